//! A transaction of this producer that Kafka left open in a partition: the exactly-once
//! mode's check before the first commit of a session into each partition
//! (docs/transactional-mode.md, "A transaction Kafka left open").
//!
//! Kafka can answer that a transaction was aborted without writing its abort marker into
//! a partition: the coordinator skips a partition that has no leader at that moment, taking
//! it for a deleted one (seen with Apache Kafka 4.4 when a hung broker woke up fenced by
//! its controller). The records stay open in that partition, and the next commit marker
//! of the same producer id (the next session's, with a new epoch) commits them: every
//! event of the aborted transaction read twice in `read_committed`. An abort marker of
//! the same producer id closes them instead.
//!
//! So before a session's first commit into a partition, the partition's last stable
//! offset must be where this transaction's own records there begin. Below it, an older
//! transaction is open there: this relay's, left open, or another producer's. The
//! transaction is then aborted rather than committed (which closes one of this relay's
//! own) and the session resumes from the slot.

use std::collections::{BTreeMap, BTreeSet};

/// A topic's partition.
pub type TopicPartition = (String, i32);

/// The partitions the open Kafka transaction wrote to that this session has not yet
/// checked, with the offset of the first record it wrote to each.
#[derive(Debug, Default, Clone)]
pub struct FirstWrites {
    unchecked: BTreeMap<TopicPartition, i64>,
    checked: BTreeSet<TopicPartition>,
}

/// An older transaction open where this one's records begin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenBefore {
    pub topic: String,
    pub partition: i32,
    /// The partition's last stable offset (where the oldest open transaction begins),
    /// `None` when it was not read.
    pub open_from: Option<i64>,
    /// Where this transaction's records in the partition begin.
    pub ours_from: i64,
}

impl FirstWrites {
    /// A record of the open transaction acknowledged at `offset`.
    pub fn acked(&mut self, topic: &str, partition: i32, offset: i64) {
        let key = (topic.to_owned(), partition);
        if self.checked.contains(&key) {
            return;
        }
        let first = self.unchecked.entry(key).or_insert(offset);
        *first = (*first).min(offset);
    }

    /// What to look up before the commit: each partition's last stable offset.
    pub fn to_check(&self) -> Vec<TopicPartition> {
        self.unchecked.keys().cloned().collect()
    }

    /// Judges the last stable offsets looked up for [`FirstWrites::to_check`]'s
    /// partitions (in its order). Each one at or past this transaction's first record
    /// there is checked for the rest of the session; one below it is the error, and the
    /// transaction must be aborted, not committed.
    pub fn judge(&mut self, stable: &[i64]) -> Result<(), OpenBefore> {
        let below = self
            .unchecked
            .iter()
            .enumerate()
            .find_map(|(i, (tp, ours))| {
                let open_from = stable.get(i).copied();
                (open_from.is_none_or(|s| s < *ours)).then(|| OpenBefore {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    open_from,
                    ours_from: *ours,
                })
            });
        if let Some(open) = below {
            return Err(open);
        }
        let checked = std::mem::take(&mut self.unchecked);
        self.checked.extend(checked.into_keys());
        Ok(())
    }

    /// The transaction ended without a commit: its first writes are no longer this
    /// session's (the next transaction's records begin elsewhere).
    pub fn aborted(&mut self) {
        self.unchecked.clear();
    }
}

impl std::fmt::Display for OpenBefore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (topic, partition, ours) = (&self.topic, self.partition, self.ours_from);
        match self.open_from {
            Some(open) => write!(
                f,
                "a transaction opened before this one is still open in {topic} [{partition}] \
                 (from offset {open}; this one's records there begin at {ours})"
            ),
            None => write!(
                f,
                "the last stable offset of {topic} [{partition}] was not read, so whether an \
                 older transaction is open there is not known"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_whose_stable_offset_is_where_ours_begin_is_checked_once() {
        let mut w = FirstWrites::default();
        w.acked("t", 0, 12);
        w.acked("t", 0, 10);
        w.acked("t", 1, 5);
        assert_eq!(w.to_check(), vec![("t".into(), 0), ("t".into(), 1)]);
        assert_eq!(w.judge(&[10, 5]), Ok(()));
        w.acked("t", 0, 40);
        assert!(w.to_check().is_empty(), "checked for the session");
    }

    #[test]
    fn an_older_open_transaction_is_the_error_and_stays_unchecked() {
        let mut w = FirstWrites::default();
        w.acked("t", 0, 60);
        w.acked("u", 3, 7);
        let open = w.judge(&[0, 7]).unwrap_err();
        assert_eq!(
            open,
            OpenBefore {
                topic: "t".into(),
                partition: 0,
                open_from: Some(0),
                ours_from: 60
            }
        );
        assert_eq!(w.to_check().len(), 2, "nothing taken as checked");
        w.aborted();
        assert!(w.to_check().is_empty());
    }

    #[test]
    fn offsets_not_all_read_check_nothing() {
        let mut w = FirstWrites::default();
        w.acked("t", 0, 3);
        w.acked("t", 1, 3);
        assert!(w.judge(&[3]).is_err());
        assert_eq!(w.to_check().len(), 2);
    }
}
