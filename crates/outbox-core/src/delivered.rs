//! Skipping what Kafka already has when PostgreSQL replays it.
//!
//! A logical slot's `confirmed_flush_lsn` is made durable only at checkpoints, so after a
//! PostgreSQL restart the server sends again every transaction since the last one. The
//! relay knows better: the position it confirmed (in memory within one process, from the
//! progress record in Kafka across processes) covers transactions the broker acked. A
//! [`DeliveredPosition`] is that knowledge, and [`SkipRange`] decides, per replayed
//! transaction, whether it is already in Kafka.
//!
//! Skipping is an optimisation that must never lose an event, so it is narrow:
//!
//! - Only transactions whose commit LSN is below the delivered position, on the same
//!   timeline, or below the point where a new timeline forked from the recorded one (a
//!   failover or point-in-time restore reuses positions past the fork for other
//!   transactions).
//! - Only while replayed transactions look like the old history: one that committed later
//!   than the newest delivered commit (plus a second of slack for concurrent commits)
//!   cannot have been delivered — the server's WAL was rewound, e.g. a disk snapshot was
//!   restored — and ends skipping for good.
//! - Inside a transaction, only the rows acked in order from its start ([`PartialTxn`],
//!   tracked by [`RowLedger`]), and only in the transaction with that very commit LSN on
//!   the same timeline: pgoutput replays a transaction with the same changes in the same
//!   order. Rows are counted over every Insert and transactional Message of the
//!   transaction, whatever the relay does with them, so the count does not depend on
//!   the relay's configuration.

use std::collections::{BTreeMap, BTreeSet};

use pgoutput::{Lsn, PgTimestamp};

/// How far the broker is known to have everything, and on which history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveredPosition {
    pub timeline: u32,
    /// Every transaction with a commit LSN below this is acked (an `end_lsn` or a
    /// keepalive's `walEnd` the relay confirmed).
    pub lsn: Lsn,
    /// Commit time of the newest transaction read when `lsn` was confirmed: no delivered
    /// transaction committed later.
    pub last_commit_unix_micros: i64,
    /// A transaction at or past `lsn` whose leading rows are acked.
    pub partial: Option<PartialTxn>,
}

/// The leading rows of one transaction that the broker acked, in order from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialTxn {
    pub commit_lsn: Lsn,
    pub rows: u64,
}

/// One change of a transaction: its commit LSN and its index among the transaction's
/// Inserts and transactional Messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowId {
    pub commit_lsn: Lsn,
    pub index: u64,
}

#[derive(Debug, Default)]
struct TxnRows {
    /// Rows read so far.
    read: u64,
    /// Rows 0..done are all done (acked, or nothing to publish).
    done: u64,
    /// Done rows past the first not done one.
    ahead: BTreeSet<u64>,
    committed: bool,
}

/// Which leading rows of each transaction with rows in flight are done. An entry leaves
/// as soon as its transaction is committed and all its rows are done (then the
/// watermark, not this ledger, covers it), so it holds no more entries than there are
/// transactions with messages in flight, plus the open one.
#[derive(Debug, Default)]
pub struct RowLedger {
    txns: BTreeMap<Lsn, TxnRows>,
    open: Option<Lsn>,
}

impl RowLedger {
    /// A transaction's Begin.
    pub fn begin(&mut self, commit_lsn: Lsn) {
        self.txns.entry(commit_lsn).or_default();
        self.open = Some(commit_lsn);
    }

    /// The next row of the open transaction (`None` outside one).
    pub fn next_row(&mut self) -> Option<RowId> {
        let commit_lsn = self.open?;
        let t = self.txns.get_mut(&commit_lsn)?;
        let index = t.read;
        t.read += 1;
        Some(RowId { commit_lsn, index })
    }

    /// The row is acked, or there was nothing to publish for it.
    pub fn done(&mut self, row: RowId) {
        let Some(t) = self.txns.get_mut(&row.commit_lsn) else {
            return;
        };
        if row.index == t.done {
            t.done += 1;
            while t.ahead.remove(&t.done) {
                t.done += 1;
            }
        } else if row.index > t.done {
            t.ahead.insert(row.index);
        }
        if t.committed && t.done == t.read {
            self.txns.remove(&row.commit_lsn);
        }
    }

    /// The open transaction's Commit.
    pub fn commit(&mut self) {
        if let Some(lsn) = self.open.take() {
            if let Some(t) = self.txns.get_mut(&lsn) {
                t.committed = true;
                if t.done == t.read {
                    self.txns.remove(&lsn);
                }
            }
        }
    }

    /// The transaction at or past `confirmed` with the most leading rows done (the one
    /// worth resuming inside), if any has some.
    pub fn partial(&self, confirmed: Lsn) -> Option<PartialTxn> {
        self.txns
            .range(confirmed..)
            .filter(|(_, t)| t.done > 0)
            .max_by_key(|(_, t)| t.done)
            .map(|(lsn, t)| PartialTxn {
                commit_lsn: *lsn,
                rows: t.done,
            })
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }
}

/// Commits this much later than the newest delivered one may still be replays: commit
/// timestamps are taken before the commit record is inserted, so concurrent commits can
/// be slightly out of LSN order.
const COMMIT_TIME_SLACK_MICROS: i64 = 1_000_000;

/// What to do with one transaction of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Already in Kafka: read it, publish nothing.
    Skip,
    /// Publish it.
    Publish,
    /// Publish it, and this transaction showed the history changed: skipping ended.
    HistoryChanged,
    /// Its first `n` rows are already in Kafka: read them, publish the rest.
    SkipRows(u64),
}

/// The replayed range of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkipRange {
    below: Lsn,
    last_commit_unix_micros: i64,
    active: bool,
    /// Only on the recorded timeline: another one may have reused the position.
    partial: Option<PartialTxn>,
}

impl SkipRange {
    /// `known` on the server's current `timeline`; `fork` is where that timeline's
    /// history left `known.timeline` (from TIMELINE_HISTORY), `None` when the timelines
    /// are equal or `known.timeline` is not an ancestor (then nothing is skipped).
    pub fn new(known: DeliveredPosition, timeline: u32, fork: Option<Lsn>) -> Self {
        let below = if known.timeline == timeline {
            Some(known.lsn)
        } else {
            fork.map(|f| f.min(known.lsn))
        };
        let below = below.unwrap_or(Lsn::ZERO);
        let partial = known
            .partial
            .filter(|p| known.timeline == timeline && p.commit_lsn >= below && p.rows > 0);
        SkipRange {
            below,
            last_commit_unix_micros: known.last_commit_unix_micros,
            active: below > Lsn::ZERO || partial.is_some(),
            partial,
        }
    }

    /// Skips nothing.
    pub fn none() -> Self {
        SkipRange {
            below: Lsn::ZERO,
            last_commit_unix_micros: 0,
            active: false,
            partial: None,
        }
    }

    /// The exclusive upper bound of commit LSNs that may be skipped.
    pub fn below(&self) -> Option<Lsn> {
        (self.active && self.below > Lsn::ZERO).then_some(self.below)
    }

    /// The transaction whose leading rows may be skipped.
    pub fn partial(&self) -> Option<PartialTxn> {
        self.partial
    }

    /// The newest delivered commit time the range was built from (0 for [`none`]).
    ///
    /// [`none`]: SkipRange::none
    pub fn last_commit_unix_micros(&self) -> i64 {
        self.last_commit_unix_micros
    }

    /// A transaction's Begin: its commit LSN and time.
    pub fn on_begin(&mut self, commit_lsn: Lsn, commit_time: PgTimestamp) -> Replay {
        if !self.active {
            return Replay::Publish;
        }
        let newest_possible = self
            .last_commit_unix_micros
            .saturating_add(COMMIT_TIME_SLACK_MICROS);
        if commit_lsn >= self.below {
            let partial = self.partial.filter(|p| p.commit_lsn == commit_lsn);
            let past = self.partial.is_none_or(|p| commit_lsn >= p.commit_lsn);
            if past {
                // Past the replayed range: nothing more can be skipped in this session.
                self.active = false;
            }
            return match partial {
                Some(_) if commit_time.unix_micros() > newest_possible => Replay::HistoryChanged,
                Some(p) => Replay::SkipRows(p.rows),
                None => Replay::Publish,
            };
        }
        if commit_time.unix_micros() > newest_possible {
            self.active = false;
            return Replay::HistoryChanged;
        }
        Replay::Skip
    }
}

/// Parses a timeline history file (`parentTLI<TAB>switchpoint<TAB>reason` lines, as
/// TIMELINE_HISTORY returns it) into `(parent timeline, switchpoint)` pairs.
pub fn parse_timeline_history(text: &str) -> Result<Vec<(u32, Lsn)>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(tli), Some(lsn)) = (fields.next(), fields.next()) else {
            return Err(format!("malformed timeline history line {line:?}"));
        };
        let tli: u32 = tli
            .parse()
            .map_err(|_| format!("bad timeline {tli:?} in history line {line:?}"))?;
        let lsn: Lsn = lsn
            .parse()
            .map_err(|e| format!("bad switchpoint in history line {line:?}: {e}"))?;
        out.push((tli, lsn));
    }
    Ok(out)
}

/// Where the history of the current timeline left `ancestor`: `None` when `ancestor`
/// does not appear in it.
pub fn fork_point(history: &[(u32, Lsn)], ancestor: u32) -> Option<Lsn> {
    history
        .iter()
        .find(|(tli, _)| *tli == ancestor)
        .map(|(_, lsn)| *lsn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(unix_micros: i64) -> PgTimestamp {
        PgTimestamp(unix_micros - pgoutput::time::PG_EPOCH_OFFSET_MICROS)
    }

    fn known(tli: u32, lsn: u64, last: i64) -> DeliveredPosition {
        DeliveredPosition {
            timeline: tli,
            lsn: Lsn(lsn),
            last_commit_unix_micros: last,
            partial: None,
        }
    }

    #[test]
    fn skips_replayed_transactions_then_stops_at_the_first_new_one() {
        let mut r = SkipRange::new(known(1, 1000, 5_000_000), 1, None);
        assert_eq!(r.on_begin(Lsn(100), at(1_000_000)), Replay::Skip);
        assert_eq!(r.on_begin(Lsn(999), at(5_000_000)), Replay::Skip);
        assert_eq!(r.on_begin(Lsn(1000), at(5_100_000)), Replay::Publish);
        // Once past the range, never again in this session.
        assert_eq!(r.on_begin(Lsn(10), at(0)), Replay::Publish);
    }

    #[test]
    fn a_later_commit_inside_the_range_means_the_history_changed() {
        let mut r = SkipRange::new(known(1, 1000, 5_000_000), 1, None);
        assert_eq!(r.on_begin(Lsn(100), at(5_900_000)), Replay::Skip, "slack");
        assert_eq!(r.on_begin(Lsn(200), at(60_000_000)), Replay::HistoryChanged);
        assert_eq!(r.on_begin(Lsn(300), at(1)), Replay::Publish);
    }

    #[test]
    fn another_timeline_skips_only_below_the_fork() {
        // The record is past the fork: positions beyond it belong to other transactions.
        let mut r = SkipRange::new(known(1, 1000, i64::MAX / 2), 2, Some(Lsn(600)));
        assert_eq!(r.below(), Some(Lsn(600)));
        assert_eq!(r.on_begin(Lsn(599), at(0)), Replay::Skip);
        assert_eq!(r.on_begin(Lsn(700), at(0)), Replay::Publish);
        // A fork after the record keeps the record's bound.
        assert_eq!(
            SkipRange::new(known(1, 1000, 0), 2, Some(Lsn(5000))).below(),
            Some(Lsn(1000))
        );
        // Not an ancestor: nothing is skipped.
        let mut none = SkipRange::new(known(3, 1000, i64::MAX / 2), 2, None);
        assert_eq!(none.below(), None);
        assert_eq!(none.on_begin(Lsn(1), at(0)), Replay::Publish);
    }

    #[test]
    fn the_recorded_partial_transaction_skips_its_leading_rows_only() {
        let partial = Some(PartialTxn {
            commit_lsn: Lsn(2000),
            rows: 7,
        });
        let with = |_: u32| DeliveredPosition {
            partial,
            ..known(1, 1000, 5_000_000)
        };
        let mut r = SkipRange::new(with(1), 1, None);
        assert_eq!(r.on_begin(Lsn(900), at(1)), Replay::Skip);
        assert_eq!(
            r.on_begin(Lsn(1500), at(1)),
            Replay::Publish,
            "not that one"
        );
        assert_eq!(r.on_begin(Lsn(2000), at(1)), Replay::SkipRows(7));
        assert_eq!(r.on_begin(Lsn(2000), at(1)), Replay::Publish, "once");
        // Another timeline may have put another transaction at that position.
        let mut other = SkipRange::new(with(1), 2, Some(Lsn(5000)));
        assert_eq!(other.partial(), None);
        assert_eq!(other.on_begin(Lsn(2000), at(1)), Replay::Publish);
        // A commit after the newest delivered one is not the recorded transaction.
        let mut later = SkipRange::new(with(1), 1, None);
        assert_eq!(
            later.on_begin(Lsn(2000), at(60_000_000)),
            Replay::HistoryChanged
        );
        // Without a whole-transaction range, the partial one alone.
        let only = DeliveredPosition {
            lsn: Lsn::ZERO,
            ..with(1)
        };
        let mut r = SkipRange::new(only, 1, None);
        assert_eq!(r.below(), None);
        assert_eq!(r.on_begin(Lsn(2000), at(1)), Replay::SkipRows(7));
    }

    #[test]
    fn the_ledger_counts_only_the_leading_done_rows() {
        let mut l = RowLedger::default();
        l.begin(Lsn(100));
        let rows: Vec<RowId> = (0..5).map(|_| l.next_row().unwrap()).collect();
        assert_eq!(l.partial(Lsn(0)), None);
        l.done(rows[1]);
        l.done(rows[2]);
        assert_eq!(l.partial(Lsn(0)), None, "row 0 is not acked yet");
        l.done(rows[0]);
        assert_eq!(
            l.partial(Lsn(0)),
            Some(PartialTxn {
                commit_lsn: Lsn(100),
                rows: 3
            })
        );
        assert_eq!(l.partial(Lsn(101)), None, "covered by the watermark");
        l.commit();
        l.done(rows[4]);
        assert_eq!(l.partial(Lsn(0)).map(|p| p.rows), Some(3));
        l.done(rows[3]);
        assert!(l.is_empty(), "a finished transaction leaves the ledger");
        assert_eq!(l.next_row(), None, "outside a transaction");
    }

    #[test]
    fn timeline_history_files_parse() {
        let text =
            "1\t0/3000158\tno recovery target specified\n\n2\t1/A0000000\tat restore point \"x\"\n";
        let h = parse_timeline_history(text).unwrap();
        assert_eq!(h, vec![(1, Lsn(0x300_0158)), (2, Lsn(0x1_A000_0000))]);
        assert_eq!(fork_point(&h, 2), Some(Lsn(0x1_A000_0000)));
        assert_eq!(fork_point(&h, 7), None);
        assert!(parse_timeline_history("x y").is_err());
    }
}
