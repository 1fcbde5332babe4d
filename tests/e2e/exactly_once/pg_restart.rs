//! Exactly-once through PostgreSQL crashes: the server stopped in immediate mode (no
//! shutdown checkpoint, as a power cut) and started again while the relay runs.

use std::time::Duration;

use pgtest::{PgCluster, StopMode};
use rand::Rng;

use super::{assert_exactly_once, finish_load, wait_confirmed_while_running, EXACTLY_ONCE};
use crate::support;
use support::broker::Broker;
use support::ops::{LoadGen, LoadShape};
use support::scenario::Scenario;
use support::schema;

/// Three brokers (RF 3, min ISR 2). PostgreSQL crashes three times under a fast load
/// (transactions of up to 100 events) while the relay keeps running. A crash takes the
/// slot back to where the last checkpoint saw it (`confirmed_flush_lsn` reaches the disk
/// only there), behind what the relay committed to Kafka: the reconnected relay is sent
/// again everything since, tens of thousands of events here. Each replayed transaction
/// must be proven delivered and left unpublished. The in-flight caps are small (2,000
/// events) and the claim's marks thin out with age, so a replay the relay held whole until
/// the next mark would fill the caps: it was published (25,180 duplicates) before a full
/// hold spilled. Every event exactly once in read_committed, the slot confirmed past the
/// last, and most replayed events skipped.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_crashed_and_restarted_neither_loses_nor_duplicates() {
    const CRASHES: usize = 3;
    const PER_ROUND: usize = 8_000;
    let pg = PgCluster::start(pgtest::ClusterOptions::default()).expect("dedicated cluster");
    let s = Scenario::on(&pg, "eos_pg_crash")
        .broker(Broker::kafka(3))
        .replicated()
        .await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    // OUTBOXD_TEST_DELIVERY=at-least-once runs the same crashes without transactions.
    let mode = std::env::var("OUTBOXD_TEST_DELIVERY").unwrap_or_else(|_| EXACTLY_ONCE.1.into());
    let mut relay = s.relay(&[
        ("OUTBOXD_DELIVERY", &mode),
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "2000"),
    ]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    drop(client);
    let load = LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        LoadShape {
            max_txn: 100,
            pause: Duration::from_millis(5),
            ..LoadShape::default()
        },
    );
    let mut reconnects = relay.metric("outboxd_reconnects_total").unwrap_or(0.0);
    for crash in 1..=CRASHES {
        load.wait_committed(crash * PER_ROUND, Duration::from_secs(300))
            .await;
        // The relay committed to Kafka and confirmed all of that (a crash now sends it
        // again) and goes on with the newer events when PostgreSQL crashes.
        let lsn = schema::current_wal_lsn(db).await;
        wait_confirmed_while_running(&mut relay, db, lsn).await;
        let published = relay
            .metric("outboxd_events_published_total")
            .unwrap_or(0.0);
        let more: u32 = rand::thread_rng().gen_range(1..=1_000);
        relay
            .wait_metric_at_least(
                "outboxd_events_published_total",
                published + f64::from(more),
            )
            .await;
        tokio::task::block_in_place(|| pg.stop(StopMode::Immediate)).expect("crash");
        tokio::task::block_in_place(|| pg.start_again()).expect("start again");
        reconnects = relay
            .wait_metric_at_least("outboxd_reconnects_total", reconnects + 1.0)
            .await;
        assert!(relay.is_running(), "relay exited:\n{}", relay.log_text());
    }
    let events = finish_load(load, &mut relay, db, (1_000, Duration::from_secs(300))).await;
    assert_exactly_once(
        bootstrap,
        topics,
        &events,
        &format!("{CRASHES} PostgreSQL crashes, {mode}"),
    );
    let skipped = relay.metric("outboxd_events_skipped_total").unwrap_or(0.0);
    println!("{} events, {skipped} replayed events skipped", events.len());
    // Each crash took the slot back to its last checkpoint, behind what the relay had
    // confirmed: the test is of a replay only if the relay was sent events it delivered.
    // How far back depends on the checkpoints (a crash's recovery ends with one, which can
    // persist a position the relay has since confirmed past): 10,739 on a loaded machine,
    // over 24,000 on a quiet one. A thousand a crash still proves the replays were proven.
    assert!(
        skipped >= (CRASHES * 1_000) as f64,
        "only {skipped} replayed events skipped"
    );
    relay.kill();
}
