//! Resuming inside a partly acked transaction: the progress record carries the commit LSN
//! of a transaction still in flight and how many of its rows, from its start, the broker
//! acked. After kill -9 in the middle of a 200k-row transaction the restarted relay skips
//! exactly those rows when PostgreSQL sends the transaction again, and publishes the rest.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rdkafka::message::Message;
use support::broker::Broker;
use support::consume::stream_topics;
use support::ops;
use support::relay::Relay;
use support::schema;

const ROWS: usize = 200_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_relay_resumes_inside_a_partly_acked_transaction() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("partial_txn").await;
    let outbox = schema::setup(&db).await;
    let topic = outbox.topic("big");
    // Mock partitions keep ~100k records / 5 MB: 32 of them hold 200k small records and
    // their duplicates many times over.
    broker
        .create_topics(&[&topic, &outbox.dead_letter_topic()], 32)
        .await;
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[
                // Small enough that the transaction takes seconds, so the kill lands
                // inside it.
                ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "500"),
                ("OUTBOXD_PROGRESS_INTERVAL_MS", "200"),
                // The restart must read the record to skip: the default 3 s wait may run
                // out on a loaded machine (then the relay re-sends by design).
                ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    let system_id: String = client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    client
        .execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             SELECT gen_random_uuid(), 'big', 'agg-' || (g % 100), 'E', jsonb_build_object('seq', g) \
             FROM generate_series(1, 200000) g",
            &[],
        )
        .await
        .expect("200k-row insert");

    // Kill -9 once a good part is acked and recorded, well before the end.
    let deadline = Instant::now() + Duration::from_secs(120);
    let published_at_kill = loop {
        let published = relay
            .metric("outboxd_events_published_total")
            .unwrap_or(0.0);
        if published >= 40_000.0 {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let published = relay
                .metric("outboxd_events_published_total")
                .unwrap_or(0.0);
            relay.kill();
            break published;
        }
        assert!(Instant::now() < deadline, "{}", relay.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        published_at_kill < 190_000.0,
        "the kill came too late to be inside the transaction ({published_at_kill} published)"
    );
    let key = format!("{system_id}/{}/{}", db.name, outbox.slot);
    let record = ops::latest_progress_record(&broker.bootstrap(), &key).expect("a progress record");
    let acked_rows = record["partial"]["rows"]
        .as_u64()
        .unwrap_or_else(|| panic!("no partly acked transaction in the record: {record}"));
    assert!(
        acked_rows >= 10_000,
        "the record covers too little of the transaction: {record}"
    );

    relay.restart();
    // Per seq (the row's position in the transaction, from 1), how often it arrived.
    let mut count = vec![0u32; ROWS + 1];
    let mut unique = 0usize;
    let total = stream_topics(
        &broker.bootstrap(),
        std::slice::from_ref(&topic),
        Duration::from_secs(60),
        Duration::from_secs(300),
        |m| {
            let value: serde_json::Value =
                serde_json::from_slice(m.payload().expect("payload")).expect("JSON payload");
            let seq = usize::try_from(value["seq"].as_u64().expect("seq")).expect("seq");
            if count[seq] == 0 {
                unique += 1;
            }
            count[seq] += 1;
            unique < ROWS
        },
    );
    let skipped = relay.metric("outboxd_events_skipped_total").unwrap_or(0.0);
    let unread = relay
        .metric("outboxd_progress_record_unread_total")
        .unwrap_or(0.0);
    drop(relay);
    assert_eq!(
        unique, ROWS,
        "{unique} of {ROWS} rows arrived ({total} records)"
    );
    let acked = usize::try_from(acked_rows).expect("rows");
    let resent_acked = (1..=acked).filter(|&s| count[s] > 1).count();
    let duplicates: u32 = count.iter().map(|c| c.saturating_sub(1)).sum();
    assert_eq!(
        unread, 0.0,
        "the restarted relay never read the progress record"
    );
    assert_eq!(
        resent_acked, 0,
        "{resent_acked} of the {acked} rows recorded as acked were sent again"
    );
    assert!(
        skipped >= f64::from(u32::try_from(acked_rows).expect("rows")),
        "skipped {skipped}, recorded {acked_rows}"
    );
    println!(
        "200k-row transaction killed after {published_at_kill} acks: record covered {acked_rows} rows, restart skipped {skipped}, {duplicates} duplicates (rows acked after the last record, or in flight)"
    );
}
