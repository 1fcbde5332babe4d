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

/// Every row is two days old, as if the loss had been found late, and `outboxd prune
/// --older-than 1d` runs from cron throughout, with the relay started right after `init`
/// (as an operator restoring service would): prune must delete none of the rows owed a
/// re-publish until the operator says they are back, as `init` prints.
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
        .query_one("SELECT (now() - interval '2 days')::text", &[])
        .await
        .expect("now")
        .get(0);
    let lost = insert_events(&client, &outbox.table, 20, 3, 4).await;
    // Updates are not published (publish = 'insert').
    client
        .execute(
            "UPDATE public.outbox SET created_at = created_at - interval '2 days'",
            &[],
        )
        .await
        .expect("age rows");
    let mut refused = Relay::start(env.clone(), &["run"]);
    assert_eq!(refused.wait_exit(Duration::from_secs(60)).code(), Some(3));

    // The runbook: init; the relay is started at once, prune keeps running from cron.
    let (code, out) = run_to_end(&env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("`outboxd init --republish-done`"), "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_some());
    let relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let prune = ["prune", "--older-than", "1d", "--wait", "30s"];
    let (code, out) = run_to_end(&env, &prune);
    assert_eq!(
        code, 3,
        "rows are owed a re-publish: prune must refuse: {out}"
    );
    assert!(out.contains("`outboxd init --republish-done`"), "{out}");
    assert_eq!(
        schema::outbox_rows(&client).await,
        50,
        "nothing deleted: {out}"
    );
    let owed = |out: &str| {
        out.lines()
            .any(|l| l.starts_with("warn  re-publish owed: "))
    };
    let (_, out) = run_to_end(&env, &["check"]);
    assert!(owed(&out), "check names the owed re-publish: {out}");

    // Re-published as the runbook says, then said so as prune says.
    let moved = schema::republish_since(&client, &lost_since).await;
    assert_eq!(moved, 20, "the rows committed while the slot was lost");
    let (code, out) = run_to_end(&env, &["init", "--republish-done"]);
    assert_eq!(code, 0, "{out}");
    let (_, out) = run_to_end(&env, &["check"]);
    assert!(!owed(&out), "{out}");
    let received = read_all_blocking(&broker.bootstrap(), &topics, &lost, Duration::from_secs(60));
    let (code, out) = run_to_end(&env, &prune);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        schema::outbox_rows(&client).await,
        0,
        "every row is relayed and old: {out}"
    );
    // Each aggregate's re-published events arrive in their original order.
    let all = [before, lost].concat();
    support::consume::check_delivery(&all, &received);
    drop(relay);
}
