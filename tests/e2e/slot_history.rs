//! A slot that existed is never recreated silently: the progress record in Kafka says it
//! existed, so a missing slot at start-up is an error naming the fix, and only an
//! explicit `outboxd init` creates it again. A first start with no history still creates
//! the slot by itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

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
    let outbox = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    // A transaction with an xid open while the relay creates the slot, as on a busy
    // cluster: the slot is active before it is consistent, and events committed in
    // between are before its start (the wait below must not return then).
    let other = db.client().await;
    other
        .batch_execute("BEGIN; SELECT txid_current();")
        .await
        .expect("open transaction");
    let mut relay = Relay::start(env.clone(), &["run"]);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        other.batch_execute("COMMIT").await.expect("commit");
    });
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
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

    // The explicit action: `outboxd init --recreate-lost-slot` creates it (plain `init`
    // refuses, like `run`), then outboxd runs again and relays what is committed from then on.
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_none(), "{out}");
    let (code, out) = run_to_end(&env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_some(), "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
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
    let outbox = Outbox::for_db(&db);
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

/// Waits until the relay exits (its code) or the slot exists (None).
async fn exit_or_slot(
    relay: &mut Relay,
    client: &tokio_postgres::Client,
    slot: &str,
) -> Option<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if !relay.is_running() {
            return Some(relay.wait_exit(Duration::from_secs(1)).code().unwrap_or(-1));
        }
        if slot_row(client, slot).await.is_some() {
            return None;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither exited nor created the slot: {}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A progress topic with several partitions (made by an operator with the cluster's
/// default partition count, or auto-created by a broker on the first write): the record
/// is written to the partition its key hashes to, but only partition 0 is read back, so
/// a lost slot looks like a first start and is recreated silently.
#[tokio::test(flavor = "multi_thread")]
async fn a_progress_topic_with_several_partitions_still_guards_the_slot() {
    let db = PgCluster::shared()
        .fresh_database("slot_progress_parts")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let progress_topic = format!("{}.progress", outbox.topic_prefix);
    broker.create_topics(&[&progress_topic], 16).await;
    // Compacted, as outboxd requires of a progress topic (a real broker shows the policy).
    broker
        .set_topic_config(&progress_topic, "cleanup.policy", "compact")
        .await;
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_PROGRESS_TOPIC", &progress_topic)],
    );
    let mut relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let first = insert_events(&client, &outbox.table, 5, 3, 3).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &first,
        Duration::from_secs(60),
    );
    check_delivery(&first, &received);
    relay.signal("TERM");
    assert_eq!(relay.wait_exit(Duration::from_secs(30)).code(), Some(0));

    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    insert_events(&client, &outbox.table, 5, 3, 3).await;
    let mut restarted = Relay::start(env, &["run"]);
    let exited = exit_or_slot(&mut restarted, &client, &outbox.slot).await;
    assert_eq!(
        exited,
        Some(3),
        "the lost slot was recreated (events committed meanwhile skipped): {}",
        restarted.log_text()
    );
}

/// Kafka unreachable when outboxd starts on a slot made by `outboxd init` (or by hand, or
/// before progress records existed): the record can be neither read nor written. Once the
/// progress topic answers again the record must be written, even while nothing is
/// confirmed (here: the events' partition leader stays down after the rest of Kafka is
/// back), or a later lost slot (a failover) would look like a first start.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_progress_write_that_failed_is_retried() {
    let db = PgCluster::shared()
        .fresh_database("slot_progress_down")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&outbox.slot],
        )
        .await
        .expect("slot");
    // A three-node Kafka: the progress topic's only replica on broker 1, the events'
    // partitions' on broker 3; all three killed before the relay starts.
    let broker = Broker::kafka(3);
    ops::create_topics_on(&broker, &outbox, 4, 3).await;
    broker.create_progress_topic_on(1).await;
    broker.set_all_down(true);
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let waiting = insert_events(&client, &outbox.table, 10, 3, 3).await;
    // With Kafka down the record can be neither read nor written, and a slot that never
    // decoded is not streamed before its first look is recorded.
    relay
        .wait_metric_at_least("outboxd_reconnects_total", 1.0)
        .await;
    assert!(
        slot_row(&client, &outbox.slot)
            .await
            .is_some_and(|r| r.active_pid.is_none()),
        "the slot is not streamed before Kafka records a look"
    );
    // Kafka comes back, but not the events' partitions' leader: nothing is confirmed,
    // while the progress topic is writable again. The record is written all the same.
    let cluster = broker.kafka_cluster();
    tokio::task::block_in_place(|| cluster.restart(&[1, 2], 2)).expect("brokers 1 and 2 back");
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    relay
        .wait_metric_at_least("outboxd_progress_recorded_lsn", 1.0)
        .await;
    relay.kill();
    assert!(!waiting.is_empty());
    // The walsender notices the killed client a moment later; only then can it be dropped.
    ops::wait_for(
        "the killed relay's walsender to release the slot",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            slot_row(&client, &outbox.slot)
                .await
                .is_some_and(|r| r.active_pid.is_none())
                .then_some(())
        },
    )
    .await;

    // The slot is lost while outboxd is down.
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let mut restarted = Relay::start(env, &["run"]);
    let exited = exit_or_slot(&mut restarted, &client, &outbox.slot).await;
    assert_eq!(
        exited,
        Some(3),
        "the lost slot was recreated over unrelayed events: {}",
        restarted.log_text()
    );
}

/// The record is written before the slot is created. If the creation never completes (a
/// long transaction delays the consistent point, and the pod is killed meanwhile), the
/// next start takes the record for a lost slot and refuses to create one that never
/// existed, until an operator steps in.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_first_creation_is_not_a_lost_slot() {
    let db = PgCluster::shared()
        .fresh_database("slot_create_killed")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    ops::create_topics(&broker, &outbox).await;
    let mut blocker = db.client().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.query_one("SELECT txid_current()", &[])
        .await
        .expect("xid");
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let mut relay = Relay::start(env.clone(), &["run"]);
    // The slot appears (ephemeral) while CREATE_REPLICATION_SLOT waits for the blocker.
    ops::wait_for(
        "the slot being created",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_row(&client, &outbox.slot).await.map(|_| ()) },
    )
    .await;
    relay.kill();
    // The walsender notices its client is gone once the wait ends: the slot goes.
    tx.commit().await.expect("commit");
    ops::wait_for(
        "the unfinished slot to go",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            slot_row(&client, &outbox.slot)
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;

    let mut restarted = Relay::start(env, &["run"]);
    let exited = exit_or_slot(&mut restarted, &client, &outbox.slot).await;
    assert_eq!(
        exited,
        None,
        "no slot ever existed, yet the restart refuses: {}",
        restarted.log_text()
    );
}

/// The final progress record is written on shutdown after the drain deadline, with its
/// own 30 s timeout, and before the final status update: with Kafka down a SIGTERM takes
/// OUTBOXD_SHUTDOWN_TIMEOUT_MS plus ~30 s (past Kubernetes' default grace period, so the
/// final confirmation is never sent and acked events are re-sent).
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_with_kafka_down_keeps_its_deadline() {
    let s = ops::streaming_relay_on(
        Broker::kafka(1),
        "slot_progress_shutdown",
        &[("OUTBOXD_SHUTDOWN_TIMEOUT_MS", "2000")],
    )
    .await;
    s.relay_events(3).await;
    let mut relay = s.relay;
    // Let a first progress record be written (the topic is then known to exist).
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.broker.set_all_down(true);
    insert_events(&s.client, &s.outbox.table, 3, 3, 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = std::time::Instant::now();
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(90));
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(0), "{}", relay.log_text());
    // The bug took the 2 s timeout plus ~30 s; 20 s leaves a loaded machine room for the
    // exit itself and still tells the two apart.
    assert!(
        took < Duration::from_secs(20),
        "shutdown took {took:?} with a 2 s shutdown timeout: {}",
        relay.log_text()
    );
}

/// A record of this database and slot written on another cluster (another system
/// identifier), and none for this one: outboxd is pointed at a different cluster than
/// before. Neither a missing slot nor an existing one is streamed from until
/// `outboxd init` records this cluster; then events flow.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_of_another_cluster_is_refused_until_init() {
    let db = PgCluster::shared()
        .fresh_database("slot_other_cluster")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let ours: String = client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    let other = "7000000000000000001";
    assert_ne!(ours, other);
    write_foreign_record(&broker.bootstrap(), other, &db.name, &outbox.slot);
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    // No slot here: it would be created at the current position, leaving behind what the
    // old cluster still had.
    let mut relay = Relay::start(env.clone(), &["run"]);
    let exited = exit_or_slot(&mut relay, &client, &outbox.slot).await;
    assert_eq!(exited, Some(3), "{}", relay.log_text());
    let log = relay.log_text();
    assert!(log.contains(other) && log.contains(&ours), "{log}");
    assert!(log.contains("outboxd init"), "{log}");

    // A slot made by hand (or carried over by pg_upgrade): refused the same way.
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&outbox.slot],
        )
        .await
        .expect("slot");
    let mut relay = Relay::start(env.clone(), &["run"]);
    let status = relay.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", relay.log_text());
    assert!(relay.log_text().contains(other), "{}", relay.log_text());

    // The explicit way through: init records this cluster.
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("written for system identifier {ours}")),
        "{out}"
    );
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = insert_events(&client, &outbox.table, 10, 3, 3).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(60),
    );
    drop(relay);
    check_delivery(&events, &received);
}

/// A progress record as another cluster's relay writes it.
fn write_foreign_record(bootstrap: &str, system_id: &str, database: &str, slot: &str) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("producer");
    let key = format!("{system_id}/{database}/{slot}");
    let value = serde_json::json!({
        "version": 1,
        "system_id": system_id,
        "database": database,
        "slot": slot,
        "timeline": 1,
        "confirmed_lsn": "0/3000000",
        "recorded_at_unix_ms": 1_764_590_400_000u64,
        "last_commit_unix_micros": 0,
        "slot_created": true,
    })
    .to_string();
    producer
        .send(
            BaseRecord::to("outboxd.progress")
                .partition(0)
                .key(&key)
                .payload(&value),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(10)).expect("flush");
}
