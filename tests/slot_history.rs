//! A slot that existed is never recreated silently: the progress record in Kafka says it
//! existed, so a missing slot at start-up is an error naming the fix, and only an
//! explicit `outboxd init` creates it again. A first start with no history still creates
//! the slot by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, slot_row, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_slot_is_not_recreated_at_start_up() {
    let db = PgCluster::shared().fresh_database("slot_history").await;
    let client = db.client().await;
    // Table and publication only: the first start creates the slot itself.
    client
        .batch_execute(&format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            schema::OUTBOX_DDL,
            db.publication
        ))
        .await
        .expect("schema");
    let outbox = Outbox {
        table: "public.outbox".into(),
        publication: db.publication.clone(),
        slot: db.slot.clone(),
        topic_prefix: db.name.replace('_', "-"),
    };
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    let mut relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(30)).await;
    let first = insert_events(&client, &outbox.table, 20, 3, 3).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &first,
        Duration::from_secs(60),
    );
    check_delivery(&first, &received);
    relay.signal("TERM");
    assert_eq!(relay.wait_exit(Duration::from_secs(30)).code(), Some(0));

    // The slot disappears while outboxd is stopped (dropped by hand, or lost in a
    // failover), and the service keeps writing events.
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let during = insert_events(&client, &outbox.table, 10, 3, 3).await;

    // A restart, or a standby that never streamed: both refuse with exit 3.
    let mut restarted = Relay::start(env.clone(), &["run"]);
    let status = restarted.wait_exit(Duration::from_secs(60));
    assert_eq!(
        status.code(),
        Some(3),
        "a lost slot must stop outboxd: {}",
        restarted.log_text()
    );
    assert!(
        slot_row(&client, &outbox.slot).await.is_none(),
        "the lost slot must not be recreated without an operator"
    );

    // The explicit action: `outboxd init` creates it, then outboxd runs again and
    // relays what is committed from then on.
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_some(), "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(30)).await;
    let after = insert_events(&client, &outbox.table, 10, 3, 3).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &after,
        Duration::from_secs(60),
    );
    drop(relay);
    // The topics hold the first batch and this one; the events committed while the slot
    // was missing are the operator's to re-publish (none of them arrived by accident).
    check_delivery(&[first, after].concat(), &received);
    let arrived: std::collections::HashSet<&str> =
        received.iter().filter_map(|r| r.header("id")).collect();
    assert!(during.iter().all(|e| !arrived.contains(e.id.as_str())));
}

/// With the progress record disabled nothing can tell a first start from a lost slot,
/// so `run` never creates a missing slot; `init` does.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_progress_record_only_init_creates_the_slot() {
    let db = PgCluster::shared().fresh_database("slot_no_record").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            schema::OUTBOX_DDL,
            db.publication
        ))
        .await
        .expect("schema");
    let outbox = Outbox {
        table: "public.outbox".into(),
        publication: db.publication.clone(),
        slot: db.slot.clone(),
        topic_prefix: db.name.replace('_', "-"),
    };
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_PROGRESS_TOPIC", "")],
    );
    let mut relay = Relay::start(env, &["run"]);
    assert_eq!(
        relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "{}",
        relay.log_text()
    );
    assert!(slot_row(&client, &outbox.slot).await.is_none());
}
