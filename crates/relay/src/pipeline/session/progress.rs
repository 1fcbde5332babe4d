//! What the session knows delivered, and the slot's progress record that keeps it
//! across restarts (see `kafka::progress` and `outbox_core::delivered`).

use std::time::{Duration, Instant};

use outbox_core::{DeliveredPosition, PartialTxn};
use pgoutput::Lsn;

use super::Session;
use crate::kafka::{ProgressRecord, ProgressStore, SlotIdentity};

/// A session that streamed this long without failing counts as progress for the reconnect
/// backoff even if it confirmed nothing (an idle slot): the outage that ends it is a new
/// one, not the same one retried.
const STREAMED_LONG_ENOUGH: Duration = Duration::from_secs(60);

/// Keeps the slot's progress record current (see `kafka::progress`).
pub(super) struct ProgressWriter {
    pub(super) store: ProgressStore,
    pub(super) identity: SlotIdentity,
    /// Position of the last record written by this session; `None`: none yet, so the
    /// first tick writes one even without progress (a slot from before records existed).
    written: Option<Lsn>,
    written_partial: Option<PartialTxn>,
    /// When the record was last written or found unchanged.
    last_write: Instant,
    /// The store's acknowledged writes when the session started: until one more is
    /// acknowledged, the record may not exist at all (a slot made by `outboxd init`, with
    /// Kafka down at the first tick), so the write is retried even without progress.
    acked_at_start: u64,
}

impl ProgressWriter {
    pub(super) fn new(store: ProgressStore, identity: SlotIdentity) -> Self {
        ProgressWriter {
            acked_at_start: store.writes_acked(),
            store,
            identity,
            written: None,
            written_partial: None,
            last_write: Instant::now(),
        }
    }
}

impl Session<'_> {
    /// The partly acked transaction worth recording at `confirmed`: the ledger's, or the
    /// one the session started with (the skip range's, which never changes) while it has
    /// not been read again.
    fn partial_at(&self, confirmed: Lsn) -> Option<PartialTxn> {
        self.rows
            .partial(confirmed)
            .or(self.skip.partial().filter(|p| p.commit_lsn >= confirmed))
    }

    /// The record of what Kafka has now: what is acked, or the position the session
    /// started knowing delivered while it has not confirmed past it yet. Not the confirmed
    /// position alone: a session starts at the slot's, often behind the record it read,
    /// and writing that would move the record back over events Kafka has (a relay
    /// killed then would make the next one publish them all again).
    pub(super) fn progress_record(&self) -> ProgressRecord {
        let delivered = self.delivered();
        ProgressRecord {
            partial: delivered.partial,
            ..ProgressRecord::now(
                delivered.timeline,
                delivered.lsn,
                delivered.last_commit_unix_micros,
            )
        }
    }

    /// Brings the progress record up to the confirmed position, at most every interval.
    /// Called on every turn of the loop: the clock is looked at first, so between writes
    /// this costs one `Instant` comparison.
    pub(super) fn update_progress(&mut self) {
        let interval = self.cfg.progress_interval;
        let Some(p) = self.progress.as_ref() else {
            return;
        };
        if p.written.is_some() && p.last_write.elapsed() < interval {
            return;
        }
        // Building the record scans the ledger: once per interval at most, also when
        // nothing changed (a stuck partition holds everything still for a long time).
        let record = self.progress_record();
        let position = record.confirmed_lsn;
        if let Some(p) = self.progress.as_mut() {
            let unacked = p.store.writes_acked() == p.acked_at_start;
            let due = match p.written {
                None => true,
                Some(w) => position > w || record.partial != p.written_partial || unacked,
            };
            p.last_write = Instant::now();
            if due {
                p.written_partial = record.partial;
                let obs = self.obs.clone();
                p.store
                    .write_in_background(&p.identity, record, move |answer| match answer {
                        Ok(lsn) => obs.progress_recorded(lsn),
                        Err(_) => obs.progress_write_failed(),
                    });
                p.written = Some(position);
            }
        }
    }

    /// What this session knows Kafka has, for the next session of the process.
    pub(in crate::pipeline) fn delivered(&self) -> DeliveredPosition {
        let lsn = self.confirmed.max(self.known_below);
        DeliveredPosition {
            timeline: self.timeline,
            lsn,
            last_commit_unix_micros: self.last_commit_unix_micros,
            partial: self.partial_at(lsn),
        }
    }

    /// Whether this session moved the confirmed position, or streamed for a good while:
    /// what allows the reconnect backoff to start over.
    pub(in crate::pipeline) fn made_progress(&self) -> bool {
        self.confirmed > self.start || self.started_at.elapsed() >= STREAMED_LONG_ENOUGH
    }
}
