//! With OUTBOXD_READY_STANDBY=true a standby waiting for the slot answers /readyz with
//! 200 (what the Kubernetes manifests rely on); by default it answers 503 saying it stands
//! by. The active replica is ready either way, and the standby takes over when it dies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking};
use support::relay::Relay;
use support::scenario::Scenario;

#[tokio::test(flavor = "multi_thread")]
async fn standby_answers_ready_only_when_opted_in() {
    let s = Scenario::new("standby_ready").partitions(4).await;
    let db = &s.db;
    // Each process its own HTTP port (env_for picks a free one per call).
    let env = |extra: &[(&str, &str)]| s.env(extra);
    let mut active = Relay::start(env(&[("OUTBOXD_READY_STANDBY", "true")]), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let ready_standby = Relay::start(env(&[("OUTBOXD_READY_STANDBY", "true")]), &["run"]);
    let plain_standby = Relay::start(env(&[]), &["run"]);
    let readyz = |r: &Relay| r.http_get("/readyz");
    ops::wait_for(
        "both standbys to stand by",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            (ready_standby.log_text().contains("standing by")
                && plain_standby.log_text().contains("standing by"))
            .then_some(())
        },
    )
    .await;
    // The slot is active from START_REPLICATION on; the active one is ready a moment
    // later (producer created, first broker probe answered).
    ops::wait_for(
        "the active instance to be ready",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (readyz(&active).map(|r| r.0) == Some(200)).then_some(()) },
    )
    .await;
    let (code, body) = readyz(&ready_standby).expect("readyz");
    assert_eq!(code, 200, "{body}");
    let (code, body) = readyz(&plain_standby).expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("standing by"), "{body}");
    // Both standbys report not streaming, which is what the alert rules count.
    for r in [&ready_standby, &plain_standby] {
        assert_eq!(r.metric("outboxd_replication_connected"), Some(0.0));
    }

    // The active one dies: a standby takes the slot and is ready as the active one.
    active.kill();
    ops::wait_for(
        "a standby to take over and answer ready as streaming",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            [&ready_standby, &plain_standby]
                .into_iter()
                .any(|r| r.metric("outboxd_replication_connected") == Some(1.0))
                .then_some(())
        },
    )
    .await;
    let streaming = [&ready_standby, &plain_standby]
        .into_iter()
        .find(|r| r.metric("outboxd_replication_connected") == Some(1.0))
        .unwrap();
    assert_eq!(readyz(streaming).map(|r| r.0), Some(200));
}

/// A standby watches the slot over one connection instead of opening new backends on the
/// primary every second, says so in `outboxd_standby`, and takes over when the active
/// instance dies.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_waits_over_one_connection_and_says_so() {
    let s = Scenario::new("standby_conn").partitions(4).await;
    let db = &s.db;
    // Each process its own HTTP port (env_for picks a free one per call).
    let env = |extra: &[(&str, &str)]| s.env(extra);
    let mut active = Relay::start(env(&[]), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let standby = Relay::start(env(&[("PGAPPNAME", "outboxd-standby")]), &["run"]);
    ops::wait_for(
        "outboxd_standby = 1",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (standby.metric("outboxd_standby") == Some(1.0)).then_some(()) },
    )
    .await;
    assert_eq!(active.metric("outboxd_standby"), Some(0.0));
    assert_eq!(standby.metric("outboxd_replication_connected"), Some(0.0));

    // Over 10 s: the sessions the database counts, and the standby's backends seen.
    // Session counts reach the shared statistics late on a loaded server (a backend
    // flushes its pending statistics when idle, at most once a second, later under
    // contention): the standby's start-up sessions (just before it reported standing
    // by) are let in before the first count, or they would be taken for sessions opened
    // while standing by.
    let before = settled_sessions(&client, &db.name).await;
    let mut pids = std::collections::BTreeSet::new();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < until {
        for row in client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'outboxd-standby'",
                &[],
            )
            .await
            .unwrap()
        {
            pids.insert(row.get::<_, i32>(0));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened = settled_sessions(&client, &db.name).await - before;
    eprintln!(
        "standby over 10 s: {} backends seen, {opened} sessions opened on the database",
        pids.len()
    );
    assert!(pids.len() <= 2, "the standby's backends: {pids:?}");
    assert!(
        opened <= 2,
        "{opened} sessions opened in 10 s while standing by"
    );

    active.kill();
    ops::wait_for(
        "the standby to take over",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { (standby.metric("outboxd_replication_connected") == Some(1.0)).then_some(()) },
    )
    .await;
    assert_eq!(standby.metric("outboxd_standby"), Some(0.0));
}

/// The database's session count once it has not moved for 3 s (every backend that had
/// connected by then has flushed its statistics), within 60 s.
async fn settled_sessions(c: &tokio_postgres::Client, db: &str) -> i64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last = sessions(c, db).await;
    let mut since = std::time::Instant::now();
    while since.elapsed() < Duration::from_secs(3) {
        assert!(
            std::time::Instant::now() < deadline,
            "the session count did not settle in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = sessions(c, db).await;
        if now != last {
            last = now;
            since = std::time::Instant::now();
        }
    }
    last
}

async fn sessions(c: &tokio_postgres::Client, db: &str) -> i64 {
    c.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    c.query_one(
        "SELECT sessions FROM pg_stat_database WHERE datname = $1",
        &[&db],
    )
    .await
    .unwrap()
    .get::<_, i64>(0)
}

/// A standby that cannot reach Kafka does not take the slot when the active instance
/// dies: it would hold it, relaying nothing, while one that reaches Kafka waits. The
/// healthy instance started after it takes the slot and relays.
#[tokio::test(flavor = "multi_thread")]
async fn a_standby_that_cannot_reach_kafka_leaves_the_slot_to_one_that_can() {
    let s = Scenario::new("standby_no_kafka").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let env = |bootstrap: &str| Relay::env_for(db, outbox, bootstrap, &[]);
    let mut active = Relay::start(env(bootstrap), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    // A port that accepts connections and never answers (a hung broker, or a network
    // that drops this instance's traffic): no broker answers this one.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let unreachable = silent.local_addr().expect("address").to_string();
    let mut cut_off = Relay::start(env(&unreachable), &["run"]);
    ops::wait_for(
        "the cut-off instance to stand by",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (cut_off.metric("outboxd_standby") == Some(1.0)).then_some(()) },
    )
    .await;
    active.kill();
    // The cut-off standby looks every second: once the slot is free, give it three
    // looks to take it (the bug this test guards against), then start a healthy one. A
    // slow machine only makes the test weaker (the healthy one may come first), never
    // fail a correct relay.
    ops::wait_for(
        "the killed instance to release the slot",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            ops::slot_row(&client, &outbox.slot)
                .await
                .filter(|r| r.active_pid.is_none())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let healthy = Relay::start(env(bootstrap), &["run"]);
    ops::wait_for(
        "the healthy instance to take the slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (healthy.metric("outboxd_replication_connected") == Some(1.0)).then_some(()) },
    )
    .await;
    let events = insert_events(&client, &outbox.table, 10, 3, 3).await;
    check_delivery(
        &events,
        &read_all_blocking(bootstrap, topics, &events, Duration::from_secs(60)),
    );
    assert!(cut_off.is_running(), "{}", cut_off.log_text());
    assert_eq!(cut_off.metric("outboxd_replication_connected"), Some(0.0));
    drop(silent);
}
