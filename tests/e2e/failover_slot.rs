//! Failover slots (PostgreSQL 17+): the slot outboxd creates, or finds, is a failover slot
//! unless told otherwise, so a standby with `sync_replication_slots` keeps a copy that
//! survives its promotion; `check` says what a failover still needs. On older servers the
//! flag is refused only when asked for explicitly.
//! Run on each version of the matrix (OUTBOXD_TEST_PG_VERSION, see scripts/test).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster};
use support::broker::Broker;
use support::ops::{slot_row, streaming_relay, wait_for};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};
use tokio_postgres::Client;

const FAILOVER_SLOTS: u32 = 17;

async fn failover_flag(client: &Client, slot: &str) -> Option<bool> {
    client
        .query_opt(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("pg_replication_slots")
        .map(|r| r.get(0))
}

/// Table and publication, no slot: what `outboxd init` starts from.
async fn without_slot(db: &pgtest::TestDb<'_>) -> Outbox {
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            schema::OUTBOX_DDL,
            db.publication
        ))
        .await
        .expect("schema");
    Outbox::for_db(db)
}

#[tokio::test(flavor = "multi_thread")]
async fn init_creates_a_failover_slot_when_the_server_has_them() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("failover_init").await;
    let outbox = without_slot(&db).await;
    let client = db.client().await;
    let broker = Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert!(slot_row(&client, &outbox.slot).await.is_some(), "{out}");
    let (code, check) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "warnings do not fail the check:\n{check}");
    if cluster.major_version() < FAILOVER_SLOTS {
        assert!(
            check.lines().any(|l| l.starts_with("ok    failover slot")),
            "{check}"
        );
        return;
    }
    assert_eq!(failover_flag(&client, &outbox.slot).await, Some(true));
    assert!(
        check
            .lines()
            .any(|l| l.starts_with("ok    failover slot") && l.contains("failover = true")),
        "{check}"
    );
    // No standby is named: a promotion could lack what outboxd already published.
    assert!(
        check
            .lines()
            .any(|l| l.starts_with("warn  synchronized_standby_slots")),
        "{check}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn false_creates_a_plain_slot_and_true_is_refused_before_17() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("failover_off").await;
    let outbox = without_slot(&db).await;
    let client = db.client().await;
    let broker = Broker::default_for_tests();
    if cluster.major_version() < FAILOVER_SLOTS {
        let env = Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_FAILOVER_SLOT", "true")],
        );
        let (code, out) = run_to_end(&env, &["init"]);
        assert_eq!(code, 3, "{out}");
        assert!(
            slot_row(&client, &outbox.slot).await.is_none(),
            "no slot is created when its failover flag cannot be honoured: {out}"
        );
        let (code, out) = run_to_end(&env, &["check"]);
        assert_eq!(code, 6, "{out}");
        assert!(
            out.lines().any(|l| l.starts_with("FAIL  failover slot")),
            "{out}"
        );
        return;
    }
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_FAILOVER_SLOT", "false")],
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(failover_flag(&client, &outbox.slot).await, Some(false));
}

/// A slot made by hand without FAILOVER is switched when the relay starts, and events
/// still flow through it.
#[tokio::test(flavor = "multi_thread")]
async fn run_switches_an_existing_slot_to_failover() {
    if PgCluster::shared().major_version() < FAILOVER_SLOTS {
        eprintln!("skipped: failover slots need PostgreSQL 17");
        return;
    }
    let s = streaming_relay("failover_switch", &[]).await;
    assert_eq!(failover_flag(&s.client, &s.outbox.slot).await, Some(true));
    s.relay_events(50).await;
    // No synchronized_standby_slots: not ready for a failover, and the metric says so.
    let ready = wait_for(
        "outboxd_slot_failover_ready",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { s.relay.metric("outboxd_slot_failover_ready") },
    )
    .await;
    assert_eq!(ready, 0.0);
}

/// `synchronized_standby_slots` naming a slot that does not exist makes the server hold
/// back every failover slot's changes: `check` fails naming it.
#[tokio::test(flavor = "multi_thread")]
async fn check_names_a_missing_standby_slot() {
    if PgCluster::shared().major_version() < FAILOVER_SLOTS {
        eprintln!("skipped: failover slots need PostgreSQL 17");
        return;
    }
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["synchronized_standby_slots = 'sb_missing'".into()],
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let db = cluster.fresh_database("failover_check").await;
    let outbox = without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL  synchronized_standby_slots") && l.contains("sb_missing")),
        "{out}"
    );
}
