//! Changing a sharded outbox's layout, by following what outboxd tells an operator
//! literally: the documented way to change the shard count (docs/operations.md, "Sharding:
//! adding shards or changing their count"), and the remedy of the error a running relay
//! stops with when a partition no shard reads appears. Every event must reach the topic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::{insert_events, Event};
use support::ops::{self, wait_active_pid};
use support::relay::{run_to_end, Relay};
use support::schema::Outbox;

fn shard_slot(o: &Outbox, i: u32) -> String {
    format!("{}_{i}", o.slot)
}

fn shard_env(
    db: &pgtest::TestDb<'_>,
    o: &Outbox,
    broker: &Broker,
    count: u32,
) -> Vec<(String, String)> {
    let count = count.to_string();
    Relay::env_for(
        db,
        o,
        &broker.bootstrap(),
        &[("OUTBOXD_SHARD_COUNT", &count)],
    )
}

fn init(env: &[(String, String)]) {
    let (code, out) = run_to_end(env, &["init"]);
    assert_eq!(code, 0, "`outboxd init` failed:\n{out}");
}

async fn start(
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

const RUNBOOK: &str = include_str!("../../docs/operations.md");

/// The first `lang` block of the runbook's section `title`, as an operator would paste it.
fn runbook_block(title: &str, lang: &str) -> String {
    let section = RUNBOOK
        .split(&format!("\n## {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/operations.md has no section {title:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    let block = section
        .split(&format!("```{lang}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("section {title:?} has no {lang} block"));
    let block = block.split("```").next().unwrap_or_default();
    // The blocks sit in a numbered list: indented.
    block.lines().map(str::trim).collect::<Vec<_>>().join("\n")
}

/// A runbook command line `VAR=value ... outboxd <args>`: `env` with its settings, and the
/// arguments.
fn runbook_command(line: &str, env: &[(String, String)]) -> (Vec<(String, String)>, Vec<String>) {
    let mut env = env.to_vec();
    let mut words = line.split_whitespace();
    for word in words.by_ref() {
        if word == "outboxd" {
            break;
        }
        let (k, v) = word.split_once('=').expect("VAR=value before `outboxd`");
        env.retain(|(key, _)| key != k);
        env.push((k.to_owned(), v.to_owned()));
    }
    (env, words.map(str::to_owned).collect())
}

/// Step 2 of the procedure: every shard's slot confirmed at or past `wal`, the position
/// noted after writes stopped.
async fn wait_relayed(client: &tokio_postgres::Client, o: &Outbox, shards: u32, wal: u64) {
    ops::wait_for(
        "every shard's slot confirmed past the writes",
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

/// Two shards grown to three, step by step as docs/operations.md says, with events
/// before and after: all of them arrive, in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_shard_count_change_loses_nothing() {
    let db = PgCluster::shared().fresh_database("shards_recount").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let two = shard_env(&db, &o, &broker, 2);
    init(&two);
    let mut relay = start(two.clone(), &client, &o, 2).await;
    let mut events: Vec<Event> = insert_events(&client, &o.table, 1_000, 8, 40).await;

    // 1. Writes stopped. 2. Every shard has relayed everything.
    let wal = support::schema::current_wal_lsn(&db).await;
    wait_relayed(&client, &o, 2, wal).await;
    // 3. outboxd stopped.
    relay.signal("TERM");
    let status = relay.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", relay.log_text());
    // 4. The old shards' slots and publications dropped, the old table renamed away.
    let section = "Sharding: adding shards or changing their count";
    let step4 = runbook_block(section, "sql")
        .replace(
            "replication_slot('outboxd_",
            &format!("replication_slot('{}_", o.slot),
        )
        .replace(
            "PUBLICATION outboxd_",
            &format!("PUBLICATION {}_", o.publication),
        );
    client.batch_execute(&step4).await.expect("step 4's SQL");
    // 5. `outboxd init` with the new count, as the runbook writes it.
    let (three, args) = runbook_command(&runbook_block(section, "sh"), &two);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out) = run_to_end(&three, &args);
    assert_eq!(
        code,
        0,
        "step 5's `outboxd {}` failed:\n{out}",
        args.join(" ")
    );
    // 6. Started with the new count; writes resume.
    let _relay = start(three, &client, &o, 3).await;
    events.extend(insert_events(&client, &o.table, 1_500, 8, 40).await);

    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(90));
    assert_eq!(report.unique, 2_500);
}

/// The old layout's step 4 renamed the table but not its partitions: `init` then created
/// the new table without shards 0 and 1 and told the operator to run `init`, again. It
/// now refuses before creating anything, naming the statement that frees the names;
/// following it, `init` and `run` relay every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_names_old_partitions_that_hold_the_shards_names() {
    let db = PgCluster::shared().fresh_database("shards_taken").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    // An old outbox renamed away with its partitions' names left as they were.
    client
        .batch_execute(
            "CREATE TABLE public.outbox_old (id uuid NOT NULL, aggregate_id text NOT NULL,
                 PRIMARY KEY (id, aggregate_id)) PARTITION BY HASH (aggregate_id);
             CREATE TABLE public.outbox_shard_0 PARTITION OF public.outbox_old
                 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
             CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox_old
                 FOR VALUES WITH (MODULUS 2, REMAINDER 1);",
        )
        .await
        .unwrap();
    let env = shard_env(&db, &o, &broker, 3);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("public.outbox_shard_0 exists (a partition of public.outbox_old)"),
        "{out}"
    );
    let exists: bool = client
        .query_one("SELECT to_regclass('public.outbox') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!exists, "init created the table before refusing:\n{out}");
    // The statement the error names, and the same for the other taken name.
    let rename = out
        .split("(ALTER TABLE ")
        .nth(1)
        .and_then(|rest| rest.split(", and each other one").next())
        .unwrap_or_else(|| panic!("no ALTER TABLE in:\n{out}"));
    client
        .batch_execute(&format!(
            "ALTER TABLE {rename}; ALTER TABLE {}",
            rename.replace("shard_0", "shard_1")
        ))
        .await
        .unwrap();
    init(&env);
    let _relay = start(env, &client, &o, 3).await;
    let events = insert_events(&client, &o.table, 600, 8, 40).await;
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(90));
    assert_eq!(report.unique, 600);
}
