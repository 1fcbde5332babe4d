//! Draining a backlog: pg_recvlogical (the one-slot limit) and outboxd.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use pgtest::PgCluster;

use crate::pg;
use crate::procfs;

/// What one drain measured.
#[derive(Debug, Clone, Default)]
pub struct DrainResult {
    pub tool: String,
    pub broker: String,
    pub events: u64,
    pub seconds: f64,
    pub pg_cpu_seconds: f64,
    pub tool_cpu_seconds: Option<f64>,
    /// The broker process's CPU during the drain (it shares the machine's cores).
    pub broker_cpu_seconds: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub note: String,
}

impl DrainResult {
    pub fn events_per_sec(&self) -> f64 {
        rate(self.events, self.seconds)
    }
}

pub fn rate(events: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        events as f64 / seconds
    } else {
        0.0
    }
}

pub struct Target<'a> {
    pub cluster: &'a PgCluster,
    pub db: &'a str,
    pub slot: &'a str,
    pub end_lsn: &'a str,
    pub events: u64,
    pub timeout: Duration,
}

pub async fn recvlogical(t: &Target<'_>) -> Result<DrainResult> {
    let sql = pg::connect(t.cluster, t.db).await?;
    let cpu0 = procfs::cluster_cpu_seconds(t.cluster.data_dir())?;
    let started = Instant::now();
    let times = std::env::temp_dir().join(format!("outboxd-bench-recvlogical-{}.time", t.slot));
    let _ = std::fs::remove_file(&times);
    let timed = Path::new("/usr/bin/time").is_file();
    let mut cmd = if timed {
        let mut c = Command::new("/usr/bin/time");
        c.args(["-f", "%U %S %M", "-o"])
            .arg(&times)
            .arg(t.cluster.bindir().join("pg_recvlogical"));
        c
    } else {
        Command::new(t.cluster.bindir().join("pg_recvlogical"))
    };
    let mut child = recvlogical_args(
        &mut cmd,
        t.cluster,
        t.db,
        t.slot,
        pg::PUBLICATION,
        Some(t.end_lsn),
        "/dev/null",
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .context("starting pg_recvlogical")?;
    let status = wait_timeout(&mut child, t.timeout)?;
    let seconds = started.elapsed().as_secs_f64();
    // The walsender exits after pg_recvlogical; its CPU time is counted once it is reaped.
    for _ in 0..100 {
        let active: bool = sql
            .query_one("SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", &[&t.slot])
            .await?
            .get(0);
        if !active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cpu = procfs::cluster_cpu_seconds(t.cluster.data_dir())? - cpu0;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status {
        bail!("pg_recvlogical failed or timed out: {err}");
    }
    drop(sql);
    // "%U %S %M": user s, system s, max RSS KiB
    let measured: Vec<f64> = std::fs::read_to_string(&times)
        .unwrap_or_default()
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let (tool_cpu, rss) = match measured.as_slice() {
        [u, s, m] => (Some(u + s), Some(m / 1024.0)),
        _ => (None, None),
    };
    Ok(DrainResult {
        tool: "pg_recvlogical".into(),
        broker: "-".into(),
        events: t.events,
        seconds,
        pg_cpu_seconds: cpu,
        tool_cpu_seconds: tool_cpu,
        peak_rss_mib: rss,
        ..DrainResult::default()
    })
}

/// pg_recvlogical's arguments for streaming `slot` of `db` through `publication` to
/// `file` (`/dev/null`, or `-` for stdout), until `end_lsn` when given (otherwise until
/// it is stopped).
pub fn recvlogical_args<'c>(
    cmd: &'c mut Command,
    cluster: &PgCluster,
    db: &str,
    slot: &str,
    publication: &str,
    end_lsn: Option<&str>,
    file: &str,
) -> &'c mut Command {
    cmd.args(["-h", cluster.host(), "-p", &cluster.port().to_string()])
        .args(["-U", cluster.superuser(), "-d", db, "--slot", slot])
        .args(["--start", "--no-loop"]);
    if let Some(end) = end_lsn {
        cmd.args(["--endpos", end]);
    }
    cmd.args(["-f", file])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={publication}"))
}

/// outboxd's environment for text pgoutput values instead of its default binary ones.
pub const TEXT_VALUES: [(&str, &str); 1] = [("OUTBOXD_PGOUTPUT_BINARY", "off")];

/// A running `outboxd run`.
pub struct Outboxd {
    pub child: Child,
    pub http: String,
}

impl Outboxd {
    pub fn spawn(
        bins: &Path,
        cluster: &PgCluster,
        db: &str,
        slot: &str,
        bootstrap: &str,
        log: &Path,
        perf_data: Option<&Path>,
    ) -> Result<Outboxd> {
        Self::spawn_with(bins, cluster, db, slot, bootstrap, log, perf_data, &[])
    }

    /// [`Outboxd::spawn`] with extra environment (e.g. OUTBOXD_PROGRESS_TOPIC).
    #[allow(clippy::too_many_arguments)]
    pub fn spawn_with(
        bins: &Path,
        cluster: &PgCluster,
        db: &str,
        slot: &str,
        bootstrap: &str,
        log: &Path,
        perf_data: Option<&Path>,
        extra: &[(&str, &str)],
    ) -> Result<Outboxd> {
        let port = crate::broker::free_port()?;
        let http = format!("127.0.0.1:{port}");
        let outboxd = bins.join("outboxd");
        let mut cmd = match perf_data {
            Some(data) => {
                let mut c = Command::new("perf");
                let extra = std::env::var("BENCH_PERF_RECORD").unwrap_or_else(|_| "-F 999".into());
                c.arg("record")
                    .args(extra.split_whitespace())
                    .arg("-o")
                    .arg(data)
                    .arg("--")
                    .arg(&outboxd);
                c
            }
            None => Command::new(&outboxd),
        };
        let logfile = std::fs::File::create(log)?;
        cmd.arg("run")
            .env("PGHOST", cluster.host())
            .env("PGPORT", cluster.port().to_string())
            .env("PGUSER", cluster.superuser())
            .env("PGDATABASE", db)
            .env("PGSSLMODE", "disable")
            .env("OUTBOXD_SLOT", slot)
            .env("OUTBOXD_PUBLICATION", pg::PUBLICATION)
            .env("OUTBOXD_CREATE_SLOT", "true")
            .env("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", bootstrap)
            .env("OUTBOXD_HTTP_ADDR", &http)
            // BENCH_OUTBOXD_LOG=info: the relay's start-up and catch-up reports in its log.
            .env(
                "OUTBOXD_LOG",
                std::env::var("BENCH_OUTBOXD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(logfile.try_clone()?)
            .stderr(logfile);
        let child = cmd.spawn().context("starting outboxd")?;
        Ok(Outboxd { child, http })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn metrics(&self) -> Result<String> {
        http_get(&self.http, "/metrics")
    }

    /// SIGTERM, then wait (bounded), then SIGKILL.
    pub fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if !wait_timeout(&mut self.child, Duration::from_secs(40))? {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        Ok(())
    }
}

pub fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out))
}

/// The value of an unlabelled metric line `outboxd_<name> <value>`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

pub async fn outboxd(
    t: &Target<'_>,
    bins: &Path,
    broker: &crate::broker::Broker,
    log: &Path,
    perf_data: Option<&Path>,
) -> Result<DrainResult> {
    outboxd_with(t, bins, broker, log, perf_data, &[]).await
}

/// [`outboxd`] with extra environment for the relay.
pub async fn outboxd_with(
    t: &Target<'_>,
    bins: &Path,
    broker: &crate::broker::Broker,
    log: &Path,
    perf_data: Option<&Path>,
    extra: &[(&str, &str)],
) -> Result<DrainResult> {
    let sql = pg::connect(t.cluster, t.db).await?;
    let cpu0 = procfs::cluster_cpu_seconds(t.cluster.data_dir())?;
    let broker_cpu = || broker.pid().and_then(procfs::cpu_seconds);
    let broker0 = broker_cpu();
    let started = Instant::now();
    let relay = Outboxd::spawn_with(
        bins,
        t.cluster,
        t.db,
        t.slot,
        &broker.bootstrap(),
        log,
        perf_data,
        extra,
    )?;
    let pid = relay.pid();
    let mut reached = false;
    while started.elapsed() < t.timeout {
        if pg::slot_reached(&sql, t.slot, t.end_lsn).await? {
            reached = true;
            break;
        }
        if let Ok(Some(status)) = relay_exited(&relay) {
            bail!("outboxd exited early ({status}); log: {}", tail(log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = procfs::cluster_cpu_seconds(t.cluster.data_dir())? - cpu0;
    let tool_cpu = procfs::cpu_seconds(pid);
    let broker_cpu_seconds = broker_cpu().zip(broker0).map(|(a, b)| a - b);
    let rss = procfs::peak_rss_mib(pid);
    if std::env::var("BENCH_DIAG").is_ok() {
        for (name, cpu, vol, invol) in procfs::threads(pid) {
            eprintln!(
                "outboxd-bench:     thread {name:<16} cpu {cpu:.2} s  ctxt vol {vol} invol {invol}"
            );
        }
    }
    let published = relay
        .metrics()
        .ok()
        .and_then(|m| metric(&m, "outboxd_events_published_total"));
    relay.stop()?;
    let mut note = String::new();
    if !reached {
        note = format!("timed out after {:.0} s", t.timeout.as_secs_f64());
    }
    if let Some(p) = published {
        if p < t.events as f64 {
            note.push_str(&format!(" only {p} events acked"));
        }
    }
    Ok(DrainResult {
        tool: "outboxd".into(),
        broker: broker.name().into(),
        events: t.events,
        seconds,
        pg_cpu_seconds: cpu,
        tool_cpu_seconds: if perf_data.is_some() { None } else { tool_cpu },
        broker_cpu_seconds,
        peak_rss_mib: if perf_data.is_some() { None } else { rss },
        note,
    })
}

fn relay_exited(relay: &Outboxd) -> Result<Option<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", relay.pid()))?;
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or("");
    Ok((state == "Z").then(|| "zombie".to_owned()))
}

pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Waits for the child up to `limit`; true if it exited successfully, false on a failure
/// exit or timeout (the child is then killed).
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Result<bool> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status.success());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
