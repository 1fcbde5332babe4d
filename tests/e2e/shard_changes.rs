//! Changing a sharded outbox's layout, by following what outboxd tells an operator
//! literally: the documented way to change the shard count (docs/operations.md, "Sharding:
//! adding shards or changing their count"), and the remedy of the error a running relay
//! stops with when a partition no shard reads appears. Every event must reach the topic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::{insert_events, Event, EVENT_COLUMNS};
use support::ops::{self, read_all_blocking, wait_active_pid, wait_for, LoadGen, LoadShape};
use support::relay::{run_to_end, Relay};
use support::schema::Outbox;

use crate::shards::{shard_slot, start_relaying, wait_shards_confirmed};

pub(crate) fn shard_env(
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

const RUNBOOK: &str = include_str!("../../docs/operations.md");
pub(crate) const SHARD_GUARD: &str = include_str!("../../sql/shard-guard.sql");

/// A migration that splits shard 1's remainder into two partitions of modulus 4, which no
/// shard's publication holds.
const SPLIT_REMAINDER: &str = "BEGIN;
         ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1;
         CREATE TABLE public.outbox_m4_1 PARTITION OF public.outbox
             FOR VALUES WITH (MODULUS 4, REMAINDER 1);
         CREATE TABLE public.outbox_m4_3 PARTITION OF public.outbox
             FOR VALUES WITH (MODULUS 4, REMAINDER 3);
         COMMIT;";

/// A migration that recreates shard 1's partition under another name, which shard 1's
/// publication does not hold.
const RECREATED_ELSEWHERE: &str = "BEGIN;
         ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1;
         ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_before;
         CREATE TABLE public.outbox_p1 PARTITION OF public.outbox
             FOR VALUES WITH (MODULUS 2, REMAINDER 1);
         COMMIT;";

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
    let mut relay = start_relaying(two.clone(), &client, &o, 2).await;
    let mut events: Vec<Event> = insert_events(&client, &o.table, 1_000, 8, 40).await;

    // 1. Writes stopped. 2. Every shard has relayed everything.
    let wal = support::schema::current_wal_lsn(&db).await;
    wait_shards_confirmed(&client, &o, 2, wal).await;
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
    let _relay = start_relaying(three, &client, &o, 3).await;
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
    let _relay = start_relaying(env, &client, &o, 3).await;
    let events = insert_events(&client, &o.table, 600, 8, 40).await;
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(90));
    assert_eq!(report.unique, 600);
}

/// The last line of the relay's log that says why it stopped.
pub(crate) fn stop_reason(relay: &Relay) -> String {
    relay
        .log_text()
        .lines()
        .rev()
        .find(|l| l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no ERROR line:\n{}", relay.log_text()))
        .to_owned()
}

/// The text between `after` and the next `until` in `text`.
pub(crate) fn between<'a>(text: &'a str, after: &str, until: &str) -> &'a str {
    let rest = text
        .split(after)
        .nth(1)
        .unwrap_or_else(|| panic!("no {after:?} in: {text}"));
    rest.split(until).next().unwrap_or(rest)
}

/// The `outboxd init ...` a layout fix says to run after its COMMIT, run as printed.
pub(crate) fn run_printed_init(fix: &str, env: &[(String, String)]) {
    let command = between(fix, "COMMIT; then run `outboxd ", "`");
    let args: Vec<&str> = command.split_whitespace().collect();
    let (code, out) = run_to_end(env, &args);
    assert_eq!(code, 0, "`outboxd {command}`:\n{out}");
}

/// `outboxd check`'s fixes, run as printed (the statement of the first FAIL that names
/// one), until no FAIL but `publication unchanged` is left: what "Make sure it publishes
/// the outbox's inserts (`outboxd check`)" asks.
async fn follow_check(env: &[(String, String)], client: &tokio_postgres::Client) -> usize {
    for round in 0..5 {
        let (_, out) = run_to_end(env, &["check"]);
        let fails: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("FAIL") && !l.starts_with("FAIL  publication unchanged"))
            .collect();
        if fails.is_empty() {
            return round;
        }
        let statement = fails
            .iter()
            .find_map(|l| l.split_once("ALTER ").map(|(_, s)| s))
            .map(|s| format!("ALTER {}", s.split(';').next().unwrap_or(s)))
            .unwrap_or_else(|| panic!("no FAIL names a statement:\n{out}"));
        eprintln!("check says: {statement}");
        client.batch_execute(&statement).await.unwrap();
    }
    panic!("`outboxd check` still fails after 5 fixes");
}

/// Shards (two, unless [`UnderLoad::start_sharded`]) relayed by one process while the
/// application writes, and a migration run meanwhile that the relay must stop on (exit 3).
pub(crate) struct UnderLoad {
    pub(crate) db: pgtest::TestDb<'static>,
    pub(crate) o: Outbox,
    pub(crate) broker: Broker,
    pub(crate) topics: Vec<String>,
    pub(crate) client: tokio_postgres::Client,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) relay: Relay,
    pub(crate) load: LoadGen,
}

impl UnderLoad {
    /// Two shards relayed while the application writes: 300 events committed so far.
    pub(crate) async fn start(name: &str) -> UnderLoad {
        UnderLoad::start_sharded(name, 2).await
    }

    /// [`UnderLoad::start`] with `count` shards.
    pub(crate) async fn start_sharded(name: &str, count: u32) -> UnderLoad {
        let db = PgCluster::shared().fresh_database(name).await;
        let o = Outbox::for_db(&db);
        let broker = Broker::default_for_tests();
        let topics = ops::create_topics(&broker, &o).await;
        let client = db.client().await;
        let env = shard_env(&db, &o, &broker, count);
        init(&env);
        let relay = start_relaying(env.clone(), &client, &o, count).await;
        let load = LoadGen::spawn(db.conn_string(), o.table.clone(), LoadShape::default());
        load.wait_committed(300, Duration::from_secs(60)).await;
        UnderLoad {
            db,
            o,
            broker,
            topics,
            client,
            env,
            relay,
            load,
        }
    }

    /// Runs `ddl` under load; returns the scenario and why the relay stopped.
    pub(crate) async fn migrate(name: &str, ddl: &str) -> (UnderLoad, String) {
        let mut s = UnderLoad::start(name).await;
        s.client.batch_execute(ddl).await.unwrap();
        let status = s.relay.wait_exit(Duration::from_secs(60));
        assert_eq!(status.code(), Some(3), "{}", s.relay.log_text());
        let reason = stop_reason(&s.relay);
        (s, reason)
    }

    /// Rows in `tables`: written where no shard's slot decodes them.
    pub(crate) async fn rows_in(&self, tables: &[&str]) -> i64 {
        let mut n = 0;
        for t in tables {
            let rows: i64 = self
                .client
                .query_one(&format!("SELECT count(*) FROM {t}"), &[])
                .await
                .unwrap()
                .get(0);
            n += rows;
        }
        n
    }

    /// outboxd started again, streaming from every shard's slot.
    pub(crate) async fn restart(mut self) -> UnderLoad {
        self.relay.restart();
        for i in 0..2 {
            wait_active_pid(
                &self.client,
                &shard_slot(&self.o, i),
                Duration::from_secs(120),
            )
            .await;
        }
        self
    }

    /// outboxd started again; 300 more events; every event of the load must arrive.
    async fn restart_and_check(self) {
        let s = self.restart().await;
        s.check().await;
    }

    /// 300 more events; every event of the load must arrive.
    pub(crate) async fn check(self) {
        let committed = self.load.committed();
        self.load
            .wait_committed(committed + 300, Duration::from_secs(60))
            .await;
        let events = self.load.stop().await;
        // Waits for every committed event, and fails naming how many never arrived.
        read_all_blocking(
            &self.broker.bootstrap(),
            &self.topics,
            &events,
            Duration::from_secs(120),
        );
        drop(self.db);
    }
}

/// A migration recreates shard 1's partition under another name while the relay runs and
/// the application writes: shard 1's publication no longer holds the partition the rows
/// go to. The relay stops (exit 3), and the operator follows what it prints, in its order,
/// while the writes go on. Every event arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_recreated_under_another_name_loses_nothing_by_the_remedy() {
    let (s, reason) = UnderLoad::migrate("shards_renamed", RECREATED_ELSEWHERE).await;
    let stranded = s.rows_in(&["public.outbox_p1"]).await;
    assert!(stranded > 0, "no row was written to the new partition");
    // 1. "Make sure it publishes the outbox's inserts (`outboxd check`)".
    let fixes = follow_check(&s.env, &s.client).await;
    assert!(fixes >= 2, "the rename and the publication: {fixes} fixes");
    // 2. "run `outboxd init --accept-publication-change`".
    let command = between(&reason, "run `outboxd ", "`");
    let args: Vec<&str> = command.split_whitespace().collect();
    let (code, out) = run_to_end(&s.env, &args);
    assert_eq!(code, 0, "`outboxd {command}`:\n{out}");
    // 3. "re-publish the outbox rows committed since <time>, minus your longest
    // transaction": the runbook's statement, with the time minus a margin.
    let since = between(&reason, "committed since ", ",");
    let from: String = s
        .client
        .query_one(
            "SELECT ($1::text::timestamptz - interval '30 seconds')::text",
            &[&since],
        )
        .await
        .unwrap()
        .get(0);
    let republish =
        runbook_block("A lost slot: re-publishing", "sql").replace("2026-12-01 09:00:00+00", &from);
    s.client.batch_execute(&republish).await.unwrap();
    // 4. "and start outboxd".
    assert!(reason.contains("and start outboxd"), "{reason}");
    s.restart().await.check().await;
}

/// A remainder split into two partitions of modulus 4 while the relay runs and the
/// application writes: their rows are in no shard's publication. The relay stops (exit
/// 3) and prints the statements that make the table two shards again; run as printed,
/// then outboxd started, every event arrives, the split partitions' rows included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repartitioning_while_running_stops_and_the_printed_fix_loses_nothing() {
    let (s, reason) = UnderLoad::migrate("shards_repartition", SPLIT_REMAINDER).await;
    let stranded = s
        .rows_in(&["public.outbox_m4_1", "public.outbox_m4_3"])
        .await;
    assert!(stranded > 0, "no row was written to the split partitions");
    // As printed, its BEGIN and COMMIT included.
    let fix = between(&reason, " shards, run: ", " then run `outboxd");
    s.client
        .batch_execute(fix)
        .await
        .unwrap_or_else(|e| panic!("the printed fix failed: {e}\n{fix}"));
    run_printed_init(&reason, &s.env);
    let (code, out) = run_to_end(&s.env, &["check"]);
    assert_eq!(code, 0, "`outboxd check` after the fix:\n{out}");
    s.restart_and_check().await;
}

/// The printed fix run where `default_transaction_isolation` is repeatable read, while a
/// transaction of the application with rows in a split partition is still open (stopping
/// the writes does not end one already in flight): DETACH waits for it, and the copies
/// must still read its rows once it commits. A fix that began with a bare BEGIN took its
/// snapshot as DETACH began, before the wait, and left them in a table no slot decodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_fix_under_repeatable_read_copies_a_transaction_in_flight() {
    let (s, reason) = UnderLoad::migrate("shards_fix_rr", SPLIT_REMAINDER).await;
    let UnderLoad {
        db,
        broker,
        topics,
        client,
        env,
        mut relay,
        load,
        ..
    } = s;
    // "Stop the application's writes".
    let mut events = load.stop().await;
    client
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name
        ))
        .await
        .unwrap();
    let mut writer = db.client().await;
    let open = writer.transaction().await.unwrap();
    let mut late = Vec::new();
    for i in 0..40 {
        let row = open
            .query_one(
                &format!(
                    "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
                     VALUES (gen_random_uuid(), 'order', 'late-{i}', 'Changed', '{{}}')
                     RETURNING {EVENT_COLUMNS}"
                ),
                &[],
            )
            .await
            .unwrap();
        late.push(Event::from_row(&row));
    }
    let in_split: i64 = open
        .query_one(
            "SELECT (SELECT count(*) FROM public.outbox_m4_1) + (SELECT count(*) FROM public.outbox_m4_3)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        in_split > 0,
        "no row of the open transaction is in a split partition"
    );
    // As printed, on a new session (which takes the database's default isolation).
    let fix = between(&reason, " shards, run: ", " then run `outboxd").to_owned();
    let fixer = db.client().await;
    let fixing = tokio::spawn(async move { fixer.batch_execute(&fix).await.map(|()| fix) });
    wait_for(
        "the fix to wait for the open transaction's lock",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            let waiting: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (waiting > 0).then_some(())
        },
    )
    .await;
    open.commit().await.unwrap();
    let fixed = fixing.await.unwrap();
    fixed.unwrap_or_else(|e| panic!("the printed fix failed: {e}"));
    run_printed_init(&reason, &env);
    relay.restart();
    let o = Outbox::for_db(&db);
    for i in 0..2 {
        wait_active_pid(&client, &shard_slot(&o, i), Duration::from_secs(120)).await;
    }
    events.extend(late);
    read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
}

/// OUTBOXD_SHARD_COUNT raised from 2 to 4 on a running outbox while the application
/// writes: `outboxd run` refuses the layout and prints what to do, which is followed
/// literally: the new shards' publications and slots first, each statement on its own,
/// then the transaction that lays the table out as four shards, then `outboxd init`,
/// then outboxd with the new count. Every event arrives. (The fix once named
/// publications that did not exist yet, so its transaction failed as printed; and left
/// to itself, rows reached the new partitions before their slots existed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_shard_count_by_the_printed_fix_loses_nothing() {
    let mut s = UnderLoad::start("shards_raise_fix").await;
    // With the optional guard installed: the printed fix gets past it.
    s.client.batch_execute(SHARD_GUARD).await.unwrap();
    s.relay.signal("TERM");
    let status = s.relay.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", s.relay.log_text());

    let four = shard_env(&s.db, &s.o, &s.broker, 4);
    let (code, out) = run_to_end(&four, &["run"]);
    assert_eq!(code, 3, "`outboxd run` with 4 shards on 2:\n{out}");
    // "run `outboxd check`, and if it fails `publication unchanged`, follow that error
    // first": it does not (the application's writes go on here, the harder case).
    let (_, checked) = run_to_end(&four, &["check"]);
    assert!(
        !checked.contains("FAIL  publication unchanged"),
        "{checked}"
    );
    let first = between(
        &out,
        "(a slot cannot be created in a transaction that wrote): ",
        " Then, to lay",
    );
    for statement in first.trim_end_matches('.').split("; ") {
        s.client
            .batch_execute(statement)
            .await
            .unwrap_or_else(|e| panic!("the printed statement failed: {e}\n{statement}"));
    }
    let fix = between(&out, " shards, run: ", " then run `outboxd");
    s.client
        .batch_execute(fix)
        .await
        .unwrap_or_else(|e| panic!("the printed fix failed: {e}\n{fix}"));
    run_printed_init(&out, &four);
    let _relay = start_relaying(four, &s.client, &s.o, 4).await;
    s.check().await;
}

/// sql/shard-guard.sql, installed as written: the migration that stranded rows in
/// partitions no shard's publication held (a remainder split into modulus 4) is refused,
/// and nothing of it happens: the layout stays two shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_guard_refuses_a_partition_no_publication_holds() {
    let db = PgCluster::shared().fresh_database("shards_guard").await;
    let o = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    ops::create_topics(&broker, &o).await;
    let client = db.client().await;
    let env = shard_env(&db, &o, &broker, 2);
    init(&env);
    client.batch_execute(SHARD_GUARD).await.unwrap();
    for migration in [SPLIT_REMAINDER, RECREATED_ELSEWHERE] {
        let refused = client.batch_execute(migration).await;
        let e = refused.expect_err("the guard lets the migration through");
        assert!(
            format!("{e:?}").contains("that no publication holds"),
            "{e:?}"
        );
        client.batch_execute("ROLLBACK").await.unwrap();
        let (code, out) = run_to_end(&env, &["check"]);
        assert_eq!(code, 0, "the layout after a refused migration:\n{out}");
    }
}
