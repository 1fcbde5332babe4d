//! The inbox protocol's examples in other languages (examples/consumers/{java,go,python}),
//! each run as real processes against outboxd, the tests' Apache Kafka and PostgreSQL: a
//! producer moves money between accounts through the outbox (exactly_once_effect's
//! producer), outboxd relays it, and the example applies it to balances in its own
//! database. One instance is killed with SIGKILL mid-stream and restarted, then a second
//! instance joins the group (a rebalance). At the end every event was applied exactly
//! once, in version order per account, the balances are exact, both instances applied
//! events, both stop on SIGTERM with exit 0 and the group's committed offsets reach the end
//! of every partition.
//!
//! Then `outboxd-dev conformance` (the tool any team can point at its own consumer) runs
//! against the same instances: duplicates, a replayed batch, an out-of-order version.
//!
//! A missing toolchain fails the test with the command that installs it
//! (`scripts/install-deps --consumer-kits`); nothing is skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::exactly_once_effect::{connect, rows, transfer, ACCOUNTS, OUTBOX_DDL, START_BALANCE};
use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd_inbox::Inbox;
use pgtest::{PgCluster, TestDb};
use rand::{Rng, SeedableRng};
use support::broker::Broker;
use support::relay::Relay;
use support::schema;
use tokio_postgres::Client;

const INSTALL: &str = "run `scripts/install-deps --consumer-kits` (as root) to install it";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn examples() -> PathBuf {
    repo().join("examples/consumers")
}

/// Where scripts/install-deps puts the Python example's virtualenv.
fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("OUTBOXD_KIT_VENV") {
        return PathBuf::from(v);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/outboxd/consumer-kits/venv")
}

/// Runs a build step; a failure names the install script.
fn build(what: &str, cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?} ({e}): {INSTALL}"));
    assert!(
        out.status.success(),
        "{what}: {cmd:?} failed ({}): {INSTALL}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(Clone, Copy, Debug)]
enum Lang {
    Java,
    Go,
    Python,
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::Java => "java",
            Lang::Go => "go",
            Lang::Python => "python",
        }
    }

    /// Builds the example (once per test) and returns the command line that runs it.
    fn prepare(self) -> Vec<String> {
        let dir = examples().join(self.name());
        match self {
            Lang::Python => {
                let python = venv().join("bin/python");
                build(
                    "the Python example's packages (confluent-kafka, psycopg)",
                    Command::new(&python).args(["-c", "import confluent_kafka, psycopg"]),
                );
                vec![
                    python.display().to_string(),
                    dir.join("inbox_example.py").display().to_string(),
                ]
            }
            Lang::Go => {
                let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("inbox-example-go");
                build(
                    "the Go example (go build)",
                    Command::new("go")
                        .args(["build", "-o"])
                        .arg(&bin)
                        .arg(".")
                        .current_dir(&dir)
                        // The modules come from install-deps' cache, never fetched here.
                        .env("GOFLAGS", "-mod=readonly")
                        .env("GOPROXY", "off"),
                );
                vec![bin.display().to_string()]
            }
            Lang::Java => {
                build(
                    "the Java example (mvn package)",
                    Command::new("mvn")
                        .args(["-q", "-B", "-o", "package", "-f"])
                        .arg(dir.join("pom.xml")),
                );
                let target = dir.join("target");
                vec![
                    "java".into(),
                    "-cp".into(),
                    format!(
                        "{}:{}/lib/*",
                        target.join("inbox-example.jar").display(),
                        target.display()
                    ),
                    "outboxd.example.InboxExample".into(),
                ]
            }
        }
    }

    /// INBOX_DATABASE_URL for this language's client: JDBC wants its own URL form.
    fn database_url(self, db: &TestDb<'_>) -> String {
        let c = db.cluster();
        match self {
            Lang::Java => format!(
                "jdbc:postgresql://{}:{}/{}?user={}",
                c.host(),
                c.port(),
                db.name,
                c.superuser()
            ),
            Lang::Go | Lang::Python => format!(
                "postgresql://{}@{}:{}/{}",
                c.superuser(),
                c.host(),
                c.port(),
                db.name
            ),
        }
    }
}

/// One example process, killed or stopped by the test.
struct Instance {
    command: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
}

impl Instance {
    fn start(command: &[String], env: Vec<(String, String)>, name: &str) -> Instance {
        let log =
            std::env::temp_dir().join(format!("outboxd-kit-{}-{name}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let mut i = Instance {
            command: command.to_vec(),
            env,
            child: None,
            log,
        };
        i.spawn();
        i
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?} ({e}): {INSTALL}", self.command));
        self.child = Some(child);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: a crash between any two steps.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("the example exited ({status}):\n{}", self.log_text());
        }
    }

    /// SIGTERM, then the exit status.
    fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the example did not stop on SIGTERM:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// Waits until `sql` counts at least `want`, the instances alive meanwhile.
async fn wait_count(client: &Client, sql: &str, want: i64, instances: &mut [&mut Instance]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        for i in instances.iter_mut() {
            i.assert_running();
        }
        let n = count(client, sql).await;
        if n >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {n}, waited for {want}; logs:\n{}",
            instances
                .iter()
                .map(|i| i.log_text())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The group's committed offset and the end of each partition of `topic`.
fn committed_and_ends(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<(i64, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    let marks = outboxd_test_broker::watermarks(bootstrap, "read_committed", topic, partitions)
        .expect("watermarks");
    (0..partitions)
        .zip(marks)
        .map(|(p, (_, end))| {
            let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(rdkafka::Offset::Offset(o)) => o,
                other => panic!("{topic}/{p}: no committed offset ({other:?})"),
            };
            (at, end)
        })
        .collect()
}

/// `outboxd-dev conformance` against the running example: its exit code is the verdict.
fn conformance(bootstrap: &str, topic: &str, db: &TestDb<'_>, group: &str) {
    let exe = std::env::current_exe().unwrap();
    // target/release/deps/e2e-… → target/release/outboxd-dev (cargo build --bins).
    let tool = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("outboxd-dev");
    let out = Command::new(&tool)
        .args([
            "conformance",
            "--bootstrap-servers",
            bootstrap,
            "--topic",
            topic,
        ])
        .args(["--database", &db.conn_string(), "--consumer", group])
        .args(["--seconds", "30"])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: build it with cargo build --release --locked --bins",
                tool.display()
            )
        });
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "outboxd-dev conformance failed ({}):\n{report}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn kit_scenario(lang: Lang) {
    let command = lang.prepare();
    let producer_db = PgCluster::shared()
        .fresh_database(&format!("kit_{}_producer", lang.name()))
        .await;
    let outbox = schema::setup_custom(&producer_db, OUTBOX_DDL, Some("publish = 'insert'")).await;
    let consumer_db = PgCluster::shared()
        .fresh_database(&format!("kit_{}_consumer", lang.name()))
        .await;
    let producer = producer_db.client().await;
    let mut consumer = consumer_db.client().await;
    // sql/inbox.sql: what a team installs before its first consumer starts.
    Inbox::install(&mut consumer).await.unwrap();
    for id in 0..ACCOUNTS {
        producer
            .execute(
                "INSERT INTO accounts (id, balance) VALUES ($1, $2)",
                &[&format!("acct-{id}"), &START_BALANCE],
            )
            .await
            .unwrap();
    }

    let broker = Broker::default_for_tests();
    let topic = format!("{}.account", outbox.topic_prefix);
    let partitions = 3;
    let conformance_topic = format!("{}.conformance", outbox.topic_prefix);
    broker
        .create_topics(
            &[&topic, &outbox.dead_letter_topic(), &conformance_topic],
            partitions,
        )
        .await;
    let template = format!("{}.{{aggregate_type}}", outbox.topic_prefix);
    let _relay = Relay::start(
        Relay::env_for(
            &producer_db,
            &outbox,
            &broker.bootstrap(),
            &[
                ("OUTBOXD_HEADER_COLUMNS", "idempotency_key,version"),
                ("OUTBOXD_TOPIC", &template),
            ],
        ),
        &["run"],
    );
    let group = format!("balances-{}", outbox.topic_prefix);
    let env =
        |instance: &str| {
            vec![
            ("INBOX_DATABASE_URL".to_owned(), lang.database_url(&consumer_db)),
            ("INBOX_BOOTSTRAP_SERVERS".to_owned(), broker.bootstrap()),
            ("INBOX_TOPICS".to_owned(), format!("{topic},{conformance_topic}")),
            ("INBOX_GROUP".to_owned(), group.clone()),
            ("INBOX_INSTANCE".to_owned(), instance.to_owned()),
            // A killed member's partitions move on after 6 s (the broker's minimum), and
            // commits every 200 ms keep the stream short between them.
            (
                "INBOX_KAFKA_CONFIG".to_owned(),
                "session.timeout.ms=6000,heartbeat.interval.ms=1000,auto.commit.interval.ms=200"
                    .to_owned(),
            ),
        ]
        };
    let mut a = Instance::start(&command, env("a"), &format!("{}-a", lang.name()));

    // Transfers flow until the test has seen the kill and the rebalance through.
    let stop = Arc::new(AtomicBool::new(false));
    let conn = producer_db.conn_string();
    let stop_load = Arc::clone(&stop);
    let load = tokio::spawn(async move {
        let mut client = connect(&conn).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(32);
        let mut n = 0;
        while n < 300 || !stop_load.load(Ordering::Relaxed) {
            let from = rng.gen_range(0..ACCOUNTS);
            let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
            transfer(&mut client, n, from, to, rng.gen_range(1..=50)).await;
            n += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        n
    });

    // The example creates its own tables.
    wait_count(
        &consumer,
        "SELECT count(*) FROM pg_tables WHERE tablename = 'ledger'",
        1,
        &mut [&mut a],
    )
    .await;
    let ledger = "SELECT count(*) FROM ledger WHERE account LIKE 'acct-%'";
    wait_count(&consumer, ledger, 100, &mut [&mut a]).await;
    // Mid-stream: applied, but its offsets not all committed; the restart re-reads them.
    a.kill();
    a.spawn();
    let before = count(&consumer, ledger).await;
    wait_count(&consumer, ledger, before + 100, &mut [&mut a]).await;
    let mut b = Instance::start(&command, env("b"), &format!("{}-b", lang.name()));
    wait_count(
        &consumer,
        "SELECT count(*) FROM ledger WHERE applied_by = 'b'",
        20,
        &mut [&mut a, &mut b],
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let transfers = load.await.unwrap();
    let want = i64::try_from(2 * transfers).unwrap();
    wait_count(&consumer, ledger, want, &mut [&mut a, &mut b]).await;
    conformance(
        &broker.bootstrap(),
        &conformance_topic,
        &consumer_db,
        &group,
    );
    // Both leave the group, committing; nothing may apply after this.
    for i in [&mut b, &mut a] {
        let status = i.stop();
        assert!(status.success(), "exit {status}:\n{}", i.log_text());
    }

    let produced = rows(&producer, "SELECT id, balance FROM accounts").await;
    let consumed: BTreeMap<String, i64> = rows(
        &consumer,
        "SELECT account, balance FROM balances WHERE account LIKE 'acct-%'",
    )
    .await
    .into_iter()
    .map(|(account, delta)| (account, START_BALANCE + delta))
    .collect();
    assert_eq!(
        consumed, produced,
        "the consumer's balances equal the producer's"
    );
    assert_eq!(
        count(&consumer, ledger).await,
        want,
        "no event applied twice"
    );
    assert_eq!(
        count(
            &consumer,
            "SELECT count(DISTINCT event_key) FROM ledger WHERE account LIKE 'acct-%'"
        )
        .await,
        want,
        "every event applied"
    );
    assert_eq!(
        count(
            &consumer,
            "SELECT count(*) FROM inbox_processed WHERE key LIKE 'transfer:%'"
        )
        .await,
        want,
        "the inbox has each key once"
    );
    let versions = rows(&producer, "SELECT id, version FROM accounts").await;
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for r in consumer
        .query(
            "SELECT account, version FROM ledger WHERE account LIKE 'acct-%' ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
    {
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
    let by = rows(
        &consumer,
        "SELECT applied_by, count(*) FROM ledger WHERE account LIKE 'acct-%' GROUP BY applied_by",
    )
    .await;
    assert!(
        by.get("a").is_some_and(|n| *n > 0) && by.get("b").is_some_and(|n| *n > 0),
        "both instances applied events: {by:?}"
    );
    let offsets = tokio::task::block_in_place(|| {
        committed_and_ends(&broker.bootstrap(), &group, &topic, partitions)
    });
    for (p, (at, end)) in offsets.iter().enumerate() {
        assert_eq!(at, end, "{topic}/{p}: the group committed up to the end");
    }
    let redelivered = [&a, &b]
        .iter()
        .map(|i| {
            i.log_text()
                .lines()
                .filter(|l| l.starts_with("duplicate "))
                .count()
        })
        .sum::<usize>();
    eprintln!(
        "{} kit: {transfers} transfers, {want} events applied once each (by instance {by:?}); \
         {redelivered} redelivered records skipped as duplicates",
        lang.name()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn python() {
    kit_scenario(Lang::Python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn go() {
    kit_scenario(Lang::Go).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn java() {
    kit_scenario(Lang::Java).await;
}
