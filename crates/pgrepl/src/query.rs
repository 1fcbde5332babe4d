//! Replication commands over the simple query protocol (the only one a walsender accepts).

use std::str::FromStr;

use bytes::Bytes;
use pgoutput::Lsn;
use postgres_protocol::message::frontend;

use crate::connection::ReplicationConnection;
use crate::error::ReplError;
use crate::wire::Backend;

/// `server_version_num` from which slots can be failover slots.
pub const FAILOVER_SLOTS_VERSION: u32 = 170_000;

/// Result of `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemInfo {
    /// Cluster identifier; a different value means a different cluster (e.g. a restored
    /// backup), whose LSNs must not be compared with stored ones.
    pub system_id: String,
    pub timeline: u32,
    pub xlog_pos: Lsn,
    pub dbname: Option<String>,
}

/// Result of `CREATE_REPLICATION_SLOT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCreated {
    pub slot_name: String,
    /// Becomes the slot's initial `confirmed_flush_lsn`.
    pub consistent_point: Lsn,
    /// The snapshot of the consistent point, when exported: valid until this connection
    /// runs its next command. What it shows committed is what the slot never decodes.
    pub snapshot_name: Option<String>,
}

/// Rows of a simple query: column names, then text values.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<Bytes>>>,
}

impl Rows {
    fn single_row(&self, what: &str) -> Result<&[Option<Bytes>], ReplError> {
        match self.rows.as_slice() {
            [row] => Ok(row),
            rows => Err(ReplError::Protocol(format!(
                "{what} returned {} rows, expected 1",
                rows.len()
            ))),
        }
    }

    fn text(&self, row: &[Option<Bytes>], name: &str) -> Result<Option<String>, ReplError> {
        let idx = self
            .columns
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| ReplError::Protocol(format!("result has no column {name:?}")))?;
        Ok(row
            .get(idx)
            .cloned()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    fn required(&self, row: &[Option<Bytes>], name: &str) -> Result<String, ReplError> {
        self.text(row, name)?
            .ok_or_else(|| ReplError::Protocol(format!("column {name:?} is NULL")))
    }
}

/// Quotes an identifier for a replication command: `"` doubled, whole name in `"…"`.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal: `'` doubled.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn parse_lsn(text: &str) -> Result<Lsn, ReplError> {
    Lsn::from_str(text).map_err(|e| ReplError::Protocol(e.to_string()))
}

impl ReplicationConnection {
    /// Sends one simple query and collects its rows until ReadyForQuery. An ErrorResponse
    /// is returned after ReadyForQuery so the connection stays usable.
    pub(crate) async fn simple_query(&mut self, sql: &str) -> Result<Rows, ReplError> {
        tracing::debug!(sql, "replication command");
        self.conn
            .send("sending a replication command", |buf| {
                frontend::query(sql, buf)
            })
            .await?;
        let mut rows = Rows::default();
        let mut error = None;
        loop {
            match self.conn.recv("reading a command result").await? {
                Backend::RowDescription(columns) => rows.columns = columns,
                Backend::DataRow(values) => rows.rows.push(values),
                Backend::CommandComplete
                | Backend::EmptyQueryResponse
                | Backend::ParameterStatus { .. } => {}
                Backend::Notice(n) => tracing::info!(notice = %n, "server notice"),
                Backend::Error(e) => error = Some(e),
                Backend::ReadyForQuery => break,
                other => {
                    return Err(ReplError::Protocol(format!(
                        "unexpected message in a command result: {}",
                        other.describe()
                    )))
                }
            }
        }
        match error {
            Some(e) => Err(ReplError::Server(Box::new(e))),
            None => Ok(rows),
        }
    }

    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<SystemInfo, ReplError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows.single_row("IDENTIFY_SYSTEM")?;
        let timeline = rows.required(row, "timeline")?;
        Ok(SystemInfo {
            system_id: rows.required(row, "systemid")?,
            timeline: timeline
                .parse()
                .map_err(|_| ReplError::Protocol(format!("invalid timeline {timeline:?}")))?,
            xlog_pos: parse_lsn(&rows.required(row, "xlogpos")?)?,
            dbname: rows.text(row, "dbname")?,
        })
    }

    /// `TIMELINE_HISTORY tli`: the history file of timeline `tli` (2 or more), as text:
    /// `parentTLI<TAB>switchpoint<TAB>reason` lines.
    pub async fn timeline_history(&mut self, timeline: u32) -> Result<String, ReplError> {
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {timeline}"))
            .await?;
        let row = rows.single_row("TIMELINE_HISTORY")?;
        // The walsender sends the file's bytes as they are, though the column is bytea.
        rows.required(row, "content")
    }

    /// `SHOW name` (e.g. `wal_sender_timeout`, `server_version_num`).
    pub async fn show(&mut self, name: &str) -> Result<String, ReplError> {
        let rows = self
            .simple_query(&format!("SHOW {}", quote_ident(name)))
            .await?;
        let row = rows.single_row("SHOW")?;
        row.first()
            .cloned()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .ok_or_else(|| ReplError::Protocol(format!("SHOW {name} returned NULL")))
    }

    /// The server version as `server_version_num` (e.g. 150018), cached.
    pub async fn server_version_num(&mut self) -> Result<u32, ReplError> {
        if let Some(v) = self.version_num {
            return Ok(v);
        }
        let text = self.show("server_version_num").await?;
        let v = text
            .trim()
            .parse()
            .map_err(|_| ReplError::Protocol(format!("invalid server_version_num {text:?}")))?;
        self.version_num = Some(v);
        Ok(v)
    }

    /// Creates a logical slot for pgoutput without exporting a snapshot: the outbox relay
    /// starts from the slot's consistent point and never needs the snapshot.
    pub async fn create_logical_slot(
        &mut self,
        name: &str,
        temporary: bool,
    ) -> Result<SlotCreated, ReplError> {
        self.create_logical_slot_with(name, temporary, false).await
    }

    /// [`Self::create_logical_slot`], optionally as a failover slot (PG17+): standbys with
    /// `sync_replication_slots` keep a copy, so the slot survives a promotion.
    pub async fn create_logical_slot_with(
        &mut self,
        name: &str,
        temporary: bool,
        failover: bool,
    ) -> Result<SlotCreated, ReplError> {
        self.create_slot(name, temporary, failover, false).await
    }

    /// [`Self::create_logical_slot_with`] (a permanent slot), exporting the snapshot of
    /// its consistent point: see [`SlotCreated::snapshot_name`].
    pub async fn create_logical_slot_exported(
        &mut self,
        name: &str,
        failover: bool,
    ) -> Result<SlotCreated, ReplError> {
        self.create_slot(name, false, failover, true).await
    }

    async fn create_slot(
        &mut self,
        name: &str,
        temporary: bool,
        failover: bool,
        export: bool,
    ) -> Result<SlotCreated, ReplError> {
        let version = self.server_version_num().await?;
        let temp = if temporary { " TEMPORARY" } else { "" };
        if failover && version < FAILOVER_SLOTS_VERSION {
            return Err(ReplError::Unsupported(format!(
                "failover slots need PostgreSQL 17 or later (server_version_num {version})"
            )));
        }
        let snapshot = if export { "export" } else { "nothing" };
        let options = match (version >= 150_000, failover) {
            (true, true) => format!(" (SNAPSHOT '{snapshot}', FAILOVER true)"),
            (true, false) => format!(" (SNAPSHOT '{snapshot}')"),
            // Unreachable with failover: checked above.
            (false, _) if export => " EXPORT_SNAPSHOT".to_owned(),
            (false, _) => " NOEXPORT_SNAPSHOT".to_owned(),
        };
        let sql = format!(
            "CREATE_REPLICATION_SLOT {}{temp} LOGICAL pgoutput{options}",
            quote_ident(name)
        );
        let rows = self.simple_query(&sql).await?;
        let row = rows.single_row("CREATE_REPLICATION_SLOT")?;
        Ok(SlotCreated {
            slot_name: rows.required(row, "slot_name")?,
            consistent_point: parse_lsn(&rows.required(row, "consistent_point")?)?,
            snapshot_name: if export {
                rows.text(row, "snapshot_name")?
            } else {
                None
            },
        })
    }

    /// Whether this server has failover slots (PostgreSQL 17+).
    pub async fn supports_failover_slots(&mut self) -> Result<bool, ReplError> {
        Ok(self.server_version_num().await? >= FAILOVER_SLOTS_VERSION)
    }

    /// `ALTER_REPLICATION_SLOT "name" (FAILOVER …)` (PG17+). The server acquires the slot
    /// for this, so while another walsender streams from it this fails with
    /// [`ReplError::SlotInUse`], retryable like START_REPLICATION's.
    pub async fn set_slot_failover(&mut self, name: &str, failover: bool) -> Result<(), ReplError> {
        if !self.supports_failover_slots().await? {
            return Err(ReplError::Unsupported(
                "failover slots need PostgreSQL 17 or later".into(),
            ));
        }
        match self
            .simple_query(&format!(
                "ALTER_REPLICATION_SLOT {} (FAILOVER {failover})",
                quote_ident(name)
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(ReplError::Server(e)) => Err(crate::stream::stream_error(name, *e)),
            Err(e) => Err(e),
        }
    }

    /// `DROP_REPLICATION_SLOT "name" [WAIT]`.
    pub async fn drop_slot(&mut self, name: &str, wait: bool) -> Result<(), ReplError> {
        let wait = if wait { " WAIT" } else { "" };
        self.simple_query(&format!(
            "DROP_REPLICATION_SLOT {}{wait}",
            quote_ident(name)
        ))
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("Slot\"x"), "\"Slot\"\"x\"");
        assert_eq!(quote_literal("a'b"), "'a''b'");
    }
}
