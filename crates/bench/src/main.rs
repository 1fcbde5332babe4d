//! outboxd-bench: the benchmark suite behind docs/benchmarks.md. Run it with
//! `scripts/bench`, which builds the binaries, fetches Kafka Connect and Debezium and sets
//! the environment described in `Settings::from_env`.

// Rates, percentiles and scaled sizes are computed in f64 and rounded back; the values
// are small and non-negative.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod broker;
mod catchup;
mod compare;
mod drain;
mod eos;
mod eos_report;
mod kafkarun;
mod latency;
mod pg;
mod poll;
mod procfs;
mod ratios;
mod recvstream;
mod report;
mod shards;
mod steady;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

use broker::BrokerKind;
pub(crate) use catchup::{case_shape, catchup_case, drain_timeout, failed, report_drain};
use drain::{DrainResult, Target};
use pg::Shape;

/// Everything the suite reads from its environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// BENCH_SCALE: multiplies every backlog size (1 = the full suite).
    pub scale: f64,
    /// BENCH_BIN_DIR: where outboxd and outboxd-dev are (default: beside this binary).
    pub bins: PathBuf,
    /// BENCH_OUT: the report (default docs/benchmarks.md); the SVG goes beside it.
    pub out: PathBuf,
    /// BENCH_WORKDIR: logs and scratch files.
    pub workdir: PathBuf,
    /// BENCH_SECTIONS: catchup,debezium,progress,poll,latency,profile,steady,shards (the
    /// default), and ratios and eos, which run only when named
    pub sections: Vec<String>,
    /// BENCH_CASES: a,b,c
    pub cases: Vec<String>,
    /// BENCH_LATENCY_SECS: seconds per latency rate (default 60, 30 when scale < 1).
    pub latency_secs: f64,
    /// BENCH_LATENCY_RATES: events/s (default 1000,5000,20000).
    pub latency_rates: Vec<u64>,
    /// BENCH_CONNECT_CP / BENCH_DEBEZIUM_VERSION: the Kafka Connect worker's classpath
    /// with Debezium's PostgreSQL connector, for the `debezium` section.
    pub connect: Option<compare::Connect>,
    /// BENCH_DEBEZIUM_SKIP_REASON: why there is no classpath, for the report.
    pub debezium_skip: String,
    /// BENCH_COMMAND: how the suite was started, for the report.
    pub command: String,
    /// BENCH_CATCHUP_BROKERS: the catch-up drains' brokers (default kafka,mock).
    pub catchup_brokers: Vec<BrokerKind>,
    /// BENCH_POLL_BROKERS: brokers for the polling comparison (default kafka,mock).
    pub poll_brokers: Vec<BrokerKind>,
    /// BENCH_LATENCY_BROKERS: brokers for the latency runs (default kafka,mock).
    pub latency_brokers: Vec<BrokerKind>,
    /// BENCH_STEADY_BROKER: the steady-load and ratios runs' broker (default kafka).
    pub steady_broker: BrokerKind,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn list(name: &str, default: &str) -> Vec<String> {
    env_or(name, default)
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let scale: f64 = env_or("BENCH_SCALE", "1").parse().context("BENCH_SCALE")?;
        let exe_dir = std::env::current_exe()?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let bins = std::env::var("BENCH_BIN_DIR")
            .ok()
            .filter(|v| !v.is_empty())
            .map_or(exe_dir, PathBuf::from);
        let latency_default = if scale < 1.0 { "30" } else { "60" };
        let connect = std::env::var("BENCH_CONNECT_CP")
            .ok()
            .filter(|v| !v.is_empty())
            .map(|classpath| compare::Connect {
                classpath,
                version: env_or("BENCH_DEBEZIUM_VERSION", "unknown"),
            });
        Ok(Settings {
            scale,
            bins,
            out: PathBuf::from(env_or("BENCH_OUT", "docs/benchmarks.md")),
            workdir: PathBuf::from(env_or("BENCH_WORKDIR", "/tmp/outboxd-bench")),
            sections: list(
                "BENCH_SECTIONS",
                "catchup,debezium,progress,poll,latency,profile,steady,shards",
            ),
            cases: list("BENCH_CASES", "a,b,c"),
            latency_secs: env_or("BENCH_LATENCY_SECS", latency_default)
                .parse()
                .context("BENCH_LATENCY_SECS")?,
            latency_rates: list("BENCH_LATENCY_RATES", "1000,5000,20000")
                .iter()
                .map(|r| r.parse().context("BENCH_LATENCY_RATES"))
                .collect::<Result<_>>()?,
            connect,
            debezium_skip: env_or("BENCH_DEBEZIUM_SKIP_REASON", "BENCH_CONNECT_CP not set"),
            command: env_or("BENCH_COMMAND", "outboxd-bench"),
            catchup_brokers: broker::kinds("BENCH_CATCHUP_BROKERS", "kafka,mock")?,
            poll_brokers: broker::kinds("BENCH_POLL_BROKERS", "kafka,mock")?,
            latency_brokers: broker::kinds("BENCH_LATENCY_BROKERS", "kafka,mock")?,
            steady_broker: BrokerKind::parse(&env_or("BENCH_STEADY_BROKER", "kafka"))
                .context("BENCH_STEADY_BROKER")?,
        })
    }

    fn section(&self, name: &str) -> bool {
        self.sections.iter().any(|s| s == name)
    }

    fn scaled(&self, n: u64) -> u64 {
        ((n as f64 * self.scale).round() as u64).max(1)
    }
}

/// One catch-up case and everything measured on it.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    pub label: String,
    pub shape: Shape,
    pub generate_seconds: f64,
    pub wal_bytes: u64,
    pub drains: Vec<DrainResult>,
    pub profile: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PollResult {
    pub approach: String,
    pub broker: String,
    pub events: u64,
    pub seconds: f64,
    pub pg_cpu_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct LatencyResult {
    pub broker: String,
    pub rate: u64,
    pub achieved: f64,
    pub seconds: f64,
    pub received: usize,
    pub consumer: [Option<f64>; 3],
    pub histogram: [Option<f64>; 3],
    pub outboxd_cpu_per_event_us: Option<f64>,
}

#[derive(Debug, Clone, Default)]
pub struct Results {
    pub cases: Vec<CaseResult>,
    pub poll_events: u64,
    pub poll: Vec<PollResult>,
    pub latency: Vec<LatencyResult>,
    pub shards: Vec<shards::ShardResult>,
    pub compare: Option<compare::Comparison>,
    pub eos: Option<eos::Eos>,
    /// (broker, current RSS, peak RSS) of an idle outboxd, MiB.
    pub idle: Vec<(String, Option<f64>, Option<f64>)>,
    /// (broker, peak RSS after the latency runs), MiB.
    pub latency_hwm: Vec<(String, Option<f64>)>,
    pub steady: Vec<steady::SteadyRun>,
    /// (label, records on, drain) of the progress-record cost comparison.
    pub progress: Vec<(String, bool, DrainResult)>,
    pub progress_label: String,
    pub notes: Vec<String>,
    pub load_before: String,
    pub load_after: String,
    pub started: String,
    pub finished: String,
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outboxd-bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outboxd-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn shell(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

async fn run() -> Result<()> {
    let s = Settings::from_env()?;
    std::fs::create_dir_all(&s.workdir)?;
    let mut r = Results {
        load_before: shell("uptime"),
        started: shell("date -u '+%Y-%m-%d %H:%M:%S UTC'"),
        ..Results::default()
    };
    if s.connect.is_none() && s.section("debezium") {
        r.notes
            .push(format!("Debezium skipped: {}", s.debezium_skip));
    }
    eprintln!("outboxd-bench: scale {} sections {:?}", s.scale, s.sections);
    let cluster = pg::start_cluster()?;
    let versions = report::versions(&s, &cluster);
    if s.section("catchup") {
        let compare = compare_builds("BENCH_CATCHUP_COMPARE");
        for case in s.cases.clone() {
            match catchup_case(&s, &cluster, &case, &compare).await {
                Ok(c) => r.cases.push(c),
                Err(e) => r.notes.push(format!("case ({case}) failed: {e:#}")),
            }
        }
    }
    if s.section("debezium") {
        if let Some(connect) = &s.connect {
            match compare::run(&s, &cluster, connect).await {
                Ok(c) => r.compare = Some(c),
                Err(e) => r.notes.push(format!("outboxd vs Debezium failed: {e:#}")),
            }
        }
    }
    if s.section("eos") {
        match eos::run(&s, &cluster).await {
            Ok(e) => r.eos = Some(e),
            Err(e) => r
                .notes
                .push(format!("exactly-once vs at-least-once failed: {e:#}")),
        }
    }
    if s.section("progress") {
        if let Err(e) = progress_cost(&s, &cluster, &mut r).await {
            r.notes
                .push(format!("progress-record comparison failed: {e:#}"));
        }
    }
    if s.section("poll") {
        if let Err(e) = polling(&s, &cluster, &mut r).await {
            r.notes.push(format!("polling comparison failed: {e:#}"));
        }
    }
    if s.section("shards") {
        match shards::suite(&s, &cluster).await {
            Ok(results) => r.shards = results,
            Err(e) => r.notes.push(format!("shards comparison failed: {e:#}")),
        }
    }
    if s.section("latency") {
        for kind in s.latency_brokers.clone() {
            if let Err(e) = latency_suite(&s, &cluster, kind, &mut r).await {
                r.notes
                    .push(format!("latency suite on {} failed: {e:#}", kind.name()));
            }
        }
    }
    if s.section("steady") {
        match steady::run(&s, &cluster).await {
            Ok(runs) => r.steady = runs,
            Err(e) => r
                .notes
                .push(format!("steady-load comparison failed: {e:#}")),
        }
    }
    let mut ratios_failed = None;
    if s.section("ratios") {
        if let Err(e) = ratios::run(&s, &cluster).await {
            r.notes.push(format!("ratios failed: {e:#}"));
            ratios_failed = Some(e);
        }
    }
    r.load_after = shell("uptime");
    r.finished = shell("date -u '+%Y-%m-%d %H:%M:%S UTC'");
    for n in &r.notes {
        eprintln!("outboxd-bench: note: {n}");
    }
    // A ratios-only run (above), a debezium-only or an eos-only run replaces its own section
    // of the report, so it can be rerun without the 40-minute suite.
    if s.sections.iter().all(|x| x == "debezium") {
        compare::splice(&s, &r)?;
        eprintln!(
            "outboxd-bench: updated the Debezium section of {}",
            s.out.display()
        );
    } else if s.sections.iter().all(|x| x == "eos") {
        eos::splice(&s, &r, &versions)?;
        eprintln!(
            "outboxd-bench: updated the exactly-once section of {}",
            s.out.display()
        );
    } else if s.sections.iter().any(|x| x != "ratios") {
        report::write(&s, &r, &versions)?;
        eprintln!("outboxd-bench: wrote {}", s.out.display());
    } else if let Some(e) = ratios_failed {
        return Err(e.context("ratios"));
    }
    Ok(())
}

/// Runs of the progress comparison: records on and off alternate, so a change in the
/// machine's load (others build here) hits both alike.
const PROGRESS_RUNS: usize = 3;

/// The cost of the progress record: the same backlog (case b's shape) drained by outboxd
/// with the record written every OUTBOXD_PROGRESS_INTERVAL_MS (the default) and with it
/// disabled (OUTBOXD_PROGRESS_TOPIC empty), alternating, on the mock cluster.
async fn progress_cost(s: &Settings, cluster: &pgtest::PgCluster, r: &mut Results) -> Result<()> {
    let (shape, label) = case_shape(s, "b")?;
    let db = "bench_progress";
    eprintln!("outboxd-bench: progress records on vs off, {label}");
    pg::create_database(cluster, db, false).await?;
    let sql = pg::connect(cluster, db).await?;
    let slots: Vec<String> = (0..PROGRESS_RUNS)
        .flat_map(|i| [format!("s_progress_on_{i}"), format!("s_progress_off_{i}")])
        .collect();
    pg::create_slots(&sql, &slots).await?;
    pg::generate(cluster, db, shape).await?;
    let end = pg::current_lsn(&sql).await?;
    sql.batch_execute("CHECKPOINT").await?;
    let events = shape.events();
    r.progress_label = label;
    for (i, slot) in slots.iter().enumerate() {
        let on = i % 2 == 0;
        let t = Target {
            cluster,
            db,
            slot,
            end_lsn: &end,
            events,
            timeout: drain_timeout(events, 2000),
        };
        let log = s.workdir.join(format!("outboxd-progress-{slot}.log"));
        let extra: &[(&str, &str)] = if on {
            &[("OUTBOXD_PROGRESS_TOPIC", "outboxd.progress")]
        } else {
            &[("OUTBOXD_PROGRESS_TOPIC", "")]
        };
        // outboxd-dev's mock broker makes the progress topic itself.
        let broker = broker::start(BrokerKind::Mock, &s.bins, &[pg::TOPIC]).await?;
        let d = report_drain(drain::outboxd_with(&t, &s.bins, &broker, &log, None, extra).await?);
        r.progress.push((format!("run {}", i / 2 + 1), on, d));
    }
    Ok(())
}

/// Other outboxd builds to run beside this one (`var`: DIR or LABEL=DIR, comma-separated),
/// e.g. the build before a change.
fn compare_builds(var: &str) -> Vec<(String, PathBuf)> {
    list(var, "")
        .iter()
        .enumerate()
        .map(|(n, c)| match c.split_once('=') {
            Some((l, d)) => (l.to_owned(), PathBuf::from(d)),
            None => (format!("outboxd (compare {})", n + 1), PathBuf::from(c)),
        })
        .collect()
}

async fn polling(s: &Settings, cluster: &pgtest::PgCluster, r: &mut Results) -> Result<()> {
    let db = "bench_poll";
    let txns = s.scaled(1_000);
    let shape = Shape::Batched { txns, rows: 100 };
    let events = shape.events();
    r.poll_events = events;
    eprintln!("outboxd-bench: polling vs CDC on {events} events in transactions of 100 rows");
    pg::create_database(cluster, db, true).await?;
    let sql = pg::connect(cluster, db).await?;
    let kinds = s.poll_brokers.clone();
    let slots: Vec<String> = kinds
        .iter()
        .map(|b| format!("s_poll_cdc_{}", b.name()))
        .collect();
    pg::create_slots(&sql, &slots).await?;
    pg::generate(cluster, db, shape).await?;
    let end = pg::current_lsn(&sql).await?;
    sql.batch_execute("VACUUM ANALYZE public.outbox").await?;
    sql.batch_execute("CHECKPOINT").await?;
    for (b, slot) in kinds.iter().zip(&slots) {
        let log = s.workdir.join(format!("outboxd-poll-cdc-{}.log", b.name()));
        let broker = broker::start(*b, &s.bins, &[pg::TOPIC]).await?;
        let t = Target {
            cluster,
            db,
            slot,
            end_lsn: &end,
            events,
            timeout: drain_timeout(events, 1000),
        };
        let d = report_drain(drain::outboxd(&t, &s.bins, &broker, &log, None).await?);
        r.poll.push(PollResult {
            approach: "outboxd (CDC)".into(),
            broker: b.name().into(),
            events,
            seconds: d.seconds,
            pg_cpu_seconds: d.pg_cpu_seconds,
        });
    }
    sql.batch_execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = 'bench_poll'",
    )
    .await?;
    for b in &kinds {
        for workers in [1usize, 4] {
            poll::reset(cluster, db).await?;
            let broker = broker::start(*b, &s.bins, &[pg::TOPIC]).await?;
            let cpu0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
            let out = poll::run(cluster, db, &broker.bootstrap(), workers).await?;
            let cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - cpu0;
            let left: i64 = sql
                .query_one(
                    "SELECT count(*) FROM public.outbox WHERE sent_at IS NULL",
                    &[],
                )
                .await?
                .get(0);
            if left != 0 || out.events != events {
                r.notes.push(format!(
                    "polling with {workers} worker(s) on {}: sent {} of {events}, {left} left unsent",
                    b.name(),
                    out.events
                ));
            }
            eprintln!(
                "outboxd-bench:   polling {workers} worker(s) {:<6} {:>8.0} events/s  pg cpu {:.2} s",
                b.name(),
                drain::rate(out.events, out.seconds),
                cpu
            );
            r.poll.push(PollResult {
                approach: format!(
                    "polling, {workers} worker{}",
                    if workers == 1 { "" } else { "s" }
                ),
                broker: b.name().into(),
                events: out.events,
                seconds: out.seconds,
                pg_cpu_seconds: cpu,
            });
        }
    }
    drop(sql);
    pg::drop_database(cluster, db).await?;
    Ok(())
}

async fn latency_suite(
    s: &Settings,
    cluster: &pgtest::PgCluster,
    kind: BrokerKind,
    r: &mut Results,
) -> Result<()> {
    let db = "bench_lat";
    eprintln!("outboxd-bench: latency on {}", kind.name());
    pg::create_database(cluster, db, false).await?;
    // The slot before the relay: the warm-up inserts at once, and outboxd refuses to
    // create a slot over rows it would skip.
    pg::create_slots(&pg::connect(cluster, db).await?, &["s_latency".to_owned()]).await?;
    let broker = broker::start(kind, &s.bins, &[pg::TOPIC]).await?;
    let stamper = latency::Stamper::start(&broker.bootstrap(), pg::TOPIC)?;
    let log = s.workdir.join("outboxd-latency.log");
    let relay = drain::Outboxd::spawn(
        &s.bins,
        cluster,
        db,
        "s_latency",
        &broker.bootstrap(),
        &log,
        None,
    )?;
    // Warm up: one event end to end.
    let mut i: i64 = 0;
    let sql = pg::connect(cluster, db).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stamper.count() == 0 {
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "no warm-up event arrived; outboxd log: {}",
                drain::tail(&log)
            );
        }
        sql.execute(
            &format!(
                "INSERT INTO public.outbox ({}) VALUES ({})",
                pg::COLUMNS,
                pg::row_values("$1::bigint")
            ),
            &[&i],
        )
        .await?;
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    r.idle.push((
        kind.name().into(),
        procfs::rss_mib(relay.pid()),
        procfs::peak_rss_mib(relay.pid()),
    ));
    for &rate in &s.latency_rates {
        let before = latency::histogram(&relay.metrics()?);
        let cpu0 = procfs::cpu_seconds(relay.pid());
        let from = drain::unix_ms();
        let (inserted, secs) = latency::load(cluster, db, rate, s.latency_secs, i).await?;
        i += i64::try_from(inserted).unwrap_or(0) + 1;
        let to = drain::unix_ms();
        // Let the tail arrive.
        let want = stamper.count();
        let wait_until = std::time::Instant::now() + Duration::from_secs(20);
        let mut last = want;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = stamper.count();
            if (now == last && stamper.window(from, to + 1).len() as u64 >= inserted)
                || std::time::Instant::now() > wait_until
            {
                break;
            }
            last = now;
        }
        let after = latency::histogram(&relay.metrics()?);
        let cpu = procfs::cpu_seconds(relay.pid())
            .zip(cpu0)
            .map(|(a, b)| (a - b) / inserted.max(1) as f64 * 1e6);
        let mut lat = stamper.window(from, to + 1);
        lat.sort_unstable();
        let qs = [0.5, 0.99, 0.999];
        let res = LatencyResult {
            broker: kind.name().into(),
            rate,
            achieved: drain::rate(inserted, secs),
            seconds: secs,
            received: lat.len(),
            consumer: qs.map(|q| latency::percentile(&lat, q)),
            histogram: qs.map(|q| latency::histogram_percentile(&before, &after, q)),
            outboxd_cpu_per_event_us: cpu,
        };
        eprintln!(
            "outboxd-bench:   {} {rate}/s: achieved {:.0}/s, received {}, consumer p50/p99/p99.9 {:?} ms, histogram {:?} ms",
            res.broker, res.achieved, res.received, res.consumer, res.histogram
        );
        r.latency.push(res);
    }
    r.latency_hwm
        .push((kind.name().into(), procfs::peak_rss_mib(relay.pid())));
    relay.stop()?;
    drop(stamper);
    drop(broker);
    drop(sql);
    pg::drop_database(cluster, db).await?;
    Ok(())
}
