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
//! The queue is bounded by the messages in flight, not by the transactions read: entries
//! that need no more reports are merged into their predecessors (`ack/merge.rs`), which
//! never changes the watermark.

use std::collections::VecDeque;

use pgoutput::Lsn;

use crate::error::AckError;

mod merge;
#[cfg(test)]
mod proptests;

/// Identifies the transaction a produced message belongs to: its position in the
/// session's stream of transactions. Not the Kafka delivery opaque (that is the
/// [`crate::Ticket`] of [`crate::InFlightLedger`], whose slab entry keeps this).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnSeq(u64);

#[cfg(test)]
impl TxnSeq {
    pub(crate) fn to_u64(self) -> u64 {
        self.0
    }

    /// Rebuild one from its number. Unknown values are rejected by
    /// [`AckTracker::ack`], so this cannot corrupt the tracker.
    pub(crate) fn from_u64(v: u64) -> Self {
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
    /// The tests' clock reading at Begin ([`AckTracker::begin_at`]).
    #[cfg(test)]
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

    /// A Begin was read.
    pub fn begin(&mut self) -> Result<(), AckError> {
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
            #[cfg(test)]
            begun_at: 0,
        });
        Ok(())
    }

    /// [`AckTracker::begin`] with a clock reading that [`AckTracker::oldest_unacked`]
    /// gives back, so tests can tell which transaction holds the watermark.
    #[cfg(test)]
    pub(crate) fn begin_at(&mut self, now: u64) -> Result<(), AckError> {
        self.begin()?;
        if let Some(txn) = self.pending.back_mut() {
            txn.begun_at = now;
        }
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
        if complete {
            self.merge_completed_back(end_lsn);
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

    /// Whether every transaction committed before the open one (if any) is fully
    /// acknowledged, none failed: the watermark is the end of the last one. What makes
    /// skipping the open transaction by hand (advancing the slot to its commit) lose
    /// nothing else.
    pub fn acked_up_to_open(&self) -> bool {
        self.failed.is_none() && self.pending.len() == usize::from(self.in_transaction())
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

    /// The `now` passed to [`AckTracker::begin_at`] of the oldest transaction the
    /// watermark has not reached: what holds progress back. `None` when idle.
    #[cfg(test)]
    pub(crate) fn oldest_unacked(&self) -> Option<u64> {
        self.pending.front().map(|t| t.begun_at)
    }

    fn open_txn(&self) -> Option<&PendingTxn> {
        self.pending.back().filter(|t| t.end_lsn.is_none())
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

    fn lsn(v: u64) -> Lsn {
        Lsn(v)
    }

    #[test]
    fn empty_transaction_completes_at_commit() {
        let mut t = AckTracker::new(lsn(100));
        t.begin_at(1).unwrap();
        assert!(!t.is_idle());
        assert!(t.in_transaction());
        assert_eq!(t.oldest_unacked(), Some(1));
        t.commit(lsn(150)).unwrap();
        assert_eq!(t.watermark(), lsn(150));
        assert!(t.is_idle());
        assert_eq!(t.oldest_unacked(), None);
    }

    #[test]
    fn acked_up_to_open_needs_every_earlier_transaction_acked() {
        let mut t = AckTracker::new(lsn(10));
        assert!(t.acked_up_to_open());
        t.begin().unwrap();
        let a = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        // The bad row's transaction, with a message of its own before the bad row.
        t.begin().unwrap();
        let b = t.track_message().unwrap();
        assert!(
            !t.acked_up_to_open(),
            "the transaction before it is unacked"
        );
        t.ack(b).unwrap();
        assert!(!t.acked_up_to_open());
        t.ack(a).unwrap();
        assert!(t.acked_up_to_open());
        assert_eq!(t.watermark(), lsn(20));
        // A failed delivery before: never.
        let mut f = AckTracker::new(lsn(10));
        f.begin().unwrap();
        let m = f.track_message().unwrap();
        f.commit(lsn(20)).unwrap();
        f.begin().unwrap();
        f.fail(m).unwrap();
        assert!(!f.acked_up_to_open());
    }

    #[test]
    fn watermark_is_end_lsn_of_contiguous_acked_prefix() {
        let mut t = AckTracker::new(lsn(10));
        t.begin().unwrap();
        let a1 = t.track_message().unwrap();
        let a2 = t.track_message().unwrap();
        t.commit(lsn(20)).unwrap();
        t.begin().unwrap();
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
        t.begin().unwrap();
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
        t.begin().unwrap();
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
        t.begin().unwrap();
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
        t.begin().unwrap();
        t.commit(lsn(90)).unwrap();
        assert_eq!(t.watermark(), lsn(100));
    }

    #[test]
    fn failure_freezes_watermark() {
        let mut t = AckTracker::new(lsn(0));
        t.begin().unwrap();
        let a = t.track_message().unwrap();
        let b = t.track_message().unwrap();
        t.commit(lsn(10)).unwrap();
        t.fail(a).unwrap();
        assert!(t.is_failed());
        assert_eq!(t.failed_txn(), Some(a));
        t.ack(b).unwrap();
        assert_eq!(t.watermark(), lsn(0));
        assert_eq!(t.in_flight_messages(), 0);
        t.begin().unwrap();
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
        t.begin().unwrap();
        assert!(matches!(
            t.begin(),
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
        t.begin().unwrap();
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
        t.begin().unwrap();
        t.commit(lsn(1)).unwrap();
        t.begin().unwrap();
        let m = t.track_message().unwrap();
        assert_eq!(TxnSeq::from_u64(m.to_u64()), m);
        t.ack(TxnSeq::from_u64(m.to_u64())).unwrap();
        t.commit(lsn(2)).unwrap();
        assert!(t.is_idle());
    }
}
