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
use crate::drain::{self, wait_timeout, DrainResult, Outboxd};
use crate::{pg, procfs, Settings};

/// One drain of the shard comparison: (shard count, what it measured).
pub type ShardResult = (u32, DrainResult);

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
            Ok((seconds, pg_cpu)) => out.push((
                n,
                DrainResult {
                    tool: "pg_recvlogical".into(),
                    broker: "-".into(),
                    events,
                    seconds,
                    pg_cpu_seconds: pg_cpu,
                    ..DrainResult::default()
                },
            )),
            Err(e) => out.push((n, crate::failed("pg_recvlogical", "-", events, &e))),
        }
        let log = s.workdir.join(format!("outboxd-shards-{n}.log"));
        match outboxd_all(s, cluster, &db, n, events, timeout, &log).await {
            Ok(r) => out.push((n, r)),
            Err(e) => out.push((
                n,
                crate::failed("outboxd", BrokerKind::Mock.name(), events, &e),
            )),
        }
        if let Some((_, r)) = out.last() {
            eprintln!(
                "outboxd-bench:   {} shards: {} {:.0} events/s, PG CPU {:.2} s / 100k events",
                n,
                r.tool,
                r.events_per_sec(),
                crate::report::per_100k(r.pg_cpu_seconds, r.events)
            );
        }
        drop(sql);
        pg::drop_database(cluster, &db).await?;
    }
    Ok(out)
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
        let child = drain::recvlogical_args(
            &mut Command::new(cluster.bindir().join("pg_recvlogical")),
            cluster,
            db,
            slot,
            &format!("{}_{i}", pg::PUBLICATION),
            Some(end),
            "/dev/null",
        )
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
) -> Result<DrainResult> {
    let broker = broker::start(BrokerKind::Mock, &s.bins, &[pg::TOPIC]).await?;
    let cpu0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let started = Instant::now();
    let shard_count = n.to_string();
    let mut relay = Outboxd::spawn_with(
        &s.bins,
        cluster,
        db,
        "ob",
        &broker.bootstrap(),
        log,
        None,
        &[
            ("OUTBOXD_SHARD_COUNT", shard_count.as_str()),
            ("OUTBOXD_PROGRESS_TOPIC", ""),
        ],
    )?;
    let pid = relay.pid();
    // Until Kafka acknowledged every event (what a consumer waits for); a shard whose
    // last own transaction is older than the backlog's end confirms the rest only with
    // the next keepalive and status update, which is not catch-up work.
    let mut done = false;
    while started.elapsed() < timeout {
        let published: f64 = relay
            .metrics()
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("outboxd_events_published_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if published >= events as f64 {
            done = true;
            break;
        }
        if relay.child.try_wait()?.is_some() {
            bail!("outboxd exited early; log: {}", drain::tail(log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = procfs::cluster_cpu_seconds(cluster.data_dir())? - cpu0;
    let tool_cpu = procfs::cpu_seconds(pid);
    let rss = procfs::peak_rss_mib(pid);
    relay.stop()?;
    drop(broker);
    Ok(DrainResult {
        tool: "outboxd".into(),
        broker: BrokerKind::Mock.name().into(),
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
        ..DrainResult::default()
    })
}
