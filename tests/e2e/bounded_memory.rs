//! Memory stays bounded while one partition is stuck: one event waits for a partition
//! whose leader is unreachable while a busy topic keeps acking a heavy stream of small
//! transactions (and transactions without events). The relay's resident memory must stay
//! flat, and once the leader is back every event arrives and the slot catches up.
//! On a three-node Apache Kafka: the quiet topic's only replica is on the broker that is
//! killed (a stuck RF 1 partition), the busy topics' on the others.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_batch, Event};
use support::ops;
use support::relay::Relay;
use support::schema;

/// The broker that leads the quiet topic's only partition, and goes down.
const STUCK_BROKER: i32 = 3;
const LOAD_FOR: Duration = Duration::from_secs(50);
const WARM_UP: Duration = Duration::from_secs(10);
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const MAX_GROWTH_KB: u64 = 8 * 1024;
/// Transactions per round trip: explicit BEGIN/COMMIT pairs in one simple query.
const TXNS_PER_BATCH: usize = 200;
const LOAD_PAUSE: Duration = Duration::from_millis(15);
/// One transaction in this many carries an event; the rest carry none (many transactions
/// acked behind the stuck one, without a minute's worth of events to read back).
const EVENT_EVERY: usize = 8;
const BUSY_PARTITIONS: i32 = 8;

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn event(loader: usize, agg: usize, seq: u64) -> Event {
    Event {
        id: uuid::Uuid::new_v4().to_string(),
        aggregate_type: "order".into(),
        aggregate_id: format!("l{loader}-agg-{agg}"),
        event_type: "Changed".into(),
        payload: format!("{{\"seq\": {seq}}}"),
    }
}

/// Single-row transactions for the busy topic, most of them replaced by transactions
/// holding only a logical message of another prefix (it reaches the relay as a
/// transaction without events; a transaction touching only an unpublished table would
/// be skipped by the server). Each loader uses its own aggregates, so commit order per
/// aggregate is the loader's order.
async fn load(
    conn: String,
    table: String,
    loader: usize,
    stop: Arc<AtomicBool>,
    txns: Arc<AtomicUsize>,
) -> Vec<Event> {
    let client = ops::connect(&conn).await;
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .expect("synchronous_commit");
    let mut events = Vec::new();
    let mut seq = 0u64;
    let mut sql = String::new();
    while !stop.load(Ordering::Relaxed) {
        sql.clear();
        let mut batch = Vec::with_capacity(TXNS_PER_BATCH);
        for i in 0..TXNS_PER_BATCH {
            if i % EVENT_EVERY != 0 {
                sql.push_str(
                    "BEGIN; SELECT pg_logical_emit_message(true, 'other-app', 'x'); COMMIT;",
                );
                continue;
            }
            seq += 1;
            let e = event(loader, i % 16, seq);
            write!(
                sql,
                "BEGIN; INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('{}', '{}', '{}', '{}', '{}'); COMMIT;",
                e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload
            )
            .unwrap();
            batch.push(e);
        }
        client.batch_execute(&sql).await.expect("load batch");
        txns.fetch_add(TXNS_PER_BATCH, Ordering::Relaxed);
        events.extend(batch);
        // Paced to what the relay keeps up with on a small machine: the point is many
        // transactions behind one stuck message, not a backlog in the WAL.
        tokio::time::sleep(LOAD_PAUSE).await;
    }
    events
}

#[tokio::test(flavor = "multi_thread")]
async fn rss_stays_flat_while_one_partition_is_stuck() {
    let db = PgCluster::shared().fresh_database("bounded_mem").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::kafka(3);
    let quiet = outbox.topic("quiet");
    let busy = outbox.topic("order");
    broker
        .create_topics_on(
            &[&busy, &outbox.dead_letter_topic()],
            BUSY_PARTITIONS,
            1,
            &[],
        )
        .await;
    broker
        .create_topics_on(&[&quiet], 1, STUCK_BROKER, &[])
        .await;
    let cluster = broker.kafka_cluster();
    let bootstrap = broker.bootstrap();
    let relay = Relay::start(Relay::env_for(&db, &outbox, &bootstrap, &[]), &["run"]);
    let client = db.client().await;
    ops::wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let topics = vec![busy.clone(), quiet.clone()];

    // The relay delivers to both topics before the outage (metadata and connections up).
    let warm = vec![event(9, 0, 1), {
        let mut e = event(9, 1, 1);
        e.aggregate_type = "quiet".into();
        e
    }];
    insert_batch(&client, &outbox.table, &warm[..1]).await;
    insert_batch(&client, &outbox.table, &warm[1..]).await;
    ops::read_all_blocking(&bootstrap, &topics, &warm, Duration::from_secs(60));

    cluster
        .kill(STUCK_BROKER)
        .expect("kill the quiet topic's broker");
    let mut stuck = event(9, 2, 1);
    stuck.aggregate_type = "quiet".into();
    insert_batch(&client, &outbox.table, std::slice::from_ref(&stuck)).await;
    let stuck_end = schema::current_wal_lsn(&db).await;

    let stop = Arc::new(AtomicBool::new(false));
    let txns = Arc::new(AtomicUsize::new(0));
    let loaders: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(load(
                db.conn_string(),
                outbox.table.clone(),
                i,
                Arc::clone(&stop),
                Arc::clone(&txns),
            ))
        })
        .collect();

    let started = Instant::now();
    let rss_before = rss_kb(relay.pid());
    let mut curve = vec![(0u64, rss_before, 0usize, 0.0)];
    // At least LOAD_FOR, and on until the load is big enough to say anything (a loaded
    // machine's loaders are slower), for at most five times as long.
    let enough = |txns: &AtomicUsize| txns.load(Ordering::Relaxed) / EVENT_EVERY >= 22_000;
    while started.elapsed() < LOAD_FOR || (!enough(&txns) && started.elapsed() < 5 * LOAD_FOR) {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let published = relay
            .metric("outboxd_events_published_total")
            .unwrap_or(0.0);
        curve.push((
            started.elapsed().as_secs(),
            rss_kb(relay.pid()),
            txns.load(Ordering::Relaxed),
            published,
        ));
    }
    stop.store(true, Ordering::Relaxed);
    let mut events = warm.clone();
    events.push(stuck.clone());
    for l in loaders {
        events.extend(l.await.expect("loader"));
    }
    let wal_after = schema::current_wal_lsn(&db).await;

    let mut report = String::new();
    for (secs, rss, n, published) in &curve {
        writeln!(
            report,
            "  t={secs:>3}s rss={:>7.1} MB txns={n:>8} published={published:>8}",
            *rss as f64 / 1024.0
        )
        .unwrap();
    }
    println!("relay RSS while {quiet} was stuck:\n{report}");
    let warm_idx = curve
        .iter()
        .position(|(secs, ..)| Duration::from_secs(*secs) >= WARM_UP)
        .expect("a sample after warm-up");
    let base = curve[warm_idx].1;
    let peak = curve[warm_idx..].iter().map(|c| c.1).max().unwrap_or(base);
    let total_txns = txns.load(Ordering::Relaxed);
    // The busy topic keeps acking behind the stuck event: with the stuck partition still
    // down, every busy event committed is published (the warm-up pair and the stuck
    // event aside). Counted against what the loaders committed rather than a fixed
    // number per 50 s, which a loaded machine (slower loaders, a slower relay) missed
    // while the relay was doing everything right.
    let busy_committed = events.len() - 3;
    let published_busy = ops::wait_for(
        "every busy event published while the quiet partition is stuck",
        Duration::from_secs(180),
        Duration::from_millis(200),
        || async {
            let n = relay.metric("outboxd_events_published_total")?;
            // + 2: the warm-up events, one per topic.
            (n >= (busy_committed + 2) as f64).then_some(n)
        },
    )
    .await;
    // What the relay worked through after the sampling counts too: its RSS now.
    let peak = peak.max(rss_kb(relay.pid()));
    assert!(
        busy_committed >= 20_000,
        "the load is too small to say anything about memory ({busy_committed} busy events, {total_txns} transactions)"
    );
    println!(
        "{published_busy} published with {quiet} stuck ({busy_committed} busy events committed)"
    );
    assert!(
        peak.saturating_sub(base) <= MAX_GROWTH_KB,
        "relay RSS grew {} kB after warm-up (from {base} kB to {peak} kB) over {total_txns} transactions:\n{report}",
        peak - base
    );
    let confirmed_during = schema::confirmed_flush_lsn(&db).await;
    assert!(
        confirmed_during < stuck_end,
        "confirmed_flush_lsn {confirmed_during:#x} passed the unacknowledged event's transaction (ends {stuck_end:#x})"
    );

    // The leader is back: the stuck event and everything after it arrive, the slot
    // catches up.
    tokio::task::block_in_place(|| cluster.restart(&[STUCK_BROKER], 3)).expect("restart");
    let received = ops::read_all_blocking(&bootstrap, &topics, &events, Duration::from_secs(180));
    let delivery = check_delivery(&events, &received);
    schema::wait_confirmed_at_least(&db, wal_after, Duration::from_secs(60)).await;
    println!(
        "{} events ({} duplicates), {total_txns} load transactions, RSS {rss_before} kB -> {} kB",
        delivery.unique,
        delivery.duplicates,
        rss_kb(relay.pid())
    );
    drop(relay);
}
