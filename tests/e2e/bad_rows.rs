//! Rows that cannot be published go to the dead-letter topic with the error, and the
//! events after them still arrive; under OUTBOXD_BAD_ROW_POLICY=stop the relay exits 4
//! naming the row without confirming it. A wrong table shape exits 3 naming the column
//! and the fix; a bad setting exits 2 naming the variable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::{read_until_ids, Received};
use support::relay::{run_to_end, Relay};
use support::schema;
use tokio_postgres::Client;

/// The default table, but with a nullable aggregate_id so a NULL key can be inserted.
const NULLABLE_KEY_DDL: &str = "CREATE TABLE public.outbox (
    id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NULL,
    event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// One transaction with one row; `aggregate_id` None inserts NULL.
async fn insert(
    client: &Client,
    id: &str,
    aggregate_id: Option<&str>,
    payload: &str,
    headers: Option<&str>,
) {
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ($1::text::uuid, 'order', $2, 'E', $3::text::jsonb, $4::text::jsonb)",
            &[&id, &aggregate_id, &payload, &headers],
        )
        .await
        .expect("insert");
}

fn by_id(records: &[Received]) -> HashMap<&str, &Received> {
    records
        .iter()
        .filter_map(|r| Some((r.header("id")?, r)))
        .collect()
}

fn topic_ids<'r>(records: &'r [Received], topic: &str) -> Vec<&'r str> {
    records
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.header("id").unwrap_or("<no id>"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_rows_are_dead_lettered_and_later_events_arrive() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("bad_rows_dlq").await;
    let outbox = schema::setup_custom(&db, NULLABLE_KEY_DDL, Some("publish = 'insert'")).await;
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    broker.create_topics(&[&topic, &dlq], 3).await;
    let relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MAX_MESSAGE_BYTES", "2000")],
        ),
        &["run"],
    );
    let client = db.client().await;
    let good: Vec<String> = (0..5).map(|_| new_id()).collect();
    let bad: Vec<String> = (0..4).map(|_| new_id()).collect();
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(10_000));

    insert(&client, &good[0], Some("g"), "{\"n\": 0}", None).await;
    insert(&client, &bad[0], None, "{\"bad\": \"null key\"}", None).await;
    insert(&client, &good[1], Some("g"), "{\"n\": 1}", None).await;
    insert(&client, &bad[1], Some(""), "{\"bad\": \"empty key\"}", None).await;
    insert(&client, &good[2], Some("g"), "{\"n\": 2}", None).await;
    insert(&client, &bad[2], Some("b"), &big, None).await;
    insert(&client, &good[3], Some("g"), "{\"n\": 3}", None).await;
    insert(&client, &bad[3], Some("b"), "{\"n\": 9}", Some("[1, 2]")).await;
    insert(&client, &good[4], Some("g"), "{\"n\": 4}", None).await;

    let want: HashSet<String> = good.iter().chain(bad.iter()).cloned().collect();
    let got = read_until_ids(
        &broker.bootstrap(),
        &[topic.clone(), dlq.clone()],
        &want,
        Duration::from_secs(2),
        Duration::from_secs(60),
    );
    let good_ids: Vec<&str> = good.iter().map(String::as_str).collect();
    assert_eq!(
        topic_ids(&got, &topic),
        good_ids,
        "every good event, once, in order"
    );
    let mut dlq_ids = topic_ids(&got, &dlq);
    dlq_ids.sort_unstable();
    let mut bad_ids: Vec<&str> = bad.iter().map(String::as_str).collect();
    bad_ids.sort_unstable();
    assert_eq!(
        dlq_ids, bad_ids,
        "every poison row, once, on the dead-letter topic"
    );

    let recs = by_id(&got);
    let expect_kind = [
        (&bad[0], "null_aggregate_id", "aggregate_id"),
        (&bad[1], "empty_aggregate_id", "aggregate_id"),
        (&bad[2], "oversize", "OUTBOXD_MAX_MESSAGE_BYTES"),
        (&bad[3], "headers_not_object", "headers"),
    ];
    for (id, kind, mentions) in expect_kind {
        let r = recs[id.as_str()];
        assert_eq!(r.header("outboxd.error_kind"), Some(kind), "{id}");
        let error = r.header("outboxd.error").expect("outboxd.error header");
        assert!(
            error.contains(mentions),
            "{kind}: error text {error:?} should mention {mentions}"
        );
        assert!(r
            .header("outboxd.source_table")
            .is_some_and(|t| t.contains("outbox")));
        assert!(r
            .header("outboxd.commit_lsn")
            .is_some_and(|l| l.contains('/')));
        let value: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().expect("dead-letter value"))
                .expect("row as JSON");
        assert_eq!(
            value["id"],
            serde_json::json!(id),
            "the row is in the record"
        );
        // The whole record, key and headers included, as the producer counts it.
        assert!(
            r.wire_size() <= 2000,
            "dead-letter record fits the limit: {} bytes",
            r.wire_size()
        );
    }
    // The oversize row arrives without its payload, saying so.
    let r = recs[bad[2].as_str()];
    assert_eq!(r.header("outboxd.omitted_columns"), Some("payload"));
    assert_eq!(r.key_str(), "b");
    // Counted when the relay has processed the acks, which may be just after a consumer
    // can read the records: waited for, then checked exactly.
    let dead_lettered = relay
        .wait_metric_at_least("outboxd_events_dead_lettered_total", 4.0)
        .await;
    assert!(
        (dead_lettered - 4.0).abs() < f64::EPSILON,
        "dead-lettered metric {dead_lettered}"
    );
    // One vocabulary: the metric's reason is the record's outboxd.error_kind.
    for (_, kind, _) in expect_kind {
        let series = format!("outboxd_events_dead_lettered_total{{reason=\"{kind}\"}}");
        assert_eq!(relay.metric_series(&series), Some(1.0), "{series}");
    }
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_policy_exits_4_without_confirming_the_bad_row() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("bad_rows_stop").await;
    let outbox = schema::setup_custom(&db, NULLABLE_KEY_DDL, Some("publish = 'insert'")).await;
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    broker.create_topics(&[&topic, &dlq], 3).await;
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_BAD_ROW_POLICY", "stop")],
        ),
        &["run"],
    );
    let client = db.client().await;
    let (before, poison, after) = (new_id(), new_id(), new_id());
    insert(&client, &before, Some("g"), "{\"n\": 1}", None).await;
    insert(&client, &poison, None, "{\"n\": 2}", None).await;
    insert(&client, &after, Some("g"), "{\"n\": 3}", None).await;

    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log_text();
    assert_eq!(
        status.code(),
        Some(4),
        "exit code 4 for a bad row under stop; log:\n{log}"
    );
    for needle in [
        poison.as_str(),
        "aggregate_id",
        "NOT NULL",
        "OUTBOXD_BAD_ROW_POLICY",
        // The two recoveries that work: the insert stays in the WAL whatever happens to
        // the row, so "delete the row" cannot.
        "OUTBOXD_BAD_ROW_POLICY=dead-letter",
        "pg_replication_slot_advance",
    ] {
        assert!(
            log.contains(needle),
            "the log should name {needle:?}; log:\n{log}"
        );
    }
    assert!(
        !log.contains("delete the row"),
        "no advice that cannot work; log:\n{log}"
    );
    let confirmed_at_stop = schema::confirmed_flush_lsn(&db).await;

    // Restart with the dead-letter policy: the row goes to the DLQ and the rest follows.
    relay.set_env("OUTBOXD_BAD_ROW_POLICY", "dead-letter");
    relay.restart();
    let want: HashSet<String> = [before.clone(), poison.clone(), after.clone()]
        .into_iter()
        .collect();
    let got = read_until_ids(
        &broker.bootstrap(),
        &[topic.clone(), dlq.clone()],
        &want,
        Duration::from_secs(2),
        Duration::from_secs(60),
    );
    let mut arrived: Vec<&str> = topic_ids(&got, &topic);
    arrived.dedup();
    assert_eq!(arrived, vec![before.as_str(), after.as_str()]);
    assert_eq!(topic_ids(&got, &dlq), vec![poison.as_str()]);
    let recs = by_id(&got);
    let poison_commit = schema::parse_lsn(
        recs[poison.as_str()]
            .header("outboxd.commit_lsn")
            .expect("commit lsn"),
    );
    assert!(
        confirmed_at_stop <= poison_commit,
        "the slot was confirmed to {confirmed_at_stop:#x}, past the bad row's commit at {poison_commit:#x}"
    );
    assert_eq!(
        recs[poison.as_str()].header("outboxd.error_kind"),
        Some("null_aggregate_id")
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_table_shape_exits_3_naming_the_column_and_fix() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("bad_rows_shape").await;
    let ddl = "CREATE TABLE public.outbox (
        id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
        event_type text NOT NULL, payload integer NOT NULL, headers jsonb NULL)";
    let outbox = schema::setup_custom(&db, ddl, Some("publish = 'insert'")).await;
    broker
        .create_topics(&[&outbox.topic("order"), &outbox.dead_letter_topic()], 1)
        .await;
    let mut relay = Relay::start(
        Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]),
        &["run"],
    );
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO public.outbox VALUES (gen_random_uuid(), 'order', 'a', 'E', 42, NULL)",
            &[],
        )
        .await
        .expect("insert");
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log_text();
    assert_eq!(
        status.code(),
        Some(3),
        "exit code 3 for a wrong table shape; log:\n{log}"
    );
    for needle in ["payload", "integer", "ALTER TABLE"] {
        assert!(
            log.contains(needle),
            "the log should mention {needle:?}; log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_setting_exits_2_naming_the_variable() {
    let db = PgCluster::shared().fresh_database("bad_rows_config").await;
    let outbox = schema::setup(&db).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        "127.0.0.1:9",
        &[("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "abc")],
    );
    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 2, "exit code 2 for a bad setting; output:\n{out}");
    assert!(out.contains("OUTBOXD_MAX_IN_FLIGHT_MESSAGES"), "{out}");
    assert!(
        out.contains("abc"),
        "the message shows the rejected value: {out}"
    );
}

/// A row whose topic does not exist, on a broker that creates no topics (as production
/// brokers don't): outboxd stops (exit 5) naming the topic, rather than re-sending
/// everything behind it every 30 s. Creating the topic, as the error says, and starting
/// again delivers every event, with the rows before the missing topic's published at most
/// twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_stops_the_relay_naming_it() {
    let db = PgCluster::shared()
        .fresh_database("bad_missing_topic")
        .await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let order = outbox.topic("order");
    let missing = outbox.topic("customer");
    broker
        .create_topics(&[&order, &outbox.dead_letter_topic()], 2)
        .await;
    let client = db.client().await;
    let events = support::load::insert_events(&client, &outbox.table, 20, 4, 5).await;
    let env = support::relay::Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let status = relay.wait_exit(Duration::from_secs(120));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(5), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("outboxd stopped") && l.contains(&missing)),
        "the error does not name the topic {missing}:\n{log}"
    );
    broker.create_topics(&[&missing], 2).await;
    let relay = Relay::start(env, &["run"]);
    let topics = vec![order, missing];
    let received = support::ops::read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
    let report = support::consume::check_delivery(&events, &received);
    assert!(
        report.duplicates <= events.len(),
        "{} duplicates of {} events",
        report.duplicates,
        events.len()
    );
    drop(relay);
}
