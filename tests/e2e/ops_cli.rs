//! Operations: the subcommands an operator runs by hand (`check`, `init`, `status`) and
//! the configuration-error exit code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster, TestDb};
use support::broker::Broker;
use support::ops;
use support::relay::{run_to_end, Relay};
use support::scenario::Scenario;
use support::schema::{self, Outbox};

/// The names a test would use, without creating anything.
fn names(db: &TestDb<'_>) -> Outbox {
    Outbox::for_db(db)
}

fn fail_line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("FAIL  {what}")))
        .unwrap_or_else(|| panic!("no FAIL line for {what}:\n{out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn check_passes_on_a_good_setup() {
    let db = PgCluster::shared().fresh_database("ops_check_ok").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
    let checks: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ok") || l.starts_with("FAIL"))
        .collect();
    assert!(checks.len() >= 8, "every prerequisite is listed:\n{out}");
    assert!(checks.iter().all(|l| l.starts_with("ok")), "{out}");
    for what in [
        "postgres connection",
        "wal_level",
        "REPLICATION attribute",
        "outbox table",
        "publication",
        "slot",
        "replication connection",
        "kafka",
    ] {
        assert!(
            checks
                .iter()
                .any(|l| l.starts_with(&format!("ok    {what}"))),
            "no ok line for {what}:\n{out}"
        );
    }
    assert!(out.contains("all checks passed"), "{out}");
}

/// A table without the aggregate id column and no publication: exit 6, one FAIL line
/// each, with the fix.
#[tokio::test(flavor = "multi_thread")]
async fn check_reports_wrong_table_and_missing_publication() {
    let db = PgCluster::shared().fresh_database("ops_check_bad").await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, \
             event_type text NOT NULL, payload jsonb NOT NULL)",
        )
        .await
        .expect("table");
    let broker = Broker::default_for_tests();
    let outbox = names(&db);
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let table = fail_line(&out, "outbox table");
    assert!(
        table.contains("aggregate_id"),
        "names the missing column: {table}"
    );
    let publication = fail_line(&out, "publication");
    assert!(publication.contains(&db.publication), "{publication}");
    assert!(
        publication.contains("outboxd init"),
        "names the fix: {publication}"
    );
    assert!(out.contains("2 check(s) failed"), "{out}");

    // A publication that exists but leaves the table out.
    client
        .batch_execute(&format!(
            "CREATE TABLE other (x int); CREATE PUBLICATION \"{}\" FOR TABLE other",
            db.publication
        ))
        .await
        .expect("publication");
    let (code, out) = run_to_end(
        &[
            env.clone(),
            vec![("OUTBOXD_MESSAGE_PREFIX".into(), String::new())],
        ]
        .concat(),
        &["check"],
    );
    assert_eq!(code, 6, "{out}");
    let publication = fail_line(&out, "publication");
    assert!(
        publication.contains("ALTER PUBLICATION"),
        "names the fix: {publication}"
    );
}

/// wal_level = replica (a dedicated cluster): exit 6 and the line says what to set.
#[tokio::test(flavor = "multi_thread")]
async fn check_reports_wal_level() {
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["wal_level = replica".into()],
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let db = cluster.fresh_database("ops_check_wal").await;
    let client = db.client().await;
    client
        .batch_execute(schema::OUTBOX_DDL)
        .await
        .expect("table");
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(&db, &names(&db), &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let line = fail_line(&out, "wal_level");
    assert!(line.contains("replica"), "{line}");
    assert!(line.contains("wal_level = logical"), "{line}");
}

/// `outboxd init` on an empty database creates table, publication and slot; a second run
/// changes nothing and succeeds; `check` passes afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn init_creates_everything_and_is_idempotent() {
    let db = PgCluster::shared().fresh_database("ops_init").await;
    let broker = Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&names(&db).dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &names(&db), &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok  table"), "{out}");
    assert_eq!(
        out.matches("(created").count(),
        3,
        "table, publication and slot created:\n{out}"
    );
    let client = db.client().await;
    let in_pub: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'outbox'",
            &[&db.publication],
        )
        .await
        .expect("pg_publication_tables")
        .get(0);
    assert_eq!(in_pub, 1);
    let slot = ops::slot_row(&client, &db.slot)
        .await
        .expect("slot created");
    assert!(slot.confirmed_flush.is_some());

    let (code, again) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{again}");
    assert!(again.contains("(exists)"), "{again}");
    assert!(!again.contains("(created"), "{again}");
    // The same slot, untouched (the server's own WAL position moves on a shared cluster).
    let again_slot = ops::slot_row(&client, &db.slot).await.expect("slot");
    assert_eq!(
        (again_slot.confirmed_flush, again_slot.restart),
        (slot.confirmed_flush, slot.restart)
    );

    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "check after init:\n{out}");
}

/// `outboxd status` shows the slot's position, lag, retained WAL and whether (and in
/// which walsender) a relay is streaming.
#[tokio::test(flavor = "multi_thread")]
async fn status_shows_lag_retained_wal_and_active_pid() {
    let s = Scenario::new("ops_status").partitions(4).await;
    let db = &s.db;
    let env = s.env(&[]);
    let (code, out) = run_to_end(&env, &["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("active             no"), "{out}");
    assert!(out.contains("retained WAL"), "{out}");
    assert!(out.contains("(lag "), "{out}");
    assert!(out.contains("wal_status         reserved"), "{out}");

    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;
    let (code, out) = run_to_end(&env, &["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("active             yes, walsender pid {pid}")),
        "{out}"
    );
    relay.kill();

    let (code, out) = run_to_end(
        &[env, vec![("OUTBOXD_SLOT".into(), "no_such_slot".into())]].concat(),
        &["status"],
    );
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("does not exist"), "{out}");
}

/// Bad configuration exits 2 before touching anything, naming the variable.
#[tokio::test(flavor = "multi_thread")]
async fn config_error_exits_2_naming_the_variable() {
    let db = PgCluster::shared().fresh_database("ops_config").await;
    let env = Relay::env_for(&db, &names(&db), "127.0.0.1:9", &[]);
    for (var, value) in [
        ("OUTBOXD_SLOT", "Bad-Name"),
        ("OUTBOXD_READY_STALL_MS", "soon"),
        ("OUTBOXD_IDLE_FLUSH", "maybe"),
    ] {
        for command in ["run", "check"] {
            let env = [env.clone(), vec![(var.to_owned(), value.to_owned())]].concat();
            let (code, out) = run_to_end(&env, &[command]);
            assert_eq!(code, 2, "{var}={value} ({command}):\n{out}");
            assert!(out.contains(var), "the message names {var}:\n{out}");
        }
    }
    let env: Vec<_> = env
        .into_iter()
        .filter(|(k, _)| k != "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS")
        .collect();
    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS"), "{out}");
}

/// Every setting is checked before anything is connected to: a producer setting the relay
/// refuses, or one librdkafka refuses, exits 2 at once naming the variable, even with
/// PostgreSQL unreachable (which would otherwise be retried for ever).
#[test]
fn producer_settings_are_refused_before_connecting() {
    let closed = support::relay::free_port().to_string();
    let env: Vec<(String, String)> = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", closed.as_str()),
        ("PGUSER", "postgres"),
        ("PGDATABASE", "postgres"),
        ("PGSSLMODE", "disable"),
        ("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
        ("OUTBOXD_HTTP_ADDR", ""),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (var, value) in [
        ("OUTBOXD_KAFKA_ACKS", "1"),
        ("OUTBOXD_KAFKA_ENABLE_IDEMPOTENCE", "false"),
        ("OUTBOXD_KAFKA_COMPRESSION_TYPE", "bogus"),
        ("OUTBOXD_KAFKA_NO_SUCH_PROPERTY", "1"),
    ] {
        let env = [env.clone(), vec![(var.to_owned(), value.to_owned())]].concat();
        let started = std::time::Instant::now();
        let mut relay = Relay::start(env, &["run"]);
        // A relay that connected first would retry the closed port for ever: any bound
        // tells the two apart, so a generous one (a loaded machine starts processes slowly).
        let status = relay.wait_exit(Duration::from_secs(60));
        let log = relay.log_text();
        assert_eq!(status.code(), Some(2), "{var}={value}:\n{log}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{var}: {:?}",
            started.elapsed()
        );
        assert!(log.contains(var), "the message names {var}:\n{log}");
    }
}

/// `<command> --help` prints that subcommand's own usage and exit codes, and exits 0
/// without reading any configuration.
#[test]
fn subcommand_help_exits_0_without_configuration() {
    for command in ["run", "check", "init", "status", "probe", "prune"] {
        for flag in ["--help", "-h"] {
            let (code, out) = run_to_end(&[], &[command, flag]);
            assert_eq!(code, 0, "{command} {flag}:\n{out}");
            assert!(
                out.contains(&format!("Usage: outboxd {command}")),
                "{command} {flag}:\n{out}"
            );
            assert!(!out.contains("outboxd: configuration error"), "{out}");
            // Only init takes init's flags, and only check fails a check.
            assert_eq!(
                out.contains("--recreate-lost-slot"),
                command == "init",
                "{command} {flag}:\n{out}"
            );
        }
        let (_, long) = run_to_end(&[], &[command, "--help"]);
        let codes = help_exit_codes(&long);
        assert!(codes.contains(&2), "{command}:\n{long}");
        assert_eq!(codes.contains(&6), command == "check", "{command}:\n{long}");
    }
}

/// The codes a help text's "Exit codes:" section lists.
fn help_exit_codes(help: &str) -> std::collections::BTreeSet<i32> {
    help.lines()
        .skip_while(|l| !l.starts_with("Exit codes:"))
        .filter_map(|l| l.strip_prefix("  ")?.split(' ').next()?.parse().ok())
        .collect()
}

/// `outboxd --help` and the README list the same exit codes.
#[test]
fn help_and_readme_list_the_same_exit_codes() {
    const README: &str = include_str!("../../README.md");
    let (code, help) = run_to_end(&[], &["--help"]);
    assert_eq!(code, 0, "{help}");
    let in_help = help_exit_codes(&help);
    let bullet = README
        .split("\n- ")
        .find(|b| b.starts_with("**Exit codes**"))
        .expect("the README's Exit codes bullet");
    let in_readme: std::collections::BTreeSet<i32> = bullet
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(in_help, in_readme, "--help:\n{help}\nREADME:\n{bullet}");
}

/// An environment that names a PostgreSQL port nobody listens on.
fn unreachable_env() -> Vec<(String, String)> {
    let closed = support::relay::free_port().to_string();
    [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", closed.as_str()),
        ("PGUSER", "postgres"),
        ("PGDATABASE", "postgres"),
        ("PGSSLMODE", "disable"),
        ("PGCONNECT_TIMEOUT", "5"),
        ("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9"),
        ("OUTBOXD_HTTP_ADDR", ""),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// Unknown arguments are refused with exit 2, naming them, before anything is checked or
/// connected to (`check --bogus` used to run the checks).
#[test]
fn unknown_arguments_exit_2_naming_them() {
    let env = unreachable_env();
    for (args, named) in [
        (&["check", "--bogus"][..], "--bogus"),
        (&["status", "extra"], "extra"),
        (&["status", "--json", "--yaml"], "--yaml"),
        (&["init", "--recreate"], "--recreate"),
        (&["probe", "--bogus"], "--bogus"),
        (&["run", "--bogus"], "--bogus"),
        (&["nonsense"], "nonsense"),
    ] {
        let (code, out) = run_to_end(&env, args);
        assert_eq!(code, 2, "{args:?}:\n{out}");
        assert!(
            out.contains(&format!("'{named}'")),
            "{args:?} names {named}:\n{out}"
        );
        assert!(
            !out.contains("FAIL") && !out.contains("cannot connect"),
            "{args:?}:\n{out}"
        );
    }
}

/// `status` tells "cannot connect" (7: try again) from a slot that is missing or lost (3),
/// in both output formats.
#[test]
fn status_cannot_connect_exits_7() {
    let env = unreachable_env();
    let (code, out) = run_to_end(&env, &["status"]);
    assert_eq!(code, 7, "{out}");
    assert!(out.contains("cannot connect"), "{out}");
    let (code, out) = run_to_end(&env, &["status", "--json"]);
    assert_eq!(code, 7, "{out}");
    let doc: serde_json::Value =
        serde_json::from_str(out.lines().next().expect("a line")).expect("JSON on stdout");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect")),
        "{doc}"
    );
}

/// `init` and `status` only talk to PostgreSQL: no Kafka setting is needed.
#[tokio::test(flavor = "multi_thread")]
async fn init_and_status_do_not_require_kafka_settings() {
    let db = PgCluster::shared().fresh_database("ops_no_kafka").await;
    let env: Vec<_> = Relay::env_for(&db, &names(&db), "unused:9092", &[])
        .into_iter()
        .filter(|(k, _)| k != "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS")
        .collect();
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&env, &["status"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 2, "check still needs the brokers:\n{out}");
    assert!(out.contains("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS"), "{out}");
}

/// `outboxd status | head -1`: the reader goes away; outboxd exits 0 instead of panicking.
#[tokio::test(flavor = "multi_thread")]
async fn status_into_a_closed_pipe_exits_0() {
    use std::process::{Command, Stdio};
    let db = PgCluster::shared().fresh_database("ops_status_pipe").await;
    let outbox = schema::setup(&db).await;
    let env = Relay::env_for(&db, &outbox, "unused:9092", &[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("status")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Closed before outboxd writes anything: every write gets EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The first SIGTERM drains (here: waiting for a broker that is down); a second one exits
/// at once with 130.
#[tokio::test(flavor = "multi_thread")]
async fn second_signal_exits_130() {
    let ops::Streaming {
        db: _db,
        outbox,
        broker,
        mut relay,
        client,
        ..
    } = ops::streaming_relay_on(Broker::kafka(1), "ops_second_signal", &[]).await;
    broker.set_all_down(true);
    support::load::insert_events(&client, &outbox.table, 5, 1, 5).await;
    ops::wait_for(
        "events in flight",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { (relay.metric("outboxd_in_flight_messages")? > 0.0).then_some(()) },
    )
    .await;
    relay.signal("TERM");
    std::thread::sleep(Duration::from_millis(500));
    assert!(relay.is_running(), "still draining after the first signal");
    relay.signal("TERM");
    // "At once": well before the drain's 30 s timeout, with room for a loaded machine.
    let status = relay.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(130), "{}", relay.log_text());
}
