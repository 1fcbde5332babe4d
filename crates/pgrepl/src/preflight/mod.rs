//! Checks over an ordinary SQL connection before replicating: server settings, role
//! rights, publication contents and the slot's state.

use std::str::FromStr;

use pgoutput::Lsn;
use tokio_postgres::Client;

use crate::error::ReplError;

mod failover;
mod partitions;
mod publication;

pub use failover::{
    in_recovery, server_version_num, slot_failover, standby_settings, standby_slots,
    synchronized_standby_slots, SlotFailover, StandbySettings, StandbySlot,
};
pub use partitions::{
    loose_shard_tables, partitioning, shard_objects, LooseTable, PartitionBound, Partitioning,
    ShardObjects,
};
pub use publication::{
    walsender_sync_state, PublicationLook, PublicationProbe, Settler, SETTLE_TIMEOUT,
};

/// A row of `pg_replication_slots`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    /// reserved / extended / unreserved / lost (PG13+).
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
}

fn lsn(text: Option<String>) -> Result<Option<Lsn>, ReplError> {
    text.map(|t| Lsn::from_str(&t).map_err(|e| ReplError::Protocol(e.to_string())))
        .transpose()
}

/// `wal_level` (must be `logical`).
pub async fn wal_level(client: &Client) -> Result<String, ReplError> {
    Ok(client.query_one("SHOW wal_level", &[]).await?.try_get(0)?)
}

/// `max_replication_slots`.
pub async fn max_replication_slots(client: &Client) -> Result<i32, ReplError> {
    Ok(client
        .query_one(
            "SELECT pg_catalog.current_setting('max_replication_slots')::int4",
            &[],
        )
        .await?
        .try_get(0)?)
}

/// The server settings logical replication depends on, and how much of them is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub wal_level: String,
    pub max_replication_slots: i32,
    /// Slots of every kind that exist now (each takes one of `max_replication_slots`).
    pub replication_slots_in_use: i64,
    pub max_wal_senders: i32,
    /// Walsender processes running now (each takes one of `max_wal_senders`).
    pub wal_senders_in_use: i64,
    /// `max_slot_wal_keep_size` in MB; -1 is no cap; `None` before PostgreSQL 13.
    pub max_slot_wal_keep_size_mb: Option<i64>,
    /// `idle_replication_slot_timeout` in seconds; 0 is off; `None` before PostgreSQL 18.
    pub idle_replication_slot_timeout_s: Option<i64>,
}

/// One query, readable by any role (pg_settings, pg_replication_slots, pg_stat_activity's
/// backend_type are not restricted).
pub async fn server_settings(client: &Client) -> Result<ServerSettings, ReplError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.current_setting('wal_level'), \
                    pg_catalog.current_setting('max_replication_slots')::int4, \
                    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_replication_slots), \
                    pg_catalog.current_setting('max_wal_senders')::int4, \
                    (SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walsender'), \
                    (SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'max_slot_wal_keep_size'), \
                    (SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = 'idle_replication_slot_timeout')",
            &[],
        )
        .await?;
    Ok(ServerSettings {
        wal_level: row.try_get(0)?,
        max_replication_slots: row.try_get(1)?,
        replication_slots_in_use: row.try_get(2)?,
        max_wal_senders: row.try_get(3)?,
        wal_senders_in_use: row.try_get(4)?,
        max_slot_wal_keep_size_mb: row.try_get(5)?,
        idle_replication_slot_timeout_s: row.try_get(6)?,
    })
}

/// Whether `user` may open a replication connection (REPLICATION or superuser).
pub async fn role_can_replicate(client: &Client, user: &str) -> Result<bool, ReplError> {
    let row = client
        .query_opt(
            "SELECT rolreplication OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = $1",
            &[&user],
        )
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
        None => false,
    })
}

/// Whether publication `publication` may have changed since slot `slot` last decoded:
/// one of its catalog rows (the publication's own, a table's or a schema's in it) was
/// written by a transaction at or after the slot's `catalog_xmin`, the oldest transaction
/// whose catalog changes the slot may still have to decode with. Older rows are from
/// before anything the slot has not confirmed. Conservative: a change just before the
/// slot's last confirmed position counts too. A row 2^31 transactions old or more has a
/// negative `age` (frozen rows keep their xmin) and never counts; one exactly 2^32 old
/// would alias a new one. A table dropped from it leaves no row: the publication then
/// no longer covers it, which the start refuses anyway. Only for a slot that has decoded
/// a transaction (`pg_stat_replication_slots.total_txns`): a new one's `catalog_xmin` is
/// the oldest transaction running when it was made, often older than a publication made
/// just before it, and it has decoded nothing under another publication anyway (stats
/// lost in a crash or reset also skip the check). `false` without such a slot or
/// publication. Every name is schema-qualified and every operator is on exact
/// pg_catalog types (`xid` through `age`, `oid = oid`), so nothing in the search path is
/// called.
pub async fn publication_changed_since_slot(
    client: &Client,
    publication: &str,
    slot: &str,
) -> Result<bool, ReplError> {
    let namespaces = if server_version_num(client).await? >= 150_000 {
        " OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace n WHERE n.pnpubid OPERATOR(pg_catalog.=) p.oid AND pg_catalog.age(n.xmin) OPERATOR(pg_catalog.>=) 0 AND pg_catalog.age(n.xmin) OPERATOR(pg_catalog.<=) pg_catalog.age(s.catalog_xmin))"
    } else {
        ""
    };
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s, pg_catalog.pg_publication p, pg_catalog.pg_stat_replication_slots st \
         WHERE s.slot_name OPERATOR(pg_catalog.=) $1::pg_catalog.name AND p.pubname OPERATOR(pg_catalog.=) $2::pg_catalog.name \
         AND st.slot_name OPERATOR(pg_catalog.=) s.slot_name AND st.total_txns OPERATOR(pg_catalog.>) 0::pg_catalog.int8 \
         AND s.catalog_xmin IS NOT NULL \
         AND ((pg_catalog.age(p.xmin) OPERATOR(pg_catalog.>=) 0 AND pg_catalog.age(p.xmin) OPERATOR(pg_catalog.<=) pg_catalog.age(s.catalog_xmin)) \
         OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r WHERE r.prpubid OPERATOR(pg_catalog.=) p.oid AND pg_catalog.age(r.xmin) OPERATOR(pg_catalog.>=) 0 AND pg_catalog.age(r.xmin) OPERATOR(pg_catalog.<=) pg_catalog.age(s.catalog_xmin)){namespaces}))"
    );
    let row = client.query_one(&sql, &[&slot, &publication]).await?;
    Ok(row.try_get(0)?)
}

pub async fn publication_exists(client: &Client, name: &str) -> Result<bool, ReplError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)",
            &[&name],
        )
        .await?
        .try_get(0)?)
}

/// `(schema, table)` pairs the publication covers, sorted.
pub async fn publication_tables(
    client: &Client,
    name: &str,
) -> Result<Vec<(String, String)>, ReplError> {
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 ORDER BY 1, 2",
            &[&name],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// `(column, type name, type OID)` in column order, or `None` when the table is missing.
pub async fn table_columns(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<Vec<(String, String, u32)>>, ReplError> {
    let exists = client
        .query_opt(
            "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&schema, &table],
        )
        .await?;
    let Some(row) = exists else {
        return Ok(None);
    };
    let relid: u32 = row.try_get(0)?;
    let rows = client
        .query(
            "SELECT attname::text, atttypid::regtype::text, atttypid FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&relid],
        )
        .await?;
    let columns = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect::<Result<Vec<_>, ReplError>>()?;
    Ok(Some(columns))
}

/// Whether the slot has decoded any transaction (`pg_stat_replication_slots.total_txns`;
/// PostgreSQL forgets it after a crash or `pg_stat_reset_replication_slot()`). Read before
/// streaming: the walsender counts what it decodes from then on.
pub async fn slot_decoded(client: &Client, slot: &str) -> Result<bool, ReplError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_replication_slots \
             WHERE slot_name OPERATOR(pg_catalog.=) $1::pg_catalog.name \
             AND total_txns OPERATOR(pg_catalog.>) 0::pg_catalog.int8)",
            &[&slot],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// A subquery (give it an alias) of `relid` and `isleaf`: the relation whose OID the SQL
/// expression `root` gives, and its partitions at any depth, read from `pg_inherits` alone.
///
/// Not `pg_partition_tree`: it takes ACCESS SHARE on every partition and holds it to the
/// statement's end. A statement that then waits for a parent's lock (PG16+'s
/// `pg_publication_tables` opens each table it lists) deadlocks with DDL that locks the
/// parent first, such as `CREATE TABLE ... PARTITION OF` beside a DEFAULT partition, and
/// PostgreSQL may cancel the application's DDL to break it. outboxd's catalog reads take
/// no lock on the outbox's tables; the functions that open one (`pg_relation_size`,
/// `pg_publication_tables` on PG16+, a relation's `pg_get_expr`) take one table at a
/// time. A partition being detached CONCURRENTLY is left out, as `pg_partition_tree`
/// leaves it out.
pub(crate) fn partition_tree(root: &str) -> String {
    format!(
        "(WITH RECURSIVE tree(relid) AS ( \
             SELECT c.oid FROM pg_catalog.pg_class c WHERE c.oid = {root} \
             UNION SELECT i.inhrelid FROM pg_catalog.pg_inherits i \
               JOIN tree ON i.inhparent = tree.relid \
               JOIN pg_catalog.pg_class ic ON ic.oid = i.inhrelid AND ic.relispartition \
              WHERE NOT i.inhdetachpending) \
         SELECT tree.relid, lc.relkind <> 'p' AS isleaf FROM tree \
           JOIN pg_catalog.pg_class lc ON lc.oid = tree.relid)"
    )
}

/// The table named `$1` (quoted, qualified) and its partitions at any depth, as `t.relid`.
fn table_tree() -> String {
    format!(
        "{} t",
        partition_tree("pg_catalog.to_regclass($1::pg_catalog.text)")
    )
}

/// Rows ever inserted into and deleted from the table and its partitions, by the server's
/// statistics: `(inserted, deleted)`, `None` when the table is not found.
pub async fn table_churn(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<(i64, i64)>, ReplError> {
    let name = format!(
        "{}.{}",
        crate::query::quote_ident(schema),
        crate::query::quote_ident(table)
    );
    let row = client
        .query_one(
            &format!(
                "SELECT pg_catalog.to_regclass($1::text) IS NOT NULL, \
                 coalesce(pg_catalog.sum(s.n_tup_ins), 0::numeric)::bigint, \
                 coalesce(pg_catalog.sum(s.n_tup_del), 0::numeric)::bigint \
                 FROM pg_catalog.pg_stat_all_tables s \
                 WHERE s.relid IN (SELECT t.relid FROM {tree})",
                tree = table_tree()
            ),
            &[&name],
        )
        .await?;
    if !row.try_get::<_, bool>(0)? {
        return Ok(None);
    }
    Ok(Some((row.try_get(1)?, row.try_get(2)?)))
}

/// The slot's row in `pg_replication_slots`, or `None` when it does not exist.
pub async fn slot_state(client: &Client, name: &str) -> Result<Option<SlotState>, ReplError> {
    let row = client
        .query_opt(
            "SELECT plugin::text, slot_type, database::text, active, active_pid, \
                    confirmed_flush_lsn::text, restart_lsn::text, wal_status, safe_wal_size \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(SlotState {
        plugin: row.try_get(0)?,
        slot_type: row.try_get(1)?,
        database: row.try_get(2)?,
        active: row.try_get(3)?,
        active_pid: row.try_get(4)?,
        confirmed_flush_lsn: lsn(row.try_get(5)?)?,
        restart_lsn: lsn(row.try_get(6)?)?,
        wal_status: row.try_get(7)?,
        safe_wal_size: row.try_get(8)?,
    }))
}

/// `pg_current_wal_lsn()` (primary only).
pub async fn current_wal_lsn(client: &Client) -> Result<Lsn, ReplError> {
    let text: String = client
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .await?
        .try_get(0)?;
    Lsn::from_str(&text).map_err(|e| ReplError::Protocol(e.to_string()))
}

/// Whether an event trigger of this name exists and is enabled.
pub async fn event_trigger_enabled(client: &Client, name: &str) -> Result<bool, ReplError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger \
             WHERE evtname = $1 AND evtenabled <> 'D')",
            &[&name],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// `TimeZone`, `DateStyle` and `bytea_output` as this session has them: what a text-mode
/// value's bytes depend on. A configuration reload changes them in every session that did
/// not set them itself, the walsender's included.
pub async fn output_settings(client: &Client) -> Result<[String; 3], ReplError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.current_setting('TimeZone'::pg_catalog.text), pg_catalog.current_setting('DateStyle'::pg_catalog.text), pg_catalog.current_setting('bytea_output'::pg_catalog.text)",
            &[],
        )
        .await?;
    Ok([row.try_get(0)?, row.try_get(1)?, row.try_get(2)?])
}

/// The server's clock now, in PostgreSQL's microseconds since 2000-01-01: the clock
/// commit times are read from, so a time an operator compares with `created_at`.
pub async fn server_clock(client: &Client) -> Result<i64, ReplError> {
    let row = client
        .query_one(
            "SELECT ((pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) 946684800::pg_catalog.float8) OPERATOR(pg_catalog.*) 1000000::pg_catalog.float8)::pg_catalog.int8",
            &[],
        )
        .await?;
    Ok(row.try_get::<_, i64>(0)?)
}

/// Whether the table has rows in an exported snapshot (a slot's consistent point: the rows
/// it shows are the ones the slot never decodes). `None`: the role may not read the table.
/// The snapshot must still be valid: its replication connection idle.
pub async fn rows_in_snapshot(
    client: &Client,
    snapshot: &str,
    schema: &str,
    table: &str,
) -> Result<Option<bool>, ReplError> {
    let name = format!(
        "{}.{}",
        crate::query::quote_ident(schema),
        crate::query::quote_ident(table)
    );
    client
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT {}",
            crate::query::quote_literal(snapshot)
        ))
        .await?;
    // Identifiers quoted above.
    let found = client
        .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {name})"), &[])
        .await;
    let ended = client.batch_execute("ROLLBACK").await;
    let found = match found {
        Ok(row) => Some(row.try_get::<_, bool>(0)?),
        Err(e) if e.code().is_some_and(|c| c.code() == "42501") => None,
        Err(e) => return Err(e.into()),
    };
    ended?;
    Ok(found)
}

/// Whether a table holds rows, or held some, as far as outboxd can tell without reading
/// data it may not be allowed to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableRows {
    /// No row now, and none ever counted by the server's statistics.
    Empty,
    /// At least one row.
    Some,
    /// None now, but the statistics count inserts (an insert-then-delete outbox, rows
    /// cleaned up): rows were written, and a slot may have existed for them.
    Were,
    /// Pages on disk, and no right to look into them (no SELECT, or row security).
    Unknown,
    /// No such table.
    Missing,
}

/// Whether the table (every partition of it) has rows or had some: what tells a first
/// start from a lost slot, since rows committed while no slot existed are never decoded.
pub async fn table_rows(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<TableRows, ReplError> {
    let name = format!(
        "{}.{}",
        crate::query::quote_ident(schema),
        crate::query::quote_ident(table)
    );
    // Every table of the tree: the table itself, and its partitions at any depth.
    let row = match client
        .query_one(
            &format!(
                "SELECT pg_catalog.to_regclass($1::text) IS NOT NULL, \
                 coalesce(pg_catalog.bool_or(pg_catalog.row_security_active(t.relid)), false), \
                 coalesce(pg_catalog.sum(pg_catalog.pg_relation_size(t.relid)), 0::numeric)::bigint, \
                 coalesce((SELECT pg_catalog.sum(s.n_tup_ins) FROM pg_catalog.pg_stat_all_tables s \
                           WHERE s.relid IN (SELECT t.relid FROM {tree})), 0::numeric)::bigint \
                 FROM {tree}",
                tree = table_tree()
            ),
            &[&name],
        )
        .await
    {
        Ok(row) => row,
        // No USAGE on the schema: nothing can be told.
        Err(e) if e.code().is_some_and(|c| c.code() == "42501") => return Ok(TableRows::Unknown),
        Err(e) => return Err(e.into()),
    };
    if !row.try_get::<_, bool>(0)? {
        return Ok(TableRows::Missing);
    }
    let row_security: bool = row.try_get(1)?;
    let bytes: i64 = row.try_get(2)?;
    let inserts: i64 = row.try_get(3)?;
    let now = if bytes == 0 {
        TableRows::Empty
    } else if row_security {
        // Rows the policies hide would read as none.
        TableRows::Unknown
    } else {
        // Identifiers quoted above.
        match client
            .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {name})"), &[])
            .await
        {
            Ok(row) if row.try_get::<_, bool>(0)? => TableRows::Some,
            Ok(_) => TableRows::Empty,
            Err(e) if e.code().is_some_and(|c| c.code() == "42501") => TableRows::Unknown,
            Err(e) => return Err(e.into()),
        }
    };
    Ok(match now {
        TableRows::Empty if inserts > 0 => TableRows::Were,
        other => other,
    })
}

/// The distinct combinations of `columns`' text values (as pgoutput's text format sends
/// them; NULL as `None`) among the rows of `schema.table` and its partitions, at most
/// `limit` of them, and whether there were more. For `check`, which renders the topic
/// template over them. A statement timeout of `timeout_ms` bounds the scan, which
/// distinct values over a large table cost.
pub async fn distinct_values(
    client: &Client,
    schema: &str,
    table: &str,
    columns: &[&str],
    limit: usize,
    timeout_ms: u32,
) -> Result<(Vec<Vec<Option<String>>>, bool), ReplError> {
    use tokio_postgres::SimpleQueryMessage;
    let name = format!(
        "{}.{}",
        crate::query::quote_ident(schema),
        crate::query::quote_ident(table)
    );
    let list: Vec<String> = columns
        .iter()
        .map(|c| format!("{}::pg_catalog.text", crate::query::quote_ident(c)))
        .collect();
    // One query string, so SET LOCAL lasts exactly as long as the scan: the session's
    // own settings are left as they were. Identifiers quoted above.
    let text = format!(
        "SET LOCAL statement_timeout = {timeout_ms}; \
         SELECT DISTINCT {} FROM {name} LIMIT {}",
        list.join(", "),
        limit.saturating_add(1)
    );
    let mut rows = Vec::new();
    for message in client.simple_query(&text).await? {
        if let SimpleQueryMessage::Row(row) = message {
            rows.push(
                (0..columns.len())
                    .map(|i| row.try_get(i).map(|v| v.map(str::to_owned)))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
    }
    let cut = rows.len() > limit;
    rows.truncate(limit);
    Ok((rows, cut))
}

/// How a publication covers the outbox table, from `pg_publication` and
/// `pg_publication_tables`: what decides whether the table's inserts reach the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationCoverage {
    /// `pubinsert`: without it no insert is decoded.
    pub publishes_insert: bool,
    /// `pubviaroot`: whether changes of a partition are named after the partitioned table.
    pub via_partition_root: bool,
    /// `relkind` of the table (`r` plain, `p` partitioned, ...); `None`: it does not exist.
    pub table_kind: Option<String>,
    /// The table itself is listed for the publication.
    pub table_listed: bool,
    /// Partitions (any depth) of the table listed for the publication: what the server
    /// publishes, under their own names, when `pubviaroot` is off.
    pub partitions_listed: i64,
    /// Leaf partitions (any depth; plain tables only, foreign ones write no WAL) of the
    /// table that neither they nor an ancestor are listed for the publication: their
    /// rows are never sent when the table itself is not listed.
    pub leaves_unlisted: i64,
    /// A row filter (`WHERE`, PostgreSQL 15+) on the table, a partition or an ancestor
    /// of it in this publication: the rows it rejects are never sent.
    pub row_filtered: bool,
    /// A column list (PostgreSQL 15+) on the same: the other columns are never sent.
    pub column_listed: bool,
    /// The table or any of its partitions (any depth) that is UNLOGGED, as quoted
    /// `schema.name`, one a line: their rows are never written to the WAL, so no
    /// publication can send them.
    pub unlogged: Option<String>,
    /// Tables that inherit from the table (`INHERITS`, not partitions), as quoted
    /// `schema.name`, one a line: rows inserted into one are its own, named after it in the
    /// stream, and not the outbox's.
    pub inheritance_children: Option<String>,
    /// Foreign tables among the table's partitions (any depth): rows routed to one are
    /// stored by another server and never written to this WAL.
    pub foreign: Vec<ForeignPartition>,
}

/// A foreign table attached as a partition of the outbox; names quoted and qualified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignPartition {
    pub name: String,
    pub parent: String,
    /// `FOR VALUES ...` or `DEFAULT`, as `pg_get_expr` prints it.
    pub bound: String,
    /// A name beside it for the plain partition that replaces it (`<name>_local_<oid>`,
    /// short enough for any name).
    pub local: String,
    /// The outbox's columns an INSERT may name (not generated), quoted, comma-separated:
    /// a partition attached with its columns in another order matches them by name, and
    /// `SELECT *` would give them by position.
    pub columns: String,
}

/// Tables (plain or partitioned, not partitions) outside the system schemas that have a
/// column named `column`, as quoted `schema.name`, at most five (an error message names
/// them): what the outbox table may be called when the configured one does not exist.
pub async fn tables_with_column(client: &Client, column: &str) -> Result<Vec<String>, ReplError> {
    let rows = client
        .query(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped \
               AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
               AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
               AND n.nspname NOT LIKE 'pg\\_%' \
             ORDER BY 1 LIMIT 5",
            &[&column],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// `None` when the publication does not exist.
pub async fn publication_coverage(
    client: &Client,
    publication: &str,
    schema: &str,
    table: &str,
) -> Result<Option<PublicationCoverage>, ReplError> {
    // The tree and its foreign tables are read once (a CTE named twice is materialized).
    let sql = format!(
        "WITH t AS ( \
               SELECT c.oid, c.relkind::text AS relkind FROM pg_catalog.pg_class c \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
               WHERE n.nspname = $2 AND c.relname = $3), \
             tr AS (SELECT l.relid, l.isleaf FROM {tree} l), \
             f AS ( \
               SELECT fc.oid, pg_catalog.format('%I.%I', fn.nspname, fc.relname) AS name, \
                      pg_catalog.format('%I.%I', pn.nspname, pc.relname) AS parent, \
                      pg_catalog.pg_get_expr(fc.relpartbound, 0) AS bound, \
                      pg_catalog.format('%I.%I', fn.nspname, \
                        pg_catalog.left(fc.relname, 10) || '_local_' || fc.oid::text) AS local \
               FROM pg_catalog.pg_class fc \
               JOIN pg_catalog.pg_namespace fn ON fn.oid = fc.relnamespace \
               JOIN pg_catalog.pg_inherits fi ON fi.inhrelid = fc.oid \
               JOIN pg_catalog.pg_class pc ON pc.oid = fi.inhparent \
               JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace \
               WHERE fc.relkind = 'f' AND fc.oid IN (SELECT tr.relid FROM tr)), \
             r AS ( \
               SELECT pr.prpubid, pg_catalog.to_jsonb(pr) ->> 'prqual'::text AS prqual, \
                      pg_catalog.to_jsonb(pr) ->> 'prattrs'::text AS prattrs \
               FROM pg_catalog.pg_publication_rel pr \
               WHERE pr.prrelid = (SELECT oid FROM t) \
                  OR EXISTS (SELECT 1 FROM pg_catalog.pg_partition_ancestors(pr.prrelid) a \
                             WHERE a.relid::oid = (SELECT oid FROM t)) \
                  OR EXISTS (SELECT 1 FROM pg_catalog.pg_partition_ancestors((SELECT oid FROM t)) a \
                             WHERE a.relid::oid = pr.prrelid)) \
             SELECT p.pubinsert, p.pubviaroot, (SELECT relkind FROM t), \
               EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables pt \
                       WHERE pt.pubname = p.pubname AND pt.schemaname = $2 AND pt.tablename = $3), \
               (SELECT pg_catalog.count(*) FROM pg_catalog.pg_publication_tables pt \
                  JOIN pg_catalog.pg_namespace pn ON pn.nspname = pt.schemaname \
                  JOIN pg_catalog.pg_class pc ON pc.relnamespace = pn.oid AND pc.relname = pt.tablename \
                 WHERE pt.pubname = p.pubname AND pc.relispartition \
                   AND EXISTS (SELECT 1 FROM pg_catalog.pg_partition_ancestors(pc.oid) a \
                               WHERE a.relid::oid = (SELECT oid FROM t))), \
               (SELECT pg_catalog.count(*) FROM tr l \
                 JOIN pg_catalog.pg_class lc ON lc.oid = l.relid::oid AND lc.relkind = 'r' \
                 WHERE l.isleaf AND l.relid::oid <> (SELECT oid FROM t) AND NOT EXISTS ( \
                   SELECT 1 FROM pg_catalog.pg_partition_ancestors(l.relid) a \
                   JOIN pg_catalog.pg_class ac ON ac.oid = a.relid::oid \
                   JOIN pg_catalog.pg_namespace an ON an.oid = ac.relnamespace \
                   JOIN pg_catalog.pg_publication_tables pt ON pt.pubname = p.pubname \
                    AND pt.schemaname = an.nspname AND pt.tablename = ac.relname)), \
               EXISTS (SELECT 1 FROM r WHERE r.prpubid = p.oid AND r.prqual IS NOT NULL), \
               EXISTS (SELECT 1 FROM r WHERE r.prpubid = p.oid AND r.prattrs IS NOT NULL), \
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I.%I', un.nspname, uc.relname), E'\\n' \
                         ORDER BY un.nspname, uc.relname) \
                  FROM pg_catalog.pg_class uc \
                  JOIN pg_catalog.pg_namespace un ON un.oid = uc.relnamespace \
                 WHERE uc.relpersistence = 'u' AND uc.relkind = 'r' \
                   AND (uc.oid = (SELECT oid FROM t) OR uc.oid IN (SELECT tr.relid FROM tr))), \
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I.%I', cn.nspname, cc.relname), E'\\n' \
                         ORDER BY cn.nspname, cc.relname) \
                  FROM pg_catalog.pg_inherits i \
                  JOIN pg_catalog.pg_class cc ON cc.oid = i.inhrelid \
                  JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
                 WHERE i.inhparent = (SELECT oid FROM t) AND NOT cc.relispartition), \
               ARRAY(SELECT f.name FROM f ORDER BY f.oid), \
               ARRAY(SELECT f.parent FROM f ORDER BY f.oid), \
               ARRAY(SELECT f.bound FROM f ORDER BY f.oid), \
               ARRAY(SELECT f.local FROM f ORDER BY f.oid), \
               (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' \
                   ORDER BY a.attnum) FROM pg_catalog.pg_attribute a \
                  WHERE a.attrelid = (SELECT oid FROM t) AND a.attnum > 0 \
                    AND NOT a.attisdropped AND a.attgenerated = '') \
             FROM pg_catalog.pg_publication p WHERE p.pubname = $1",
        tree = partition_tree("(SELECT oid FROM t)")
    );
    let row = client
        .query_opt(&sql, &[&publication, &schema, &table])
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(PublicationCoverage {
        publishes_insert: row.try_get(0)?,
        via_partition_root: row.try_get(1)?,
        table_kind: row.try_get(2)?,
        table_listed: row.try_get(3)?,
        partitions_listed: row.try_get(4)?,
        leaves_unlisted: row.try_get(5)?,
        row_filtered: row.try_get(6)?,
        column_listed: row.try_get(7)?,
        unlogged: row.try_get(8)?,
        inheritance_children: row.try_get(9)?,
        foreign: foreign_partitions(
            [
                row.try_get(10)?,
                row.try_get(11)?,
                row.try_get(12)?,
                row.try_get(13)?,
            ],
            row.try_get::<_, Option<String>>(14)?.unwrap_or_default(),
        ),
    }))
}

fn foreign_partitions(
    [names, parents, bounds, locals]: [Vec<String>; 4],
    columns: String,
) -> Vec<ForeignPartition> {
    names
        .into_iter()
        .zip(parents)
        .zip(bounds.into_iter().zip(locals))
        .map(|((name, parent), (bound, local))| ForeignPartition {
            name,
            parent,
            bound,
            local,
            columns: columns.clone(),
        })
        .collect()
}

/// Whether relation `rel_id` is a partition, at any depth, of `schema.table` in the
/// current catalog (pgoutput names a partition's rows after the partition unless the
/// publication sets `publish_via_partition_root`).
pub async fn is_partition_of(
    client: &Client,
    rel_id: u32,
    schema: &str,
    table: &str,
) -> Result<bool, ReplError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class pc \
               CROSS JOIN LATERAL pg_catalog.pg_partition_ancestors(pc.oid) a \
               JOIN pg_catalog.pg_class c ON c.oid = a.relid::oid \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE pc.oid = $1 AND pc.relispartition AND a.relid::oid <> pc.oid \
                AND n.nspname = $2 AND c.relname = $3)",
            &[&rel_id, &schema, &table],
        )
        .await?
        .try_get(0)?)
}

/// The `pg_logical_emit_message` overloads PUBLIC may execute, as `regprocedure` text
/// (their signatures differ between versions: PG17 added a `flush` argument). Any role
/// can write a logical message into the WAL with one of them.
pub async fn emit_message_functions_public_can_execute(
    client: &Client,
) -> Result<Vec<String>, ReplError> {
    let rows = client
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p \
             WHERE p.proname = 'pg_logical_emit_message' \
               AND p.pronamespace = 'pg_catalog'::regnamespace::oid \
               AND pg_catalog.has_function_privilege('public'::text, p.oid, 'EXECUTE'::text) \
             ORDER BY 1",
            &[],
        )
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}
