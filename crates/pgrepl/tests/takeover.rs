//! A takeover must never move the slot's `confirmed_flush_lsn` backwards. A standby that
//! read the slot's position over SQL, then waited while the active instance confirmed
//! more, holds a stale position when its START_REPLICATION finally succeeds; PostgreSQL
//! ≤ 16 takes any flush position a status update reports, lower ones included. So the
//! stream starts with `initial_flush = 0/0` (which the server ignores), and the caller
//! reads the real start position once the slot is its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use pgrepl::{preflight, ConnectConfig, Lsn, ReplicationConnection, SslMode, StartOptions};
use pgtest::PgCluster;

async fn confirmed(client: &tokio_postgres::Client, slot: &str) -> Lsn {
    preflight::slot_state(client, slot)
        .await
        .expect("slot state")
        .and_then(|s| s.confirmed_flush_lsn)
        .expect("slot with a confirmed_flush_lsn")
}

#[tokio::test(flavor = "multi_thread")]
async fn takeover_after_the_slot_advanced_never_lowers_confirmed_flush() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("pgrepl_takeover").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id int); CREATE PUBLICATION \"{}\" FOR TABLE t",
            db.publication
        ))
        .await
        .expect("table and publication");
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&db.slot],
        )
        .await
        .expect("slot");

    // The standby's view before its START_REPLICATION...
    let stale = confirmed(&client, &db.slot).await;
    // ...while the active instance relays and confirms more.
    client
        .batch_execute("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)")
        .await
        .expect("insert");
    client
        .query_one(
            "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())",
            &[&db.slot],
        )
        .await
        .expect("advance");
    let advanced = confirmed(&client, &db.slot).await;
    assert!(advanced > stale);

    let mut cfg = ConnectConfig::new(
        cluster.host(),
        cluster.port(),
        cluster.superuser(),
        db.name.clone(),
    );
    cfg.ssl_mode = SslMode::Disable;
    let conn = ReplicationConnection::connect(&cfg)
        .await
        .expect("replication connection");
    let mut opts = StartOptions::new(db.slot.clone(), db.publication.clone());
    // Nothing known yet: the server ignores a flush of 0/0.
    opts.initial_flush = Lsn::ZERO;
    opts.status_interval = Some(Duration::from_millis(50));
    let stream = conn.start_replication(opts).await.expect("start");

    // Status updates flow (the writer sends one right at start, then every 50 ms).
    stream.send_status_now().await.expect("status");
    // Waited for rather than counted after a fixed 300 ms: a loaded machine may run the
    // writer late, and what matters is that updates flow, not how many fit in 300 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stream.status_updates_sent() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} status updates sent in 30 s",
            stream.status_updates_sent()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The slot is ours now: this is where the stream really starts.
    let start = confirmed(&client, &db.slot).await;
    assert_eq!(
        start, advanced,
        "confirmed_flush_lsn went from {advanced} to {start} at the takeover (the standby's stale view was {stale})"
    );
    // Reporting that position (as the relay does) keeps it, and a stale advance is ignored.
    let flush = stream.flush_handle();
    flush.advance(start);
    flush.advance(stale);
    stream.send_status_now().await.expect("status");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(confirmed(&client, &db.slot).await, advanced);
    stream.stop().await.expect("stop");
    assert_eq!(confirmed(&client, &db.slot).await, advanced);
}
