//! A consumer that stops reading must not let the walsender time out.

use std::time::Duration;

use pgrepl::{preflight, ReplicationConnection, StartOptions};
use pgtest::{ClusterOptions, PgCluster};

use crate::common::{
    check_txn, config, create_table_and_publication, insert_txn, read_until_commits, split_txns,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_consumer_survives_short_wal_sender_timeout() {
    paused_consumer_keeps_its_walsender(None).await;
}

/// An explicit interval longer than half of wal_sender_timeout is clamped, not obeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_status_interval_is_clamped_to_half_the_timeout() {
    paused_consumer_keeps_its_walsender(Some(Duration::from_secs(30))).await;
}

async fn paused_consumer_keeps_its_walsender(status_interval: Option<Duration>) {
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["wal_sender_timeout = '2s'".into()],
        ..ClusterOptions::default()
    })
    .expect("start cluster");
    let db = cluster.fresh_database("pgrepl_timeout").await;
    let client = create_table_and_publication(&db).await;
    let cfg = config(&cluster, &db.name);

    let mut repl = ReplicationConnection::connect(&cfg).await.expect("connect");
    assert_eq!(repl.show("wal_sender_timeout").await.expect("show"), "2s");
    repl.create_logical_slot(&db.slot, false)
        .await
        .expect("create slot");
    let mut options = StartOptions::new(&db.slot, &db.publication);
    options.status_interval = status_interval;
    let mut stream = repl.start_replication(options).await.expect("start");
    insert_txn(&client, &[(1, "before")]).await;
    read_until_commits(&mut stream, 1).await;
    let pid = preflight::slot_state(&client, &db.slot)
        .await
        .expect("slot")
        .expect("exists")
        .active_pid;
    assert!(pid.is_some());

    // Back-pressure: no next() for 10 s, five times wal_sender_timeout.
    tokio::time::sleep(Duration::from_secs(5)).await;
    insert_txn(&client, &[(2, "during")]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    let txns = split_txns(read_until_commits(&mut stream, 1).await);
    check_txn(&txns[0], false, &[(2, "during")]);
    let state = preflight::slot_state(&client, &db.slot)
        .await
        .expect("slot")
        .expect("exists");
    assert!(state.active);
    assert_eq!(state.active_pid, pid, "the walsender was replaced");
    stream.stop().await.expect("stop");
}
