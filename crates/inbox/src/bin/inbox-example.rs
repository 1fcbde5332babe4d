//! An example consumer on the inbox kit, to copy: it reads outboxd's account events and
//! keeps balances and a ledger in its own PostgreSQL database, each event applied once and
//! in order per account, through crashes and rebalances.
//!
//! ```text
//! INBOX_DATABASE_URL='host=/run/postgresql dbname=ledger' \
//! INBOX_BOOTSTRAP_SERVERS=localhost:9092 INBOX_TOPICS=outbox.account \
//!   cargo run --release -p outboxd-inbox --bin inbox-example
//! ```
//!
//! | variable | meaning |
//! |---|---|
//! | `INBOX_DATABASE_URL` | the consumer's database (libpq key=value or URL; no TLS here) |
//! | `INBOX_BOOTSTRAP_SERVERS` | Kafka |
//! | `INBOX_TOPICS` | comma-separated topics |
//! | `INBOX_GROUP` | consumer group and inbox name, default `balances` |
//! | `INBOX_KAFKA_CONFIG` | extra librdkafka settings, `name=value,name=value` |
//! | `INBOX_KEEP_KEYS_HOURS` | dedup key retention, default 336 (14 days); 0: keep all |
//! | `INBOX_INSTANCE` | this process's name in the ledger, default `pid-<pid>` |
//!
//! Each event's payload is `{"amount": <integer>}`, its record key the account. It
//! prints one line per event; it exits 1 on an error (a supervisor restarts it and the
//! group's committed offsets re-deliver what was not committed, which the inbox skips),
//! and 2 on a bad setting.

use std::process::ExitCode;
use std::time::Duration;

use outboxd_inbox::{consumer_config, Apply, BoxError, Inbox, InboxEvent, Outcome, Positions};
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio_postgres::{Client, NoTls, Transaction};

/// The example's own tables: what its handler changes.
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS balances (
    account text   PRIMARY KEY,
    balance bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    seq       bigserial PRIMARY KEY,
    account   text      NOT NULL,
    version   bigint    NULL,
    event_key text      NOT NULL,
    amount    bigint    NOT NULL,
    applied_by text     NOT NULL  -- INBOX_INSTANCE: which process applied it
);";

/// The change an event makes: a ledger line and the balance, in the inbox's transaction.
struct Post {
    instance: String,
}

impl Apply for Post {
    type Output = i64;

    async fn apply(&mut self, tx: &Transaction<'_>, event: &InboxEvent) -> Result<i64, BoxError> {
        let payload: serde_json::Value =
            serde_json::from_slice(event.payload.as_deref().unwrap_or(b"null"))?;
        let amount = payload["amount"]
            .as_i64()
            .ok_or("the payload has no integer \"amount\"")?;
        let account = event
            .aggregate_id
            .as_deref()
            .ok_or("the record has no key (the account)")?;
        tx.execute(
            "INSERT INTO ledger (account, version, event_key, amount, applied_by) \
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &account,
                &event.version,
                &event.key,
                &amount,
                &self.instance,
            ],
        )
        .await?;
        let row = tx
            .query_one(
                "INSERT INTO balances (account, balance) VALUES ($1, $2) ON CONFLICT (account) \
                 DO UPDATE SET balance = balances.balance + $2 RETURNING balance",
                &[&account, &amount],
            )
            .await?;
        Ok(row.get(0))
    }
}

struct Settings {
    database: String,
    bootstrap: String,
    topics: Vec<String>,
    group: String,
    kafka: Vec<(String, String)>,
    keep: Option<Duration>,
    instance: String,
}

fn settings() -> Result<Settings, String> {
    let required = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or(format!(
                "{name} is not set: see the table at the top of inbox-example.rs"
            ))
    };
    let topics: Vec<String> = required("INBOX_TOPICS")?
        .split(',')
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    let mut kafka = Vec::new();
    for pair in std::env::var("INBOX_KAFKA_CONFIG")
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.trim().is_empty())
    {
        let (k, v) = pair.split_once('=').ok_or(format!(
            "INBOX_KAFKA_CONFIG has {pair:?}: write name=value pairs separated by commas"
        ))?;
        kafka.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let hours = std::env::var("INBOX_KEEP_KEYS_HOURS").unwrap_or_else(|_| "336".into());
    let hours: u64 = hours.trim().parse().map_err(|_| {
        format!("INBOX_KEEP_KEYS_HOURS is {hours:?}: write a whole number of hours (0: keep all)")
    })?;
    Ok(Settings {
        database: required("INBOX_DATABASE_URL")?,
        bootstrap: required("INBOX_BOOTSTRAP_SERVERS")?,
        topics,
        group: std::env::var("INBOX_GROUP").unwrap_or_else(|_| "balances".into()),
        kafka,
        keep: (hours > 0).then(|| Duration::from_secs(hours.saturating_mul(3600))),
        instance: std::env::var("INBOX_INSTANCE")
            .unwrap_or_else(|_| format!("pid-{}", std::process::id())),
    })
}

async fn connect(url: &str) -> Result<Client, BoxError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("inbox-example: database connection: {e}");
        }
    });
    Ok(client)
}

fn describe(event: &InboxEvent, outcome: &Outcome<i64>) -> String {
    let at = format!(
        "{}/{}@{} {} v{} key={}",
        event.topic,
        event.partition,
        event.offset,
        event.aggregate_id.as_deref().unwrap_or("-"),
        event.version.map_or("-".into(), |v| v.to_string()),
        event.key
    );
    match outcome {
        Outcome::Applied(balance) => format!("applied {at}: balance {balance}"),
        Outcome::Duplicate => format!("duplicate {at}: applied before, skipped"),
        Outcome::Stale { known, got } => {
            format!("stale {at}: version {got} at or below {known}, skipped")
        }
        Outcome::Gap { known, got } => format!(
            "held {at}: version {got} after {known}; waiting for the missing version, \
             the partition's commit stays here"
        ),
    }
}

async fn run(s: Settings) -> Result<(), BoxError> {
    let mut client = connect(&s.database).await?;
    Inbox::install(&mut client).await?;
    // Under a lock, like the kit's tables: consumers starting together must not race.
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('inbox-example.tables'))",
        &[],
    )
    .await?;
    tx.batch_execute(TABLES).await?;
    tx.commit().await?;
    let mut config = consumer_config(&s.bootstrap, &s.group);
    for (k, v) in &s.kafka {
        config.set(k, v);
    }
    let consumer: StreamConsumer = config.create()?;
    let topics: Vec<&str> = s.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let inbox = Inbox::new(s.group.clone());
    let mut positions = Positions::default();
    let mut post = Post {
        instance: s.instance.clone(),
    };
    let mut prune = tokio::time::interval(Duration::from_secs(300));
    let mut stop = std::pin::pin!(shutdown());
    println!("inbox-example: consuming {topics:?} as group {}", s.group);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => break,
            m = consumer.recv() => {
                let m = m?;
                for h in inbox.handle(&mut client, &consumer, &mut positions, &m, &mut post).await? {
                    println!("{}", describe(&h.event, &h.outcome));
                }
            }
            _ = prune.tick() => {
                if let Some(keep) = s.keep {
                    // Batches keep each delete short; the next tick goes on.
                    let deleted = inbox.prune(&client, keep, 10_000).await?;
                    if deleted > 0 {
                        println!("pruned {deleted} keys older than {keep:?}");
                    }
                }
            }
        }
    }
    // Dropping the consumer leaves the group and commits the stored offsets.
    drop(consumer);
    println!("inbox-example: stopped");
    Ok(())
}

async fn shutdown() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let s = match settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("inbox-example: {e}");
            return ExitCode::from(2);
        }
    };
    match run(s).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inbox-example: {e}");
            ExitCode::FAILURE
        }
    }
}
