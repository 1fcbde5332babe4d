//! `outboxd init` as the least-privilege role of sql/role.sql on PostgreSQL 15+: it creates
//! only what is missing, and a missing privilege exits 3 naming the exact GRANT or the
//! alternative. Every file in sql/ runs twice as written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::process::Command;

use pgtest::{PgCluster, TestDb};
use support::ops;
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

fn names(db: &TestDb<'_>) -> Outbox {
    Outbox::for_db(db)
}

/// `init` as `role`, without any Kafka setting (init does not talk to Kafka).
fn init_as(db: &TestDb<'_>, role: &str) -> (i32, String) {
    let mut env = Relay::env_for(db, &names(db), "unused:9092", &[]);
    env.retain(|(k, _)| k != "PGUSER" && k != "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS");
    env.push(("PGUSER".into(), role.into()));
    run_to_end(&env, &["init"])
}

async fn create_role(db: &TestDb<'_>, role: &str, attrs: &str) {
    db.client()
        .await
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {role} {attrs}; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT CONNECT ON DATABASE \"{}\" TO {role};",
            db.name
        ))
        .await
        .expect("role");
}

/// Table and publication made by their owner (sql/outbox.sql, sql/publication.sql); the
/// relay's role creates only the slot.
#[tokio::test(flavor = "multi_thread")]
async fn init_as_the_relay_role_creates_only_the_missing_slot() {
    let db = PgCluster::shared().fresh_database("init_slot_only").await;
    create_role(&db, "init_relay", "LOGIN REPLICATION").await;
    let client = db.client().await;
    client
        .batch_execute(schema::OUTBOX_DDL)
        .await
        .expect("table");
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            db.publication
        ))
        .await
        .expect("publication");
    let (code, out) = init_as(&db, "init_relay");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(exists)"), "{out}");
    assert_eq!(out.matches("(created").count(), 1, "only the slot:\n{out}");
    assert!(ops::slot_row(&client, &db.slot).await.is_some(), "{out}");
}

/// Nothing exists and the role may not create a table in schema public (PG15+): exit 3,
/// naming the GRANT and the alternative.
#[tokio::test(flavor = "multi_thread")]
async fn init_without_create_on_the_schema_names_the_grant() {
    let db = PgCluster::shared().fresh_database("init_no_schema").await;
    create_role(&db, "init_noschema", "LOGIN REPLICATION").await;
    let (code, out) = init_as(&db, "init_noschema");
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("GRANT CREATE ON SCHEMA public TO init_noschema"),
        "{out}"
    );
    assert!(out.contains("sql/outbox.sql"), "the alternative: {out}");
    let client = db.client().await;
    assert!(ops::slot_row(&client, &db.slot).await.is_none(), "{out}");
}

/// The table's owner without CREATE on the database cannot create the publication
/// (PG15+): exit 3 naming GRANT CREATE ON DATABASE, and no slot is created before it.
#[tokio::test(flavor = "multi_thread")]
async fn init_as_table_owner_without_create_on_the_database_names_the_grant() {
    let db = PgCluster::shared()
        .fresh_database("init_no_db_create")
        .await;
    create_role(&db, "init_owner", "LOGIN REPLICATION").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{}\nALTER TABLE public.outbox OWNER TO init_owner;",
            schema::OUTBOX_DDL
        ))
        .await
        .expect("table");
    let (code, out) = init_as(&db, "init_owner");
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO init_owner",
            db.name
        )),
        "{out}"
    );
    assert!(
        out.contains("sql/publication.sql"),
        "the alternative: {out}"
    );
    assert!(ops::slot_row(&client, &db.slot).await.is_none(), "{out}");
}

fn psql_file(db: &TestDb<'_>, file: &str) -> Result<(), String> {
    let cluster = db.cluster();
    let out = Command::new(cluster.bindir().join("psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", cluster.host(), "-p", &cluster.port().to_string()])
        .args(["-U", cluster.superuser(), "-d", &db.name, "-f"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/").to_owned() + file)
        .output()
        .expect("psql");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The files a user runs by hand, in the README's order, twice each.
#[tokio::test(flavor = "multi_thread")]
async fn every_sql_file_runs_twice_as_written() {
    let db = PgCluster::shared().fresh_database("init_sql_files").await;
    for file in ["outbox.sql", "publication.sql", "role.sql", "examples.sql"] {
        for round in 1..=2 {
            if let Err(e) = psql_file(&db, file) {
                panic!("sql/{file} failed on run {round}:\n{e}");
            }
        }
    }
}
