//! Issue 18: a restarted relay skips replayed transactions that the progress record says
//! are delivered, and the record names its cluster by system identifier, database and
//! slot only. Each test here builds a real situation in which that record describes
//! another history than the one the server replays (a second primary with the same
//! system identifier, a partly acked transaction read under another configuration, a
//! server clock that ran ahead, an older backup restored on the same timeline), and
//! checks what a consumer sees: every committed event arrives, in order per aggregate
//! after dedup by id. Duplicates are allowed; each test prints how many it cost
//! (`proven_skip: <scenario>: N duplicates`).
//!
//! Every restarted relay waits up to a minute for the record
//! (`OUTBOXD_PROGRESS_READ_WAIT_MS=60000`), and the tests check that it read it
//! (`outboxd_progress_record_unread_total` is 0): a relay that did not read the record
//! skips nothing, and the test would prove nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use pgtest::{ClusterOptions, PgCluster, StopMode, TestDb};
use support::broker::Broker;
use support::consume::{assigned_consumer, check_delivery, received, DeliveryReport, Received};
use support::load::{insert_events, Event};
use support::ops::{self, read_all_blocking, slot_row, wait_active_pid, wait_for};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};
use tokio_postgres::Client;

/// Settings of every relay here: records often, and a restart really reads the record.
const RELAY_ENV: [(&str, &str); 2] = [
    ("OUTBOXD_PROGRESS_INTERVAL_MS", "200"),
    ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
];

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Scenario 1: a cold copy of the data directory (slots kept) started as a primary of its
/// own on the same timeline, next to the original: both have one system identifier and
/// use the default slot, database and progress topic names on one Kafka; the copy's
/// relay publishes to `staging.` topics. The copy writes more WAL than the original. The
/// original's relay is killed, 300 events commit on the original, the copy's relay
/// records a position past the original's whole WAL, and the original's relay restarts:
/// all 300 must reach the original's topics.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_two_live_primaries_on_one_timeline() {
    let original = PgCluster::start(ClusterOptions::default()).expect("original");
    let db = original.fresh_database("proven_copy").await;
    let outbox = schema::setup(&db).await;
    let copy = tokio::task::block_in_place(|| original.live_copy()).expect("live copy");
    let oc = ops::connect(&original.conn_string(&db.name)).await;
    let cc = ops::connect(&copy.conn_string(&db.name)).await;
    assert_eq!(
        ops::current_timeline(&oc).await,
        1,
        "the original stays on timeline 1"
    );
    assert_eq!(
        ops::current_timeline(&cc).await,
        1,
        "the copy runs on the same timeline"
    );
    assert_eq!(
        ops::system_identifier(&oc).await,
        ops::system_identifier(&cc).await
    );
    two_primaries(
        "two live primaries, timeline 1",
        (&original, &oc),
        (&copy, &cc),
        &db,
        &outbox,
    )
    .await;
}

/// Scenario 2: as scenario 1, with both primaries promoted once: two point-in-time
/// restores of one cluster, each ending recovery on timeline 2 at a different point, so
/// both write timeline 2 with different histories.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_two_primaries_both_on_timeline_2() {
    let origin = PgCluster::start(ClusterOptions::default()).expect("origin");
    let db = origin.fresh_database("proven_tl2").await;
    let outbox = schema::setup(&db).await;
    let first = tokio::task::block_in_place(|| origin.restore_copy()).expect("first restore");
    let second = tokio::task::block_in_place(|| origin.restore_copy()).expect("second restore");
    tokio::task::block_in_place(|| origin.stop(StopMode::Immediate)).expect("stop origin");
    let fc = ops::connect(&first.conn_string(&db.name)).await;
    let sc = ops::connect(&second.conn_string(&db.name)).await;
    for c in [&fc, &sc] {
        ops::wait_out_of_recovery(c).await;
        assert_eq!(
            ops::current_timeline(c).await,
            2,
            "each restore ends recovery on timeline 2"
        );
    }
    assert_eq!(
        ops::system_identifier(&fc).await,
        ops::system_identifier(&sc).await
    );
    two_primaries(
        "two primaries, both on timeline 2",
        (&first, &fc),
        (&second, &sc),
        &db,
        &outbox,
    )
    .await;
}

/// The body of scenarios 1 and 2: `original` and `copy` are live primaries with one
/// system identifier and timeline, `db`'s database, table, publication and slot on both.
async fn two_primaries(
    scenario: &str,
    (original, oc): (&PgCluster, &Client),
    (copy, cc): (&PgCluster, &Client),
    db: &TestDb<'_>,
    outbox: &Outbox,
) {
    let broker = Broker::default_for_tests();
    let bootstrap = broker.bootstrap();
    let topics = ops::create_topics(&broker, outbox).await;
    let staging = format!("staging.{}", outbox.topic_prefix);
    let staging_topics = vec![format!("{staging}.order"), format!("{staging}.customer")];
    let staging_dead = format!("{staging}.dead-letter");
    broker
        .create_topics(&[&staging_topics[0], &staging_topics[1], &staging_dead], 4)
        .await;

    let original_port = original.port().to_string();
    let mut env = vec![("PGPORT", original_port.as_str())];
    env.extend(RELAY_ENV);
    let mut relay = Relay::start(Relay::env_for(db, outbox, &bootstrap, &env), &["run"]);
    wait_active_pid(oc, &outbox.slot, Duration::from_secs(120)).await;
    let before = insert_events(oc, &outbox.table, 50, 5, 5).await;
    read_all_blocking(&bootstrap, &topics, &before, Duration::from_secs(60));
    let before_end = ops::current_wal(oc).await;
    wait_slot_confirmed(oc, &outbox.slot, before_end).await;
    relay
        .wait_metric_at_least("outboxd_progress_recorded_lsn", before_end as f64)
        .await;
    relay.kill();

    // Committed while the original's relay is down.
    let down = insert_events(oc, &outbox.table, 300, 5, 5).await;
    let original_end = ops::current_wal(oc).await;

    // The copy writes more WAL than the original, then events of its own, committed
    // after the 300.
    cc.batch_execute("CREATE TABLE filler (n int, pad text)")
        .await
        .expect("filler table");
    while ops::current_wal(cc).await < original_end + (4 << 20) {
        cc.execute(
            "INSERT INTO filler SELECT g, repeat('x', 500) FROM generate_series(1, 5000) g",
            &[],
        )
        .await
        .expect("filler rows");
    }
    let staged = insert_events(cc, &outbox.table, 20, 5, 5).await;
    let copy_end = ops::current_wal(cc).await;
    let copy_port = copy.port().to_string();
    let staging_template = format!("{staging}.{{aggregate_type}}");
    let mut copy_env = vec![
        ("PGPORT", copy_port.as_str()),
        ("OUTBOXD_TOPIC", staging_template.as_str()),
        ("OUTBOXD_DEAD_LETTER_TOPIC", staging_dead.as_str()),
    ];
    copy_env.extend(RELAY_ENV);
    let mut copy_relay = Relay::start(Relay::env_for(db, outbox, &bootstrap, &copy_env), &["run"]);
    read_all_blocking(
        &bootstrap,
        &staging_topics,
        &staged,
        Duration::from_secs(60),
    );
    copy_relay
        .wait_metric_at_least("outboxd_progress_recorded_lsn", copy_end as f64)
        .await;
    copy_relay.signal("TERM");
    assert_eq!(
        copy_relay.wait_exit(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        copy_relay.log_text()
    );
    let key = ops::progress_key(oc, &db.name, &outbox.slot).await;
    let record = ops::latest_progress_record(&bootstrap, &key).expect("the copy's progress record");
    let recorded = record_lsn(&record);
    assert!(
        recorded > original_end,
        "setup: the copy's record ({recorded:X}) must lie past the original's WAL ({original_end:X}): {record}"
    );

    // What the on-call engineer sees first: `check` names the other copy and the fix.
    let (code, out) = run_to_end(&Relay::env_for(db, outbox, &bootstrap, &env), &["check"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  progress record:"))
        .unwrap_or_else(|| panic!("check does not report the copy's record (exit {code}):\n{out}"));
    assert!(
        code == 6
            && line.contains("past this server's WAL end")
            && line.contains("OUTBOXD_CLUSTER_NAME"),
        "check's report of the copy's record (exit {code}): {line}"
    );

    relay.restart();
    wait_active_pid(oc, &outbox.slot, Duration::from_secs(120)).await;
    wait_slot_confirmed(oc, &outbox.slot, original_end).await;
    let all = [before, down.clone()].concat();
    let report = expect_arrived(
        scenario,
        &relay,
        &bootstrap,
        &topics,
        &all,
        &down,
        "committed on the original while its relay was down",
    );
    assert_record_read(scenario, &relay);
    eprintln!(
        "proven_skip: {scenario}: {} duplicates (record of the copy at {recorded:X}, original's WAL up to {original_end:X}, {} skipped)",
        report.duplicates,
        relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0)
    );
}

/// What changes between the relay that died inside the transaction and the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// `OUTBOXD_HEARTBEAT_INTERVAL_MS` was set (so pgoutput sent logical messages), then
    /// unset.
    HeartbeatOff,
    /// `OUTBOXD_MESSAGE_PREFIX` was set, then unset.
    PrefixRemoved,
    /// The publication carried another table, then `ALTER PUBLICATION … DROP TABLE`.
    PublicationNarrowed,
    /// `OUTBOXD_PUBLICATION` named a publication with another table too, then one with
    /// the outbox table alone.
    PublicationSwitched,
}

/// Scenario 3a: partly acked transaction, restarted with the heartbeat turned off.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_partial_transaction_after_heartbeat_off() {
    partial_after_change(Change::HeartbeatOff, "partial transaction, heartbeat off").await;
}

/// Scenario 3b: partly acked transaction, restarted with the message prefix removed.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_partial_transaction_after_prefix_removed() {
    partial_after_change(Change::PrefixRemoved, "partial transaction, prefix removed").await;
}

/// Scenario 3c: partly acked transaction, restarted after the publication dropped the
/// other table. PostgreSQL decodes the replayed transaction with the catalog as it was
/// when it was written, so the other table's row is still sent and the counts agree: this
/// one passes on the relay of issue 18 too, and guards the behaviour (3d is the variant
/// that changes what the replay carries).
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_partial_transaction_after_publication_narrowed() {
    partial_after_change(
        Change::PublicationNarrowed,
        "partial transaction, publication narrowed",
    )
    .await;
}

/// Scenario 3d: partly acked transaction, restarted on a narrower publication (the
/// relay's `OUTBOXD_PUBLICATION` now names one without the other table). PostgreSQL
/// decodes with the catalog as it was when each change was written, so an `ALTER
/// PUBLICATION` after the transaction does not change what the replay sends (3c); a
/// different publication does. Its past is not the recorded one's, so outboxd first
/// refuses it, until `outboxd init --accept-publication-change`.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_partial_transaction_after_publication_switched() {
    partial_after_change(
        Change::PublicationSwitched,
        "partial transaction, narrower publication",
    )
    .await;
}

/// One transaction of 9 outbox events with a transactional logical message (another
/// application's prefix) and an insert into another published table among its leading
/// rows; its 6th event goes to a partition without a leader, so the relay acks the rows
/// before it and records them as the partly acked transaction's leading rows. The relay
/// is killed, the partition gets a leader, the configuration changes so that pgoutput no
/// longer sends the message or the other table's row, and the relay restarts: all 9 must
/// arrive.
async fn partial_after_change(change: Change, scenario: &str) {
    let name = match change {
        Change::HeartbeatOff => "proven_partial_hb",
        Change::PrefixRemoved => "proven_partial_prefix",
        Change::PublicationNarrowed => "proven_partial_pub",
        Change::PublicationSwitched => "proven_partial_pub_switch",
    };
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup(&db).await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE other_table (id bigint PRIMARY KEY, note text); \
             ALTER PUBLICATION \"{}\" ADD TABLE other_table",
            db.publication
        ))
        .await
        .expect("another published table");
    // Made before the transaction: the replay decodes with the catalog of its time.
    let narrow = format!("{}_narrow", db.publication);
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{narrow}\" FOR TABLE public.outbox WITH (publish = 'insert')"
        ))
        .await
        .expect("the narrower publication");
    // A three-node Kafka: the events' and the progress topics' only replicas on broker 1,
    // the stuck topic's on broker 3, which is down until the relay has been killed.
    let broker = Broker::kafka(3);
    let bootstrap = broker.bootstrap();
    let ok_topic = outbox.topic("order");
    let stuck_topic = outbox.topic("stuck");
    let dead = outbox.dead_letter_topic();
    broker
        .create_topics_on(&[&ok_topic, &dead], 4, 1, &[])
        .await;
    broker.create_progress_topic_on(1).await;
    broker.create_topics_on(&[&stuck_topic], 1, 3, &[]).await;
    let cluster = broker.kafka_cluster();
    cluster.kill(3).expect("the stuck topic's broker down");

    let mut first_env: Vec<(&str, &str)> = RELAY_ENV.to_vec();
    match change {
        Change::HeartbeatOff => first_env.push(("OUTBOXD_HEARTBEAT_INTERVAL_MS", "1000")),
        Change::PrefixRemoved => first_env.push(("OUTBOXD_MESSAGE_PREFIX", "outbox")),
        Change::PublicationNarrowed | Change::PublicationSwitched => {}
    }
    let mut relay = Relay::start(
        Relay::env_for(&db, &outbox, &bootstrap, &first_env),
        &["run"],
    );
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;

    let event = |n: usize, aggregate_type: &str, aggregate_id: &str| Event {
        id: uuid::Uuid::new_v4().to_string(),
        aggregate_type: aggregate_type.into(),
        aggregate_id: aggregate_id.into(),
        event_type: "Changed".into(),
        payload: format!("{{\"n\": {n}}}"),
    };
    let events: Vec<Event> = (1..=9)
        .map(|n| match n {
            6 => event(n, "stuck", "agg-stuck"),
            n => event(n, "order", &format!("agg-{}", n % 2)),
        })
        .collect();
    let insert = |e: &Event| {
        format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{}', '{}', '{}', '{}', '{}');",
            e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload
        )
    };
    // Rows in order: e1, message, e2, other_table, e3, e4, e5, e6 (stuck), e7, e8, e9.
    let mut sql = String::from("BEGIN;");
    sql.push_str(&insert(&events[0]));
    sql.push_str("SELECT pg_logical_emit_message(true, 'other-app', 'not an event');");
    sql.push_str(&insert(&events[1]));
    sql.push_str("INSERT INTO other_table VALUES (1, 'not an event');");
    for e in &events[2..] {
        sql.push_str(&insert(e));
    }
    sql.push_str("COMMIT;");
    client.batch_execute(&sql).await.expect("the transaction");
    let end = schema::current_wal_lsn(&db).await;
    // The five events before the stuck one are acked...
    read_all_blocking(
        &bootstrap,
        std::slice::from_ref(&ok_topic),
        &events[..5],
        Duration::from_secs(60),
    );
    // ...and a record written since names the transaction as partly acked. Version 1
    // records count every Insert and transactional Message pgoutput sent: e1 to e5, the
    // other table's row, and the message when pgoutput sent it (the heartbeat or a
    // prefix asks for messages). Later versions may count differently (published rows
    // only): then at least the five events.
    let messages_sent = matches!(change, Change::HeartbeatOff | Change::PrefixRemoved);
    let v1_leading = 6 + u64::from(messages_sent);
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    let record = wait_for(
        "a progress record naming the partly acked transaction",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            ops::latest_progress_record(&bootstrap, &key).filter(|r| {
                match (
                    r["partial_rows_acked"].as_u64(),
                    r["partial"]["rows"].as_u64(),
                ) {
                    (Some(rows), _) => rows == v1_leading,
                    // Five published rows acked: e1 to e5, whenever it was written.
                    (None, Some(rows)) => rows >= 5,
                    (None, None) => false,
                }
            })
        },
    )
    .await;
    relay.kill();
    drop(relay);
    eprintln!("proven_skip: {scenario}: killed with the record {record}");

    tokio::task::block_in_place(|| cluster.restart(&[3], 3))
        .expect("stuck partition's broker back");
    // Neither the heartbeat nor a prefix now: pgoutput sends no messages.
    let mut second_env: Vec<(&str, &str)> = RELAY_ENV.to_vec();
    if change == Change::PublicationSwitched {
        second_env.push(("OUTBOXD_PUBLICATION", &narrow));
    }
    if change == Change::PublicationNarrowed {
        client
            .batch_execute(&format!(
                "ALTER PUBLICATION \"{}\" DROP TABLE other_table",
                db.publication
            ))
            .await
            .expect("narrow the publication");
    }
    let second = Relay::env_for(&db, &outbox, &bootstrap, &second_env);
    if change == Change::PublicationSwitched {
        // Another publication than the one recorded: its past is unknown, so outboxd
        // stops (docs/operations.md, "The publication changed") until told it is meant.
        let mut refused = Relay::start(second.clone(), &["run"]);
        assert_eq!(
            refused.wait_exit(Duration::from_secs(60)).code(),
            Some(3),
            "{}",
            refused.log_text()
        );
        let (code, out) = run_to_end(&second, &["init", "--accept-publication-change"]);
        assert_eq!(code, 0, "{out}");
    }
    let relay = Relay::start(second, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    schema::wait_confirmed_at_least(&db, end, Duration::from_secs(120)).await;
    let topics = vec![ok_topic, stuck_topic];
    let report = expect_arrived(
        scenario,
        &relay,
        &bootstrap,
        &topics,
        &events,
        &events,
        "of the partly acked transaction",
    );
    assert_record_read(scenario, &relay);
    eprintln!(
        "proven_skip: {scenario}: {} duplicates ({} skipped)",
        report.duplicates,
        relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0)
    );
    drop(relay);
}

/// Issue 30 item 5: whoever may write the progress topic raises the partly acked
/// transaction's row count. One transaction of 20 events whose 11th goes to a partition
/// without a leader: the first 10 are acked and recorded as its leading rows. The relay
/// is killed, the test rewrites the record with `rows: 20`, the partition gets its
/// leader back and the relay restarts: the replayed rows' digest is not the recorded
/// one, so nothing is skipped on the count alone, and all 20 arrive.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_partial_count_raised_by_another_writer() {
    let scenario = "partial count raised";
    let db = PgCluster::shared()
        .fresh_database("proven_partial_forged")
        .await;
    let outbox = schema::setup(&db).await;
    let client = db.client().await;
    let broker = Broker::kafka(3);
    let bootstrap = broker.bootstrap();
    let ok_topic = outbox.topic("order");
    let stuck_topic = outbox.topic("stuck");
    let dead = outbox.dead_letter_topic();
    broker
        .create_topics_on(&[&ok_topic, &dead], 4, 1, &[])
        .await;
    broker.create_progress_topic_on(1).await;
    broker.create_topics_on(&[&stuck_topic], 1, 3, &[]).await;
    let cluster = broker.kafka_cluster();
    cluster.kill(3).expect("the stuck topic's broker down");

    let mut relay = Relay::start(
        Relay::env_for(&db, &outbox, &bootstrap, &RELAY_ENV),
        &["run"],
    );
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events: Vec<Event> = (1..=20)
        .map(|n| Event {
            id: uuid::Uuid::new_v4().to_string(),
            aggregate_type: if n == 11 { "stuck" } else { "order" }.into(),
            // Its own aggregate: order is per aggregate, and its topic is another one.
            aggregate_id: if n == 11 {
                "agg-stuck".into()
            } else {
                format!("agg-{}", n % 3)
            },
            event_type: "Changed".into(),
            payload: format!("{{\"n\": {n}}}"),
        })
        .collect();
    let mut sql = String::from("BEGIN;");
    for e in &events {
        sql.push_str(&format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{}', '{}', '{}', '{}', '{}');",
            e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload
        ));
    }
    sql.push_str("COMMIT;");
    client.batch_execute(&sql).await.expect("the transaction");
    let end = schema::current_wal_lsn(&db).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    let mut record = wait_for(
        "a progress record naming the first 10 rows acked",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            ops::latest_progress_record(&bootstrap, &key)
                .filter(|r| r["partial"]["rows"].as_u64() == Some(10))
        },
    )
    .await;
    relay.kill();
    drop(relay);

    // Another principal with write access to the topic raises the count.
    record["partial"]["rows"] = serde_json::json!(20);
    ops::write_progress_record(&bootstrap, &key, &record.to_string());
    let forged = ops::latest_progress_record(&bootstrap, &key).expect("the forged record");
    assert_eq!(forged["partial"]["rows"].as_u64(), Some(20), "{forged}");

    tokio::task::block_in_place(|| cluster.restart(&[3], 3))
        .expect("stuck partition's broker back");
    let relay = Relay::start(
        Relay::env_for(&db, &outbox, &bootstrap, &RELAY_ENV),
        &["run"],
    );
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    schema::wait_confirmed_at_least(&db, end, Duration::from_secs(120)).await;
    let report = expect_arrived(
        scenario,
        &relay,
        &bootstrap,
        &[ok_topic, stuck_topic],
        &events,
        &events,
        "of the transaction whose record was forged",
    );
    assert_record_read(scenario, &relay);
    let doubts = relay
        .metric_series("outboxd_replay_doubts_total{reason=\"partial_digest\"}")
        .unwrap_or(0.0);
    assert!(
        doubts >= 1.0,
        "the forged partial counted as a doubt: {doubts}"
    );
    eprintln!(
        "proven_skip: {scenario}: 0 lost, {} duplicates ({} skipped)",
        report.duplicates,
        relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0)
    );
    drop(relay);
}

/// Scenario 4: the primary's clock (the server process alone, through libfaketime) steps
/// forty minutes forward and back (less than the hour Kafka 4 accepts records stamped
/// ahead of its clock: see the next test for more). Events committed meanwhile are
/// stamped forty minutes ahead,
/// and the relay's record keeps that as its newest delivered commit. An older copy of
/// the cluster (taken before the step, slots kept) is then started as the primary on the
/// same timeline, and its new events, stamped with the corrected clock, reuse positions
/// below the record: every one must arrive.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_clock_stepped_forward_and_back() {
    let (clock, cluster) = FakeClock::cluster();
    let db = cluster.fresh_database("proven_clock").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let bootstrap = broker.bootstrap();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(&db, &outbox, &bootstrap, &RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let before = insert_events(&client, &outbox.table, 50, 5, 5).await;
    read_all_blocking(&bootstrap, &topics, &before, Duration::from_secs(60));
    drop(client);

    // The backup: a cold copy with its slot, stopped until the restore.
    let backup = tokio::task::block_in_place(|| cluster.live_copy()).expect("backup");
    tokio::task::block_in_place(|| backup.stop(StopMode::Fast)).expect("stop the backup");
    let client = ops::connect(&db.conn_string()).await;

    clock.set("+40m");
    wait_server_clock(&client, 2400.0).await;
    let ahead = insert_events(&client, &outbox.table, 50, 5, 5).await;
    clock.set("+0");
    wait_server_clock(&client, 0.0).await;
    // The corrected clock; enough WAL that the restored copy's new events lie below the
    // record.
    let corrected = insert_events(&client, &outbox.table, 2000, 20, 5).await;
    // What Kafka has of the original's history, in commit order.
    let delivered = [before, ahead, corrected].concat();
    read_all_blocking(&bootstrap, &topics, &delivered, Duration::from_secs(120));
    let original_end = ops::current_wal(&client).await;
    wait_slot_confirmed(&client, &outbox.slot, original_end).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    let record = wait_for(
        "the record past the original's WAL",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            ops::latest_progress_record(&bootstrap, &key).filter(|r| record_lsn(r) >= original_end)
        },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(
        relay.wait_exit(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        relay.log_text()
    );
    drop(client);
    eprintln!("proven_skip: clock: record before the restore {record}");
    tokio::task::block_in_place(|| cluster.stop(StopMode::Fast)).expect("stop the original");

    tokio::task::block_in_place(|| backup.start_again()).expect("start the backup");
    let bc = ops::connect(&backup.conn_string(&db.name)).await;
    assert_eq!(
        ops::current_timeline(&bc).await,
        1,
        "the backup runs on the same timeline"
    );
    let restored = insert_events(&bc, &outbox.table, 100, 5, 5).await;
    let restored_end = ops::current_wal(&bc).await;
    let recorded = record_lsn(&record);
    assert!(
        restored_end < recorded,
        "setup: the restored events (up to {restored_end:X}) must reuse positions below the record ({recorded:X})"
    );
    let mut backup_env = env;
    backup_env.retain(|(k, _)| k != "PGPORT");
    backup_env.push(("PGPORT".into(), backup.port().to_string()));
    let relay = Relay::start(backup_env, &["run"]);
    wait_active_pid(&bc, &outbox.slot, Duration::from_secs(120)).await;
    wait_slot_confirmed(&bc, &outbox.slot, restored_end).await;
    // The original's branch after the backup is in Kafka (it was delivered), not in the
    // restored history: a consumer sees it first, then the restored copy's events.
    let committed = [delivered, restored.clone()].concat();
    let report = expect_arrived(
        "clock stepped forward and back",
        &relay,
        &bootstrap,
        &topics,
        &committed,
        &restored,
        "committed on the restored copy",
    );
    assert_record_read("clock stepped forward and back", &relay);
    eprintln!(
        "proven_skip: clock stepped forward and back: {} duplicates ({} skipped)",
        report.duplicates,
        relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0)
    );
    drop(relay);
}

/// Scenario 5: an older backup (a cold copy with its slot, taken at T1) restored as the
/// primary on the same timeline after the original relayed well past T1's WAL and was
/// stopped for good. New events commit on it, the operator runs `outboxd init
/// --replace-progress-record` (it replaces a stale record of the same cluster), then
/// `outboxd run`: every event committed on the restored copy reaches Kafka.
#[tokio::test(flavor = "multi_thread")]
async fn proven_skip_same_timeline_restore_of_an_older_backup() {
    let scenario = "same-timeline restore of an older backup";
    let cluster = PgCluster::start(ClusterOptions::default()).expect("original");
    let db = cluster.fresh_database("proven_restore").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let bootstrap = broker.bootstrap();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(&db, &outbox, &bootstrap, &RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let before = insert_events(&client, &outbox.table, 50, 5, 5).await;
    read_all_blocking(&bootstrap, &topics, &before, Duration::from_secs(60));
    drop(client);

    let backup = tokio::task::block_in_place(|| cluster.live_copy()).expect("backup at T1");
    tokio::task::block_in_place(|| backup.stop(StopMode::Fast)).expect("stop the backup");
    let client = ops::connect(&db.conn_string()).await;
    let later = insert_events(&client, &outbox.table, 2000, 20, 5).await;
    read_all_blocking(
        &bootstrap,
        &topics,
        &[before.clone(), later.clone()].concat(),
        Duration::from_secs(120),
    );
    let original_end = ops::current_wal(&client).await;
    wait_slot_confirmed(&client, &outbox.slot, original_end).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    wait_for(
        "the record past the original's WAL",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            ops::latest_progress_record(&bootstrap, &key).filter(|r| record_lsn(r) >= original_end)
        },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(
        relay.wait_exit(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        relay.log_text()
    );
    drop(client);
    tokio::task::block_in_place(|| cluster.stop(StopMode::Fast)).expect("stop the original");

    tokio::task::block_in_place(|| backup.start_again()).expect("start the backup");
    let bc = ops::connect(&backup.conn_string(&db.name)).await;
    assert_eq!(
        ops::current_timeline(&bc).await,
        1,
        "the backup runs on the same timeline"
    );
    let restored_first = insert_events(&bc, &outbox.table, 100, 5, 5).await;
    let backup_port = backup.port().to_string();
    let mut backup_env = env;
    backup_env.retain(|(k, _)| k != "PGPORT");
    backup_env.push(("PGPORT".into(), backup_port));

    let (code, out) = run_to_end(&backup_env, &["init", "--replace-progress-record"]);
    assert_eq!(
        code, 0,
        "outboxd init --replace-progress-record failed (exit {code}):\n{out}"
    );
    let backup_wal = ops::current_wal(&bc).await;
    // Replaced by a record of what this server has, or deleted.
    if let Some(after_init) = ops::latest_progress_record(&bootstrap, &key) {
        assert!(
            record_lsn(&after_init) <= backup_wal,
            "outboxd init --replace-progress-record left the stale record in place: it still says \
             delivered up to {:X}, past the restored server's WAL end {backup_wal:X} (the flag is \
             unknown to this binary, or was ignored); record {after_init}; init said:\n{out}",
            record_lsn(&after_init)
        );
    }

    let relay = Relay::start(backup_env, &["run"]);
    wait_active_pid(&bc, &outbox.slot, Duration::from_secs(120)).await;
    let restored_second = insert_events(&bc, &outbox.table, 100, 5, 5).await;
    let restored_end = ops::current_wal(&bc).await;
    wait_slot_confirmed(&bc, &outbox.slot, restored_end).await;
    let restored = [restored_first, restored_second].concat();
    let committed = [before, later, restored.clone()].concat();
    let report = expect_arrived(
        scenario,
        &relay,
        &bootstrap,
        &topics,
        &committed,
        &restored,
        "committed on the restored copy",
    );
    assert_record_read(scenario, &relay);
    eprintln!(
        "proven_skip: {scenario}: {} duplicates ({} skipped)",
        report.duplicates,
        relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0)
    );
    drop(relay);
}

/// Reads `topics` until every event of `committed` arrived (by id), then 2 s more for
/// trailing replays, and checks the delivery (each arrived, per aggregate in commit
/// order). Gives up 60 s after the last new record and fails naming how many of
/// `at_risk` (the events the scenario is about) and of the others are missing.
fn expect_arrived(
    scenario: &str,
    relay: &Relay,
    bootstrap: &str,
    topics: &[String],
    committed: &[Event],
    at_risk: &[Event],
    what: &str,
) -> DeliveryReport {
    // Read first: the callers wait until the relay confirmed past the events, so the
    // count is final, and a failure names it.
    let skipped = relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0);
    let what = format!("{what} (the restarted relay skipped {skipped} events as delivered)");
    let received = tokio::task::block_in_place(|| {
        read_until_all(scenario, bootstrap, topics, committed, at_risk, &what)
    });
    check_delivery(committed, &received)
}

fn read_until_all(
    scenario: &str,
    bootstrap: &str,
    topics: &[String],
    committed: &[Event],
    at_risk: &[Event],
    what: &str,
) -> Vec<Received> {
    let idle_limit = Duration::from_secs(60);
    let consumer = assigned_consumer(bootstrap, topics);
    let mut missing: HashSet<&str> = committed.iter().map(|e| e.id.as_str()).collect();
    let mut out = Vec::new();
    let mut last_new = Instant::now();
    let mut complete_at: Option<Instant> = None;
    loop {
        if missing.is_empty() && complete_at.is_none() {
            complete_at = Some(Instant::now());
        }
        if complete_at.is_some_and(|t| t.elapsed() >= Duration::from_secs(2)) {
            return out;
        }
        if last_new.elapsed() >= idle_limit {
            let risk_missing: Vec<&str> = at_risk
                .iter()
                .map(|e| e.id.as_str())
                .filter(|id| missing.contains(id))
                .collect();
            let other_missing = missing.len() - risk_missing.len();
            panic!(
                "proven_skip: {scenario}: {} of {} events {what} never arrived \
                 ({other_missing} of the other {} committed events missing too; {} records read; first missing: {:?})",
                risk_missing.len(),
                at_risk.len(),
                committed.len() - at_risk.len(),
                out.len(),
                risk_missing.first()
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let r = received(&m);
                if let Some(id) = r.header("id") {
                    missing.remove(id);
                }
                out.push(r);
                last_new = Instant::now();
            }
            Some(Err(e)) if support::consume::transient(&e) => {}
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
}

/// The restarted relay read the progress record (else it skipped nothing by design, and
/// the test proved nothing).
fn assert_record_read(scenario: &str, relay: &Relay) {
    let unread = relay
        .metric("outboxd_progress_record_unread_total")
        .expect("outboxd_progress_record_unread_total exported");
    assert_eq!(
        unread, 0.0,
        "proven_skip: {scenario}: the restarted relay never read the progress record"
    );
}

/// Waits (2 min at most) until the slot's confirmed position reaches `lsn`.
async fn wait_slot_confirmed(client: &Client, slot: &str, lsn: u64) {
    wait_for(
        &format!("slot {slot} confirmed at {lsn:X}"),
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            slot_row(client, slot)
                .await
                .and_then(|r| r.confirmed_flush)
                .filter(|c| *c >= lsn)
        },
    )
    .await;
}

/// A primary whose clock runs two hours ahead of the broker's: Apache Kafka 4 refuses
/// records stamped more than an hour ahead (`message.timestamp.after.max.ms`), and outboxd
/// stamps each record with its commit time. outboxd stops (exit 5) with an error naming
/// the clock and that topic setting; followed literally (the setting raised on the
/// topics), a restart publishes every event: nothing was confirmed past them.
#[tokio::test(flavor = "multi_thread")]
async fn a_primary_clock_hours_ahead_stops_naming_the_fix_and_loses_nothing() {
    let (clock, cluster) = FakeClock::cluster();
    let db = cluster.fresh_database("clock_ahead").await;
    let outbox = schema::setup(&db).await;
    // A Kafka of its own, with Kafka 4's limit set explicitly (a user's broker from
    // OUTBOXD_TEST_BOOTSTRAP_SERVERS may have none).
    let broker = Broker::kafka(1);
    let bootstrap = broker.bootstrap();
    let topics = ops::create_topics(&broker, &outbox).await;
    for t in topics
        .iter()
        .chain(std::iter::once(&outbox.dead_letter_topic()))
    {
        broker
            .set_topic_config(t, "message.timestamp.after.max.ms", "3600000")
            .await;
    }
    let client = db.client().await;
    clock.set("+2h");
    wait_server_clock(&client, 7200.0).await;
    let events = insert_events(&client, &outbox.table, 20, 4, 5).await;
    let env = Relay::env_for(&db, &outbox, &bootstrap, &RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let status = relay.wait_exit(Duration::from_secs(120));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(5), "{log}");
    assert!(
        log.contains("message.timestamp.after.max.ms") && log.contains("clock"),
        "the error names neither the clock nor the topic setting:\n{log}"
    );
    // Followed literally: every outboxd topic (events and dead letters).
    for t in topics
        .iter()
        .chain(std::iter::once(&outbox.dead_letter_topic()))
    {
        broker
            .set_topic_config(t, "message.timestamp.after.max.ms", "86400000")
            .await;
    }
    let relay = Relay::start(env, &["run"]);
    let received = read_all_blocking(&bootstrap, &topics, &events, Duration::from_secs(120));
    check_delivery(&events, &received);
    drop(relay);
}

/// The progress record's key: `system_id/database/slot`.
fn record_lsn(record: &serde_json::Value) -> u64 {
    schema::parse_lsn(record["confirmed_lsn"].as_str().expect("confirmed_lsn"))
}

/// The server's clock offset, read by libfaketime on every call from a file.
struct FakeClock {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

impl FakeClock {
    /// A fresh PostgreSQL cluster whose server processes read their clock from a new
    /// fake clock.
    fn cluster() -> (FakeClock, PgCluster) {
        assert!(
            std::path::Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} missing: apt-get install -y faketime"
        );
        let clock = FakeClock::new();
        let cluster = PgCluster::start_with_server_env(ClusterOptions::default(), clock.env())
            .expect("cluster with a fake clock");
        (clock, cluster)
    }

    fn new() -> FakeClock {
        use std::os::unix::fs::PermissionsExt;
        static CLOCKS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CLOCKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("outboxd-fakeclock-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("clock dir");
        // The server runs as another user: it must read the file.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let clock = FakeClock {
            file: dir.join("offset"),
            dir,
        };
        clock.set("+0");
        clock
    }

    /// libfaketime's relative form, e.g. `+2h`, `+0`.
    fn set(&self, offset: &str) {
        use std::os::unix::fs::PermissionsExt;
        let tmp = self.dir.join("offset.new");
        std::fs::write(&tmp, format!("{offset}\n")).expect("clock file");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::rename(&tmp, &self.file).expect("clock file");
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), LIBFAKETIME.into()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file.to_string_lossy().into_owned(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            // Only the wall clock moves: timeouts and latches keep a sane monotonic clock.
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the server's `clock_timestamp()` is `ahead_secs` ahead of ours (±10 min).
async fn wait_server_clock(client: &Client, ahead_secs: f64) {
    wait_for(
        &format!("the server clock {ahead_secs} s ahead"),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let row = client
                .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
                .await
                .ok()?;
            let server: f64 = row.get(0);
            let ours = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs_f64();
            ((server - ours - ahead_secs).abs() < 600.0).then_some(())
        },
    )
    .await;
}
