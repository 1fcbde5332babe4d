//! A publication change committed but not yet visible (issue 30, item 2). With
//! synchronous replication, a commit waits for the standby after it is in the WAL: the
//! walsender decodes it, and the rows after it by the new catalog, while every query still
//! sees the old one. A look at the catalog taken meanwhile matches, yet cannot vouch for
//! the WAL before it: the slot must not be confirmed past the rows the change hid, and
//! the error that follows, once the change is visible, must name a time they are after.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::insert_events;
use support::ops::{self, read_all_blocking, wait_active_pid, wait_for};
use support::relay::{run_to_end, Relay};
use support::schema;

/// The error's "re-publish the outbox rows committed since {since}".
fn republish_since_in(log: &str) -> String {
    let (_, rest) = log
        .split_once("re-publish the outbox rows committed since ")
        .unwrap_or_else(|| panic!("no re-publish time in the relay's error: {log}"));
    rest.split([',', ' ']).next().expect("a time").to_owned()
}

/// Runs `sql` with `synchronous_commit = on` in a session of its own, until its commit
/// waits for the standby (its pid and task), or ends without waiting (None; a panic if it
/// failed).
async fn commit_waiting_for_the_standby(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
    sql: String,
) -> Option<(i32, tokio::task::JoinHandle<()>)> {
    let session = db.client().await;
    let pid: i32 = session
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    let commit = tokio::spawn(async move {
        session
            .batch_execute(&format!("SET synchronous_commit = on; {sql}"))
            .await
            .expect("the commit succeeds, once its wait is cancelled");
    });
    let waits = wait_for(
        "the commit to wait for the standby, or to end",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            let row = client
                .query_opt(
                    "SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .expect("activity");
            match row {
                Some(row) if row.get::<_, String>(0) == "SyncRep" => Some(true),
                _ if commit.is_finished() => Some(false),
                _ => None,
            }
        },
    )
    .await;
    if waits {
        return Some((pid, commit));
    }
    commit.await.expect("the commit");
    None
}

/// A reload is asynchronous: commits wait only once the checkpointer has read the new
/// standby list. Until a probe commit is seen waiting, the change could commit at once.
/// (The probe writes a row: a commit that wrote no WAL before its record never waits.)
async fn wait_commits_wait_for_the_standby(
    db: &pgtest::TestDb<'_>,
    client: &tokio_postgres::Client,
) {
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS sync_probe (x int)")
        .await
        .expect("the probe's table");
    wait_for(
        "a probe commit to wait for the standby",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async {
            let probe = "INSERT INTO sync_probe VALUES (1)".to_owned();
            let (pid, commit) = commit_waiting_for_the_standby(db, client, probe).await?;
            client
                .execute("SELECT pg_cancel_backend($1)", &[&pid])
                .await
                .expect("cancel the probe's wait");
            commit.await.expect("the probe");
            Some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_waiting_for_a_synchronous_standby_hides_no_rows() {
    // Sessions that do not ask for more commit locally: the test's own work never waits.
    let cluster = PgCluster::start(pgtest::ClusterOptions {
        conf: vec!["synchronous_commit = local".into()],
        ..Default::default()
    })
    .expect("cluster");
    let db = cluster.fresh_database("invisible_commit").await;
    let client = db.client().await;
    let outbox = schema::setup_without_slot(&db).await;
    let broker = Broker::default_for_tests();
    let extra = [("OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS", "1000")];
    let ops::FirstBatch {
        mut relay,
        env,
        topics,
        first,
    } = ops::relay_first_batch(&db, &client, &outbox, &broker, &extra, 10).await;

    // The synchronous standby goes away: every commit that asks for it waits.
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = 'ghost'",
        "SELECT pg_reload_conf()",
    ] {
        client
            .batch_execute(sql)
            .await
            .expect("a synchronous standby");
    }
    wait_commits_wait_for_the_standby(&db, &client).await;

    // The change, committed and in the WAL, waiting for the standby: invisible.
    let change = format!(
        "ALTER PUBLICATION \"{}\" DROP TABLE public.outbox",
        outbox.publication
    );
    let (ddl_pid, change) = commit_waiting_for_the_standby(&db, &client, change)
        .await
        .expect("the change waits for the standby: commits wait since the probe did");
    let before_rows = schema::current_wal_lsn(&db).await;
    let hidden = insert_events(&client, &outbox.table, 20, 3, 3).await;
    // Seconds later (a look's time names whole seconds), more WAL, in a table nobody
    // publishes.
    ops::wait_clock_past_rows(&client).await;
    client
        .batch_execute("CREATE TABLE later AS SELECT 1 AS x")
        .await
        .expect("more WAL");
    let past_rows = schema::current_wal_lsn(&db).await;

    // The stream has gone past the rows (keepalives: the walsender sent none of them).
    // Looks keep matching the old catalog; unfixed, the next one confirmed the slot past
    // the rows, and named a time after them once the change was seen.
    relay
        .wait_metric_at_least("outboxd_acked_lsn", past_rows as f64)
        .await;
    wait_for(
        "the slot confirmed past the rows, or two looks that could not count",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            let confirmed = relay.metric("outboxd_confirmed_lsn").unwrap_or(0.0);
            let unsettled = relay
                .metric("outboxd_publication_looks_unsettled_total")
                .unwrap_or(0.0);
            (confirmed >= past_rows as f64 || unsettled >= 2.0).then_some(())
        },
    )
    .await;
    let confirmed = schema::confirmed_flush_lsn(&db).await;
    assert!(
        confirmed < before_rows,
        "the slot was confirmed to {confirmed:#x}, past the change's commit (before {before_rows:#x}) while it was invisible"
    );

    // The standby's wait is given up: the change is visible, and the relay stops.
    client
        .execute("SELECT pg_cancel_backend($1)", &[&ddl_pid])
        .await
        .expect("cancel the wait");
    change.await.expect("the change");
    assert_eq!(
        relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "the change must stop outboxd: {}",
        relay.log_text()
    );
    let since = republish_since_in(&relay.log_text());

    // Its error, followed literally: make sure the publication publishes the outbox's
    // inserts, re-publish the rows committed since `since` minus the longest transaction
    // (a second here), accept, start.
    let (code, out) = run_to_end(&env, &["check"]);
    assert_ne!(code, 0, "check must fail on the changed publication: {out}");
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{}\" ADD TABLE public.outbox",
            outbox.publication
        ))
        .await
        .expect("publish the outbox again");
    let from: String = client
        .query_one(
            "SELECT ($1::text::timestamptz - interval '1 second')::text",
            &[&since],
        )
        .await
        .expect("since")
        .get(0);
    schema::republish_since(&client, &from).await;
    // The standby is still missing: no look can vouch for the catalog, and `init` says
    // so; its fix followed (the standby list emptied), it accepts.
    let (code, out) = run_to_end(&env, &["init", "--accept-publication-change"]);
    assert_ne!(code, 0, "{out}");
    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = ''",
        "SELECT pg_reload_conf()",
    ] {
        client
            .batch_execute(sql)
            .await
            .expect("no synchronous standbys");
    }
    let (code, out) = ops::wait_for(
        "init to accept once the reload is seen",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let (code, out) = run_to_end(&env, &["init", "--accept-publication-change"]);
            (code == 0).then_some((code, out))
        },
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let after = insert_events(&client, &outbox.table, 5, 3, 3).await;
    let all = [first, hidden, after].concat();
    check_delivery(
        &all,
        &read_all_blocking(&broker.bootstrap(), &topics, &all, Duration::from_secs(60)),
    );
    drop(relay);
}
