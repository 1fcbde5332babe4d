//! Past one walsender: the same backlog of single-row transactions drained through 1, 2
//! and 4 shards (an outbox hash-partitioned by aggregate id, one publication and slot per
//! partition), by pg_recvlogical (one process per slot) and by one outboxd process
//! relaying every shard. Every walsender decodes all of the WAL, so the primary's CPU
//! grows with the shard count: measured per 100k events.

use std::fmt::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pgtest::PgCluster;

use crate::broker::{self, BrokerKind};
use crate::drain::{self, wait_timeout};
use crate::{pg, procfs, Settings};

#[derive(Debug, Clone)]
pub struct ShardResult {
    pub shards: u32,
    pub tool: String,
    pub events: u64,
    pub seconds: f64,
    pub pg_cpu_seconds: f64,
    pub tool_cpu_seconds: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub note: String,
}

impl ShardResult {
    fn events_per_sec(&self) -> f64 {
        drain::rate(self.events, self.seconds)
    }

    fn pg_cpu_per_100k(&self) -> f64 {
        if self.events == 0 {
            0.0
        } else {
            self.pg_cpu_seconds * 100_000.0 / self.events as f64
        }
    }
}

/// Shard counts measured (BENCH_SHARDS, default 1,2,4).
fn counts() -> Vec<u32> {
    std::env::var("BENCH_SHARDS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

pub async fn suite(s: &Settings, cluster: &PgCluster) -> Result<Vec<ShardResult>> {
    let events = s.scaled(300_000);
    let mut out = Vec::new();
    for n in counts() {
        eprintln!("outboxd-bench: shards {n}, {events} single-row transactions");
        let db = format!("bench_shards_{n}");
        create_sharded_database(cluster, &db, n).await?;
        let sql = pg::connect(cluster, &db).await?;
        let recv_slots: Vec<String> = (0..n).map(|i| format!("rl_{i}")).collect();
        let relay_slots: Vec<String> = (0..n).map(|i| format!("ob_{i}")).collect();
        pg::create_slots(&sql, &recv_slots).await?;
        pg::create_slots(&sql, &relay_slots).await?;
        pg::generate(cluster, &db, pg::Shape::SingleRow { n: events }).await?;
        let end = pg::current_lsn(&sql).await?;
        // Before any drain: autovacuum of the fresh partitions would otherwise land in
        // whichever drain runs first and be counted as its PostgreSQL CPU.
        sql.batch_execute("VACUUM ANALYZE public.outbox").await?;
        sql.batch_execute("CHECKPOINT").await?;
        let timeout = Duration::from_secs(60 + events / 1_000);
        match recvlogical_all(cluster, &db, &recv_slots, &end, timeout).await {
            Ok((seconds, pg_cpu)) => out.push(ShardResult {
                shards: n,
                tool: "pg_recvlogical".into(),
                events,
                seconds,
                pg_cpu_seconds: pg_cpu,
                tool_cpu_seconds: None,
                peak_rss_mib: None,
                note: String::new(),
            }),
            Err(e) => out.push(failed(n, "pg_recvlogical", events, &e)),
        }
        let log = s.workdir.join(format!("outboxd-shards-{n}.log"));
        match outboxd_all(s, cluster, &db, n, events, timeout, &log).await {
            Ok(r) => out.push(r),
            Err(e) => out.push(failed(n, "outboxd", events, &e)),
        }
        if let Some(r) = out.last() {
            eprintln!(
                "outboxd-bench:   {} shards: {} {:.0} events/s, PG CPU {:.2} s / 100k events",
                n,
                r.tool,
                r.events_per_sec(),
                r.pg_cpu_per_100k()
            );
        }
        drop(sql);
        pg::drop_database(cluster, &db).await?;
    }
    Ok(out)
}

fn failed(shards: u32, tool: &str, events: u64, e: &anyhow::Error) -> ShardResult {
    ShardResult {
        shards,
        tool: tool.into(),
        events,
        seconds: 0.0,
        pg_cpu_seconds: 0.0,
        tool_cpu_seconds: None,
        peak_rss_mib: None,
        note: format!("failed: {e:#}"),
    }
}

/// The layout `outboxd init` creates for OUTBOXD_SHARD_COUNT=n (sql/shards.sql).
async fn create_sharded_database(cluster: &PgCluster, db: &str, n: u32) -> Result<()> {
    pg::drop_database(cluster, db).await?;
    let admin = pg::connect(cluster, "postgres").await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let c = pg::connect(cluster, db).await?;
    let mut ddl = String::from(
        "CREATE TABLE public.outbox (
            id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
            event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NULL,
            created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, aggregate_id)
         ) PARTITION BY HASH (aggregate_id);",
    );
    for i in 0..n {
        let _ = write!(
            ddl,
            "CREATE TABLE public.outbox_shard_{i} PARTITION OF public.outbox FOR VALUES WITH (MODULUS {n}, REMAINDER {i});
             CREATE PUBLICATION {pub}_{i} FOR TABLE public.outbox_shard_{i} WITH (publish = 'insert', publish_via_partition_root = true);",
            pub = pg::PUBLICATION
        );
    }
    c.batch_execute(&ddl).await?;
    Ok(())
}

/// One pg_recvlogical per shard, all at once; (wall seconds until the last one is done,
/// PostgreSQL CPU seconds).
async fn recvlogical_all(
    cluster: &PgCluster,
    db: &str,
    slots: &[String],
    end: &str,
    timeout: Duration,
) -> Result<(f64, f64)> {
    let cpu0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let started = Instant::now();
    let mut children: Vec<Child> = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let child = Command::new(cluster.bindir().join("pg_recvlogical"))
            .args(["-h", cluster.host(), "-p", &cluster.port().to_string()])
            .args(["-U", cluster.superuser(), "-d", db, "--slot", slot])
            .args(["--start", "--no-loop", "--endpos", end, "-f", "/dev/null"])
            .args(["-o", "proto_version=1", "-o"])
            .arg(format!("publication_names={}_{i}", pg::PUBLICATION))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting pg_recvlogical")?;
        children.push(child);
    }
    for child in &mut children {
        let left = timeout.saturating_sub(started.elapsed());
        if !wait_timeout(child, left)? {
            bail!("pg_recvlogical failed or timed out");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    // The walsenders exit after their clients; their CPU counts once they are reaped.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - cpu0;
    Ok((seconds, cpu))
}

async fn outboxd_all(
    s: &Settings,
    cluster: &PgCluster,
    db: &str,
    n: u32,
    events: u64,
    timeout: Duration,
    log: &std::path::Path,
) -> Result<ShardResult> {
    let broker = broker::start(BrokerKind::Mock, &s.bins, &s.tansu_path(), &[pg::TOPIC]).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cpu0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let started = Instant::now();
    let logfile = std::fs::File::create(log)?;
    let mut child = Command::new(s.bins.join("outboxd"))
        .arg("run")
        .env("PGHOST", cluster.host())
        .env("PGPORT", cluster.port().to_string())
        .env("PGUSER", cluster.superuser())
        .env("PGDATABASE", db)
        .env("PGSSLMODE", "disable")
        .env("OUTBOXD_SLOT", "ob")
        .env("OUTBOXD_PUBLICATION", pg::PUBLICATION)
        .env("OUTBOXD_SHARD_COUNT", n.to_string())
        .env("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap())
        .env("OUTBOXD_PROGRESS_TOPIC", "")
        .env("OUTBOXD_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("OUTBOXD_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(logfile.try_clone()?)
        .stderr(logfile)
        .spawn()
        .context("starting outboxd")?;
    let pid = child.id();
    // Until Kafka acknowledged every event (what a consumer waits for); a shard whose
    // last own transaction is older than the backlog's end confirms the rest only with
    // the next keepalive and status update, which is not catch-up work.
    let http = format!("127.0.0.1:{port}");
    let mut done = false;
    while started.elapsed() < timeout {
        let published: f64 = drain::http_get(&http, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("outboxd_events_published_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if published >= events as f64 {
            done = true;
            break;
        }
        if child.try_wait()?.is_some() {
            bail!("outboxd exited early; log: {}", drain::tail(log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - cpu0;
    let tool_cpu = procfs::cpu_seconds(pid);
    let rss = procfs::peak_rss_mib(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    if !wait_timeout(&mut child, Duration::from_secs(40))? {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(broker);
    Ok(ShardResult {
        shards: n,
        tool: "outboxd".into(),
        events,
        seconds,
        pg_cpu_seconds: cpu,
        tool_cpu_seconds: tool_cpu,
        peak_rss_mib: rss,
        note: if done {
            String::new()
        } else {
            format!("timed out after {:.0} s", timeout.as_secs_f64())
        },
    })
}

/// The report's section.
pub fn markdown(w: &mut String, results: &[ShardResult]) {
    if results.is_empty() {
        return;
    }
    let _ = writeln!(w, "## Shards: one slot per hash partition\n");
    let _ = writeln!(
        w,
        "The same backlog of single-row transactions (see the first column's event count) in a \
         table hash-partitioned by aggregate_id into N partitions, one publication and slot per \
         partition, drained by N pg_recvlogical processes at once and by one outboxd process \
         relaying all N shards (`OUTBOXD_SHARD_COUNT=N`, mock cluster, progress records off). \
         Wall time runs until pg_recvlogical reached the backlog's end, and until Kafka acknowledged every event for outboxd. PostgreSQL CPU is that of \
         all its processes while draining: each walsender decodes all of the WAL.\n"
    );
    let _ = writeln!(
        w,
        "| shards | tool | events | seconds | events/s | PG CPU s | PG CPU s / 100k events | tool CPU s | peak RSS MiB | note |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in results {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            r.shards,
            r.tool,
            r.events,
            r.seconds,
            r.events_per_sec(),
            r.pg_cpu_seconds,
            r.pg_cpu_per_100k(),
            r.tool_cpu_seconds.map_or("-".into(), |c| format!("{c:.2}")),
            r.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}")),
            r.note
        );
    }
    let _ = writeln!(w);
}
