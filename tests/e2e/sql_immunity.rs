//! Every SQL statement outboxd runs is immune to objects planted in schema `public`
//! (docs/sql.md). Whoever may create there (any role on PostgreSQL 14, a database owner
//! on 15+) can plant an operator or function that PostgreSQL prefers to pg_catalog's for a
//! statement whose argument types match no pg_catalog one exactly (e.g. `oid = regclass`),
//! or that pg_catalog lacks; the relay's role (REPLICATION, maybe the table's owner) would
//! run it. Here each planted object records its call, and `init`, `check` and `run` must
//! do all their work without one call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::PgCluster;
use support::broker::Broker;
use support::ops;
use support::relay::{run_to_end, Relay};
use support::schema::Outbox;

/// The recorder: each planted object inserts its name and the caller's application_name.
const RECORDER: &str = "
CREATE TABLE public.planted_calls (what text NOT NULL, app text);
GRANT INSERT, SELECT ON public.planted_calls TO PUBLIC;
CREATE FUNCTION public.planted(what text) RETURNS void LANGUAGE plpgsql
    SET search_path = pg_catalog AS $f$
BEGIN
    INSERT INTO public.planted_calls VALUES (what, pg_catalog.current_setting('application_name'));
END $f$;
";

/// Operators over argument types pg_catalog has no exact operator for, which the relay's
/// queries used (`oid = regclass` in the publication probe, ...): (left, op, right, body).
const OPERATORS: &[(&str, &str, &str, &str)] = &[
    ("oid", "=", "regclass", "a OPERATOR(pg_catalog.=) b::oid"),
    ("regclass", "=", "oid", "a::oid OPERATOR(pg_catalog.=) b"),
    ("oid", "<>", "regclass", "a OPERATOR(pg_catalog.<>) b::oid"),
    ("regclass", "<>", "oid", "a::oid OPERATOR(pg_catalog.<>) b"),
    (
        "oid",
        "=",
        "regnamespace",
        "a OPERATOR(pg_catalog.=) b::oid",
    ),
    (
        "numeric",
        "*",
        "integer",
        "a OPERATOR(pg_catalog.*) b::numeric",
    ),
    (
        "double precision",
        "*",
        "integer",
        "a OPERATOR(pg_catalog.*) b::double precision",
    ),
];

/// Shadows of the functions the relay calls (name, arguments, result, body): some match
/// better than pg_catalog's (`has_database_privilege(name, text)` for a `name` argument,
/// `to_jsonb` of a row type), the rest would run if pg_catalog were searched after public.
const FUNCTIONS: &[(&str, &str, &str, &str)] = &[
    (
        "to_regclass",
        "a text",
        "regclass",
        "pg_catalog.to_regclass(a)",
    ),
    (
        "current_setting",
        "a text",
        "text",
        "pg_catalog.current_setting(a)",
    ),
    (
        "current_setting",
        "a text, b boolean",
        "text",
        "pg_catalog.current_setting(a, b)",
    ),
    (
        "pg_current_wal_lsn",
        "",
        "pg_lsn",
        "pg_catalog.pg_current_wal_lsn()",
    ),
    (
        "clock_timestamp",
        "",
        "timestamptz",
        "pg_catalog.clock_timestamp()",
    ),
    ("now", "", "timestamptz", "pg_catalog.now()"),
    (
        "pg_is_in_recovery",
        "",
        "boolean",
        "pg_catalog.pg_is_in_recovery()",
    ),
    (
        "current_database",
        "",
        "name",
        "pg_catalog.current_database()",
    ),
    (
        "has_schema_privilege",
        "a oid, b text",
        "boolean",
        "pg_catalog.has_schema_privilege(a, b)",
    ),
    (
        "has_database_privilege",
        "a name, b text",
        "boolean",
        "pg_catalog.has_database_privilege(a::text, b)",
    ),
    (
        "pg_has_role",
        "a oid, b text",
        "boolean",
        "pg_catalog.pg_has_role(a, b)",
    ),
    (
        "has_function_privilege",
        "a text, b oid, c text",
        "boolean",
        "pg_catalog.has_function_privilege(a, b, c)",
    ),
    (
        "to_jsonb",
        "a pg_catalog.pg_publication_rel",
        "jsonb",
        "pg_catalog.to_jsonb(a)",
    ),
    (
        "pg_logical_emit_message",
        "a boolean, b text, c text",
        "pg_lsn",
        "pg_catalog.pg_logical_emit_message(a, b, c)",
    ),
    (
        "row_security_active",
        "a oid",
        "boolean",
        "pg_catalog.row_security_active(a)",
    ),
    (
        "pg_relation_size",
        "a oid",
        "bigint",
        "pg_catalog.pg_relation_size(a)",
    ),
];

fn planted_sql() -> String {
    let mut sql = RECORDER.to_owned();
    for (i, (left, op, right, body)) in OPERATORS.iter().enumerate() {
        let what = format!("operator {op}({left}, {right})");
        sql.push_str(&format!(
            "CREATE FUNCTION public.planted_op_{i}(a {left}, b {right}) RETURNS {} \
             LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ \
             BEGIN PERFORM public.planted('{what}'); RETURN {body}; END $f$;\n\
             CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, \
             FUNCTION = public.planted_op_{i});\n",
            if *op == "*" { left } else { "boolean" },
        ));
    }
    for (name, args, result, body) in FUNCTIONS {
        let what = format!("function {name}({args})");
        sql.push_str(&format!(
            "CREATE FUNCTION public.{name}({args}) RETURNS {result} LANGUAGE plpgsql \
             SET search_path = pg_catalog AS $f$ \
             BEGIN PERFORM public.planted('{what}'); RETURN {body}; END $f$;\n"
        ));
    }
    sql
}

async fn planted_calls(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT what || ' (by ' || coalesce(app, '?') || ')' FROM public.planted_calls",
            &[],
        )
        .await
        .expect("planted_calls")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// `init` (table, publication, slot), `check`, then `run` relaying events with
/// heartbeats on: no planted operator or function runs, and the events arrive.
#[tokio::test(flavor = "multi_thread")]
async fn objects_planted_in_public_never_run() {
    let db = PgCluster::shared().fresh_database("sql_immunity").await;
    let client = db.client().await;
    client.batch_execute(&planted_sql()).await.expect("plant");
    // The planted objects work and record: a query resolving through public calls one.
    client
        .query_one(
            "SELECT 'pg_class'::regclass::oid = 'pg_class'::regclass",
            &[],
        )
        .await
        .expect("planted operator");
    assert_eq!(
        planted_calls(&client).await.len(),
        1,
        "the recorder records"
    );
    client
        .batch_execute("TRUNCATE public.planted_calls")
        .await
        .expect("truncate");

    let outbox = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_HEARTBEAT_INTERVAL_MS", "200")],
    );

    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "init: {out}");
    assert!(
        ops::slot_row(&client, &outbox.slot).await.is_some(),
        "init made the slot: {out}"
    );
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "check: {out}");

    // A second slot of our own watches for the relay's heartbeat messages in the WAL.
    let watch = format!("{}_watch", outbox.slot);
    client
        .query_one(
            "SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&watch],
        )
        .await
        .expect("watch slot");
    let mut relay = Relay::start(env, &["run"]);
    ops::wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    let events = support::load::insert_events(&client, &outbox.table, 40, 5, 5).await;
    let received = ops::read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(60),
    );
    let report = support::consume::check_delivery(&events, &received);
    assert_eq!(report.duplicates, 0, "one record per event");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let heartbeats: i64 = client
            .query_one(
                "SELECT pg_catalog.count(*) FROM pg_catalog.pg_logical_slot_peek_binary_changes( \
                   $1, NULL, NULL, 'proto_version', '1', 'publication_names', $2, 'messages', 'true') \
                 WHERE pg_catalog.position(data, 'outboxd.heartbeat'::bytea) > 0",
                &[&watch, &outbox.publication],
            )
            .await
            .expect("peek")
            .get(0);
        if heartbeats >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat in the WAL within 60 s; log:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    relay.kill();
    client
        .query_one("SELECT pg_catalog.pg_drop_replication_slot($1)", &[&watch])
        .await
        .expect("drop watch slot");

    let calls = planted_calls(&client).await;
    assert!(
        calls.is_empty(),
        "objects planted in public ran {} times: {calls:#?}",
        calls.len()
    );
}
