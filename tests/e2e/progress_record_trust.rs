//! What a progress record that outboxd did not write does: nothing. An unreadable value
//! under the slot's key (written by someone else, or by a bug) skips nothing, never holds
//! the slot (and so the primary's WAL) back, is counted for an alert, and is replaced at
//! the next write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, wait_active_pid};
use support::relay::Relay;
use support::schema;

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_record_holds_nothing_back_and_is_replaced() {
    let db = PgCluster::shared()
        .fresh_database("record_unreadable")
        .await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let mut batch = ops::relay_first_batch(&db, &client, &outbox, &broker, &[], 10).await;
    batch.stop();
    let key = ops::progress_key(&client, &db.name, &outbox.slot).await;
    ops::write_progress_record(&broker.bootstrap(), &key, r#"{"forged":true}"#);
    assert!(
        ops::latest_progress_record(&broker.bootstrap(), &key)
            .is_some_and(|r| r.get("confirmed_lsn").is_none()),
        "the forged value is the newest under the key"
    );

    let relay = Relay::start(batch.env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = insert_events(&client, &outbox.table, 10, 3, 3).await;
    let after = schema::current_wal_lsn(&db).await;
    let all = [batch.first.clone(), events].concat();
    check_delivery(
        &all,
        &read_all_blocking(
            &broker.bootstrap(),
            &batch.topics,
            &all,
            Duration::from_secs(60),
        ),
    );
    // The slot moves on: the record held nothing back.
    schema::wait_confirmed_at_least(&db, after, Duration::from_secs(60)).await;
    assert!(
        relay
            .metric("outboxd_progress_record_invalid_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    // And outboxd's own record replaced it.
    ops::wait_for(
        "a readable record under the key",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            ops::latest_progress_record(&broker.bootstrap(), &key)
                .filter(|r| r.get("confirmed_lsn").is_some())
        },
    )
    .await;
    drop(relay);
}
