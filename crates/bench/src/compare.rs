//! outboxd against Debezium, both on a real Apache Kafka broker: Debezium's PostgreSQL
//! connector (pgoutput) with the Outbox Event Router SMT in a Kafka Connect standalone
//! worker, as it is deployed, against `outboxd run`. Both read the same publication through
//! slots of their own and route `public.outbox` to `outbox.<aggregate_type>` keyed by
//! aggregate_id; one consumer, the same for both, sees what reached the broker.
//!
//! Measured for each: process start to the last record at the consumer for three backlog
//! shapes, and insert-to-consumer latency at paced rates, each with the relay process's CPU
//! (and, in a column of its own, the broker JVM's).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pgtest::PgCluster;
use rdkafka::message::Message;

use crate::broker::{self, BrokerKind, PARTITIONS};
use crate::drain::{self, unix_ms, wait_timeout, Outboxd};
use crate::pg::{self, Shape};
use crate::{latency, procfs, Results, Settings};

/// How to run Kafka Connect with Debezium: the worker's classpath (every jar of
/// scripts/kafka/debezium-pom.xml) and the versions, for the report.
#[derive(Debug, Clone)]
pub struct Connect {
    pub classpath: String,
    pub version: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Outboxd,
    Debezium,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Outboxd => "outboxd",
            Tool::Debezium => "Debezium",
        }
    }
}

const TOOLS: [Tool; 2] = [Tool::Outboxd, Tool::Debezium];

/// One backlog drained by one tool.
#[derive(Debug, Clone)]
pub struct DrainRow {
    pub case: String,
    pub tool: Tool,
    pub events: u64,
    /// Process start to the last record's arrival at the consumer.
    pub seconds: Option<f64>,
    /// Process start to the first record's arrival.
    pub first: Option<f64>,
    /// The relay process's CPU over its whole life up to the last record.
    pub relay_cpu: Option<f64>,
    pub broker_cpu: Option<f64>,
    pub pg_cpu: f64,
    pub peak_rss_mib: Option<f64>,
    pub note: String,
}

/// One paced rate through one tool.
#[derive(Debug, Clone)]
pub struct LatencyRow {
    pub tool: Tool,
    pub rate: u64,
    pub achieved: f64,
    pub inserted: u64,
    pub received: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub relay_cpu_us: Option<f64>,
    pub broker_cpu_us: Option<f64>,
    pub note: String,
}

#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub drains: Vec<DrainRow>,
    pub latency: Vec<LatencyRow>,
    pub latency_secs: f64,
    pub dbz_settings: String,
    pub notes: Vec<String>,
}

/// Debezium's connector settings that differ from its defaults for throughput and latency
/// (poll.interval.ms 500 would add up to half a second to every quiet-time event); the
/// same as the embedded-engine runs before. BENCH_DBZ_POLL_MS, BENCH_DBZ_BATCH override.
fn dbz_tuning() -> (String, String) {
    (
        crate::env_or("BENCH_DBZ_POLL_MS", "10"),
        crate::env_or("BENCH_DBZ_BATCH", "8192"),
    )
}

/// BENCH_DEBEZIUM_CASES (default a,b,c; 100k events each at scale 1) and
/// BENCH_DEBEZIUM_RATES (default 1000,5000 events/s, BENCH_LATENCY_SECS each).
pub async fn run(s: &Settings, cluster: &PgCluster, connect: &Connect) -> Result<Comparison> {
    let (poll, batch) = dbz_tuning();
    let mut c = Comparison {
        latency_secs: s.latency_secs,
        dbz_settings: format!(
            "poll.interval.ms={poll}, max.batch.size={batch}, max.queue.size={}",
            batch.parse::<u64>().unwrap_or(8192) * 4
        ),
        ..Comparison::default()
    };
    for case in crate::list("BENCH_DEBEZIUM_CASES", "a,b,c") {
        if let Err(e) = drain_case(s, cluster, connect, &case, &mut c).await {
            c.notes.push(format!("case ({case}) failed: {e:#}"));
        }
    }
    let rates: Vec<u64> = crate::list("BENCH_DEBEZIUM_RATES", "1000,5000")
        .iter()
        .map(|r| r.parse().context("BENCH_DEBEZIUM_RATES"))
        .collect::<Result<_>>()?;
    if !rates.is_empty() {
        if let Err(e) = latency_runs(s, cluster, connect, &rates, &mut c).await {
            c.notes.push(format!("latency failed: {e:#}"));
        }
    }
    for n in &c.notes {
        eprintln!("outboxd-bench:   note: {n}");
    }
    Ok(c)
}

fn shape(s: &Settings, case: &str) -> Result<(Shape, String)> {
    let n = s.scaled(100_000);
    Ok(match case {
        "a" => (
            Shape::SingleRow { n },
            format!("(a) {n} single-row transactions"),
        ),
        "b" => {
            let txns = (n / 100).max(1);
            (
                Shape::Batched { txns, rows: 100 },
                format!("(b) {txns} transactions of 100 rows"),
            )
        }
        "c" => (
            Shape::OneTxn { n },
            format!("(c) one transaction of {n} rows"),
        ),
        other => bail!("unknown case {other:?} (expected a, b or c)"),
    })
}

async fn drain_case(
    s: &Settings,
    cluster: &PgCluster,
    connect: &Connect,
    case: &str,
    c: &mut Comparison,
) -> Result<()> {
    let (shape, label) = shape(s, case)?;
    let db = format!("bench_dbz_{case}");
    eprintln!("outboxd-bench: outboxd vs Debezium, {label}");
    pg::create_database(cluster, &db, false).await?;
    let sql = pg::connect(cluster, &db).await?;
    let slots: Vec<String> = TOOLS
        .iter()
        .map(|t| format!("s_cmp_{}", t.name().to_lowercase()))
        .collect();
    pg::create_slots(&sql, &slots).await?;
    pg::generate(cluster, &db, shape).await?;
    sql.batch_execute("CHECKPOINT").await?;
    let events = shape.events();
    for (tool, slot) in TOOLS.iter().zip(&slots) {
        let row = match drain_one(s, cluster, connect, &db, slot, *tool, events).await {
            Ok(mut r) => {
                r.case.clone_from(&label);
                r
            }
            Err(e) => DrainRow {
                case: label.clone(),
                tool: *tool,
                events,
                seconds: None,
                first: None,
                relay_cpu: None,
                broker_cpu: None,
                pg_cpu: 0.0,
                peak_rss_mib: None,
                note: format!("FAILED: {e:#}"),
            },
        };
        eprintln!(
            "outboxd-bench:   {:<8} {:>8} s to the last record ({} s to the first), relay cpu {} s, broker cpu {} s {}",
            tool.name(),
            crate::report::opt(row.seconds, 2),
            crate::report::opt(row.first, 2),
            crate::report::opt(row.relay_cpu, 2),
            crate::report::opt(row.broker_cpu, 2),
            row.note
        );
        c.drains.push(row);
    }
    drop(sql);
    pg::drop_database(cluster, &db).await?;
    Ok(())
}

async fn drain_one(
    s: &Settings,
    cluster: &PgCluster,
    connect: &Connect,
    db: &str,
    slot: &str,
    tool: Tool,
    events: u64,
) -> Result<DrainRow> {
    let broker = broker::start(BrokerKind::Kafka, &s.bins, &[pg::TOPIC]).await?;
    let watch = Watch::start(&broker.bootstrap(), pg::TOPIC)?;
    let broker_pid = broker.pid();
    let broker0 = broker_pid.and_then(procfs::cpu_seconds);
    let pg0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let started = Instant::now();
    let mut relay = Relay::spawn(s, connect, cluster, db, slot, &broker.bootstrap(), tool)?;
    let timeout = Duration::from_secs(180 + events / 200);
    let mut note = String::new();
    let mut polls = 0u64;
    loop {
        if watch.count() >= events {
            break;
        }
        polls += 1;
        if started.elapsed() > timeout {
            note = format!(
                "timed out after {:.0} s with {} of {events} records",
                timeout.as_secs_f64(),
                watch.count()
            );
            break;
        }
        // Once a second: Connect's check reads its log.
        if polls.is_multiple_of(100) {
            if let Some(status) = relay.exited()? {
                bail!(
                    "{} failed ({status}); log: {}",
                    tool.name(),
                    drain::tail(&relay.log)
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let relay_cpu = procfs::cpu_seconds(relay.pid());
    let peak_rss_mib = procfs::peak_rss_mib(relay.pid());
    let broker_cpu = broker_pid
        .and_then(procfs::cpu_seconds)
        .zip(broker0)
        .map(|(a, b)| a - b);
    let pg_cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - pg0;
    let (first, last) = watch.first_last();
    let since = |t: Option<Instant>| t.map(|t| t.saturating_duration_since(started).as_secs_f64());
    relay.stop()?;
    let seconds = if note.is_empty() { since(last) } else { None };
    let extra = watch.count().saturating_sub(events);
    if extra > 0 {
        note.push_str(&format!(" {extra} records more than inserted (duplicates)"));
    }
    Ok(DrainRow {
        case: String::new(),
        tool,
        events,
        seconds,
        first: since(first),
        relay_cpu,
        broker_cpu,
        pg_cpu,
        peak_rss_mib,
        note: note.trim().to_owned(),
    })
}

/// The load's insert with the insert's wall clock (ms) as the payload's first field `t`,
/// which both relays carry through unchanged: the latency is measured from it by one
/// consumer for both, as neither has a commit-time header the other has.
fn stamped_insert() -> String {
    format!(
        "INSERT INTO public.outbox ({}) VALUES (gen_random_uuid(), '{}', 'order-' || ($1::bigint % 1000), 'OrderCreated', \
         jsonb_build_object('t', floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'orderId', $1::bigint, \
         'customerId', 'customer-' || ($1::bigint % 5000), 'amount', ($1::bigint % 100000) / 100.0, 'currency', 'EUR', \
         'sku', md5($1::bigint::text), 'note', 'outboxd benchmark event'))",
        pg::COLUMNS,
        pg::AGGREGATE_TYPE
    )
}

async fn latency_runs(
    s: &Settings,
    cluster: &PgCluster,
    connect: &Connect,
    rates: &[u64],
    c: &mut Comparison,
) -> Result<()> {
    let db = "bench_dbz_latency";
    pg::create_database(cluster, db, false).await?;
    let sql = pg::connect(cluster, db).await?;
    let insert = stamped_insert();
    let mut i: i64 = 0;
    for tool in TOOLS {
        eprintln!("outboxd-bench: latency through {}", tool.name());
        let slot = format!("s_cmp_lat_{}", tool.name().to_lowercase());
        pg::create_slots(&sql, std::slice::from_ref(&slot)).await?;
        let broker = broker::start(BrokerKind::Kafka, &s.bins, &[pg::TOPIC]).await?;
        let watch = Watch::start(&broker.bootstrap(), pg::TOPIC)?;
        let broker_pid = broker.pid();
        let mut relay = Relay::spawn(s, connect, cluster, db, &slot, &broker.bootstrap(), tool)?;
        // Warm-up: one record end to end (the worker's start-up is not latency).
        let deadline = Instant::now() + Duration::from_secs(180);
        while watch.count() == 0 {
            if Instant::now() > deadline {
                bail!(
                    "no warm-up record through {}; log: {}",
                    tool.name(),
                    drain::tail(&relay.log)
                );
            }
            if let Some(status) = relay.exited()? {
                bail!(
                    "{} failed ({status}); log: {}",
                    tool.name(),
                    drain::tail(&relay.log)
                );
            }
            sql.execute(insert.as_str(), &[&i]).await?;
            i += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        for &rate in rates {
            let cpu0 = procfs::cpu_seconds(relay.pid());
            let b0 = broker_pid.and_then(procfs::cpu_seconds);
            let from = unix_ms();
            let (inserted, secs) =
                latency::load_sql(cluster, db, rate, 1, s.latency_secs, i, insert.clone()).await?;
            i += i64::try_from(inserted).unwrap_or(0) + 1;
            let to = unix_ms();
            let wait_until = Instant::now() + Duration::from_secs(30);
            while (watch.window(from, to + 1).len() as u64) < inserted
                && Instant::now() < wait_until
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let per_event = |a: Option<f64>, b: Option<f64>| {
                a.zip(b)
                    .map(|(a, b)| (a - b) / inserted.max(1) as f64 * 1e6)
            };
            let relay_cpu_us = per_event(procfs::cpu_seconds(relay.pid()), cpu0);
            let broker_cpu_us = per_event(broker_pid.and_then(procfs::cpu_seconds), b0);
            let mut lat = watch.window(from, to + 1);
            lat.sort_unstable();
            let row = LatencyRow {
                tool,
                rate,
                achieved: drain::rate(inserted, secs),
                inserted,
                received: lat.len(),
                p50: latency::percentile(&lat, 0.5),
                p99: latency::percentile(&lat, 0.99),
                relay_cpu_us,
                broker_cpu_us,
                note: if (lat.len() as u64) < inserted {
                    format!("{} of {inserted} arrived within 30 s", lat.len())
                } else {
                    String::new()
                },
            };
            eprintln!(
                "outboxd-bench:   {:<8} {rate}/s: achieved {:.0}/s, received {}, p50/p99 {}/{} ms, relay {} µs/event, broker {} µs/event",
                tool.name(),
                row.achieved,
                row.received,
                crate::report::opt(row.p50, 0),
                crate::report::opt(row.p99, 0),
                crate::report::opt(row.relay_cpu_us, 0),
                crate::report::opt(row.broker_cpu_us, 0),
            );
            c.latency.push(row);
        }
        relay.stop()?;
        drop(watch);
        drop(broker);
        sql.execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await?;
    }
    drop(sql);
    pg::drop_database(cluster, db).await?;
    Ok(())
}

/// `outboxd run`, or a Kafka Connect standalone worker running the Debezium connector.
struct Relay {
    /// None once stopped.
    kind: Option<RelayKind>,
    log: PathBuf,
}

enum RelayKind {
    Outboxd(Outboxd),
    Connect(Child),
}

impl Relay {
    fn spawn(
        s: &Settings,
        connect: &Connect,
        cluster: &PgCluster,
        db: &str,
        slot: &str,
        bootstrap: &str,
        tool: Tool,
    ) -> Result<Relay> {
        match tool {
            Tool::Outboxd => {
                let log = s.workdir.join(format!("outboxd-{slot}.log"));
                let o = Outboxd::spawn(&s.bins, cluster, db, slot, bootstrap, &log, None)?;
                Ok(Relay {
                    kind: Some(RelayKind::Outboxd(o)),
                    log,
                })
            }
            Tool::Debezium => {
                let dir = s.workdir.join(format!("connect-{slot}"));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir)?;
                let log = dir.join("connect.log");
                let child = spawn_connect(connect, cluster, db, slot, bootstrap, &dir, &log)?;
                Ok(Relay {
                    kind: Some(RelayKind::Connect(child)),
                    log,
                })
            }
        }
    }

    fn pid(&self) -> u32 {
        match &self.kind {
            Some(RelayKind::Outboxd(o)) => o.pid(),
            Some(RelayKind::Connect(c)) => c.id(),
            None => 0,
        }
    }

    /// Why the relay is of no more use, if it is not: its process ended, or (Connect) its
    /// connector or task failed, which leaves the worker running with nothing to do.
    fn exited(&mut self) -> Result<Option<String>> {
        let child = match &mut self.kind {
            Some(RelayKind::Outboxd(o)) => &mut o.child,
            Some(RelayKind::Connect(c)) => c,
            None => return Ok(Some("stopped".into())),
        };
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status.to_string()));
        }
        if matches!(self.kind, Some(RelayKind::Connect(_))) {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let failed = [
                "unrecoverable exception",
                "Failed to start connector",
                "Failed to create connector",
            ];
            if let Some(f) = failed.iter().find(|f| log.contains(*f)) {
                return Ok(Some(format!("the Connect worker logged {f:?}")));
            }
        }
        Ok(None)
    }

    fn stop(mut self) -> Result<()> {
        match self.kind.take() {
            None => Ok(()),
            Some(RelayKind::Outboxd(o)) => o.stop(),
            Some(RelayKind::Connect(mut c)) => {
                let _ = Command::new("kill")
                    .args(["-TERM", &c.id().to_string()])
                    .status();
                if !wait_timeout(&mut c, Duration::from_secs(30))? {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                Ok(())
            }
        }
    }
}

/// A relay left behind by an early return (a failed run) must not run on into the next.
impl Drop for Relay {
    fn drop(&mut self) {
        let child = match &mut self.kind {
            Some(RelayKind::Outboxd(o)) => &mut o.child,
            Some(RelayKind::Connect(c)) => c,
            None => return,
        };
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A Connect standalone worker as `bin/connect-standalone.sh` starts one (its heap and GC
/// flags), every jar on the classpath; the connector's offsets in a file of `dir`.
fn spawn_connect(
    connect: &Connect,
    cluster: &PgCluster,
    db: &str,
    slot: &str,
    bootstrap: &str,
    dir: &Path,
    log: &Path,
) -> Result<Child> {
    let rest_port = broker::free_port()?;
    let worker = dir.join("worker.properties");
    std::fs::write(
        &worker,
        format!(
            "bootstrap.servers={bootstrap}
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename={offsets}
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:{rest_port}
plugin.discovery={discovery}
",
            offsets = dir.join("connect.offsets").display(),
            discovery = crate::env_or("BENCH_CONNECT_PLUGIN_DISCOVERY", "service_load"),
        ),
    )?;
    let (poll, batch) = dbz_tuning();
    let queue = batch.parse::<u64>().unwrap_or(8192) * 4;
    let connector = dir.join("debezium.properties");
    std::fs::write(
        &connector,
        format!(
            "name=outboxd-bench
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname={host}
database.port={port}
database.user={user}
database.password=
database.dbname={db}
topic.prefix=bench
plugin.name=pgoutput
slot.name={slot}
slot.drop.on.stop=false
publication.name={publication}
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=public.outbox
poll.interval.ms={poll}
max.batch.size={batch}
max.queue.size={queue}
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.id=id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.table.fields.additional.placement=event_type:header:event_type
transforms.outbox.route.topic.replacement=outbox.${{routedByValue}}
",
            host = cluster.host(),
            port = cluster.port(),
            user = cluster.superuser(),
            publication = pg::PUBLICATION,
        ),
    )?;
    let log4j = dir.join("log4j2.properties");
    let level = if std::env::var("BENCH_DBZ_DEBUG").is_ok() {
        "info"
    } else {
        "warn"
    };
    std::fs::write(
        &log4j,
        format!(
            "status = error
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss.SSS}} %-5level %c{{1}} - %msg%n
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = STDOUT
"
        ),
    )?;
    let out = std::fs::File::create(log)?;
    Command::new("java")
        .args(["-Xms256M", "-Xmx2G", "-server", "-XX:+UseG1GC"])
        .args([
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
        ])
        .args([
            "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true",
        ])
        .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
        .args(["-cp", &connect.classpath])
        .arg("org.apache.kafka.connect.cli.ConnectStandalone")
        .arg(&worker)
        .arg(&connector)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting the Kafka Connect worker (java)")
}

/// A consumer of every partition from the beginning (read_committed), counting records and
/// noting the first's and last's arrival, and (arrival − `t`) for records whose value has
/// a payload field `t`.
struct Watch {
    count: Arc<AtomicU64>,
    times: Arc<Mutex<(Option<Instant>, Option<Instant>)>>,
    samples: Arc<Mutex<Vec<(i64, i64)>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(bootstrap: &str, topic: &str) -> Result<Watch> {
        let consumer = latency::latency_consumer(bootstrap, topic, "outboxd-bench-compare")?;
        let count = Arc::new(AtomicU64::new(0));
        let times = Arc::new(Mutex::new((None, None)));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (count2, times2, samples2, stop2) = (
            Arc::clone(&count),
            Arc::clone(&times),
            Arc::clone(&samples),
            Arc::clone(&stop),
        );
        let handle = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let now = Instant::now();
                count2.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut t) = times2.lock() {
                    t.0.get_or_insert(now);
                    t.1 = Some(now);
                }
                if let Some(t) = m.payload().and_then(stamp) {
                    if let Ok(mut g) = samples2.lock() {
                        g.push((t, unix_ms()));
                    }
                }
            }
        });
        Ok(Watch {
            count,
            times,
            samples,
            stop,
            handle: Some(handle),
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn first_last(&self) -> (Option<Instant>, Option<Instant>) {
        self.times.lock().map(|t| *t).unwrap_or((None, None))
    }

    /// Latencies (ms) of records inserted within [from, to).
    fn window(&self, from: i64, to: i64) -> Vec<i64> {
        crate::latency::window(&self.samples, from, to)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The number after `"t":` in a JSON value (jsonb's text form puts a space after the
/// colon; outboxd and Debezium each pass the payload on as that text).
fn stamp(value: &[u8]) -> Option<i64> {
    const KEY: &[u8] = b"\"t\":";
    let at = value.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = value.get(at..)?;
    let digits: Vec<u8> = rest
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

const BEGIN: &str = "<!-- debezium-comparison:begin -->";
const END: &str = "<!-- debezium-comparison:end -->";

fn cell(v: Option<f64>, digits: usize) -> String {
    crate::report::opt(v, digits)
}

/// The comparison's section of the report, between markers so that [`splice`] can replace
/// it alone.
/// `run`: when and under what load, for a section run on its own.
pub fn markdown(s: &Settings, c: &Comparison, run: Option<&str>) -> String {
    let mut w = String::new();
    let _ = write_markdown(&mut w, s, c, run);
    w
}

fn write_markdown(
    w: &mut String,
    s: &Settings,
    c: &Comparison,
    run: Option<&str>,
) -> std::fmt::Result {
    writeln!(w, "{BEGIN}")?;
    writeln!(w, "## outboxd vs Debezium on Apache Kafka\n")?;
    if let Some(run) = run {
        writeln!(w, "*{run}*\n")?;
    }
    writeln!(
        w,
        "One run, one machine (2 cores shared by PostgreSQL, the broker, the relay, the load and the consumer), \
         scale {} (`BENCH_SCALE`; 1 = 100k events per backlog). Broker: Apache Kafka {} (one KRaft node, a fresh JVM \
         per run, topic `{}` with {PARTITIONS} partitions created beforehand). Debezium: {} \
         (debezium-connector-postgres) in a Kafka Connect {} standalone worker (`ConnectStandalone`, heap and GC flags of `connect-standalone.sh`, String converters, \
         file offsets), PostgresConnector with pgoutput on an existing slot and publication, `snapshot.mode=no_data`, \
         {}, Outbox Event Router SMT routing by aggregate_type to `outbox.${{routedByValue}}` keyed by aggregate_id; \
         the worker's producer at Connect's defaults. Debezium 3.6.1 is built against Kafka 4.3 and calls \
         `org.apache.kafka.common.utils.Sanitizer`, which 4.4 moved to `…utils.internals`: without a \
         one-class forwarder on the worker's classpath (`scripts/kafka/compat/`) its task dies at start. \
         outboxd: `outboxd run` at its defaults (it creates its progress topic on the fresh broker at \
         start). Each reads the same publication through its own slot.\n",
        s.scale,
        outboxd_test_broker::kafka::KAFKA_VERSION,
        pg::TOPIC,
        s.connect.as_ref().map_or("–", |x| x.version.as_str()),
        outboxd_test_broker::kafka::KAFKA_VERSION,
        c.dbz_settings,
    )?;
    if !c.drains.is_empty() {
        writeln!(
            w,
            "### Catch-up: process start to the last record at the consumer\n\n\
             The backlog is generated first; then the relay process starts (outboxd; the Connect JVM, which \
             also starts the connector) and a read_committed consumer, assigned to every partition before \
             the start, counts records until all have arrived. *events/s first → last*: the rate once \
             records flow, without either relay's start-up (the JVM's and the connector's, outboxd's \
             connections and progress topic). *Relay CPU*: the relay process's user+system \
             time over its whole life (start-up included), from /proc. *Broker CPU*: the Kafka JVM's over the \
             same span, **not** included in the relay's. *PG CPU*: every PostgreSQL process of the cluster.\n"
        )?;
        writeln!(w, "| backlog | relay | seconds to last record | events/s | first record after s | events/s first → last | relay CPU s | relay CPU µs / event | broker CPU s | PG CPU s | peak RSS MiB | note |")?;
        writeln!(
            w,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        )?;
        for d in &c.drains {
            let streaming = d
                .seconds
                .zip(d.first)
                .filter(|(l, f)| l > f)
                .map(|(l, f)| drain::rate(d.events.saturating_sub(1), l - f));
            writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                d.case,
                d.tool.name(),
                cell(d.seconds, 2),
                cell(d.seconds.map(|x| drain::rate(d.events, x)), 0),
                cell(d.first, 2),
                cell(streaming, 0),
                cell(d.relay_cpu, 2),
                cell(d.relay_cpu.map(|x| x / d.events.max(1) as f64 * 1e6), 1),
                cell(d.broker_cpu, 2),
                d.pg_cpu,
                cell(d.peak_rss_mib, 0),
                d.note.replace('|', "/").replace('\n', " "),
            )?;
        }
        writeln!(w)?;
        let mut ratios = String::new();
        let cases: Vec<&String> = c
            .drains
            .iter()
            .map(|d| &d.case)
            .fold(Vec::new(), |mut v, x| {
                if !v.contains(&x) {
                    v.push(x);
                }
                v
            });
        for case in cases {
            let get = |t: Tool| {
                c.drains
                    .iter()
                    .find(|d| &d.case == case && d.tool == t)
                    .and_then(|d| d.seconds.zip(d.relay_cpu))
            };
            if let (Some((os, oc)), Some((ds, dc))) = (get(Tool::Outboxd), get(Tool::Debezium)) {
                let _ = writeln!(
                    ratios,
                    "| {case} | {:.1}× | {:.1}× |",
                    ds / os.max(1e-9),
                    dc / oc.max(1e-9)
                );
            }
        }
        if !ratios.is_empty() {
            writeln!(w, "| backlog | Debezium's time / outboxd's | Debezium's relay CPU / outboxd's |\n|---|---:|---:|")?;
            w.push_str(&ratios);
            writeln!(w)?;
        }
    }
    if !c.latency.is_empty() {
        writeln!(
            w,
            "### Latency: insert to consumer, paced single-row transactions\n\n\
             {} s per rate over 4 pipelining connections, after a warm-up record and 5 s idle. Each insert \
             puts its wall clock (`clock_timestamp()`, ms) into the payload as `t`; the consumer (the same \
             for both, `fetch.wait.max.ms=2`) subtracts it from the arrival time. Commit follows the insert \
             within the same autocommit statement (fsync off), so this is commit-to-consumer to within a \
             fraction of a millisecond, taken the same way for both relays. *CPU µs / event*: over the \
             rate's window divided by the events inserted; the broker's is its own column, **not** in the \
             relay's.\n",
            c.latency_secs
        )?;
        writeln!(w, "| relay | target events/s | achieved | received | p50 ms | p99 ms | relay CPU µs / event | broker CPU µs / event | note |")?;
        writeln!(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|")?;
        for l in &c.latency {
            writeln!(
                w,
                "| {} | {} | {:.0} | {} / {} | {} | {} | {} | {} | {} |",
                l.tool.name(),
                l.rate,
                l.achieved,
                l.received,
                l.inserted,
                cell(l.p50, 0),
                cell(l.p99, 0),
                cell(l.relay_cpu_us, 1),
                cell(l.broker_cpu_us, 1),
                l.note,
            )?;
        }
        writeln!(w)?;
    }
    if !c.notes.is_empty() {
        for n in &c.notes {
            writeln!(w, "- {}", n.replace('\n', " "))?;
        }
        writeln!(w)?;
    }
    writeln!(
        w,
        "Reproduce: `BENCH_SECTIONS=debezium scripts/bench` (this section only: it replaces itself in \
         `docs/benchmarks.md`; `BENCH_SCALE`, `BENCH_DEBEZIUM_CASES=a,b,c`, `BENCH_DEBEZIUM_RATES=1000,5000`, \
         `BENCH_LATENCY_SECS`, `BENCH_DBZ_POLL_MS`, `BENCH_DBZ_BATCH`). `scripts/bench` fetches the worker's \
         and Debezium's jars with Maven from `scripts/kafka/debezium-pom.xml`. Command of this run: `{}`.\n",
        s.command
    )?;
    writeln!(w, "{END}\n")?;
    Ok(())
}

/// Replaces the comparison's section of the report (or adds it before the machine's
/// section), leaving the rest of the report as the last full run wrote it.
pub fn splice(s: &Settings, r: &Results) -> Result<()> {
    let Some(c) = &r.compare else {
        bail!("no comparison to write: {}", r.notes.join("; "));
    };
    let run = format!(
        "Run {} → {}, on its own (`BENCH_SECTIONS=debezium`); load before `{}`, after `{}`.",
        r.started, r.finished, r.load_before, r.load_after
    );
    let section = markdown(s, c, Some(&run));
    let old = std::fs::read_to_string(&s.out).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => {
            let after = old
                .get(e + END.len()..)
                .unwrap_or("")
                .trim_start_matches('\n');
            format!("{}{section}{after}", old.get(..b).unwrap_or(""))
        }
        _ => match old.find("## Machine and versions") {
            Some(at) => format!(
                "{}{section}{}",
                old.get(..at).unwrap_or(""),
                old.get(at..).unwrap_or("")
            ),
            None => format!("{old}\n{section}"),
        },
    };
    std::fs::write(&s.out, new)?;
    Ok(())
}
