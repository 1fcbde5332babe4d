//! Streaming, resume after a reported flush, and the slot-in-use error.

use std::time::Duration;

use pgoutput::Lsn;
use pgrepl::{
    preflight, ErrorClass, ReplError, ReplicationConnection, ReplicationEvent, StartOptions,
};
use pgtest::PgCluster;

use crate::common::{
    check_txn, config, create_table_and_publication, insert_txn, lsn_ok, read_until_commits,
    split_txns,
};

const T1: &[(i64, &str)] = &[(1, "one")];
const T2: &[(i64, &str)] = &[(2, "two"), (3, "three")];
const T3: &[(i64, &str)] = &[(4, "four")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_transactions_then_resumes_after_reported_flush() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("pgrepl_stream").await;
    let client = create_table_and_publication(&db).await;
    let cfg = config(cluster, &db.name);

    let mut repl = ReplicationConnection::connect(&cfg).await.expect("connect");
    let system = repl.identify_system().await.expect("identify_system");
    assert_eq!(system.dbname.as_deref(), Some(db.name.as_str()));
    assert!(lsn_ok(system.xlog_pos));
    assert!(repl.server_version_num().await.expect("version") >= 100_000);
    let created = repl
        .create_logical_slot(&db.slot, false)
        .await
        .expect("create slot");
    assert_eq!(created.slot_name, db.slot);

    insert_txn(&client, T1).await;
    insert_txn(&client, T2).await;
    insert_txn(&client, T3).await;

    let mut opts = StartOptions::new(&db.slot, &db.publication);
    opts.initial_flush = created.consistent_point;
    let mut stream = repl.start_replication(opts).await.expect("start");
    let txns = split_txns(read_until_commits(&mut stream, 3).await);
    assert_eq!(txns.len(), 3);
    let c1 = check_txn(&txns[0], true, T1);
    let c2 = check_txn(&txns[1], false, T2);
    let c3 = check_txn(&txns[2], false, T3);
    assert!(c1.end_lsn <= c2.commit_lsn && c2.end_lsn <= c3.commit_lsn);
    assert!(c1.commit_lsn >= created.consistent_point);
    assert!(stream.server_wal_end() >= c3.end_lsn);

    // Report transaction 2 as durable, then stop cleanly.
    let flush = stream.flush_handle();
    flush.advance(c2.end_lsn);
    flush.advance(c1.end_lsn); // ignored: never backwards
    assert_eq!(flush.get(), c2.end_lsn);
    stream.send_status_now().await.expect("status");
    stream.stop().await.expect("stop");

    let state = preflight::slot_state(&client, &db.slot)
        .await
        .expect("slot state")
        .expect("slot exists");
    assert_eq!(state.confirmed_flush_lsn, Some(c2.end_lsn));
    assert_eq!(state.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(state.slot_type, "logical");

    // A new session from 0/0 resumes at confirmed_flush: only transaction 3.
    let repl = ReplicationConnection::connect(&cfg)
        .await
        .expect("reconnect");
    let mut opts = StartOptions::new(&db.slot, &db.publication);
    opts.initial_flush = c2.end_lsn;
    let mut stream = repl.start_replication(opts).await.expect("restart");
    let txns = split_txns(read_until_commits(&mut stream, 1).await);
    assert_eq!(check_txn(&txns[0], true, T3), c3);
    // Nothing else follows.
    let quiet = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match stream.next().await {
                Ok(Some(ReplicationEvent::Keepalive { .. })) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(
        quiet.is_err(),
        "unexpected data after transaction 3: {quiet:?}"
    );
    stream.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_consumer_gets_slot_in_use() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("pgrepl_busy").await;
    let client = create_table_and_publication(&db).await;
    let cfg = config(cluster, &db.name);

    let mut repl = ReplicationConnection::connect(&cfg).await.expect("connect");
    repl.create_logical_slot(&db.slot, false)
        .await
        .expect("create slot");
    let mut first = repl
        .start_replication(StartOptions::new(&db.slot, &db.publication))
        .await
        .expect("start");
    insert_txn(&client, T1).await;
    read_until_commits(&mut first, 1).await;

    let second = ReplicationConnection::connect(&cfg)
        .await
        .expect("connect 2");
    let err = second
        .start_replication(StartOptions::new(&db.slot, &db.publication))
        .await
        .expect_err("slot is active");
    let state = preflight::slot_state(&client, &db.slot)
        .await
        .expect("slot state")
        .expect("slot exists");
    assert!(state.active);
    match &err {
        ReplError::SlotInUse { slot, pid } => {
            assert_eq!(slot, &db.slot);
            assert_eq!(Some(*pid), state.active_pid);
        }
        other => panic!("expected SlotInUse, got {other}"),
    }
    assert_eq!(err.class(), ErrorClass::Retryable);
    assert_eq!(err.sqlstate(), Some("55006"));
    first.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_slot_is_permanent_and_preflight_reads_catalog() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("pgrepl_missing").await;
    let client = create_table_and_publication(&db).await;
    let cfg = config(cluster, &db.name);

    assert_eq!(
        preflight::wal_level(&client).await.expect("wal_level"),
        "logical"
    );
    assert!(
        preflight::max_replication_slots(&client)
            .await
            .expect("slots")
            > 0
    );
    assert!(preflight::role_can_replicate(&client, "postgres")
        .await
        .expect("role"));
    assert!(!preflight::role_can_replicate(&client, "nobody_here")
        .await
        .expect("role"));
    assert!(preflight::publication_exists(&client, &db.publication)
        .await
        .expect("pub"));
    assert!(!preflight::publication_exists(&client, "nope")
        .await
        .expect("pub"));
    assert_eq!(
        preflight::publication_tables(&client, &db.publication)
            .await
            .expect("tables"),
        vec![("public".to_string(), "outbox".to_string())]
    );
    let columns = preflight::table_columns(&client, "public", "outbox")
        .await
        .expect("columns")
        .expect("table exists");
    assert_eq!(columns[0], ("id".into(), "bigint".into(), 20));
    assert_eq!(columns[1], ("payload".into(), "text".into(), 25));
    assert!(preflight::table_columns(&client, "public", "nope")
        .await
        .expect("columns")
        .is_none());
    assert!(preflight::slot_state(&client, &db.slot)
        .await
        .expect("slot")
        .is_none());
    assert!(preflight::current_wal_lsn(&client).await.expect("lsn") > Lsn::ZERO);

    let sql = cfg.connect_sql().await.expect("connect_sql");
    let one: i32 = sql.query_one("SELECT 1", &[]).await.expect("query").get(0);
    assert_eq!(one, 1);

    let mut repl = ReplicationConnection::connect(&cfg).await.expect("connect");
    let timeout = repl.show("wal_sender_timeout").await.expect("show");
    assert!(!timeout.is_empty());
    let err = repl
        .start_replication(StartOptions::new(&db.slot, &db.publication))
        .await
        .expect_err("no such slot");
    assert_eq!(err.sqlstate(), Some("42704"), "{err}");
    assert_eq!(err.class(), ErrorClass::Permanent);
    assert!(err.to_string().contains("42704"), "{err}");

    // The same over the Unix socket.
    let mut unix = cfg.clone();
    unix.host = cluster.socket_dir().display().to_string();
    let mut repl = ReplicationConnection::connect(&unix)
        .await
        .expect("unix connect");
    let system = repl.identify_system().await.expect("identify_system");
    assert_eq!(system.dbname.as_deref(), Some(db.name.as_str()));
}
