//! One replication message far larger than the relay's memory budget: it is read
//! through, not held whole. A 300 MB logical message of another prefix between outbox
//! rows is passed over (every event arrives, the slot moves past it); a 300 MB outbox row
//! stops the relay under `stop` (exit 4, naming the fix), and following that fix
//! literally dead-letters it with nothing lost; one with outboxd's own prefix is
//! dead-lettered. Throughout, the relay's peak resident
//! memory stays far below the message's size.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use pgtest::{PgCluster, TestDb};
use support::broker::Broker;
use support::consume::{read_until_ids, Received};
use support::relay::Relay;
use support::schema::{self, Outbox};
use tokio_postgres::Client;

/// Bytes of the huge message or payload, built server-side with `repeat`.
const HUGE: i64 = 300_000_000;
/// The relay's peak RSS must stay under this: far below `HUGE`, far above its usual
/// ~40 MB.
const PEAK_RSS_LIMIT_KB: u64 = 160 * 1024;

/// The default outbox with a text payload: a jsonb string cannot reach 300 MB (256 MB
/// at most).
fn text_payload_ddl() -> String {
    let ddl = schema::OUTBOX_DDL.replace("payload        jsonb", "payload        text");
    assert_ne!(
        ddl,
        schema::OUTBOX_DDL,
        "sql/outbox.sql's payload column moved"
    );
    ddl
}

async fn setup(name: &str, broker: &Broker) -> (TestDb<'static>, Outbox) {
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup_custom(&db, &text_payload_ddl(), Some("publish = 'insert'")).await;
    broker
        .create_topics(&[&outbox.topic("order"), &outbox.dead_letter_topic()], 1)
        .await;
    (db, outbox)
}

async fn insert(client: &Client, aggregate_id: &str, payload_len: Option<i64>) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1::text::uuid, 'order', $2, 'E', \
                     CASE WHEN $3::bigint IS NULL THEN '{}' ELSE repeat('p', $3::bigint::int) END)",
            &[&id, &aggregate_id, &payload_len],
        )
        .await
        .expect("insert");
    id
}

fn read(broker: &Broker, topics: &[String], want: &HashSet<String>) -> Vec<Received> {
    tokio::task::block_in_place(|| {
        read_until_ids(
            &broker.bootstrap(),
            topics,
            want,
            Duration::from_secs(2),
            Duration::from_secs(90),
        )
    })
}

fn ids_on<'a>(got: &'a [Received], topic: &str) -> Vec<&'a str> {
    got.iter()
        .filter(|r| r.topic == topic)
        .filter_map(|r| r.header("id"))
        .collect()
}

/// The slot confirmed past `wal_after`, the relay still running, its memory bounded.
async fn assert_relayed_past(db: &TestDb<'_>, relay: &mut Relay, wal_after: u64) {
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(60)).await;
    assert!(
        relay.is_running(),
        "the relay exited; log:\n{}",
        relay.log_text()
    );
    assert_peak_rss_bounded(relay);
}

fn assert_peak_rss_bounded(relay: &Relay) {
    let peak = relay.peak_rss_kb();
    eprintln!("relay peak RSS: {peak} kB");
    assert!(
        peak < PEAK_RSS_LIMIT_KB,
        "the relay's peak RSS was {peak} kB (limit {PEAK_RSS_LIMIT_KB} kB) for a {HUGE}-byte message: it was held whole"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_logical_message_of_another_prefix_is_read_through() {
    let broker = Broker::default_for_tests();
    let (db, outbox) = setup("huge_foreign_message", &broker).await;
    let topic = outbox.topic("order");
    // Relaying emitted messages too: the stream then carries every logical message.
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MESSAGE_PREFIX", "outbox")],
        ),
        &["run"],
    );
    let client = db.client().await;
    let before = insert(&client, "a-1", None).await;
    client
        .execute(
            "SELECT pg_logical_emit_message(true, 'other', repeat('m', $1::bigint::int))",
            &[&HUGE],
        )
        .await
        .expect("huge logical message");
    let after = insert(&client, "a-1", None).await;
    let wal_after = schema::current_wal_lsn(&db).await;

    let want: HashSet<String> = [before.clone(), after.clone()].into();
    let got = read(&broker, std::slice::from_ref(&topic), &want);
    assert_eq!(ids_on(&got, &topic), vec![before.as_str(), after.as_str()]);
    assert_relayed_past(&db, &mut relay, wal_after).await;
}

/// Under `stop` the huge row stops the relay (exit 4) with the row named and the slot
/// before it; the message's fix, followed as written (one run with
/// OUTBOXD_BAD_ROW_POLICY=dead-letter), dead-letters it and publishes the rest in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_outbox_row_stops_or_is_dead_lettered() {
    let broker = Broker::default_for_tests();
    let (db, outbox) = setup("huge_outbox_row", &broker).await;
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
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
    let before = insert(&client, "a-1", None).await;
    let huge = insert(&client, "a-huge", Some(HUGE)).await;
    let huge_end = schema::current_wal_lsn(&db).await;
    let after = insert(&client, "a-1", None).await;
    let wal_after = schema::current_wal_lsn(&db).await;

    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(4), "log:\n{log}");
    assert!(log.contains(&huge), "the log names the row; log:\n{log}");
    assert!(
        log.contains("OUTBOXD_BAD_ROW_POLICY=dead-letter"),
        "log:\n{log}"
    );
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    // Keepalives may confirm WAL the huge transaction wrote before it committed (it is
    // decoded whole all the same), never its commit.
    assert!(
        confirmed < huge_end,
        "the slot was confirmed to {confirmed:#x}, past the huge row's transaction ending at {huge_end:#x}"
    );

    // The fix as the message words it: one run with the dead-letter policy.
    relay.set_env("OUTBOXD_BAD_ROW_POLICY", "dead-letter");
    relay.restart();
    let want: HashSet<String> = [before.clone(), huge.clone(), after.clone()].into();
    let got = read(&broker, &[topic.clone(), dlq.clone()], &want);
    assert_eq!(ids_on(&got, &topic), vec![before.as_str(), after.as_str()]);
    assert_eq!(ids_on(&got, &dlq), vec![huge.as_str()]);
    let dead = got.iter().find(|r| r.topic == dlq).expect("dead letter");
    assert_eq!(dead.header("outboxd.error_kind"), Some("oversize"));
    assert!(
        dead.header("outboxd.error")
            .is_some_and(|e| e.contains("OUTBOXD_MAX_MESSAGE_BYTES")),
        "{dead:#?}"
    );
    assert_eq!(
        dead.key_str(),
        "a-huge",
        "the key is the row's aggregate id"
    );
    assert!(dead.wire_size() <= 1_000_000);
    assert_relayed_past(&db, &mut relay, wal_after).await;
}

/// A huge message with outboxd's own prefix would be published whole: read through, it
/// is dead-lettered without its content, and the events around it follow.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_emitted_message_of_ours_is_dead_lettered() {
    let broker = Broker::default_for_tests();
    let (db, outbox) = setup("huge_own_message", &broker).await;
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    let mut relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MESSAGE_PREFIX", "outbox")],
        ),
        &["run"],
    );
    let client = db.client().await;
    let before = insert(&client, "a-1", None).await;
    client
        .execute(
            "SELECT pg_logical_emit_message(true, 'outbox', repeat('m', $1::bigint::int))",
            &[&HUGE],
        )
        .await
        .expect("huge logical message");
    let after = insert(&client, "a-1", None).await;
    let wal_after = schema::current_wal_lsn(&db).await;

    let want: HashSet<String> = [before.clone(), after.clone()].into();
    let got = read(&broker, &[topic.clone(), dlq.clone()], &want);
    assert_eq!(ids_on(&got, &topic), vec![before.as_str(), after.as_str()]);
    let dead: Vec<&Received> = got.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].header("outboxd.error_kind"), Some("oversize"));
    assert_eq!(dead[0].header("outboxd.source_prefix"), Some("outbox"));
    assert_eq!(dead[0].header("outboxd.omitted_columns"), Some("content"));
    assert!(
        dead[0]
            .header("outboxd.error")
            .is_some_and(|e| e.contains("the message with prefix \"outbox\"")
                && e.contains("OUTBOXD_MAX_MESSAGE_BYTES")),
        "{dead:#?}"
    );
    assert_relayed_past(&db, &mut relay, wal_after).await;
}
