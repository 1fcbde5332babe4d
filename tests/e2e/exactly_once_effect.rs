//! The seeds' exactly-once effect, measured end to end with the real binaries: a producer
//! moves money between accounts, writing the business rows and two outbox rows (debit and
//! credit, each with an idempotency key and the account's version) in one transaction;
//! outboxd relays them; an example consumer built on the inbox kit (crates/inbox) applies
//! them to balances in its own database. outboxd and the consumer are each killed with
//! SIGKILL at random moments, at least ten times each. At the end the consumer's balances
//! equal the producer's, every event was applied exactly once, and each account's
//! versions were applied in order with none missing.
//!
//! The consumer runs as a separate process (this test binary re-run on the ignored
//! `example_consumer_process` test), so a kill is a real crash between any two steps.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outboxd_inbox::{Apply, BoxError, Inbox, InboxEvent, Outcome, Positions};
use pgtest::PgCluster;
use rand::{Rng, SeedableRng};
use support::broker::Broker;
use support::relay::Relay;
use support::schema;
use tokio_postgres::{Client, NoTls, Transaction};

pub(crate) const ACCOUNTS: i64 = 20;
pub(crate) const START_BALANCE: i64 = 1_000;
const TRANSFERS: usize = 1_500;
const KILLS_EACH: usize = 10;

pub(crate) const OUTBOX_DDL: &str = "CREATE TABLE public.outbox (
    id              uuid   PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type  text   NOT NULL,
    aggregate_id    text   NOT NULL,
    event_type      text   NOT NULL,
    payload         jsonb  NOT NULL,
    idempotency_key text   NOT NULL,
    version         bigint NOT NULL
);
CREATE TABLE public.accounts (
    id      text   PRIMARY KEY,
    balance bigint NOT NULL,
    version bigint NOT NULL DEFAULT 0
);";

/// The consumer's own tables: balances, and a log of what was applied in which order
/// (written in the same transaction as the balance, so it is the truth about applies).
const CONSUMER_DDL: &str = "CREATE TABLE balances (account text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE applied (seq bigserial PRIMARY KEY, account text NOT NULL, version bigint NOT NULL, key text NOT NULL);";

/// (text, bigint) rows as a map.
pub(crate) async fn rows(client: &Client, sql: &str) -> BTreeMap<String, i64> {
    client
        .query(sql, &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect()
}

pub(crate) async fn connect(conn: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The example consumer's change: the event's amount onto the account's balance.
struct ApplyTransfer;

impl Apply for ApplyTransfer {
    type Output = ();

    async fn apply(&mut self, tx: &Transaction<'_>, event: &InboxEvent) -> Result<(), BoxError> {
        let payload: serde_json::Value =
            serde_json::from_slice(event.payload.as_deref().unwrap_or(b"null"))?;
        let amount = payload["amount"].as_i64().ok_or("payload without amount")?;
        let account = event.aggregate_id.as_deref().ok_or("no account")?;
        tx.execute(
            "UPDATE balances SET balance = balance + $2 WHERE account = $1",
            &[&account, &amount],
        )
        .await?;
        tx.execute(
            "INSERT INTO applied (account, version, key) VALUES ($1, $2, $3)",
            &[&account, &event.version.ok_or("no version")?, &event.key],
        )
        .await?;
        Ok(())
    }
}

/// The example consumer, when run as a child process (EOE_CONSUMER_DB set): reads the
/// topic from the group's committed offsets and hands every record to the inbox kit.
#[tokio::test(flavor = "current_thread")]
#[ignore = "the consumer process of exactly_once_effect_under_kill_9, not a test"]
async fn example_consumer_process() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let Ok(db) = std::env::var("EOE_CONSUMER_DB") else {
        return;
    };
    let bootstrap = std::env::var("EOE_BOOTSTRAP").unwrap();
    let topic = std::env::var("EOE_TOPIC").unwrap();
    let partitions: i32 = std::env::var("EOE_PARTITIONS").unwrap().parse().unwrap();
    let mut client = connect(&db).await;
    let mut config = outboxd_inbox::consumer_config(&bootstrap, "balances");
    // Commit often: a kill then re-delivers less.
    config.set("auto.commit.interval.ms", "200");
    let consumer: StreamConsumer = config.create().unwrap();
    // Assigned from the committed offsets rather than subscribed: a restarted consumer
    // resumes at once instead of waiting for the killed member's session to expire
    // (crates/inbox/tests/rebalance.rs covers subscribe() and rebalances).
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&topic, p, rdkafka::Offset::Stored)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let inbox = Inbox::new("balances");
    let mut positions = Positions::default();
    loop {
        let m = consumer.recv().await.unwrap();
        for h in inbox
            .handle(
                &mut client,
                &consumer,
                &mut positions,
                &m,
                &mut ApplyTransfer,
            )
            .await
            .unwrap()
        {
            match h.outcome {
                Outcome::Gap { known, got } => {
                    panic!("version gap {known} -> {got}: an event was lost")
                }
                Outcome::Applied(()) | Outcome::Duplicate | Outcome::Stale { .. } => {}
            }
        }
    }
}

struct ConsumerProcess {
    child: Option<Child>,
    env: Vec<(String, String)>,
    log: std::path::PathBuf,
}

impl ConsumerProcess {
    fn start(env: Vec<(String, String)>) -> Self {
        let log =
            std::env::temp_dir().join(format!("outboxd-eoe-consumer-{}.log", std::process::id()));
        let mut c = ConsumerProcess {
            child: None,
            env,
            log,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // The harness names a test by its path below the crate: this module's, then the fn.
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let test = format!("{module}::example_consumer_process");
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &test,
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!(
                "the consumer exited ({status}):\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One transfer: both accounts' rows and both events in one transaction.
pub(crate) async fn transfer(client: &mut Client, n: usize, from: i64, to: i64, amount: i64) {
    let tx = client.transaction().await.unwrap();
    // Lock in id order: the producer is single-threaded, but keep it deadlock-free anyway.
    let (first, second) = if from < to { (from, to) } else { (to, from) };
    for id in [first, second] {
        tx.execute(
            "SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE",
            &[&format!("acct-{id}")],
        )
        .await
        .unwrap();
    }
    for (account, delta, side) in [(from, -amount, "debit"), (to, amount, "credit")] {
        let account = format!("acct-{account}");
        let version: i64 = tx
            .query_one(
                "UPDATE accounts SET balance = balance + $2, version = version + 1 \
                 WHERE id = $1 RETURNING version",
                &[&account, &delta],
            )
            .await
            .unwrap()
            .get(0);
        tx.execute(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, idempotency_key, version) \
             VALUES ('account', $1, $2, jsonb_build_object('amount', $3::bigint), $4, $5)",
            &[
                &account,
                &if delta < 0 { "Debited" } else { "Credited" },
                &delta,
                &format!("transfer:{n}:{side}"),
                &version,
            ],
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_effect_under_kill_9() {
    let producer_db = PgCluster::shared().fresh_database("eoe_producer").await;
    let outbox = schema::setup_custom(&producer_db, OUTBOX_DDL, Some("publish = 'insert'")).await;
    let consumer_db = PgCluster::shared().fresh_database("eoe_consumer").await;
    let producer = producer_db.client().await;
    let mut consumer = consumer_db.client().await;
    Inbox::install(&mut consumer).await.unwrap();
    consumer.batch_execute(CONSUMER_DDL).await.unwrap();
    for id in 0..ACCOUNTS {
        let account = format!("acct-{id}");
        producer
            .execute(
                "INSERT INTO accounts (id, balance) VALUES ($1, $2)",
                &[&account, &START_BALANCE],
            )
            .await
            .unwrap();
        consumer
            .execute(
                "INSERT INTO balances (account, balance) VALUES ($1, $2)",
                &[&account, &START_BALANCE],
            )
            .await
            .unwrap();
    }

    let broker = Broker::default_for_tests();
    let topic = format!("{}.account", outbox.topic_prefix);
    let partitions = 3;
    broker
        .create_topics(&[&topic, &outbox.dead_letter_topic()], partitions)
        .await;
    let template = format!("{}.{{aggregate_type}}", outbox.topic_prefix);
    let mut relay = Relay::start(
        Relay::env_for(
            &producer_db,
            &outbox,
            &broker.bootstrap(),
            &[
                ("OUTBOXD_HEADER_COLUMNS", "idempotency_key,version"),
                ("OUTBOXD_TOPIC", &template),
                ("OUTBOXD_RECONNECT_MAX_BACKOFF_MS", "500"),
            ],
        ),
        &["run"],
    );
    let mut consumer_process = ConsumerProcess::start(vec![
        ("EOE_CONSUMER_DB".into(), consumer_db.conn_string()),
        ("EOE_BOOTSTRAP".into(), broker.bootstrap()),
        ("EOE_TOPIC".into(), topic.clone()),
        ("EOE_PARTITIONS".into(), partitions.to_string()),
    ]);

    // The producer runs while both are killed at random moments.
    let conn = producer_db.conn_string();
    let load = tokio::spawn(async move {
        let mut client = connect(&conn).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for n in 0..TRANSFERS {
            let from = rng.gen_range(0..ACCOUNTS);
            let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
            transfer(&mut client, n, from, to, rng.gen_range(1..=50)).await;
            // Spread over the kills (about 15 s of them).
            if n % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
    });
    let mut rng = rand::rngs::StdRng::from_entropy();
    let (mut relay_kills, mut consumer_kills) = (0, 0);
    while relay_kills < KILLS_EACH || consumer_kills < KILLS_EACH {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        consumer_process.assert_running();
        let kill_relay = if relay_kills >= KILLS_EACH {
            false
        } else if consumer_kills >= KILLS_EACH {
            true
        } else {
            rng.gen_bool(0.5)
        };
        if kill_relay {
            relay.kill();
            relay_kills += 1;
            relay.restart();
        } else {
            consumer_process.kill();
            consumer_kills += 1;
            consumer_process.spawn();
        }
    }
    load.await.unwrap();

    // Everything arrives: two events per transfer.
    let want = i64::try_from(2 * TRANSFERS).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        consumer_process.assert_running();
        let n: i64 = consumer
            .query_one("SELECT count(*) FROM applied", &[])
            .await
            .unwrap()
            .get(0);
        if n >= want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of {want} events applied; relay log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A little longer: nothing more may be applied (a duplicate would show here).
    tokio::time::sleep(Duration::from_secs(2)).await;

    let produced = rows(&producer, "SELECT id, balance FROM accounts").await;
    let consumed = rows(&consumer, "SELECT account, balance FROM balances").await;
    assert_eq!(
        consumed, produced,
        "the consumer's balances equal the producer's"
    );
    let total: i64 = consumed.values().sum();
    assert_eq!(total, ACCOUNTS * START_BALANCE, "money is conserved");

    // Exactly once: one applied row and one key per event.
    let applied: i64 = consumer
        .query_one("SELECT count(*) FROM applied", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(applied, want, "no event applied twice");
    let distinct: i64 = consumer
        .query_one("SELECT count(DISTINCT key) FROM applied", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, want);
    let keys: i64 = consumer
        .query_one("SELECT count(*) FROM inbox_processed", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(keys, want, "the kit's table has each key once");

    // In order per account: versions 1, 2, 3, … in apply order, up to the producer's.
    let versions = rows(&producer, "SELECT id, version FROM accounts").await;
    let log = consumer
        .query("SELECT account, version FROM applied ORDER BY seq", &[])
        .await
        .unwrap();
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in log {
        let (account, version): (String, i64) = (r.get(0), r.get(1));
        let prev = last.entry(account.clone()).or_insert(0);
        assert_eq!(
            version,
            *prev + 1,
            "{account}: version {version} after {prev}"
        );
        *prev = version;
    }
    assert_eq!(last, versions, "every account's last version applied");
    // What the kills cost on the wire: records re-sent by outboxd after its crashes.
    let records = tokio::task::block_in_place(|| {
        outboxd_test_broker::watermarks(&broker.bootstrap(), "read_committed", &topic, partitions)
            .expect("watermarks")
            .into_iter()
            .map(|(lo, hi)| hi - lo)
            .sum::<i64>()
    });
    assert!(records >= want, "{records} records for {want} events");
    eprintln!(
        "{TRANSFERS} transfers, {want} events, {records} records in Kafka ({} re-sent); \
         outboxd killed {relay_kills}x, consumer killed {consumer_kills}x",
        records - want
    );
}
