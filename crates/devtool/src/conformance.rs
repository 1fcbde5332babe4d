//! `outboxd-dev conformance`: checks a team's inbox consumer (docs/inbox.md) from outside.
//! It writes a scripted run of records shaped exactly like outboxd's (headers `id`,
//! `idempotency_key`, `version`, `aggregate_type`, `event_type`; the aggregate id as the key,
//! partitioned by murmur2 like outboxd) with what at-least-once delivery does to a consumer:
//! the same record twice, a replayed batch, an event re-inserted under a new id, an older
//! version under a new key, and a version that arrives before the one it follows. Then it
//! waits until the consumer's group has committed past every record and checks the
//! consumer's tables with SQL: each key recorded once, each aggregate at its last version,
//! and the effect (one integer per aggregate, the sum of its applied amounts) exact.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio_postgres::NoTls;

use crate::args;

/// One record of the script: which aggregate, its version and amount, the key suffix (the
/// idempotency key), and the event id suffix (a new id is a re-insert into the outbox).
struct Step {
    aggregate: &'static str,
    version: i64,
    amount: i64,
    key: &'static str,
    id: &'static str,
    why: &'static str,
}

const fn step(
    aggregate: &'static str,
    version: i64,
    amount: i64,
    key: &'static str,
    id: &'static str,
    why: &'static str,
) -> Step {
    Step {
        aggregate,
        version,
        amount,
        key,
        id,
        why,
    }
}

/// What at-least-once delivery does, in the order it is written to the topic.
const SCRIPT: &[Step] = &[
    step("a", 1, 10, "a1", "a1", "first event"),
    step("b", 1, 20, "b1", "b1", "first event"),
    step("a", 2, 5, "a2", "a2", "next version"),
    step(
        "a",
        2,
        5,
        "a2",
        "a2",
        "the same record again (a producer retry)",
    ),
    step(
        "a",
        1,
        10,
        "a1",
        "a1",
        "a replayed batch (outboxd's re-send after a crash)",
    ),
    step(
        "b",
        1,
        20,
        "b1",
        "b1",
        "a replayed batch (outboxd's re-send after a crash)",
    ),
    step("b", 2, 7, "b2", "b2", "next version"),
    step("c", 1, 1, "c1", "c1", "first event"),
    step(
        "c",
        3,
        100,
        "c3",
        "c3",
        "out of order: version 3 before 2 (hold it)",
    ),
    step("a", 3, 3, "a3", "a3", "next version, while c waits"),
    step(
        "c",
        2,
        50,
        "c2",
        "c2",
        "the missing version: then 3 applies",
    ),
    step("c", 3, 100, "c3", "c3", "redelivered after it applied"),
    step(
        "a",
        3,
        3,
        "a3",
        "a3-again",
        "re-inserted: a new id, the same idempotency key",
    ),
    step(
        "a",
        2,
        99,
        "a2-other",
        "a2-other",
        "an older version under a new key (stale)",
    ),
];

/// The outcome the script must leave: per aggregate, (sum of amounts applied, last version).
fn expected() -> BTreeMap<&'static str, (i64, i64)> {
    BTreeMap::from([("a", (18, 3)), ("b", (27, 2)), ("c", (151, 3))])
}

/// Keys the inbox records: every distinct idempotency key (a stale one is recorded too).
fn expected_keys() -> usize {
    let mut keys: Vec<&str> = SCRIPT.iter().map(|s| s.key).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.len()
}

struct Options {
    bootstrap: String,
    topic: String,
    database: String,
    consumer: String,
    group: String,
    effect: String,
    aggregate_type: String,
    wait: Duration,
}

const FLAGS: &[&str] = &[
    "--bootstrap-servers",
    "--topic",
    "--database",
    "--consumer",
    "--group",
    "--effect-query",
    "--aggregate-type",
    "--seconds",
];

fn options(argv: &[String]) -> Result<Options> {
    let mut o = Options {
        bootstrap: String::new(),
        topic: String::new(),
        database: String::new(),
        consumer: "balances".into(),
        group: String::new(),
        effect: "SELECT account, balance FROM balances WHERE account = ANY($1)".into(),
        aggregate_type: "account".into(),
        wait: Duration::from_secs(60),
    };
    for (flag, value) in args::pairs(argv, FLAGS)? {
        match flag.as_str() {
            "--bootstrap-servers" => o.bootstrap = value,
            "--topic" => o.topic = value,
            "--database" => o.database = value,
            "--consumer" => o.consumer = value,
            "--group" => o.group = value,
            "--effect-query" => o.effect = value,
            "--aggregate-type" => o.aggregate_type = value,
            _ => o.wait = Duration::from_secs(args::number(&flag, &value)?),
        }
    }
    for (value, flag) in [
        (&o.bootstrap, "--bootstrap-servers"),
        (&o.topic, "--topic"),
        (&o.database, "--database"),
    ] {
        if value.is_empty() {
            bail!("{flag} is required (outboxd-dev help shows every option)");
        }
    }
    if o.group.is_empty() {
        o.group.clone_from(&o.consumer);
    }
    Ok(o)
}

pub fn main(argv: &[String]) -> Result<ExitCode> {
    let o = options(argv)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&o))
}

/// This run's name for an aggregate or key: runs never collide, so the tool can run
/// again against the same tables.
fn named(run: &str, s: &str) -> String {
    format!("conformance-{run}-{s}")
}

async fn run(o: &Options) -> Result<ExitCode> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (db, connection) = tokio_postgres::connect(&o.database, NoTls)
        .await
        .with_context(|| format!("connecting to --database {:?}", o.database))?;
    tokio::spawn(connection);

    let before = ends(o)?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &o.bootstrap)
        // outboxd's partitioner (the Java client's): one aggregate, one partition.
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .create()
        .context("creating the producer")?;
    for (n, s) in SCRIPT.iter().enumerate() {
        let aggregate = named(&run, s.aggregate);
        let id = named(&run, s.id);
        let key = named(&run, s.key);
        let version = s.version.to_string();
        let payload = serde_json::json!({ "amount": s.amount }).to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "id",
                value: Some(&id),
            })
            .insert(Header {
                key: "aggregate_type",
                value: Some(&o.aggregate_type),
            })
            .insert(Header {
                key: "event_type",
                value: Some("ConformanceStep"),
            })
            .insert(Header {
                key: "idempotency_key",
                value: Some(&key),
            })
            .insert(Header {
                key: "version",
                value: Some(&version),
            });
        producer
            .send(
                BaseRecord::to(&o.topic)
                    .key(&aggregate)
                    .payload(&payload)
                    .headers(headers),
            )
            .map_err(|(e, _)| e)
            .with_context(|| format!("producing step {n} to {}", o.topic))?;
        println!(
            "sent {:>2}: {aggregate} v{} {:+} key={key}: {}",
            n + 1,
            s.version,
            s.amount,
            s.why
        );
    }
    producer
        .flush(Duration::from_secs(30))
        .context("the broker did not acknowledge the script")?;
    // Only the partitions the script went to: others may have no committed offset at all.
    let ends: Vec<(i32, i64)> = ends(o)?
        .into_iter()
        .filter(|end| !before.contains(end))
        .collect();

    // Done when the group committed past every record: nothing is in flight then.
    let deadline = Instant::now() + o.wait;
    loop {
        let behind = behind(o, &ends)?;
        if behind.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            println!(
                "FAIL group {} did not commit past the script within {:?} ({}): is the \
                 consumer running, subscribed to {} with group.id {}?",
                o.group,
                o.wait,
                behind.join(", "),
                o.topic,
                o.group
            );
            return Ok(ExitCode::FAILURE);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut failed = 0;
    let mut check = |ok: bool, what: String| {
        println!("{} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            failed += 1;
        }
    };
    let want = expected();
    let aggregates: Vec<String> = want.keys().map(|a| named(&run, a)).collect();
    let effect: BTreeMap<String, i64> = db
        .query(&o.effect, &[&aggregates])
        .await
        .with_context(|| {
            format!(
                "--effect-query {:?}: it takes the aggregate ids as $1 (text[]) and returns \
                 (aggregate id text, amount bigint) rows",
                o.effect
            )
        })?
        .into_iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .context("--effect-query must return (text, bigint) rows")?;
    let versions: BTreeMap<String, Option<i64>> = db
        .query(
            "SELECT aggregate_id, version FROM inbox_versions WHERE consumer = $1 \
             AND aggregate_type = $2 AND aggregate_id = ANY($3)",
            &[&o.consumer, &o.aggregate_type, &aggregates],
        )
        .await
        .context("reading inbox_versions (sql/inbox.sql)")?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (a, (amount, version)) in &want {
        let name = named(&run, a);
        let got = effect.get(&name).copied();
        check(
            got == Some(*amount),
            format!("{name}: effect {got:?}, want {amount} (each event applied once)"),
        );
        let got = versions.get(&name).copied().flatten();
        check(
            got == Some(*version),
            format!("{name}: inbox_versions {got:?}, want {version} (in version order)"),
        );
    }
    let keys: i64 = db
        .query_one(
            "SELECT count(*) FROM inbox_processed WHERE consumer = $1 AND key LIKE $2",
            &[&o.consumer, &format!("conformance-{run}-%")],
        )
        .await
        .context("reading inbox_processed (sql/inbox.sql)")?
        .get(0);
    let want_keys = i64::try_from(expected_keys())?;
    check(
        keys == want_keys,
        format!("inbox_processed: {keys} keys of this run, want {want_keys} (one per key)"),
    );
    if failed > 0 {
        println!("conformance run {run}: {failed} checks failed; docs/inbox.md has the protocol");
        return Ok(ExitCode::FAILURE);
    }
    println!("conformance run {run}: every check passed");
    Ok(ExitCode::SUCCESS)
}

fn admin(o: &Options) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", &o.bootstrap)
        .set("group.id", &o.group)
        .create()
        .context("creating a Kafka client")
}

/// The end offset of each partition of the topic, after the script.
fn ends(o: &Options) -> Result<Vec<(i32, i64)>> {
    let c = admin(o)?;
    let metadata = c
        .fetch_metadata(Some(&o.topic), Duration::from_secs(10))
        .with_context(|| format!("reading {}'s partitions", o.topic))?;
    let mut out = Vec::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            let (_, high) = c.fetch_watermarks(&o.topic, p.id(), Duration::from_secs(10))?;
            out.push((p.id(), high));
        }
    }
    if out.is_empty() {
        bail!("topic {} has no partitions: create it first", o.topic);
    }
    Ok(out)
}

/// Partitions whose committed offset is short of its end, as `partition@committed/end`.
fn behind(o: &Options, ends: &[(i32, i64)]) -> Result<Vec<String>> {
    let c = admin(o)?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (p, _) in ends {
        tpl.add_partition(&o.topic, *p);
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok(ends
        .iter()
        .filter_map(|(p, end)| {
            let at = committed
                .find_partition(&o.topic, *p)
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0);
            (at < Some(*end)).then(|| format!("{p}@{}/{end}", at.unwrap_or(-1)))
        })
        .collect())
}
