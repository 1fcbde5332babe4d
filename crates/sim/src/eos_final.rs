//! The exactly-once schedules' final check: what a `read_committed` consumer sees once
//! the system is quiet.

use std::collections::{HashMap, HashSet};

use super::Eos;
use crate::Violation;

impl Eos {
    /// The read_committed view: every event of the history exactly once (copies of rows
    /// a lost slot's procedure re-inserted aside, one for each re-insert, copies a commit
    /// in doubt over a transaction Kafka left open made visible, and event
    /// messages lost with a slot as the operator was told), and per aggregate in commit
    /// order, as a consumer dropping copies by event id sees them.
    pub(super) fn check_final(&mut self) -> Result<(), Violation> {
        let mut count: HashMap<u64, u64> = HashMap::new();
        for w in self.broker.read_committed() {
            *count.entry(w.id).or_default() += 1;
        }
        let mut order: HashMap<u64, usize> = HashMap::new();
        for t in &self.cluster.history {
            for &ch in &t.changes {
                let Some(id) = self.event_id(ch) else {
                    continue;
                };
                if order.contains_key(&id) {
                    // A re-inserted copy: the event is counted once.
                    continue;
                }
                let next = order.len();
                order.insert(id, next);
                let n = count.get(&id).copied().unwrap_or(0);
                let reinserted = self.reinserted.get(&id).copied().unwrap_or(0)
                    + self.resurrected.get(&id).copied().unwrap_or(0);
                let doubted = self.stats.doubts > 0 || self.stats.records_unread > 0;
                if self.lost_messages.contains(&id) && n <= 1 {
                    continue;
                }
                if n == 0 && self.buried.contains(&id) {
                    continue;
                }
                if n > 1 && n <= 1 + reinserted {
                    self.stats.duplicates += n - 1;
                } else if n > 1 && doubted {
                    self.stats.duplicates += 1;
                } else if n != 1 {
                    return Err(Violation(format!(
                        "exactly-once: event {id} (transaction {:?}) is {n} times in the read_committed view",
                        t.commit_lsn
                    )));
                }
            }
        }
        let mut seen = HashSet::new();
        let mut last: HashMap<u32, (usize, u64)> = HashMap::new();
        // Kafka's burials aside: a copy published again after the loss comes late.
        for w in self
            .broker
            .read_committed()
            .filter(|w| !w.dead && !self.buried.contains(&w.id))
        {
            let Some(&at) = order.get(&w.id) else {
                continue;
            };
            if !seen.insert(w.id) {
                continue;
            }
            if let Some(&(before, prev)) = last.get(&w.agg) {
                if at < before {
                    return Err(Violation(format!(
                        "exactly-once: aggregate {}: event {} after event {prev}, committed after it",
                        w.agg, w.id
                    )));
                }
            }
            last.insert(w.agg, (at, w.id));
        }
        Ok(())
    }
}
