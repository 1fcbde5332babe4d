//! `outboxd-dev quickstart`: outboxd working end to end in one command, for demos and
//! development only. A throwaway PostgreSQL (pgtest), a throwaway Apache Kafka node (the
//! tests' harness; librdkafka's in-memory mock cluster where Java or Kafka's jars are
//! missing, or with `--mock`), the real `outboxd run`, sample events, and a consumer
//! printing each arrival.

mod consume;
mod events;
mod postgres;
mod relay;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::mocking::MockCluster;

use crate::{args, broker};
use consume::Watcher;
use events::{Event, Pattern};
use postgres::Postgres;
use relay::Relay;

const TOPICS: [&str; 3] = ["outbox.order", "outbox.customer", "outbox.dead-letter"];
const PARTITIONS: i32 = 3;
/// PostgreSQL 14 added pg_logical_emit_message to pgoutput.
const PG14: i32 = 140_000;

struct Options {
    events: usize,
    seconds: u64,
    mock: bool,
}

/// The demo's broker; dropping it stops it.
enum DemoBroker {
    Kafka(outboxd_test_broker::Broker),
    Mock(MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
}

impl DemoBroker {
    /// Apache Kafka when it can run here, else the mock cluster, saying which and why.
    async fn start(mock: bool) -> Result<DemoBroker> {
        let why_mock = if mock {
            Some("--mock".to_owned())
        } else {
            match outboxd_test_broker::kafka::find_libs() {
                Err(e) => Some(e.to_string()),
                Ok(_) if !outboxd_test_broker::kafka::available() => {
                    Some(outboxd_test_broker::Error::NoJava.to_string())
                }
                Ok(_) => None,
            }
        };
        let Some(why) = why_mock else {
            println!(
                "quickstart: starting Apache Kafka {} (one KRaft node, a JVM process; a few seconds)",
                outboxd_test_broker::kafka::KAFKA_VERSION
            );
            let broker = outboxd_test_broker::Broker::kafka(1).context("starting Apache Kafka")?;
            broker
                .create_topics(&TOPICS, PARTITIONS)
                .await
                .context("creating the demo topics")?;
            println!(
                "quickstart: Apache Kafka {} at {}; topics {} with {PARTITIONS} partitions each",
                outboxd_test_broker::kafka::KAFKA_VERSION,
                broker.bootstrap(),
                TOPICS.join(", ")
            );
            return Ok(DemoBroker::Kafka(broker));
        };
        println!("quickstart: using the in-memory demo broker instead of Apache Kafka ({why})");
        let cluster = MockCluster::new(3).context("starting librdkafka's mock cluster")?;
        cluster
            .create_topic(crate::broker::PROGRESS_TOPIC, 1, 1)
            .context("creating the progress topic")?;
        for topic in TOPICS {
            cluster
                .create_topic(topic, PARTITIONS, 1)
                .with_context(|| format!("creating topic {topic}"))?;
        }
        println!(
            "quickstart: in-memory demo Kafka (librdkafka mock cluster, 3 brokers; for demos only) at {}; \
             topics {} with {PARTITIONS} partitions each",
            cluster.bootstrap_servers(),
            TOPICS.join(", ")
        );
        Ok(DemoBroker::Mock(cluster))
    }

    fn bootstrap(&self) -> String {
        match self {
            DemoBroker::Kafka(b) => b.bootstrap(),
            DemoBroker::Mock(c) => c.bootstrap_servers(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            DemoBroker::Kafka(_) => "Apache Kafka",
            DemoBroker::Mock(_) => "the demo broker",
        }
    }
}

/// How long to wait for the relay to create its slot, and for the last events to arrive.
const STARTUP_LIMIT: Duration = Duration::from_secs(60);
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);

pub fn main(argv: &[String]) -> Result<ExitCode> {
    let mut events: usize = 20;
    let mut seconds: Option<u64> = None;
    let mock = argv.iter().any(|a| a == "--mock");
    let rest: Vec<String> = argv.iter().filter(|a| *a != "--mock").cloned().collect();
    for (flag, value) in args::pairs(&rest, &["--events", "--seconds"])? {
        match flag.as_str() {
            "--events" => events = args::number(&flag, &value)?,
            _ => seconds = Some(args::number(&flag, &value)?),
        }
    }
    if events == 0 {
        bail!("--events must be at least 1");
    }
    let opts = Options {
        events,
        seconds: seconds.unwrap_or_else(|| u64::try_from(events.div_ceil(4)).unwrap_or(5)),
        mock,
    };
    let bin = relay::binary()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(opts, bin))
}

async fn run(opts: Options, bin: PathBuf) -> Result<ExitCode> {
    println!("quickstart: outboxd-dev is for demos and development only: its PostgreSQL and Kafka are throwaway");
    let mut pg = Postgres::start().await?;
    let cluster = DemoBroker::start(opts.mock).await?;
    let bootstrap = cluster.bootstrap();
    let mut relay = Relay::spawn(&bin, &pg.env(), &bootstrap)?;
    let outcome = tokio::select! {
        r = demo(&opts, &mut pg, &mut relay, &bootstrap) => r,
        s = broker::wait_for_signal() => Err(anyhow!("interrupted ({})", s.unwrap_or("signal"))),
    };
    println!("quickstart: stopping outboxd (SIGTERM)");
    let status = relay.stop(Duration::from_secs(40)).await;
    match &status {
        Ok(s) => println!("quickstart: outboxd exited: {s}"),
        Err(e) => eprintln!("quickstart: stopping outboxd: {e:#}"),
    }
    let broker_name = cluster.name();
    drop(cluster);
    drop(pg);
    println!("quickstart: PostgreSQL stopped and its directory deleted; {broker_name} stopped");
    let missing = outcome?;
    if missing.is_empty() {
        println!("quickstart: OK: every event arrived in Kafka");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "quickstart: FAILED: {} event(s) never arrived:",
            missing.len()
        );
        for m in &missing {
            eprintln!("  {m}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// Steps 4-6; returns the labels of the events that never arrived.
async fn demo(
    opts: &Options,
    pg: &mut Postgres,
    relay: &mut Relay,
    bootstrap: &str,
) -> Result<Vec<String>> {
    wait_for_slot(pg, relay).await?;
    let watcher = Watcher::start(bootstrap, &TOPICS)?;
    let plan = events::plan(opts.events, pg.version >= PG14);
    let pause = Duration::from_secs(opts.seconds) / u32::try_from(opts.events).unwrap_or(u32::MAX);
    println!(
        "quickstart: inserting {} events over {} s, each in its own transaction; arrivals:",
        plan.len(),
        opts.seconds
    );
    for e in &plan {
        events::insert(&mut pg.client, e).await?;
        match e.pattern {
            Pattern::Row => {}
            Pattern::InsertThenDelete => println!(
                "quickstart: committed {} as insert-then-delete (public.outbox stays empty)",
                e.label()
            ),
            Pattern::EmitMessage => println!(
                "quickstart: committed {} with pg_logical_emit_message (no table row)",
                e.label()
            ),
        }
        tokio::time::sleep(pause).await;
    }
    let end_lsn = pg.current_wal_lsn().await?;
    let deadline = Instant::now() + ARRIVAL_LIMIT;
    while missing(&plan, &watcher).next().is_some() && Instant::now() < deadline {
        if let Some(status) = relay.exited()? {
            eprintln!("quickstart: outboxd exited early ({status})");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let duplicates: usize = plan
        .iter()
        .map(|e| watcher.count(&e.id).saturating_sub(1))
        .sum();
    let lost: Vec<String> = missing(&plan, &watcher)
        .map(|e| format!("{} (id {})", e.label(), e.id))
        .collect();
    watcher.stop();
    println!(
        "quickstart: {} of {} events arrived ({duplicates} duplicates)",
        plan.len() - lost.len(),
        plan.len()
    );
    report_slot(pg, &end_lsn).await?;
    report_metrics(relay).await;
    Ok(lost)
}

fn missing<'a>(plan: &'a [Event], watcher: &'a Watcher) -> impl Iterator<Item = &'a Event> + 'a {
    plan.iter().filter(|e| watcher.count(&e.id) == 0)
}

/// Events committed before the slot exists are not in its stream: wait for the relay.
async fn wait_for_slot(pg: &Postgres, relay: &mut Relay) -> Result<()> {
    let deadline = Instant::now() + STARTUP_LIMIT;
    loop {
        if let Some(status) = relay.exited()? {
            bail!("outboxd exited ({status}) before streaming; see the [outboxd] lines above");
        }
        if pg.slot_active().await? == Some(true) {
            println!(
                "quickstart: outboxd created slot {} and is streaming",
                postgres::SLOT
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "outboxd did not start streaming slot {} within {STARTUP_LIMIT:?}",
                postgres::SLOT
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The slot only advances after broker acks and the next look at the publication
/// (OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS); status updates carry it to the server.
async fn report_slot(pg: &Postgres, end_lsn: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pg.slot_reached(end_lsn).await? && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let Some(s) = pg.slot_status().await? else {
        println!("quickstart: slot {} is gone", postgres::SLOT);
        return Ok(());
    };
    let confirmed = s.confirmed_flush_lsn.as_deref().unwrap_or("(none)");
    let behind = s
        .behind_bytes
        .map_or_else(|| "?".to_owned(), |b| b.to_string());
    println!(
        "quickstart: slot {}: confirmed_flush_lsn {confirmed}, pg_current_wal_lsn() {} \
         ({behind} bytes behind; the last event committed before {end_lsn})",
        postgres::SLOT,
        s.current_wal_lsn,
    );
    Ok(())
}

async fn report_metrics(relay: &Relay) {
    match relay.metrics().await {
        Ok(lines) => {
            println!("quickstart: from http://{}/metrics:", relay.http_addr);
            // Histogram buckets and zero-valued labelled series are noise here.
            let shown = lines
                .iter()
                .filter(|l| !l.contains("_bucket") && (!l.contains('{') || !l.ends_with(" 0")))
                .take(16);
            for line in shown {
                println!("  {line}");
            }
        }
        Err(e) => eprintln!("quickstart: could not read metrics: {e:#}"),
    }
}
