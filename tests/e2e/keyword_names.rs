//! Names that are SQL keywords. A schema, table or column may be named `order`, `user` or
//! `offset`; outboxd puts the configured names into the SQL it runs (`init`'s DDL, the
//! back-fill, the shards' re-partitioning) and into the remedies it prints, and both must
//! work as written. Bare, such a name is a syntax error (`INSERT INTO t (offset)`) or means
//! something else (`TO user`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use outbox_core::pgtype::quote_ident;
use pgtest::PgCluster;
use support::broker::Broker;
use support::load;
use support::ops;
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// Every keyword the server knows, and names of each other kind, are quoted exactly as the
/// server's own `quote_ident` quotes them.
#[tokio::test(flavor = "multi_thread")]
async fn names_are_quoted_as_the_server_quotes_them() {
    let db = PgCluster::shared().fresh_database("kw_quote").await;
    let client = db.client().await;
    let mut names: Vec<String> = client
        .query("SELECT word FROM pg_catalog.pg_get_keywords()", &[])
        .await
        .expect("keywords")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(names.len() > 400, "{} keywords", names.len());
    names.extend(
        [
            "outbox",
            "Outbox",
            "a b",
            "x\"y",
            "_1",
            "1a",
            "é",
            "outbox_2025",
            "",
        ]
        .map(str::to_owned),
    );
    for name in names {
        let server: String = client
            .query_one("SELECT pg_catalog.quote_ident($1)", &[&name])
            .await
            .expect("quote_ident")
            .get(0);
        assert_eq!(quote_ident(&name), server, "{name:?}");
    }
}

/// `outboxd init` creates an outbox whose schema, table and columns are keywords, `check`
/// passes, and `run` relays every row.
#[tokio::test(flavor = "multi_thread")]
async fn an_outbox_named_by_keywords_is_created_and_relayed() {
    let db = PgCluster::shared().fresh_database("kw_outbox").await;
    let client = db.client().await;
    client
        .batch_execute("CREATE SCHEMA \"order\"")
        .await
        .expect("schema");
    let outbox = Outbox {
        table: "order.user".into(),
        ..Outbox::for_db(&db)
    };
    let broker = Broker::default_for_tests();
    let topics = ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[
            ("OUTBOXD_TABLE", "order.user"),
            ("OUTBOXD_COLUMN_ID", "offset"),
            ("OUTBOXD_COLUMN_AGGREGATE_TYPE", "group"),
            ("OUTBOXD_COLUMN_AGGREGATE_ID", "user"),
            ("OUTBOXD_COLUMN_EVENT_TYPE", "type"),
            ("OUTBOXD_COLUMN_PAYLOAD", "select"),
            ("OUTBOXD_COLUMN_HEADERS", "table"),
        ],
    );
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");

    let columns = "\"offset\", \"group\", \"user\", type, \"select\"";
    let events = load::make_events(60, 5);
    for batch in events.chunks(7) {
        load::try_insert_as(&client, "\"order\".\"user\"", columns, batch)
            .await
            .expect("insert");
    }
    let end = schema::current_wal_lsn(&db).await;
    let relay = Relay::start(env, &["run"]);
    let report = ops::read_and_check(&broker, &topics, &events, Duration::from_secs(60));
    assert_eq!(report.duplicates, 0, "no restart, so no duplicates");
    schema::wait_confirmed_at_least(&db, end, Duration::from_secs(30)).await;
    drop(relay);
}
