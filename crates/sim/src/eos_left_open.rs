//! Transactions Kafka left open (docs/transactional-mode.md, "A transaction Kafka left
//! open"): which partitions an end skips, and what a later marker of the producer id
//! decided of records left open before.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use outbox_core::{Regions, TxnError};

use super::{partition, Eos, Failure, Session, TOPIC};
use crate::eos_broker::{Decision, State};
use crate::model::{Written, PARTITIONS};
use crate::Violation;

/// Whose `EndTxn` a transaction end was.
#[derive(Debug, Clone, Copy)]
pub(super) struct By {
    pub i: usize,
    /// An abort the left-open check asked for.
    pub left_open: bool,
    /// The transaction the abort ended (its own records, which the next session
    /// publishes again).
    pub serial: Option<u64>,
}

impl Eos {
    /// Whether transaction `serial` is one that instance `i`'s process aborted without
    /// asking to commit it, in a session since it last forgot (its start, or a takeover
    /// after standing by): the relay knows where it began.
    /// In partition `p`: not where its records there were all in flight when a broker hung
    /// (no ack, so no start known; only a copy's proof can close them).
    pub(super) fn known_aborted(&self, i: usize, serial: u64, p: usize) -> bool {
        let Some(epoch) = self.broker.epoch_of(serial) else {
            return false;
        };
        self.epoch_owners.get(&epoch) == Some(&(i, self.instances[i].process))
            && epoch >= self.instances[i].known_since
            && !self.commit_asked.contains(&serial)
            && !self.hung.contains(&(serial, p))
    }

    /// Before instance `i`'s check: where some partition in `parts` has, from its last
    /// stable offset, records whose outcome the relay cannot know, committing in doubt is
    /// the rule (an abort could hide committed records), and whatever is open in those
    /// partitions is waived: a copy, now or when a later marker decides it.
    pub(super) fn waive_if_unknown(&mut self, i: usize, parts: &[usize]) {
        let open = self.broker.open_serial();
        let unknown = parts.iter().any(|&p| {
            let lso = self.broker.last_stable_offset(p);
            self.broker
                .serial_at(p, lso)
                .is_some_and(|x| Some(x) != open && !self.known_aborted(i, x, p))
        });
        if unknown {
            for &p in parts {
                for serial in self.broker.left_open_in(p) {
                    self.waived.insert((serial, p));
                }
            }
        }
    }

    /// The partitions a transaction's end writes no marker to: now and then some,
    /// leaderless at that moment (a stream of its own).
    pub(super) fn skipped_markers(&mut self) -> Vec<usize> {
        // A broker that hung is fenced by its controller when it wakes: often no leader
        // for its partitions at the next end (the hung-broker test's case).
        if let Some(p) = self.fenced.take() {
            if self.hangs.chance(700) {
                return vec![p];
            }
        }
        if !self.markers.chance(150) {
            return Vec::new();
        }
        (0..PARTITIONS)
            .filter(|_| self.markers.chance(600))
            .collect()
    }

    /// Judges what the markers of the latest end decided of records left open before.
    /// `by`: whose `EndTxn` it was; `None`: the coordinator's own abort.
    ///
    /// - Records of an aborted transaction made visible by a commit: a copy, unless the
    ///   committing process had aborted that transaction itself without asking to commit
    ///   it (it knows that span), nothing of unknown outcome began the span below it, and
    ///   no partition of the check's gave it cause to commit in doubt
    ///   (`Eos::waive_if_unknown`).
    /// - Records of a committed transaction hidden by an abort: lost, which the relay
    ///   cannot tell from aborted ones, except when the left-open check's own abort did it.
    pub(super) fn judge_decided(&mut self, by: Option<By>) -> Result<(), Violation> {
        let decided = std::mem::take(&mut self.broker.decided_now);
        let own = |this: &Eos, d: &Decision| {
            by.is_some_and(|b: By| this.known_aborted(b.i, d.serial, d.p))
        };
        let mut oldest_unknown: HashMap<usize, i64> = HashMap::new();
        for d in &decided {
            if !own(self, d) {
                let o = oldest_unknown.entry(d.p).or_insert(d.first);
                *o = (*o).min(d.first);
            }
        }
        for d in &decided {
            match (d.ended, d.by) {
                (State::Aborted, State::Committed) => {
                    let below = oldest_unknown.get(&d.p).is_some_and(|o| *o < d.first);
                    if own(self, d) && !below && !self.waived.contains(&(d.serial, d.p)) {
                        let i = by.map_or(0, |b| b.i);
                        return Err(Violation(format!(
                            "exactly-once: instance {i} committed over its own process's aborted transaction {}, left open in partition {}",
                            d.serial, d.p
                        )));
                    }
                    for id in self.broker.ids_of(d.serial, d.p) {
                        *self.resurrected.entry(id).or_default() += 1;
                    }
                }
                (State::Committed, State::Aborted) => {
                    if let Some(By {
                        i,
                        left_open: true,
                        serial,
                    }) = by
                    {
                        // Hidden with a copy of each record in the aborted transaction
                        // itself: published again by the next session (the final check
                        // demands them), not lost.
                        let copies =
                            serial.map_or_else(Vec::new, |x| self.broker.writes_of(x, d.p));
                        let hidden = self.broker.writes_of(d.serial, d.p);
                        if hidden.iter().all(|w| copies.contains(w)) {
                            continue;
                        }
                        return Err(Violation(format!(
                            "exactly-once: instance {i}'s left-open check aborted over committed transaction {}, left open in partition {}",
                            d.serial, d.p
                        )));
                    }
                    self.stats.buried += 1;
                    self.buried.extend(self.broker.ids_of(d.serial, d.p));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The relay's ack of `w` at `offset` in partition `p` of the open transaction: where
    /// its records begin there, and what they are.
    pub(super) fn first_write(&mut self, s: &mut Session, p: usize, offset: i64, w: &Written) {
        if let Some(serial) = self.broker.open_serial() {
            self.acked_in.insert((serial, p));
        }
        let writes = s.txn.first_writes();
        writes.acked(TOPIC, partition(p), offset);
        writes.content(TOPIC, partition(p), content(w));
    }

    /// The broker hangs with partition `p`'s queued records in flight: it writes them, no
    /// ack comes, and the session gives up on its transaction (the acks' deadline).
    pub(super) fn hang(&mut self, s: &mut Session, p: usize) -> Result<(), Failure> {
        self.stats.hangs += 1;
        let serial = self.broker.open_serial();
        while let Some((_, w)) = s.life.queues[p].pop_front() {
            if self.broker.append(s.epoch, p, w).is_none() {
                break;
            }
            if let Some(serial) = serial.filter(|x| !self.acked_in.contains(&(*x, p))) {
                self.hung.insert((serial, p));
            }
        }
        self.fenced = Some(p);
        Err(Failure::Txn(TxnError::Abortable(
            "the transaction's messages were not all acknowledged: the broker hung".into(),
        )))
    }

    /// The regions the check asks to read, read from the broker's log (read_uncommitted):
    /// each record's content, in offset order.
    pub(super) fn read_regions(&mut self, s: &mut Session, stable: &[Option<i64>]) -> Regions {
        let mut read = Regions::new();
        for ((topic, q), from, to) in s.txn.first_writes().regions_to_read(stable) {
            self.stats.regions_read += 1;
            let p = usize::try_from(q).unwrap_or(usize::MAX);
            if let Some(records) = self.broker.region(p, from, to) {
                read.insert((topic, q), records.iter().map(content).collect());
            }
        }
        read
    }
}

/// A record's content as the relay compares it (its key, value and headers).
fn content(w: &Written) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    w.hash(&mut h);
    h.finish()
}
