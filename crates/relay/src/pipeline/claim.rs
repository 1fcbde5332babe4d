//! What the progress record (or the last session of this process) says Kafka has, and
//! the record's own checks: another cluster's record, an unfinished back-fill, another
//! live writer, a record outboxd did not write.

use std::time::Duration;

use outbox_core::{Known, RecordRead, SlotView};
use pgrepl::ConnectConfig;

use super::backfill::refuse_unfinished_backfill;
use super::carry::Carry;
use super::config::RelayConfig;
use super::error::{OtherClusterRecord, RelayError};
use super::observe::Observer;
use super::server::refused;
use super::session;
use crate::kafka::{
    ProgressError, ProgressRecord, ProgressStore, PublicationSeen, SlotIdentity, SlotRecords,
};

/// What the coming replay may skip once proven, and the look to compare the publication
/// with: the rules are `outbox_core::LifeCore`'s (the claim of this process's last
/// session before the record's); this reads the record when they need it, and says what
/// they find.
pub(super) async fn replay_claim(
    cfg: &RelayConfig,
    obs: &Observer,
    carry: &Carry,
    progress: Option<&ProgressStore>,
    (identity, server): (&SlotIdentity, &(String, u16)),
) -> Result<Known<PublicationSeen>, RelayError> {
    let read = match progress {
        Some(p) if carry.life.needs_record() => read_record(cfg, obs, p, identity).await,
        _ => RecordRead::NotKept,
    };
    let known = carry.life.known(read).map_err(|r| refused(r, server))?;
    if let (true, Some(p)) = (known.foreign_writer, progress) {
        if p.mark_foreign_writer() {
            obs.progress_foreign_write();
            warn_foreign_writer(identity, p.topic());
        }
    }
    Ok(known)
}

/// One read of the slot's record for [`replay_claim`], bounded: the stream is already
/// started and waits for this optimisation (and the identity check it brings is then
/// skipped: it may only ever stop a relay, never be why one cannot start).
async fn read_record(
    cfg: &RelayConfig,
    obs: &Observer,
    p: &ProgressStore,
    identity: &SlotIdentity,
) -> RecordRead<PublicationSeen, RelayError> {
    let wait = cfg.progress_read_wait;
    p.check_durable_in_background();
    let read = tokio::time::timeout(wait, p.read_slot(identity)).await;
    match read.unwrap_or(Err(ProgressError::Timeout(wait))) {
        Ok(records) => RecordRead::Read(SlotView {
            other_cluster: refuse_other_cluster(&records, p, identity).err(),
            backfill_unfinished: refuse_unfinished_backfill(&records, p.topic(), identity).err(),
            writers_alternate: records.writers_alternate(),
            last_look: records.last_look().cloned(),
            ours: records.ours.map(|r| (r.claim, r.lineage)),
        }),
        Err(ProgressError::Unreadable(why)) => {
            unreadable_record(obs, identity, p.topic(), &why);
            RecordRead::Unreadable
        }
        Err(e) => {
            obs.progress_record_unread();
            tracing::warn!(
                "no progress record to skip replayed events, or to compare the publication with ({e}): replayed events are published again, and the slot is not confirmed past its start until the record is read and the publication compared with it"
            );
            RecordRead::NotRead
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
    // A back-fill's slot that `init` left with no record: its state's look, from before the
    // slot was created, is the one the publication must still match (a change while the
    // back-fill ran hid rows from the slot), and the slot's creation time the record's.
    if let Some((b, look)) = records
        .backfill
        .as_ref()
        .and_then(|b| Some((b, b.look_before_slot(record.confirmed_lsn())?)))
    {
        let mut record = ProgressRecord {
            publication: Some(look.clone()),
            ..record
        };
        record.claim.since = b.slot_created_at;
        return write_first_look(progress, identity, &record, failed).await;
    }
    let table = (
        cfg.rules.table.schema.as_str(),
        cfg.rules.table.table.as_str(),
    );
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
    write_first_look(progress, identity, &record, failed).await
}

async fn write_first_look(
    progress: &ProgressStore,
    identity: &SlotIdentity,
    record: &ProgressRecord,
    failed: impl Fn(String) -> RelayError,
) -> Result<(), RelayError> {
    match tokio::time::timeout(FIRST_LOOK_WAIT, progress.write_and_wait(identity, record)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!(
            "Kafka did not acknowledge the write within {FIRST_LOOK_WAIT:?}"
        ))),
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
