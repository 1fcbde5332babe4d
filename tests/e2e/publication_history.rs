//! A publication changed and changed back is seen, whenever it happens. PostgreSQL decides
//! what to send by the catalog as it was when each row was written: rows committed while
//! the outbox was out of the publication are never decoded, even once it is back. outboxd
//! cannot bring them back, so it stops, names when the rows to re-publish start, and
//! goes on only once an operator says they were (`outboxd init
//! --accept-publication-change`). Each test ends with every row relayed, or with the relay
//! stopped. Runs on every version of the matrix (PostgreSQL 18 skips a missing
//! publication with a warning where 17 raises an error).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_events, Event};
use support::ops::{self, read_all_blocking, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// A relay streaming a first batch of events, stopped cleanly: the publication is
/// recorded as it was.
struct Stopped {
    outbox: Outbox,
    broker: Broker,
    topics: Vec<String>,
    env: Vec<(String, String)>,
    first: Vec<Event>,
}

async fn relayed_then_stopped(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
    broker: Broker,
) -> Stopped {
    let outbox = schema::setup_without_slot(db).await;
    let mut batch = ops::relay_first_batch(db, client, &outbox, &broker, &[], 10).await;
    batch.stop();
    let ops::FirstBatch {
        env, topics, first, ..
    } = batch;
    Stopped {
        outbox,
        broker,
        topics,
        env,
        first,
    }
}

/// How the slot gets past the change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// The publication existed throughout: accept it as it is now.
    Accept,
    /// It was missing for a while: the slot can never decode past that (PostgreSQL 17
    /// and older raise an error there; outboxd refuses 18's warning the same way), so it
    /// is dropped and created again.
    RecreateSlot,
}

/// The runbook (docs/operations.md, "The publication changed"): accept the publication
/// as it is now (or recreate the slot), start again, re-publish the rows committed since
/// `since`.
async fn republish_and_accept(
    client: &tokio_postgres::Client,
    s: &Stopped,
    since: &str,
    expect_moved: u64,
    recovery: Recovery,
) -> Relay {
    let (code, out) = run_to_end(&s.env, &["check"]);
    assert_eq!(code, 6, "check must fail on the changed publication: {out}");
    let (code, out) = match recovery {
        Recovery::Accept => run_to_end(&s.env, &["init", "--accept-publication-change"]),
        Recovery::RecreateSlot => {
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&s.outbox.slot])
                .await
                .expect("drop slot");
            run_to_end(&s.env, &["init", "--recreate-lost-slot"])
        }
    };
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("`outboxd init --republish-done`"), "{out}");
    let relay = Relay::start(s.env.clone(), &["run"]);
    wait_active_pid(client, &s.outbox.slot, Duration::from_secs(120)).await;
    // The retention job, run meanwhile, keeps the rows the change hid (a loss the final
    // delivery check would show), until the operator says they are re-published.
    let prune = ["prune", "--older-than", "1s", "--wait", "30s"];
    let (code, out) = run_to_end(&s.env, &prune);
    assert_eq!(code, 3, "rows are owed a re-publish: {out}");
    assert!(out.contains("`outboxd init --republish-done`"), "{out}");
    let moved = schema::republish_since(client, since).await;
    assert_eq!(moved, expect_moved, "the rows committed since the change");
    let (code, out) = run_to_end(&s.env, &["init", "--republish-done"]);
    assert_eq!(code, 0, "{out}");
    relay
}

async fn now_text(client: &tokio_postgres::Client) -> String {
    client
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .expect("now")
        .get(0)
}

/// The stopped relay's publication is changed, 20 rows are committed, and the change is
/// undone, before the relay starts again.
async fn changed_while_stopped(name: &str, change: &str, undo: &str, recovery: Recovery) {
    changed_while_stopped_then(name, change, undo, recovery, &[]).await;
}

/// The same, restarted with `restart_env` added (a new progress key or topic), after a
/// plain `outboxd init`.
async fn changed_while_stopped_then(
    name: &str,
    change: &str,
    undo: &str,
    recovery: Recovery,
    restart_env: &[(&str, &str)],
) {
    let db = PgCluster::shared().fresh_database(name).await;
    let client = db.client().await;
    let mut s = relayed_then_stopped(&db, &client, Broker::default_for_tests()).await;
    for (k, v) in restart_env {
        s.env.retain(|(key, _)| key != k);
        s.env.push(((*k).to_owned(), (*v).to_owned()));
    }
    let publication = &s.outbox.publication;
    let since = now_text(&client).await;
    client
        .batch_execute(&change.replace("{p}", publication))
        .await
        .expect("change the publication");
    let during = insert_events(&client, &s.outbox.table, 20, 3, 3).await;
    client
        .batch_execute(&undo.replace("{p}", publication))
        .await
        .expect("change it back");

    if !restart_env.is_empty() {
        // Deploy scripts run `init` before every start. Under a new key or topic no look
        // is recorded there: writing today's publication as the first would let `run`
        // stream past the rows the change hid.
        let (code, out) = run_to_end(&s.env, &["init"]);
        assert_eq!(code, 3, "init must refuse the changed publication: {out}");
        assert!(
            out.contains("--accept-publication-change"),
            "init's refusal names the way past it: {out}"
        );
    }
    // The catalog looks as before; the rows in between were never decoded.
    let mut refused = Relay::start(s.env.clone(), &["run"]);
    assert_eq!(
        refused.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "a publication changed and changed back must stop outboxd: {}",
        refused.log_text()
    );
    let relay = republish_and_accept(&client, &s, &since, 20, recovery).await;
    let after = insert_events(&client, &s.outbox.table, 5, 3, 3).await;
    let all = [s.first.clone(), during, after].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &s.broker.bootstrap(),
            &s.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_dropped_from_the_publication_and_added_back_while_stopped_is_seen() {
    changed_while_stopped(
        "pub_drop_add",
        "ALTER PUBLICATION \"{p}\" DROP TABLE public.outbox",
        "ALTER PUBLICATION \"{p}\" ADD TABLE public.outbox",
        Recovery::Accept,
    )
    .await;
}

/// Restarted under a new progress key (`OUTBOXD_CLUSTER_NAME` set for the first time,
/// as the docs advise for copies): the record under the old name holds the look.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_made_while_stopped_is_seen_under_a_new_progress_key() {
    changed_while_stopped_then(
        "pub_new_key",
        "ALTER PUBLICATION \"{p}\" DROP TABLE public.outbox",
        "ALTER PUBLICATION \"{p}\" ADD TABLE public.outbox",
        Recovery::Accept,
        &[("OUTBOXD_CLUSTER_NAME", "renamed")],
    )
    .await;
}

/// Restarted under a new progress topic: no record there holds a look to compare with.
#[tokio::test(flavor = "multi_thread")]

async fn a_change_made_while_stopped_is_seen_under_a_new_progress_topic() {
    changed_while_stopped_then(
        "pub_new_topic",
        "ALTER PUBLICATION \"{p}\" SET (publish = 'update')",
        "ALTER PUBLICATION \"{p}\" SET (publish = 'insert')",
        Recovery::Accept,
        &[("OUTBOXD_PROGRESS_TOPIC", "outboxd.progress.pub_new_topic")],
    )
    .await;
}

/// PostgreSQL 18 skips a publication missing at decoding time with a warning only.
#[tokio::test(flavor = "multi_thread")]
async fn a_publication_dropped_and_recreated_while_stopped_is_seen() {
    changed_while_stopped(
        "pub_recreate",
        "DROP PUBLICATION \"{p}\"",
        "CREATE PUBLICATION \"{p}\" FOR TABLE public.outbox WITH (publish = 'insert')",
        Recovery::RecreateSlot,
    )
    .await;
}

/// While streaming, within one look at the catalog: `publish` changed and changed back.
#[tokio::test(flavor = "multi_thread")]
async fn publish_changed_and_changed_back_while_streaming_stops_the_relay() {
    let db = PgCluster::shared().fresh_database("pub_flags").await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let ops::FirstBatch { mut relay, env, .. } =
        ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    let p = &outbox.publication;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" SET (publish = 'update')"
        ))
        .await
        .expect("publish update");
    insert_events(&client, &outbox.table, 20, 3, 3).await;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" SET (publish = 'insert')"
        ))
        .await
        .expect("publish insert");
    assert_eq!(
        relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "the change must stop outboxd: {}",
        relay.log_text()
    );
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
}

/// While the relay is stopped: the table dropped from the publication, 20 rows committed,
/// the table added back. The catalog looks as before; the rows were never decoded.
async fn hide_rows(client: &tokio_postgres::Client, s: &Stopped) {
    let p = &s.outbox.publication;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" DROP TABLE public.outbox"
        ))
        .await
        .expect("drop table");
    insert_events(client, &s.outbox.table, 20, 3, 3).await;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" ADD TABLE public.outbox"
        ))
        .await
        .expect("add table");
}

/// The record cannot be read at the start (Kafka is down): the publication cannot be
/// compared with the record's, so the slot must not move, not even on the keepalives of an
/// idle outbox (whose hidden rows decode to nothing), until Kafka answers and the
/// comparison stops the relay.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_made_while_stopped_is_seen_once_kafka_answers() {
    let db = PgCluster::shared().fresh_database("pub_kafka_down").await;
    let client = db.client().await;
    let s = relayed_then_stopped(&db, &client, Broker::kafka(1)).await;
    hide_rows(&client, &s).await;
    let past_the_rows = schema::current_wal_lsn(&db).await;
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    s.broker.set_all_down(true);
    let mut relay = Relay::start(s.env.clone(), &["run"]);
    relay
        .wait_metric_at_least("outboxd_progress_record_unread_total", 1.0)
        .await;
    // Keepalives past the hidden rows, and status updates after them: where an idle
    // relay confirms.
    relay
        .wait_metric_at_least("outboxd_server_wal_end_lsn", past_the_rows as f64)
        .await;
    let sent = relay
        .wait_metric_at_least("outboxd_status_updates_sent_total", 1.0)
        .await;
    relay
        .wait_metric_at_least("outboxd_status_updates_sent_total", sent + 2.0)
        .await;
    assert_eq!(
        schema::confirmed_flush_lsn(&db).await,
        confirmed,
        "the slot moved past rows the publication hid, before the change could be seen"
    );
    s.broker.set_all_down(false);
    assert_eq!(
        relay.wait_exit(Duration::from_secs(120)).code(),
        Some(3),
        "the change must stop outboxd once the record is read: {}",
        relay.log_text()
    );
    assert_eq!(schema::confirmed_flush_lsn(&db).await, confirmed);
}

/// A new progress topic (no record holds a look) read only after the start (Kafka down
/// then): the slot's catalog horizon must judge the change once the read comes, as it
/// does when the read comes in time. It used to take the empty read as the comparison
/// and go on, confirming past the rows the change hid.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_made_while_stopped_is_seen_under_a_new_topic_read_late() {
    let db = PgCluster::shared().fresh_database("pub_late_topic").await;
    let client = db.client().await;
    let mut s = relayed_then_stopped(&db, &client, Broker::kafka(1)).await;
    s.env.retain(|(k, _)| k != "OUTBOXD_PROGRESS_TOPIC");
    s.env.push((
        "OUTBOXD_PROGRESS_TOPIC".into(),
        "outboxd.progress.pub_late_topic".into(),
    ));
    hide_rows(&client, &s).await;
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    s.broker.set_all_down(true);
    let mut relay = Relay::start(s.env.clone(), &["run"]);
    relay
        .wait_metric_at_least("outboxd_progress_record_unread_total", 1.0)
        .await;
    s.broker.set_all_down(false);
    assert_eq!(
        relay.wait_exit(Duration::from_secs(120)).code(),
        Some(3),
        "the change must stop outboxd once the empty record is read: {}",
        relay.log_text()
    );
    assert_eq!(
        schema::confirmed_flush_lsn(&db).await,
        confirmed,
        "the slot moved past rows the publication hid"
    );
}

/// With sql/publication-guard.sql the change is marked in the WAL, and the relay stops
/// there, at once: here its looks at the catalog are an hour apart, so only the guard can
/// stop it. The slot is never confirmed past the change.
#[tokio::test(flavor = "multi_thread")]
async fn with_the_guard_trigger_the_relay_stops_at_the_change() {
    let db = PgCluster::shared().fresh_database("pub_guard").await;
    let client = db.client().await;
    client
        .batch_execute(include_str!("../../sql/publication-guard.sql"))
        .await
        .expect("guard trigger");
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let extra = [("OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS", "3600000")];
    let ops::FirstBatch { mut relay, .. } =
        ops::relay_first_batch(&db, &client, &outbox, &broker, &extra, 10).await;
    let p = &outbox.publication;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" DROP TABLE public.outbox"
        ))
        .await
        .expect("drop table");
    let change_done = schema::current_wal_lsn(&db).await;
    insert_events(&client, &outbox.table, 20, 3, 3).await;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{p}\" ADD TABLE public.outbox"
        ))
        .await
        .expect("add table");
    // Rows after the change back: decoded and published, never confirmed.
    insert_events(&client, &outbox.table, 5, 3, 3).await;
    assert_eq!(
        relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "the guard's message must stop outboxd: {}",
        relay.log_text()
    );
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    assert!(
        confirmed <= change_done,
        "the slot was confirmed to {confirmed:#x}, past the change (done by {change_done:#x})"
    );
}
