//! Replayed transactions Kafka already has, skipped only once the stream proves it (see
//! `outbox_core::delivered`): what is produced while the proof is pending is held, then
//! dropped as delivered or published.

use outbox_core::{DeliveredPosition, Doubt, Outcome, ReplayBegin, RowId, Settle, TxnId};
use pgoutput::Lsn;

use super::{Produced, Session};
use crate::pipeline::error::RelayError;

/// What the next published row of the open transaction is.
pub(super) enum NextRow {
    /// Publish it (`None`: a non-transactional message, which has no row).
    Publish(Option<RowId>),
    /// One of the leading rows of a partly delivered transaction: already in Kafka.
    InKafka,
}

impl Session<'_> {
    /// At a Begin: holds, publishes, or resumes inside the partly delivered transaction.
    pub(super) async fn on_replayed_begin(&mut self, txn: TxnId) -> Result<(), RelayError> {
        match self.proof.on_begin(txn) {
            ReplayBegin::Hold | ReplayBegin::Publish => Ok(()),
            ReplayBegin::SkipRows(n) => {
                tracing::info!(
                    commit_lsn = %txn.commit_lsn,
                    xid = txn.xid,
                    rows = n,
                    "resuming inside a partly delivered transaction: its first {n} published rows are already in Kafka"
                );
                self.skip_rows = n;
                self.partial_rows = Some(n);
                Ok(())
            }
            ReplayBegin::Release(d) => self.settle(Settle::Release(d)).await,
        }
    }

    /// Drops what is held as delivered (proven), or publishes it in order (doubted).
    pub(super) async fn settle(&mut self, settle: Settle) -> Result<(), RelayError> {
        let held = std::mem::take(&mut self.held);
        match settle {
            Settle::Proven => {
                for h in held {
                    self.ledger.delivered(h.ticket, Outcome::Acked)?;
                    if let Some(row) = h.row {
                        self.rows.done(row);
                    }
                    self.obs.skipped_as_delivered();
                }
            }
            Settle::Release(d) => {
                self.doubted(d);
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
        self.obs.replay_held(self.held.len());
        Ok(())
    }

    /// A doubt: counted each time, logged once per session. The claim the session started
    /// with is given up for good unless the doubt is only the hold's size.
    pub(super) fn doubted(&mut self, d: Doubt) {
        self.obs.replay_doubt(d);
        if !std::mem::replace(&mut self.doubt_logged, true) {
            tracing::warn!(
                reason = d.as_str(),
                held = self.held.len(),
                "publishing replayed events again instead of skipping them: {}",
                d.explain()
            );
        }
        if d != Doubt::HoldFull {
            self.proof.doubt();
            // What this session confirms from here on is its own claim, in a lineage of
            // its own: the one it read is not this history's.
            self.claim = DeliveredPosition::at(self.timeline, self.confirmed, self.claim.fingerprint);
            self.prev_lineage = std::mem::replace(&mut self.lineage, rand::random());
        }
    }

    /// Takes the next published row of the open transaction.
    pub(super) fn next_row(&mut self) -> NextRow {
        let row = self.rows.next_row();
        if self.skip_rows == 0 {
            return NextRow::Publish(row);
        }
        self.skip_rows -= 1;
        if let Some(row) = row {
            self.rows.done(row);
        }
        self.obs.skipped_as_delivered();
        NextRow::InKafka
    }

    /// At the Commit of the transaction resumed inside: fewer published rows than recorded
    /// means the skipped ones may not be the delivered ones. The transaction is not
    /// confirmed: the session ends, and the next one publishes it whole.
    pub(super) fn check_partial_rows(&mut self, commit_lsn: Lsn) -> Result<(), RelayError> {
        let Some(recorded) = self.partial_rows.take() else {
            return Ok(());
        };
        let read = self.rows.open_rows();
        if read >= recorded {
            return Ok(());
        }
        self.doubted(Doubt::PartialRows);
        // Its skipped rows counted as done: no claim may name it partly delivered again.
        self.rows = outbox_core::RowLedger::default();
        Err(RelayError::PartialReplay {
            commit_lsn,
            recorded,
            read,
        })
    }
}
