//! Turning out-of-order Kafka delivery reports into in-order replication progress.
//!
//! The relay reports to PostgreSQL a *flush* position W, and the server will never send
//! again a transaction whose `commit_lsn < W`. W must therefore only cover transactions
//! whose every message the broker acknowledged. Delivery reports come back in any order
//! (across partitions, and even before the transaction's Commit has been read, because a
//! large transaction is produced as it streams in), so a "last callback wins" watermark
//! loses data. Instead [`AckTracker`] keeps a queue of transactions in stream order with a
//! count of outstanding messages each, and W is the `end_lsn` of the newest transaction of
//! the fully-acknowledged, committed prefix of that queue:
//!
//! - `end_lsn`, never `commit_lsn` (reporting `commit_lsn` re-sends that transaction on
//!   every restart), and never `end_lsn + 1` (the next commit record may start exactly at
//!   `end_lsn`).
//! - Monotonic by construction: W only moves through `max`.
//! - A failed delivery freezes W for good ([`AckTracker::fail`]): later messages of the
//!   same partition may already be written, so the failed one cannot be re-sent alone
//!   without reordering. The relay drops the producer and restarts from the slot with a
//!   new tracker.
//! - Keepalives advance W only when nothing is open and nothing is unacknowledged
//!   ([`AckTracker::on_keepalive`], docs/replication-protocol.md §4.3).
//!
//! The queue is bounded by the messages in flight, not by the transactions read: one
//! message stuck on an unreachable partition must not make every later transaction cost
//! memory. A committed entry that needs no more reports and is not at the front is merged
//! into its predecessor (which then ends at the merged one's `end_lsn`): W reaches that
//! `end_lsn` exactly when it would have reached the predecessor's and then popped the
//! merged entry at once, so the watermark is unchanged. Merging happens at Commit, and a
//! compaction pass merges the entries whose last report arrived while they were not at
//! the front, so the queue holds at most `2 × (messages in flight + 2)` entries.

use std::collections::VecDeque;

use pgoutput::Lsn;

use crate::error::AckError;

/// Identifies the transaction a produced message belongs to: its position in the
/// session's stream of transactions. Not the Kafka delivery opaque (that is the
/// [`crate::Ticket`] of [`crate::InFlightLedger`], whose slab entry keeps this).
/// [`TxnSeq::to_u64`] / [`TxnSeq::from_u64`] expose the number for errors and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnSeq(u64);

impl TxnSeq {
    pub fn to_u64(self) -> u64 {
        self.0
    }

    /// Rebuild one from its number. Unknown values are rejected by
    /// [`AckTracker::ack`], so this cannot corrupt the tracker.
    pub fn from_u64(v: u64) -> Self {
        TxnSeq(v)
    }
}

#[derive(Debug, Clone)]
struct PendingTxn {
    /// Also the [`TxnSeq`] of this transaction's messages. Strictly increasing along the
    /// queue, so one is found by binary search even after merges removed entries.
    seq: u64,
    /// `None` until the Commit is read. After merges: the `end_lsn` of the newest
    /// transaction merged into this entry.
    end_lsn: Option<Lsn>,
    /// Messages handed to the producer without a delivery report yet.
    outstanding: u64,
    /// Caller-supplied clock reading at Begin (opaque to the tracker).
    begun_at: u64,
}

/// The ack queue of one replication session. See the module docs.
#[derive(Debug, Clone)]
pub struct AckTracker {
    watermark: Lsn,
    /// Transactions in stream order whose `end_lsn` W has not reached yet (runs of them
    /// merged into one entry, see the module docs). Only the last one can be uncommitted;
    /// committed, fully-acked ones at the front are popped at once.
    pending: VecDeque<PendingTxn>,
    next_seq: u64,
    in_flight: u64,
    failed: Option<TxnSeq>,
    last_end_lsn: Option<Lsn>,
}

impl AckTracker {
    /// `start` is where W begins: the slot's `confirmed_flush_lsn` (or the requested start
    /// position if higher). W never goes below it.
    pub fn new(start: Lsn) -> Self {
        AckTracker {
            watermark: start,
            pending: VecDeque::new(),
            next_seq: 0,
            in_flight: 0,
            failed: None,
            last_end_lsn: None,
        }
    }

    /// A Begin was read. `now` is any clock reading the caller wants back from
    /// [`AckTracker::oldest_unacked`] (e.g. monotonic microseconds); the tracker never
    /// interprets it.
    pub fn begin(&mut self, now: u64) -> Result<(), AckError> {
        if let Some(open) = self.open_txn() {
            return Err(AckError::TransactionAlreadyOpen { open: open.seq });
        }
        // `>=`: the push below must not take the queue past the bound.
        if self.pending.len() >= self.compaction_threshold() {
            self.compact();
        }
        let seq = self.next_seq;
        // 2^64 transactions cannot be read in a session; saturating keeps the queue sorted
        // by seq (which the lookup by seq relies on) even in theory.
        self.next_seq = self.next_seq.saturating_add(1);
        self.pending.push_back(PendingTxn {
            seq,
            end_lsn: None,
            outstanding: 0,
            begun_at: now,
        });
        Ok(())
    }

    /// A message of the open transaction was handed to the producer. Pass the returned
    /// [`TxnSeq`] back to [`AckTracker::ack`] or [`AckTracker::fail`] with its delivery report.
    pub fn track_message(&mut self) -> Result<TxnSeq, AckError> {
        let txn = self
            .pending
            .back_mut()
            .filter(|t| t.end_lsn.is_none())
            .ok_or(AckError::NoOpenTransaction {
                operation: "a produced message",
            })?;
        txn.outstanding = txn.outstanding.saturating_add(1);
        self.in_flight = self.in_flight.saturating_add(1);
        Ok(TxnSeq(txn.seq))
    }

    /// The Commit of the open transaction was read. A transaction without messages (or
    /// whose messages are all acknowledged already) completes here.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), AckError> {
        if let Some(previous) = self.last_end_lsn.filter(|p| end_lsn < *p) {
            return Err(AckError::EndLsnRegressed { end_lsn, previous });
        }
        let txn = self
            .pending
            .back_mut()
            .filter(|t| t.end_lsn.is_none())
            .ok_or(AckError::NoOpenTransaction {
                operation: "Commit",
            })?;
        txn.end_lsn = Some(end_lsn);
        let complete = txn.outstanding == 0;
        self.last_end_lsn = Some(end_lsn);
        if complete && self.pending.len() > 1 {
            // Needs nothing more: let the predecessor carry its end_lsn (module docs).
            self.pending.pop_back();
            if let Some(previous) = self.pending.back_mut() {
                previous.end_lsn = Some(end_lsn);
            }
        }
        self.advance();
        Ok(())
    }

    /// A successful delivery report. May arrive in any order, and before the Commit.
    pub fn ack(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        self.settle(seq)?;
        self.advance();
        self.compact_if_over();
        Ok(())
    }

    /// A tracked message the producer refused before taking it, so no delivery report
    /// will come: it stops holding its transaction back. The caller must track whatever
    /// replaces it (a dead-letter record) before the transaction's Commit, or stop.
    pub fn untrack(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        self.settle(seq)?;
        self.advance();
        Ok(())
    }

    /// A failed delivery report. Freezes the watermark permanently (even if the seq is
    /// unknown, which is reported as an error as well): the relay must drop the producer
    /// and restart from the slot. Later reports are still counted so the relay can drain.
    pub fn fail(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        if self.failed.is_none() {
            self.failed = Some(seq);
        }
        self.settle(seq)?;
        self.compact_if_over();
        Ok(())
    }

    /// The position safe to report as flushed. Never decreases.
    pub fn watermark(&self) -> Lsn {
        self.watermark
    }

    /// A primary keepalive with `wal_end` was read. W moves to `max(W, wal_end)` only if
    /// no transaction is open, every transaction is fully acknowledged and no delivery
    /// failed (docs/replication-protocol.md §4.3). Returns whether W moved.
    pub fn on_keepalive(&mut self, wal_end: Lsn) -> bool {
        if self.failed.is_some() || !self.pending.is_empty() || wal_end <= self.watermark {
            return false;
        }
        self.watermark = wal_end;
        true
    }

    /// A delivery failed; W will not move again in this tracker.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The transaction of the first failed delivery.
    pub fn failed_txn(&self) -> Option<TxnSeq> {
        self.failed
    }

    /// No transaction open and nothing awaiting acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether a Begin was read without its Commit yet.
    pub fn in_transaction(&self) -> bool {
        self.open_txn().is_some()
    }

    /// Messages produced without a delivery report yet.
    pub fn in_flight_messages(&self) -> u64 {
        self.in_flight
    }

    /// Entries of the queue of transactions the watermark has not reached yet: the open
    /// one, if any, plus committed ones waiting for delivery reports (or, after a failure,
    /// never to be reached). Runs of transactions that need no more reports count as one,
    /// so this stays at most `2 × (in_flight_messages() + 2)` however many transactions
    /// wait behind an unacknowledged message.
    pub fn open_transactions(&self) -> usize {
        self.pending.len()
    }

    /// The `now` passed to [`AckTracker::begin`] of the oldest transaction the watermark
    /// has not reached: what holds progress back. `None` when idle.
    pub fn oldest_unacked(&self) -> Option<u64> {
        self.pending.front().map(|t| t.begun_at)
    }

    fn open_txn(&self) -> Option<&PendingTxn> {
        self.pending.back().filter(|t| t.end_lsn.is_none())
    }

    /// The queue is kept at or below this many entries. Twice what a compaction leaves at
    /// most (front, open, one per outstanding message), so a pass removes at least half of
    /// the entries it scans: amortized O(1) per transaction.
    fn compaction_threshold(&self) -> usize {
        usize::try_from(self.in_flight)
            .unwrap_or(usize::MAX)
            .saturating_add(2)
            .saturating_mul(2)
    }

    /// A report lowers the bound, and the entry it completed may sit behind the front.
    fn compact_if_over(&mut self) {
        if self.pending.len() > self.compaction_threshold() {
            self.compact();
        }
    }

    /// Merges every committed entry that needs no more reports into its predecessor; the
    /// front stays (it is what W waits for, and its `begun_at` is what
    /// [`AckTracker::oldest_unacked`] reports).
    fn compact(&mut self) {
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

    fn settle(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        let unknown = || AckError::UnknownTxn { seq: seq.0 };
        let index = self
            .pending
            .binary_search_by_key(&seq.0, |t| t.seq)
            .map_err(|_| unknown())?;
        let txn = self.pending.get_mut(index).ok_or_else(unknown)?;
        if txn.outstanding == 0 {
            return Err(AckError::TooManyReports { seq: seq.0 });
        }
        txn.outstanding -= 1;
        self.in_flight = self.in_flight.saturating_sub(1);
        Ok(())
    }

    fn advance(&mut self) {
        if self.failed.is_some() {
            return;
        }
        while let Some(front) = self.pending.front() {
            match front.end_lsn {
                Some(end) if front.outstanding == 0 => {
                    self.watermark = self.watermark.max(end);
                    self.pending.pop_front();
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lsn(v: u64) -> Lsn {
        Lsn(v)
    }

    #[test]
    fn empty_transaction_completes_at_commit() {
        let mut t = AckTracker::new(lsn(100));
        t.begin(1).unwrap();
        assert!(!t.is_idle());
        assert!(t.in_transaction());
        assert_eq!(t.oldest_unacked(), Some(1));
        t.commit(lsn(150)).unwrap();
        assert_eq!(t.watermark(), lsn(150));
        assert!(t.is_idle());
        assert_eq!(t.oldest_unacked(), None);
    }

    #[test]
    fn watermark_is_end_lsn_of_contiguous_acked_prefix() {
        let mut t = AckTracker::new(lsn(10));
        t.begin(0).unwrap();
        let a1 = t.track_message().unwrap();
        let a2 = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        t.begin(0).unwrap();
        let b1 = t.track_message().unwrap();
        t.commit(lsn(30)).unwrap();
        assert_eq!(t.in_flight_messages(), 3);
        assert_eq!(t.open_transactions(), 2);

        // Second transaction acked first: nothing moves.
        t.ack(b1).unwrap();
        assert_eq!(t.watermark(), lsn(10));
        t.ack(a2).unwrap();
        assert_eq!(t.watermark(), lsn(10));
        // Completing the first releases both.
        t.ack(a1).unwrap();
        assert_eq!(t.watermark(), lsn(30));
        assert!(t.is_idle());
        assert_eq!(t.in_flight_messages(), 0);
    }

    #[test]
    fn acks_before_commit_wait_for_commit() {
        let mut t = AckTracker::new(lsn(0));
        t.begin(0).unwrap();
        let m = t.track_message().unwrap();
        t.ack(m).unwrap();
        assert_eq!(t.watermark(), lsn(0));
        assert!(t.in_transaction());
        t.commit(lsn(40)).unwrap();
        assert_eq!(t.watermark(), lsn(40));
    }

    #[test]
    fn keepalive_does_not_move_while_unacked() {
        let mut t = AckTracker::new(lsn(10));
        t.begin(0).unwrap();
        let m = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        // Keepalive beyond the unacked transaction: must not move (loss after a crash).
        assert!(!t.on_keepalive(lsn(500)));
        assert_eq!(t.watermark(), lsn(10));
        t.ack(m).unwrap();
        assert_eq!(t.watermark(), lsn(20));
        assert!(t.on_keepalive(lsn(500)));
        assert_eq!(t.watermark(), lsn(500));
    }

    #[test]
    fn keepalive_does_not_move_inside_transaction() {
        let mut t = AckTracker::new(lsn(10));
        t.begin(0).unwrap();
        assert!(!t.on_keepalive(lsn(50)));
        assert_eq!(t.watermark(), lsn(10));
    }

    #[test]
    fn keepalive_never_moves_backwards() {
        let mut t = AckTracker::new(lsn(100));
        assert!(!t.on_keepalive(lsn(50)));
        assert!(!t.on_keepalive(lsn(100)));
        assert_eq!(t.watermark(), lsn(100));
        assert!(t.on_keepalive(lsn(101)));
    }

    #[test]
    fn commit_below_start_does_not_lower_watermark() {
        let mut t = AckTracker::new(lsn(100));
        t.begin(0).unwrap();
        t.commit(lsn(90)).unwrap();
        assert_eq!(t.watermark(), lsn(100));
    }

    #[test]
    fn failure_freezes_watermark() {
        let mut t = AckTracker::new(lsn(0));
        t.begin(0).unwrap();
        let a = t.track_message().unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(10)).unwrap();
        t.fail(a).unwrap();
        assert!(t.is_failed());
        assert_eq!(t.failed_txn(), Some(a));
        t.ack(b).unwrap();
        assert_eq!(t.watermark(), lsn(0));
        assert_eq!(t.in_flight_messages(), 0);
        t.begin(0).unwrap();
        t.commit(lsn(20)).unwrap();
        assert!(!t.on_keepalive(lsn(30)));
        assert_eq!(t.watermark(), lsn(0));
    }

    #[test]
    fn failure_with_unknown_txn_still_freezes() {
        let mut t = AckTracker::new(lsn(0));
        assert!(t.fail(TxnSeq::from_u64(7)).is_err());
        assert!(t.is_failed());
        assert!(!t.on_keepalive(lsn(5)));
    }

    #[test]
    fn sequence_errors() {
        let mut t = AckTracker::new(lsn(0));
        assert!(matches!(
            t.track_message(),
            Err(AckError::NoOpenTransaction { .. })
        ));
        assert!(matches!(
            t.commit(lsn(5)),
            Err(AckError::NoOpenTransaction { .. })
        ));
        t.begin(0).unwrap();
        assert!(matches!(
            t.begin(0),
            Err(AckError::TransactionAlreadyOpen { open: 0 })
        ));
        let m = t.track_message().unwrap();
        t.ack(m).unwrap();
        assert!(matches!(t.ack(m), Err(AckError::TooManyReports { seq: 0 })));
        assert!(matches!(
            t.ack(TxnSeq::from_u64(9)),
            Err(AckError::UnknownTxn { seq: 9 })
        ));
        t.commit(lsn(50)).unwrap();
        // The transaction completed: its seq is no longer known.
        assert!(matches!(t.ack(m), Err(AckError::UnknownTxn { .. })));
        t.begin(0).unwrap();
        assert!(matches!(
            t.commit(lsn(49)),
            Err(AckError::EndLsnRegressed { .. })
        ));
        // The failed commit left the transaction open.
        assert!(t.in_transaction());
        t.commit(lsn(60)).unwrap();
        assert_eq!(t.watermark(), lsn(60));
    }

    #[test]
    fn txn_seq_round_trips() {
        let mut t = AckTracker::new(lsn(0));
        t.begin(0).unwrap();
        t.commit(lsn(1)).unwrap();
        t.begin(0).unwrap();
        let m = t.track_message().unwrap();
        assert_eq!(TxnSeq::from_u64(m.to_u64()), m);
        t.ack(TxnSeq::from_u64(m.to_u64())).unwrap();
        t.commit(lsn(2)).unwrap();
        assert!(t.is_idle());
    }

    #[test]
    fn completed_transactions_behind_a_stuck_message_are_merged() {
        let mut t = AckTracker::new(lsn(10));
        t.begin(7).unwrap();
        let stuck = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        // Empty transactions complete at Commit: merged into the stuck one at once.
        for i in 0..5u64 {
            t.begin(0).unwrap();
            t.commit(lsn(30 + i)).unwrap();
        }
        assert_eq!(t.open_transactions(), 1);
        // One acked before its Commit, one after: both end up merged too.
        t.begin(0).unwrap();
        let a = t.track_message().unwrap();
        t.ack(a).unwrap();
        t.commit(lsn(40)).unwrap();
        t.begin(0).unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(50)).unwrap();
        assert_eq!(t.open_transactions(), 2);
        t.ack(b).unwrap();
        t.begin(0).unwrap();
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
        t.begin(0).unwrap();
        let stuck = t.track_message().unwrap();
        t.commit(lsn(2)).unwrap();
        let mut end = 2;
        // A window of unacked messages acked out of order, interleaved with empty
        // transactions, all behind the stuck one.
        let mut window: VecDeque<TxnSeq> = VecDeque::new();
        let mut max_len = 0;
        for i in 0..200_000u64 {
            t.begin(0).unwrap();
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
        t.begin(0).unwrap();
        let a = t.track_message().unwrap();
        t.commit(lsn(10)).unwrap();
        t.begin(0).unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        t.begin(0).unwrap();
        t.commit(lsn(30)).unwrap();
        t.begin(0).unwrap();
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

    /// One step of a simulated session.
    #[derive(Debug, Clone)]
    enum Step {
        /// Feed the next stream event (Begin, message, Commit, or an idle keepalive).
        Stream,
        /// Deliver (ack) the outstanding message at this index modulo the count.
        Ack(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![Just(Step::Stream), any::<usize>().prop_map(Step::Ack)]
    }

    #[derive(Debug, Clone, Copy)]
    enum Event {
        Begin,
        Message,
        Commit,
        /// A keepalive read between transactions; wal_end never beyond the next commit.
        Keepalive(u64),
        /// A keepalive with an arbitrary (possibly huge) wal_end inside a transaction.
        KeepaliveInside(u64),
    }

    /// Transactions as (message count, commit_lsn, end_lsn), in WAL order; many without
    /// messages (zero-row, or only ignored content), which the tracker merges.
    fn transactions() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
        let count = prop_oneof![2 => Just(0usize), 3 => 0usize..5];
        prop::collection::vec((count, 0u64..40, 1u64..40), 0..40).prop_map(|v| {
            let mut pos = 1000;
            v.into_iter()
                .map(|(n, gap, len)| {
                    let commit = pos + gap;
                    let end = commit + len;
                    pos = end;
                    (n, commit, end)
                })
                .collect()
        })
    }

    fn events(txns: &[(usize, u64, u64)], start: u64) -> Vec<Event> {
        let mut out = Vec::new();
        let mut prev_end = start;
        for &(n, commit, end) in txns {
            // Idle keepalive: anything in [prev_end, commit] is legal (sentPtr <= next commit).
            out.push(Event::Keepalive(prev_end + (commit - prev_end) / 2));
            out.push(Event::Begin);
            for i in 0..n {
                out.push(Event::Message);
                if i == 0 {
                    out.push(Event::KeepaliveInside(u64::MAX - 1));
                }
            }
            out.push(Event::Commit);
            prev_end = end;
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn watermark_is_safe_monotonic_and_complete(
            txns in transactions(),
            steps in prop::collection::vec(step(), 0..300),
            tail_order in prop::collection::vec(any::<usize>(), 60),
        ) {
            let start = 1000;
            let mut t = AckTracker::new(Lsn(start));
            let evs = events(&txns, start);
            let mut ev_i = 0;
            let mut txn_i = 0; // index of the next transaction to Begin
            // Outstanding messages' seqs with their transaction index.
            let mut outstanding: Vec<(TxnSeq, usize)> = Vec::new();
            // Unacked message count per transaction; committed flags.
            let mut unacked = vec![0usize; txns.len()];
            let mut committed = vec![false; txns.len()];
            let mut last_w = t.watermark();

            let check = |t: &AckTracker, last_w: &mut Lsn, unacked: &[usize], committed: &[bool]| {
                let w = t.watermark();
                prop_assert!(w >= *last_w, "watermark went back: {:?} -> {:?}", last_w, w);
                *last_w = w;
                // The first transaction not fully done bounds W by its commit_lsn (so it
                // is re-sent on restart): W <= commit_lsn < end_lsn.
                let first_undone = (0..txns.len()).find(|&i| !committed[i] || unacked[i] > 0);
                if let Some(i) = first_undone {
                    prop_assert!(w.0 <= txns[i].1,
                        "W {} passed txn {} (commit {}, end {}) with unacked messages", w.0, i, txns[i].1, txns[i].2);
                }
                // And W is not late: it covers the whole completed prefix at once.
                let done = first_undone.unwrap_or(txns.len());
                if let Some(last_done) = done.checked_sub(1) {
                    prop_assert!(w.0 >= txns[last_done].2,
                        "W {} lags the completed prefix ending at {}", w.0, txns[last_done].2);
                }
                // Bookkeeping is bounded by the messages in flight, not by transactions.
                let in_flight = usize::try_from(t.in_flight_messages()).unwrap();
                prop_assert!(t.open_transactions() <= 2 * (in_flight + 2),
                    "{} queue entries with {} messages in flight", t.open_transactions(), in_flight);
                Ok(())
            };

            let feed = |t: &mut AckTracker, ev_i: &mut usize, txn_i: &mut usize,
                            outstanding: &mut Vec<(TxnSeq, usize)>, unacked: &mut [usize],
                            committed: &mut [bool]| {
                let Some(ev) = evs.get(*ev_i).copied() else { return false };
                *ev_i += 1;
                match ev {
                    Event::Begin => t.begin(0).unwrap(),
                    Event::Message => {
                        let tk = t.track_message().unwrap();
                        outstanding.push((tk, *txn_i));
                        unacked[*txn_i] += 1;
                    }
                    Event::Commit => {
                        t.commit(Lsn(txns[*txn_i].2)).unwrap();
                        committed[*txn_i] = true;
                        *txn_i += 1;
                    }
                    Event::Keepalive(w) | Event::KeepaliveInside(w) => {
                        let idle = t.is_idle();
                        let before = t.watermark();
                        let moved = t.on_keepalive(Lsn(w));
                        if !idle {
                            assert!(!moved);
                            assert_eq!(t.watermark(), before);
                        }
                    }
                }
                true
            };

            for s in &steps {
                match s {
                    Step::Stream => {
                        feed(&mut t, &mut ev_i, &mut txn_i, &mut outstanding, &mut unacked, &mut committed);
                    }
                    Step::Ack(k) => {
                        if !outstanding.is_empty() {
                            let (tk, ti) = outstanding.swap_remove(k % outstanding.len());
                            t.ack(tk).unwrap();
                            unacked[ti] -= 1;
                        }
                    }
                }
                check(&t, &mut last_w, &unacked, &committed)?;
            }
            // Finish the stream, then deliver everything left in a random order.
            while feed(&mut t, &mut ev_i, &mut txn_i, &mut outstanding, &mut unacked, &mut committed) {
                check(&t, &mut last_w, &unacked, &committed)?;
            }
            let mut r = tail_order.iter().cycle();
            while !outstanding.is_empty() {
                let k = r.next().copied().unwrap_or(0);
                let (tk, ti) = outstanding.swap_remove(k % outstanding.len());
                t.ack(tk).unwrap();
                unacked[ti] -= 1;
                check(&t, &mut last_w, &unacked, &committed)?;
            }
            prop_assert!(t.is_idle());
            prop_assert_eq!(t.in_flight_messages(), 0);
            let expected = txns.last().map_or(start, |x| x.2);
            prop_assert_eq!(t.watermark(), Lsn(expected));
        }

        #[test]
        fn failure_freezes_forever(
            sizes in prop::collection::vec(1usize..4, 1..8),
            fail_at in any::<usize>(),
            order in prop::collection::vec(any::<usize>(), 40),
        ) {
            let mut t = AckTracker::new(Lsn(0));
            let mut seqs = Vec::new();
            for (i, n) in sizes.iter().enumerate() {
                t.begin(0).unwrap();
                for _ in 0..*n {
                    seqs.push(t.track_message().unwrap());
                }
                t.commit(Lsn(10 * (u64::try_from(i).unwrap() + 1))).unwrap();
            }
            let failed = seqs.swap_remove(fail_at % seqs.len());
            // Deliver some first, then the failure, then the rest.
            let mut r = order.iter().cycle();
            let split = fail_at % (seqs.len() + 1);
            for _ in 0..split {
                let k = r.next().copied().unwrap_or(0) % seqs.len();
                t.ack(seqs.swap_remove(k)).unwrap();
            }
            t.fail(failed).unwrap();
            let frozen = t.watermark();
            while !seqs.is_empty() {
                let k = r.next().copied().unwrap_or(0) % seqs.len();
                t.ack(seqs.swap_remove(k)).unwrap();
                prop_assert_eq!(t.watermark(), frozen);
            }
            prop_assert!(!t.on_keepalive(Lsn(u64::MAX)));
            prop_assert_eq!(t.watermark(), frozen);
            // W stops below the failed message's transaction (seq = transaction index).
            prop_assert!(frozen.0 < 10 * (failed.to_u64() + 1));
            prop_assert_eq!(t.in_flight_messages(), 0);
        }

        /// Acks, refusals (untrack + a dead-letter replacement) and failures in any
        /// order against a plain model: W never passes the commit of a transaction with
        /// an unacked message, never moves after a failure, and the queue stays bounded.
        #[test]
        fn untrack_and_fail_against_a_model(
            ops in prop::collection::vec((0u8..6, any::<usize>()), 0..400),
        ) {
            let mut t = AckTracker::new(Lsn(100));
            // (commit_lsn, end_lsn, unacked) per transaction in stream order.
            let mut model: Vec<(u64, Option<u64>, usize)> = Vec::new();
            let mut outstanding: Vec<(TxnSeq, usize)> = Vec::new();
            let mut pos = 100u64;
            let mut open = false;
            let mut frozen: Option<Lsn> = None;
            let mut last_w = t.watermark();
            for (op, k) in ops {
                match op {
                    0 if !open => {
                        t.begin(0).unwrap();
                        model.push((pos + 1, None, 0));
                        open = true;
                    }
                    1 if open => {
                        let i = model.len() - 1;
                        let tk = t.track_message().unwrap();
                        if k % 3 == 0 {
                            // Refused by the producer: a dead letter replaces it.
                            t.untrack(tk).unwrap();
                            let dl = t.track_message().unwrap();
                            outstanding.push((dl, i));
                        } else {
                            outstanding.push((tk, i));
                        }
                        model[i].2 += 1;
                    }
                    2 if open => {
                        let i = model.len() - 1;
                        pos += 2;
                        model[i].0 = pos;
                        pos += 1 + u64::try_from(k % 5).unwrap();
                        model[i].1 = Some(pos);
                        t.commit(Lsn(pos)).unwrap();
                        open = false;
                    }
                    3 | 4 if !outstanding.is_empty() => {
                        let (tk, i) = outstanding.swap_remove(k % outstanding.len());
                        if op == 4 && k % 7 == 0 {
                            t.fail(tk).unwrap();
                            frozen.get_or_insert(t.watermark());
                        } else {
                            t.ack(tk).unwrap();
                        }
                        model[i].2 -= 1;
                    }
                    5 if !open => {
                        t.on_keepalive(Lsn(pos));
                    }
                    _ => {}
                }
                let w = t.watermark();
                prop_assert!(w >= last_w);
                last_w = w;
                if let Some(f) = frozen {
                    prop_assert_eq!(w, f, "W moved after a failure");
                }
                if let Some(&(commit, _, _)) = model.iter().find(|m| m.1.is_none() || m.2 > 0) {
                    prop_assert!(w.0 < commit, "W {} passed an undone commit {}", w.0, commit);
                }
                let in_flight = usize::try_from(t.in_flight_messages()).unwrap();
                prop_assert_eq!(in_flight, outstanding.len());
                prop_assert!(t.open_transactions() <= 2 * (in_flight + 2));
            }
            if frozen.is_none() && !open && outstanding.is_empty() {
                prop_assert_eq!(t.watermark().0, model.last().and_then(|m| m.1).unwrap_or(100).max(last_w.0));
            }
        }
    }
}
