//! Exactly-once against at-least-once (issue 31): the same backlog and the same paced
//! loads through `outboxd run` in each delivery mode on one Apache Kafka broker, the modes
//! alternating so that a change in the machine's load hits both alike, and the exactly-once
//! commit interval against throughput and latency.
//!
//! Every run is a fresh relay process with a slot and a topic of its own, seen by one
//! read_committed consumer: what a consumer of exactly-once output sees, in either mode.

use std::time::Duration;

use anyhow::{Context, Result};
use pgtest::PgCluster;

use crate::broker::{self, Broker, BrokerKind};
use crate::drain::Outboxd;
use crate::kafkarun::{self, Drained, Paced, Relay, Watch};
use crate::pg::{self, Shape};
use crate::report::opt;
use crate::Settings;

pub use crate::eos_report::{markdown, splice};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AtLeastOnce,
    ExactlyOnce,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "at-least-once",
            Mode::ExactlyOnce => "exactly-once",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "alo",
            Mode::ExactlyOnce => "eos",
        }
    }
}

/// The order of every pair: at-least-once first, then exactly-once.
pub const MODES: [Mode; 2] = [Mode::AtLeastOnce, Mode::ExactlyOnce];

/// One catch-up of the backlog in one mode.
#[derive(Debug, Clone)]
pub struct CatchUp {
    pub round: usize,
    pub mode: Mode,
    pub drained: Drained,
}

/// One paced rate in one mode.
#[derive(Debug, Clone)]
pub struct Latency {
    pub round: usize,
    pub mode: Mode,
    pub paced: Paced,
}

/// Exactly-once at one commit interval.
#[derive(Debug, Clone)]
pub struct CurvePoint {
    pub commit_ms: u64,
    pub drained: Option<Drained>,
    pub paced: Option<Paced>,
}

#[derive(Debug, Clone, Default)]
pub struct Eos {
    pub backlog: String,
    pub events: u64,
    pub generate_seconds: f64,
    pub repeats: usize,
    pub latency_secs: f64,
    pub curve_rate: u64,
    pub catchup: Vec<CatchUp>,
    pub latency: Vec<Latency>,
    pub curve: Vec<CurvePoint>,
    pub notes: Vec<String>,
}

/// The default commit interval (OUTBOXD_TXN_COMMIT_MS), which the goal's p99 bound uses.
pub const DEFAULT_COMMIT_MS: u64 = 100;

fn numbers(var: &str, default: &str) -> Result<Vec<u64>> {
    crate::list(var, default)
        .iter()
        .map(|r| r.parse().with_context(|| var.to_owned()))
        .collect()
}

/// BENCH_EOS_REPEATS (default 2 rounds), BENCH_EOS_RATES (default 1000,5000 events/s,
/// BENCH_LATENCY_SECS each), BENCH_EOS_COMMIT_MS (the curve, default 20,50,100,200,500;
/// empty skips it) at BENCH_EOS_CURVE_RATE (default 1000 events/s).
pub async fn run(s: &Settings, cluster: &PgCluster) -> Result<Eos> {
    let repeats: usize = crate::env_or("BENCH_EOS_REPEATS", "2")
        .parse()
        .context("BENCH_EOS_REPEATS")?;
    let rates = numbers("BENCH_EOS_RATES", "1000,5000")?;
    let commit_ms = numbers("BENCH_EOS_COMMIT_MS", "20,50,100,200,500")?;
    let curve_rate: u64 = crate::env_or("BENCH_EOS_CURVE_RATE", "1000")
        .parse()
        .context("BENCH_EOS_CURVE_RATE")?;
    let txns = (s.scaled(1_000_000) / 100).max(1);
    let shape = Shape::Batched { txns, rows: 100 };
    let mut e = Eos {
        backlog: format!(
            "{} events in {txns} transactions of 100 rows",
            shape.events()
        ),
        events: shape.events(),
        repeats,
        latency_secs: s.latency_secs,
        curve_rate,
        ..Eos::default()
    };
    eprintln!(
        "outboxd-bench: exactly-once vs at-least-once, {}",
        e.backlog
    );
    let broker = broker::start(BrokerKind::Kafka, &s.bins, &[]).await?;
    let bench = Bench {
        s,
        cluster,
        broker: &broker,
    };
    // The backlog first, read later by every catch-up through a slot made before it.
    let db = "bench_eos";
    pg::create_database(cluster, db, false).await?;
    let sql = pg::connect(cluster, db).await?;
    let mut slots: Vec<String> = (1..=repeats)
        .flat_map(|r| MODES.map(|m| format!("s_eos_{}_{r}", m.tag())))
        .collect();
    slots.extend(commit_ms.iter().map(|ms| format!("s_eos_curve_{ms}")));
    pg::create_slots(&sql, &slots).await?;
    e.generate_seconds = pg::generate(cluster, db, shape).await?.as_secs_f64();
    sql.batch_execute("CHECKPOINT").await?;
    drop(sql);
    let lat_db = "bench_eos_latency";
    pg::create_database(cluster, lat_db, false).await?;
    let mut lat = Paces {
        sql: pg::connect(cluster, lat_db).await?,
        db: lat_db,
        i: 0,
    };
    for round in 1..=repeats {
        // Latency first: its warm-ups also make the broker's transaction log and the
        // progress topic, which no measured catch-up should wait for.
        for &rate in &rates {
            for mode in MODES {
                let tag = format!("{}_{rate}_{round}", mode.tag());
                match bench.paced(&mut lat, &tag, mode, None, rate).await {
                    Ok(paced) => e.latency.push(Latency { round, mode, paced }),
                    Err(err) => e.notes.push(format!(
                        "latency {} at {rate}/s, round {round}, failed: {err:#}",
                        mode.name()
                    )),
                }
            }
        }
        for mode in MODES {
            let tag = format!("{}_{round}", mode.tag());
            match bench.catch_up(db, e.events, &tag, mode, None).await {
                Ok(drained) => e.catchup.push(CatchUp {
                    round,
                    mode,
                    drained,
                }),
                Err(err) => e.notes.push(format!(
                    "catch-up {}, round {round}, failed: {err:#}",
                    mode.name()
                )),
            }
        }
    }
    for &ms in &commit_ms {
        let tag = format!("curve_{ms}");
        let drained = bench
            .catch_up(db, e.events, &tag, Mode::ExactlyOnce, Some(ms))
            .await
            .map_err(|err| e.notes.push(format!("catch-up at {ms} ms failed: {err:#}")))
            .ok();
        let paced = bench
            .paced(&mut lat, &tag, Mode::ExactlyOnce, Some(ms), curve_rate)
            .await
            .map_err(|err| e.notes.push(format!("latency at {ms} ms failed: {err:#}")))
            .ok();
        e.curve.push(CurvePoint {
            commit_ms: ms,
            drained,
            paced,
        });
    }
    drop(lat);
    drop(broker);
    // A walsender still exiting after its relay keeps its slot active for a moment: a
    // failed clean-up costs disk until the cluster goes, not the measurements.
    for d in [lat_db, db] {
        if let Err(err) = pg::drop_database(cluster, d).await {
            e.notes.push(format!("dropping {d} failed: {err:#}"));
        }
    }
    for n in &e.notes {
        eprintln!("outboxd-bench:   note: {n}");
    }
    Ok(e)
}

/// What every run of the section shares.
struct Bench<'a> {
    s: &'a Settings,
    cluster: &'a PgCluster,
    broker: &'a Broker,
}

/// The database of the paced runs and the next row number of its stamped inserts.
struct Paces {
    sql: tokio_postgres::Client,
    db: &'static str,
    i: i64,
}

impl Bench<'_> {
    /// `outboxd run` in `mode` on `slot` of `db`, writing every event to `topic`;
    /// `commit_ms` sets OUTBOXD_TXN_COMMIT_MS (exactly-once's commit interval).
    fn spawn(
        &self,
        db: &str,
        slot: &str,
        topic: &str,
        mode: Mode,
        commit_ms: Option<u64>,
    ) -> Result<Relay> {
        let log = self.s.workdir.join(format!("outboxd-{slot}.log"));
        let ms = commit_ms.map(|m| m.to_string());
        let mut env = vec![("OUTBOXD_DELIVERY", mode.name()), ("OUTBOXD_TOPIC", topic)];
        if let Some(ms) = &ms {
            env.push(("OUTBOXD_TXN_COMMIT_MS", ms.as_str()));
        }
        let o = Outboxd::spawn_with(
            &self.s.bins,
            self.cluster,
            db,
            slot,
            &self.broker.bootstrap(),
            &log,
            None,
            &env,
        )?;
        Ok(Relay::outboxd(o, log))
    }

    /// A topic of its own for one run, so that its consumer counts that run's records
    /// only, on the section's one broker.
    async fn topic(&self, tag: &str) -> Result<(String, Watch)> {
        let topic = format!("eos.{tag}");
        self.broker
            .create_topics(&[&topic], broker::PARTITIONS)
            .await
            .with_context(|| format!("creating topic {topic}"))?;
        let watch = Watch::start(&self.broker.bootstrap(), &topic)?;
        Ok((topic, watch))
    }

    /// The backlog of `db` through the slot `s_eos_<tag>`, process start to last record.
    async fn catch_up(
        &self,
        db: &str,
        events: u64,
        tag: &str,
        mode: Mode,
        commit_ms: Option<u64>,
    ) -> Result<Drained> {
        let (topic, watch) = self.topic(tag).await?;
        let slot = format!("s_eos_{tag}");
        let (d, relay) = kafkarun::drain(
            self.cluster,
            self.broker.pid(),
            &watch,
            events,
            mode.name(),
            || self.spawn(db, &slot, &topic, mode, commit_ms),
        )
        .await?;
        relay.stop()?;
        eprintln!(
            "outboxd-bench:   catch-up {tag:<10} {:>8} events/s ({} s to the last record, {} s to the first, {} events/s first → last), relay cpu {} s {}",
            opt(d.rate(), 0),
            opt(d.seconds, 2),
            opt(d.first, 2),
            opt(d.streaming(), 0),
            opt(d.relay_cpu, 2),
            d.note
        );
        Ok(d)
    }

    /// A fresh relay on a new slot at the end of the paced database, warmed up by one
    /// record, then `rate` events/s for BENCH_LATENCY_SECS.
    async fn paced(
        &self,
        p: &mut Paces,
        tag: &str,
        mode: Mode,
        commit_ms: Option<u64>,
        rate: u64,
    ) -> Result<Paced> {
        let slot = format!("s_eos_lat_{tag}");
        pg::create_slots(&p.sql, std::slice::from_ref(&slot)).await?;
        let (topic, watch) = self.topic(&format!("lat.{tag}")).await?;
        let mut relay = self.spawn(p.db, &slot, &topic, mode, commit_ms)?;
        kafkarun::warm_up(&p.sql, &mut p.i, &watch, &mut relay, mode.name()).await?;
        // The relay's first transactions (exactly-once's first AddPartitionsToTxn per
        // partition) are start-up, not latency.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let paced = kafkarun::paced(
            self.cluster,
            p.db,
            rate,
            self.s.latency_secs,
            &mut p.i,
            &watch,
            relay.pid(),
            self.broker.pid(),
        )
        .await?;
        relay.stop()?;
        eprintln!(
            "outboxd-bench:   latency {tag:<14} {rate}/s: achieved {:.0}/s, received {}, p50/p99 {}/{} ms, relay {} µs/event {}",
            paced.achieved,
            paced.received,
            opt(paced.p50, 0),
            opt(paced.p99, 0),
            opt(paced.relay_cpu_us, 0),
            paced.note
        );
        Ok(paced)
    }
}
