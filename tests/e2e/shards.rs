//! A sharded outbox: the table partitioned by hash of aggregate_id, one slot and
//! publication per partition. One process relaying every shard, shards spread over
//! processes with one of them killed mid-load, and layouts that would leave a partition
//! unread refused by `check`, at start-up and while running.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::PgCluster;
use rand::Rng;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_events, Event};
use support::ops::{self, read_all_blocking, wait_active_pid, LoadGen, LoadShape};
use support::relay::{run_to_end, Relay};
use support::schema::Outbox;

pub(crate) fn shard_slot(o: &Outbox, i: u32) -> String {
    format!("{}_{i}", o.slot)
}

/// `outboxd init` with OUTBOXD_SHARD_COUNT: the partitioned table, and each shard's
/// publication and slot; then `check` passes.
pub(crate) fn init_shards(env: &[(String, String)]) {
    let (code, out) = run_to_end(env, &["init"]);
    assert_eq!(code, 0, "init failed:\n{out}");
    let (code, out) = run_to_end(env, &["check"]);
    assert_eq!(code, 0, "check failed after init:\n{out}");
    assert!(out.contains("ok    shards:"), "{out}");
}

/// Starts `outboxd run` and waits until each of its `shards` streams from its slot.
pub(crate) async fn start_relaying(
    env: Vec<(String, String)>,
    client: &tokio_postgres::Client,
    o: &Outbox,
    shards: u32,
) -> Relay {
    let relay = Relay::start(env, &["run"]);
    for i in 0..shards {
        wait_active_pid(client, &shard_slot(o, i), Duration::from_secs(120)).await;
    }
    relay
}

/// Waits until the slot of each of `shards` is confirmed at or past `wal`.
pub(crate) async fn wait_shards_confirmed(
    client: &tokio_postgres::Client,
    o: &Outbox,
    shards: u32,
    wal: u64,
) {
    ops::wait_for(
        "every shard's slot confirmed past the load",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let mut all = true;
            for i in 0..shards {
                let row = ops::slot_row(client, &shard_slot(o, i))
                    .await
                    .expect("slot");
                all &= row.confirmed_flush.unwrap_or(0) >= wal;
            }
            all.then_some(())
        },
    )
    .await;
}

/// Inserts `n` events over 40 aggregates and checks that all arrive, in order per aggregate.
async fn insert_and_deliver(
    client: &tokio_postgres::Client,
    broker: &Broker,
    topics: &[String],
    o: &Outbox,
    n: usize,
    max_txn: usize,
) -> support::consume::DeliveryReport {
    let events = insert_events(client, &o.table, n, max_txn, 40).await;
    ops::read_and_check(broker, topics, &events, Duration::from_secs(90))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_relays_three_shards_in_order_per_aggregate() {
    let db = PgCluster::shared().fresh_database("shards_three").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", "3")],
    );
    init_shards(&env);
    let client = db.client().await;
    let relay = start_relaying(env.clone(), &client, &o, 3).await;
    // Multi-row transactions spanning shards: each shard publishes its own rows.
    let report = insert_and_deliver(&client, &broker, &topics, &o, 3_000, 8).await;
    assert_eq!(report.duplicates, 0);

    // Each shard relayed its own share, and says so under its label. The counters move
    // when the relay has processed the acks, which may be just after a consumer can
    // read the records: waited for, then checked exactly.
    let body = relay
        .wait_metrics("the shards' published counters to reach 3000", |body| {
            let total: f64 = (0..3)
                .filter_map(|i| {
                    ops::metric(
                        body,
                        &format!("outboxd_events_published_total{{shard=\"{i}\"}}"),
                    )
                })
                .sum();
            (total >= 3_000.0).then(|| body.to_owned())
        })
        .await;
    let mut total = 0.0;
    for i in 0..3 {
        let n = ops::must_metric(
            &body,
            &format!("outboxd_events_published_total{{shard=\"{i}\"}}"),
        );
        assert!(n > 0.0, "shard {i} published nothing:\n{body}");
        total += n;
    }
    assert_eq!(total, 3_000.0);
    let (code, ready) = relay.http_get("/readyz").expect("readyz");
    assert_eq!(code, 200, "{ready}");

    // Every shard's slot is confirmed past its rows.
    let wal = support::schema::current_wal_lsn(&db).await;
    wait_shards_confirmed(&client, &o, 3, wal).await;

    let (code, out) = run_to_end(&env, &["status", "--json"]);
    assert_eq!(code, 0, "{out}");
    let doc: serde_json::Value = serde_json::from_str(out.trim()).expect("status json");
    let shards = doc["shards"].as_array().expect("shards array");
    assert_eq!(shards.len(), 3);
    for (i, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"], i);
        assert_eq!(s["slot"], shard_slot(&o, u32::try_from(i).unwrap()));
        assert_eq!(s["active"], true);
    }
}

/// sql/shards.sql as an owner would run it (twice), then `init` creates only the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_kit_makes_a_layout_check_and_run_accept() {
    let db = PgCluster::shared().fresh_database("shards_sql_kit").await;
    let client = db.client().await;
    let kit = include_str!("../../sql/shards.sql");
    client.batch_execute(kit).await.unwrap();
    client.batch_execute(kit).await.unwrap();
    let o = Outbox {
        publication: "outboxd".into(),
        ..Outbox::for_db(&db)
    };
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", "4")],
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.matches("(exists)").count(),
        5,
        "table and 4 publications exist:\n{out}"
    );
    assert_eq!(
        out.matches("(created at").count(),
        4,
        "4 slots created:\n{out}"
    );
    init_shards(&env);
    let _relay = start_relaying(env, &client, &o, 4).await;
    insert_and_deliver(&client, &broker, &topics, &o, 400, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shard_processes_one_killed_mid_load_lose_nothing() {
    let db = PgCluster::shared().fresh_database("shards_kill").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let bootstrap = broker.bootstrap();
    let base = [("OUTBOXD_SHARD_COUNT", "2")];
    init_shards(&Relay::env_for(&db, &o, &bootstrap, &base));
    // Two processes, as two pods of a StatefulSet would run: one shard each.
    let _steady = Relay::start(
        Relay::env_for(
            &db,
            &o,
            &bootstrap,
            &[("OUTBOXD_SHARD_COUNT", "2"), ("OUTBOXD_SHARDS", "0")],
        ),
        &["run"],
    );
    let mut killed = Relay::start(
        Relay::env_for(
            &db,
            &o,
            &bootstrap,
            &[
                ("OUTBOXD_SHARD_COUNT", "2"),
                ("OUTBOXD_SHARDS", "ordinal"),
                ("HOSTNAME", "outboxd-1"),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    for i in 0..2 {
        wait_active_pid(&client, &shard_slot(&o, i), Duration::from_secs(120)).await;
    }
    let load_client = db.client().await;
    let table = o.table.clone();
    let load = tokio::spawn(async move {
        let mut events: Vec<Event> = Vec::new();
        while events.len() < 20_000 {
            events.extend(insert_events(&load_client, &table, 1_000, 20, 60).await);
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        events
    });
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while kills < 5 || !load.is_finished() {
        let pause = rand::thread_rng().gen_range(300..=1200);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        killed.restart();
        kills += 1;
        assert!(
            Instant::now() < deadline,
            "load did not finish in 5 minutes"
        );
    }
    let events = load.await.expect("load");
    let received = read_all_blocking(&bootstrap, &topics, &events, Duration::from_secs(180));
    let report = check_delivery(&events, &received);
    assert_eq!(report.unique, events.len());
    eprintln!(
        "{} events, {kills} kills of shard 1's process: {} duplicates",
        events.len(),
        report.duplicates
    );
}

/// A table with four hash partitions, relayed as two shards: the rows of two partitions
/// would be published by no shard's publication.
const FOUR_PARTITIONS: &str = "
CREATE TABLE public.outbox (
    id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
    event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, aggregate_id)
) PARTITION BY HASH (aggregate_id);
CREATE TABLE public.outbox_shard_0 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE public.outbox_shard_2 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 4, REMAINDER 2);
CREATE TABLE public.outbox_shard_3 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 4, REMAINDER 3);
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_no_shard_reads_is_refused_by_check_init_and_run() {
    let db = PgCluster::shared().fresh_database("shards_refused").await;
    let o = Outbox::for_db(&db);
    let client = db.client().await;
    client.batch_execute(FOUR_PARTITIONS).await.unwrap();
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", "2")],
    );

    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    assert!(
        out.contains("FAIL  shards:") && out.contains("modulus 4"),
        "{out}"
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    // Nothing was created for a layout that would lose rows.
    assert!(
        ops::slot_row(&client, &shard_slot(&o, 0)).await.is_none(),
        "{out}"
    );
    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("relayed by no shard"), "{out}");
}

/// Inserts `n` rows dated `at` in one transaction, returning them in insertion order.
async fn insert_dated(
    client: &tokio_postgres::Client,
    table: &str,
    n: i32,
    at: &str,
) -> Vec<Event> {
    let sql = format!(
        "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'order' ELSE 'customer' END, \
                'agg-' || (g % 40), 'Changed', jsonb_build_object('g', g), $1::text::timestamptz \
         FROM generate_series(1, $2::int) g \
         RETURNING {}",
        support::load::EVENT_COLUMNS
    );
    client
        .query(&sql, &[&at, &n])
        .await
        .expect("dated insert")
        .iter()
        .map(Event::from_row)
        .collect()
}

/// The SQL date `offset` days after `today` (`YYYY-MM-DD`).
pub(crate) fn day_after(today: &str, offset: i32) -> String {
    format!("('{today}'::date + {offset})")
}

/// Creates two shards, each partitioned by range of `created_at`: a DEFAULT partition and
/// one per day from yesterday to tomorrow (`_d0` to `_d2`), each shard its own
/// publication. Returns the server's today (`YYYY-MM-DD`).
pub(crate) async fn create_by_day_layout(client: &tokio_postgres::Client, o: &Outbox) -> String {
    let today: String = client
        .query_one("SELECT current_date::text", &[])
        .await
        .unwrap()
        .get(0);
    client
        .batch_execute(&by_day_layout(o, &today))
        .await
        .expect("layout");
    today
}

/// 100 events dated noon the day after tomorrow (the `_d3` partition a test attaches).
pub(crate) async fn insert_after_tomorrow(
    client: &tokio_postgres::Client,
    o: &Outbox,
    today: &str,
) -> Vec<Event> {
    let at: String = client
        .query_one(
            &format!(
                "SELECT ({} + interval '12 hours')::text",
                day_after(today, 2)
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    insert_dated(client, &o.table, 100, &at).await
}

fn by_day_layout(o: &Outbox, today: &str) -> String {
    let day = |offset: i32| day_after(today, offset);
    let mut ddl = format!(
        "CREATE TABLE {t} (id uuid NOT NULL, aggregate_type text NOT NULL, \
         aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, \
         headers jsonb, created_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (id, aggregate_id, created_at)) PARTITION BY HASH (aggregate_id);",
        t = o.table
    );
    for i in 0..2 {
        let shard = format!("{}_shard_{i}", o.table);
        ddl += &format!(
            "CREATE TABLE {shard} PARTITION OF {t} FOR VALUES WITH (MODULUS 2, REMAINDER {i}) \
             PARTITION BY RANGE (created_at);\
             CREATE TABLE {shard}_default PARTITION OF {shard} DEFAULT;\
             CREATE PUBLICATION {p}_{i} FOR TABLE {shard} \
             WITH (publish = 'insert', publish_via_partition_root = true);",
            t = o.table,
            p = o.publication
        );
        for d in -1..=1 {
            ddl += &format!(
                "CREATE TABLE {shard}_d{n} PARTITION OF {shard} FOR VALUES FROM ({from}) TO ({to});",
                n = d + 1,
                from = day(d),
                to = day(d + 1)
            );
        }
    }
    ddl
}

/// Shards partitioned further by day, for retention (sql/shards.sql says this works):
/// `check` and `run` accept the layout, rows of every daily partition (and of the default
/// one, and of a day attached while running) are published under their shard, once each,
/// in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_partitioned_by_day_publish_every_day() {
    let db = PgCluster::shared().fresh_database("shards_by_day").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let today = create_by_day_layout(&client, &o).await;
    let day = |offset: i32| day_after(&today, offset);
    let env = Relay::env_for(
        &db,
        &o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", "2")],
    );
    init_shards(&env);
    let mut relay = start_relaying(env, &client, &o, 2).await;

    let mut events = insert_events(&client, &o.table, 600, 8, 40).await;
    // Near midnight UTC: yesterday's or today's partition, whatever the server's time zone.
    events.extend(insert_dated(&client, &o.table, 100, &format!("{today} 00:00:01+00")).await);
    // Older than every day: the default partition.
    events.extend(insert_dated(&client, &o.table, 100, "2001-01-01 12:00:00+00").await);
    // The nightly job: tomorrow+1 attached while the relay runs, then written to.
    for i in 0..2 {
        let shard = format!("{}_shard_{i}", o.table);
        client
            .batch_execute(&format!(
                "CREATE TABLE {shard}_d3 PARTITION OF {shard} FOR VALUES FROM ({from}) TO ({to})",
                from = day(2),
                to = day(3)
            ))
            .await
            .expect("attach a day");
    }
    events.extend(insert_after_tomorrow(&client, &o, &today).await);
    events.extend(insert_events(&client, &o.table, 300, 8, 40).await);

    // Every daily partition, the default one and the attached one got rows.
    let per_leaf: Vec<(String, i64)> = client
        .query(
            &format!(
                "SELECT tableoid::regclass::text, count(*) FROM {} GROUP BY 1 ORDER BY 1",
                o.table
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        per_leaf.iter().any(|(t, _)| t.ends_with("_default"))
            && per_leaf.iter().any(|(t, _)| t.ends_with("_d3")),
        "{per_leaf:?}"
    );

    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(90));
    assert_eq!(report.duplicates, 0);
    assert_eq!(report.unique, 1_200);
    assert!(relay.is_running(), "the relay still runs after the attach");
}

/// Whether every one of `shards` reports `outboxd_standby` = `value` on `relay`.
fn standby_on_every_shard(relay: &Relay, shards: u32, value: f64) -> bool {
    relay.http_get("/metrics").is_some_and(|(_, body)| {
        (0..shards).all(|i| {
            ops::metric(&body, &format!("outboxd_standby{{shard=\"{i}\"}}")) == Some(value)
        })
    })
}

/// An active process and a standby, both relaying every shard (the default
/// `OUTBOXD_SHARDS=all`): the standby waits on both slots, takes both over when the
/// active one is killed mid-load, and every event arrives, in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_every_shard_when_the_active_process_dies() {
    let db = PgCluster::shared().fresh_database("shards_standby").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let bootstrap = broker.bootstrap();
    // Each process its own HTTP port.
    let env = || Relay::env_for(&db, &o, &bootstrap, &[("OUTBOXD_SHARD_COUNT", "2")]);
    init_shards(&env());
    let client = db.client().await;
    let mut active = start_relaying(env(), &client, &o, 2).await;
    let mut standby = Relay::start(env(), &["run"]);
    ops::wait_for(
        "the second process standing by on both shards",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { standby_on_every_shard(&standby, 2, 1.0).then_some(()) },
    )
    .await;

    // Kill mid-load: the load runs on before and after the kill, through the takeover.
    let load = LoadGen::spawn(db.conn_string(), o.table.clone(), LoadShape::default());
    load.wait_committed(3_000, Duration::from_secs(30)).await;
    active.kill();
    let at_kill = load.committed();
    load.wait_committed(at_kill + 3_000, Duration::from_secs(60))
        .await;
    let events = load.stop().await;
    let received = read_all_blocking(&bootstrap, &topics, &events, Duration::from_secs(180));
    let report = check_delivery(&events, &received);
    assert_eq!(report.unique, events.len());
    assert!(
        standby_on_every_shard(&standby, 2, 0.0),
        "the standby took over both shards"
    );
    assert!(standby.is_running());
    let wal = support::schema::current_wal_lsn(&db).await;
    wait_shards_confirmed(&client, &o, 2, wal).await;
    eprintln!(
        "{} events, the active process killed mid-load, the standby took over: {} duplicates",
        events.len(),
        report.duplicates
    );
}
