//! Steady-state commit→ack latency: paced single-row inserts, outboxd streaming them,
//! a consumer stamping each record on arrival, and the relay's own histogram.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::stream::{FuturesUnordered, StreamExt};
use pgtest::PgCluster;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::broker::PARTITIONS;
use crate::drain::unix_ms;
use crate::pg;

/// (commit unix ms from the header, consume unix ms)
pub type Sample = (i64, i64);

/// A consumer thread that records every record's commit and arrival time.
pub struct Stamper {
    pub samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Stamper {
    pub fn start(bootstrap: &str, topic: &str) -> Result<Stamper> {
        let consumer = latency_consumer(bootstrap, topic, "outboxd-bench-latency")?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (Arc::clone(&samples), Arc::clone(&stop));
        let handle = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let now = unix_ms();
                    let commit = m.headers().and_then(|h| {
                        h.iter()
                            .find(|h| h.key == "outboxd.commit_time")
                            .and_then(|h| h.value)
                            .and_then(|v| std::str::from_utf8(v).ok())
                            .and_then(|v| v.parse::<i64>().ok())
                    });
                    if let Some(c) = commit {
                        if let Ok(mut g) = s2.lock() {
                            g.push((c, now));
                        }
                    }
                }
            }
        });
        Ok(Stamper {
            samples,
            stop,
            handle: Some(handle),
        })
    }

    pub fn count(&self) -> usize {
        self.samples.lock().map(|g| g.len()).unwrap_or(0)
    }

    /// Latencies (ms) of records committed within [from, to).
    pub fn window(&self, from: i64, to: i64) -> Vec<i64> {
        window(&self.samples, from, to)
    }
}

/// A consumer of every partition of `topic` from the beginning, `read_committed`, that
/// answers a fetch as soon as one record is there (its wait is part of what it measures).
pub fn latency_consumer(bootstrap: &str, topic: &str, group: &str) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "2")
        .set("fetch.min.bytes", "1")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// Latencies (ms, arrival − stamp) of the `(stamp, arrival)` samples stamped within
/// [from, to).
pub fn window(samples: &Mutex<Vec<(i64, i64)>>, from: i64, to: i64) -> Vec<i64> {
    samples
        .lock()
        .map(|g| {
            g.iter()
                .filter(|(c, _)| *c >= from && *c < to)
                .map(|(c, a)| a - c)
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Stamper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Inserts single-row transactions at `rate` per second for `secs`, over `conns`
/// pipelining connections. Returns (inserted, seconds).
pub async fn load(
    cluster: &PgCluster,
    db: &str,
    rate: u64,
    secs: f64,
    start_i: i64,
) -> Result<(u64, f64)> {
    load_txns(cluster, db, rate, 1, secs, start_i).await
}

/// Inserts `rate` events per second in transactions of `rows` rows (one statement each)
/// for `secs`, over 4 pipelining connections. Returns (events inserted, seconds).
pub async fn load_txns(
    cluster: &PgCluster,
    db: &str,
    rate: u64,
    rows: u64,
    secs: f64,
    start_i: i64,
) -> Result<(u64, f64)> {
    let rows = rows.max(1);
    let sql = if rows == 1 {
        format!(
            "INSERT INTO public.outbox ({}) VALUES ({})",
            pg::COLUMNS,
            pg::row_values("$1::bigint")
        )
    } else {
        format!(
            "INSERT INTO public.outbox ({}) SELECT {} FROM generate_series($1::bigint, $1::bigint + {}) AS g(i)",
            pg::COLUMNS,
            pg::row_values("i"),
            rows - 1
        )
    };
    load_sql(cluster, db, rate, rows, secs, start_i, sql).await
}

/// [`load_txns`] with the statement given: it inserts `rows` rows from `$1::bigint` on.
pub async fn load_sql(
    cluster: &PgCluster,
    db: &str,
    rate: u64,
    rows: u64,
    secs: f64,
    start_i: i64,
    sql: String,
) -> Result<(u64, f64)> {
    let conns = 4usize;
    let rows = rows.max(1);
    // Transactions per second and in total; event i of the run is row i of the sequence.
    let txn_rate = rate as f64 / rows as f64;
    let total = (txn_rate * secs) as u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for j in 0..conns {
        let client = pg::connect(cluster, db).await?;
        let sql = sql.clone();
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&sql).await?;
            let mut next = j as u64;
            let mut inflight = FuturesUnordered::new();
            let mut done = 0u64;
            loop {
                // Issue every event that is due, up to a pipeline depth of 256.
                while next < total && inflight.len() < 256 {
                    let due = started + Duration::from_secs_f64(next as f64 / txn_rate);
                    if due > Instant::now() {
                        break;
                    }
                    let i = start_i + (next * rows) as i64;
                    let c = &client;
                    let s = &stmt;
                    inflight.push(async move { c.execute(s, &[&i]).await });
                    next += conns as u64;
                }
                if next >= total && inflight.is_empty() {
                    return Ok::<u64, anyhow::Error>(done);
                }
                let wait_until = if next < total {
                    started + Duration::from_secs_f64(next as f64 / txn_rate)
                } else {
                    Instant::now() + Duration::from_secs(3600)
                };
                tokio::select! {
                    r = inflight.next(), if !inflight.is_empty() => {
                        if let Some(r) = r { r?; done += rows; }
                    }
                    _ = tokio::time::sleep_until(wait_until.into()) => {}
                }
            }
        }));
    }
    let mut inserted = 0;
    for t in tasks {
        inserted += t.await??;
    }
    Ok((inserted, started.elapsed().as_secs_f64()))
}

/// Percentile (0..=1) of sorted values.
pub fn percentile(sorted: &[i64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let last = sorted.len() - 1;
    let idx = ((last as f64) * q).round();
    let idx = usize::try_from(idx as u64).unwrap_or(last).min(last);
    sorted.get(idx).map(|v| *v as f64)
}

/// Cumulative (upper bound seconds, count) buckets of outboxd_commit_to_ack_seconds.
pub fn histogram(metrics: &str) -> Vec<(f64, f64)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("outboxd_commit_to_ack_seconds_bucket{le=\""))
        .filter_map(|r| {
            let (le, rest) = r.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect()
}

/// Percentile in ms from the difference of two cumulative histograms, interpolating
/// linearly inside the bucket (Prometheus' histogram_quantile).
pub fn histogram_percentile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - b)
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = 0.0;
    let mut below = 0.0;
    for (le, n) in &diff {
        if *n >= rank {
            if le.is_infinite() {
                return Some(lower * 1000.0);
            }
            let in_bucket = n - below;
            let frac = if in_bucket > 0.0 {
                (rank - below) / in_bucket
            } else {
                1.0
            };
            return Some((lower + (le - lower) * frac) * 1000.0);
        }
        lower = *le;
        below = *n;
    }
    None
}
