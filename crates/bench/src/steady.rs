//! Steady load: what a streaming client costs the primary and itself while the outbox
//! receives a paced insert load, against the same load with no client at all and with
//! pg_recvlogical reading the same publication.
//!
//! Every run gets a fresh slot, and the runs of one load alternate between the tools
//! (load only, pg_recvlogical, outboxd, and optionally a second outboxd build), repeated,
//! so the noise of a shared machine falls on all of them alike.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pgtest::PgCluster;
use tokio_postgres::Client;

use crate::broker::{self, Broker};
use crate::drain::{self, Outboxd};
use crate::latency::{self, Stamper};
use crate::pg;
use crate::procfs;
use crate::recvstream::Receiver;
use crate::Settings;

/// One paced load: `rate` events/s in transactions of `rows` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub rate: u64,
    pub rows: u64,
}

impl Load {
    /// "2000x10": 2000 events/s in transactions of 10 rows.
    pub fn parse(s: &str) -> Result<Load> {
        let (rate, rows) = s.split_once('x').unwrap_or((s, "1"));
        Ok(Load {
            rate: rate.trim().parse().context("BENCH_STEADY_LOADS rate")?,
            rows: rows.trim().parse().context("BENCH_STEADY_LOADS rows")?,
        })
    }

    pub fn label(self) -> String {
        if self.rows == 1 {
            format!("{}/s, single-row transactions", self.rate)
        } else {
            format!("{}/s in transactions of {} rows", self.rate, self.rows)
        }
    }
}

/// What reads the slot during a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tool {
    LoadOnly,
    /// pg_recvlogical writing to /dev/null, as in the catch-up drains: its CPU.
    RecvLogical,
    /// pg_recvlogical writing to a pipe the bench reads: its commit→receive latency. Not
    /// its CPU: writing into a pipe (and waking its reader) costs it more than writing to
    /// /dev/null (A/B at 5,000 single-row events/s: 0.55-0.62 s against 0.79-0.92 s).
    RecvLogicalPiped,
    /// An outboxd build: a label, the directory holding its binary, and extra
    /// environment (e.g. text pgoutput values).
    Outboxd {
        label: String,
        dir: PathBuf,
        env: Vec<(String, String)>,
    },
}

impl Tool {
    /// An outboxd build with its defaults.
    pub fn outboxd(label: &str, dir: &Path) -> Tool {
        Tool::Outboxd {
            label: label.to_owned(),
            dir: dir.to_path_buf(),
            env: Vec::new(),
        }
    }

    /// The same build with text pgoutput values, labelled "`label` (text values)".
    pub fn outboxd_text(label: &str, dir: &Path) -> Tool {
        Tool::Outboxd {
            label: text_label(label),
            dir: dir.to_path_buf(),
            env: drain::TEXT_VALUES
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Tool::LoadOnly => LOAD_ONLY.into(),
            Tool::RecvLogical => RECVLOGICAL.into(),
            Tool::RecvLogicalPiped => RECVLOGICAL_PIPED.into(),
            Tool::Outboxd { label, .. } => label.clone(),
        }
    }
}

pub const LOAD_ONLY: &str = "load only";
pub const RECVLOGICAL: &str = "pg_recvlogical";
pub const RECVLOGICAL_PIPED: &str = "pg_recvlogical (output read)";

/// The name of a build's text-values runs.
pub fn text_label(label: &str) -> String {
    format!("{label} (text values)")
}

/// What one steady comparison runs: each load with its tools, alternating within each
/// repeat.
#[derive(Debug, Clone)]
pub struct Plan {
    pub loads: Vec<(Load, Vec<Tool>)>,
    pub secs: f64,
    pub repeats: u32,
}

/// One measured run.
#[derive(Debug, Clone)]
pub struct SteadyRun {
    pub load: Load,
    /// Which repeat of the load (0-based): runs of one repeat ran back to back.
    pub repeat: u32,
    pub tool: String,
    pub events: u64,
    pub seconds: f64,
    /// CPU of every PostgreSQL process during the load (incl. its tail).
    pub pg_cpu: f64,
    /// CPU of the slot's walsender.
    pub walsender_cpu: Option<f64>,
    /// CPU of the client's other backends (outboxd's side SQL connection).
    pub side_cpu: Option<f64>,
    /// CPU of the client process (outboxd or pg_recvlogical).
    pub tool_cpu: Option<f64>,
    /// outboxd: standby status updates sent during the run.
    pub status_updates: Option<f64>,
    /// Commit→arrival p50 and p99 (ms) of the run's events: outboxd's at the consumer,
    /// pg_recvlogical's at the bench reading its output.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    /// outboxd: peak RSS (MiB).
    pub peak_rss: Option<f64>,
}

/// BENCH_STEADY_LOADS (default 2000x10,1000x1,5000x1), BENCH_STEADY_SECS (default 60,
/// 20 when scale < 1), BENCH_STEADY_REPEATS (default 2), BENCH_STEADY_COMPARE: a directory
/// with another outboxd binary run alternately with this one (e.g. the build before a
/// change), BENCH_STEADY_TOOLS (which of them).
pub async fn run(s: &Settings, cluster: &PgCluster) -> Result<Vec<SteadyRun>> {
    let loads: Vec<Load> = crate::list("BENCH_STEADY_LOADS", "2000x10,1000x1,5000x1")
        .iter()
        .map(|l| Load::parse(l))
        .collect::<Result<_>>()?;
    let default_secs = if s.scale < 1.0 { "20" } else { "60" };
    let (secs, repeats) = secs_and_repeats(default_secs)?;
    // BENCH_STEADY_TOOLS: a subset by name (load,recvlogical,piped,outboxd,text,compare);
    // `text` is this build with text pgoutput values, `piped` pg_recvlogical read by the
    // bench for its latency.
    let only = crate::list(
        "BENCH_STEADY_TOOLS",
        "load,recvlogical,piped,outboxd,compare",
    );
    let mut keyed = vec![
        ("load", Tool::LoadOnly),
        ("recvlogical", Tool::RecvLogical),
        ("piped", Tool::RecvLogicalPiped),
        ("outboxd", Tool::outboxd("outboxd", &s.bins)),
        ("text", Tool::outboxd_text("outboxd", &s.bins)),
    ];
    for (label, dir) in crate::compare_builds("BENCH_STEADY_COMPARE") {
        keyed.push(("compare", Tool::outboxd(&label, &dir)));
    }
    let tools: Vec<Tool> = keyed
        .into_iter()
        .filter(|(key, _)| only.iter().any(|o| o == key))
        .map(|(_, t)| t)
        .collect();
    let plan = Plan {
        loads: loads.into_iter().map(|l| (l, tools.clone())).collect(),
        secs,
        repeats,
    };
    run_plan(s, cluster, &plan).await
}

/// BENCH_STEADY_SECS (default `default_secs`) and BENCH_STEADY_REPEATS (default 2).
pub fn secs_and_repeats(default_secs: &str) -> Result<(f64, u32)> {
    let secs: f64 = crate::env_or("BENCH_STEADY_SECS", default_secs)
        .parse()
        .context("BENCH_STEADY_SECS")?;
    let repeats: u32 = crate::env_or("BENCH_STEADY_REPEATS", "2")
        .parse()
        .context("BENCH_STEADY_REPEATS")?;
    Ok((secs, repeats))
}

/// Runs `plan`: for each load, `repeats` rounds of its tools one after another.
pub async fn run_plan(s: &Settings, cluster: &PgCluster, plan: &Plan) -> Result<Vec<SteadyRun>> {
    let secs = plan.secs;
    let db = "bench_steady";
    pg::create_database(cluster, db, false).await?;
    let sql = pg::connect(cluster, db).await?;
    let broker = broker::start(s.steady_broker, &s.bins, &[pg::TOPIC]).await?;
    let stamper = Stamper::start(&broker.bootstrap(), pg::TOPIC)?;
    let mut out = Vec::new();
    let mut next_i: i64 = 0;
    let mut n = 0u32;
    for (load, tools) in &plan.loads {
        let load = *load;
        for rep in 0..plan.repeats {
            for tool in tools {
                n += 1;
                let slot = format!("s_steady_{n}");
                let r = one(
                    s, cluster, &sql, &broker, &stamper, tool, load, secs, &slot, next_i,
                )
                .await;
                next_i += i64::try_from(load.rate).unwrap_or(0) * (secs as i64 + 1) + 100;
                let _ = sql
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await;
                match r {
                    Ok(mut run) => {
                        run.repeat = rep;
                        eprintln!(
                            "outboxd-bench:   steady {} rep {rep} {:<22} pg cpu {:.2} s, walsender {}, side {}, client {} s, status updates {}, p50/p99 {}/{} ms",
                            load.label(),
                            run.tool,
                            run.pg_cpu,
                            fmt(run.walsender_cpu),
                            fmt(run.side_cpu),
                            fmt(run.tool_cpu),
                            fmt(run.status_updates),
                            fmt(run.p50),
                            fmt(run.p99),
                        );
                        out.push(run);
                    }
                    Err(e) => eprintln!(
                        "outboxd-bench:   steady {} {} FAILED: {e:#}",
                        load.label(),
                        tool.name()
                    ),
                }
                // Keep the table small: the load of one run should not depend on the rows
                // left by earlier ones.
                sql.batch_execute("TRUNCATE public.outbox; CHECKPOINT")
                    .await?;
            }
        }
    }
    drop(stamper);
    drop(broker);
    drop(sql);
    pg::drop_database(cluster, db).await?;
    Ok(out)
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

enum Running {
    None,
    RecvLogical(Child, Option<Receiver>),
    Outboxd(Outboxd),
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Running::None => None,
            Running::RecvLogical(c, _) => Some(c.id()),
            Running::Outboxd(o) => Some(o.pid()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn one(
    s: &Settings,
    cluster: &PgCluster,
    sql: &Client,
    broker: &Broker,
    stamper: &Stamper,
    tool: &Tool,
    load: Load,
    secs: f64,
    slot: &str,
    start_i: i64,
) -> Result<SteadyRun> {
    if *tool != Tool::LoadOnly {
        pg::create_slots(sql, &[slot.to_owned()]).await?;
    }
    let running = match tool {
        Tool::LoadOnly => Running::None,
        Tool::RecvLogical | Tool::RecvLogicalPiped => {
            let pipe = *tool == Tool::RecvLogicalPiped;
            let mut child = drain::recvlogical_args(
                &mut Command::new(cluster.bindir().join("pg_recvlogical")),
                cluster,
                "bench_steady",
                slot,
                pg::PUBLICATION,
                None,
                if pipe { "-" } else { "/dev/null" },
            )
            .stdin(Stdio::null())
            .stdout(if pipe { Stdio::piped() } else { Stdio::null() })
            .stderr(Stdio::null())
            .spawn()
            .context("starting pg_recvlogical")?;
            let rx = child.stdout.take().map(Receiver::start);
            Running::RecvLogical(child, rx)
        }
        Tool::Outboxd { dir, env, .. } => {
            let log = s.workdir.join(format!("outboxd-steady-{slot}.log"));
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Running::Outboxd(Outboxd::spawn_with(
                dir,
                cluster,
                "bench_steady",
                slot,
                &broker.bootstrap(),
                &log,
                None,
                &env,
            )?)
        }
    };
    let result = measure(
        cluster, sql, stamper, tool, &running, load, secs, slot, start_i,
    )
    .await;
    match running {
        Running::None => {}
        Running::RecvLogical(mut c, rx) => {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            if !drain::wait_timeout(&mut c, Duration::from_secs(10))? {
                let _ = c.kill();
                let _ = c.wait();
            }
            if let Some(reader) = rx.and_then(Receiver::finish) {
                if reader.errors > 0 || reader.pending() > 0 {
                    eprintln!(
                        "outboxd-bench:   pg_recvlogical's output: {} messages did not decode (last: {:?}), {} bytes of an unfinished one",
                        reader.errors,
                        reader.last_error,
                        reader.pending()
                    );
                }
            }
        }
        Running::Outboxd(o) => o.stop()?,
    }
    // The walsender must be gone before its slot is dropped.
    for _ in 0..250 {
        if active_pid(sql, slot).await?.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    result
}

async fn active_pid(sql: &Client, slot: &str) -> Result<Option<i32>> {
    Ok(sql
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .and_then(|r| r.get::<_, Option<i32>>(0)))
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    cluster: &PgCluster,
    sql: &Client,
    stamper: &Stamper,
    tool: &Tool,
    running: &Running,
    load: Load,
    secs: f64,
    slot: &str,
    start_i: i64,
) -> Result<SteadyRun> {
    // Streaming first: the slot active, and for outboxd one event through end to end.
    let mut walsender = None;
    if *tool != Tool::LoadOnly {
        let deadline = Instant::now() + Duration::from_secs(60);
        while walsender.is_none() {
            if Instant::now() > deadline {
                bail!("the client did not start streaming from {slot} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            walsender = active_pid(sql, slot).await?;
        }
    }
    if let Running::Outboxd(o) = running {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = o
                .metrics()
                .ok()
                .and_then(|m| drain::metric(&m, "outboxd_status_updates_sent_total"));
            if up.is_some() {
                break;
            }
            if Instant::now() > deadline {
                bail!("outboxd served no metrics within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Let start-up work (first slot checks, first progress record) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ws_pid = walsender.and_then(|p| u32::try_from(p).ok());
    // outboxd's side connection (slot statistics, publication checks, heartbeats).
    let side: Vec<u32> = if matches!(running, Running::Outboxd(_)) {
        sql.query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'outboxd' AND backend_type = 'client backend'",
            &[],
        )
        .await?
        .iter()
        .filter_map(|r| u32::try_from(r.get::<_, i32>(0)).ok())
        .collect()
    } else {
        Vec::new()
    };
    let side_cpu_now = || -> Option<f64> {
        if side.is_empty() {
            return None;
        }
        side.iter().map(|p| procfs::cpu_seconds(*p)).sum()
    };
    let side0 = side_cpu_now();
    let updates = |r: &Running| match r {
        Running::Outboxd(o) => o
            .metrics()
            .ok()
            .and_then(|m| drain::metric(&m, "outboxd_status_updates_sent_total")),
        _ => None,
    };
    let diag = std::env::var("BENCH_DIAG").is_ok();
    let threads0 = match (diag, running.pid()) {
        (true, Some(pid)) => procfs::threads(pid),
        _ => Vec::new(),
    };
    let pg0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let ws0 = ws_pid.and_then(procfs::cpu_seconds);
    let tool0 = running.pid().and_then(procfs::cpu_seconds);
    let up0 = updates(running);
    let from = drain::unix_ms();
    let (events, seconds) =
        latency::load_txns(cluster, "bench_steady", load.rate, load.rows, secs, start_i).await?;
    let to = drain::unix_ms();
    // The tail: what the client still has to read and acknowledge.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pg_cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - pg0;
    let walsender_cpu = ws_pid
        .and_then(procfs::cpu_seconds)
        .zip(ws0)
        .map(|(a, b)| a - b);
    let tool_cpu = running
        .pid()
        .and_then(procfs::cpu_seconds)
        .zip(tool0)
        .map(|(a, b)| a - b);
    let status_updates = updates(running).zip(up0).map(|(a, b)| a - b);
    if let (true, Some(pid)) = (diag, running.pid()) {
        for (name, cpu, vol, invol) in procfs::threads(pid) {
            let before = threads0.iter().find(|t| t.0 == name);
            let (c0, v0, i0) = before.map_or((0.0, 0, 0), |t| (t.1, t.2, t.3));
            eprintln!(
                "outboxd-bench:     {} thread {name:<16} cpu {:.2} s  ctxt vol {} invol {}",
                tool.name(),
                cpu - c0,
                vol.saturating_sub(v0),
                invol.saturating_sub(i0)
            );
        }
    }
    let side_cpu = side_cpu_now().zip(side0).map(|(a, b)| a - b);
    let peak_rss = match running {
        Running::Outboxd(o) => procfs::peak_rss_mib(o.pid()),
        _ => None,
    };
    // Both in ms: the consumer's samples are whole ms, pg_recvlogical's µs.
    let (lat, unit_ms) = match running {
        Running::Outboxd(_) => (Some(stamper.window(from, to + 1)), 1.0),
        Running::RecvLogical(_, Some(rx)) => (Some(rx.window(from, to + 1)), 1000.0),
        Running::RecvLogical(_, None) => (None, 1.0),
        Running::None => (None, 1.0),
    };
    let (p50, p99) = match lat {
        Some(mut lat) => {
            lat.sort_unstable();
            if (lat.len() as u64) < events {
                eprintln!(
                    "outboxd-bench:   steady {}: only {} of {events} events arrived",
                    tool.name(),
                    lat.len()
                );
            }
            (
                latency::percentile(&lat, 0.5).map(|v| v / unit_ms),
                latency::percentile(&lat, 0.99).map(|v| v / unit_ms),
            )
        }
        None => (None, None),
    };
    Ok(SteadyRun {
        load,
        repeat: 0,
        tool: tool.name(),
        events,
        seconds,
        pg_cpu,
        walsender_cpu,
        side_cpu,
        tool_cpu,
        status_updates,
        p50,
        p99,
        peak_rss,
    })
}
