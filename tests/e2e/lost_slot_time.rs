//! The time a lost-slot error names, followed literally. The rows committed after the
//! slot's last confirmed position must all have committed at or after it, whatever
//! wrote the record last: a session that published nothing, or `outboxd init`
//! replacing the record. Each test commits rows the relay could not publish, loses the
//! slot, runs `outboxd run` to read its error, runs `outboxd init --recreate-lost-slot`
//! and re-publishes the rows committed since the time the error named (minus the
//! longest transaction, here under a second), then reads every row from the topics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster};
use support::broker::{is_probe, Broker};
use support::consume::{check_delivery, ids, read_until_ids, Received};
use support::load::{insert_events, Event};
use support::ops::{self, read_all_blocking, wait_active_pid, wait_for};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// What the error says to re-publish from: the time after "committed since ", or, when it
/// names none, every row (`-infinity`).
fn named_time(text: &str) -> String {
    if text.contains("re-publish every outbox row that may not be in Kafka") {
        return "-infinity".to_owned();
    }
    text.match_indices("committed since ")
        .map(|(at, lead)| &text[at + lead.len()..])
        .find(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        .and_then(|rest| rest.split([',', ' ', ')']).next())
        .unwrap_or_else(|| panic!("no time to re-publish from in: {text}"))
        .to_owned()
}

/// From the lost slot on, as the operator does it: `run` refuses naming a time,
/// `init --recreate-lost-slot`, start, re-publish since that time minus a second;
/// every row arrives.
async fn follow_the_error(
    client: &tokio_postgres::Client,
    outbox: &Outbox,
    broker: &Broker,
    env: &[(String, String)],
    topics: &[String],
    all: &[Event],
    pending: usize,
) {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let (code, out) = run_to_end(env, &["run"]);
    assert_eq!(code, 3, "{out}");
    let since = named_time(&out);
    recreate_and_republish(client, outbox, broker, (env, topics), all, pending, &since).await;
}

/// `init --recreate-lost-slot`, start, re-publish since `since` minus a second (the
/// longest transaction here); every row arrives.
async fn recreate_and_republish(
    client: &tokio_postgres::Client,
    outbox: &Outbox,
    broker: &Broker,
    (env, topics): (&[(String, String)], &[String]),
    all: &[Event],
    pending: usize,
    since: &str,
) {
    // The runbook's order: the slot, the re-publish, then outboxd.
    let (code, out) = run_to_end(env, &["init", "--recreate-lost-slot"]);
    assert_eq!(code, 0, "{out}");
    let from: String = client
        .query_one(
            "SELECT ($1::text::timestamptz - interval '1 second')::text",
            &[&since],
        )
        .await
        .expect("time")
        .get(0);
    let moved = schema::republish_since(client, &from).await;
    assert!(
        moved >= u64::try_from(pending).unwrap(),
        "re-publishing since {since} (as the error said) moved {moved} rows; {pending} were never relayed"
    );
    let relay = Relay::start(env.to_vec(), &["run"]);
    wait_active_pid(client, &outbox.slot, Duration::from_secs(120)).await;
    let got: Vec<Received> =
        read_all_blocking(&broker.bootstrap(), topics, all, Duration::from_secs(60))
            .into_iter()
            .filter(|r| !is_probe(r))
            .collect();
    check_delivery(all, &got);
    drop(relay);
}

/// A relay that relayed a batch and stopped cleanly, then rows it has not seen.
async fn relayed_then_pending(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
    broker: &Broker,
) -> (Outbox, ops::FirstBatch, Vec<Event>) {
    let outbox = schema::setup_without_slot(db).await;
    let (batch, pending) = pending_after_a_batch(db, client, broker, &outbox).await;
    (outbox, batch, pending)
}

/// [`relayed_then_pending`] on an outbox set up by the caller (whose topics, made first,
/// `ops::relay_first_batch` finds there).
async fn pending_after_a_batch(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
    broker: &Broker,
    outbox: &Outbox,
) -> (ops::FirstBatch, Vec<Event>) {
    let mut batch = ops::relay_first_batch(db, client, outbox, broker, &[], 10).await;
    batch.stop();
    let pending = insert_events(client, &outbox.table, 20, 3, 3).await;
    // Anything written from here on is seconds after the rows.
    ops::wait_clock_past_rows(client).await;
    (batch, pending)
}

/// Restarted while its topics refuse every write (the progress topic still takes its
/// record): the session publishes nothing and its record names no transaction, yet the
/// rows it could not publish came before the time it writes. On a three-node Kafka of
/// its own: refusing writes takes a killed replica (`Broker::create_refusable_topics`).
#[tokio::test(flavor = "multi_thread")]
async fn a_session_that_published_nothing_keeps_the_time_to_republish_from() {
    let db = PgCluster::shared()
        .fresh_database("lost_time_session")
        .await;
    let client = db.client().await;
    let broker = Broker::kafka(3);
    let outbox = schema::setup_without_slot(&db).await;
    ops::refusable_topics(&broker, &outbox).await;
    let (batch, pending) = pending_after_a_batch(&db, &client, &broker, &outbox).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    let before = ops::latest_progress_record(&broker.bootstrap(), &key).expect("record");
    broker.refuse_acks_all(&batch.topics, 4).await;
    let mut stuck = Relay::start(batch.env.clone(), &["run"]);
    wait_for(
        "the restarted relay's progress record",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let now = ops::latest_progress_record(&broker.bootstrap(), &key)?;
            (now["writer"] != before["writer"]).then_some(())
        },
    )
    .await;
    // Once the session has sent the pending rows (in flight, or acked had the topics
    // taken them), none may have been published while the topics refused every write.
    let sent = f64::from(u32::try_from(pending.len()).unwrap());
    stuck
        .wait_metrics("the restarted relay to send the pending rows", |body| {
            let in_flight = ops::metric_sum(body, "outboxd_in_flight_messages")?;
            let acked = ops::metric_sum(body, "outboxd_events_published_total")?;
            (in_flight + acked >= sent).then_some(())
        })
        .await;
    // Until the first batch is read (it is in the topics: a read that saw nothing cannot
    // pass), then 2 s on.
    let read = tokio::task::block_in_place(|| {
        read_until_ids(
            &broker.bootstrap(),
            &batch.topics,
            &ids(&batch.first),
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
    });
    let in_topics: Vec<String> = read
        .iter()
        .filter_map(|r| r.header("id"))
        .filter(|id| ids(&pending).contains(*id))
        .map(str::to_owned)
        .collect();
    let published = stuck.metric("outboxd_events_published_total");
    assert!(
        published == Some(0.0) && in_topics.is_empty(),
        "the restarted session published {published:?} events, {} of the {} pending rows in the topics, while they refused every write",
        in_topics.len(),
        pending.len()
    );
    stuck.kill();
    broker.take_acks_all(&batch.topics).await;
    let all = [batch.first.clone(), pending.clone()].concat();
    follow_the_error(
        &client,
        &outbox,
        &broker,
        &batch.env,
        &batch.topics,
        &all,
        pending.len(),
    )
    .await;
}

/// A slot invalidated by `max_slot_wal_keep_size` while the relay was stopped, with rows it
/// never saw. `run`'s error is followed as written: drop the slot, run `outboxd init` for
/// the time to re-publish from, `init --recreate-lost-slot`, re-publish.
#[tokio::test(flavor = "multi_thread")]
async fn an_invalidated_slot_is_followed_to_every_row() {
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["max_slot_wal_keep_size = '16MB'".to_owned()],
        ..ClusterOptions::default()
    })
    .expect("dedicated cluster");
    let db = cluster.fresh_database("lost_time_invalidated").await;
    let client = db.client().await;
    let broker = Broker::default_for_tests();
    let (outbox, batch, pending) = relayed_then_pending(&db, &client, &broker).await;
    ops::invalidate_slot(&client, &outbox.slot).await;

    let (code, out) = run_to_end(&batch.env, &["run"]);
    assert_eq!(code, 3, "run on an invalidated slot: {out}");
    let drop = format!("SELECT pg_drop_replication_slot('{}')", outbox.slot);
    assert!(out.contains(&drop), "the error names how to drop it: {out}");
    client.batch_execute(&drop).await.expect("drop slot");
    let (code, out) = run_to_end(&batch.env, &["init"]);
    assert_ne!(code, 0, "init must not create the lost slot unasked: {out}");
    let since = named_time(&out);
    let all = [batch.first.clone(), pending.clone()].concat();
    recreate_and_republish(
        &client,
        &outbox,
        &broker,
        (&batch.env, &batch.topics),
        &all,
        pending.len(),
        &since,
    )
    .await;
}

/// `outboxd init --accept-publication-change` over a slot with rows not yet relayed: the
/// record it writes names no transaction, yet must not name a time after those rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_record_keeps_the_time_to_republish_from() {
    replaced_then_lost("lost_time_accepted", "--accept-publication-change").await;
}

/// `outboxd init --replace-progress-record` replaces a record as wrong: its time is not
/// trusted, and the error says to re-publish every row that may be missing.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_replaced_as_wrong_names_no_time_and_loses_nothing() {
    replaced_then_lost("lost_time_replaced", "--replace-progress-record").await;
}

async fn replaced_then_lost(name: &str, flag: &str) {
    let db = PgCluster::shared().fresh_database(name).await;
    let client = db.client().await;
    let broker = Broker::default_for_tests();
    let (outbox, batch, pending) = relayed_then_pending(&db, &client, &broker).await;
    let (code, out) = run_to_end(&batch.env, &["init", flag]);
    assert_eq!(code, 0, "{out}");
    let all = [batch.first.clone(), pending.clone()].concat();
    follow_the_error(
        &client,
        &outbox,
        &broker,
        &batch.env,
        &batch.topics,
        &all,
        pending.len(),
    )
    .await;
}
