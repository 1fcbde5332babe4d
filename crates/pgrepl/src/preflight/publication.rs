//! Looking at a publication, and making sure such a look sees every commit the stream may
//! already have shown (commits still waiting for synchronous standbys).

use pgoutput::Lsn;
use tokio_postgres::Client;

use super::server_version_num;
use crate::error::ReplError;

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
                      UNION SELECT tree.relid FROM {tree} tree \
                      UNION SELECT relid::oid FROM t, pg_catalog.pg_partition_ancestors(t.oid)) \
             SELECT p.oid::text || '.' || p.xmin::text || ' ' || p.puballtables::text \
                 || p.pubinsert::text || p.pubviaroot::text \
                 || ' r:' || coalesce((SELECT pg_catalog.string_agg(r.oid::text || '.' || r.xmin::text, ',' \
                    ORDER BY r.oid) FROM pg_catalog.pg_publication_rel r \
                    WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT relid FROM rels)), '') \
                 {namespaces} \
             FROM pg_catalog.pg_publication p WHERE p.pubname = $1",
            tree = super::partition_tree("(SELECT oid FROM t)")
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
