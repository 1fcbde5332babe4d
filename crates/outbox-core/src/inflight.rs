//! Messages handed to the producer and not yet acknowledged: the per-message half of
//! [`crate::InFlightLedger`].
//!
//! The Kafka delivery opaque (the ledger's [`crate::Ticket`]) is an index into this slab,
//! so a delivery report finds its transaction, byte size and commit time without a
//! per-message allocation, and the in-flight caps are exact.

use crate::ack::TxnSeq;
use crate::delivered::RowId;

/// What the ledger keeps of one in-flight message.
#[derive(Debug, Clone, Copy)]
pub struct InFlightEntry {
    /// The transaction whose watermark waits for this message.
    pub(crate) txn: TxnSeq,
    pub bytes: usize,
    /// Commit timestamp (unix micros) of the source transaction, for commit→ack latency.
    pub commit_unix_micros: i64,
    /// Index of the record's topic in the ledger's [`TopicNames`], so a stuck event can
    /// be reported with its topic without a string per message.
    pub(crate) topic: u32,
    /// The change it was made from, for resuming inside a partly acked transaction
    /// (`None`: a non-transactional message).
    pub row: Option<RowId>,
}

/// Topic names of the session's messages, each stored once. Bounded: a topic template
/// over the aggregate id could name millions of topics, and past the bound a stuck event
/// is reported without its topic rather than memory growing.
#[derive(Debug, Default)]
pub(crate) struct TopicNames {
    names: Vec<String>,
    index: std::collections::HashMap<String, u32>,
}

impl TopicNames {
    pub fn intern(&mut self, topic: &str) -> u32 {
        if let Some(i) = self.index.get(topic) {
            return *i;
        }
        if self.names.len() >= MAX_TOPIC_NAMES {
            return u32::MAX;
        }
        let i = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(topic.to_owned());
        self.index.insert(topic.to_owned(), i);
        i
    }

    pub fn named(&self, i: u32) -> Option<&str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.names.get(i))
            .map(String::as_str)
    }

    pub fn name(&self, i: u32) -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.names.get(i))
            .map_or("(one of many topics)", String::as_str)
    }
}

const MAX_TOPIC_NAMES: usize = 1024;

/// The slab. Indexes are reused, so one is valid from `insert` until `remove`.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    slots: Vec<Option<InFlightEntry>>,
    free: Vec<usize>,
    len: usize,
    bytes: usize,
}

impl InFlight {
    pub fn insert(&mut self, entry: InFlightEntry) -> usize {
        self.len += 1;
        self.bytes += entry.bytes;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(entry);
                i
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        }
    }

    /// Removes the entry; `None` for an index that is not in flight (a duplicate or stale
    /// report), which the caller treats as a protocol error rather than guessing.
    pub fn remove(&mut self, index: usize) -> Option<InFlightEntry> {
        let entry = self.slots.get_mut(index)?.take()?;
        self.free.push(index);
        self.len -= 1;
        self.bytes -= entry.bytes;
        Some(entry)
    }

    /// The entry of an index in flight, left in place.
    pub fn get(&self, index: usize) -> Option<&InFlightEntry> {
        self.slots.get(index)?.as_ref()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Slots allocated, live or free: what the slab's memory follows.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        debug_assert_eq!(self.free.len() + self.len, self.slots.len());
        self.slots.len()
    }

    /// Commit time of the oldest in-flight message, by scanning; called on the metrics
    /// tick only, never per message.
    pub fn oldest_commit_unix_micros(&self) -> Option<i64> {
        self.oldest().map(|e| e.commit_unix_micros)
    }

    /// The in-flight message with the oldest commit, by scanning (ticks only).
    pub fn oldest(&self) -> Option<&InFlightEntry> {
        self.slots
            .iter()
            .flatten()
            .min_by_key(|e| e.commit_unix_micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: usize, t: i64) -> InFlightEntry {
        InFlightEntry {
            txn: TxnSeq::default(),
            bytes,
            commit_unix_micros: t,
            topic: 0,
            row: None,
        }
    }

    #[test]
    fn counts_and_bytes_follow_inserts_and_removes_and_indexes_are_reused() {
        let mut f = InFlight::default();
        let a = f.insert(entry(10, 5));
        let b = f.insert(entry(20, 3));
        assert_eq!((f.len(), f.bytes()), (2, 30));
        assert_eq!(f.oldest_commit_unix_micros(), Some(3));
        assert_eq!(f.remove(a).map(|e| e.bytes), Some(10));
        assert!(
            f.remove(a).is_none(),
            "a second report for one message is refused"
        );
        let c = f.insert(entry(1, 9));
        assert_eq!(c, a);
        assert_eq!((f.len(), f.bytes()), (2, 21));
        f.remove(b);
        f.remove(c);
        assert!(f.is_empty());
        assert_eq!(f.bytes(), 0);
    }
}
