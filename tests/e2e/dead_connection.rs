//! A dead replication connection is noticed while the relay is back-pressured (Kafka
//! down, in-flight cap reached, nothing reading the stream): the session ends, the relay
//! reports itself disconnected and reconnects, and once the brokers are back every event
//! arrives. Two ways to lose the server: a partition (a proxy that stops forwarding
//! without closing) and a terminated walsender.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_events, Event};
use support::ops::{create_topics, read_all_blocking, slot_row, wait_active_pid};
use support::proxy::Proxy;
use support::relay::Relay;
use support::schema;

const CAP: &str = "10";

/// Inserts events with the brokers down until the relay sits at its in-flight cap.
async fn back_pressure(
    relay: &Relay,
    broker: &Broker,
    client: &tokio_postgres::Client,
    table: &str,
) -> Vec<Event> {
    broker.set_all_down(true);
    let events = insert_events(client, table, 60, 3, 5).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let in_flight = relay.metric("outboxd_in_flight_messages").unwrap_or(0.0);
        if in_flight >= 10.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay never reached its in-flight cap ({in_flight}); log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settled at the cap: the stream is no longer being read.
    tokio::time::sleep(Duration::from_secs(2)).await;
    events
}

fn metric(relay: &Relay, name: &str) -> f64 {
    relay
        .metric(name)
        .unwrap_or_else(|| panic!("metric {name}; log:\n{}", relay.log_text()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_is_noticed_at_the_in_flight_cap_and_every_event_arrives_after_it() {
    let db = PgCluster::shared()
        .fresh_database("dead_conn_partition")
        .await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::kafka(1);
    let topics = create_topics(&broker, &outbox).await;
    let proxy = Proxy::start(db.cluster().port());
    let port = proxy.port().to_string();
    let relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[
                ("PGHOST", "127.0.0.1"),
                ("PGPORT", &port),
                ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", CAP),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    let first_pid = wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = back_pressure(&relay, &broker, &client, &outbox.table).await;
    assert_eq!(metric(&relay, "outboxd_replication_connected"), 1.0);
    let reconnects = metric(&relay, "outboxd_reconnects_total");

    proxy.set_blackholed(true);
    let cut = Instant::now();
    let detected = loop {
        let connected = metric(&relay, "outboxd_replication_connected");
        if connected == 0.0 {
            break cut.elapsed();
        }
        assert!(
            cut.elapsed() < Duration::from_secs(40),
            "a partition at the in-flight cap went unnoticed for 40 s; log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("partition detected after {detected:?}");
    for line in relay
        .log_text()
        .lines()
        .filter(|l| l.contains("retry_in_ms"))
    {
        eprintln!("  {line}");
    }
    assert!(metric(&relay, "outboxd_reconnects_total") > reconnects);
    let (code, body) = relay.http_get("/readyz").expect("/readyz");
    assert_eq!(code, 503, "not ready while disconnected: {body}");
    assert!(body.contains("replication"), "{body}");

    // Heal, and bring the brokers back: a new session takes the slot over once the old
    // walsender is gone, and everything committed arrives.
    proxy.set_blackholed(false);
    broker.set_all_down(false);
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
    check_delivery(&events, &received);
    let pid = wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    assert_ne!(pid, first_pid, "a new walsender streams the slot");
    let deadline = Instant::now() + Duration::from_secs(60);
    while relay.http_get("/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "/readyz never recovered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminated_walsender_is_noticed_at_the_in_flight_cap() {
    let db = PgCluster::shared()
        .fresh_database("dead_conn_terminate")
        .await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::kafka(1);
    let topics = create_topics(&broker, &outbox).await;
    let relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", CAP)],
        ),
        &["run"],
    );
    let client = db.client().await;
    let first_pid = wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = back_pressure(&relay, &broker, &client, &outbox.table).await;
    let reconnects = metric(&relay, "outboxd_reconnects_total");

    let terminated: bool = client
        .query_one("SELECT pg_terminate_backend($1)", &[&first_pid])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(terminated);
    let killed = Instant::now();
    let reconnected = loop {
        let row = slot_row(&client, &outbox.slot).await.expect("slot");
        if row.active_pid.is_some_and(|p| p != first_pid) {
            break killed.elapsed();
        }
        // A few seconds when quiet (the EOF is seen at once, the backoff is 2 s); 60 s so
        // that a loaded machine's slow reconnect (fork, auth, START_REPLICATION) passes
        // while a relay that never notices, stuck at its cap, still fails.
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no new walsender 60 s after the old one was terminated (brokers down, at the cap); log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("reconnected after the walsender was terminated: {reconnected:?}");
    assert!(metric(&relay, "outboxd_reconnects_total") > reconnects);

    broker.set_all_down(false);
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
    check_delivery(&events, &received);
    drop(relay);
}
