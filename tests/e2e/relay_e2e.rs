//! Every committed outbox event arrives once, keyed by aggregate id, in commit order per
//! aggregate, with the documented topic, headers and payload bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::{check_delivery, read_topics};
use support::load::insert_events;
use support::relay::Relay;
use support::scenario::Scenario;
use support::schema;

async fn ten_thousand_events_arrive_once_in_order(broker: Broker) {
    let s = Scenario::new("e2e_10k").broker(broker).partitions(6).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let relay = s.relay(&[]);
    let client = db.client().await;
    let events = insert_events(&client, &outbox.table, 10_000, 500, 100).await;
    let wal_after_inserts = schema::current_wal_lsn(db).await;

    let received = read_topics(
        bootstrap,
        topics,
        events.len(),
        Duration::from_secs(30),
        Duration::from_secs(180),
    );
    let report = check_delivery(&events, &received);
    assert_eq!(report.duplicates, 0, "no restarts, so no duplicates");
    assert_eq!(received.len(), events.len());

    let by_id: HashMap<&str, &support::load::Event> =
        events.iter().map(|e| (e.id.as_str(), e)).collect();
    for r in &received {
        let id = r.header("id").unwrap();
        let e = by_id[id];
        assert_eq!(r.topic, outbox.topic(&e.aggregate_type));
        assert_eq!(r.key_str(), e.aggregate_id);
        assert_eq!(r.header("event_type"), Some(e.event_type.as_str()));
        assert_eq!(r.header("aggregate_type"), Some(e.aggregate_type.as_str()));
        assert!(r.header("outboxd.commit_lsn").unwrap().contains('/'));
        let commit_ms: i64 = r.header("outboxd.commit_time").unwrap().parse().unwrap();
        assert_eq!(r.timestamp_millis, Some(commit_ms));
        // The payload bytes as stored (the generator inserts jsonb's canonical text).
        assert_eq!(r.value.as_deref().unwrap(), e.payload.as_bytes());
    }
    // Once everything is acked the slot passes the last transaction's end (at the next
    // status update, up to 10 s; the rest is for a loaded machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if schema::confirmed_flush_lsn(db).await >= wal_after_inserts {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "confirmed_flush_lsn does not catch up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_events() {
    ten_thousand_events_arrive_once_in_order(Broker::default_for_tests()).await;
}

/// zstd is compiled into librdkafka: a producer configured for it starts and delivers.
#[tokio::test(flavor = "multi_thread")]
async fn zstd_compression_relays() {
    let s = Scenario::new("e2e_zstd").partitions(3).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let mut relay = s.relay(&[("OUTBOXD_KAFKA_COMPRESSION_TYPE", "zstd")]);
    let client = db.client().await;
    let events = insert_events(&client, &outbox.table, 500, 50, 20).await;
    // The reader stops early only after this long without a record; the first one waits
    // for the relay's start-up, which takes longer than 10 s on a loaded machine.
    let received = read_topics(
        bootstrap,
        topics,
        events.len(),
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    let report = check_delivery(&events, &received);
    assert_eq!(report.duplicates, 0);
    assert!(relay.is_running(), "{}", relay.log_text());
    relay.kill();
}

/// SASL GSSAPI is compiled into librdkafka: a producer configured for Kerberos is created
/// (the broker here speaks no SASL, so only the settings are checked, not a login).
#[tokio::test(flavor = "multi_thread")]
async fn gssapi_producer_settings_are_accepted() {
    let db = PgCluster::shared().fresh_database("e2e_gssapi").await;
    let outbox = schema::setup(&db).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        "127.0.0.1:9",
        &[
            ("OUTBOXD_KAFKA_SECURITY_PROTOCOL", "sasl_plaintext"),
            ("OUTBOXD_KAFKA_SASL_MECHANISM", "GSSAPI"),
            (
                "OUTBOXD_KAFKA_SASL_KERBEROS_PRINCIPAL",
                "outboxd@EXAMPLE.COM",
            ),
            (
                "OUTBOXD_KAFKA_SASL_KERBEROS_KEYTAB",
                "/nonexistent/outboxd.keytab",
            ),
            ("OUTBOXD_KAFKA_SASL_KERBEROS_KINIT_CMD", "true"),
        ],
    );
    let (code, out) = support::relay::run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "no broker answers: {out}");
    assert!(
        !out.contains("FAIL  kafka producer settings"),
        "GSSAPI refused by librdkafka: {out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("FAIL  kafka: ")),
        "the producer was built and tried the broker: {out}"
    );
}
