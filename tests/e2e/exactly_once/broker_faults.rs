//! Exactly-once through broker faults: a partition leader or the transaction coordinator
//! killed, the only broker hung across a commit.

use std::time::Duration;

use pgtest::PgCluster;

use super::{assert_exactly_once, finish_load, EXACTLY_ONCE};
use crate::support;
use support::broker::Broker;
use support::ops::{LoadGen, LoadShape};
use support::scenario::Scenario;

/// Three brokers, RF 3, min ISR 2: the leader of an event partition killed (kill -9)
/// mid-stream under exactly-once, then back. Every event exactly once in read_committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_leader_killed_neither_loses_nor_duplicates() {
    let pg = PgCluster::start(pgtest::ClusterOptions {
        conf: vec!["wal_sender_timeout = '5s'".to_owned()],
        ..pgtest::ClusterOptions::default()
    })
    .expect("dedicated cluster");
    let s = Scenario::on(&pg, "eos_leader_killed")
        .broker(Broker::kafka(3))
        .replicated()
        .await;
    let (db, outbox, topics, bootstrap, broker) = s.parts();
    let cluster = broker.kafka_cluster();
    let mut relay = s.relay(&[EXACTLY_ONCE, ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "500")]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let load = LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        LoadShape {
            pause: Duration::from_millis(15),
            ..LoadShape::default()
        },
    );
    load.wait_committed(500, Duration::from_secs(60)).await;
    relay
        .wait_metric_at_least("outboxd_events_published_total", 200.0)
        .await;
    let leader = cluster.leader(&topics[0], 0).expect("leader");
    let published_at_kill = relay
        .metric("outboxd_events_published_total")
        .unwrap_or(0.0);
    cluster.kill(leader).expect("kill the leader");
    relay
        .wait_metric_at_least(
            "outboxd_events_published_total",
            published_at_kill + 1_000.0,
        )
        .await;
    tokio::task::block_in_place(|| cluster.restart(&[leader], 3)).expect("the broker rejoins");
    load.wait_committed(load.committed() + 300, Duration::from_secs(60))
        .await;
    let events = load.stop().await;
    assert_exactly_once(bootstrap, topics, &events, "leader killed");
    assert!(relay.is_running(), "relay exited:\n{}", relay.log_text());
    relay.kill();
}

/// The only broker hung (SIGSTOP) under load while a Kafka commit falls due: the relay's
/// commit (or the acks it waits for first) times out, its session ends, and it waits in
/// `init_transactions` for the broker; the hang lasts until the relay gave up on the
/// session, longer than `transaction.timeout.ms` (3 s), so the broker finds the open
/// transaction expired when it wakes. Every event exactly once. About one run in ten, the
/// woken broker is fenced by its controller for a moment and its coordinator aborts the
/// transaction without writing a single abort marker: the next session's first commit
/// would commit those records too (388 to 770 duplicates before outboxd checked the
/// partitions' last stable offsets; docs/transactional-mode.md, "A transaction Kafka left
/// open").
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_hung_across_a_commit_neither_loses_nor_duplicates() {
    let s = Scenario::new("eos_broker_hung")
        .broker(Broker::kafka(1))
        .partitions(4)
        .await;
    let (db, outbox, topics, bootstrap, broker) = s.parts();
    let mut relay = s.relay(&[
        EXACTLY_ONCE,
        ("OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS", "3000"),
        ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
    ]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let load = LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        LoadShape {
            pause: Duration::from_millis(15),
            ..LoadShape::default()
        },
    );
    load.wait_committed(300, Duration::from_secs(60)).await;
    relay
        .wait_metric_at_least("outboxd_events_published_total", 200.0)
        .await;
    let cluster = broker.kafka_cluster();
    let reconnects = relay.metric("outboxd_reconnects_total").unwrap_or(0.0);
    // Commits fall due every 100 ms under this load: one is in flight, or its acks are.
    cluster.set_paused(1, true).expect("SIGSTOP the broker");
    let at_hang = load.committed();
    // The session gives up only after transaction.timeout.ms without an answer.
    relay
        .wait_metric_at_least("outboxd_reconnects_total", reconnects + 1.0)
        .await;
    cluster.set_paused(1, false).expect("SIGCONT the broker");
    let events = finish_load(load, &mut relay, db, (300, Duration::from_secs(60))).await;
    assert_exactly_once(
        bootstrap,
        topics,
        &events,
        &format!(
            "broker hung ({} events, {} committed since the hang began)",
            events.len(),
            events.len() - at_hang
        ),
    );
    relay.kill();
}

/// Three brokers, RF 3, min ISR 2: the coordinator of the relay's transactional.id
/// (`outboxd/<progress record key>`) killed (kill -9) mid-stream, its partition of
/// `__transaction_state` taken over by another broker, then back. Every event exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn the_transaction_coordinator_killed_neither_loses_nor_duplicates() {
    let s = Scenario::new("eos_coordinator_killed")
        .broker(Broker::kafka(3))
        .replicated()
        .await;
    let (db, outbox, topics, bootstrap, broker) = s.parts();
    let cluster = broker.kafka_cluster();
    let mut relay = s.relay(&[
        EXACTLY_ONCE,
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "500"),
        ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
    ]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let key = support::ops::progress_key(&client, &db.name, &outbox.slot).await;
    let load = LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        LoadShape {
            pause: Duration::from_millis(15),
            ..LoadShape::default()
        },
    );
    load.wait_committed(500, Duration::from_secs(60)).await;
    // Published: init_transactions is done, so the id has its coordinator.
    relay
        .wait_metric_at_least("outboxd_events_published_total", 200.0)
        .await;
    let coordinator = cluster
        .transaction_coordinator(&format!("outboxd/{key}"))
        .expect("the transaction coordinator");
    let published_at_kill = relay
        .metric("outboxd_events_published_total")
        .unwrap_or(0.0);
    cluster.kill(coordinator).expect("kill the coordinator");
    relay
        .wait_metric_at_least(
            "outboxd_events_published_total",
            published_at_kill + 1_000.0,
        )
        .await;
    let moved_to = cluster
        .transaction_coordinator(&format!("outboxd/{key}"))
        .expect("a new coordinator");
    tokio::task::block_in_place(|| cluster.restart(&[coordinator], 3)).expect("the broker rejoins");
    let events = finish_load(load, &mut relay, db, (300, Duration::from_secs(60))).await;
    assert_exactly_once(
        bootstrap,
        topics,
        &events,
        &format!("coordinator {coordinator} killed (then {moved_to})"),
    );
    relay.kill();
}
