//! Checks over an ordinary SQL connection before replicating: server settings, role
//! rights, publication contents and the slot's state.

use std::str::FromStr;

use pgoutput::Lsn;
use tokio_postgres::Client;

use crate::error::ReplError;

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
        .query_one("SELECT current_setting('max_replication_slots')::int4", &[])
        .await?
        .try_get(0)?)
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
