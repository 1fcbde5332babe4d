//! What the session knows delivered, and the slot's progress record that keeps it
//! across restarts (see `kafka::progress` and `outbox_core::delivered`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{CadenceRules, DeliveredPosition, RecordAcks, RecordCadence, RecordFacts};

use super::Session;
use crate::kafka::{ProgressRecord, ProgressStore, SlotIdentity};

/// A session that streamed this long without failing counts as progress for the reconnect
/// backoff even if it confirmed nothing (an idle slot): the outage that ends it is a new
/// one, not the same one retried.
const STREAMED_LONG_ENOUGH: Duration = Duration::from_secs(60);

/// Keeps the slot's progress record current (see `kafka::progress`); when, is
/// `outbox_core::RecordCadence`'s.
pub(super) struct ProgressWriter {
    pub(super) store: ProgressStore,
    pub(super) identity: SlotIdentity,
    cadence: RecordCadence,
    /// The store's acknowledged writes when the session started (see
    /// `outbox_core::RecordAcks::any_this_session`).
    acked_at_start: u64,
    /// The lineage of the newest record the broker acknowledged (see
    /// `outbox_core::RecordAcks::own_lineage`).
    acked_lineage: Arc<AtomicU64>,
}

impl ProgressWriter {
    pub(super) fn new(store: ProgressStore, identity: SlotIdentity, rules: CadenceRules) -> Self {
        ProgressWriter {
            acked_at_start: store.writes_acked(),
            store,
            identity,
            cadence: RecordCadence::new(rules, Duration::ZERO),
            acked_lineage: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// An idle slot's record is written again this often (see
/// `outbox_core::CadenceRules::rewrite_idle_every`).
pub(super) const REWRITE_IDLE_EVERY: Duration = Duration::from_secs(300);

/// How often a writing session looks at whether another lineage wrote its record.
pub(super) const LINEAGE_CHECK_EVERY: Duration = Duration::from_secs(30);

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
    /// Called on every turn of the loop: between looks this costs one clock reading.
    pub(super) fn update_progress(&mut self) {
        let Some(p) = self.progress.as_ref() else {
            return;
        };
        let now = self.since_start();
        let compared = self.publication.as_ref().is_none_or(|w| w.compared());
        if !p.cadence.looks(now, compared) {
            return;
        }
        // Building the record scans the ledger: once per interval at most, also when
        // nothing changed (a stuck partition holds everything still for a long time).
        let record = self.progress_record();
        let facts = RecordFacts {
            position: record.confirmed_lsn(),
            partial: record.claim.partial,
            lineage: record.lineage,
        };
        let lineages = self.core.lineages();
        let obs = self.obs.clone();
        let Some(p) = self.progress.as_mut() else {
            return;
        };
        let acks = RecordAcks {
            any_this_session: p.store.writes_acked() != p.acked_at_start,
            own_lineage: p.acked_lineage.load(Ordering::Acquire) == lineages.0,
        };
        let turn = p.cadence.turn(now, facts, acks);
        if turn.check_lineage {
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
        if turn.write {
            let lineage = facts.lineage;
            let acked_lineage = Arc::clone(&p.acked_lineage);
            let sent =
                p.store
                    .write_in_background(&p.identity, record, move |answer| match answer {
                        Ok(lsn) => {
                            acked_lineage.store(lineage, Ordering::Release);
                            obs.progress_recorded(lsn);
                        }
                        Err(_) => obs.progress_write_failed(),
                    });
            // Skipped while an earlier write is unanswered: due again next time.
            if sent {
                p.cadence.sent(now, facts);
            }
        }
    }

    /// What this session claims Kafka has, and its lineage, for the next session of the
    /// process: proven against the replay like a progress record.
    pub(in crate::pipeline) fn delivered(&mut self) -> (DeliveredPosition, u64) {
        self.core.claim()
    }

    /// Exactly-once mode: what the process carries into its next session of the spans it
    /// aborted (`outbox_core::left_open`).
    pub(in crate::pipeline) fn aborted_spans(&mut self) -> outbox_core::AbortedSpans {
        self.txn
            .as_mut()
            .map(|t| t.first_writes().spans().clone())
            .unwrap_or_default()
    }

    /// Whether this session moved the confirmed position, or streamed for a good while:
    /// what allows the reconnect backoff to start over.
    pub(in crate::pipeline) fn made_progress(&self) -> bool {
        self.core.confirmed() > self.core.start() || self.since_start() >= STREAMED_LONG_ENOUGH
    }
}
