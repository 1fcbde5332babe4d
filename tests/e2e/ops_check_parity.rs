//! `outboxd check` fails first on every condition `outboxd run` refuses: a slot of the
//! same name in another database, no walsender allowed (max_wal_senders = 0), a role that
//! cannot open a replication connection; and it reports WAL retention
//! (max_slot_wal_keep_size, the slot's safe_wal_size).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster};
use support::broker::Broker;
use support::relay::{run_to_end, Relay};
use support::schema;

fn line<'a>(out: &'a str, prefix: &str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{prefix}{what}")))
        .unwrap_or_else(|| panic!("no {prefix:?} line for {what}:\n{out}"))
}

fn fail_line<'a>(out: &'a str, what: &str) -> &'a str {
    line(out, "FAIL  ", what)
}

/// `run` to its exit, or a panic if it is still running after `limit` (retrying forever).
fn run_exit_code(env: Vec<(String, String)>, limit: Duration) -> (i32, String) {
    let mut relay = Relay::start(env, &["run"]);
    let status = relay.wait_exit(limit);
    (status.code().unwrap_or(-1), relay.log_text())
}

#[tokio::test(flavor = "multi_thread")]
async fn slot_of_the_same_name_in_another_database_fails_check_and_run() {
    let cluster = PgCluster::shared();
    let other = cluster.fresh_database("parity_other").await;
    let other_outbox = schema::setup(&other).await;
    let db = cluster.fresh_database("parity_db").await;
    let mut outbox = schema::setup(&db).await;
    // The slot name the other database's relay uses.
    outbox.slot = other_outbox.slot.clone();
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let slot = fail_line(&out, "slot");
    assert!(
        slot.contains(&other.name),
        "names the slot's database: {slot}"
    );
    assert!(slot.contains("OUTBOXD_SLOT"), "names the fix: {slot}");
    let (code, log) = run_exit_code(env, Duration::from_secs(30));
    assert_eq!(code, 3, "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_walsender_allowed_fails_check_and_run_exits_3() {
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["max_wal_senders = 0".into()],
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let db = cluster.fresh_database("parity_senders").await;
    let outbox = schema::setup_custom(&db, schema::OUTBOX_DDL, Some("publish = 'insert'")).await;
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let senders = fail_line(&out, "max_wal_senders");
    assert!(senders.contains("max_wal_senders"), "{senders}");
    assert!(senders.contains("restart"), "names the fix: {senders}");
    // Before: the replication connection was refused with 53300 and retried forever.
    let (code, log) = run_exit_code(env, Duration::from_secs(30));
    assert_eq!(code, 3, "{log}");
    assert!(log.contains("max_wal_senders"), "{log}");
}

/// The default max_slot_wal_keep_size (-1) is reported as a warning; a cap is reported
/// with the slot's safe_wal_size. On PostgreSQL 18+ idle_replication_slot_timeout too: its
/// default (0) is fine, a timeout is a warning naming the fix.
#[tokio::test(flavor = "multi_thread")]
async fn wal_retention_is_reported() {
    let shared = PgCluster::shared();
    let idle_timeout = shared.major_version() >= 18;
    let db = shared.fresh_database("parity_keep_default").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "a warning does not fail the check:\n{out}");
    let keep = line(&out, "warn  ", "max_slot_wal_keep_size");
    assert!(keep.contains("-1"), "{keep}");
    if idle_timeout {
        let idle = line(&out, "ok    ", "idle_replication_slot_timeout");
        assert!(idle.contains(": 0"), "{idle}");
    } else {
        assert!(!out.contains("idle_replication_slot_timeout"), "{out}");
    }

    let mut conf = vec!["max_slot_wal_keep_size = '64MB'".to_owned()];
    if idle_timeout {
        conf.push("idle_replication_slot_timeout = '1h'".into());
    }
    let cluster = PgCluster::start(ClusterOptions {
        conf,
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let db = cluster.fresh_database("parity_keep_cap").await;
    let outbox = schema::setup(&db).await;
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
    let keep = line(&out, "ok    ", "max_slot_wal_keep_size");
    assert!(keep.contains("64MB") || keep.contains("64 MB"), "{keep}");
    let slot = line(&out, "ok    ", "slot");
    assert!(slot.contains("safe_wal_size"), "{slot}");
    if idle_timeout {
        let idle = line(&out, "warn  ", "idle_replication_slot_timeout");
        assert!(idle.contains("1h00m"), "{idle}");
        assert!(
            idle.contains("idle_replication_slot_timeout = 0"),
            "names the fix: {idle}"
        );
    }
}

/// The REPLICATION attribute is not inherited, and providers grant replication in other
/// ways (RDS's rds_replication): what decides is whether the role can open a replication
/// connection, which check tries. The catalog attribute is only advisory.
#[tokio::test(flavor = "multi_thread")]
async fn replication_right_is_decided_by_a_real_replication_connection() {
    let db = PgCluster::shared().fresh_database("parity_repl").await;
    let outbox = schema::setup(&db).await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE parity_norepl LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             DO $$ BEGIN CREATE ROLE parity_repl LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT CONNECT ON DATABASE \"{}\" TO parity_norepl, parity_repl;",
            db.name
        ))
        .await
        .expect("roles");
    let broker = Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let base = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let as_role = |role: &str| {
        let mut env = base.clone();
        env.retain(|(k, _)| k != "PGUSER");
        env.push(("PGUSER".into(), role.into()));
        env
    };
    // A non-superuser with REPLICATION (what sql/role.sql creates): every check passes.
    let (code, out) = run_to_end(&as_role("parity_repl"), &["check"]);
    assert_eq!(code, 0, "{out}");
    line(&out, "ok    ", "replication connection");

    // Without it: the failure is the replication connection's, with the fix; the catalog
    // attribute alone is not a failure of its own.
    let (code, out) = run_to_end(&as_role("parity_norepl"), &["check"]);
    assert_eq!(code, 6, "{out}");
    let conn = fail_line(&out, "replication connection");
    assert!(
        conn.contains("ALTER ROLE parity_norepl WITH REPLICATION"),
        "names the fix: {conn}"
    );
    assert!(
        !out.lines()
            .any(|l| l.starts_with("FAIL  REPLICATION attribute")),
        "{out}"
    );
    assert!(out.contains("1 check(s) failed"), "{out}");
}
