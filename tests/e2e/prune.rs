//! `outboxd prune`: relayed rows older than the retention are deleted, and no row whose
//! transaction the slot has not confirmed (Kafka may not have it) ever is.

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

/// Back-dates rows, as if written two days ago (publish = 'insert': the update is not
/// relayed).
async fn age(client: &tokio_postgres::Client, ids: &[String]) {
    client
        .execute(
            "UPDATE public.outbox SET created_at = created_at - interval '2 days' \
             WHERE id::text = ANY($1)",
            &[&ids],
        )
        .await
        .expect("age rows");
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_deletes_only_old_rows_the_slot_confirmed() {
    let db = PgCluster::shared().fresh_database("prune").await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    let relayed: Vec<String> = batch.first.iter().map(|e| e.id.clone()).collect();
    age(&client, &relayed).await;
    batch.stop();

    // Committed while the relay is stopped: old, but not in Kafka.
    let unrelayed = insert_events(&client, &outbox.table, 10, 3, 3).await;
    age(
        &client,
        &unrelayed.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
    )
    .await;
    let (code, out) = run_to_end(&batch.env, &["prune", "--older-than", "1d", "--wait", "3s"]);
    assert_eq!(code, 3, "the slot is behind: prune must refuse: {out}");
    assert_eq!(
        schema::outbox_rows(&client).await,
        20,
        "nothing deleted: {out}"
    );

    let relay = Relay::start(batch.env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let fresh = insert_events(&client, &outbox.table, 5, 3, 3).await;
    let (code, out) = run_to_end(&batch.env, &["prune", "--older-than", "1d", "--batch", "7"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        schema::outbox_rows(&client).await,
        5,
        "only the fresh rows stay: {out}"
    );
    let all = [batch.first.clone(), unrelayed, fresh].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &broker.bootstrap(),
            &batch.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    // `check` reads the table's churn: a table that is pruned is not one to warn about.
    let (_, out) = run_to_end(&batch.env, &["check"]);
    assert!(
        out.lines().any(|l| l.starts_with("ok    retention: ")),
        "{out}"
    );
    drop(relay);
}
