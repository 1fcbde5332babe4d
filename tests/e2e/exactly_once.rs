//! OUTBOXD_DELIVERY=exactly-once against real Apache Kafka: a consumer that reads
//! `read_committed` (librdkafka's default, which the tests' readers keep) sees every
//! committed event exactly once, per aggregate in commit order, through kills, a zombie
//! instance, dead letters and PostgreSQL transactions longer than the Kafka transaction
//! timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rand::Rng;
use support::broker::Broker;
use support::consume::{check_delivery, ids, read_until_ids};
use support::load::{insert_events, Event};
use support::relay::Relay;
use support::schema;

const EXACTLY_ONCE: (&str, &str) = ("OUTBOXD_DELIVERY", "exactly-once");

/// Reads `topics` (read_committed) until every event arrived, and asserts each arrived
/// exactly once, per aggregate in commit order.
fn assert_exactly_once(bootstrap: &str, topics: &[String], events: &[Event], what: &str) {
    let received = read_until_ids(
        bootstrap,
        topics,
        &ids(events),
        Duration::from_secs(3),
        Duration::from_secs(120),
    );
    let report = check_delivery(events, &received);
    println!(
        "{what}: {} events committed, {} records read_committed, {} unique, {} duplicates",
        events.len(),
        received.len(),
        report.unique,
        report.duplicates
    );
    assert_eq!(report.unique, events.len(), "{what}: lost events");
    assert_eq!(report.duplicates, 0, "{what}: duplicates in read_committed");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_load_neither_loses_nor_duplicates() {
    const TOTAL: usize = 20_000;
    const KILLS: usize = 10;
    let started = Instant::now();
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("eos_crash").await;
    let outbox = schema::setup(&db).await;
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    broker
        .create_topics(&[&topics[0], &topics[1], &outbox.dead_letter_topic()], 6)
        .await;
    let bootstrap = broker.bootstrap();
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &bootstrap,
            &[
                EXACTLY_ONCE,
                ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "2000"),
                ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    let table = outbox.table.clone();
    let done = Arc::new(AtomicBool::new(false));
    let inserter = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let mut events: Vec<Event> = Vec::with_capacity(TOTAL);
            while events.len() < TOTAL {
                events.extend(insert_events(&client, &table, 1_000, 50, 200).await);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            done.store(true, Ordering::Release);
            events
        }
    });
    let mut kills = 0;
    while kills < KILLS || !done.load(Ordering::Acquire) {
        let pause = rand::thread_rng().gen_range(300..=1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        relay.kill();
        relay.restart();
        kills += 1;
        assert!(kills < 200, "the load did not finish");
    }
    let events = inserter.await.expect("inserter");
    let wal_after = schema::current_wal_lsn(&db).await;
    assert_exactly_once(&bootstrap, &topics, &events, &format!("{kills} SIGKILLs"));
    assert!(relay.is_running(), "the last relay is still running");
    schema::wait_confirmed_at_least(&db, wal_after, Duration::from_secs(60)).await;
    println!("eos crash test took {:.1?}", started.elapsed());
}
