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
use support::scenario::Scenario;
use support::schema::{self, Outbox};
use tokio_postgres::Client;

mod partial;

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
    let s = Scenario::on(&cluster, "proven_clock").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let env = s.env(&RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let before = insert_events(&client, &outbox.table, 50, 5, 5).await;
    read_all_blocking(bootstrap, topics, &before, Duration::from_secs(60));
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
    read_all_blocking(bootstrap, topics, &delivered, Duration::from_secs(120));
    let original_end = ops::current_wal(&client).await;
    wait_slot_confirmed(&client, &outbox.slot, original_end).await;
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    let record = wait_for(
        "the record past the original's WAL",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            ops::latest_progress_record(bootstrap, &key).filter(|r| record_lsn(r) >= original_end)
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
        bootstrap,
        topics,
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
    let s = Scenario::on(&cluster, "proven_restore").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let env = s.env(&RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let before = insert_events(&client, &outbox.table, 50, 5, 5).await;
    read_all_blocking(bootstrap, topics, &before, Duration::from_secs(60));
    drop(client);

    let backup = tokio::task::block_in_place(|| cluster.live_copy()).expect("backup at T1");
    tokio::task::block_in_place(|| backup.stop(StopMode::Fast)).expect("stop the backup");
    let client = ops::connect(&db.conn_string()).await;
    let later = insert_events(&client, &outbox.table, 2000, 20, 5).await;
    read_all_blocking(
        bootstrap,
        topics,
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
            ops::latest_progress_record(bootstrap, &key).filter(|r| record_lsn(r) >= original_end)
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
    if let Some(after_init) = ops::latest_progress_record(bootstrap, &key) {
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
        bootstrap,
        topics,
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
    // A Kafka of its own, with Kafka 4's limit set explicitly (a user's broker from
    // OUTBOXD_TEST_BOOTSTRAP_SERVERS may have none).
    let s = Scenario::on(&cluster, "clock_ahead")
        .broker(Broker::kafka(1))
        .partitions(4)
        .await;
    let (db, outbox, topics, bootstrap, broker) = s.parts();
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
    let first = insert_events(&client, &outbox.table, 20, 4, 5).await;
    // Writes go on while the relay meets the refusal: its next sends find the producer
    // stopped (the gap-less guarantee), and the error must still be the broker's.
    let load = ops::LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        ops::LoadShape::default(),
    );
    let env = s.env(&RELAY_ENV);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let status = relay.wait_exit(Duration::from_secs(120));
    let events = [first, load.stop().await].concat();
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
    let received = read_all_blocking(bootstrap, topics, &events, Duration::from_secs(120));
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
