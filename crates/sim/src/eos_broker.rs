//! A model of a Kafka broker's transactions for one transactional.id (the slot's): an
//! epoch that `init_transactions` bumps (fencing the older producer and aborting its open
//! transaction), one open transaction at a time, records invisible to a read_committed
//! reader until their transaction commits, the broker's own abort of a transaction open
//! past `transaction.timeout.ms` (which also ends the epoch, KIP-588), and no KIP-890: a
//! late produce request of a retried commit lands in the same producer's next
//! transaction. The coordinator's aborts may skip partitions (no leader at that moment,
//! taken for deleted: seen with Apache Kafka 4.4): there the records stay open, and the
//! next `EndTxn` of the same producer id that writes to the partition decides them with
//! its own (docs/transactional-mode.md, "A transaction Kafka left open").

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_core::{DeliveredPosition, TxnError};

use crate::model::Written;

/// Records of transaction `serial` left open in partition `p` (from offset `first`),
/// decided `by` a later marker of the producer id; `ended` is how the coordinator ended
/// their transaction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decision {
    pub serial: u64,
    pub p: usize,
    pub first: i64,
    pub ended: State,
    pub by: State,
}

/// How a transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    Commit,
    Abort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Open,
    Committed,
    Aborted,
}

#[derive(Debug, Default)]
pub(crate) struct Broker {
    pub epoch: u64,
    /// The open transaction: its serial, epoch and when it began.
    open: Option<(u64, u64, Duration)>,
    serials: u64,
    states: HashMap<u64, State>,
    /// Every write, in append order, with its transaction's serial, its partition and its
    /// offset there.
    log: Vec<(Written, u64, usize, i64)>,
    /// Each partition's next offset.
    ends: HashMap<usize, i64>,
    /// Partitions of aborted transactions the coordinator wrote no marker to: their
    /// records are still open there.
    left_open: HashSet<(u64, usize)>,
    /// How such records were decided later, by another transaction's marker.
    decided: HashMap<(u64, usize), State>,
    /// Transactions ended with records left open somewhere (markers skipped).
    pub skipped_aborts: u64,
    pub trace: bool,
    /// Each transaction's producer epoch.
    epochs: HashMap<u64, u64>,
    /// What the markers of the latest ends decided of records left open before: taken
    /// by the caller after each end.
    pub decided_now: Vec<Decision>,
    /// Progress records, with their lineage, their transaction's serial and when they
    /// were written.
    records: Vec<(DeliveredPosition, u64, u64, i64)>,
    /// A produce request of a committed transaction, still on its way, and the epoch of
    /// the producer that sent it.
    pub late: Option<(u64, Option<(Written, usize)>)>,
    /// The epoch the newest `init_transactions` began: a producer of an older epoch has
    /// been taken over by another (the broker's expiry also ends epochs, but begins none
    /// that a producer holds).
    pub last_init: u64,
}

impl Broker {
    /// A new producer registers: the epoch moves on and the open transaction is aborted
    /// (no marker to the partitions in `skipped`).
    pub fn init_transactions(&mut self, skipped: &[usize]) -> u64 {
        self.abort_open(skipped);
        self.epoch += 1;
        self.late = None;
        self.last_init = self.epoch;
        self.epoch
    }

    fn abort_open(&mut self, skipped: &[usize]) {
        if let Some((serial, _, _)) = self.open.take() {
            self.finish(serial, State::Aborted, skipped);
        }
    }

    /// Transaction `serial` ends as `state`: its markers go to its partitions but those in
    /// `skipped`, and each decides whatever of this producer id is open there (a span
    /// left open before included); in a skipped one its records stay open.
    fn finish(&mut self, serial: u64, state: State, skipped: &[usize]) {
        self.states.insert(serial, state);
        let parts: HashSet<usize> = self
            .log
            .iter()
            .filter(|(_, s, _, _)| *s == serial)
            .map(|(_, _, p, _)| *p)
            .collect();
        let marked: HashSet<usize> = parts
            .iter()
            .copied()
            .filter(|p| !skipped.contains(p))
            .collect();
        let decided: Vec<(u64, usize)> = self
            .left_open
            .iter()
            .filter(|(_, p)| marked.contains(p))
            .copied()
            .collect();
        for key in decided {
            let first = self
                .log
                .iter()
                .filter(|(_, s, q, _)| (*s, *q) == key)
                .map(|(_, _, _, o)| *o)
                .min()
                .unwrap_or(0);
            self.decided_now.push(Decision {
                serial: key.0,
                p: key.1,
                first,
                ended: self.states.get(&key.0).copied().unwrap_or(State::Aborted),
                by: state,
            });
            if self.trace {
                eprintln!("  broker: transaction {serial}'s marker decides {key:?} as {state:?}");
            }
            self.left_open.remove(&key);
            self.decided.insert(key, state);
        }
        let before = self.left_open.len();
        for p in parts.difference(&marked) {
            if self.trace {
                eprintln!("  broker: transaction {serial} ({state:?}) left open in partition {p}");
            }
            self.left_open.insert((serial, *p));
        }
        self.skipped_aborts += u64::from(self.left_open.len() > before);
    }

    fn push(&mut self, w: Written, serial: u64, p: usize) -> i64 {
        let end = self.ends.entry(p).or_insert(0);
        let offset = *end;
        *end += 1;
        self.log.push((w, serial, p, offset));
        offset
    }

    /// The transactions with records left open in partition `p`.
    pub fn left_open_in(&self, p: usize) -> Vec<u64> {
        self.left_open
            .iter()
            .filter(|(_, q)| *q == p)
            .map(|(s, _)| *s)
            .collect()
    }

    /// The transaction of the record at `offset` in partition `p`.
    pub fn serial_at(&self, p: usize, offset: i64) -> Option<u64> {
        self.log
            .iter()
            .find(|(_, _, q, o)| *q == p && *o == offset)
            .map(|(_, s, _, _)| *s)
    }

    /// The records transaction `serial` wrote to partition `p`.
    pub fn writes_of(&self, serial: u64, p: usize) -> Vec<Written> {
        self.log
            .iter()
            .filter(|(_, s, q, _)| *s == serial && *q == p)
            .map(|(w, _, _, _)| *w)
            .collect()
    }

    /// The records at offsets `from..to` of partition `p`, whatever their transactions'
    /// states, as a read_uncommitted reader reads them: `None` unless every offset holds one.
    pub fn region(&self, p: usize, from: i64, to: i64) -> Option<Vec<Written>> {
        let mut found: Vec<(i64, Written)> = self
            .log
            .iter()
            .filter(|(_, _, q, o)| *q == p && (from..to).contains(o))
            .map(|(w, _, _, o)| (*o, *w))
            .collect();
        found.sort_by_key(|(o, _)| *o);
        let whole = (from..to).eq(found.iter().map(|(o, _)| *o));
        whole.then(|| found.into_iter().map(|(_, w)| w).collect())
    }

    /// The open transaction's serial.
    pub fn open_serial(&self) -> Option<u64> {
        self.open.map(|(serial, _, _)| serial)
    }

    /// The producer epoch of transaction `serial`.
    pub fn epoch_of(&self, serial: u64) -> Option<u64> {
        self.epochs.get(&serial).copied()
    }

    /// The event ids transaction `serial` wrote to partition `p`.
    pub fn ids_of(&self, serial: u64, p: usize) -> Vec<u64> {
        self.writes_of(serial, p).iter().map(|w| w.id).collect()
    }

    /// Partition `p`'s last stable offset: where its oldest open records begin (this
    /// producer's open transaction's, or an aborted one's left open), else its end.
    pub fn last_stable_offset(&self, p: usize) -> i64 {
        self.log
            .iter()
            .filter(|(_, s, q, _)| *q == p && self.state(*s, p) == State::Open)
            .map(|(_, _, _, o)| *o)
            .min()
            .unwrap_or_else(|| self.ends.get(&p).copied().unwrap_or(0))
    }

    /// How the records of transaction `serial` in partition `p` stand now.
    fn state(&self, serial: u64, p: usize) -> State {
        if self.left_open.contains(&(serial, p)) {
            return State::Open;
        }
        self.outcome(serial, p)
    }

    /// The producer of `epoch` begins a transaction at `now` (at its first produce).
    pub fn begin(&mut self, epoch: u64, now: Duration) {
        if epoch != self.epoch || self.open.is_some() {
            return;
        }
        self.serials += 1;
        self.open = Some((self.serials, epoch, now));
        self.epochs.insert(self.serials, epoch);
        self.states.insert(self.serials, State::Open);
        if let Some((late_epoch, write)) = self.late.take() {
            if late_epoch == epoch {
                if let Some((w, p)) = write {
                    self.push(w, self.serials, p);
                }
            }
        }
    }

    /// Appends `w` to partition `p` in the open transaction of `epoch`: its offset, or
    /// `None`: fenced (or none open).
    pub fn append(&mut self, epoch: u64, p: usize, w: Written) -> Option<i64> {
        match self.open {
            Some((serial, e, _)) if e == epoch && epoch == self.epoch => {
                Some(self.push(w, serial, p))
            }
            _ => None,
        }
    }

    /// The progress record, last in the open transaction of `epoch`, written at `at`.
    pub fn append_record(&mut self, epoch: u64, claim: (DeliveredPosition, u64), at: i64) -> bool {
        match self.open {
            Some((serial, e, _)) if e == epoch && epoch == self.epoch => {
                self.records.push((claim.0, claim.1, serial, at));
                true
            }
            _ => false,
        }
    }

    /// A progress record written outside any transaction (`outboxd init`'s), at `at`: a
    /// read_committed reader sees it at once.
    pub fn write_record(&mut self, claim: DeliveredPosition, at: i64) {
        self.serials += 1;
        self.states.insert(self.serials, State::Committed);
        self.records.push((claim, 0, self.serials, at));
    }

    /// `EndTxn` of `epoch`'s open transaction (no marker to the partitions in `skipped`).
    /// Again after a commit whose answer was lost: the same answer. An older epoch is
    /// fenced.
    pub fn end_txn(&mut self, epoch: u64, how: Commit, skipped: &[usize]) -> Result<(), TxnError> {
        if epoch != self.epoch {
            return Err(TxnError::Fenced("EndTxn: PRODUCER_FENCED".into()));
        }
        // A new epoch aborts the older one's transaction: an open one is this epoch's.
        let Some((serial, _, _)) = self.open.take() else {
            return Ok(());
        };
        let state = match how {
            Commit::Commit => State::Committed,
            Commit::Abort => State::Aborted,
        };
        self.finish(serial, state, skipped);
        Ok(())
    }

    /// The coordinator aborts a transaction open `timeout` or longer (no marker to the
    /// partitions in `skipped`), and ends its producer's epoch; true if it did.
    pub fn expire(&mut self, now: Duration, timeout: Duration, skipped: &[usize]) -> bool {
        match self.open {
            Some((_, _, since)) if now.saturating_sub(since) >= timeout => {
                self.abort_open(skipped);
                self.epoch += 1;
                true
            }
            _ => false,
        }
    }

    fn committed(&self, serial: u64) -> bool {
        self.states.get(&serial) == Some(&State::Committed)
    }

    /// What a read_committed consumer reads, in append order.
    /// Records left open count as their transaction ended at the coordinator: what a
    /// consumer reads once a marker decides them as Kafka should have. A marker of a later
    /// transaction that decided them otherwise shows (a copy, or a gap).
    pub fn read_committed(&self) -> impl Iterator<Item = &Written> {
        self.log
            .iter()
            .filter(|(_, s, p, _)| self.outcome(*s, *p) == State::Committed)
            .map(|(w, _, _, _)| w)
    }

    /// How the records of transaction `serial` in partition `p` end: as a later marker
    /// decided them, else as the coordinator ended their transaction.
    fn outcome(&self, serial: u64, p: usize) -> State {
        match self.decided.get(&(serial, p)) {
            Some(s) => *s,
            None => self.states.get(&serial).copied().unwrap_or(State::Aborted),
        }
    }

    /// The ids a read_committed consumer has.
    pub fn committed_ids(&self) -> HashSet<u64> {
        self.read_committed().map(|w| w.id).collect()
    }

    /// The newest progress record a read_committed reader finds.
    pub fn last_record(&self) -> Option<(DeliveredPosition, u64)> {
        self.newest_record().map(|(c, l, _)| (c.clone(), l))
    }

    /// The newest progress record a read_committed reader finds, with its lineage and
    /// when it was written.
    pub fn newest_record(&self) -> Option<(&DeliveredPosition, u64, i64)> {
        self.records
            .iter()
            .rev()
            .find(|(_, _, s, _)| self.committed(*s))
            .map(|(c, l, _, at)| (c, *l, *at))
    }

    /// A write of the newest committed transaction, with its partition.
    pub fn last_committed_write(&self) -> Option<(Written, usize)> {
        let serial = self
            .log
            .iter()
            .rev()
            .find(|(_, s, _, _)| self.committed(*s))
            .map(|(_, s, _, _)| *s)?;
        self.log
            .iter()
            .rev()
            .find(|(_, s, _, _)| *s == serial)
            .map(|(w, _, p, _)| (*w, *p))
    }
}
