//! Two fixes outboxd prints for a sharded outbox, followed literally end to end: the one
//! for a lowered OUTBOXD_SHARD_COUNT (with the warning about the slots and publications
//! of the shards it leaves behind), and the one for a detached table named like a shard's
//! partition whose rows no slot decoded. Every event must reach the topic, in order per
//! aggregate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use support::load::{insert_events, make_events, try_insert, Event};
use support::ops;
use support::relay::run_to_end;

use crate::shard_changes::{between, run_printed_init, shard_env, UnderLoad};
use crate::shards::{shard_slot, start_relaying, wait_shards_confirmed};

/// The line of `outboxd check`'s output warning of shards beyond the count, if any.
fn leftover_warning(checked: &str) -> Option<&str> {
    checked
        .lines()
        .find(|l| l.starts_with("warn  shards:") && l.contains("of shards beyond"))
}

/// One transaction of 200 events over 20 aggregates of its own (`late-<k>`), begun before
/// the load's next 100 events and committed after them. `now()`, the `created_at`
/// default, is a transaction's start: with writers that commit out of start order, as
/// concurrent ones do, the table is not in `created_at` order.
async fn begun_before_committed_after(s: &UnderLoad) -> Vec<Event> {
    let late = s.db.client().await;
    late.batch_execute("BEGIN; SELECT now()").await.unwrap();
    let more = s.load.committed() + 100;
    s.load.wait_committed(more, Duration::from_secs(60)).await;
    let batch: Vec<Event> = make_events(200, 20)
        .into_iter()
        .map(|mut e| {
            e.aggregate_id = e.aggregate_id.replace("agg-", "late-");
            e
        })
        .collect();
    try_insert(&late, &s.o.table, &batch).await.unwrap();
    late.batch_execute("COMMIT").await.unwrap();
    batch
}

/// `DROP TABLE` of the tables a fix names in `list` ("a, b"), as its "drop those tables"
/// says.
async fn drop_tables(client: &tokio_postgres::Client, list: &str) {
    let statement = format!("DROP TABLE {list}");
    client
        .batch_execute(&statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Four shards relayed while the application writes (and never deletes); outboxd stopped
/// and started with OUTBOXD_SHARD_COUNT=2: `run` refuses the layout and prints the fix,
/// which is followed literally (its transaction, then `outboxd init` as printed), then
/// outboxd with two shards. Then `outboxd check` warns of shards 2 and 3's slots and
/// publications; once every shard's slot confirmed past the fix's COMMIT, its drop
/// statements are run as printed (and the fix's detached tables dropped, as it says), and
/// `check` passes without the warning. Every event arrives, in order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_the_shard_count_by_the_printed_fix_loses_nothing() {
    let mut s = UnderLoad::start_sharded("shards_lower_fix", 4).await;
    s.relay.signal("TERM");
    let status = s.relay.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", s.relay.log_text());
    // Rows written while no relay runs: those of shards 2 and 3 reach the topic only by
    // the fix's copy. Among them several events of one aggregate in one transaction,
    // with a later-begun transaction committed before it.
    let more = s.load.committed() + 200;
    s.load.wait_committed(more, Duration::from_secs(60)).await;
    let late = begun_before_committed_after(&s).await;

    let two = shard_env(&s.db, &s.o, &s.broker, 2);
    let (code, out) = run_to_end(&two, &["run"]);
    assert_eq!(code, 3, "`outboxd run` with 2 shards on 4:\n{out}");
    assert!(
        out.contains("of public.outbox has modulus 4, but OUTBOXD_SHARD_COUNT=2"),
        "{out}"
    );
    // Its warning for an application that deletes its rows as it writes them: this one
    // keeps them, so the copy reaches every row shards 2 and 3 did not relay.
    assert!(
        out.contains("If the application deletes its outbox rows as it writes them, do not lower the count with this transaction"),
        "{out}"
    );
    // "run `outboxd check`, and if it fails `publication unchanged`, follow that error
    // first": it does not (the application's writes go on here, the harder case).
    let (_, checked) = run_to_end(&two, &["check"]);
    assert!(
        !checked.contains("FAIL  publication unchanged"),
        "{checked}"
    );
    // The two shards that remain have their publications and slots: nothing before the
    // transaction.
    assert!(!out.contains("each statement on its own"), "{out}");
    let fix = between(&out, " shards, run: ", " then run `outboxd");
    s.client
        .batch_execute(fix)
        .await
        .unwrap_or_else(|e| panic!("the printed fix failed: {e}\n{fix}"));
    // "read SELECT pg_current_wal_lsn() after COMMIT".
    let committed = support::schema::current_wal_lsn(&s.db).await;
    run_printed_init(&out, &two);
    let _relay = start_relaying(two.clone(), &s.client, &s.o, 2).await;

    let (code, checked) = run_to_end(&two, &["check"]);
    assert_eq!(code, 0, "`outboxd check` after the fix:\n{checked}");
    let warning = leftover_warning(&checked)
        .unwrap_or_else(|| panic!("no warning of shards 2 and 3:\n{checked}"));
    for i in [2, 3] {
        assert!(warning.contains(&shard_slot(&s.o, i)), "{warning}");
        assert!(
            warning.contains(&format!("{}_{i}", s.o.publication)),
            "{warning}"
        );
    }
    let drops = between(warning, "no outboxd process relays them, run: ", "\n");
    // The same statements as the fix's own ending.
    assert!(out.contains(drops), "{drops}\n{out}");
    // "every shard's slot confirmed past that".
    wait_shards_confirmed(&s.client, &s.o, 2, committed).await;
    s.client
        .batch_execute(drops)
        .await
        .unwrap_or_else(|e| panic!("the printed drops failed: {e}\n{drops}"));
    // "drop those tables once outboxd has relayed past the COMMIT": the copied ones and
    // the ones set aside.
    drop_tables(
        &s.client,
        between(
            &out,
            "The transaction inserts again the rows of ",
            ", which no remaining",
        ),
    )
    .await;
    drop_tables(
        &s.client,
        between(
            &out,
            ". The rows of ",
            " were relayed by a shard that remains",
        ),
    )
    .await;
    let (code, checked) = run_to_end(&two, &["check"]);
    assert_eq!(code, 0, "`outboxd check` after the drops:\n{checked}");
    assert!(leftover_warning(&checked).is_none(), "{checked}");
    for i in [2, 3] {
        assert!(ops::slot_row(&s.client, &shard_slot(&s.o, i))
            .await
            .is_none());
    }

    let UnderLoad {
        db,
        broker,
        topics,
        load,
        ..
    } = s;
    let more = load.committed() + 300;
    load.wait_committed(more, Duration::from_secs(60)).await;
    let mut events = load.stop().await;
    events.extend(late);
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(120));
    assert_eq!(report.unique, events.len());
    drop(db);
}

/// Remainder 1 of two shards split into partitions of modulus 4 named like shards 1 and 3,
/// while the relay runs and the application writes.
const SPLIT_UNDER_SHARD_NAMES: &str = "BEGIN;
         ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1;
         ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_of_2;
         CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox
             FOR VALUES WITH (MODULUS 4, REMAINDER 1);
         CREATE TABLE public.outbox_shard_3 PARTITION OF public.outbox
             FOR VALUES WITH (MODULUS 4, REMAINDER 3);
         COMMIT;";

/// The split reverted by hand: the old partition attached again and the rows of the
/// partition renamed out of its way copied back through the table, while
/// `outbox_shard_3`, which kept its name, is only detached: its rows stay where no slot
/// decoded them.
const REVERTED_BUT_ONE: &str = "BEGIN;
         ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1;
         ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_3;
         ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_of_4;
         ALTER TABLE public.outbox_shard_1_of_2 RENAME TO outbox_shard_1;
         ALTER TABLE public.outbox ATTACH PARTITION public.outbox_shard_1
             FOR VALUES WITH (MODULUS 2, REMAINDER 1);
         INSERT INTO public.outbox SELECT * FROM public.outbox_shard_1_of_4 ORDER BY created_at, ctid;
         DROP TABLE public.outbox_shard_1_of_4;
         COMMIT;";

/// A split of a remainder under load (the relay stops, exit 3), the writes stopped, and
/// the split reverted by hand but for one partition, left detached with the rows written
/// to it: `outboxd run` refuses the table named like shard 3's partition that no
/// publication holds, and the fix it prints, followed literally, copies its rows back
/// through the table. `check` passes; every event arrives, the detached table's too, in
/// order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranded_detached_table_is_copied_back_by_the_printed_fix() {
    let (s, _) = UnderLoad::migrate("shards_stranded", SPLIT_UNDER_SHARD_NAMES).await;
    // Rows written to the split partitions, several events of one aggregate in a
    // transaction that a later-begun one committed before, then the writes stopped, as
    // the fix asks.
    let more = s.load.committed() + 300;
    s.load.wait_committed(more, Duration::from_secs(60)).await;
    let late = begun_before_committed_after(&s).await;
    let UnderLoad {
        db,
        o,
        broker,
        topics,
        client,
        env,
        load,
        ..
    } = s;
    let mut events = load.stop().await;
    events.extend(late);
    let stranded: Vec<String> = client
        .query("SELECT id::text FROM public.outbox_shard_3", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!stranded.is_empty(), "no row was written to outbox_shard_3");
    client.batch_execute(REVERTED_BUT_ONE).await.unwrap();

    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 3, "`outboxd run` with a stranded table:\n{out}");
    assert!(
        out.contains("public.outbox_shard_3 is no partition of public.outbox and no shard's publication holds it"),
        "{out}"
    );
    let (_, checked) = run_to_end(&env, &["check"]);
    assert!(
        !checked.contains("FAIL  publication unchanged"),
        "{checked}"
    );
    let fix = between(&out, " shards, run: ", " then run `outboxd");
    assert!(fix.contains("outbox_shard_3"), "{fix}");
    client
        .batch_execute(fix)
        .await
        .unwrap_or_else(|e| panic!("the printed fix failed: {e}\n{fix}"));
    let committed = support::schema::current_wal_lsn(&db).await;
    run_printed_init(&out, &env);
    let (code, checked) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "`outboxd check` after the fix:\n{checked}");

    // outboxd started; the writes resume.
    let _relay = start_relaying(env.clone(), &client, &o, 2).await;
    events.extend(insert_events(&client, &o.table, 300, 8, 40).await);
    // "drop those tables once outboxd has relayed past the COMMIT".
    wait_shards_confirmed(&client, &o, 2, committed).await;
    drop_tables(
        &client,
        between(
            &out,
            "The transaction inserts again the rows of ",
            ", which no remaining",
        ),
    )
    .await;
    let (code, checked) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "`outboxd check` after the drop:\n{checked}");

    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(120));
    assert_eq!(report.unique, events.len());
    assert!(
        stranded.iter().all(|id| events.iter().any(|e| &e.id == id)),
        "the detached table held rows the load did not commit"
    );
    drop(db);
}
