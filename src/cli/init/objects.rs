//! The table and the publication: created when missing, a publication that exists checked
//! against the outbox table.

use outbox_core::pgtype::quote_ident;
use outboxd_relay::pipeline::{judge_publication, table_candidates};
use pgrepl::preflight;
use tokio_postgres::Client;

use super::{quoted, say, InitError};
use crate::config::{shard_table, Settings};

pub(super) async fn create_table(
    s: &Settings,
    sql: &Client,
    table: &str,
    user: &str,
) -> Result<(), InitError> {
    let schema = quote_ident(&s.table_schema);
    let can_create: Option<bool> = sql
        .query_opt(
            "SELECT pg_catalog.has_schema_privilege(n.oid, 'CREATE'::text) FROM pg_catalog.pg_namespace n \
             WHERE n.nspname = $1",
            &[&s.table_schema],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    let refused = || {
        InitError::Refused(format!(
            "cannot create table {table}: role {user} has no CREATE privilege on schema \
             {schema} (PostgreSQL 15+ no longer grants it to PUBLIC on schema public). Either \
             grant it, as the schema's owner: GRANT CREATE ON SCHEMA {schema} TO {user}; or \
             create the table as its owner with sql/outbox.sql (adjusted to OUTBOXD_TABLE and \
             OUTBOXD_COLUMN_*) and run `outboxd init` again"
        ))
    };
    match can_create {
        None => {
            return Err(InitError::Refused(format!(
                "cannot create table {table}: schema {schema} does not exist. Create it \
                 (CREATE SCHEMA {schema}) or set OUTBOXD_TABLE"
            )))
        }
        Some(false) => return Err(refused()),
        Some(true) => {}
    }
    let headers = s
        .columns
        .headers
        .as_deref()
        .map(|h| format!(",\n    {} jsonb NULL", quote_ident(h)))
        .unwrap_or_default();
    let (id, aggregate_id) = (
        quote_ident(&s.columns.id),
        quote_ident(&s.columns.aggregate_id),
    );
    // A partitioned table's primary key must include the partition key.
    let (key, partitioning) = match &s.shards {
        Some(_) => (
            format!("{id} uuid NOT NULL"),
            format!(
                ",\n    PRIMARY KEY ({id}, {aggregate_id})\n) PARTITION BY HASH ({aggregate_id}"
            ),
        ),
        None => (format!("{id} uuid PRIMARY KEY"), String::new()),
    };
    // IF NOT EXISTS only for a concurrent `init`: the table was looked for above.
    let mut ddl = format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    {key},\n    {} text NOT NULL,\n    {aggregate_id} text NOT NULL,\n    {} text NOT NULL,\n    {} jsonb NOT NULL{headers},\n    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(){partitioning}\n)",
        quote_ident(&s.columns.aggregate_type),
        quote_ident(&s.columns.event_type),
        quote_ident(&s.columns.payload),
    );
    if let Some(shards) = &s.shards {
        refuse_taken_partition_names(s, sql, shards.count).await?;
        for i in 0..shards.count {
            ddl.push_str(&format!(
                ";\nCREATE TABLE IF NOT EXISTS {schema}.{} PARTITION OF {table} FOR VALUES WITH (MODULUS {}, REMAINDER {i})",
                quote_ident(&shard_table(&s.table_name, i)),
                shards.count
            ));
        }
    }
    match sql.batch_execute(&ddl).await {
        Err(e) if e.code().map(|c| c.code()) == Some("42501") => Err(refused()),
        other => Ok(other?),
    }
}

/// The table is missing, so a table named as one of its shards' partitions belongs to
/// something else (an old table renamed away without its partitions): `CREATE TABLE IF NOT
/// EXISTS` would pass over it and leave the new table without that shard.
async fn refuse_taken_partition_names(
    s: &Settings,
    sql: &Client,
    count: u32,
) -> Result<(), InitError> {
    let names: Vec<String> = (0..count).map(|i| shard_table(&s.table_name, i)).collect();
    let taken = sql
        .query(
            "SELECT c.relname::text, \
                    (SELECT i.inhparent::pg_catalog.regclass::text FROM pg_catalog.pg_inherits i \
                     WHERE i.inhrelid = c.oid LIMIT 1) \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2) ORDER BY c.relname",
            &[&s.table_schema, &names],
        )
        .await?;
    let Some(first) = taken.first() else {
        return Ok(());
    };
    let name: String = first.try_get(0)?;
    let parent: Option<String> = first.try_get(1)?;
    let schema = quote_ident(&s.table_schema);
    let owner = parent.map_or_else(String::new, |p| format!(" (a partition of {p})"));
    Err(InitError::Refused(format!(
        "cannot create the sharded table's partitions: {schema}.{} exists{owner}, and {} of \
         the {count} partition names are taken. Rename the old tables away (ALTER TABLE \
         {schema}.{} RENAME TO {}, and each other one), then run `outboxd init` again \
         (docs/operations.md, \"Sharding: adding shards or changing their count\")",
        quote_ident(&name),
        taken.len(),
        quote_ident(&name),
        quote_ident(&format!("{name}_old")),
    )))
}

/// An existing publication is left as it is (it may serve other subscribers, and its
/// owner decides what it publishes): init says whether it delivers the outbox's inserts,
/// by the rule `run` applies, and stops with the fix when it does not.
pub(super) async fn verify_existing_publication(
    s: &Settings,
    sql: &Client,
) -> Result<(), InitError> {
    if !s.relay_table {
        say!("ok  publication {} (exists)", s.publication);
        return Ok(());
    }
    let table = s.table();
    let coverage =
        preflight::publication_coverage(sql, &s.publication, &s.table_schema, &s.table_name)
            .await?
            .ok_or_else(|| {
                InitError::Refused(format!(
                    "publication {} was dropped while init ran: run `outboxd init` again",
                    s.publication
                ))
            })?;
    let candidates = table_candidates(sql, &coverage, &s.columns.aggregate_id)
        .await
        .map_err(|e| InitError::Refused(e.to_string()))?;
    match judge_publication(&coverage, &s.publication, &table, &candidates) {
        Ok(None) => {
            say!(
                "ok  publication {} (exists): publishes the inserts of {table}",
                s.publication
            );
            Ok(())
        }
        Ok(Some(warning)) => {
            say!("warn publication {} (exists): {warning}", s.publication);
            Ok(())
        }
        Err(problem) => Err(InitError::Refused(format!(
            "publication {} exists but does not deliver the inserts of {table}: {problem}. \
             Then run `outboxd init` again",
            s.publication
        ))),
    }
}

pub(super) async fn create_publication(
    s: &Settings,
    sql: &Client,
    table: &str,
    user: &str,
) -> Result<(), InitError> {
    let row = sql
        .query_one(
            "SELECT pg_catalog.current_database()::text, \
                    pg_catalog.has_database_privilege(pg_catalog.current_database()::text, 'CREATE'::text), \
                    (SELECT pg_catalog.pg_has_role(c.relowner, 'USAGE'::text) FROM pg_catalog.pg_class c \
                       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                      WHERE n.nspname = $1 AND c.relname = $2), \
                    (SELECT c.relowner::regrole::text FROM pg_catalog.pg_class c \
                       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                      WHERE n.nspname = $1 AND c.relname = $2)",
            &[&s.table_schema, &s.table_name],
        )
        .await?;
    let database: String = row.try_get(0)?;
    let can_create: bool = row.try_get(1)?;
    let owns_table: Option<bool> = row.try_get(2)?;
    let owner: Option<String> = row.try_get(3)?;
    let publication = quote_ident(&s.publication);
    let alternative = "or create it as the table's owner with sql/publication.sql (adjusted \
         to OUTBOXD_PUBLICATION and OUTBOXD_TABLE) and run `outboxd init` again";
    let no_create = || {
        InitError::Refused(format!(
            "cannot create publication {publication}: CREATE PUBLICATION needs the CREATE \
             privilege on the database (PostgreSQL 15+), which role {user} lacks. Either \
             grant it: GRANT CREATE ON DATABASE {} TO {user}; {alternative}",
            quoted(&database)
        ))
    };
    if !can_create {
        return Err(no_create());
    }
    if owns_table == Some(false) {
        return Err(InitError::Refused(format!(
            "cannot create publication {publication}: adding {table} to a publication needs \
             ownership of the table (owner: {}), which role {user} lacks. Either GRANT {} TO \
             {user}; {alternative}",
            owner.as_deref().unwrap_or("?"),
            owner
                .as_deref()
                .map_or_else(|| "<owner>".to_owned(), quote_ident),
        )));
    }
    let ddl = format!(
        "CREATE PUBLICATION {publication} FOR TABLE {table} WITH (publish = 'insert', publish_via_partition_root = true)"
    );
    match sql.batch_execute(&ddl).await {
        Err(e) if e.code().map(|c| c.code()) == Some("42501") => Err(InitError::Refused(format!(
            "cannot create publication {publication}: {}; {alternative}",
            pgrepl::error_chain(&e)
        ))),
        other => Ok(other?),
    }
}
