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
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use pgtest::PgCluster;

use crate::broker::{self, BrokerKind, PARTITIONS};
use crate::drain::Outboxd;
use crate::kafkarun::{self, Drained, Paced, Relay, Watch};
use crate::pg::{self, Shape};
use crate::{Results, Settings};

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
    pub drained: Drained,
}

/// One paced rate through one tool.
#[derive(Debug, Clone)]
pub struct LatencyRow {
    pub tool: Tool,
    pub paced: Paced,
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
                drained: Drained {
                    events,
                    note: format!("FAILED: {e:#}"),
                    ..Drained::default()
                },
            },
        };
        let d = &row.drained;
        eprintln!(
            "outboxd-bench:   {:<8} {:>8} s to the last record ({} s to the first), relay cpu {} s, broker cpu {} s {}",
            tool.name(),
            crate::report::opt(d.seconds, 2),
            crate::report::opt(d.first, 2),
            crate::report::opt(d.relay_cpu, 2),
            crate::report::opt(d.broker_cpu, 2),
            d.note
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
    let (drained, relay) =
        kafkarun::drain(cluster, broker.pid(), &watch, events, tool.name(), || {
            spawn(s, connect, cluster, db, slot, &broker.bootstrap(), tool)
        })
        .await?;
    relay.stop()?;
    Ok(DrainRow {
        case: String::new(),
        tool,
        drained,
    })
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
    let mut i: i64 = 0;
    for tool in TOOLS {
        eprintln!("outboxd-bench: latency through {}", tool.name());
        let slot = format!("s_cmp_lat_{}", tool.name().to_lowercase());
        pg::create_slots(&sql, std::slice::from_ref(&slot)).await?;
        let broker = broker::start(BrokerKind::Kafka, &s.bins, &[pg::TOPIC]).await?;
        let watch = Watch::start(&broker.bootstrap(), pg::TOPIC)?;
        let mut relay = spawn(s, connect, cluster, db, &slot, &broker.bootstrap(), tool)?;
        kafkarun::warm_up(&sql, &mut i, &watch, &mut relay, tool.name()).await?;
        // The worker's JIT and the connector's first polls are not latency either.
        tokio::time::sleep(Duration::from_secs(5)).await;
        for &rate in rates {
            let paced = kafkarun::paced(
                cluster,
                db,
                rate,
                s.latency_secs,
                &mut i,
                &watch,
                relay.pid(),
                broker.pid(),
            )
            .await?;
            eprintln!(
                "outboxd-bench:   {:<8} {rate}/s: achieved {:.0}/s, received {}, p50/p99 {}/{} ms, relay {} µs/event, broker {} µs/event",
                tool.name(),
                paced.achieved,
                paced.received,
                crate::report::opt(paced.p50, 0),
                crate::report::opt(paced.p99, 0),
                crate::report::opt(paced.relay_cpu_us, 0),
                crate::report::opt(paced.broker_cpu_us, 0),
            );
            c.latency.push(LatencyRow { tool, paced });
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

/// `outboxd run` at its defaults, or a Kafka Connect worker running the Debezium connector.
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
            Ok(Relay::outboxd(o, log))
        }
        Tool::Debezium => {
            let dir = s.workdir.join(format!("connect-{slot}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let log = dir.join("connect.log");
            let child = spawn_connect(connect, cluster, db, slot, bootstrap, &dir, &log)?;
            Ok(Relay::connect(child, log))
        }
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
        writeln!(
            w,
            "{}",
            Drained::table_head("| backlog | relay ", "|---|---")
        )?;
        for row in &c.drains {
            let cells = row.drained.cells();
            writeln!(w, "| {} | {} {cells}", row.case, row.tool.name())?;
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
                    .and_then(|d| d.drained.seconds.zip(d.drained.relay_cpu))
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
        for row in &c.latency {
            let l = &row.paced;
            writeln!(
                w,
                "| {} | {} | {:.0} | {} / {} | {} | {} | {} | {} | {} |",
                row.tool.name(),
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
    kafkarun::splice(&s.out, BEGIN, END, &markdown(s, c, Some(&run)))
}
