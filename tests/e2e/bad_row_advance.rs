//! The bad-row error's way past a row (OUTBOXD_BAD_ROW_POLICY=stop), followed as printed:
//! `pg_replication_slot_advance` past the bad transaction, right behind a transaction of
//! 20,000 events still in flight when the bad row is read. Advancing skips whatever the
//! slot had not confirmed, so the text may offer it only once everything before the bad
//! transaction is in Kafka: every other event must arrive.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::{insert_events, insert_one_transaction};
use support::ops::{self, read_all_blocking};
use support::relay::Relay;
use support::schema;

/// The default table, but with a nullable aggregate_id so a NULL key can be inserted.
const NULLABLE_KEY_DDL: &str = "CREATE TABLE public.outbox (
    id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NULL,
    event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NULL,
    created_at timestamptz NOT NULL DEFAULT now())";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advancing_past_a_bad_row_as_printed_skips_only_its_transaction() {
    let db = PgCluster::shared().fresh_database("bad_row_advance").await;
    let o = schema::setup_custom(&db, NULLABLE_KEY_DDL, Some("publish = 'insert'")).await;
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_BAD_ROW_POLICY", "stop")],
    );
    // Created before the rows: a slot created over them would be refused.
    let (code, out) = support::relay::run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let mut events = insert_one_transaction(&client, &o.table, 20_000, 40).await;
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES (gen_random_uuid(), 'order', NULL, 'E', '{}')",
            &[],
        )
        .await
        .unwrap();
    let mut relay = Relay::start(env, &["run"]);
    let mut rounds = 0;
    loop {
        let reason = bad_row_stop(&mut relay);
        rounds += 1;
        assert!(
            rounds <= 3,
            "still no safe way past after {rounds} stops: {reason}"
        );
        // The advance, where the text offers it; else it says to start outboxd again.
        if let Some(args) = printed_advance(&reason) {
            eprintln!("advancing as printed: pg_replication_slot_advance({args})");
            client
                .batch_execute(&format!("SELECT pg_replication_slot_advance({args})"))
                .await
                .unwrap();
            break;
        }
        assert!(reason.contains("Start outboxd again"), "{reason}");
        relay.restart();
    }
    relay.restart();
    events.extend(insert_events(&client, &o.table, 1_000, 10, 40).await);
    // Waits for every committed event, and fails naming how many never arrived.
    read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
}

/// A bad non-transactional message's way past, followed as printed. Its position is where
/// its WAL record ends, which is where the next record starts: an advance one byte past it
/// (what a transaction's commit LSN takes) would skip the message written right after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advancing_past_a_bad_message_as_printed_skips_only_it() {
    let db = PgCluster::shared()
        .fresh_database("bad_message_advance")
        .await;
    let o = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let topic = o.topic("order");
    broker
        .create_topics(&[&topic, &o.dead_letter_topic()], 3)
        .await;
    let client = db.client().await;
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[
            ("OUTBOXD_BAD_ROW_POLICY", "stop"),
            ("OUTBOXD_MESSAGE_PREFIX", "outbox"),
        ],
    );
    let (code, out) = support::relay::run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let envelope = |id: &str, aggregate_id: &str| {
        format!(
            r#"{{"id": "{id}", "aggregate_type": "order", "aggregate_id": {aggregate_id}, "event_type": "E", "payload": {{}}}}"#
        )
    };
    let good = uuid::Uuid::new_v4().to_string();
    // One statement: the two records are written back to back.
    client
        .execute(
            "SELECT pg_logical_emit_message(false, 'outbox', $1::text), \
                    pg_logical_emit_message(false, 'outbox', $2::text)",
            &[
                &envelope(&uuid::Uuid::new_v4().to_string(), "null"),
                &envelope(&good, "\"agg-1\""),
            ],
        )
        .await
        .unwrap();
    let mut relay = Relay::start(env, &["run"]);
    let reason = bad_row_stop(&mut relay);
    let args = printed_advance(&reason)
        .unwrap_or_else(|| panic!("nothing was before it, yet no advance offered: {reason}"));
    client
        .batch_execute(&format!("SELECT pg_replication_slot_advance({args})"))
        .await
        .unwrap();
    relay.restart();
    let want: std::collections::HashSet<String> = [good].into_iter().collect();
    let received = tokio::task::block_in_place(|| {
        support::consume::read_until_ids(
            &broker.bootstrap(),
            &[topic],
            &want,
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
    });
    assert!(
        received
            .iter()
            .any(|r| want.contains(r.header("id").unwrap_or(""))),
        "the message after the bad one never arrived: the advance skipped it ({args})"
    );
}

/// Waits for the relay's exit 4 and returns its bad-row error line.
fn bad_row_stop(relay: &mut Relay) -> String {
    let status = relay.wait_exit(Duration::from_secs(120));
    assert_eq!(status.code(), Some(4), "{}", relay.log_text());
    let log = relay.log_text();
    log.lines()
        .rev()
        .find(|l| l.contains("bad outbox row"))
        .unwrap_or_else(|| panic!("no bad-row error:\n{log}"))
        .to_owned()
}

/// The arguments of the `pg_replication_slot_advance` the error offers, if it does.
fn printed_advance(reason: &str) -> Option<&str> {
    reason
        .split("SELECT pg_replication_slot_advance(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
}
