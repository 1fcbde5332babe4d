//! Merging and compaction of the ack queue.
//!
//! The queue is bounded by the messages in flight, not by the transactions read: one
//! message stuck on an unreachable partition must not make every later transaction cost
//! memory. A committed entry that needs no more reports and is not at the front is merged
//! into its predecessor (which then ends at the merged one's `end_lsn`): W reaches that
//! `end_lsn` exactly when it would have reached the predecessor's and then popped the
//! merged entry at once, so the watermark is unchanged. Merging happens at Commit, and a
//! compaction pass merges the entries whose last report arrived while they were not at
//! the front, so the queue holds at most `2 × (messages in flight + 2)` entries.
//!
//! A merged entry's [`super::TxnSeq`] is no longer known: every message of it was settled.

use pgoutput::Lsn;

use super::AckTracker;

impl AckTracker {
    /// The transaction just committed at the back needs no more reports: unless it is
    /// also the front (which `advance` pops), its predecessor carries its `end_lsn`.
    pub(super) fn merge_completed_back(&mut self, end_lsn: Lsn) {
        if self.pending.len() > 1 {
            self.pending.pop_back();
            if let Some(previous) = self.pending.back_mut() {
                previous.end_lsn = Some(end_lsn);
            }
        }
    }

    /// The queue is kept at or below this many entries. Twice what a compaction leaves at
    /// most (front, open, one per outstanding message), so a pass removes at least half of
    /// the entries it scans: amortized O(1) per transaction.
    pub(super) fn compaction_threshold(&self) -> usize {
        usize::try_from(self.in_flight)
            .unwrap_or(usize::MAX)
            .saturating_add(2)
            .saturating_mul(2)
    }

    /// A report lowers the bound, and the entry it completed may sit behind the front.
    pub(super) fn compact_if_over(&mut self) {
        if self.pending.len() > self.compaction_threshold() {
            self.compact();
        }
    }

    /// Merges every committed entry that needs no more reports into its predecessor; the
    /// front stays (it is what W waits for, and its `begun_at` is what the tests'
    /// `oldest_unacked` reports).
    pub(super) fn compact(&mut self) {
        let mut kept = 0;
        for i in 0..self.pending.len() {
            let t = &self.pending[i];
            if kept > 0 && t.outstanding == 0 && t.end_lsn.is_some() {
                let end = t.end_lsn;
                self.pending[kept - 1].end_lsn = end;
            } else {
                self.pending.swap(kept, i);
                kept += 1;
            }
        }
        self.pending.truncate(kept);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::super::TxnSeq;
    use crate::error::AckError;

    use super::*;

    fn lsn(v: u64) -> Lsn {
        Lsn(v)
    }

    #[test]
    fn completed_transactions_behind_a_stuck_message_are_merged() {
        let mut t = AckTracker::new(lsn(10));
        t.begin_at(7).unwrap();
        let stuck = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        // Empty transactions complete at Commit: merged into the stuck one at once.
        for i in 0..5u64 {
            t.begin().unwrap();
            t.commit(lsn(30 + i)).unwrap();
        }
        assert_eq!(t.open_transactions(), 1);
        // One acked before its Commit, one after: both end up merged too.
        t.begin().unwrap();
        let a = t.track_message().unwrap();
        t.ack(a).unwrap();
        t.commit(lsn(40)).unwrap();
        t.begin().unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(50)).unwrap();
        assert_eq!(t.open_transactions(), 2);
        t.ack(b).unwrap();
        t.begin().unwrap();
        t.commit(lsn(60)).unwrap();
        assert!(t.open_transactions() <= 2);
        // A merged transaction's seq is no longer known.
        assert!(matches!(t.ack(a), Err(AckError::UnknownTxn { .. })));
        assert_eq!(t.watermark(), lsn(10));
        assert_eq!(t.oldest_unacked(), Some(7), "the stuck transaction holds W");
        t.ack(stuck).unwrap();
        assert_eq!(t.watermark(), lsn(60));
        assert!(t.is_idle());
    }

    #[test]
    fn queue_stays_bounded_behind_one_stuck_message() {
        let mut t = AckTracker::new(lsn(1));
        t.begin().unwrap();
        let stuck = t.track_message().unwrap();
        t.commit(lsn(2)).unwrap();
        let mut end = 2;
        // A window of unacked messages acked out of order, interleaved with empty
        // transactions, all behind the stuck one.
        let mut window: VecDeque<TxnSeq> = VecDeque::new();
        let mut max_len = 0;
        for i in 0..200_000u64 {
            t.begin().unwrap();
            if i % 3 != 0 {
                window.push_back(t.track_message().unwrap());
            }
            end += 1;
            t.commit(lsn(end)).unwrap();
            if window.len() > 50 {
                // Newest first: every report completes a transaction behind the front.
                let k = window.pop_back().unwrap();
                t.ack(k).unwrap();
                let k = window.pop_front().unwrap();
                t.ack(k).unwrap();
            }
            let bound = 2 * (usize::try_from(t.in_flight_messages()).unwrap() + 2);
            assert!(
                t.open_transactions() <= bound,
                "{} entries",
                t.open_transactions()
            );
            max_len = max_len.max(t.open_transactions());
        }
        assert!(
            max_len <= 2 * (52 + 2),
            "{max_len} entries for at most 52 in flight"
        );
        assert_eq!(t.watermark(), lsn(1));
        for k in window.drain(..) {
            t.ack(k).unwrap();
        }
        assert!(t.open_transactions() <= 2 * (1 + 2));
        assert_eq!(t.watermark(), lsn(1));
        t.ack(stuck).unwrap();
        assert_eq!(t.watermark(), lsn(end));
        assert!(t.is_idle());
    }

    #[test]
    fn merging_does_not_delay_the_watermark() {
        // A completes after B and C completed behind it: W jumps straight to C's end.
        let mut t = AckTracker::new(lsn(0));
        t.begin().unwrap();
        let a = t.track_message().unwrap();
        t.commit(lsn(10)).unwrap();
        t.begin().unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        t.begin().unwrap();
        t.commit(lsn(30)).unwrap();
        t.begin().unwrap();
        let d = t.track_message().unwrap();
        t.ack(b).unwrap();
        t.ack(a).unwrap();
        assert_eq!(t.watermark(), lsn(30));
        assert!(t.in_transaction());
        t.ack(d).unwrap();
        assert_eq!(t.watermark(), lsn(30));
        t.commit(lsn(40)).unwrap();
        assert_eq!(t.watermark(), lsn(40));
    }
}
