//! Reconnect backoff: with Postgres down for a while, the relay's retries back off
//! exponentially (they do not hammer the server every few hundred milliseconds because an
//! earlier session once streamed), and it streams again on its own once Postgres is back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::{ClusterOptions, PgCluster, StopMode};
use support::ops;
use support::relay::Relay;
use support::scenario::Scenario;
use support::schema;

const OUTAGE: Duration = Duration::from_secs(30);

/// Postgres stopped for 30 s under a streaming relay with the default maximum backoff
/// (30 s): the delays grow 0.1-0.2 s, 0.2-0.4 s, ... so about 7-9 attempts fit, not
/// ~200 as when the backoff restarted from its base after every attempt.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_30s_backs_off_and_resumes() {
    let cluster = PgCluster::start(ClusterOptions::default()).expect("dedicated cluster");
    let s = Scenario::on(&cluster, "ops_reconnect").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let relay = s.relay(
        // The default (the test support sets 2 s for faster tests).
        &[("OUTBOXD_RECONNECT_MAX_BACKOFF_MS", "30000")],
    );
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let before = support::load::insert_events(&client, &outbox.table, 50, 5, 5).await;
    ops::read_all_blocking(bootstrap, topics, &before, Duration::from_secs(60));
    drop(client);

    let reconnects = |relay: &Relay| relay.metric("outboxd_reconnects_total").unwrap_or(0.0);
    let at_stop = reconnects(&relay);
    tokio::task::block_in_place(|| cluster.stop(StopMode::Fast)).expect("pg_ctl stop");
    let stopped = Instant::now();
    let mut curve = Vec::new();
    while stopped.elapsed() < OUTAGE {
        tokio::time::sleep(Duration::from_secs(5)).await;
        curve.push((stopped.elapsed().as_secs(), reconnects(&relay) - at_stop));
    }
    let during = reconnects(&relay) - at_stop;
    tokio::task::block_in_place(|| cluster.start_again()).expect("pg_ctl start");
    println!("reconnect attempts while Postgres was down {OUTAGE:?}: {during} ({curve:?})");
    assert!(
        during <= 10.0,
        "{during} reconnect attempts in {OUTAGE:?} with the default 30 s maximum backoff: {curve:?}"
    );

    // Back: events inserted now arrive (after at most one full backoff delay).
    let client = ops::connect(&db.conn_string()).await;
    let after = support::load::insert_events(&client, &outbox.table, 50, 5, 5).await;
    let wal_after = schema::current_wal_lsn(db).await;
    let all: Vec<_> = before.iter().chain(after.iter()).cloned().collect();
    let received = ops::read_all_blocking(bootstrap, topics, &all, Duration::from_secs(120));
    support::consume::check_delivery(&all, &received);
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(60)).await;
    drop(relay);
}
