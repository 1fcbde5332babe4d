//! Renaming the slot as docs/operations.md ("Decommissioning and renaming") says, step by
//! step as written, while the application writes: every event arrives.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::ops::{self, read_all_blocking, wait_active_pid, LoadGen, LoadShape};
use support::relay::{run_to_end, Relay};
use support::schema::Outbox;

const RUNBOOK: &str = include_str!("../../docs/operations.md");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_slot_rename_loses_nothing() {
    let db = PgCluster::shared().fresh_database("slot_rename").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let env = Relay::env_for(&db, &o, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let mut old = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &o.slot, Duration::from_secs(120)).await;
    let load = LoadGen::spawn(db.conn_string(), o.table.clone(), LoadShape::default());
    load.wait_committed(500, Duration::from_secs(60)).await;

    let section = RUNBOOK
        .split("\n## Decommissioning and renaming\n")
        .nth(1)
        .expect("the runbook's section")
        .split("\n## ")
        .next()
        .unwrap();
    let new_slot = format!("{}_new", o.slot);
    // 1. The command as written, with this test's names.
    let line = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("step 1's command")
        .trim()
        .replace("outboxd_new", &new_slot);
    let mut words = line.split_whitespace();
    let assignment = words.next().unwrap();
    assert_eq!(words.next(), Some("outboxd"), "{line}");
    let (key, value) = assignment.split_once('=').unwrap();
    let mut new_env: Vec<(String, String)> =
        env.iter().filter(|(k, _)| k != key).cloned().collect();
    new_env.push((key.to_owned(), value.to_owned()));
    let args: Vec<&str> = words.collect();
    let (code, out) = run_to_end(&new_env, &args);
    assert_eq!(code, 0, "step 1, `{line}`:\n{out}");
    let position = out
        .split(&format!("ok  slot {new_slot} (created at "))
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("step 1 printed no position:\n{out}"))
        .to_owned();
    // 2. The old slot confirmed at or past it, asked as the runbook asks.
    let ask = format!(
        "SELECT confirmed_flush_lsn >= '{position}' FROM pg_replication_slots WHERE slot_name = '{}'",
        o.slot
    );
    assert!(section.contains(
        &ask.replace(&o.slot, "outboxd")
            .replace(&position, "<position>")
    ));
    ops::wait_for(
        "the old slot confirmed past the new slot's start",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let row = client.query_one(&ask, &[]).await.unwrap();
            row.get::<_, bool>(0).then_some(())
        },
    )
    .await;
    // 3. The old relay stopped, one on the new slot started.
    old.signal("TERM");
    assert_eq!(old.wait_exit(Duration::from_secs(60)).code(), Some(0));
    let _new = Relay::start(new_env, &["run"]);
    wait_active_pid(&client, &new_slot, Duration::from_secs(120)).await;
    // 4. The old slot dropped.
    client
        .batch_execute(&format!("SELECT pg_drop_replication_slot('{}')", o.slot))
        .await
        .unwrap();

    let committed = load.committed();
    load.wait_committed(committed + 500, Duration::from_secs(60))
        .await;
    let events = load.stop().await;
    // Waits for every committed event, and fails naming how many never arrived.
    read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
}
