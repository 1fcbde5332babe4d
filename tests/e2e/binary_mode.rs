//! pgoutput's binary mode gives the records of text mode, byte for byte: the same
//! committed rows are relayed twice, through two slots made before them, once with
//! `OUTBOXD_PGOUTPUT_BINARY=off` and once with `on` (or `auto`), and every record's
//! topic, key, value, headers, timestamp (and partition, when keyed) are compared. Rows carry
//! every decoded type as header columns and a topic placeholder, NULLs, unicode, a big
//! jsonb, timestamptz entered at odd offsets, BC and both infinities, bad rows that go
//! to the dead-letter topic, and partitions of their own column order; and a table's
//! extra, unread columns of other types (numeric, arrays, an enum, a composite, a
//! domain) leave binary mode usable. A walsender printing timestamptz at another
//! TimeZone rules binary out: `auto` streams text, `on` refuses to start.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::{PgCluster, TestDb};
use support::broker::Broker;
use support::consume::{read_topics, received, stream_topics, Received};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// Every type outboxd decodes, each read (header columns, a topic placeholder), in a
/// table partitioned by aggregate type; the `user` partition's columns are in another
/// order.
const DECODED_DDL: &str = "
CREATE TABLE public.outbox (
    id             uuid NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id   text,
    event_type     varchar(100),
    payload        jsonb,
    headers        jsonb,
    created_at     timestamptz,
    version        bigint,
    small          smallint,
    n              integer,
    flag           boolean NOT NULL,
    blob           bytea,
    doc            json,
    code           char(4),
    ref            uuid
) PARTITION BY LIST (aggregate_type);
CREATE TABLE public.outbox_order PARTITION OF public.outbox FOR VALUES IN ('order');
CREATE TABLE public.outbox_user (
    ref uuid, code char(4), doc json, blob bytea, flag boolean NOT NULL, n integer,
    small smallint, version bigint, created_at timestamptz, headers jsonb, payload jsonb,
    event_type varchar(100), aggregate_id text, aggregate_type text NOT NULL, id uuid NOT NULL
);
ALTER TABLE public.outbox ATTACH PARTITION public.outbox_user FOR VALUES IN ('user');
";

const DECODED_HEADER_COLUMNS: &str = "created_at,version,small,n,blob,doc,code,ref";

/// (aggregate_type, aggregate_id, event_type, payload, headers, created_at, version,
/// small, n, flag, blob, doc, code, ref) as SQL expressions.
const DECODED_ROWS: &[&str] = &[
    "'order', 'o-1', 'Created', '{\"b\": 1, \"a\": [true, null], \"ü\": \"✓\"}', \
     '{\"trace\": \"t-1\", \"n\": 2}', '2026-12-02 07:06:27.123+05:45', 9007199254740993, \
     -32768, 2147483647, true, '\\x00ff5c'::bytea, '{ \"spaced\" : [1, 2] }', 'ab', \
     '0f0e0d0c-0b0a-4908-8706-050403020100'",
    "'order', 'o-2', 'Nulls', NULL, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, NULL, NULL",
    "'user', '訂單-42', 'Größe', jsonb_build_object('big', repeat('Ω→', 60000)), '{}', \
     'infinity', -9223372036854775808, 0, -1, true, ''::bytea, 'null', 'wxyz', NULL",
    "'user', 'u-2', 'Old', '\"just a string\"', NULL, '-infinity', 1, 1, 1, false, \
     '\\x'::bytea || decode(repeat('00', 300), 'hex'), '[]', NULL, NULL",
    "'order', 'o-3', 'Dates', '1', NULL, '0044-03-15 12:00:00.5+01 BC', 2, 2, 2, true, NULL, \
     NULL, 'a', NULL",
    "'user', 'u-3', 'Dates', '2', NULL, '2024-02-29 23:59:59.999999-03:30', 3, 3, 3, true, \
     NULL, NULL, NULL, NULL",
    "'order', 'o-4', 'Dates', '3', NULL, '1900-01-01 00:00:00.000001+14', 4, 4, 4, false, \
     NULL, NULL, NULL, NULL",
    // Dead letters: a NULL and an empty aggregate id, headers that are not an object.
    "'order', NULL, 'NoKey', '{}', NULL, now(), 5, 5, 5, true, '\\x01'::bytea, NULL, NULL, NULL",
    "'user', '', 'EmptyKey', '{}', NULL, NULL, 6, 6, 6, false, NULL, '{}', NULL, NULL",
    "'order', 'o-5', 'BadHeaders', '{}', '[1, 2]', '2000-01-01 00:00+00', 7, 7, 7, true, NULL, \
     NULL, NULL, gen_random_uuid()",
];

/// The seed-004 shape with extra columns outboxd does not read, of types it does not
/// decode.
const EXTRA_COLUMNS_DDL: &str = "
CREATE TYPE mood AS ENUM ('calm', 'busy');
CREATE TYPE address AS (street text, zip integer);
CREATE DOMAIN positive AS numeric CHECK (VALUE > 0);
CREATE TABLE public.outbox (
    id             uuid PRIMARY KEY,
    aggregate_type text NOT NULL,
    aggregate_id   text NOT NULL,
    event_type     text NOT NULL,
    payload        jsonb NOT NULL,
    amount         numeric(20, 4),
    tags           text[],
    grid           integer[][],
    m              mood,
    addr           address,
    price          positive,
    at             interval,
    created_at     timestamptz NOT NULL
)";

const EXTRA_COLUMNS_ROWS: &[&str] = &[
    "'order', 'o-1', 'Created', '{\"x\": 1}', 12345678.9, '{a,\"b c\",NULL}', '{{1,2},{3,4}}', \
     'calm', ROW('Main St', 12345), 3.5, '1 day 2 hours', '2026-01-01 00:00+00'",
    "'order', 'o-2', 'Shipped', '{\"x\": 2}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
     '1999-12-31 23:59:59.5-08'",
];

async fn insert_rows(db: &TestDb<'_>, columns: &str, rows: &[&str]) {
    let client = db.client().await;
    for row in rows {
        client
            .batch_execute(&format!(
                "INSERT INTO public.outbox (id, {columns}) VALUES (gen_random_uuid(), {row})"
            ))
            .await
            .unwrap_or_else(|e| panic!("insert {row}: {e}"));
    }
}

/// A second slot on the test database's publication, made now: it delivers what the
/// first one delivers from here on.
async fn second_slot(db: &TestDb<'_>, outbox: &Outbox, suffix: &str) -> Outbox {
    let slot = format!("{}_{suffix}", outbox.slot);
    db.client()
        .await
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .expect("second slot");
    Outbox {
        slot,
        topic_prefix: format!("{}-{suffix}", outbox.topic_prefix),
        ..outbox.clone()
    }
}

/// `OUTBOXD_PGOUTPUT_BINARY`, and whether the stream is to carry binary values then.
struct Mode(&'static str, bool);

const OFF: Mode = Mode("off", false);
const ON: Mode = Mode("on", true);
const AUTO_TEXT: Mode = Mode("auto", false);

/// `outbox`'s relay in `mode` with `extra`, and every record it produced (`want` of
/// them) on `suffixes` (topic names after the prefix) and the dead-letter topic, sorted,
/// their topics without the prefix.
async fn relay_all(
    broker: &Broker,
    db: &TestDb<'_>,
    outbox: &Outbox,
    Mode(binary, streams_binary): Mode,
    extra: &[(&str, &str)],
    suffixes: &[&str],
    want: usize,
) -> Vec<Received> {
    let mut topics: Vec<String> = suffixes.iter().map(|s| outbox.topic(s)).collect();
    topics.push(outbox.dead_letter_topic());
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    broker.create_topics(&refs, 2).await;
    let mut env = extra.to_vec();
    env.push(("OUTBOXD_PGOUTPUT_BINARY", binary));
    let template = env
        .iter()
        .find(|(k, _)| *k == "OUTBOXD_TOPIC")
        .map(|(_, t)| t.replace("{prefix}", &outbox.topic_prefix));
    if let Some(t) = &template {
        env.retain(|(k, _)| *k != "OUTBOXD_TOPIC");
        env.push(("OUTBOXD_TOPIC", t));
    }
    let relay = Relay::start(
        Relay::env_for(db, outbox, &broker.bootstrap(), &env),
        &["run"],
    );
    let mut received = read_topics(
        &broker.bootstrap(),
        &topics,
        want,
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    assert_eq!(
        received.len(),
        want,
        "{binary}: {received:?}\n{}",
        relay.log_text()
    );
    assert_eq!(
        relay.metric("outboxd_pgoutput_binary"),
        Some(if streams_binary { 1.0 } else { 0.0 }),
        "{binary}: the mode the stream ran in"
    );
    for r in &mut received {
        r.topic = r
            .topic
            .strip_prefix(&outbox.topic_prefix)
            .expect("prefixed topic")
            .to_owned();
    }
    // Each row is its own transaction: its commit LSN names it in both runs.
    received.sort_by(|a, b| {
        let at = |r: &Received| {
            (
                r.topic.clone(),
                r.header("outboxd.commit_lsn").map(str::to_owned),
            )
        };
        at(a).cmp(&at(b))
    });
    received
}

fn assert_same_records(text: &[Received], binary: &[Received]) {
    assert_eq!(text.len(), binary.len());
    for (t, b) in text.iter().zip(binary) {
        let what = format!("{} {:?}", t.topic, t.header("outboxd.commit_lsn"));
        assert_eq!(t.topic, b.topic, "{what}");
        // Keyless dead letters go to any partition; a key picks the same one.
        if t.key.is_some() {
            assert_eq!(t.partition, b.partition, "{what}: partition");
        }
        assert_eq!(t.key, b.key, "{what}: key");
        assert_eq!(t.value, b.value, "{what}: value");
        assert_eq!(t.headers, b.headers, "{what}: headers");
        assert_eq!(t.timestamp_millis, b.timestamp_millis, "{what}: timestamp");
    }
}

/// A database whose sessions print timestamptz in `zone`, with the outbox of extra,
/// unread columns of other types.
async fn extra_columns(name: &str, zone: &str) -> (TestDb<'static>, Outbox) {
    let db = PgCluster::shared().fresh_database(name).await;
    set_time_zone(&db, zone).await;
    let outbox = schema::setup_custom(&db, EXTRA_COLUMNS_DDL, Some("publish = 'insert'")).await;
    (db, outbox)
}

async fn insert_extra_rows(db: &TestDb<'_>) {
    insert_rows(
        db,
        "aggregate_type, aggregate_id, event_type, payload, amount, tags, grid, m, addr, \
         price, at, created_at",
        EXTRA_COLUMNS_ROWS,
    )
    .await;
}

async fn set_time_zone(db: &TestDb<'_>, zone: &str) {
    // New sessions (the relays' walsenders) print timestamptz in this zone.
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET timezone = '{zone}'",
            db.name
        ))
        .await
        .expect("time zone");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_decoded_type_gives_the_same_bytes_as_text_mode() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("binary_same").await;
    set_time_zone(&db, "UTC").await;
    let text = schema::setup_custom(&db, DECODED_DDL, Some("publish = 'insert'")).await;
    let binary = second_slot(&db, &text, "bin").await;
    insert_rows(
        &db,
        "aggregate_type, aggregate_id, event_type, payload, headers, created_at, version, \
         small, n, flag, blob, doc, code, ref",
        DECODED_ROWS,
    )
    .await;
    // Set after the rows: theirs still arrive under the partitions' names, each
    // partition's Relation in its own column order.
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{}\" SET (publish = 'insert', publish_via_partition_root = true)",
            text.publication
        ))
        .await
        .expect("publish via root");
    let extra = [
        ("OUTBOXD_HEADER_COLUMNS", DECODED_HEADER_COLUMNS),
        ("OUTBOXD_TOPIC", "{prefix}.{aggregate_type}.{flag}"),
        ("OUTBOXD_BAD_ROW_POLICY", "dead-letter"),
    ];
    let suffixes = ["order.t", "order.f", "user.t", "user.f"];
    let want = DECODED_ROWS.len();
    let t = relay_all(&broker, &db, &text, OFF, &extra, &suffixes, want).await;
    let b = relay_all(&broker, &db, &binary, ON, &extra, &suffixes, want).await;
    assert_same_records(&t, &b);
    // What was compared: PostgreSQL's own text forms, and dead letters.
    let dead = t.iter().filter(|r| r.topic == ".dead-letter").count();
    assert_eq!(dead, 3, "{t:?}");
    let first = t.iter().find(|r| r.key_str() == "o-1").expect("o-1");
    assert_eq!(
        first.header("created_at"),
        Some("2026-12-02 01:21:27.123+00")
    );
    assert_eq!(first.header("blob"), Some("\\x00ff5c"));
    assert_eq!(first.header("code"), Some("ab  "));
    assert_eq!(first.header("doc"), Some("{ \"spaced\" : [1, 2] }"));
    assert_eq!(first.header("version"), Some("9007199254740993"));
    let bc = t.iter().find(|r| r.key_str() == "o-3").expect("o-3");
    assert_eq!(bc.header("created_at"), Some("0044-03-15 11:00:00.5+00 BC"));
}

#[tokio::test(flavor = "multi_thread")]
async fn unread_columns_of_other_types_leave_binary_mode_usable() {
    let broker = Broker::default_for_tests();
    let (db, text) = extra_columns("binary_extra", "UTC").await;
    let binary = second_slot(&db, &text, "bin").await;
    let dead_letter = second_slot(&db, &text, "dl").await;
    insert_extra_rows(&db).await;
    let stop = [
        ("OUTBOXD_BAD_ROW_POLICY", "stop"),
        ("OUTBOXD_HEADER_COLUMNS", "created_at"),
    ];
    let want = EXTRA_COLUMNS_ROWS.len();
    let t = relay_all(&broker, &db, &text, OFF, &stop, &["order"], want).await;
    let b = relay_all(&broker, &db, &binary, ON, &stop, &["order"], want).await;
    assert_same_records(&t, &b);
    // Dead letters print every column, numeric and arrays too: auto streams text.
    let dl = [("OUTBOXD_HEADER_COLUMNS", "created_at")];
    let d = relay_all(&broker, &db, &dead_letter, AUTO_TEXT, &dl, &["order"], want).await;
    assert_same_records(&t, &d);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_time_zone_keeps_text_mode() {
    let broker = Broker::default_for_tests();
    let (db, text) = extra_columns("binary_zone", "Asia/Kathmandu").await;
    let auto = second_slot(&db, &text, "auto").await;
    insert_extra_rows(&db).await;
    let env = [
        ("OUTBOXD_BAD_ROW_POLICY", "stop"),
        ("OUTBOXD_HEADER_COLUMNS", "created_at"),
    ];
    let mut on = Relay::env_for(&db, &auto, &broker.bootstrap(), &env);
    on.push(("OUTBOXD_PGOUTPUT_BINARY".into(), "on".into()));
    let (code, out) = run_to_end(&on, &["run"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("Asia/Kathmandu") && out.contains("created_at"),
        "the error names the column and the setting: {out}"
    );
    let want = EXTRA_COLUMNS_ROWS.len();
    let t = relay_all(&broker, &db, &text, OFF, &env, &["order"], want).await;
    let a = relay_all(&broker, &db, &auto, AUTO_TEXT, &env, &["order"], want).await;
    assert_same_records(&t, &a);
    let first = t.iter().find(|r| r.key_str() == "o-1").expect("o-1");
    assert_eq!(
        first.header("created_at"),
        Some("2026-01-01 05:45:00+05:45")
    );
}

/// A column retyped to one without a binary decoder while a binary stream runs: the
/// Relation message that announces it ends the session before any of its rows is
/// mapped. `auto` goes on with text values (the gauge says so), `on` stops with exit 3.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_retyped_mid_stream_switches_to_text_or_stops() {
    let broker = Broker::default_for_tests();
    let (db, auto) = extra_columns("binary_retype", "UTC").await;
    let on = second_slot(&db, &auto, "on").await;
    let topics = vec![auto.topic("order")];
    broker
        .create_topics(&[&topics[0], &on.topic("order")], 2)
        .await;
    let env = [
        ("OUTBOXD_BAD_ROW_POLICY", "stop"),
        ("OUTBOXD_HEADER_COLUMNS", "created_at"),
        ("OUTBOXD_PGOUTPUT_BINARY", "auto"),
    ];
    let relay = Relay::start(
        Relay::env_for(&db, &auto, &broker.bootstrap(), &env),
        &["run"],
    );
    let mut strict_env = Relay::env_for(&db, &on, &broker.bootstrap(), &env);
    strict_env.push(("OUTBOXD_PGOUTPUT_BINARY".into(), "on".into()));
    let mut strict = Relay::start(strict_env, &["run"]);
    let columns = "aggregate_type, aggregate_id, event_type, payload, amount, tags, grid, m, \
                   addr, price, at, created_at";
    insert_rows(&db, columns, &EXTRA_COLUMNS_ROWS[..1]).await;
    let first = read_topics(
        &broker.bootstrap(),
        &topics,
        1,
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    assert_eq!(first.len(), 1, "{}", relay.log_text());
    assert_eq!(relay.metric("outboxd_pgoutput_binary"), Some(1.0));
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE public.outbox ALTER COLUMN created_at TYPE timestamp \
             USING created_at AT TIME ZONE 'UTC'",
        )
        .await
        .expect("retype");
    insert_rows(&db, columns, &EXTRA_COLUMNS_ROWS[1..]).await;
    let status = strict.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", strict.log_text());
    // o-1 may come again: the reconnect resumes from the slot (duplicates, never a loss).
    let mut all = Vec::new();
    stream_topics(
        &broker.bootstrap(),
        &topics,
        Duration::from_secs(60),
        Duration::from_secs(120),
        |m| {
            all.push(received(m));
            all.iter().all(|r| r.key_str() != "o-2")
        },
    );
    let second = all
        .iter()
        .find(|r| r.key_str() == "o-2")
        .unwrap_or_else(|| panic!("o-2 not relayed: {all:?}\n{}", relay.log_text()));
    // timestamp_out's text (the offset typed into a timestamp is dropped).
    assert_eq!(second.header("created_at"), Some("1999-12-31 23:59:59.5"));
    relay
        .wait_metrics("the text stream", |body| {
            support::ops::metric(body, "outboxd_pgoutput_binary").filter(|v| *v == 0.0)
        })
        .await;
}

/// A configuration reload that changes TimeZone while binary values stream: the walsender
/// prints timestamptz at the new zone from then on, so the binary session ends. `auto`
/// goes on with text values (the records are then those of text mode), `on` stops with
/// exit 3 (binary values would no longer give the text form's bytes). A cluster of its
/// own: ALTER SYSTEM is cluster-wide.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_changes_the_time_zone_ends_the_binary_session() {
    let cluster = PgCluster::start(pgtest::ClusterOptions::default()).expect("cluster");
    let db = cluster.fresh_database("binary_reload").await;
    let client = db.client().await;
    for sql in [
        "ALTER SYSTEM SET timezone = 'UTC'",
        "SELECT pg_reload_conf()",
    ] {
        client.batch_execute(sql).await.expect("UTC");
    }
    let auto = schema::setup(&db).await;
    let on = second_slot(&db, &auto, "on").await;
    let broker = Broker::default_for_tests();
    let topics = support::ops::create_topics(&broker, &auto).await;
    support::ops::create_topics(&broker, &on).await;
    let env = |outbox: &Outbox, mode: &str| {
        let mut env = Relay::env_for(
            &db,
            outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_HEADER_COLUMNS", "created_at")],
        );
        env.push(("OUTBOXD_PGOUTPUT_BINARY".into(), mode.into()));
        env
    };
    let auto_relay = Relay::start(env(&auto, "auto"), &["run"]);
    let mut on_relay = Relay::start(env(&on, "on"), &["run"]);
    for r in [&auto_relay, &on_relay] {
        support::ops::wait_for(
            "binary values streamed",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { (r.metric("outboxd_pgoutput_binary") == Some(1.0)).then_some(()) },
        )
        .await;
    }
    let before = support::load::insert_events(&client, &auto.table, 3, 1, 1).await;
    let first = support::ops::read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &before,
        Duration::from_secs(60),
    );
    for e in &before {
        assert!(created_at(&first, &e.id).ends_with("+00"));
    }

    for sql in [
        "ALTER SYSTEM SET timezone = 'Asia/Kathmandu'",
        "SELECT pg_reload_conf()",
    ] {
        client.batch_execute(sql).await.expect("reload");
    }
    support::ops::wait_for(
        "auto to stream text values",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (auto_relay.metric("outboxd_pgoutput_binary") == Some(0.0)).then_some(()) },
    )
    .await;
    assert_eq!(
        on_relay.wait_exit(Duration::from_secs(60)).code(),
        Some(3),
        "{}",
        on_relay.log_text()
    );
    let after = support::load::insert_events(&client, &auto.table, 3, 1, 1).await;
    let got = support::ops::read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &after,
        Duration::from_secs(60),
    );
    // Every copy of each (a replay may publish one again): all at the new zone.
    for e in &after {
        let stamps: Vec<&str> = got
            .iter()
            .filter(|r| r.header("id") == Some(e.id.as_str()))
            .filter_map(|r| r.header("created_at"))
            .collect();
        assert!(
            !stamps.is_empty() && stamps.iter().all(|t| t.ends_with("+05:45")),
            "{stamps:?}"
        );
    }
}

/// The `created_at` header of event `id`'s first record in `got`.
fn created_at(got: &[Received], id: &str) -> String {
    got.iter()
        .find(|r| r.header("id") == Some(id))
        .and_then(|r| r.header("created_at"))
        .unwrap_or_else(|| panic!("event {id} with created_at in {got:?}"))
        .to_owned()
}
