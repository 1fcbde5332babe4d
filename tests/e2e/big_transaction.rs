//! One 1M-row transaction relays completely, once, in order per aggregate, while the
//! relay's memory stays bounded by the in-flight cap (peak RSS is measured and bounded).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rdkafka::message::Message;
use support::broker::Broker;
use support::consume::stream_topics;
use support::relay::Relay;
use support::schema;

const ROWS: usize = 1_000_000;
const AGGREGATES: usize = 100;
const IN_FLIGHT_CAP: &str = "10000";
/// Generous: a relay buffering the whole transaction needs far more (1M records with
/// their headers are several hundred MB).
const PEAK_RSS_LIMIT_KB: u64 = 300 * 1024;

#[tokio::test(flavor = "multi_thread")]
async fn million_row_transaction_relays_in_order_with_bounded_memory() {
    let started = Instant::now();
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("big_txn").await;
    let outbox = schema::setup(&db).await;
    let topic = outbox.topic("big");
    // librdkafka's mock broker keeps at most 100k records / 5 MB per partition and drops
    // the oldest: with 6 partitions a consumer slower than the relay lost records it never
    // saw. 128 partitions hold the whole million (~2.5 MB each), whatever the reader's pace.
    broker
        .create_topics(&[&topic, &outbox.dead_letter_topic()], 128)
        .await;
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", IN_FLIGHT_CAP)],
        ),
        &["run"],
    );
    let client = db.client().await;
    let inserted = client
        .execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             SELECT gen_random_uuid(), 'big', 'agg-' || (g % 100), 'E', jsonb_build_object('seq', g) \
             FROM generate_series(1, 1000000) g",
            &[],
        )
        .await
        .expect("1M-row insert");
    assert_eq!(usize::try_from(inserted).unwrap(), ROWS);
    let wal_after = schema::current_wal_lsn(&db).await;
    let inserted_at = started.elapsed();

    // Stream the topic: per aggregate, seq must rise strictly (commit order, no repeats).
    let mut seen = vec![false; ROWS + 1];
    let mut unique = 0usize;
    let mut last_seq: HashMap<Vec<u8>, u64> = HashMap::with_capacity(AGGREGATES);
    let mut problem: Option<String> = None;
    let total = stream_topics(
        &broker.bootstrap(),
        std::slice::from_ref(&topic),
        Duration::from_secs(180),
        Duration::from_secs(1200),
        |m| {
            let value: serde_json::Value =
                serde_json::from_slice(m.payload().expect("payload")).expect("JSON payload");
            let seq = value["seq"].as_u64().expect("seq");
            let key = m.key().expect("key").to_vec();
            let want_key = format!("agg-{}", seq % 100);
            if key != want_key.as_bytes() {
                problem = Some(format!(
                    "seq {seq} arrived with key {key:?}, expected {want_key}"
                ));
                return false;
            }
            let idx = usize::try_from(seq).expect("seq");
            if seen[idx] {
                problem = Some(format!("seq {seq} arrived twice"));
                return false;
            }
            seen[idx] = true;
            unique += 1;
            let last = last_seq.entry(key).or_insert(0);
            if seq <= *last {
                problem = Some(format!(
                    "{want_key}: seq {seq} arrived after {last}: not commit order"
                ));
                return false;
            }
            *last = seq;
            unique < ROWS
        },
    );
    assert!(problem.is_none(), "{}", problem.unwrap_or_default());
    assert_eq!(
        unique,
        ROWS,
        "only {unique} of {ROWS} events arrived ({total} records read) after {:?}",
        started.elapsed()
    );
    assert_eq!(last_seq.len(), AGGREGATES);
    schema::wait_confirmed_at_least(&db, wal_after, Duration::from_secs(60)).await;

    let peak_kb = relay.peak_rss_kb();
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(60));
    println!(
        "1M-row transaction: inserted in {inserted_at:.1?}, relayed by {:.1?}; relay peak RSS {} MB with OUTBOXD_MAX_IN_FLIGHT_MESSAGES={IN_FLIGHT_CAP} (limit {} MB)",
        started.elapsed(),
        peak_kb / 1024,
        PEAK_RSS_LIMIT_KB / 1024
    );
    assert_eq!(status.code(), Some(0), "SIGTERM stops the relay cleanly");
    assert!(
        peak_kb < PEAK_RSS_LIMIT_KB,
        "relay peak RSS {peak_kb} kB exceeds {PEAK_RSS_LIMIT_KB} kB: it is buffering more than its in-flight cap"
    );
}
