//! What the session knows delivered, and the slot's progress record that keeps it
//! across restarts (see `kafka::progress` and `outbox_core::delivered`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    /// The lineage of the last record written: a new one (after a doubt) is written at
    /// once, or the record would go on naming the doubted claim.
    written_lineage: u64,
    /// When the record was last written or found unchanged.
    last_write: Instant,
    /// When a write was last sent.
    last_sent: Instant,
    /// The store's acknowledged writes when the session started: until one more is
    /// acknowledged, the record may not exist at all (a slot made by `outboxd init`, with
    /// Kafka down at the first tick), so the write is retried even without progress.
    acked_at_start: u64,
    /// When the record was last read back to see whether another lineage writes it.
    last_lineage_check: Instant,
    /// The lineage of the newest record the broker acknowledged: the record is read back
    /// only once it is this session's own (before, the newest may well be the previous
    /// session's, of another lineage, and no sign of another writer).
    acked_lineage: Arc<AtomicU64>,
}

impl ProgressWriter {
    pub(super) fn new(store: ProgressStore, identity: SlotIdentity) -> Self {
        ProgressWriter {
            acked_at_start: store.writes_acked(),
            store,
            identity,
            written: None,
            written_partial: None,
            written_lineage: 0,
            last_write: Instant::now(),
            last_sent: Instant::now(),
            last_lineage_check: Instant::now(),
            acked_lineage: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// An idle slot's record is written again this often: a record that is never rewritten
/// is the first a topic's retention or a stray delete takes, and the newest write of a key
/// is what says the slot exists.
const REWRITE_IDLE_EVERY: Duration = Duration::from_secs(300);

/// How often a writing session looks at whether another lineage wrote its record.
const LINEAGE_CHECK_EVERY: Duration = Duration::from_secs(30);

impl Session<'_> {
    /// The record of what this session claims Kafka has.
    pub(super) fn progress_record(&mut self) -> ProgressRecord {
        let (claim, lineage) = self.core.claim();
        ProgressRecord {
            publication: self.publication.as_ref().map(|w| w.last().clone()),
            ..ProgressRecord::of(claim, lineage)
        }
    }

    /// The publication at this session's last look, and whether it was compared with the
    /// record's, for the next session of the process.
    pub(in crate::pipeline) fn publication_seen(
        &self,
    ) -> Option<(crate::kafka::PublicationSeen, bool)> {
        self.publication
            .as_ref()
            .map(|w| (w.last().clone(), w.compared()))
    }

    /// Brings the progress record up to the confirmed position, at most every interval.
    /// Called on every turn of the loop: the clock is looked at first, so between writes
    /// this costs one `Instant` comparison.
    pub(super) fn update_progress(&mut self) {
        let interval = self.cfg.progress_interval;
        let Some(p) = self.progress.as_ref() else {
            return;
        };
        if self.txn.is_some() {
            // Exactly-once: written only inside each Kafka transaction, as its last record
            // (a record outside one could claim what an abort then takes back).
            return;
        }
        if self.publication.as_ref().is_some_and(|w| !w.compared()) {
            // It would replace the record's look at the publication with one never
            // compared with it (and its position cannot move meanwhile anyway).
            return;
        }
        if p.written.is_some() && p.last_write.elapsed() < interval {
            return;
        }
        // Building the record scans the ledger: once per interval at most, also when
        // nothing changed (a stuck partition holds everything still for a long time).
        let record = self.progress_record();
        let position = record.confirmed_lsn();
        let lineages = self.core.lineages();
        let obs = self.obs.clone();
        if let Some(p) = self.progress.as_mut() {
            let unacked = p.store.writes_acked() == p.acked_at_start;
            let due = match p.written {
                None => true,
                Some(w) => {
                    position > w
                        || record.claim.partial != p.written_partial
                        || record.lineage != p.written_lineage
                        || unacked
                        || p.last_sent.elapsed() >= REWRITE_IDLE_EVERY
                }
            };
            p.last_write = Instant::now();
            let own_acked = p.acked_lineage.load(Ordering::Acquire) == lineages.0;
            if own_acked && p.last_lineage_check.elapsed() >= LINEAGE_CHECK_EVERY {
                p.last_lineage_check = Instant::now();
                let store = p.store.clone();
                let identity = p.identity.clone();
                let topic = p.store.topic().to_owned();
                let obs = obs.clone();
                p.store
                    .check_lineage_in_background(&p.identity, lineages, move |_, writer| {
                        if store.mark_foreign_writer() {
                            obs.progress_foreign_write();
                            tracing::error!(writer = %writer, "this slot's progress record was just written by another relay");
                            crate::pipeline::claim::warn_foreign_writer(&identity, &topic);
                        }
                    });
            }
            if due {
                let (partial, lineage) = (record.claim.partial, record.lineage);
                let acked_lineage = Arc::clone(&p.acked_lineage);
                let sent = p
                    .store
                    .write_in_background(&p.identity, record, move |answer| match answer {
                        Ok(lsn) => {
                            acked_lineage.store(lineage, Ordering::Release);
                            obs.progress_recorded(lsn);
                        }
                        Err(_) => obs.progress_write_failed(),
                    });
                // Skipped while an earlier write is unanswered: due again next time.
                if sent {
                    p.last_sent = Instant::now();
                    p.written_partial = partial;
                    p.written_lineage = lineage;
                    p.written = Some(position);
                }
            }
        }
    }

    /// What this session claims Kafka has, and its lineage, for the next session of the
    /// process: proven against the replay like a progress record.
    pub(in crate::pipeline) fn delivered(&mut self) -> (DeliveredPosition, u64) {
        self.core.claim()
    }

    /// Whether this session moved the confirmed position, or streamed for a good while:
    /// what allows the reconnect backoff to start over.
    pub(in crate::pipeline) fn made_progress(&self) -> bool {
        self.core.confirmed() > self.core.start()
            || self.started_at.elapsed() >= STREAMED_LONG_ENOUGH
    }
}
