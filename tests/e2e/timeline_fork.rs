//! The one way the progress record could cost an event: a point-in-time restore (or a
//! promoted standby that missed the tail) keeps the system identifier and starts a new
//! timeline forking at some LSN, and the new timeline's transactions reuse positions the
//! record says were delivered on the old one. Skipping stops at the fork.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster, StopMode};
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, slot_row, wait_active_pid};
use support::proxy::Proxy;
use support::relay::Relay;
use support::schema;

/// The cluster is restored (a copy taken after the first events, ending recovery on
/// timeline 2), while the original goes on relaying on timeline 1 far past the copy's
/// end. The relay is then pointed at the restored cluster: every event committed there
/// after the fork is published, and the restored slot's replay of what Kafka has is not
/// published twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_past_the_fork_point_skips_nothing_after_the_fork() {
    let primary = PgCluster::start(ClusterOptions::default()).expect("primary");
    let db = primary.fresh_database("timeline_fork").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::mock();
    let topics = ops::create_topics(&broker, &outbox).await;
    let vip = Proxy::start(primary.port());
    let port = vip.port().to_string();
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("PGPORT", &port), ("OUTBOXD_PROGRESS_INTERVAL_MS", "200")],
    );
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let before = insert_events(&client, &outbox.table, 100, 5, 5).await;
    read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &before,
        Duration::from_secs(60),
    );
    drop(client);

    // The restore point. Making the copy restarts the original: the relay reconnects.
    let restored = primary.restore_copy().expect("restored copy");
    let restored_client = ops::connect(&restored.conn_string(&db.name)).await;
    ops::wait_for(
        "the restored copy to end recovery",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let row = restored_client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .ok()?;
            (!row.get::<_, bool>(0)).then_some(())
        },
    )
    .await;
    // The timeline of the WAL being written now (the checkpoint's may lag behind).
    let timeline: String = restored_client
        .query_one(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            &[],
        )
        .await
        .expect("timeline")
        .get(0);
    let timeline = u32::from_str_radix(&timeline, 16).expect("hex timeline");
    assert_eq!(timeline, 2, "the restored copy runs on a new timeline");
    let fork = ops::current_wal(&restored_client).await;

    // The original goes on for a good stretch of WAL: all of it is delivered and in the
    // record, none of it in the restored history.
    let client = ops::connect(&primary.conn_string(&db.name)).await;
    let lost_branch = insert_events(&client, &outbox.table, 3000, 20, 5).await;
    read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &lost_branch,
        Duration::from_secs(120),
    );
    relay.signal("TERM");
    assert_eq!(
        relay.wait_exit(Duration::from_secs(30)).code(),
        Some(0),
        "{}",
        relay.log_text()
    );
    let recorded = slot_row(&client, &outbox.slot)
        .await
        .and_then(|r| r.confirmed_flush)
        .expect("confirmed position on the old timeline");
    assert!(
        recorded > fork + 200_000,
        "the record ({recorded}) must lie well past the fork ({fork})"
    );
    let system_id: String = client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    drop(client);
    primary
        .stop(StopMode::Immediate)
        .expect("stop the original");
    // The record as written, but with its newest commit an hour ahead (a clock that ran
    // fast on the old timeline): the commit-time guard then accepts every new
    // transaction as a possible replay, so only the fork bound stands between them and
    // being skipped.
    write_record(
        &broker.bootstrap(),
        &system_id,
        &db.name,
        &outbox.slot,
        recorded,
        now_unix_micros() + 3_600_000_000,
    );

    // The address now leads to the restored cluster; its applications write on.
    vip.set_upstream(restored.port());
    vip.close_all();
    let after = insert_events(&restored_client, &outbox.table, 60, 3, 5).await;
    let end = ops::current_wal(&restored_client).await;
    assert!(
        end < recorded,
        "the new timeline's events ({fork}..{end}) reuse positions below the record ({recorded})"
    );
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&restored_client, &outbox.slot, Duration::from_secs(120)).await;
    let committed = [before, after.clone()].concat();
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &committed,
        Duration::from_secs(60),
    );
    let log = relay.log_text();
    drop(relay);
    // The old timeline's branch is in Kafka (it was delivered) but not in the restored
    // history: left out of the comparison.
    let lost: HashSet<&str> = lost_branch.iter().map(|e| e.id.as_str()).collect();
    let received: Vec<_> = received
        .into_iter()
        .filter(|r| !r.header("id").is_some_and(|id| lost.contains(id)))
        .collect();
    let report = check_delivery(&committed, &received);
    assert_eq!(report.duplicates, 0, "{log}");
    eprintln!(
        "fork at {fork:X}, record at {recorded:X}, new timeline's events up to {end:X}: {} after the fork published, 0 duplicates",
        after.len()
    );
}

fn now_unix_micros() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    i64::try_from(d.as_micros()).expect("micros")
}

/// A progress record of timeline 1 as the relay writes it.
fn write_record(
    bootstrap: &str,
    system_id: &str,
    database: &str,
    slot: &str,
    lsn: u64,
    last_commit_unix_micros: i64,
) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("producer");
    let key = format!("{system_id}/{database}/{slot}");
    let value = serde_json::json!({
        "version": 1,
        "system_id": system_id,
        "database": database,
        "slot": slot,
        "timeline": 1,
        "confirmed_lsn": format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF),
        "recorded_at_unix_ms": 1_764_590_400_000u64,
        "last_commit_unix_micros": last_commit_unix_micros,
        "slot_created": true,
    })
    .to_string();
    producer
        .send(
            BaseRecord::to("outboxd.progress")
                .partition(0)
                .key(&key)
                .payload(&value),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(10)).expect("flush");
}
