//! The publication, watched for changes whenever they happen. PostgreSQL decides what to
//! send by the catalog as it was when each row was written: a table dropped from the
//! publication and added back, or `publish` changed and changed back, leaves today's
//! catalog as it was and the rows in between never decoded. Their row versions do not go
//! back (`pgrepl::preflight::publication_identity`), so any change since the last look is
//! seen; the rows written after that look are the ones to re-publish.

use pgoutput::{Lsn, PgTimestamp};

use super::{bounded, Session};
use crate::kafka::PublicationSeen;
use crate::pipeline::error::RelayError;

/// The prefix of the transactional message `sql/publication-guard.sql`'s event trigger
/// emits in every transaction that changes a publication: the exact WAL position of the
/// change, where polling the catalog only brackets it.
pub const PUBLICATION_GUARD_PREFIX: &str = "outboxd.publication";

/// The publication's identity now, and the WAL position before it was read: a change
/// committed after that position may be missing from the identity, never one before.
pub(in crate::pipeline) async fn look(
    sql: &tokio_postgres::Client,
    publication: &str,
    table: Option<(&str, &str)>,
) -> Result<Option<PublicationSeen>, RelayError> {
    let wal = pgrepl::preflight::current_wal_lsn(sql).await?;
    let at = PublicationSeen::now(String::new(), wal);
    Ok(
        pgrepl::preflight::publication_identity(sql, publication, table)
            .await?
            .map(|identity| PublicationSeen { identity, ..at }),
    )
}

/// Stops when `now` is another publication than `last` (the last look that matched).
pub(in crate::pipeline) fn compare(
    publication: &str,
    last: &PublicationSeen,
    now: Option<&PublicationSeen>,
) -> Result<(), RelayError> {
    match now {
        Some(now) if now.identity == last.identity => Ok(()),
        _ => Err(RelayError::PublicationChanged {
            publication: publication.to_owned(),
            since: last.at_text(),
            since_lsn: last.wal_lsn,
        }),
    }
}

impl Session<'_> {
    /// Looks at the publication (every few seconds, and at a guard message): the same one
    /// as at the last look, or the session stops before confirming anything after it.
    pub(super) async fn watch_publication(&mut self) -> Result<(), RelayError> {
        let Some(last) = self.publication.clone() else {
            return Ok(());
        };
        let table = &self.cfg.table;
        let now = bounded(
            "checking the publication",
            look(
                &self.sql,
                &self.cfg.publication,
                Some((table.schema.as_str(), table.table.as_str())),
            ),
        )
        .await?;
        compare(&self.cfg.publication, &last, now.as_ref())?;
        self.publication = now;
        Ok(())
    }

    /// A guard message: the transaction it is in changed a publication. Rows after it
    /// are decoded by the new catalog, so look now; a change names this transaction's
    /// commit as where re-publishing starts.
    pub(super) async fn on_publication_guard(&mut self) -> Result<(), RelayError> {
        let Some(last) = self.publication.clone() else {
            return Ok(());
        };
        let commit = self.txn.map_or((Lsn::ZERO, PgTimestamp::now()), |t| {
            (t.commit_lsn, t.commit_time)
        });
        let at_commit = PublicationSeen {
            identity: last.identity.clone(),
            at_unix_ms: u64::try_from(commit.1.unix_micros() / 1000).unwrap_or(0),
            wal_lsn: commit.0,
        };
        // Kept on failure too: the next session of this process starts from this look.
        self.publication = Some(at_commit);
        self.watch_publication().await
    }
}
