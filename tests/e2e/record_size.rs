//! Rows near OUTBOXD_MAX_MESSAGE_BYTES: a record of exactly the limit, counted as
//! librdkafka counts it (framing and header lengths included), is published; one byte
//! more is a bad row: dead-lettered (the dead-letter record shrunk to fit, even for a
//! 100 kB aggregate id or event id), or, under `stop`, exit 4 without confirming it.
//! Never exit 5, never a crash loop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use pgtest::{PgCluster, TestDb};
use support::broker::Broker;
use support::consume::{read_until_ids, wire_size, Received};
use support::relay::Relay;
use support::schema::{self, Outbox};
use tokio_postgres::Client;

const LIMIT: usize = 2000;

/// A text id without an index, so a 100 kB event id can be inserted.
const DDL: &str = "CREATE TABLE public.outbox (
    id text NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
    event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NULL)";

/// The record outboxd makes of a row: key = aggregate id, value = the payload text,
/// headers id, event_type, aggregate_type, outboxd.commit_lsn, outboxd.commit_time.
fn row_record_size(id: &str, aggregate_id: &str, payload: &str, lsn_text_len: usize) -> usize {
    wire_size(
        aggregate_id.len(),
        payload.len(),
        &[
            (2, id.len()),
            (10, 1),
            (14, "order".len()),
            (18, lsn_text_len),
            (19, 13),
        ],
    )
}

/// One row to insert, with the Kafka record size it is built to have.
struct Row {
    id: String,
    aggregate_id: String,
    payload: String,
    size: usize,
}

/// A row whose record is exactly `size` bytes: the payload is a JSON string (jsonb
/// prints it back byte for byte) padded to measure. `lsn_len` is the length of the
/// commit LSN's text, read from pg_current_wal_lsn() just before.
fn row_of_size(size: usize, aggregate_id: &str, lsn_len: usize) -> Row {
    let id = uuid::Uuid::new_v4().to_string();
    let empty = row_record_size(&id, aggregate_id, "\"\"", lsn_len);
    let payload = format!("\"{}\"", "v".repeat(size - empty));
    assert_eq!(row_record_size(&id, aggregate_id, &payload, lsn_len), size);
    Row {
        id,
        aggregate_id: aggregate_id.to_owned(),
        payload,
        size,
    }
}

async fn lsn_text_len(client: &Client) -> usize {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("pg_current_wal_lsn");
    row.get::<_, String>(0).len()
}

/// Inserts each row in its own transaction, sized with the LSN length current at the
/// time; returns the rows (their sizes are checked against the records that arrive).
async fn insert_sized(client: &Client, specs: &[(usize, &str)]) -> Vec<Row> {
    let mut rows = Vec::new();
    for &(size, aggregate_id) in specs {
        let row = row_of_size(size, aggregate_id, lsn_text_len(client).await);
        insert(client, &row.id, &row.aggregate_id, &row.payload).await;
        rows.push(row);
    }
    rows
}

async fn insert(client: &Client, id: &str, aggregate_id: &str, payload: &str) {
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, 'order', $2, 'E', $3::text::jsonb)",
            &[&id, &aggregate_id, &payload],
        )
        .await
        .expect("insert");
}

async fn setup(name: &str, broker: &Broker) -> (TestDb<'static>, Outbox) {
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup_custom(&db, DDL, Some("publish = 'insert'")).await;
    broker
        .create_topics(&[&outbox.topic("order"), &outbox.dead_letter_topic()], 1)
        .await;
    (db, outbox)
}

fn relay_env(
    db: &TestDb<'_>,
    outbox: &Outbox,
    broker: &Broker,
    policy: &str,
) -> Vec<(String, String)> {
    let limit = LIMIT.to_string();
    Relay::env_for(
        db,
        outbox,
        &broker.bootstrap(),
        &[
            ("OUTBOXD_MAX_MESSAGE_BYTES", &limit),
            ("OUTBOXD_BAD_ROW_POLICY", policy),
        ],
    )
}

/// The commit LSN header's length must be what the row was sized with; otherwise the
/// WAL crossed a hex digit between the lookup and the commit and the sizes are off by
/// one (rare: rerun).
fn assert_sized_as_intended(row: &Row, r: &Received) {
    let lsn = r.header("outboxd.commit_lsn").expect("commit lsn header");
    let actual = row_record_size(&row.id, &row.aggregate_id, &row.payload, lsn.len());
    assert_eq!(
        actual, row.size,
        "the commit LSN {lsn} changed length while the row was inserted; rerun"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn records_up_to_the_limit_are_published_and_larger_ones_dead_lettered() {
    let broker = Broker::default_for_tests();
    let (db, outbox) = setup("record_size_dlq", &broker).await;
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    let mut relay = Relay::start(relay_env(&db, &outbox, &broker, "dead-letter"), &["run"]);
    let client = db.client().await;

    let sized = insert_sized(
        &client,
        &[(LIMIT - 1, "a-1"), (LIMIT, "a-1"), (LIMIT + 1, "a-1")],
    )
    .await;
    let huge_key_id = uuid::Uuid::new_v4().to_string();
    let huge_key = "k".repeat(100_000);
    insert(&client, &huge_key_id, &huge_key, "{\"n\": 1}").await;
    let huge_id = format!("{}{}", uuid::Uuid::new_v4(), "i".repeat(100_000));
    insert(&client, &huge_id, "a-2", "{\"n\": 2}").await;
    let later = uuid::Uuid::new_v4().to_string();
    insert(&client, &later, "a-1", "{\"n\": 3}").await;

    // The huge event id arrives cut short, so it is found by its prefix below.
    let want: HashSet<String> = sized
        .iter()
        .map(|r| r.id.clone())
        .chain([huge_key_id.clone(), later.clone()])
        .collect();
    let got = tokio::task::block_in_place(|| {
        read_until_ids(
            &broker.bootstrap(),
            &[topic.clone(), dlq.clone()],
            &want,
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
    });
    assert!(
        relay.is_running(),
        "the relay exited; log:\n{}",
        relay.log_text()
    );
    let on = |t: &str| -> Vec<&Received> { got.iter().filter(|r| r.topic == t).collect() };
    let published = on(&topic);
    let ids: Vec<&str> = published.iter().map(|r| r.header("id").unwrap()).collect();
    assert_eq!(
        ids,
        vec![sized[0].id.as_str(), sized[1].id.as_str(), later.as_str()],
        "limit - 1 and limit are published, in order, then the later event"
    );
    for (row, r) in sized[..2].iter().zip(&published) {
        assert_sized_as_intended(row, r);
        assert_eq!(r.wire_size(), row.size, "as it arrived");
        assert_eq!(r.key_str(), "a-1");
        assert_eq!(r.value.as_deref(), Some(row.payload.as_bytes()));
    }

    let dead = on(&dlq);
    assert_eq!(dead.len(), 3, "three dead-letter records: {dead:#?}");
    for r in &dead {
        assert_eq!(r.header("outboxd.error_kind"), Some("oversize"));
        assert!(r
            .header("outboxd.error")
            .is_some_and(|e| e.contains("OUTBOXD_MAX_MESSAGE_BYTES")));
        assert!(
            r.wire_size() <= LIMIT,
            "a dead-letter record fits the limit: {}",
            r.wire_size()
        );
    }
    let find = |pred: &dyn Fn(&str) -> bool| -> &Received {
        dead.iter()
            .find(|r| r.header("id").is_some_and(pred))
            .expect("dead-letter record")
    };
    // limit + 1: its key kept, its payload omitted, nothing else cut.
    let over = find(&|id| id == sized[2].id);
    assert_sized_as_intended(&sized[2], over);
    assert_eq!(over.key_str(), "a-1");
    assert_eq!(over.header("outboxd.omitted_columns"), Some("payload"));
    assert_eq!(over.header("outboxd.truncated"), None);
    let value: serde_json::Value = serde_json::from_slice(over.value.as_deref().unwrap()).unwrap();
    assert_eq!(value["id"], serde_json::json!(sized[2].id));
    assert_eq!(value["payload"], serde_json::Value::Null);
    // 100 kB aggregate id: no key, the column left out, saying so.
    let big_key = find(&|id| id == huge_key_id);
    assert_eq!(big_key.key, None);
    assert_eq!(big_key.header("outboxd.truncated"), Some("key"));
    assert_eq!(
        big_key.header("outboxd.omitted_columns"),
        Some("aggregate_id")
    );
    let value: serde_json::Value =
        serde_json::from_slice(big_key.value.as_deref().unwrap()).unwrap();
    assert_eq!(value["payload"], "{\"n\": 1}");
    // 100 kB event id: the id header cut short (with …), the key kept.
    let prefix = &huge_id[..40];
    let big_id = find(&|id| id.starts_with(prefix) && id.ends_with('…'));
    assert_eq!(big_id.key_str(), "a-2");
    assert!(big_id
        .header("outboxd.truncated")
        .is_some_and(|t| t.split(',').any(|f| f == "id")));

    // Counted when the relay has processed the acks, which may be just after a consumer
    // can read the records: waited for, then checked exactly.
    let (dead_lettered, published) = relay
        .wait_metrics(
            "the dead-lettered and published counters to reach 3 and 6",
            |body| {
                let d = support::ops::metric_sum(body, "outboxd_events_dead_lettered_total")?;
                let p = support::ops::metric_sum(body, "outboxd_events_published_total")?;
                (d >= 3.0 && p >= 6.0).then_some((d, p))
            },
        )
        .await;
    assert!(
        (dead_lettered - 3.0).abs() < f64::EPSILON,
        "dead-lettered metric {dead_lettered}"
    );
    assert!(
        (published - 6.0).abs() < f64::EPSILON,
        "published (acked) metric counts the dead-letter records too: {published}"
    );
    drop(relay);
}

/// Under `stop`, the first row over the limit stops the relay with exit 4 naming it,
/// the rows before it (up to exactly the limit) are published, and the slot is not
/// confirmed past it. `bad` is the aggregate id of the bad row and its record size.
async fn stop_case(name: &str, bad_aggregate_id: &str, bad_size: Option<usize>) {
    let broker = Broker::default_for_tests();
    let (db, outbox) = setup(name, &broker).await;
    let topic = outbox.topic("order");
    let mut relay = Relay::start(relay_env(&db, &outbox, &broker, "stop"), &["run"]);
    let client = db.client().await;
    let good = insert_sized(&client, &[(LIMIT - 1, "a-1"), (LIMIT, "a-1")]).await;
    // The insert position: with synchronous_commit off the write position may lag the
    // good rows' commits, which the relay confirms before stopping.
    let before_bad: u64 = client
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        .try_into()
        .unwrap();
    let bad = match bad_size {
        Some(size) => insert_sized(&client, &[(size, bad_aggregate_id)])
            .await
            .remove(0),
        None => {
            let id = uuid::Uuid::new_v4().to_string();
            insert(&client, &id, bad_aggregate_id, "{}").await;
            Row {
                id,
                aggregate_id: bad_aggregate_id.to_owned(),
                payload: "{}".into(),
                size: 0,
            }
        }
    };
    let after = uuid::Uuid::new_v4().to_string();
    insert(&client, &after, "a-1", "{}").await;

    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log_text();
    assert_eq!(
        status.code(),
        Some(4),
        "exit code 4 for an oversize row under stop; log:\n{log}"
    );
    assert!(log.contains(&bad.id), "the log names the row; log:\n{log}");
    assert!(log.contains("OUTBOXD_MAX_MESSAGE_BYTES"), "log:\n{log}");
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    assert!(
        confirmed <= before_bad,
        "the slot was confirmed to {confirmed:#x}, past the start of the bad row's transaction at {before_bad:#x}"
    );

    // Under dead-letter the same relay gets past it: nothing before or after is lost,
    // and nothing is published twice (what was sent before the bad row was acknowledged
    // and confirmed before the stop).
    relay.set_env("OUTBOXD_BAD_ROW_POLICY", "dead-letter");
    relay.restart();
    let dlq = outbox.dead_letter_topic();
    let want: HashSet<String> = good
        .iter()
        .map(|r| r.id.clone())
        .chain([bad.id.clone(), after.clone()])
        .collect();
    let got = tokio::task::block_in_place(|| {
        read_until_ids(
            &broker.bootstrap(),
            &[topic.clone(), dlq.clone()],
            &want,
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
    });
    let published: Vec<&Received> = got.iter().filter(|r| r.topic == topic).collect();
    let ids: Vec<&str> = published.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(
        ids,
        vec![good[0].id.as_str(), good[1].id.as_str(), after.as_str()]
    );
    for (row, r) in good.iter().zip(&published) {
        assert_sized_as_intended(row, r);
        assert_eq!(r.wire_size(), row.size);
    }
    let dead: Vec<&str> = got
        .iter()
        .filter(|r| r.topic == dlq)
        .filter_map(|r| r.header("id"))
        .collect();
    assert_eq!(dead, vec![bad.id.as_str()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_policy_exits_4_on_a_record_one_byte_over_the_limit() {
    stop_case("record_size_stop", "a-1", Some(LIMIT + 1)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_policy_exits_4_on_a_100_kb_aggregate_id() {
    stop_case("record_size_stop_key", &"k".repeat(100_000), None).await;
}
