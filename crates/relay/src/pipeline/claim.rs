//! What the progress record (or the last session of this process) says Kafka has, and
//! the record's own checks: another cluster's record, an unfinished back-fill, another
//! live writer, a record outboxd did not write.

use std::time::Duration;

use outbox_core::DeliveredPosition;
use pgrepl::ConnectConfig;

use super::backfill::refuse_unfinished_backfill;
use super::carry::Carry;
use super::config::RelayConfig;
use super::error::{OtherClusterRecord, RelayError};
use super::observe::Observer;
use super::session;
use crate::kafka::{
    ProgressError, ProgressRecord, ProgressStore, PublicationSeen, SlotIdentity, SlotRecords,
};

/// What the coming replay may skip once the stream proves it: the claim of the previous
/// session of this process, or else the progress record's, with the lineage it continues.
/// No record, an unreadable one, or one this process saw another live writer write:
/// nothing (see `outbox_core::delivered`).
pub(super) async fn replay_claim(
    cfg: &RelayConfig,
    obs: &Observer,
    carry: &Carry,
    progress: Option<&ProgressStore>,
    identity: &SlotIdentity,
) -> Result<Known, RelayError> {
    if let Some(claim) = &carry.delivered {
        let (publication, read) = match &carry.publication {
            Some((look, compared)) => (Some(look.clone()), *compared),
            None => (None, true),
        };
        return Ok(Known {
            claim: Some(claim.clone()),
            publication,
            timeline: None,
            read,
            unrecorded: false,
        });
    }
    let Some(p) = progress else {
        return Ok(Known {
            read: true,
            ..Known::default()
        });
    };
    // Bounded: the stream is already started and waits for this optimisation (and the
    // identity check it brings is then skipped: it may only ever stop a relay, never be
    // why one cannot start).
    let wait = cfg.progress_read_wait;
    p.check_durable_in_background();
    let read = tokio::time::timeout(wait, p.read_slot(identity)).await;
    match read.unwrap_or(Err(ProgressError::Timeout(wait))) {
        Ok(records) => {
            refuse_other_cluster(&records, p, identity)?;
            refuse_unfinished_backfill(&records, p.topic(), identity)?;
            if records.writers_alternate() && p.mark_foreign_writer() {
                obs.progress_foreign_write();
                warn_foreign_writer(identity, p.topic());
            }
            let publication = records.last_look().cloned();
            let timeline = records.ours.as_ref().map(|r| r.claim.timeline);
            Ok(Known {
                unrecorded: publication.is_none(),
                claim: records.ours.map(|r| (r.claim, r.lineage)),
                publication,
                timeline,
                read: true,
            })
        }
        Err(ProgressError::Unreadable(why)) => {
            // Not a record outboxd writes: read, and holding nothing. Waiting for a
            // readable one would hold the slot, and the primary's WAL, forever.
            unreadable_record(obs, identity, p.topic(), &why);
            Ok(Known {
                read: true,
                unrecorded: true,
                ..Known::default()
            })
        }
        Err(e) => {
            obs.progress_record_unread();
            tracing::warn!(
                "no progress record to skip replayed events, or to compare the publication with ({e}): replayed events are published again, and the slot is not confirmed past its start until the record is read and the publication compared with it"
            );
            Ok(Known::default())
        }
    }
}

/// A slot that has decoded nothing yet (a slot made by hand, or its statistics reset by
/// a crash): before its first stream, a look at the publication is recorded unless the
/// record holds one, so that no stream of this slot ever runs without a look to compare
/// with. Without it a later start could only judge the slot's catalog horizon, which
/// flags a slot made just after its publication (it keeps an older `catalog_xmin` until
/// it confirms) as changed. Until Kafka answers, the slot is not streamed: nothing could
/// be published anyway.
pub(super) async fn record_first_look(
    cfg: &RelayConfig,
    (pg, sql): (&ConnectConfig, &tokio_postgres::Client),
    progress: &ProgressStore,
    identity: &SlotIdentity,
    obs: &Observer,
    record: ProgressRecord,
) -> Result<(), RelayError> {
    let failed = |reason: String| RelayError::FirstLookUnrecorded {
        publication: cfg.publication.clone(),
        progress_topic: progress.topic().to_owned(),
        reason,
    };
    let waited = |what: &str| failed(format!("{what} within {FIRST_LOOK_WAIT:?}"));
    let records = match tokio::time::timeout(FIRST_LOOK_WAIT, progress.read_slot(identity)).await {
        Ok(Ok(records)) => records,
        Ok(Err(ProgressError::Unreadable(why))) => {
            unreadable_record(obs, identity, progress.topic(), &why);
            SlotRecords::default()
        }
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(waited("Kafka did not answer the read")),
    };
    refuse_other_cluster(&records, progress, identity)?;
    // Its resume drops and creates the slot again: a record would make that a lost slot.
    refuse_unfinished_backfill(&records, progress.topic(), identity)?;
    if records.last_look().is_some() || records.ours.is_some() {
        return Ok(());
    }
    let table = (cfg.table.schema.as_str(), cfg.table.table.as_str());
    let looked =
        session::publication::look(sql, (pg, &mut None), &cfg.publication, Some(table)).await?;
    let Some(seen) = looked.seen.filter(|_| looked.settled) else {
        // Unsettled: the start's own look decides as before (`StandbysUnsettled`); no
        // publication: the session stops on it.
        return Ok(());
    };
    let record = ProgressRecord {
        publication: Some(seen),
        ..record
    };
    match tokio::time::timeout(FIRST_LOOK_WAIT, progress.write_and_wait(identity, &record)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(waited("Kafka did not acknowledge the write")),
    }
}

/// How long a slot's first start waits for Kafka to read and record its first look.
const FIRST_LOOK_WAIT: Duration = Duration::from_secs(30);

/// Says that the slot's record is not one outboxd writes, which then counts as none.
pub(super) fn unreadable_record(obs: &Observer, identity: &SlotIdentity, topic: &str, why: &str) {
    obs.progress_record_invalid();
    tracing::error!(
        key = %identity.key(),
        progress_topic = %topic,
        "this slot's progress record is not one outboxd writes ({why}): nothing is skipped on it, the publication is compared with the slot instead, and the next write replaces it. Something other than outboxd writes this topic: only outboxd's Kafka principal may (docs/operations.md, \"OutboxdProgressRecordInvalid\")"
    );
}

/// What the last session of this process, or the progress record, knew.
#[derive(Debug, Default)]
pub(super) struct Known {
    pub(super) claim: Option<(DeliveredPosition, u64)>,
    pub(super) publication: Option<PublicationSeen>,
    /// The record's timeline: a server on an older one is an abandoned history.
    pub(super) timeline: Option<u32>,
    /// Whether the record (or the last session) was read: if not, the publication is
    /// compared once it is (see `session::publication`).
    pub(super) read: bool,
    /// The record was read and holds no look at the publication for this slot, under
    /// any name of this cluster.
    pub(super) unrecorded: bool,
}

/// The loud warning for two live writers of one key (see `Doubt::ForeignWriter`).
pub(super) fn warn_foreign_writer(identity: &SlotIdentity, topic: &str) {
    tracing::error!(
        key = %identity.key(),
        progress_topic = %topic,
        "another relay writes this slot's progress record with another history: two live copies of one cluster (a clone, snapshot or restored backup) share this Kafka. Replays are published again from now on (duplicates, never a loss). Set OUTBOXD_CLUSTER_NAME to a different value on each copy (or give each its own OUTBOXD_PROGRESS_TOPIC)"
    );
}

/// Stops a relay whose slot has a record only from another cluster (see
/// [`RelayError::RecordOfOtherCluster`]); `check` reports the same error.
pub fn refuse_other_cluster(
    records: &SlotRecords,
    progress: &ProgressStore,
    identity: &SlotIdentity,
) -> Result<(), RelayError> {
    match records.only_other_cluster() {
        None => Ok(()),
        Some((recorded, record)) => Err(RelayError::RecordOfOtherCluster(Box::new(
            OtherClusterRecord {
                slot: identity.slot.clone(),
                database: identity.database.clone(),
                progress_topic: progress.topic().to_owned(),
                found: identity.system_id.clone(),
                recorded: recorded.clone(),
                last_confirmed: record.confirmed_lsn(),
                recorded_at: record
                    .since_text()
                    .unwrap_or_else(|| record.recorded_at_text()),
            },
        ))),
    }
}
