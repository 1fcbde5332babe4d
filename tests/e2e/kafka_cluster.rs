//! What only a real Kafka cluster shows: brokers of a three-node KRaft cluster killed under
//! load, with every topic replicated three times and `min.insync.replicas=2` (the setup a
//! production cluster runs), and a single broker hung (SIGSTOP) rather than gone.
//!
//! Each test asserts through the topics (every committed event arrived, in per-aggregate
//! order after dedup by id), the slot (never confirmed past what Kafka has) and the
//! walsender (status updates keep it alive while Kafka cannot take writes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::{ClusterOptions, PgCluster};
use support::broker::Broker;
use support::ops::{self, LoadGen, LoadShape};
use support::relay::Relay;
use support::scenario::Scenario;
use support::schema::{self, Outbox};

fn dedicated() -> PgCluster {
    PgCluster::start(ClusterOptions {
        conf: vec!["wal_sender_timeout = '5s'".to_owned()],
        ..ClusterOptions::default()
    })
    .expect("dedicated cluster")
}

fn start_relay(db: &pgtest::TestDb<'_>, outbox: &Outbox, broker: &Broker) -> Relay {
    Relay::start(
        Relay::env_for(
            db,
            outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "500")],
        ),
        &["run"],
    )
}

/// Samples the slot every second for `window` of an outage that began when the server's
/// WAL was at `ceiling`: the same walsender throughout (status updates kept it alive,
/// wal_sender_timeout 5 s), and never confirmed past `ceiling` (nothing after it could be
/// acknowledged).
async fn watch_outage(
    pg: &PgCluster,
    client: &tokio_postgres::Client,
    slot: &str,
    pid: i32,
    ceiling: u64,
    window: Duration,
) {
    let start = Instant::now();
    let mut pids = Vec::new();
    while start.elapsed() < window {
        let row = ops::slot_row(client, slot).await.expect("slot");
        pids.push(row.active_pid);
        let confirmed = row.confirmed_flush.unwrap_or(0);
        assert!(
            confirmed <= ceiling,
            "the slot was confirmed at {confirmed:X}, past {ceiling:X}, though Kafka could acknowledge nothing after it"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        pids.iter().all(|p| *p == Some(pid)),
        "the walsender changed or went away during the outage: {pids:?}\nserver log:\n{}",
        pg.log()
    );
}

fn paced() -> LoadShape {
    LoadShape {
        pause: Duration::from_millis(15),
        ..LoadShape::default()
    }
}

/// The leader of an event partition killed (kill -9) mid-stream, RF 3, min ISR 2: leadership
/// moves, the idempotent producer's retried batches are accepted by the new leader (no
/// OutOfOrderSequence, nothing fatal), every event arrives in per-aggregate order, and the
/// killed broker rejoins.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_leader_killed_mid_stream_loses_nothing() {
    let started = Instant::now();
    let pg = dedicated();
    let s = Scenario::on(&pg, "kafka_leader_killed")
        .broker(Broker::kafka(3))
        .replicated()
        .await;
    let (db, outbox, topics, _, broker) = s.parts();
    let mut relay = start_relay(db, outbox, broker);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;

    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), paced());
    load.wait_committed(500, Duration::from_secs(60)).await;
    relay
        .wait_metric_at_least("outboxd_events_published_total", 200.0)
        .await;
    let cluster = broker.kafka_cluster();
    let leader = cluster.leader(&topics[0], 0).expect("leader");
    let published_at_kill = relay
        .metric("outboxd_events_published_total")
        .unwrap_or(0.0);
    cluster.kill(leader).expect("kill the leader");
    eprintln!("killed broker {leader}, the leader of {}/0", topics[0]);
    // Delivery goes on while the old leader is down: leadership moved to a follower.
    relay
        .wait_metric_at_least(
            "outboxd_events_published_total",
            published_at_kill + 1_000.0,
        )
        .await;
    assert_ne!(
        cluster.leader(&topics[0], 0).expect("leader"),
        leader,
        "leadership moved"
    );
    tokio::task::block_in_place(|| cluster.restart(&[leader], 3)).expect("the broker rejoins");
    load.wait_committed(load.committed() + 300, Duration::from_secs(60))
        .await;
    let events = load.stop().await;
    let wal_after = ops::current_wal(&client).await;

    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(180));
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(120)).await;
    let row = ops::slot_row(&client, &outbox.slot).await.expect("slot");
    assert_eq!(
        row.active_pid,
        Some(pid),
        "the walsender streamed throughout: the relay never had to restart its session"
    );
    assert!(relay.is_running(), "relay exited:\n{}", relay.log_text());
    eprintln!(
        "leader killed: {} events, {} duplicates, {:?}",
        events.len(),
        report.duplicates,
        started.elapsed()
    );
    relay.kill();
}

/// Two of three brokers down (RF 3, min ISR 2: no write can be acknowledged, and the
/// controller quorum is gone too) while events keep coming: the relay waits, the slot is
/// not confirmed past the first event Kafka could not take, status updates keep the
/// walsender alive, and once the brokers are back every event arrives without anyone
/// restarting the relay.
#[tokio::test(flavor = "multi_thread")]
async fn two_brokers_down_the_relay_waits_and_resumes_on_its_own() {
    let pg = dedicated();
    let s = Scenario::on(&pg, "kafka_two_down")
        .broker(Broker::kafka(3))
        .replicated()
        .await;
    let (db, outbox, topics, _, broker) = s.parts();
    let mut relay = start_relay(db, outbox, broker);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;

    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), paced());
    load.wait_committed(300, Duration::from_secs(60)).await;
    let cluster = broker.kafka_cluster();
    let down = [2, 3];
    for id in down {
        cluster.kill(id).expect("kill a broker");
    }
    // Everything committed from here on needs a broker that is gone.
    let down_wal = ops::current_wal(&client).await;
    let committed_at_outage = load.committed();
    load.wait_committed(committed_at_outage + 300, Duration::from_secs(60))
        .await;
    watch_outage(
        &pg,
        &client,
        &outbox.slot,
        pid,
        down_wal,
        Duration::from_secs(20),
    )
    .await;
    tokio::task::block_in_place(|| cluster.restart(&down, 3)).expect("all three brokers back");
    let events = load.stop().await;
    let wal_after = ops::current_wal(&client).await;
    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(240));
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(120)).await;
    assert!(relay.is_running(), "relay exited:\n{}", relay.log_text());
    eprintln!(
        "two brokers down: {} events ({} during the outage), {} duplicates",
        events.len(),
        events.len() - committed_at_outage,
        report.duplicates
    );
    relay.kill();
}

/// The only broker hung (SIGSTOP: connections open, nothing answers) while events keep
/// coming: the walsender survives the hang on status updates and nothing is confirmed
/// past what Kafka had. Then the relay is killed -9 and the hung broker too (the requests
/// it had buffered die with it), and both start again: the new relay publishes everything
/// the hang held.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_broker_then_a_relay_crash_and_a_broker_crash_lose_nothing() {
    let pg = dedicated();
    let s = Scenario::on(&pg, "kafka_hung")
        .broker(Broker::kafka(1))
        .partitions(4)
        .await;
    let (db, outbox, topics, _, broker) = s.parts();
    let mut relay = start_relay(db, outbox, broker);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;

    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), paced());
    load.wait_committed(300, Duration::from_secs(60)).await;
    let cluster = broker.kafka_cluster();
    cluster.set_paused(1, true).expect("SIGSTOP");
    let hung_wal = ops::current_wal(&client).await;
    let at_hang = load.committed();
    load.wait_committed(at_hang + 300, Duration::from_secs(60))
        .await;
    watch_outage(
        &pg,
        &client,
        &outbox.slot,
        pid,
        hung_wal,
        Duration::from_secs(15),
    )
    .await;
    relay.kill();
    cluster.kill(1).expect("kill -9 the hung broker");
    tokio::task::block_in_place(|| cluster.restart(&[1], 1)).expect("restart the broker");
    let mut relay = start_relay(db, outbox, broker);
    load.wait_committed(load.committed() + 200, Duration::from_secs(60))
        .await;
    let events = load.stop().await;
    let wal_after = ops::current_wal(&client).await;
    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(180));
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(120)).await;
    assert!(relay.is_running(), "relay exited:\n{}", relay.log_text());
    eprintln!(
        "hung broker: {} events ({} during the hang), {} duplicates",
        events.len(),
        events.len() - at_hang,
        report.duplicates
    );
    relay.kill();
}

/// Issue 30 item 13a: one broker of three down, leading no partition of the progress topic
/// nor of the outbox's topics. A relay restarted after a PostgreSQL crash (which may replay
/// what was relayed since the slot was last saved) must still read its progress record:
/// nothing is published twice, and events committed after the start are confirmed
/// promptly (an unread record holds the slot at its start until a read succeeds).
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_leading_nothing_down_does_not_stop_the_progress_read() {
    use support::load::insert_events;
    let pg = PgCluster::start(ClusterOptions {
        // No checkpoint of its own in the test: the crash replays everything relayed.
        conf: vec!["checkpoint_timeout = '1h'".to_owned()],
        ..ClusterOptions::default()
    })
    .expect("dedicated cluster");
    let db = pg.fresh_database("progress_read_one_broker_down").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::kafka(3);
    let bootstrap = broker.bootstrap();
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    let dead = outbox.dead_letter_topic();
    broker
        .create_topics_on(&[&topics[0], &topics[1], &dead], 4, 1, &[])
        .await;
    broker.create_progress_topic_on(1).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        &bootstrap,
        &[
            ("OUTBOXD_PROGRESS_INTERVAL_MS", "200"),
            // Room for a loaded machine: a read stuck on the dead broker still never ends,
            // and counts as unread.
            ("OUTBOXD_PROGRESS_READ_WAIT_MS", "20000"),
            ("OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS", "1000"),
        ],
    );
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    ops::wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    client
        .batch_execute("CHECKPOINT")
        .await
        .expect("a checkpoint before the events");
    let events = insert_events(&client, &outbox.table, 2000, 10, 20).await;
    let end = schema::current_wal_lsn(&db).await;
    schema::wait_confirmed_at_least(&db, end, Duration::from_secs(120)).await;
    relay
        .wait_metrics("the progress record at the end", |body| {
            ops::metric(body, "outboxd_progress_recorded_lsn").filter(|l| *l >= end as f64)
        })
        .await;
    relay.kill();
    drop(relay);
    drop(client);
    broker.kafka_cluster().kill(3).expect("broker 3 down");
    tokio::task::block_in_place(|| pg.stop(pgtest::StopMode::Immediate)).expect("crash");
    tokio::task::block_in_place(|| pg.start_again()).expect("start");

    let started = Instant::now();
    let relay = Relay::start(env, &["run"]);
    let client = ops::connect(&db.conn_string()).await;
    let more = insert_events(&client, &outbox.table, 200, 10, 20).await;
    let end = schema::current_wal_lsn(&db).await;
    schema::wait_confirmed_at_least(&db, end, Duration::from_secs(120)).await;
    let confirmed_after = started.elapsed();
    let events = [events, more].concat();
    let received = ops::read_all_blocking(&bootstrap, &topics, &events, Duration::from_secs(120));
    let report = support::consume::check_delivery(&events, &received);
    let unread = relay
        .metric("outboxd_progress_record_unread_total")
        .expect("outboxd_progress_record_unread_total exported");
    let skipped = relay.metric("outboxd_events_skipped_total").unwrap_or(-1.0);
    eprintln!(
        "kafka_cluster: one broker down at start: slot confirmed after {confirmed_after:?}, \
         {skipped} skipped, {} duplicates, record unread {unread} times",
        report.duplicates
    );
    assert_eq!(unread, 0.0, "the progress record was not read");
    assert_eq!(report.duplicates, 0, "the replay was published again");
    // Start-up, the connection to the restarted server, the read, a look at the
    // publication and a status update; an unread record would hold the slot for good.
    assert!(
        confirmed_after < Duration::from_secs(45),
        "the slot was confirmed {confirmed_after:?} after the start"
    );
    drop(relay);
}
