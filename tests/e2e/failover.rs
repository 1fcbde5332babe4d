//! A primary failover with a PG17+ failover slot is a non-event: a standby with slot sync,
//! the primary killed (immediate stop) while events are inserted, the standby promoted
//! and the address (a forwarder standing in for a VIP) moved to it. Ground truth is the
//! new primary's outbox: every row in it reaches Kafka, in order per aggregate, and no
//! record reaches Kafka whose row the new primary lacks (synchronized_standby_slots holds
//! decoding back until the standby has the WAL). outboxd follows by itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use pgtest::{ClusterOptions, PgCluster, StopMode, TestDb};
use rand::Rng;
use support::broker::Broker;
use support::consume::check_delivery;
use support::ops::{self, read_all_blocking, wait_active_pid, wait_for, LoadGen, LoadShape};
use support::proxy::Proxy;
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};
use tokio_postgres::Client;

const STANDBY_SLOT: &str = "sb1";

async fn synced_on_standby(standby: &Client, slot: &str) -> bool {
    standby
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 \
             AND synced AND NOT temporary AND invalidation_reason IS NULL",
            &[&slot],
        )
        .await
        .ok()
        .flatten()
        .is_some()
}

async fn outbox_ids(client: &Client) -> HashSet<String> {
    client
        .query("SELECT id::text FROM public.outbox", &[])
        .await
        .expect("read the outbox")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// false: this server version has no failover slots. `both_hosts`: outboxd is given
/// PGHOST/PGPORT lists naming the primary and the standby instead of a moving address.
/// `shards` > 0: the outbox is sharded (`outboxd init` lays it out), one failover slot per
/// shard, each of which must be synced, followed and relayed without loss.
async fn failover_once(round: usize, both_hosts: bool, shards: u32, exactly_once: bool) -> bool {
    let primary = PgCluster::start(ClusterOptions {
        conf: vec!["wal_sender_timeout = 10s".into()],
        ..ClusterOptions::default()
    })
    .expect("primary");
    if primary.major_version() < 17 {
        return false;
    }
    let db = primary.fresh_database("failover").await;
    let client = db.client().await;
    // Sharded: the table, publications and slots are init's (below, through the same
    // addresses the relay uses); the standby gets the table by replication.
    let schema_sql = if shards == 0 {
        format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert');",
            schema::OUTBOX_DDL,
            db.publication
        )
    } else {
        String::new()
    };
    client
        .batch_execute(&format!(
            "{schema_sql} SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}')"
        ))
        .await
        .expect("schema");
    drop(client);
    let standby = primary
        .start_standby(
            STANDBY_SLOT,
            ClusterOptions {
                conf: vec!["sync_replication_slots = on".into()],
                ..ClusterOptions::default()
            },
        )
        .expect("standby");
    let client = db.client().await;
    wait_for(
        "the standby to stream from its slot",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            client
                .query_opt(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
                    &[&STANDBY_SLOT],
                )
                .await
                .ok()
                .flatten()
        },
    )
    .await;
    // Waits for the reload: `check` below reads the setting from a new session.
    alter(
        &client,
        "synchronized_standby_slots",
        &format!("'{STANDBY_SLOT}'"),
    )
    .await;
    let outbox = Outbox::for_db(&db);
    let slots: Vec<String> = if shards == 0 {
        vec![outbox.slot.clone()]
    } else {
        (0..shards)
            .map(|i| format!("{}_{i}", outbox.slot))
            .collect()
    };
    let shard_count = shards.to_string();

    // The load reaches "the primary" through an address that moves; so does the relay,
    // unless it is given both hosts and has to find the primary itself.
    let relay_vip = (!both_hosts).then(|| Proxy::start(primary.port()));
    let load_vip = Proxy::start(primary.port());
    // Exactly-once is shown on three brokers (issue 31), or on the user's own broker.
    let (broker, topics) = if exactly_once {
        let broker = Broker::three_for_tests();
        let topics = match broker.own_kafka() {
            Some(_) => ops::replicated_topics(&broker, &outbox).await,
            None => ops::create_topics(&broker, &outbox).await,
        };
        (broker, topics)
    } else {
        let broker = Broker::default_for_tests();
        let topics = ops::create_topics(&broker, &outbox).await;
        (broker, topics)
    };
    let (hosts, ports) = match &relay_vip {
        Some(vip) => ("127.0.0.1".to_owned(), vip.port().to_string()),
        None => (
            "127.0.0.1,127.0.0.1".to_owned(),
            format!("{},{}", primary.port(), standby.port()),
        ),
    };
    let mut extra = vec![("PGHOST", hosts.as_str()), ("PGPORT", ports.as_str())];
    if shards > 0 {
        extra.push(("OUTBOXD_SHARD_COUNT", &shard_count));
    }
    if exactly_once {
        extra.push(("OUTBOXD_DELIVERY", "exactly-once"));
        extra.push(("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"));
    }
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &extra);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok    synchronized_standby_slots")),
        "{out}"
    );
    let mut relay = Relay::start(env, &["run"]);
    for slot in &slots {
        wait_active_pid(&client, slot, Duration::from_secs(120)).await;
    }
    // Summed over the shards: every slot is failover-ready.
    let ready = f64::from(u32::try_from(slots.len()).expect("slots"));
    wait_for(
        "outboxd_slot_failover_ready = 1 for every slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (relay.metric("outboxd_slot_failover_ready") == Some(ready)).then_some(()) },
    )
    .await;

    let load_conn = format!(
        "host=127.0.0.1 port={} user=postgres dbname={} connect_timeout=2",
        load_vip.port(),
        db.name
    );
    let load = LoadGen::spawn(
        load_conn,
        outbox.table.clone(),
        LoadShape {
            max_txn: 5,
            aggregates: 20,
            pause: Duration::from_millis(5),
            ..LoadShape::default()
        },
    );
    let standby_client = ops::connect(&standby.conn_string(&db.name)).await;
    for slot in &slots {
        wait_for(
            "the slot to be synced and persisted on the standby",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async { synced_on_standby(&standby_client, slot).await.then_some(()) },
        )
        .await;
    }
    let kill_after = rand::thread_rng().gen_range(200..2500);
    load.wait_committed(kill_after, Duration::from_secs(60))
        .await;
    eprintln!(
        "round {round}: killing the primary after {} events",
        load.committed()
    );
    primary.stop(StopMode::Immediate).expect("stop the primary");
    // The address moves before the promotion is done: outboxd finds a standby there,
    // whose synced slot it cannot stream from yet, and waits instead of giving up.
    if let Some(vip) = &relay_vip {
        vip.set_upstream(standby.port());
        vip.close_all();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        relay.is_running(),
        "outboxd gave up on a standby: {}",
        relay.log_text()
    );
    standby.promote().expect("promote");
    let promoted = Instant::now();
    load_vip.set_upstream(standby.port());
    load_vip.close_all();

    // outboxd streams from the new primary by itself. Typically in a few seconds (its
    // reconnect backoff is 2 s here); the deadline is for a loaded machine (the matrix
    // runs this on PostgreSQL 17 and 18 at once, five rounds each, next to other tests),
    // while a relay that gave up or waits for something that never comes still fails.
    let new_primary = ops::connect(&standby.conn_string(&db.name)).await;
    for slot in &slots {
        wait_active_pid(&new_primary, slot, Duration::from_secs(60)).await;
    }
    let followed = promoted.elapsed();
    load.wait_committed(load.committed() + 200, Duration::from_secs(60))
        .await;
    let committed = load.stop().await;

    let truth = outbox_ids(&new_primary).await;
    let expected: Vec<_> = committed
        .into_iter()
        .filter(|e| truth.contains(&e.id))
        .collect();
    assert_eq!(
        expected.len(),
        truth.len(),
        "every row of the new primary was inserted by the load"
    );
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &expected,
        Duration::from_secs(180),
    );
    let report = check_delivery(&expected, &received);
    let foreign: Vec<&str> = received
        .iter()
        .filter_map(|r| r.header("id"))
        .filter(|id| !truth.contains(*id))
        .collect();
    assert!(
        foreign.is_empty(),
        "{} records reached Kafka whose rows the new primary lacks (first {:?})",
        foreign.len(),
        foreign.first()
    );
    assert!(relay.is_running(), "outboxd exited: {}", relay.log_text());
    eprintln!(
        "round {round} ({} slots): {} rows on the new primary, {} duplicates, streaming again {followed:?} after the promotion",
        slots.len(),
        truth.len(),
        report.duplicates
    );
    if exactly_once {
        assert_eq!(
            report.duplicates, 0,
            "duplicates in read_committed across the failover"
        );
    }
    relay.kill();
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn primary_killed_and_standby_promoted_loses_nothing() {
    let rounds: usize = std::env::var("OUTBOXD_TEST_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        if !failover_once(round, false, 0, false).await {
            eprintln!("skipped: failover slots need PostgreSQL 17");
            return;
        }
    }
}

/// A sharded outbox through a host list: each shard's slot is a failover slot, synced to
/// the standby, and each shard's session finds the primary again by itself after the
/// promotion (one round: the unsharded tests above take the repeated rounds).
#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_relay_follows_a_failover_through_a_host_list() {
    if !failover_once(0, true, 2, false).await {
        eprintln!("skipped: failover slots need PostgreSQL 17");
    }
}

/// The same failover without any moving address: PGHOST/PGPORT list both servers and
/// outboxd settles on whichever is the primary, before and after the promotion.
#[tokio::test(flavor = "multi_thread")]
async fn failover_followed_through_a_host_list_without_a_vip() {
    let rounds: usize = std::env::var("OUTBOXD_TEST_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for round in 0..rounds {
        if !failover_once(round, true, 0, false).await {
            eprintln!("skipped: failover slots need PostgreSQL 17");
            return;
        }
    }
}

/// Issue 31: exactly-once delivery through a failover (PostgreSQL 17+, a host list): the
/// promoted standby has the same system identifier, so the same transactional.id; what
/// the old primary's sessions committed to Kafka is skipped on the replay by the record,
/// and a read_committed consumer sees every event of the new primary once.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_follows_a_failover_through_a_host_list() {
    if !failover_once(0, true, 0, true).await {
        eprintln!("skipped: failover slots need PostgreSQL 17");
    }
}

/// The outbox table and its publication in `db`, then a standby of `primary` streaming
/// through a physical slot (made by a cold copy, so it has the table).
async fn outbox_and_standby(primary: &PgCluster, db: &TestDb<'_>) -> PgCluster {
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert'); \
             SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}')",
            schema::OUTBOX_DDL,
            db.publication
        ))
        .await
        .expect("schema");
    drop(client);
    primary
        .start_standby(STANDBY_SLOT, ClusterOptions::default())
        .expect("standby")
}

/// With the standby listed first, `run` streams from the primary (the second host), and
/// a command that finds no primary names every host it tried and why.
#[tokio::test(flavor = "multi_thread")]
async fn the_primary_is_chosen_among_listed_hosts() {
    let primary = PgCluster::start(ClusterOptions::default()).expect("primary");
    let db = primary.fresh_database("multi_host").await;
    let standby = outbox_and_standby(&primary, &db).await;
    let client = db.client().await;
    let outbox = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let dead = support::relay::free_port();

    // No primary among them: each host is named with its reason.
    let ports = format!("{dead},{}", standby.port());
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("PGHOST", "127.0.0.1,127.0.0.1"), ("PGPORT", &ports)],
    );
    for command in ["init", "status"] {
        let (code, out) = run_to_end(&env, &[command]);
        assert_eq!(code, 3, "{command}: {out}");
        for port in [dead, standby.port()] {
            assert!(
                out.contains(&format!("@127.0.0.1:{port}/{}", db.name)),
                "{command} names the host on port {port}: {out}"
            );
        }
        assert!(out.contains("standby"), "{command}: {out}");
    }
    // status may be pointed at a standby on purpose.
    let env_standby = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[
            ("PGHOST", "127.0.0.1,127.0.0.1"),
            ("PGPORT", &ports),
            ("PGTARGETSESSIONATTRS", "standby"),
        ],
    );
    let (code, out) = run_to_end(&env_standby, &["run"]);
    assert_eq!(code, 2, "run refuses target_session_attrs=standby: {out}");

    let ports = format!("{dead},{},{}", standby.port(), primary.port());
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[
            ("PGHOST", "127.0.0.1,127.0.0.1,127.0.0.1"),
            ("PGPORT", &ports),
        ],
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let mut relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = support::load::insert_events(&client, &outbox.table, 50, 5, 5).await;
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(60));
    assert_eq!(report.duplicates, 0);
    assert!(relay.is_running(), "{}", relay.log_text());
    relay.kill();
}

/// Without slot sync (PG ≤16, or a standby that never synced or persisted the slot) the
/// promoted standby has no slot: outboxd stops with exit 3 and does not create one, which
/// would silently skip what was committed since its last confirmed position.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_the_standby_lacks_stops_the_relay_after_promotion() {
    let primary = PgCluster::start(ClusterOptions::default()).expect("primary");
    let db = primary.fresh_database("failover_lost").await;
    let standby = outbox_and_standby(&primary, &db).await;
    let client = db.client().await;
    let outbox = Outbox::for_db(&db);
    let vip = Proxy::start(primary.port());
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let port = vip.port().to_string();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[("PGPORT", &port)]);
    let mut relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = support::load::insert_events(&client, &outbox.table, 50, 5, 5).await;
    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(60),
    );
    check_delivery(&events, &received);

    primary.stop(StopMode::Immediate).expect("stop the primary");
    standby.promote().expect("promote");
    vip.set_upstream(standby.port());
    vip.close_all();
    let status = relay.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", relay.log_text());
    let new_primary = ops::connect(&standby.conn_string(&db.name)).await;
    assert!(
        ops::slot_row(&new_primary, &outbox.slot).await.is_none(),
        "the slot must not be recreated on the new primary"
    );
}

/// `check` with a standby named in OUTBOXD_CHECK_STANDBYS: all ok when slot sync is set
/// up, and each setting broken on its own is named.
#[tokio::test(flavor = "multi_thread")]
async fn check_names_each_missing_failover_setting() {
    let primary = PgCluster::start(ClusterOptions::default()).expect("primary");
    if primary.major_version() < 17 {
        eprintln!("skipped: failover slots need PostgreSQL 17");
        return;
    }
    let db = primary.fresh_database("failover_check").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert'); \
             SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}')",
            schema::OUTBOX_DDL,
            db.publication
        ))
        .await
        .expect("schema");
    drop(client);
    let standby = primary
        .start_standby(
            STANDBY_SLOT,
            ClusterOptions {
                conf: vec!["sync_replication_slots = on".into()],
                ..ClusterOptions::default()
            },
        )
        .expect("standby");
    let client = db.client().await;
    alter(
        &client,
        "synchronized_standby_slots",
        &format!("'{STANDBY_SLOT}'"),
    )
    .await;
    let outbox = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    // The dead-letter topic check verifies (the event topics have no rows to name them).
    ops::create_topics(&broker, &outbox).await;
    let standbys = format!("127.0.0.1:{}", standby.port());
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_CHECK_STANDBYS", &standbys)],
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let standby_client = ops::connect(&standby.conn_string(&db.name)).await;
    wait_for(
        "the slot to be synced and persisted on the standby",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            synced_on_standby(&standby_client, &outbox.slot)
                .await
                .then_some(())
        },
    )
    .await;
    wait_for(
        "check to pass",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let (code, out) = run_to_end(&env, &["check"]);
            (code == 0).then_some(out)
        },
    )
    .await;

    let conninfo_without_dbname = format!(
        "'host=127.0.0.1 port={} user=postgres application_name=standby'",
        primary.port()
    );
    for (setting, bad) in [
        ("sync_replication_slots", "off"),
        ("hot_standby_feedback", "off"),
        ("primary_slot_name", "''"),
        ("primary_conninfo", conninfo_without_dbname.as_str()),
    ] {
        alter(&standby_client, setting, bad).await;
        let (code, out) = run_to_end(&env, &["check"]);
        assert_eq!(code, 6, "{setting} = {bad}:\n{out}");
        let line = format!("FAIL  standby {standbys} {setting}");
        assert!(
            out.lines().any(|l| l.starts_with(&line)),
            "{setting} = {bad} is named:\n{out}"
        );
        reset(&standby_client, setting).await;
    }
    // The primary's side: without synchronized_standby_slots a promoted standby may lack
    // what outboxd published; a warning, since nothing is broken until a failover.
    reset(&client, "synchronized_standby_slots").await;
    let (_, out) = run_to_end(&env, &["check"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("warn  synchronized_standby_slots")),
        "{out}"
    );
}

/// ALTER SYSTEM, reload, and wait until new sessions see the value.
async fn alter(client: &Client, setting: &str, value: &str) {
    client
        .batch_execute(&format!("ALTER SYSTEM SET {setting} = {value}"))
        .await
        .expect("alter system");
    reload_and_wait(client, setting).await;
}

async fn reset(client: &Client, setting: &str) {
    client
        .batch_execute(&format!("ALTER SYSTEM RESET {setting}"))
        .await
        .expect("alter system reset");
    reload_and_wait(client, setting).await;
}

async fn setting_value(client: &Client, setting: &str) -> String {
    client
        .query_one(
            "SELECT setting FROM pg_settings WHERE name = $1",
            &[&setting],
        )
        .await
        .expect("pg_settings")
        .get(0)
}

async fn reload_and_wait(client: &Client, setting: &str) {
    let before = setting_value(client, setting).await;
    client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    // The server applies a reload asynchronously: wait until this session sees it. Every
    // caller changes the value; a reload that is not seen in time fails here, where it
    // is clear, rather than as a wrong `check` result afterwards (the former 5 s loop
    // then went on silently).
    wait_for(
        &format!("{setting} to change after a reload"),
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (setting_value(client, setting).await != before).then_some(()) },
    )
    .await;
}
