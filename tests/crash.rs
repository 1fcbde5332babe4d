//! The real binary is SIGKILLed at random moments while a 50k-event load runs, and
//! restarted each time: afterwards every committed event is in the topics and, per
//! aggregate, the first arrivals are in commit order (replays of a suffix are allowed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rand::Rng;
use support::broker::Broker;
use support::consume::{check_delivery, ids, read_until_ids};
use support::load::{insert_events, Event};
use support::relay::Relay;
use support::schema;

const TOTAL: usize = 50_000;
const CHUNK: usize = 1_000;
const MIN_KILLS: usize = 10;

async fn killed_at_random_moments_loses_nothing(broker: Broker, name: &str) {
    let started = Instant::now();
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup(&db).await;
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    broker
        .create_topics(&[&topics[0], &topics[1], &outbox.dead_letter_topic()], 6)
        .await;
    let bootstrap = broker.bootstrap();
    let mut relay = Relay::start(Relay::env_for(&db, &outbox, &bootstrap, &[]), &["run"]);

    // The load: chunks one after another, so the concatenation is commit order.
    let client = db.client().await;
    let table = outbox.table.clone();
    let inserter = tokio::spawn(async move {
        let mut events: Vec<Event> = Vec::with_capacity(TOTAL);
        while events.len() < TOTAL {
            events.extend(insert_events(&client, &table, CHUNK, 50, 200).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        events
    });

    let mut kills = 0;
    let kill_deadline = Instant::now() + Duration::from_secs(600);
    while kills < MIN_KILLS || !inserter.is_finished() {
        let pause = rand::thread_rng().gen_range(200..=1500);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        // SIGKILL, then start again at once: if the killed relay's walsender still holds
        // the slot, the new relay stands by and retries every second.
        relay.restart();
        kills += 1;
        assert!(
            Instant::now() < kill_deadline,
            "the load did not finish within 10 minutes ({kills} kills)"
        );
    }
    let events = inserter.await.expect("inserter task");
    let wal_after = schema::current_wal_lsn(&db).await;
    assert_eq!(events.len(), TOTAL);

    let received = read_until_ids(
        &bootstrap,
        &topics,
        &ids(&events),
        Duration::from_secs(3),
        Duration::from_secs(300),
    );
    let report = check_delivery(&events, &received);
    println!(
        "{name}: {kills} SIGKILLs during {TOTAL} events; {} records read, {} unique, {} duplicates (replays after kills); {:.1?} total",
        received.len(),
        report.unique,
        report.duplicates,
        started.elapsed()
    );
    assert_eq!(
        report.unique, TOTAL,
        "nothing but the committed events arrived"
    );
    assert!(relay.is_running(), "the last relay is still running");
    schema::wait_confirmed_at_least(&db, wal_after, Duration::from_secs(60)).await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_load_mock_cluster() {
    // The mock cluster lives in this process, so it survives every relay kill.
    killed_at_random_moments_loses_nothing(Broker::mock(), "crash_mock").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_load_tansu() {
    killed_at_random_moments_loses_nothing(Broker::tansu(), "crash_tansu").await;
}
