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

/// The table named `$1` (quoted, qualified) and its partitions at any depth, as `t.relid`.
const TABLE_TREE: &str = "(SELECT pg_catalog.to_regclass($1::text) AS relid \
     UNION SELECT relid FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass($1::text))) t \
     WHERE t.relid IS NOT NULL";

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
                 WHERE s.relid IN (SELECT t.relid::oid FROM {TABLE_TREE})"
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

/// Looks at a publication: the server's WAL position and clock, then what the catalog says
/// of the publication today, as one line of text (its *identity*, [`PublicationLook`]).
/// Prepared once on a connection, for a session that looks again and again (several times
/// a second while it confirms): Bind and Execute only, no parsing or planning on the
/// primary.
pub struct PublicationProbe {
    clock: tokio_postgres::Statement,
    identity: tokio_postgres::Statement,
    publication: String,
    qualified: Option<String>,
}

/// What one [`PublicationProbe::look`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationLook {
    /// The server's WAL insert position and clock (Unix milliseconds) before the catalog
    /// was read: a change committed after that position may be missing from `identity`,
    /// never one before.
    pub wal_lsn: Lsn,
    pub at_unix_ms: u64,
    /// Which row version of `pg_publication` it is (oid and xmin: a dropped and recreated
    /// one, or one whose `publish` was changed, even changed back, is another) with its
    /// flags, and the row versions of its `pg_publication_rel` entries for the table, its
    /// partitions and its ancestors (a table dropped from it and added back is another
    /// entry), and on PostgreSQL 15+ of its `pg_publication_namespace` entries for their
    /// schemas. Not other tables' entries: the relay publishes only the outbox's rows.
    /// `None`: it does not exist.
    ///
    /// PostgreSQL decides what to send by the catalog as it was when each row was written,
    /// so a change undone before anyone looks leaves the flags as they were; the row
    /// versions do not go back.
    pub identity: Option<String>,
    /// Whether every commit in the WAL before `wal_lsn` was visible to the catalog read.
    /// A commit waiting for a synchronous standby is in the WAL, so decoded, and changes
    /// what the walsender sends, before any query sees it (`pg_xact_status` says "in
    /// progress" meanwhile). So with `synchronous_standby_names` set, the look first
    /// commits a transaction of its own that waits for the standbys (on a [`Settler`]):
    /// waiters are released in WAL order, so once it returns every commit before it has
    /// been too.
    /// If it waits longer than [`SETTLE_TIMEOUT`], the look is not settled, nor when it
    /// had no [`Settler`] to wait on (then `synchronous` says why). An open transaction,
    /// even one idle for hours, has no commit in the WAL and holds nothing.
    pub settled: bool,
    /// `synchronous_standby_names` was set.
    pub synchronous: bool,
    /// Where the WAL ended after that transaction (`None`: none was needed). The stream
    /// passes it, so what it acks up to there is the look's own doing, not new rows.
    pub settle_end: Option<Lsn>,
}

/// How long a look waits for the synchronous standbys (see [`PublicationLook::settled`]):
/// about a round trip when they are healthy.
pub const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

impl PublicationProbe {
    pub async fn prepare(
        client: &Client,
        publication: &str,
        table: Option<(&str, &str)>,
    ) -> Result<Self, ReplError> {
        let qualified = table.map(|(schema, name)| {
            format!(
                "{}.{}",
                crate::query::quote_ident(schema),
                crate::query::quote_ident(name)
            )
        });
        let namespaces = if server_version_num(client).await? >= 150_000 {
            "|| ' n:' || coalesce((SELECT pg_catalog.string_agg(pn.oid::text || '.' || pn.xmin::text, ',' \
                 ORDER BY pn.oid) FROM pg_catalog.pg_publication_namespace pn \
                 WHERE pn.pnpubid = p.oid AND pn.pnnspid IN (SELECT c.relnamespace \
                 FROM pg_catalog.pg_class c WHERE c.oid IN (SELECT relid FROM rels))), '')"
        } else {
            ""
        };
        let sql = format!(
            "WITH t AS (SELECT pg_catalog.to_regclass($2::text) AS oid), \
             rels AS (SELECT oid::oid AS relid FROM t WHERE oid IS NOT NULL \
                      UNION SELECT relid::oid FROM t, pg_catalog.pg_partition_tree(t.oid) \
                      UNION SELECT relid::oid FROM t, pg_catalog.pg_partition_ancestors(t.oid)) \
             SELECT p.oid::text || '.' || p.xmin::text || ' ' || p.puballtables::text \
                 || p.pubinsert::text || p.pubviaroot::text \
                 || ' r:' || coalesce((SELECT pg_catalog.string_agg(r.oid::text || '.' || r.xmin::text, ',' \
                    ORDER BY r.oid) FROM pg_catalog.pg_publication_rel r \
                    WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT relid FROM rels)), '') \
                 {namespaces} \
             FROM pg_catalog.pg_publication p WHERE p.pubname = $1"
        );
        Ok(PublicationProbe {
            clock: client
                .prepare(
                    "SELECT pg_catalog.pg_current_wal_lsn()::text, \
                     (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000::numeric)::bigint, \
                     pg_catalog.current_setting('synchronous_standby_names'::pg_catalog.text) OPERATOR(pg_catalog.<>) ''::pg_catalog.text, \
                     pg_catalog.current_setting('synchronous_commit'::pg_catalog.text) OPERATOR(pg_catalog.=) 'remote_apply'::pg_catalog.text",
                )
                .await?,
            identity: client.prepare(sql.as_str()).await?,
            publication: publication.to_owned(),
            qualified,
        })
    }

    /// Reads the WAL position and clock, then the identity: two statements sent together
    /// (one round trip), run one after the other, so the catalog is read by a snapshot
    /// taken after the position. With a [`Settler`], the clock, the wait for the
    /// standbys and the identity, in that order (see [`PublicationLook::settled`]).
    pub async fn look(
        &self,
        client: &Client,
        settler: Option<&Settler>,
    ) -> Result<PublicationLook, ReplError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
            [&self.publication, &self.qualified];
        let clock = client.query_one(&self.clock, &[]);
        // Once a settler exists, every look settles, also with the setting emptied: a
        // reload reaches this session before the checkpointer has released the waiters,
        // and only a commit of our own that does not wait proves it has. The identity is
        // then read after the settle, so not sent with the clock.
        let (clock, identity, settled, settle_end) = match settler {
            Some(settler) => {
                let clock = clock.await?;
                let apply: bool = clock.try_get(3)?;
                let (settled, end) = settler.settle(apply).await?;
                let identity = client.query_opt(&self.identity, &params).await?;
                (clock, identity, settled, end)
            }
            None => {
                let identity = client.query_opt(&self.identity, &params);
                // `try_join` polls `clock` first, and a prepared statement's request is
                // queued on its future's first poll: the position's statement goes first.
                let (clock, identity) = futures_util::future::try_join(clock, identity).await?;
                // With synchronous standbys and no settler, not settled: the caller
                // opens one and looks again.
                let synchronous: bool = clock.try_get(2)?;
                (clock, identity, !synchronous, None)
            }
        };
        let lsn: String = clock.try_get(0)?;
        let ms: i64 = clock.try_get(1)?;
        let wal_lsn = lsn
            .parse::<Lsn>()
            .map_err(|e| ReplError::Protocol(format!("pg_current_wal_lsn: {e}")))?;
        Ok(PublicationLook {
            wal_lsn,
            at_unix_ms: u64::try_from(ms).unwrap_or(0),
            identity: identity.map(|r| r.try_get::<_, String>(0)).transpose()?,
            settled,
            synchronous: clock.try_get(2)?,
            settle_end,
        })
    }
}

/// A connection of its own on which a look waits for the synchronous standbys (see
/// [`PublicationLook::settled`]). A commit's wait for them ignores `statement_timeout`,
/// and a backend waiting for them never notices its client gone: a wait given up, or a
/// settle dropped mid-wait (a session ending), is cancelled with a cancel request (the
/// wait ends, the commit stands, with a warning), or the backend would wait on, holding
/// its transaction id (and vacuum's horizon) and a connection, until the standbys return.
pub struct Settler {
    client: Client,
    pg: crate::ConnectConfig,
}

/// How long a cancelled wait may take to end before the connection counts as broken.
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Settler {
    pub async fn new(pg: &crate::ConnectConfig) -> Result<Self, ReplError> {
        Ok(Settler {
            client: pg.connect_sql().await?,
            pg: pg.clone(),
        })
    }

    /// Commits a transaction that waits for the standbys (`apply`: until they apply it,
    /// the server's default level; otherwise until they flush it, which also releases
    /// `remote_write` waiters). Whether it returned within [`SETTLE_TIMEOUT`], and where
    /// the WAL ended after it (`None`: the cancel ended the settle before it said).
    async fn settle(&self, apply: bool) -> Result<(bool, Option<Lsn>), ReplError> {
        let mut guard = CancelOnDrop {
            pg: Some(self.pg.clone()),
            token: self.client.cancel_token(),
        };
        let mut wait = std::pin::pin!(commit_and_wait(&self.client, apply));
        let outcome = match tokio::time::timeout(SETTLE_TIMEOUT, &mut wait).await {
            Ok(end) => end.map(|end| (true, Some(end))),
            Err(_) => {
                self.pg.cancel(&guard.token).await?;
                tokio::time::timeout(CANCEL_WAIT, wait)
                    .await
                    .map_err(|_| {
                        ReplError::Timeout("cancelling a wait for the synchronous standbys")
                    })?
                    .map(|end| (false, Some(end)))
            }
        };
        guard.pg = None;
        match outcome {
            // The cancel came as the wait ended, and cut a statement around it: not
            // settled, and the transaction it left open is rolled back.
            Err(ReplError::Sql(e))
                if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) =>
            {
                self.client.batch_execute("ROLLBACK").await?;
                Ok((false, None))
            }
            other => other,
        }
    }
}

/// Cancels the settler's wait when a settle is dropped before it ended.
struct CancelOnDrop {
    pg: Option<crate::ConnectConfig>,
    token: tokio_postgres::CancelToken,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let (Some(pg), Ok(runtime)) = (self.pg.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let token = self.token.clone();
        runtime.spawn(async move {
            if let Err(e) = pg.cancel(&token).await {
                tracing::warn!(error = %e, "could not cancel a wait for the synchronous standbys: its backend waits until they answer");
            }
        });
    }
}

/// A transaction that wrote no WAL does not wait for the standbys, so it writes a logical
/// message (of a prefix the relay ignores): the function heartbeats use. READ WRITE: a
/// role whose transactions default to read-only can still write it.
async fn commit_and_wait(client: &Client, apply: bool) -> Result<Lsn, ReplError> {
    let level = if apply { "remote_apply" } else { "on" };
    let answer = client
        .simple_query(&format!(
            "BEGIN READ WRITE; SET LOCAL synchronous_commit = {level}; \
             SELECT pg_catalog.pg_logical_emit_message(true, 'outboxd.settle'::pg_catalog.text, ''::pg_catalog.text); \
             COMMIT; SELECT pg_catalog.pg_current_wal_lsn()::pg_catalog.text"
        ))
        .await
        .map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                ReplError::Config(format!(
                    "synchronous_standby_names is set, so each look at the publication commits a logical message that waits for the standbys (a publication change waiting for them is decoded before any query sees it), and this role may not: {}. GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) TO the role outboxd connects as (sql/role.sql)",
                    crate::error_chain(&e)
                ))
            } else {
                ReplError::Sql(e)
            }
        })?;
    answer
        .iter()
        .rev()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
            _ => None,
        })
        .ok_or_else(|| ReplError::Protocol("pg_current_wal_lsn returned no row".into()))?
        .parse::<Lsn>()
        .map_err(|e| ReplError::Protocol(format!("pg_current_wal_lsn: {e}")))
}

/// The sync state (`sync`, `quorum`, `potential`, `async`) of the walsender streaming
/// `slot`, as `pg_stat_replication` shows it to the role that runs it.
pub async fn walsender_sync_state(
    client: &Client,
    slot: &str,
) -> Result<Option<String>, ReplError> {
    let row = client
        .query_opt(
            "SELECT r.sync_state FROM pg_catalog.pg_stat_replication r \
             JOIN pg_catalog.pg_replication_slots s ON s.active_pid OPERATOR(pg_catalog.=) r.pid \
             WHERE s.slot_name OPERATOR(pg_catalog.=) $1::pg_catalog.text",
            &[&slot],
        )
        .await?;
    Ok(row
        .map(|r| r.try_get::<_, Option<String>>(0))
        .transpose()?
        .flatten())
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
                           WHERE s.relid IN (SELECT t.relid::oid FROM {TABLE_TREE})), 0::numeric)::bigint \
                 FROM {TABLE_TREE}"
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
    let row = client
        .query_opt(
            "WITH t AS ( \
               SELECT c.oid, c.relkind::text AS relkind FROM pg_catalog.pg_class c \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
               WHERE n.nspname = $2 AND c.relname = $3), \
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
               (SELECT pg_catalog.count(*) FROM pg_catalog.pg_partition_tree((SELECT oid FROM t)) l \
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
                   AND (uc.oid = (SELECT oid FROM t) OR uc.oid IN ( \
                        SELECT l.relid::oid FROM pg_catalog.pg_partition_tree((SELECT oid FROM t)) l))), \
               (SELECT pg_catalog.string_agg(pg_catalog.format('%I.%I', cn.nspname, cc.relname), E'\\n' \
                         ORDER BY cn.nspname, cc.relname) \
                  FROM pg_catalog.pg_inherits i \
                  JOIN pg_catalog.pg_class cc ON cc.oid = i.inhrelid \
                  JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
                 WHERE i.inhparent = (SELECT oid FROM t) AND NOT cc.relispartition) \
             FROM pg_catalog.pg_publication p WHERE p.pubname = $1",
            &[&publication, &schema, &table],
        )
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
    }))
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

/// A slot's failover columns of `pg_replication_slots` (PG17+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotFailover {
    /// Created or altered with FAILOVER: standbys with `sync_replication_slots` copy it.
    pub failover: bool,
    /// On a standby: a copy maintained by slot sync (usable after promotion only when
    /// also not temporary).
    pub synced: bool,
    pub temporary: bool,
    /// Why the slot was invalidated, `None` while usable.
    pub invalidation_reason: Option<String>,
}

/// `None` when the slot does not exist. Only for PostgreSQL 17+: older servers have no
/// such columns.
pub async fn slot_failover(client: &Client, name: &str) -> Result<Option<SlotFailover>, ReplError> {
    let row = client
        .query_opt(
            "SELECT failover, synced, temporary, invalidation_reason \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    row.map(|row| {
        Ok(SlotFailover {
            failover: row.try_get(0)?,
            synced: row.try_get(1)?,
            temporary: row.try_get(2)?,
            invalidation_reason: row.try_get(3)?,
        })
    })
    .transpose()
}

/// `synchronized_standby_slots` on a primary (PG17+): the physical slots of the standbys
/// that must confirm WAL before a failover slot's changes are sent, so a promoted
/// standby never lacks what a consumer already saw. Empty when unset.
pub async fn synchronized_standby_slots(client: &Client) -> Result<Vec<String>, ReplError> {
    let text: Option<String> = client
        .query_one(
            "SELECT pg_catalog.current_setting('synchronized_standby_slots', true)",
            &[],
        )
        .await?
        .try_get(0)?;
    Ok(text
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

/// A physical slot named in `synchronized_standby_slots`, as the primary sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlot {
    pub name: String,
    /// `None`: no slot of that name (logical decoding of failover slots then waits).
    pub slot_type: Option<String>,
    pub active: bool,
    pub invalidation_reason: Option<String>,
}

/// The primary's view of each slot named in `synchronized_standby_slots` (PG17+).
pub async fn standby_slots(
    client: &Client,
    names: &[String],
) -> Result<Vec<StandbySlot>, ReplError> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let row = client
            .query_opt(
                "SELECT slot_type, active, invalidation_reason \
                 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                &[name],
            )
            .await?;
        out.push(match row {
            Some(row) => StandbySlot {
                name: name.clone(),
                slot_type: row.try_get(0)?,
                active: row.try_get(1)?,
                invalidation_reason: row.try_get(2)?,
            },
            None => StandbySlot {
                name: name.clone(),
                slot_type: None,
                active: false,
                invalidation_reason: None,
            },
        });
    }
    Ok(out)
}

/// `server_version_num` over SQL.
pub async fn server_version_num(client: &Client) -> Result<u32, ReplError> {
    let text: String = client
        .query_one("SHOW server_version_num", &[])
        .await?
        .try_get(0)?;
    text.trim()
        .parse()
        .map_err(|_| ReplError::Protocol(format!("invalid server_version_num {text:?}")))
}

/// What slot sync needs on a standby (PG17+), read on the standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySettings {
    pub in_recovery: bool,
    pub sync_replication_slots: Option<String>,
    pub hot_standby_feedback: Option<String>,
    pub primary_slot_name: Option<String>,
    /// `None` when the role may not read it (superuser or pg_read_all_settings only).
    pub primary_conninfo: Option<String>,
    /// The standby's copy of `slot`, if any.
    pub slot: Option<SlotFailover>,
}

pub async fn standby_settings(client: &Client, slot: &str) -> Result<StandbySettings, ReplError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(), \
                    pg_catalog.current_setting('sync_replication_slots', true), \
                    pg_catalog.current_setting('hot_standby_feedback', true), \
                    pg_catalog.current_setting('primary_slot_name', true), \
                    CASE WHEN pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') \
                         THEN pg_catalog.current_setting('primary_conninfo', true) END",
            &[],
        )
        .await?;
    Ok(StandbySettings {
        in_recovery: row.try_get(0)?,
        sync_replication_slots: row.try_get(1)?,
        hot_standby_feedback: row.try_get(2)?,
        primary_slot_name: row.try_get(3)?,
        primary_conninfo: row.try_get(4)?,
        slot: slot_failover(client, slot).await?,
    })
}

/// `pg_is_in_recovery()`: true on a standby.
pub async fn in_recovery(client: &Client) -> Result<bool, ReplError> {
    Ok(client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .try_get(0)?)
}

/// A partitioned table's partitioning, as the catalog has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// `relkind` (`p` partitioned, `r` plain, ...).
    pub kind: String,
    /// `pg_get_partkeydef`, e.g. `HASH (aggregate_id)`; `None` unless partitioned.
    pub key: Option<String>,
    /// Direct partitions, by name.
    pub partitions: Vec<PartitionBound>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionBound {
    pub schema: String,
    pub name: String,
    /// `pg_get_expr(relpartbound)`, e.g. `FOR VALUES WITH (modulus 4, remainder 1)`.
    pub bound: String,
}

/// `None` when `schema.table` does not exist.
pub async fn partitioning(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<Partitioning>, ReplError> {
    let Some(row) = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, \
                    CASE WHEN c.relkind = 'p' THEN pg_catalog.pg_get_partkeydef(c.oid) END \
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await?
    else {
        return Ok(None);
    };
    let oid: u32 = row.try_get(0)?;
    let partitions = client
        .query(
            "SELECT n.nspname::text, c.relname::text, \
                    coalesce(pg_catalog.pg_get_expr(c.relpartbound, c.oid), '') \
               FROM pg_catalog.pg_inherits i \
               JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE i.inhparent = $1 ORDER BY 1, 2",
            &[&oid],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(PartitionBound {
                schema: r.try_get(0)?,
                name: r.try_get(1)?,
                bound: r.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    Ok(Some(Partitioning {
        kind: row.try_get(1)?,
        key: row.try_get(2)?,
        partitions,
    }))
}
