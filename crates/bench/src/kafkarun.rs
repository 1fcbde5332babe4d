//! What the sections that measure a relay on Apache Kafka share (`debezium`, `eos`): a
//! relay process, one read_committed consumer that counts a topic's records and times the
//! stamped ones ([`Watch`]), a backlog drained from process start to its last record
//! ([`drain()`]), a paced load measured insert to consumer ([`paced`]), and a report section
//! replaced in place between its markers ([`splice`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use pgtest::PgCluster;
use rdkafka::message::Message;
use tokio_postgres::Client;

use crate::drain::{self, unix_ms, wait_timeout, Outboxd};
use crate::{latency, pg, procfs};

/// `outboxd run`, or a Kafka Connect standalone worker running the Debezium connector.
pub struct Relay {
    /// None once stopped.
    kind: Option<RelayKind>,
    pub log: PathBuf,
}

enum RelayKind {
    Outboxd(Outboxd),
    Connect(Child),
}

impl Relay {
    pub fn outboxd(o: Outboxd, log: PathBuf) -> Relay {
        Relay {
            kind: Some(RelayKind::Outboxd(o)),
            log,
        }
    }

    pub fn connect(child: Child, log: PathBuf) -> Relay {
        Relay {
            kind: Some(RelayKind::Connect(child)),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        match &self.kind {
            Some(RelayKind::Outboxd(o)) => o.pid(),
            Some(RelayKind::Connect(c)) => c.id(),
            None => 0,
        }
    }

    /// Why the relay is of no more use, if it is not: its process ended, or (Connect) its
    /// connector or task failed, which leaves the worker running with nothing to do.
    pub fn exited(&mut self) -> Result<Option<String>> {
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

    /// An error with the relay's log when it is of no more use.
    pub fn check(&mut self, what: &str) -> Result<()> {
        if let Some(status) = self.exited()? {
            bail!("{what} failed ({status}); log: {}", drain::tail(&self.log));
        }
        Ok(())
    }

    pub fn stop(mut self) -> Result<()> {
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

/// A consumer of every partition from the beginning (read_committed), counting records and
/// noting the first's and last's arrival, and (arrival − `t`) for records whose value has
/// a payload field `t`.
pub struct Watch {
    count: Arc<AtomicU64>,
    times: Arc<Mutex<(Option<Instant>, Option<Instant>)>>,
    samples: Arc<Mutex<Vec<(i64, i64)>>>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    pub fn start(bootstrap: &str, topic: &str) -> Result<Watch> {
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

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn first_last(&self) -> (Option<Instant>, Option<Instant>) {
        self.times.lock().map(|t| *t).unwrap_or((None, None))
    }

    /// Latencies (ms) of records inserted within [from, to).
    pub fn window(&self, from: i64, to: i64) -> Vec<i64> {
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

/// The load's insert with the insert's wall clock (ms) as the payload's first field `t`,
/// which every relay carries through unchanged: the latency is measured from it by one
/// consumer for all, as Debezium has no commit-time header outboxd has.
pub fn stamped_insert() -> String {
    format!(
        "INSERT INTO public.outbox ({}) VALUES (gen_random_uuid(), '{}', 'order-' || ($1::bigint % 1000), 'OrderCreated', \
         jsonb_build_object('t', floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, 'orderId', $1::bigint, \
         'customerId', 'customer-' || ($1::bigint % 5000), 'amount', ($1::bigint % 100000) / 100.0, 'currency', 'EUR', \
         'sku', md5($1::bigint::text), 'note', 'outboxd benchmark event'))",
        pg::COLUMNS,
        pg::AGGREGATE_TYPE
    )
}

/// A backlog drained by one relay process, seen by the consumer.
#[derive(Debug, Clone, Default)]
pub struct Drained {
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

impl Drained {
    /// The header of a table with one drained run per row, after the row's own leading
    /// columns (`lead`, e.g. `"| round | mode "`), and its alignment line.
    pub fn table_head(lead: &str, lead_align: &str) -> String {
        format!(
            "{lead}| seconds to last record | events/s | first record after s | \
             events/s first → last | relay CPU s | relay CPU µs / event | broker CPU s | \
             PG CPU s | peak RSS MiB | note |\n{lead_align}|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        )
    }

    /// This run's cells of such a row, from "seconds to last record" on.
    pub fn cells(&self) -> String {
        use crate::report::opt;
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
            opt(self.seconds, 2),
            opt(self.rate(), 0),
            opt(self.first, 2),
            opt(self.streaming(), 0),
            opt(self.relay_cpu, 2),
            opt(
                self.relay_cpu.map(|x| x / self.events.max(1) as f64 * 1e6),
                1
            ),
            opt(self.broker_cpu, 2),
            self.pg_cpu,
            opt(self.peak_rss_mib, 0),
            self.note.replace('|', "/").replace('\n', " "),
        )
    }

    /// Events per second once records flow: first to last record, without the start-up.
    pub fn streaming(&self) -> Option<f64> {
        self.seconds
            .zip(self.first)
            .filter(|(l, f)| l > f)
            .map(|(l, f)| drain::rate(self.events.saturating_sub(1), l - f))
    }

    /// Events per second from process start to the last record.
    pub fn rate(&self) -> Option<f64> {
        self.seconds.map(|x| drain::rate(self.events, x))
    }
}

/// Starts the relay (`spawn`, timed from just before it) and waits until `watch`, started
/// before on an empty topic, has counted `events` records; the relay is returned running.
pub async fn drain(
    cluster: &PgCluster,
    broker_pid: Option<u32>,
    watch: &Watch,
    events: u64,
    what: &str,
    spawn: impl FnOnce() -> Result<Relay>,
) -> Result<(Drained, Relay)> {
    let broker0 = broker_pid.and_then(procfs::cpu_seconds);
    let pg0 = procfs::cluster_cpu_seconds(cluster.data_dir())?;
    let started = Instant::now();
    let mut relay = spawn()?;
    let timeout = Duration::from_secs(180 + events / 200);
    let mut note = String::new();
    let mut polls = 0u64;
    while watch.count() < events {
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
            relay.check(what)?;
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
    let seconds = if note.is_empty() { since(last) } else { None };
    let extra = watch.count().saturating_sub(events);
    if extra > 0 {
        note.push_str(&format!(" {extra} records more than inserted (duplicates)"));
    }
    let d = Drained {
        events,
        seconds,
        first: since(first),
        relay_cpu,
        broker_cpu,
        pg_cpu,
        peak_rss_mib,
        note: note.trim().to_owned(),
    };
    Ok((d, relay))
}

/// Inserts stamped rows (one every 0.5 s) until the first reaches `watch`: the relay's
/// start-up is not latency. `i` is the next row number.
pub async fn warm_up(
    sql: &Client,
    i: &mut i64,
    watch: &Watch,
    relay: &mut Relay,
    what: &str,
) -> Result<()> {
    let insert = stamped_insert();
    let deadline = Instant::now() + Duration::from_secs(180);
    while watch.count() == 0 {
        if Instant::now() > deadline {
            bail!(
                "no warm-up record through {what}; log: {}",
                drain::tail(&relay.log)
            );
        }
        relay.check(what)?;
        sql.execute(insert.as_str(), &[&*i]).await?;
        *i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// One paced rate through a relay, insert to consumer.
#[derive(Debug, Clone)]
pub struct Paced {
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

/// How long the tail of a paced run may take to arrive before it is counted missing.
const TAIL: Duration = Duration::from_secs(30);

/// Single-row stamped inserts at `rate` per second for `secs` into `db`, through the relay
/// `relay_pid` to `watch`; `i` is the next row number.
#[allow(clippy::too_many_arguments)]
pub async fn paced(
    cluster: &PgCluster,
    db: &str,
    rate: u64,
    secs: f64,
    i: &mut i64,
    watch: &Watch,
    relay_pid: u32,
    broker_pid: Option<u32>,
) -> Result<Paced> {
    let cpu0 = procfs::cpu_seconds(relay_pid);
    let b0 = broker_pid.and_then(procfs::cpu_seconds);
    let from = unix_ms();
    let (inserted, took) =
        latency::load_sql(cluster, db, rate, 1, secs, *i, stamped_insert()).await?;
    *i += i64::try_from(inserted).unwrap_or(0) + 1;
    let to = unix_ms();
    let wait_until = Instant::now() + TAIL;
    while (watch.window(from, to + 1).len() as u64) < inserted && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let per_event = |a: Option<f64>, b: Option<f64>| {
        a.zip(b)
            .map(|(a, b)| (a - b) / inserted.max(1) as f64 * 1e6)
    };
    let mut lat = watch.window(from, to + 1);
    lat.sort_unstable();
    Ok(Paced {
        rate,
        achieved: drain::rate(inserted, took),
        inserted,
        received: lat.len(),
        p50: latency::percentile(&lat, 0.5),
        p99: latency::percentile(&lat, 0.99),
        relay_cpu_us: per_event(procfs::cpu_seconds(relay_pid), cpu0),
        broker_cpu_us: per_event(broker_pid.and_then(procfs::cpu_seconds), b0),
        note: if (lat.len() as u64) < inserted {
            format!(
                "{} of {inserted} arrived within {} s",
                lat.len(),
                TAIL.as_secs()
            )
        } else {
            String::new()
        },
    })
}

/// Replaces the section between `begin` and `end` of the report at `out` (or adds it
/// before the machine's section), leaving the rest as the last full run wrote it.
pub fn splice(out: &Path, begin: &str, end: &str, section: &str) -> Result<()> {
    let old = std::fs::read_to_string(out).unwrap_or_default();
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => {
            let after = old
                .get(e + end.len()..)
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
    std::fs::write(out, new)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Drained;

    #[test]
    fn a_drained_row_has_the_columns_of_its_header() {
        let d = Drained {
            events: 10,
            seconds: Some(2.0),
            first: None,
            relay_cpu: Some(0.5),
            broker_cpu: None,
            pg_cpu: 1.0,
            peak_rss_mib: Some(40.0),
            note: "a | b\nc".into(),
        };
        let head = Drained::table_head("| round | mode ", "|---:|---");
        let row = format!("| 1 | exactly-once {}", d.cells());
        let bars = |l: &str| l.matches('|').count();
        let lines: Vec<&str> = head.lines().chain([row.as_str()]).collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines.iter().all(|l| bars(l) == bars(lines[0])),
            "{lines:#?}"
        );
        assert!(row.contains("| 2.00 | 5 | – |"), "{row}");
    }
}
