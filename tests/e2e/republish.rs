//! The runbook's re-publish procedure after a lost slot (docs/operations.md): rows kept in
//! the outbox are deleted and re-inserted in one statement, which writes new inserts to the
//! WAL, and reach Kafka again with their own ids.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, slot_row, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema;

#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_while_the_slot_was_lost_can_be_republished() {
    let db = PgCluster::shared().fresh_database("republish").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let client = db.client().await;
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 30).await;
    batch.stop();
    let ops::FirstBatch {
        env,
        topics,
        first: before,
        ..
    } = batch;

    // The slot is lost; the service goes on writing; outboxd refuses to recreate it.
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let lost_since: String = client
        .query_one("SELECT now()::text", &[])
        .await
        .expect("now")
        .get(0);
    let lost = insert_events(&client, &outbox.table, 20, 3, 4).await;
    let mut refused = Relay::start(env.clone(), &["run"]);
    assert_eq!(refused.wait_exit(Duration::from_secs(60)).code(), Some(3));

    // The runbook: init, re-publish the rows since the loss, start.
    let (code, out) = run_to_end(&env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_some());
    let moved = schema::republish_since(&client, &lost_since).await;
    assert_eq!(moved, 20, "the rows committed while the slot was lost");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let received = read_all_blocking(&broker.bootstrap(), &topics, &lost, Duration::from_secs(60));
    // Each aggregate's re-published events arrive in their original order.
    let all = [before, lost].concat();
    support::consume::check_delivery(&all, &received);
    drop(relay);
}
