//! A slot is created only over nothing it would skip. Creating a slot starts it at the
//! current WAL position: rows committed before that are never decoded for it. So neither
//! `run` nor `init` creates one when the progress record says a slot existed, when the
//! record is gone but the table has rows, or when the table has rows at all, unless the
//! operator says so; and a primary left running after a promotion is not streamed from.
//! Each test ends with every row relayed, or with outboxd stopped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_events, Event};
use support::ops::{self, read_all_blocking, slot_row, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// Relays a first batch, stops cleanly, drops the slot (by hand, or lost in a failover)
/// and commits 20 more rows: the rows a recreated slot would skip.
struct Lost {
    outbox: Outbox,
    broker: Broker,
    topics: Vec<String>,
    env: Vec<(String, String)>,
    first: Vec<Event>,
    lost_since: String,
    during: Vec<Event>,
}

async fn relayed_then_lost(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
    extra: &[(&str, &str)],
) -> Lost {
    let outbox = schema::setup_without_slot(db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(db, client, &outbox, &broker, extra, 10).await;
    batch.stop();
    let ops::FirstBatch {
        env, topics, first, ..
    } = batch;
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let lost_since: String = client
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .expect("now")
        .get(0);
    let during = insert_events(client, &outbox.table, 20, 3, 3).await;
    Lost {
        outbox,
        broker,
        topics,
        env,
        first,
        lost_since,
        during,
    }
}

/// `run` must exit 3 without creating the slot.
async fn run_refuses(env: &[(String, String)], client: &tokio_postgres::Client, slot: &str) {
    let mut relay = Relay::start(env.to_vec(), &["run"]);
    assert_eq!(
        relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "{}",
        relay.log_text()
    );
    assert!(
        slot_row(client, slot).await.is_none(),
        "the slot was created over rows it skips: {}",
        relay.log_text()
    );
}

/// The runbook's last steps: start, re-publish the rows since the loss, and every row
/// has arrived, in order per aggregate.
async fn republish_and_check(client: &tokio_postgres::Client, l: &Lost, env: &[(String, String)]) {
    let relay = Relay::start(env.to_vec(), &["run"]);
    wait_active_pid(client, &l.outbox.slot, Duration::from_secs(120)).await;
    // The retention job, run meanwhile, keeps the rows owed (a loss the delivery check
    // below would show) until the operator says they are re-published.
    let prune = ["prune", "--older-than", "1s", "--wait", "30s"];
    let (code, out) = run_to_end(env, &prune);
    assert_eq!(code, 3, "rows are owed a re-publish: {out}");
    assert!(out.contains("`outboxd init --republish-done`"), "{out}");
    let moved = schema::republish_since(client, &l.lost_since).await;
    assert_eq!(moved, 20);
    let (code, out) = run_to_end(env, &["init", "--republish-done"]);
    assert_eq!(code, 0, "{out}");
    let all = [l.first.clone(), l.during.clone()].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &l.broker.bootstrap(),
            &l.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    drop(relay);
}

/// `init` reads the record before it creates: a slot that existed is recreated only
/// with `--recreate-lost-slot`, and the new slot's start is then the record's.
#[tokio::test(flavor = "multi_thread")]
async fn init_does_not_recreate_a_lost_slot_without_being_told() {
    let db = PgCluster::shared().fresh_database("init_lost").await;
    let client = db.client().await;
    let l = relayed_then_lost(&db, &client, &[]).await;
    let (code, out) = run_to_end(&l.env, &["init"]);
    assert_eq!(code, 3, "init recreated a lost slot: {out}");
    assert!(slot_row(&client, &l.outbox.slot).await.is_none(), "{out}");
    assert!(out.contains("--recreate-lost-slot"), "{out}");

    let (code, out) = run_to_end(&l.env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    let slot = slot_row(&client, &l.outbox.slot).await.expect("slot");
    let key = format!(
        "{}/{}/{}",
        ops::system_identifier(&client).await,
        db.name,
        l.outbox.slot
    );
    let record = ops::latest_progress_record(&l.broker.bootstrap(), &key).expect("record");
    assert_eq!(
        record["confirmed_lsn"].as_str().map(schema::parse_lsn),
        slot.confirmed_flush,
        "the record must say where the new slot starts: {record}"
    );
    republish_and_check(&client, &l, &l.env).await;
}

/// The progress record is gone (its topic deleted or renamed, or a Kafka migration) and
/// so is the slot: the table's rows say a slot may have existed.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_slot_whose_record_is_gone_too_is_not_recreated() {
    let db = PgCluster::shared().fresh_database("record_gone").await;
    let client = db.client().await;
    let first_topic = format!("{}.progress", db.name);
    let l = relayed_then_lost(&db, &client, &[("OUTBOXD_PROGRESS_TOPIC", &first_topic)]).await;
    let renamed = format!("{}.progress-renamed", db.name);
    let mut env = l.env.clone();
    env.retain(|(k, _)| k != "OUTBOXD_PROGRESS_TOPIC");
    env.push(("OUTBOXD_PROGRESS_TOPIC".into(), renamed));
    run_refuses(&env, &client, &l.outbox.slot).await;
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "init created a slot over rows: {out}");
    assert!(slot_row(&client, &l.outbox.slot).await.is_none(), "{out}");
    let (code, out) = run_to_end(&env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    republish_and_check(&client, &l, &env).await;
}

/// A table that has rows and no slot (a pod started late, a shard's slot after `init`
/// failed part-way): a slot created now would start after them.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_is_not_created_over_existing_rows() {
    let db = PgCluster::shared().fresh_database("rows_first").await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    // A progress topic of its own, never written: nothing says a slot existed.
    let progress = format!("{}.progress", db.name);
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_PROGRESS_TOPIC", &progress)],
    );
    let before = insert_events(&client, &outbox.table, 5, 2, 2).await;
    run_refuses(&env, &client, &outbox.slot).await;
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("--skip-existing-rows"), "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_none(), "{out}");

    // The operator knows those rows are published (an earlier relay): start after them.
    let (code, out) = run_to_end(&env, &["init", "--skip-existing-rows"]);
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let after = insert_events(&client, &outbox.table, 10, 3, 3).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &after,
        Duration::from_secs(60),
    );
    check_delivery(&after, &received);
    let ids: std::collections::HashSet<&str> =
        received.iter().filter_map(|r| r.header("id")).collect();
    assert!(before.iter().all(|e| !ids.contains(e.id.as_str())));
    drop(relay);
}

/// The least-privilege role of sql/role.sql cannot read the table: its pages on disk tell
/// that rows were written, and that is enough to refuse.
#[tokio::test(flavor = "multi_thread")]
async fn a_role_without_select_does_not_create_a_slot_over_rows() {
    let db = PgCluster::shared().fresh_database("rows_no_select").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE lifecycle_relay LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT CONNECT ON DATABASE \"{}\" TO lifecycle_relay;",
            db.name
        ))
        .await
        .expect("role");
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let progress = format!("{}.progress", db.name);
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[
            ("PGUSER", "lifecycle_relay"),
            ("OUTBOXD_PROGRESS_TOPIC", &progress),
        ],
    );
    insert_events(&client, &outbox.table, 5, 2, 2).await;
    run_refuses(&env, &client, &outbox.slot).await;
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_none(), "{out}");
}

/// Creating a slot waits for the transactions running when it starts; rows committed
/// meanwhile are before its consistent point and never decoded. The snapshot of that point
/// shows them: the slot is dropped again and outboxd stops.
#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_while_the_slot_is_created_are_not_skipped() {
    let db = PgCluster::shared()
        .fresh_database("rows_during_create")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let mut blocker = db.client().await;
    let tx = blocker.transaction().await.expect("begin");
    tx.query_one("SELECT txid_current()", &[])
        .await
        .expect("xid");
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let mut relay = Relay::start(env.clone(), &["run"]);
    // The slot appears while CREATE_REPLICATION_SLOT waits for the blocker.
    ops::wait_for(
        "the slot being created",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { slot_row(&client, &outbox.slot).await.map(|_| ()) },
    )
    .await;
    let during = insert_events(&client, &outbox.table, 5, 2, 2).await;
    tx.commit().await.expect("commit the blocker");
    let code = relay.wait_exit(Duration::from_secs(60)).code();
    assert_eq!(
        code,
        Some(3),
        "a slot created past rows committed meanwhile: {}",
        relay.log_text()
    );
    assert!(slot_row(&client, &outbox.slot).await.is_none());
    // The operator's way on: a slot that skips them knowingly, and the rows re-published.
    let (code, out) = run_to_end(&env, &["init", "--skip-existing-rows"]);
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    client
        .execute(
            "WITH moved AS (DELETE FROM public.outbox RETURNING *) \
             INSERT INTO public.outbox SELECT * FROM moved",
            &[],
        )
        .await
        .expect("re-publish");
    check_delivery(
        &during,
        &read_all_blocking(
            &broker.bootstrap(),
            &topics,
            &during,
            Duration::from_secs(60),
        ),
    );
    drop(relay);
}

/// Split brain through a host list: a restored copy of the cluster (a promoted standby,
/// for the relay) runs on timeline 2 while the old primary, not fenced, stays up on
/// timeline 1. Once the relay streamed from timeline 2, the old primary's history is one
/// that was abandoned: going back to it is refused.
#[tokio::test(flavor = "multi_thread")]
async fn an_old_primary_left_running_is_not_streamed_from() {
    let old = PgCluster::start(pgtest::ClusterOptions::default()).expect("cluster");
    let db = old.fresh_database("split_brain").await;
    let outbox = schema::setup(&db).await;
    let promoted = old.restore_copy().expect("copy on a new timeline");
    let promoted_client = ops::connect(&promoted.conn_string(&db.name)).await;
    ops::wait_out_of_recovery(&promoted_client).await;
    assert_eq!(ops::current_timeline(&promoted_client).await, 2);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let ports = format!("{},{}", promoted.port(), old.port());
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("PGHOST", "127.0.0.1,127.0.0.1"), ("PGPORT", &ports)],
    );
    let mut relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&promoted_client, &outbox.slot, Duration::from_secs(120)).await;
    let relayed = insert_events(&promoted_client, &outbox.table, 10, 3, 3).await;
    check_delivery(
        &relayed,
        &read_all_blocking(
            &broker.bootstrap(),
            &topics,
            &relayed,
            Duration::from_secs(60),
        ),
    );
    // The new primary goes away; the first host that answers is the old one.
    promoted
        .stop(pgtest::StopMode::Immediate)
        .expect("stop the new primary");
    let old_client = db.client().await;
    insert_events(&old_client, &outbox.table, 10, 3, 3).await;
    assert_eq!(
        relay.wait_exit(Duration::from_secs(90)).code(),
        Some(3),
        "outboxd streamed from the abandoned timeline: {}",
        relay.log_text()
    );
    // A new process (a restarted pod) knows the newer timeline from the progress record.
    let mut restarted = Relay::start(env, &["run"]);
    assert_eq!(
        restarted.wait_exit(Duration::from_secs(90)).code(),
        Some(3),
        "a restarted outboxd streamed from the abandoned timeline: {}",
        restarted.log_text()
    );
}

/// A slot `run` creates has nothing to replay: its first start counts no replay doubt
/// (it counted `past_server_end` and warned of a cloned cluster on every first start).
#[tokio::test(flavor = "multi_thread")]
async fn a_first_start_that_creates_the_slot_doubts_nothing() {
    let db = PgCluster::shared().fresh_database("first_start").await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    batch
        .relay
        .wait_metric_at_least("outboxd_events_published_total", 10.0)
        .await;
    assert!(slot_row(&client, &outbox.slot).await.is_some());
    assert_eq!(
        batch.relay.metric("outboxd_replay_doubts_total"),
        Some(0.0),
        "replay doubts on a first start"
    );
    batch.stop();
}
