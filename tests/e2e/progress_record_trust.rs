//! What a progress record that outboxd did not write does: nothing. An unreadable value
//! under the slot's key (written by someone else, or by a bug) skips nothing, never holds
//! the slot (and so the primary's WAL) back, is counted for an alert, and is replaced at
//! the next write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema;

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_record_holds_nothing_back_and_is_replaced() {
    let db = PgCluster::shared()
        .fresh_database("record_unreadable")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    batch.stop();
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    ops::write_progress_record(&broker.bootstrap(), &key, r#"{"forged":true}"#);
    assert!(
        ops::latest_progress_record(&broker.bootstrap(), &key)
            .is_some_and(|r| r.get("confirmed_lsn").is_none()),
        "the forged value is the newest under the key"
    );

    let relay = Relay::start(batch.env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = insert_events(&client, &outbox.table, 10, 3, 3).await;
    let after = schema::current_wal_lsn(&db).await;
    let all = [batch.first.clone(), events].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &broker.bootstrap(),
            &batch.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    // The slot moves on: the record held nothing back.
    schema::wait_confirmed_at_least(&db, after, Duration::from_secs(60)).await;
    assert!(
        relay
            .metric("outboxd_progress_record_invalid_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    // And outboxd's own record replaced it.
    ops::wait_for(
        "a readable record under the key",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            ops::latest_progress_record(&broker.bootstrap(), &key)
                .filter(|r| r.get("confirmed_lsn").is_some())
        },
    )
    .await;
    drop(relay);
}

/// The slot lost while its record is unreadable: whether a slot existed is unknown, and
/// the error's words are followed (`init --recreate-lost-slot`, re-publish every row that
/// may not be in Kafka). Every row arrives.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_lost_under_an_unreadable_record_is_followed_to_every_row() {
    let db = PgCluster::shared()
        .fresh_database("record_unreadable_lost")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    batch.stop();
    let pending = insert_events(&client, &outbox.table, 20, 3, 3).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    ops::write_progress_record(&broker.bootstrap(), &key, r#"{"forged":true}"#);
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");

    let (code, out) = run_to_end(&batch.env, &["init"]);
    assert_ne!(code, 0, "init must not create the slot unasked: {out}");
    assert!(
        out.contains("`outboxd init --recreate-lost-slot`")
            && out.contains("re-publish every outbox row that may not be in Kafka"),
        "the error names the way on: {out}"
    );
    let (code, out) = run_to_end(&batch.env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(batch.env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    // Unsure which rows Kafka has: all rows still in the table.
    let moved = schema::republish_since(&client, "-infinity").await;
    assert_eq!(moved, 30, "every row in the table");
    let all = [batch.first.clone(), pending].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &broker.bootstrap(),
            &batch.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    drop(relay);
}
