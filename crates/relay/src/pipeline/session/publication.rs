//! The publication, watched for changes whenever they happen. PostgreSQL decides what to
//! send by the catalog as it was when each row was written: a table dropped from the
//! publication and added back, or `publish` changed and changed back, leaves today's
//! catalog as it was and the rows in between never decoded. Their row versions do not go
//! back (`pgrepl::preflight::PublicationLook::identity`), so any change since the last look is
//! seen.
//!
//! Seeing it is not enough: the slot must not have been confirmed past the rows it hid.
//! So the slot is confirmed only up to what was acknowledged when the last matching look
//! began (`SessionCore::raise_cap`): everything in it was received, and so written to the WAL, before that
//! look read the catalog, and a change made before those rows would have shown.
//!
//! Shown, that is, once it is visible. A commit waiting for a synchronous standby is in
//! the WAL, and decoded, before any query sees it: a look taken meanwhile matches the old
//! catalog while the walsender already follows the new one. Such a look does not count
//! (`PublicationLook::settled`): the cap stays, and so does the last matching look,
//! which a change seen later names as where re-publishing starts.

use std::time::{Duration, Instant};

use pgoutput::{Lsn, PgTimestamp};

use outbox_core::WatchStop;
use pgrepl::preflight::{PublicationLook, PublicationProbe, Settler};
use pgrepl::ConnectConfig;

use super::{bounded, Session};
use crate::kafka::{ProgressError, PublicationSeen, SlotRecords};
use crate::pipeline::error::RelayError;

/// The shortest wait between looks taken early (see `Session::early_look_at`).
const EARLY_LOOK_AFTER: Duration = Duration::from_millis(250);

/// The publication's identity now, with the server's WAL position and clock before it
/// was read: a change committed after that position may be missing from the identity,
/// never one before. The server's clock, not ours: operators compare it with
/// `created_at`. A session looks through its own prepared [`PublicationProbe`].
///
/// With synchronous standbys, a look waits for them on a connection of its own to `pg`
/// (the server `sql` is connected to), opened at the first look that needs it and kept
/// in `settler` for the next ones.
pub async fn look(
    sql: &tokio_postgres::Client,
    (pg, settler): (&ConnectConfig, &mut Option<Settler>),
    publication: &str,
    table: Option<(&str, &str)>,
) -> Result<Looked, RelayError> {
    let probe = PublicationProbe::prepare(sql, publication, table).await?;
    look_through(&probe, sql, pg, settler).await
}

async fn look_through(
    probe: &PublicationProbe,
    sql: &tokio_postgres::Client,
    pg: &ConnectConfig,
    settler: &mut Option<Settler>,
) -> Result<Looked, RelayError> {
    let look = probe.look(sql, settler.as_ref()).await?;
    if !look.synchronous || settler.is_some() {
        return Ok(Looked::from(look));
    }
    let opened = settler.insert(Settler::new(pg).await?);
    Ok(Looked::from(probe.look(sql, Some(opened)).await?))
}

/// A look, and whether it vouches for the WAL before it.
#[derive(Debug)]
pub struct Looked {
    /// `None`: the publication does not exist.
    pub seen: Option<PublicationSeen>,
    /// No commit was in the WAL that the look's snapshot did not see: a change made
    /// before `seen.wal_lsn` would have shown.
    pub settled: bool,
    /// The end of the WAL the look wrote to settle (`PublicationLook::settle_end`).
    pub settle_end: Option<Lsn>,
}

impl From<PublicationLook> for Looked {
    fn from(look: PublicationLook) -> Self {
        Looked {
            settled: look.settled,
            settle_end: look.settle_end,
            seen: look.identity.map(|identity| PublicationSeen {
                identity,
                at_unix_ms: look.at_unix_ms,
                wal_lsn: look.wal_lsn,
            }),
        }
    }
}

/// Stops when `now` is another publication than `last` (the last look that matched), by
/// the rule a session's start compares with (`init` and `check` look as `run` does).
pub fn compare(
    publication: &str,
    last: &PublicationSeen,
    now: Option<&PublicationSeen>,
) -> Result<(), RelayError> {
    outbox_core::PublicationWatch::start(now.cloned(), true, Some(last), true)
        .map(drop)
        .map_err(|stop| stopped(publication, stop))
}

/// With no earlier look to compare with (no record under this key, or one without a
/// look): whether the slot's own catalog horizon says the publication may have changed
/// since the slot decoded (`pgrepl::preflight::publication_changed_since_slot`).
/// `key` and `progress_topic` name where the look was looked for. `run` and `check`.
pub async fn judge_unrecorded(
    sql: &tokio_postgres::Client,
    publication: &str,
    slot: &str,
    key: String,
    progress_topic: &str,
) -> Result<(), RelayError> {
    if pgrepl::preflight::publication_changed_since_slot(sql, publication, slot).await? {
        return Err(RelayError::PublicationUnverified {
            publication: publication.to_owned(),
            slot: slot.to_owned(),
            key,
            progress_topic: progress_topic.to_owned(),
        });
    }
    Ok(())
}

impl outbox_core::CatalogLook for PublicationSeen {
    fn same_catalog(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

/// Maps the watch's stop to the relay's error.
fn stopped(publication: &str, stop: WatchStop<PublicationSeen>) -> RelayError {
    match stop {
        WatchStop::Dropped => RelayError::PublicationDropped {
            // Gone, not changed: the error the stream gives at the next change (and the
            // fix it names), which an early look now usually comes before.
            publication: publication.to_owned(),
            server: "a look at pg_publication found none of this name".into(),
        },
        WatchStop::Changed { since } => RelayError::PublicationChanged {
            publication: publication.to_owned(),
            since: since.at_text(),
            since_lsn: since.wal_lsn,
        },
        WatchStop::StandbysUnsettled => RelayError::StandbysUnsettled {
            publication: publication.to_owned(),
        },
    }
}

/// What the session knows of the publication: the rules (`outbox_core::PublicationWatch`:
/// the last matching look, whether the start was compared with the record, when a look
/// counts) and the IO around them.
pub(in crate::pipeline) struct PublicationWatch {
    pub(super) rules: outbox_core::PublicationWatch<PublicationSeen>,
    pub(super) looked_at: Instant,
    /// The progress record could not be read at the start: it is read again in the
    /// background, and the start's look compared with it once there.
    read: Option<tokio::sync::oneshot::Receiver<Result<SlotRecords, ProgressError>>>,
    /// Prepared at the session's first look, on its side connection.
    probe: Option<PublicationProbe>,
    /// When looks stopped counting (a commit not yet visible), logged when they count
    /// again; read only while the rules say they do not count.
    unsettled_at: Instant,
    /// The server looked at, and the connection a look waits for its synchronous
    /// standbys on (see [`look`]).
    pg: ConnectConfig,
    settler: Option<Settler>,
    /// The slot had decoded before this session (`pg_stat_replication_slots`): a record
    /// read late with no look is then judged by the slot's catalog horizon, as at the start.
    decoded_before: bool,
}

impl PublicationWatch {
    /// The session's watch from the start's look (`None`: the relay does not read the
    /// table, so no look), compared with the look `known` before it (see
    /// `outbox_core::PublicationWatch::start`). `pg` and `settler`: the server, and the
    /// connection the start's look waited for its synchronous standbys on.
    pub(in crate::pipeline) fn start(
        publication: &str,
        start: Option<Looked>,
        known: &outbox_core::Known<PublicationSeen>,
        (pg, settler): (ConnectConfig, Option<Settler>),
        decoded_before: bool,
    ) -> Result<Option<Self>, RelayError> {
        let Some(start) = start else {
            return Ok(None);
        };
        let rules = outbox_core::PublicationWatch::start(
            start.seen,
            start.settled,
            known.publication.as_ref(),
            known.read,
        )
        .map_err(|stop| stopped(publication, stop))?;
        Ok(rules.map(|rules| PublicationWatch {
            rules,
            looked_at: Instant::now(),
            read: None,
            probe: None,
            unsettled_at: Instant::now(),
            pg,
            settler,
            decoded_before,
        }))
    }

    pub(super) fn compared(&self) -> bool {
        self.rules.compared()
    }

    pub(super) fn last(&self) -> &PublicationSeen {
        self.rules.last()
    }
}

impl Session<'_> {
    /// Looks at the publication: the same one as at the last look, or the session stops
    /// before confirming anything received after that look.
    pub(super) async fn watch_publication(&mut self) -> Result<(), RelayError> {
        let Some(watch) = self.publication.as_mut() else {
            return Ok(());
        };
        watch.rules.begin(self.core.watermark());
        let (sql, publication, table) = (&self.sql, &self.cfg.publication, &self.cfg.rules.table);
        let (probe, pg, settler) = (&mut watch.probe, &watch.pg, &mut watch.settler);
        let now = bounded("checking the publication", async {
            let p = match probe {
                Some(p) => p,
                None => {
                    let table = Some((table.schema.as_str(), table.table.as_str()));
                    probe.insert(PublicationProbe::prepare(sql, publication, table).await?)
                }
            };
            look_through(p, sql, pg, settler).await
        })
        .await?;
        let look = outbox_core::Look {
            seen: now.seen,
            settled: now.settled,
            settle_end: now.settle_end,
        };
        let looked = watch
            .rules
            .looked(look, self.core.watermark())
            .map_err(|stop| stopped(&self.cfg.publication, stop))?;
        watch.looked_at = Instant::now();
        match looked {
            outbox_core::Looked::Unsettled { first } => {
                self.obs.publication_look_unsettled();
                if first {
                    watch.unsettled_at = Instant::now();
                    // Its own walsender as the synchronous standby: the look's commit
                    // waits for a confirmation that waits for the look. Never settles.
                    let state = bounded("looking up the walsender's sync state", async {
                        Ok(
                            pgrepl::preflight::walsender_sync_state(&self.sql, &self.cfg.slot)
                                .await?,
                        )
                    })
                    .await?;
                    if let Some(state) = state.filter(|s| s == "sync" || s == "quorum") {
                        return Err(RelayError::ServerSetting {
                            setting: "synchronous_standby_names",
                            problem: format!(
                                "outboxd's own walsender (slot {:?}) is a synchronous standby ({state}): commits then wait for Kafka's acks, and outboxd's looks at the publication wait for themselves. List only the physical standbys by name (not `*`), and set application_name (PGAPPNAME) of outboxd to a name not listed",
                                self.cfg.slot
                            ),
                        });
                    }
                    tracing::warn!(
                        publication = %self.cfg.publication,
                        "the synchronous standbys (synchronous_standby_names) do not confirm commits: a transaction committed but still waiting for them is invisible to queries, and may have changed the publication unseen, so the slot is not confirmed past what was acknowledged at the last look before they stopped, until they confirm again (or synchronous_standby_names is emptied)"
                    );
                }
            }
            outbox_core::Looked::Counts {
                raise_cap,
                settled_again,
            } => {
                if settled_again {
                    tracing::info!(
                        waited = ?watch.unsettled_at.elapsed(),
                        "the synchronous standbys confirm commits again: the publication looks count"
                    );
                }
                if let Some(acked) = raise_cap {
                    self.core.raise_cap(acked);
                }
            }
        }
        Ok(())
    }

    /// Whether the regular look is due: every `OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS`.
    pub(super) fn publication_look_due(&self) -> bool {
        self.publication
            .as_ref()
            .is_some_and(|w| w.looked_at.elapsed() >= self.cfg.publication_check_interval)
    }

    /// When to look before the regular look (`outbox_core::PublicationWatch::early_look_wanted`):
    /// [`EARLY_LOOK_AFTER`] after the last look. A drained backlog or a lone transaction
    /// is then confirmed at once, not at the end of the interval; under a steady load
    /// that is a few prepared statements a second on the side connection.
    pub(super) fn early_look_at(&self) -> Option<Instant> {
        let watch = self.publication.as_ref().filter(|w| {
            w.rules.early_look_wanted(
                self.core.awaiting_reports(),
                self.core.watermark(),
                self.core.confirmed(),
            )
        })?;
        Some(watch.looked_at + EARLY_LOOK_AFTER)
    }

    /// A guard message: the transaction it is in changed a publication. Rows after it
    /// are decoded by the new catalog, so look now; a change names this transaction's
    /// commit as where re-publishing starts.
    pub(super) async fn on_publication_guard(
        &mut self,
        commit: Option<(Lsn, PgTimestamp)>,
    ) -> Result<(), RelayError> {
        let Some(watch) = self.publication.as_mut() else {
            return Ok(());
        };
        let commit = commit.unwrap_or((Lsn::ZERO, PgTimestamp::now()));
        watch.rules.guard(PublicationSeen {
            identity: watch.rules.last().identity.clone(),
            at_unix_ms: u64::try_from(commit.1.unix_micros() / 1000).unwrap_or(0),
            wal_lsn: commit.0,
        });
        self.watch_publication().await
    }

    /// While the start's look waits for the record to compare with: reads the record in
    /// the background, and compares once it is there. A failed read is tried again.
    pub(super) async fn compare_with_record(&mut self) -> Result<(), RelayError> {
        let (Some(watch), Some(p)) = (self.publication.as_mut(), self.progress.as_ref()) else {
            return Ok(());
        };
        if watch.compared() {
            return Ok(());
        }
        let read = &mut watch.read;
        let Some(rx) = read else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (store, identity) = (p.store.clone(), p.identity.clone());
            tokio::spawn(async move {
                let _ = tx.send(store.read_slot(&identity).await);
            });
            *read = Some(rx);
            return Ok(());
        };
        let records = match rx.try_recv() {
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return Ok(()),
            Ok(Ok(records)) => records,
            Ok(Err(ProgressError::Unreadable(why))) => {
                crate::pipeline::claim::unreadable_record(
                    self.obs,
                    &p.identity,
                    p.store.topic(),
                    &why,
                );
                SlotRecords::default()
            }
            Ok(Err(_)) | Err(_) => {
                *read = None;
                return Ok(());
            }
        };
        // Nothing was confirmed past the start yet: an unfinished back-fill still stops it.
        crate::pipeline::backfill::refuse_unfinished_backfill(
            &records,
            p.store.topic(),
            &p.identity,
        )?;
        // No look recorded, read too late for the start's check: the same check now. It
        // still holds: nothing was confirmed past the start, so the slot's catalog_xmin
        // is where the session found it.
        if records.last_look().is_none() && watch.decoded_before {
            let (key, topic) = (p.identity.key(), p.store.topic().to_owned());
            let judged = judge_unrecorded(
                &self.sql,
                &self.cfg.publication,
                &self.cfg.slot,
                key,
                &topic,
            );
            bounded("checking the slot's catalog horizon", judged).await?;
        }
        let Some(watch) = self.publication.as_mut() else {
            return Ok(());
        };
        watch
            .rules
            .record_read(records.last_look())
            .map_err(|stop| stopped(&self.cfg.publication, stop))?;
        if let Some(record) = &records.ours {
            crate::pipeline::server::refuse_older_timeline(
                record.claim.timeline,
                self.timeline,
                &self.server,
            )?;
        }
        tracing::info!("the progress record is read: the publication is as recorded");
        watch.read = None;
        Ok(())
    }
}
