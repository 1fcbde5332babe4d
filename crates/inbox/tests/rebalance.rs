//! The example consumer (src/bin/inbox-example.rs) in a consumer group, through
//! `subscribe()` and rebalances, with a version gap held and then filled: two consumers
//! share a topic of account events; one is killed with SIGKILL mid-run and the other takes
//! its partitions over; one account's version 3 is missing, so its versions 4 and later
//! are held and the group's committed offset of that partition stays at version 4's
//! record, whoever owns it (a restarted consumer joins, the survivor is killed, the new
//! one re-reads from there). Then version 3 arrives, as a re-send from a dead-letter
//! topic would, after them. At the end every event is applied exactly once, each
//! account's versions in order, the balances are exact and every partition is committed
//! to its end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::Client;

const TOPIC: &str = "outbox.account";
const PARTITIONS: i32 = 3;
const ACCOUNTS: i64 = 12;
const GAP_ACCOUNT: i64 = 0;
const GAP_VERSION: i64 = 3;
const GROUP: &str = "balances";

fn account(a: i64) -> String {
    format!("acct-{a}")
}

/// Debits and credits that differ by account and version.
fn amount(a: i64, v: i64) -> i64 {
    let n = (a * 7 + v * 13) % 23 + 1;
    if v % 3 == 0 {
        -n
    } else {
        n
    }
}

/// One consumer process: the example binary, killed with SIGKILL on drop.
struct ConsumerProcess {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ConsumerProcess {
    fn start(name: &'static str, database: &str, bootstrap: &str) -> Self {
        let log = std::env::temp_dir().join(format!(
            "outboxd-inbox-rebalance-{}-{name}.log",
            std::process::id()
        ));
        let out = std::fs::File::create(&log).unwrap();
        // The shortest session a Kafka broker accepts by default (group.min.session.timeout.ms)
        // so that a killed member leaves the group in seconds; frequent commits so that the
        // committed offsets are quick to check.
        let kafka = format!(
            "client.id={name},session.timeout.ms=6000,heartbeat.interval.ms=500,\
             max.poll.interval.ms=10000,auto.commit.interval.ms=100"
        );
        let child = Command::new(env!("CARGO_BIN_EXE_inbox-example"))
            .env("INBOX_DATABASE_URL", database)
            .env("INBOX_BOOTSTRAP_SERVERS", bootstrap)
            .env("INBOX_TOPICS", TOPIC)
            .env("INBOX_GROUP", GROUP)
            .env("INBOX_KAFKA_CONFIG", kafka)
            .env("INBOX_INSTANCE", name)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        ConsumerProcess { name, child, log }
    }

    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("--- {} ---\n{text}", self.name)
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("consumer {} exited ({status}):\n{}", self.name, self.log());
        }
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the test reads of the group: its committed offsets, without joining it (who owns
/// what shows in the ledger's `applied_by`).
struct Watcher {
    consumer: BaseConsumer,
}

impl Watcher {
    /// Each partition's committed offset (None: nothing committed yet).
    fn committed(&self) -> Vec<Option<i64>> {
        tokio::task::block_in_place(|| {
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition(TOPIC, p);
            }
            let Ok(tpl) = self.consumer.committed_offsets(tpl, Duration::from_secs(5)) else {
                return vec![None; 3];
            };
            (0..PARTITIONS)
                .map(|p| match tpl.find_partition(TOPIC, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => Some(o),
                    _ => None,
                })
                .collect()
        })
    }

    fn high_watermarks(&self) -> Vec<i64> {
        tokio::task::block_in_place(|| {
            (0..PARTITIONS)
                .map(|p| {
                    self.consumer
                        .fetch_watermarks(TOPIC, p, Duration::from_secs(5))
                        .unwrap()
                        .1
                })
                .collect()
        })
    }
}

struct Producer {
    producer: FutureProducer,
    /// (account, version) -> (partition, offset) of its record.
    sent: BTreeMap<(i64, i64), (i32, i64)>,
    rounds: i64,
}

impl Producer {
    /// Every account's next version, except the gap's.
    async fn round(&mut self) {
        self.rounds += 1;
        for acct in 0..ACCOUNTS {
            if (acct, self.rounds) != (GAP_ACCOUNT, GAP_VERSION) {
                self.send(acct, self.rounds).await;
            }
        }
    }

    fn count(&self) -> i64 {
        i64::try_from(self.sent.len()).unwrap()
    }

    async fn send(&mut self, a: i64, v: i64) {
        let key = account(a);
        let id = format!("e-{a}-{v}");
        let idempotency_key = format!("{key}:v{v}");
        let version = v.to_string();
        let payload = format!("{{\"amount\": {}}}", amount(a, v));
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "idempotency_key",
                value: Some(idempotency_key.as_bytes()),
            })
            .insert(Header {
                key: "version",
                value: Some(version.as_bytes()),
            })
            .insert(Header {
                key: "id",
                value: Some(id.as_bytes()),
            })
            .insert(Header {
                key: "aggregate_type",
                value: Some(b"account".as_slice()),
            });
        let delivery = self
            .producer
            .send(
                FutureRecord::to(TOPIC)
                    .key(&key)
                    .payload(&payload)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        self.sent
            .insert((a, v), (delivery.partition, delivery.offset));
    }
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// Polls `done` until it holds, checking after every poll that the gap's partition is
/// never committed past the held record (while `held` says where it is) and that the
/// consumers still run.
async fn wait_until<F, Fut>(
    what: &str,
    watcher: &Watcher,
    held: Option<(i32, i64)>,
    consumers: &mut [&mut ConsumerProcess],
    mut done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((partition, offset)) = held {
            let committed = watcher.committed();
            let at = committed
                .get(usize::try_from(partition).unwrap())
                .copied()
                .flatten();
            assert!(
                at.is_none_or(|c| c <= offset),
                "partition {partition} committed at {at:?}, past the held record at {offset}"
            );
        }
        for c in consumers.iter_mut() {
            c.assert_running();
        }
        if done().await {
            return;
        }
        let logs: Vec<String> = consumers.iter().map(|c| c.log()).collect();
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; committed {:?}\n{}",
            watcher.committed(),
            logs.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many ledger lines `instance` wrote.
async fn applied_by(client: &Client, instance: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM ledger WHERE applied_by = $1",
            &[&instance],
        )
        .await
        .unwrap()
        .get(0)
}

/// Produces rounds until `instance` has applied some (it owns partitions), at least
/// `min` of them.
async fn rounds_until_applied_by(
    producer: &mut Producer,
    client: &Client,
    instances: &[&str],
    min: i64,
    consumers: &mut [&mut ConsumerProcess],
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut all = producer.rounds >= min;
        for i in instances {
            all &= applied_by(client, i).await > 0;
        }
        if all {
            return;
        }
        for c in consumers.iter_mut() {
            c.assert_running();
        }
        assert!(
            Instant::now() < deadline,
            "{instances:?} applied nothing after {} rounds",
            producer.rounds
        );
        producer.round().await;
        // Paced, so that group joins land between rounds.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_group_keeps_the_effect_exact_through_kill_9_rebalances_and_a_held_gap() {
    let started = Instant::now();
    let db = PgCluster::shared().fresh_database("inbox_rebalance").await;
    let client = db.client().await;
    // A real Kafka node of the test's own: its group coordinator runs the rebalances (the
    // topic and group names are fixed by the example's settings).
    let broker = outboxd_test_broker::Broker::kafka(1).expect("starting Kafka");
    broker.create_topics(&[TOPIC], PARTITIONS).await.unwrap();
    let bootstrap = broker.bootstrap();
    let watcher = Watcher {
        consumer: ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", GROUP)
            .create()
            .unwrap(),
    };
    let mut producer = Producer {
        producer: ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .unwrap(),
        sent: BTreeMap::new(),
        rounds: 0,
    };
    let database = db.conn_string();

    // Two consumers subscribe; rounds of events until both have applied some (each owns
    // partitions) and the gap is behind.
    let mut a = ConsumerProcess::start("consumer-a", &database, &bootstrap);
    let mut b = ConsumerProcess::start("consumer-b", &database, &bootstrap);
    wait_until(
        "the example's tables",
        &watcher,
        None,
        &mut [&mut a, &mut b],
        || async {
            count(
                &client,
                "SELECT count(*) FROM pg_class WHERE relname = 'ledger'",
            )
            .await
                == 1
        },
    )
    .await;
    rounds_until_applied_by(
        &mut producer,
        &client,
        &["consumer-a", "consumer-b"],
        GAP_VERSION + 1,
        &mut [&mut a, &mut b],
    )
    .await;
    let held = producer.sent[&(GAP_ACCOUNT, GAP_VERSION + 1)];
    // Mid-run, consumer-a is killed (SIGKILL: it leaves the group only when its session
    // expires) while more rounds come.
    drop(a);
    for _ in 0..4 {
        producer.round().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // consumer-b, alone after the rebalance, has applied everything but the held records,
    // and the group committed every partition to its end but the gap's, which waits at
    // the first held record.
    let held_records = || producer.rounds - GAP_VERSION;
    let expect_applied = producer.count() - held_records();
    wait_until(
        "everything but the held records applied and committed",
        &watcher,
        Some(held),
        &mut [&mut b],
        || async {
            let committed = watcher.committed();
            let ends = watcher.high_watermarks();
            let commits_ok = (0..PARTITIONS).all(|p| {
                let i = usize::try_from(p).unwrap();
                let want = if p == held.0 { held.1 } else { ends[i] };
                committed[i] == Some(want)
            });
            commits_ok && count(&client, "SELECT count(*) FROM ledger").await == expect_applied
        },
    )
    .await;
    let versions_of = |acct: i64| {
        let client = &client;
        async move {
            client
                .query(
                    "SELECT version FROM ledger WHERE account = $1 ORDER BY seq",
                    &[&account(acct)],
                )
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.get::<_, i64>(0))
                .collect::<Vec<i64>>()
        }
    };
    assert_eq!(
        versions_of(GAP_ACCOUNT).await,
        (1..GAP_VERSION).collect::<Vec<_>>(),
        "versions after the gap are held"
    );

    // consumer-c joins (and gets partitions), then consumer-b is killed: consumer-c owns
    // every partition and reads the gap's again from the held record.
    let mut c = ConsumerProcess::start("consumer-c", &database, &bootstrap);
    rounds_until_applied_by(
        &mut producer,
        &client,
        &["consumer-c"],
        0,
        &mut [&mut b, &mut c],
    )
    .await;
    drop(b);
    // The missing version arrives after the held ones (as a re-send from a dead-letter
    // topic would), then one more round.
    producer.send(GAP_ACCOUNT, GAP_VERSION).await;
    producer.round().await;
    let total = producer.count();
    wait_until(
        "everything applied and committed",
        &watcher,
        None,
        &mut [&mut c],
        || async {
            let ends: Vec<Option<i64>> = watcher.high_watermarks().into_iter().map(Some).collect();
            watcher.committed() == ends
                && count(&client, "SELECT count(*) FROM ledger").await == total
        },
    )
    .await;

    // Exactly once: one ledger line and one key per event.
    assert_eq!(
        count(&client, "SELECT count(DISTINCT event_key) FROM ledger").await,
        total
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM inbox_processed").await,
        total
    );
    // The held records were applied by the last owner, after the repair.
    let late: Vec<String> = client
        .query(
            "SELECT DISTINCT applied_by FROM ledger WHERE account = $1 AND version >= $2",
            &[&account(GAP_ACCOUNT), &GAP_VERSION],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(late, ["consumer-c"]);
    // Exact balances, and every account's versions in order.
    for acct in 0..ACCOUNTS {
        let want: i64 = (1..=producer.rounds).map(|v| amount(acct, v)).sum();
        let got: i64 = client
            .query_one(
                "SELECT balance FROM balances WHERE account = $1",
                &[&account(acct)],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(got, want, "{}", account(acct));
        assert_eq!(
            versions_of(acct).await,
            (1..=producer.rounds).collect::<Vec<_>>(),
            "{}",
            account(acct)
        );
    }
    eprintln!(
        "{total} events in {} rounds, the gap at {TOPIC}/{}@{} held across 2 SIGKILLs and \
         3 owners, {:.1} s",
        producer.rounds,
        held.0,
        held.1,
        started.elapsed().as_secs_f64()
    );
}
