//! Replayed transactions Kafka already has: skipped whole, or their leading rows (see
//! `outbox_core::delivered`).

use outbox_core::{Replay, RowId};
use pgoutput::{Lsn, PgTimestamp};

use super::Session;

impl Session<'_> {
    /// At a Begin: whether the transaction is skipped whole (Kafka has it); sets the
    /// leading rows to skip of a partly delivered one, and forgets the delivered range if
    /// the server's history changed.
    pub(super) fn replay(&mut self, commit_lsn: Lsn, commit_time: PgTimestamp) -> bool {
        match self.skip.on_begin(commit_lsn, commit_time) {
            Replay::Skip => true,
            Replay::Publish => false,
            Replay::SkipRows(n) => {
                tracing::info!(
                    commit_lsn = %commit_lsn,
                    rows = n,
                    "resuming inside a partly delivered transaction: its first {n} rows are already in Kafka"
                );
                self.skip_rows = n;
                false
            }
            Replay::HistoryChanged => {
                tracing::warn!(
                    commit_lsn = %commit_lsn,
                    "a transaction inside the range already delivered committed after the newest delivered one: the server's history changed (restored from a snapshot?); publishing everything from here"
                );
                self.known_below = Lsn::ZERO;
                false
            }
        }
    }

    /// A row of the open transaction that is already in Kafka (whole transaction or
    /// leading rows skipped), or has nothing to publish: done at once. `false`: publish it.
    /// Called once per row with `nothing_to_publish`, or once more for a mapping that
    /// turned out empty.
    pub(super) fn row_needs_nothing(
        &mut self,
        row: Option<RowId>,
        nothing_to_publish: bool,
    ) -> bool {
        let delivered = self.skipping || self.skip_rows > 0;
        // Rows are counted by position, relayed or not, as they were counted when acked.
        self.skip_rows = self.skip_rows.saturating_sub(1);
        if delivered && !nothing_to_publish {
            self.obs.skipped_as_delivered();
        }
        if delivered || nothing_to_publish {
            if let Some(row) = row {
                self.rows.done(row);
            }
            return true;
        }
        false
    }
}
