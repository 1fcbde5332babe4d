//! The application's DDL holding locks on the outbox's tables. A nightly job creating a
//! day's partition beside a DEFAULT one holds ACCESS EXCLUSIVE on the shard and on its
//! DEFAULT partition until it commits. The relay's periodic catalog checks must neither
//! wait behind it (its loop would stall, and a wait of more than a few seconds restarted
//! the session) nor hold one table's lock while waiting for another's: on PostgreSQL 16+
//! that deadlocked with the job, and PostgreSQL cancelled the job's DDL to break it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::shards::{
    create_by_day_layout, day_after, init_shards, insert_after_tomorrow, start_relaying,
    wait_shards_confirmed,
};
use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::{insert_events, Event, EVENT_COLUMNS};
use support::ops;
use support::relay::Relay;
use support::schema::Outbox;

/// Inserts `n` events through the root whose aggregates all hash to shard 0 of 2, so no
/// row is routed to (and no lock taken on) shard 1. Each aggregate keeps the type
/// (topic) `insert_events` gives it, so its order is checked across both.
async fn insert_into_shard_0(client: &tokio_postgres::Client, o: &Outbox, n: i32) -> Vec<Event> {
    let sql = format!(
        "WITH aggs AS (SELECT pg_catalog.array_agg(a) AS a FROM ( \
           SELECT 'agg-' || i AS a FROM generate_series(0, 39) i) s \
           WHERE satisfies_hash_partition('{t}'::regclass, 2, 0, s.a)) \
         INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT gen_random_uuid(), \
                CASE WHEN substr(one.a, 5)::int % 2 = 0 THEN 'order' ELSE 'customer' END, \
                one.a, 'Changed', jsonb_build_object('g', g) \
         FROM generate_series(1, $1::int) g, aggs, LATERAL (SELECT aggs.a[1 + g % 10] AS a) one \
         RETURNING {EVENT_COLUMNS}",
        t = o.table
    );
    client
        .query(&sql, &[&n])
        .await
        .expect("insert into shard 0")
        .iter()
        .map(Event::from_row)
        .collect()
}

/// The relay's counter `outboxd_<name>` of `shard` (0 before it is first shown).
fn shard_counter(relay: &Relay, name: &str, shard: u32) -> f64 {
    relay
        .metric_series(&format!("outboxd_{name}{{shard=\"{shard}\"}}"))
        .unwrap_or(0.0)
}

/// The relay's catalog-check rounds of `shard` so far.
fn checks(relay: &Relay, shard: u32) -> f64 {
    shard_counter(relay, "catalog_checks_total", shard)
}

/// While a transaction holds the locks of a day's partition being created in shard 1,
/// the relay goes on: rows of shard 0 arrive, both slots are confirmed past them, no
/// session restarts, and the DDL commits (not a deadlock's victim). Every event,
/// those of the new partition too, arrives once, in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_partition_created_beside_a_default_one_stalls_nothing() {
    let db = PgCluster::shared().fresh_database("catalog_locks").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let today = create_by_day_layout(&client, &o).await;
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", "2")],
    );
    init_shards(&env);
    let mut relay = start_relaying(env, &client, &o, 2).await;
    let mut events = insert_events(&client, &o.table, 300, 8, 40).await;
    let reconnects = relay.metric("outboxd_reconnects_total").unwrap_or(0.0);

    // The nightly job, left open: ACCESS EXCLUSIVE on shard 1 and its DEFAULT partition.
    let shard_1 = format!("{}_shard_1", o.table);
    let job = db.client().await;
    job.batch_execute(&format!(
        "BEGIN; CREATE TABLE {shard_1}_d3 PARTITION OF {shard_1} FOR VALUES FROM ({}) TO ({})",
        day_after(&today, 2),
        day_after(&today, 3)
    ))
    .await
    .expect("the job's DDL");
    events.extend(insert_into_shard_0(&client, &o, 400).await);
    let wal = ops::current_wal(&client).await;
    let version: String = client
        .query_one("SHOW server_version_num", &[])
        .await
        .unwrap()
        .get(0);
    // Shard 1's coverage check opens shard 1 on PostgreSQL 16+ (`pg_publication_tables`).
    let defers = version.parse::<u32>().unwrap() >= 160_000;
    // Two rounds of every shard's checks after the locks were taken: they met them. A
    // round already under way when they were taken may have passed before them, so on 16+
    // the wait is for two put off, not for two rounds alone.
    let since = [checks(&relay, 0), checks(&relay, 1)];
    ops::wait_for(
        "two rounds of catalog checks on each shard under the job's locks",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let deferred = shard_counter(&relay, "catalog_checks_deferred_total", 1);
            (checks(&relay, 0) >= since[0] + 2.0
                && checks(&relay, 1) >= since[1] + 2.0
                && (!defers || deferred >= 2.0))
                .then_some(())
        },
    )
    .await;
    wait_shards_confirmed(&client, &o, 2, wal).await;
    assert_eq!(
        relay.metric("outboxd_reconnects_total").unwrap_or(0.0),
        reconnects,
        "a session restarted while the job held its locks"
    );
    // Shard 0's checks read nothing the job locks. Shard 1's coverage check opens shard 1
    // on PostgreSQL 16+ (`pg_publication_tables`), and is put off rather than waited for.
    assert_eq!(
        shard_counter(&relay, "catalog_checks_deferred_total", 0),
        0.0
    );
    if defers {
        assert!(shard_counter(&relay, "catalog_checks_deferred_total", 1) >= 2.0);
    }
    job.batch_execute("COMMIT")
        .await
        .expect("the job's DDL commits");

    events.extend(insert_after_tomorrow(&client, &o, &today).await);
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(90));
    assert_eq!(report.duplicates, 0);
    assert_eq!(report.unique, 800);
    assert!(relay.is_running(), "the relay still runs after the job");
}
