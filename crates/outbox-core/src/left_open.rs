//! A transaction of this producer that Kafka left open in a partition: the exactly-once
//! mode's check before the first commit of a session into each partition
//! (docs/transactional-mode.md, "A transaction Kafka left open").
//!
//! Kafka can end a transaction without writing its marker into a partition: the
//! coordinator skips a partition that has no leader at that moment, taking it for a
//! deleted one (seen with Apache Kafka 4.4 when a hung broker woke up fenced by its
//! controller). The records stay open there, and the next marker of the same producer id
//! (the next session's, with a new epoch) decides them with its own: a commit makes an
//! aborted transaction's records visible (every event twice in `read_committed`), an
//! abort hides a committed one's (a loss, when its progress record or the slot moved on).
//!
//! So before a session's first commit into a partition, the last stable offsets of the
//! transaction's partitions are read. Where this transaction's own records begin: nothing
//! older is open. Below: an older transaction is open, and it is closed by aborting this
//! one only when nothing else is open in any of its partitions and what is open is proven
//! to go nowhere it must: a transaction this process aborted without ever asking Kafka to
//! commit it, or records that are byte for byte this transaction's first ones there (a
//! transaction that began where this one began, in the same stream, and whose records were
//! still in flight when it was aborted: the abort hides the copies, and the next session
//! publishes them again). Anything else open may be a commit of this relay's whose markers
//! were skipped, or another producer's transaction: in doubt, commit (a duplicate is a
//! cost, a wrong abort a loss).

use std::collections::{BTreeMap, BTreeSet};

/// A topic's partition.
pub type TopicPartition = (String, i32);

/// Per partition, where the oldest and the newest transaction this process aborted without
/// asking to commit it (since its last commit there) began: records Kafka may have left
/// open, proven never committed. A last stable offset between the two means they are still
/// open; below the oldest, what is open there begins with records of unknown outcome.
pub type AbortedSpans = BTreeMap<TopicPartition, (i64, i64)>;

/// Per partition, the contents (a hash of key, value and headers) of the records read
/// from a region left open, in offset order: what [`FirstWrites::regions_to_read`] asked
/// for, where it was read whole.
pub type Regions = BTreeMap<TopicPartition, Vec<u64>>;

/// The most records' contents a transaction keeps to compare with regions left open, in
/// all its partitions (8 bytes each): a longer region stays a doubt.
pub const COPIES_KEPT: usize = 100_000;

/// One session's view of its Kafka transactions' first records per partition.
#[derive(Debug, Default, Clone)]
pub struct FirstWrites {
    /// The open transaction's first acknowledged offset in each partition it wrote to.
    txn: BTreeMap<TopicPartition, i64>,
    /// Partitions checked in this session: nothing of this producer id is open there
    /// below this session's records.
    checked: BTreeSet<TopicPartition>,
    /// Proven aborted spans: the process's, then this session's.
    aborted: AbortedSpans,
    /// A commit of the open transaction was asked for: its outcome is not known.
    commit_asked: bool,
    /// The open transaction's records' contents, in offset order, in the partitions not
    /// yet checked in this session (up to [`COPIES_KEPT`] in all).
    copies: BTreeMap<TopicPartition, Vec<u64>>,
    copies_kept: usize,
    /// Whether a copy proves anything in this session: only when its replay skipped what
    /// the newest record claims, as read, and doubted nothing (see
    /// [`FirstWrites::allow_copies`]).
    copies_allowed: bool,
    /// The open transaction wrote where its first record is not known (an ack without an
    /// offset, or a partition not tracked): an abort would decide that partition unseen.
    unplaced: bool,
}

/// Why a transaction must be aborted rather than committed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeftOpen {
    /// A transaction this process aborted is still open below this one's records.
    #[error("{} [{}]: a transaction this process aborted is open from offset {open_from}, below ours at {ours_from}", .at.0, .at.1)]
    Aborted {
        at: TopicPartition,
        open_from: i64,
        ours_from: i64,
    },
    /// What is open below this one's records is a copy of its first records there.
    #[error("{} [{}]: the records open from offset {open_from} to ours at {ours_from} are copies of ours", .at.0, .at.1)]
    Copies {
        at: TopicPartition,
        open_from: i64,
        ours_from: i64,
    },
    /// The last stable offset is past this transaction's first record there: another
    /// client decided (aborted) its records, and a commit would claim them.
    #[error("{} [{}]: another client decided our records (last stable offset {stable} past our first, {ours_from})", .at.0, .at.1)]
    Decided {
        at: TopicPartition,
        stable: i64,
        ours_from: i64,
    },
    /// The last stable offset was not read where a transaction this process aborted
    /// may still be open.
    #[error("the last stable offset of {} [{}] was not read, where a transaction this process aborted may still be open", .at.0, .at.1)]
    Unread { at: TopicPartition },
}

/// An older transaction open below this one's records, not one proven aborted: it is
/// committed with them if it is this producer id's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenBelow {
    pub at: TopicPartition,
    /// The last stable offset, `None` when not read.
    pub open_from: Option<i64>,
    pub ours_from: i64,
}

impl FirstWrites {
    /// A session's, with what its process proved aborted before.
    pub fn new(aborted: AbortedSpans) -> Self {
        FirstWrites {
            aborted,
            ..FirstWrites::default()
        }
    }

    /// Whether the session's copies prove records left open aborted over. A session
    /// publishes copies of another transaction's records when it does not skip them; the
    /// next session publishes them again only if it skips no more than this one. That
    /// holds when this one's replay rested on the newest record, read and trusted whole
    /// (not unread, not doubted after a spill, no other writer of the key): the next reads
    /// the same record, or a newer one a commit wrote. A session that published anything
    /// in doubt, or that found another writer, sets it back to false.
    pub fn allow_copies(&mut self, allowed: bool) {
        self.copies_allowed = allowed;
    }

    /// Whether copies may decide an abort at all: allowed, and every record of the
    /// transaction placed.
    fn copies_count(&self) -> bool {
        self.copies_allowed && !self.unplaced
    }

    /// The open transaction wrote to a partition it does not track (past the bound on
    /// topic names): it commits, in doubt where anything is open, and never aborts over
    /// what is open elsewhere (the abort would decide that partition too, unseen).
    pub fn unplaced(&mut self) {
        self.unplaced = true;
    }

    /// A record of the open transaction acknowledged at `offset`. A negative one, as
    /// librdkafka reports a retried produce the broker had already, hides where the
    /// transaction's records begin there: [`FirstWrites::unplaced`].
    pub fn acked(&mut self, topic: &str, partition: i32, offset: i64) {
        if offset < 0 {
            self.unplaced = true;
            return;
        }
        let first = self
            .txn
            .entry((topic.to_owned(), partition))
            .or_insert(offset);
        *first = (*first).min(offset);
    }

    /// The content (key, value and headers hashed) of the open transaction's record
    /// acknowledged next in a partition, in the order of the acks (a partition's are in
    /// offset order). Kept only where the session has not checked the partition yet.
    pub fn content(&mut self, topic: &str, partition: i32, hash: u64) {
        if self.copies_kept >= COPIES_KEPT {
            return;
        }
        let at = (topic.to_owned(), partition);
        if self.checked.contains(&at) {
            return;
        }
        self.copies.entry(at).or_default().push(hash);
        self.copies_kept += 1;
    }

    /// The regions left open to read (read_uncommitted) before [`FirstWrites::judge_with`],
    /// as (partition, from, to): where an older transaction is open below this one's
    /// records, not one proven aborted, and this transaction kept at least as many records'
    /// contents there as the region holds offsets.
    pub fn regions_to_read(&self, stable: &[Option<i64>]) -> Vec<(TopicPartition, i64, i64)> {
        if !self.copies_count() {
            return Vec::new();
        }
        self.to_check()
            .into_iter()
            .zip(stable)
            .filter_map(|(at, s)| {
                let open_from = (*s)?;
                let ours_from = *self.txn.get(&at)?;
                let proven = self
                    .aborted
                    .get(&at)
                    .is_some_and(|&(lo, hi)| lo <= open_from && open_from <= hi);
                let len = usize::try_from(ours_from.checked_sub(open_from)?).ok()?;
                let kept = self.copies.get(&at).map_or(0, Vec::len);
                (len > 0 && !proven && len <= kept).then_some((at, open_from, ours_from))
            })
            .collect()
    }

    /// Whether the region `open_from..ours_from` of `at`, as read, is this transaction's
    /// first records there, one for one. Copies of another producer id (another
    /// transactional.id relaying the same rows) stay open after this abort; the next
    /// session's region holds them, this transaction's aborted records and its abort
    /// marker (an offset no record is read at), so it is read short: one abort more, no
    /// loop.
    fn copies_of_ours(
        &self,
        at: &TopicPartition,
        open_from: i64,
        ours_from: i64,
        regions: &Regions,
    ) -> bool {
        let (Some(read), Some(ours)) = (regions.get(at), self.copies.get(at)) else {
            return false;
        };
        if !self.copies_count() {
            return false;
        }
        usize::try_from(ours_from.saturating_sub(open_from)).is_ok_and(|len| {
            len > 0 && read.len() == len && ours.get(..len) == Some(read.as_slice())
        })
    }

    /// The partitions whose last stable offset to read before the commit: none once
    /// every partition the transaction wrote to was checked in this session, else all of
    /// them (an abort would decide the checked ones too, where an earlier commit of this
    /// session may have had its markers skipped).
    pub fn to_check(&self) -> Vec<TopicPartition> {
        if self.txn.keys().all(|tp| self.checked.contains(tp)) {
            return Vec::new();
        }
        self.txn.keys().cloned().collect()
    }

    /// Judges the last stable offsets read for [`FirstWrites::to_check`]'s partitions, in
    /// its order (`None`: not read). `Err`: abort the transaction instead of committing
    /// it. `Ok`: commit; the doubts are older transactions open below this one's records
    /// that its commit may make visible.
    ///
    /// An abort decides every partition the transaction wrote to: where what is open is
    /// of unknown outcome (a commit whose markers were skipped too, or another producer's
    /// transaction), or was not read, it could hide committed records. Then the
    /// transaction is committed in doubt, proven spans included (copies, not a loss).
    pub fn judge(&mut self, stable: &[Option<i64>]) -> Result<Vec<OpenBelow>, LeftOpen> {
        self.judge_with(stable, &Regions::new())
    }

    /// [`FirstWrites::judge`], with the regions read that
    /// [`FirstWrites::regions_to_read`] asked for: one that is a copy of this
    /// transaction's first records there is closed by an abort like a proven span.
    pub fn judge_with(
        &mut self,
        stable: &[Option<i64>],
        regions: &Regions,
    ) -> Result<Vec<OpenBelow>, LeftOpen> {
        let mut doubts = Vec::new();
        let mut proven = Vec::new();
        let mut clean = Vec::new();
        let parts = self.to_check();
        for (i, at) in parts.iter().enumerate() {
            let Some(&ours_from) = self.txn.get(at) else {
                continue;
            };
            let aborted = self.aborted.get(at).copied();
            let at = at.clone();
            match stable.get(i).copied().flatten() {
                Some(s) if s == ours_from => clean.push(at),
                Some(stable) if stable > ours_from => {
                    return Err(LeftOpen::Decided {
                        at,
                        stable,
                        ours_from,
                    })
                }
                // Open from one of the proven transactions: they are still open (this
                // producer id's open records are one span from its oldest). Below the
                // oldest, the span begins with records of unknown outcome.
                Some(open_from)
                    if aborted.is_some_and(|(lo, hi)| lo <= open_from && open_from <= hi) =>
                {
                    proven.push(LeftOpen::Aborted {
                        at,
                        open_from,
                        ours_from,
                    })
                }
                Some(open_from) if self.copies_of_ours(&at, open_from, ours_from, regions) => {
                    proven.push(LeftOpen::Copies {
                        at,
                        open_from,
                        ours_from,
                    })
                }
                None if aborted.is_some() => proven.push(LeftOpen::Unread { at }),
                open_from => doubts.push(OpenBelow {
                    at,
                    open_from,
                    ours_from,
                }),
            }
        }
        if doubts.is_empty() && !self.unplaced {
            if let Some(why) = proven.into_iter().next() {
                return Err(why);
            }
        } else {
            for why in proven {
                let (at, open_from) = match why {
                    LeftOpen::Aborted { at, open_from, .. }
                    | LeftOpen::Copies { at, open_from, .. } => (at, Some(open_from)),
                    LeftOpen::Unread { at } | LeftOpen::Decided { at, .. } => (at, None),
                };
                let ours_from = self.txn.get(&at).copied().unwrap_or_default();
                doubts.push(OpenBelow {
                    at,
                    open_from,
                    ours_from,
                });
            }
        }
        // Committed over: whatever of this producer id is open there is decided with this
        // transaction, and nothing is open below its records from now on.
        for at in clean.iter().chain(doubts.iter().map(|d| &d.at)) {
            self.aborted.remove(at);
        }
        for at in &parts {
            if let Some(gone) = self.copies.remove(at) {
                self.copies_kept -= gone.len();
            }
        }
        self.checked.extend(parts);
        Ok(doubts)
    }

    /// The transaction's commit is being asked for: from now on its outcome is unknown
    /// until answered.
    pub fn commit_asked(&mut self) {
        self.commit_asked = true;
    }

    /// The transaction committed: its markers decided whatever of this producer id was
    /// open in its partitions.
    pub fn committed(&mut self) {
        self.forget_copies();
        for at in std::mem::take(&mut self.txn).into_keys() {
            self.aborted.remove(&at);
        }
        self.commit_asked = false;
    }

    /// The transaction ends without a commit. Never asked to commit: proven aborted, so
    /// its records are a span to close wherever Kafka left them open. Asked: its outcome
    /// is unknown, and a span merged with it is no longer proven.
    pub fn aborted(&mut self) {
        self.forget_copies();
        for (at, first) in std::mem::take(&mut self.txn) {
            if self.commit_asked {
                self.aborted.remove(&at);
            } else {
                let span = self.aborted.entry(at).or_insert((first, first));
                span.0 = span.0.min(first);
                span.1 = span.1.max(first);
            }
        }
        self.commit_asked = false;
    }

    /// The transaction ended: its records' contents compare with nothing any more, and
    /// where it wrote is no concern of the next.
    fn forget_copies(&mut self) {
        self.copies.clear();
        self.copies_kept = 0;
        self.unplaced = false;
    }

    /// What the process carries into its next session.
    pub fn spans(&self) -> &AbortedSpans {
        &self.aborted
    }
}

#[cfg(test)]
#[path = "left_open_tests.rs"]
mod tests;
