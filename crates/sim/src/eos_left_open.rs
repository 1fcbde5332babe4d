//! Transactions Kafka left open (docs/transactional-mode.md, "A transaction Kafka left
//! open"): which partitions an end skips, and what a later marker of the producer id
//! decided of records left open before.

use std::collections::HashMap;

use super::Eos;
use crate::eos_broker::{Decision, State};
use crate::model::PARTITIONS;
use crate::Violation;

/// Whose `EndTxn` a transaction end was.
#[derive(Debug, Clone, Copy)]
pub(super) struct By {
    pub i: usize,
    /// An abort the left-open check asked for.
    pub left_open: bool,
}

impl Eos {
    /// Whether transaction `serial` is one that instance `i`'s process aborted without
    /// asking to commit it, in a session since it last forgot (its start, or a takeover
    /// after standing by): the relay knows where it began.
    pub(super) fn known_aborted(&self, i: usize, serial: u64) -> bool {
        let Some(epoch) = self.broker.epoch_of(serial) else {
            return false;
        };
        self.epoch_owners.get(&epoch) == Some(&(i, self.instances[i].process))
            && epoch >= self.instances[i].known_since
            && !self.commit_asked.contains(&serial)
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
                .is_some_and(|x| Some(x) != open && !self.known_aborted(i, x))
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
        let own =
            |this: &Eos, d: &Decision| by.is_some_and(|b: By| this.known_aborted(b.i, d.serial));
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
                        i, left_open: true, ..
                    }) = by
                    {
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
}
