//! Replayed transactions Kafka already has, skipped only once the stream proves it: the
//! IO half of `outbox_core::replay` (acking dropped records in the ledger, sending
//! released ones, logging and counting doubts).

use outbox_core::{NextRow, OutboxRecord, Outcome, Step};

use super::{Produced, Session};
use crate::pipeline::error::RelayError;

impl Session<'_> {
    /// Carries out what the replay rules decided.
    pub(super) async fn apply(&mut self, step: Step<OutboxRecord>) -> Result<(), RelayError> {
        self.report_doubts();
        match step {
            Step::Nothing | Step::Resume { .. } => {}
            Step::Drop(tickets) => {
                for ticket in tickets {
                    self.ledger.delivered(ticket, Outcome::Acked)?;
                    self.obs.skipped_as_delivered();
                }
            }
            Step::Release(_, held) => {
                for h in held {
                    if let Produced::TooLarge { size } = self.send(&h.record, h.ticket).await? {
                        // check_size passed it when it was mapped: only a producer whose
                        // measure differs gets here. Stop rather than confirm past it.
                        return Err(RelayError::Protocol(format!(
                            "a replayed record for topic {} was refused as too large ({size} bytes) after it was held; nothing past it is confirmed",
                            h.record.topic
                        )));
                    }
                }
            }
        }
        self.obs.replay_held(self.replay.held_len());
        Ok(())
    }

    /// Counts each doubt the rules met, and logs the first of the session.
    pub(super) fn report_doubts(&mut self) {
        for d in self.replay.take_doubts() {
            self.obs.replay_doubt(d);
            if !std::mem::replace(&mut self.doubt_logged, true) {
                tracing::warn!(
                    reason = d.as_str(),
                    held = self.replay.held_len(),
                    "publishing replayed events again instead of skipping them: {}",
                    d.explain()
                );
            }
        }
    }

    /// Takes the next published row of the open transaction.
    pub(super) fn next_row(&mut self) -> NextRow {
        let next = self.replay.next_row();
        if next == NextRow::InKafka {
            self.obs.skipped_as_delivered();
        }
        next
    }
}
