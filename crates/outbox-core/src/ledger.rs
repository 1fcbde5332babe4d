//! One ledger per in-flight message: from "row produced" to "acked" to the watermark.
//!
//! A produced message is registered once ([`InFlightLedger::produced`]), which counts it
//! against its open transaction ([`AckTracker`]) and stores what its delivery report needs
//! in a slab ([`crate::inflight`]). The slab index is the [`Ticket`], the one delivery
//! opaque handed to the producer and back. Its report settles it once
//! ([`InFlightLedger::delivered`]), and the flush position comes out of
//! [`InFlightLedger::watermark`] under [`AckTracker`]'s rules. The in-flight caps
//! ([`InFlightCaps::has_room`]) apply to the slab's exact counts.

use pgoutput::Lsn;

use crate::ack::AckTracker;
use crate::budget::InFlightCaps;
use crate::delivered::RowId;
use crate::error::AckError;
use crate::inflight::{InFlight, InFlightEntry, TopicNames};

/// The delivery opaque of one in-flight message: an index into the ledger's slab, valid
/// from [`InFlightLedger::produced`] until its report is settled (then reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(usize);

impl Ticket {
    /// The number handed to the producer as the delivery opaque.
    pub fn index(self) -> usize {
        self.0
    }

    /// The ticket of a delivery report's opaque. One that is not in flight is refused by
    /// [`InFlightLedger::delivered`], so this cannot corrupt the ledger.
    pub fn from_index(index: usize) -> Self {
        Ticket(index)
    }
}

/// What a delivery report says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acked,
    /// Not written (or not known to be). Freezes the watermark for good.
    Failed,
}

/// A message about to be handed to the producer.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// Counted against the byte cap (an estimate of the record's size).
    pub bytes: usize,
    /// Commit time of the source transaction (unix micros), for commit→ack latency and the
    /// age of the oldest unacked message.
    pub commit_unix_micros: i64,
    /// The change it was made from (`None`: a non-transactional message).
    pub row: Option<RowId>,
}

/// The in-flight bookkeeping of one replication session. See the module docs.
#[derive(Debug)]
pub struct InFlightLedger {
    acks: AckTracker,
    slab: InFlight,
    topics: TopicNames,
    caps: InFlightCaps,
}

impl InFlightLedger {
    /// `start` is where the watermark begins (see [`AckTracker::new`]).
    pub fn new(start: Lsn, caps: InFlightCaps) -> Self {
        InFlightLedger {
            acks: AckTracker::new(start),
            slab: InFlight::default(),
            topics: TopicNames::default(),
            caps,
        }
    }

    /// A Begin was read (or a non-transactional message gets a transaction of its own).
    pub fn begin(&mut self) -> Result<(), AckError> {
        self.acks.begin()
    }

    /// The Commit of the open transaction was read.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), AckError> {
        self.acks.commit(end_lsn)
    }

    /// A primary keepalive; see [`AckTracker::on_keepalive`]. Returns whether W moved.
    pub fn on_keepalive(&mut self, wal_end: Lsn) -> bool {
        self.acks.on_keepalive(wal_end)
    }

    /// A message of the open transaction is about to be handed to the producer: pass the
    /// ticket as its delivery opaque, and back to [`InFlightLedger::delivered`] with its
    /// report (or to [`InFlightLedger::refused`] if the producer does not take it).
    pub fn produced(&mut self, message: Outgoing<'_>) -> Result<Ticket, AckError> {
        let txn = self.acks.track_message()?;
        let topic = self.topics.intern(message.topic);
        let index = self.slab.insert(InFlightEntry {
            txn,
            bytes: message.bytes,
            commit_unix_micros: message.commit_unix_micros,
            topic,
            row: message.row,
        });
        Ok(Ticket(index))
    }

    /// The producer refused the message before taking it, so no report will come: it
    /// stops holding its transaction back. The caller must produce whatever replaces it
    /// (a dead-letter record) before the transaction's Commit, or stop.
    pub fn refused(&mut self, ticket: Ticket) -> Result<InFlightEntry, AckError> {
        let entry = self.take(ticket)?;
        self.acks.untrack(entry.txn)?;
        Ok(entry)
    }

    /// The delivery report of a message; in any order, and before its Commit too. Returns
    /// what [`InFlightLedger::produced`] was told of it. A ticket not in flight (a
    /// duplicate or stale report) is an error, never a guess.
    pub fn delivered(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
    ) -> Result<InFlightEntry, AckError> {
        let entry = self.take(ticket)?;
        match outcome {
            Outcome::Acked => self.acks.ack(entry.txn)?,
            Outcome::Failed => self.acks.fail(entry.txn)?,
        }
        Ok(entry)
    }

    /// The position safe to report as flushed. Never decreases.
    pub fn watermark(&self) -> Lsn {
        self.acks.watermark()
    }

    /// Whether another message may be read (and so produced): the caps, always letting one
    /// through when nothing is in flight.
    pub fn has_room(&self) -> bool {
        self.caps.has_room(self.slab.len(), self.slab.bytes())
    }

    /// Whether a Begin was read without its Commit yet.
    pub fn in_transaction(&self) -> bool {
        self.acks.in_transaction()
    }

    /// See [`AckTracker::acked_up_to_open`].
    pub fn acked_up_to_open(&self) -> bool {
        self.acks.acked_up_to_open()
    }

    /// A delivery failed; the watermark will not move again in this ledger.
    pub fn is_failed(&self) -> bool {
        self.acks.is_failed()
    }

    /// Messages produced without a delivery report yet.
    pub fn len(&self) -> usize {
        self.slab.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Bytes of the messages in flight, as counted against the byte cap.
    pub fn bytes(&self) -> usize {
        self.slab.bytes()
    }

    /// The in-flight message with the oldest commit, by scanning: for the metrics tick,
    /// never per message.
    pub fn oldest(&self) -> Option<&InFlightEntry> {
        self.slab.oldest()
    }

    /// Commit time of the oldest in-flight message (scanning, ticks only).
    pub fn oldest_commit_unix_micros(&self) -> Option<i64> {
        self.slab.oldest_commit_unix_micros()
    }

    /// The topic of the in-flight message `ticket` (before its report is taken), for an
    /// error that names it.
    pub fn topic_of(&self, ticket: Ticket) -> Option<&str> {
        self.slab.get(ticket.0).map(|e| self.topics.name(e.topic))
    }

    /// [`Self::topic_of`], but `None` past the bound on the names kept (the placeholder
    /// names no topic).
    pub fn named_topic_of(&self, ticket: Ticket) -> Option<&str> {
        self.slab
            .get(ticket.0)
            .and_then(|e| self.topics.named(e.topic))
    }

    /// The topic of an in-flight message, or a placeholder past the bound on the names
    /// kept (a template over the aggregate id could name millions).
    pub fn topic_name(&self, entry: &InFlightEntry) -> &str {
        self.topics.name(entry.topic)
    }

    /// The per-transaction half, for the tests' inspection.
    #[cfg(test)]
    pub(crate) fn acks(&self) -> &AckTracker {
        &self.acks
    }

    fn take(&mut self, ticket: Ticket) -> Result<InFlightEntry, AckError> {
        self.slab
            .remove(ticket.0)
            .ok_or(AckError::UnknownDelivery { ticket: ticket.0 })
    }
}

#[cfg(test)]
mod edge_tests;
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CAPS: InFlightCaps = InFlightCaps {
        max_messages: 4,
        max_bytes: 1000,
    };

    fn msg(bytes: usize) -> Outgoing<'static> {
        Outgoing {
            topic: "orders",
            bytes,
            commit_unix_micros: 0,
            row: None,
        }
    }

    /// Three transactions of 2, 1 and 1 messages; returns their tickets.
    fn three_transactions(l: &mut InFlightLedger) -> [Ticket; 4] {
        l.begin().unwrap();
        let a1 = l.produced(msg(10)).unwrap();
        let a2 = l.produced(msg(10)).unwrap();
        l.commit(Lsn(200)).unwrap();
        l.begin().unwrap();
        let b1 = l.produced(msg(10)).unwrap();
        l.commit(Lsn(300)).unwrap();
        l.begin().unwrap();
        let c1 = l.produced(msg(10)).unwrap();
        l.commit(Lsn(400)).unwrap();
        [a1, a2, b1, c1]
    }

    #[test]
    fn out_of_order_acks_move_the_watermark_to_the_newest_fully_acked_prefix() {
        let mut l = InFlightLedger::new(Lsn(100), CAPS);
        let [a1, a2, b1, c1] = three_transactions(&mut l);
        assert_eq!((l.len(), l.bytes()), (4, 40));
        // The last and the second transaction first: nothing before them is done.
        assert_eq!(l.delivered(c1, Outcome::Acked).unwrap().bytes, 10);
        l.delivered(b1, Outcome::Acked).unwrap();
        assert_eq!(l.watermark(), Lsn(100));
        l.delivered(a2, Outcome::Acked).unwrap();
        assert_eq!(
            l.watermark(),
            Lsn(100),
            "a1 still holds the first transaction"
        );
        // The first one completes: W jumps to the end of the third (end_lsn, not +1).
        l.delivered(a1, Outcome::Acked).unwrap();
        assert_eq!(l.watermark(), Lsn(400));
        assert!(l.is_empty());
        assert!(l.acks().is_idle());
        // A second report for a settled ticket is refused, and changes nothing.
        assert_eq!(
            l.delivered(a1, Outcome::Acked).unwrap_err(),
            AckError::UnknownDelivery { ticket: a1.index() }
        );
        assert_eq!(l.watermark(), Lsn(400));
        // Idle: a keepalive may move it on.
        assert!(l.on_keepalive(Lsn(450)));
        assert_eq!(l.watermark(), Lsn(450));
    }

    #[test]
    fn a_failed_delivery_freezes_the_watermark() {
        let mut l = InFlightLedger::new(Lsn(100), CAPS);
        let [a1, a2, b1, c1] = three_transactions(&mut l);
        l.delivered(a1, Outcome::Acked).unwrap();
        l.delivered(a2, Outcome::Acked).unwrap();
        assert_eq!(l.watermark(), Lsn(200));
        l.delivered(b1, Outcome::Failed).unwrap();
        assert!(l.is_failed());
        // Later reports still drain the slab, but W stays.
        l.delivered(c1, Outcome::Acked).unwrap();
        assert!(l.is_empty());
        assert_eq!(l.watermark(), Lsn(200));
        l.begin().unwrap();
        l.commit(Lsn(500)).unwrap();
        assert!(!l.on_keepalive(Lsn(600)));
        assert_eq!(l.watermark(), Lsn(200));
    }

    #[test]
    fn a_refused_message_stops_holding_its_transaction_back() {
        let mut l = InFlightLedger::new(Lsn(100), CAPS);
        l.begin().unwrap();
        let too_big = l.produced(msg(900)).unwrap();
        assert_eq!(l.refused(too_big).unwrap().bytes, 900);
        assert_eq!((l.len(), l.bytes()), (0, 0));
        // Its dead letter takes its place before the Commit.
        let dead_letter = l.produced(msg(50)).unwrap();
        l.commit(Lsn(200)).unwrap();
        assert_eq!(l.watermark(), Lsn(100));
        l.delivered(dead_letter, Outcome::Acked).unwrap();
        assert_eq!(l.watermark(), Lsn(200));
    }

    #[test]
    fn caps_follow_the_messages_in_flight() {
        let mut l = InFlightLedger::new(Lsn(0), CAPS);
        assert!(l.has_room());
        l.begin().unwrap();
        let mut tickets = Vec::new();
        for _ in 0..3 {
            tickets.push(l.produced(msg(10)).unwrap());
            assert!(l.has_room());
        }
        tickets.push(l.produced(msg(10)).unwrap());
        assert!(!l.has_room(), "message cap");
        let t = tickets.pop().unwrap();
        l.delivered(t, Outcome::Acked).unwrap();
        assert!(l.has_room());
        // One message past the byte cap still gets through when nothing is in flight.
        for t in tickets.drain(..) {
            l.delivered(t, Outcome::Acked).unwrap();
        }
        let huge = l.produced(msg(5000)).unwrap();
        assert!(!l.has_room(), "byte cap");
        l.delivered(huge, Outcome::Acked).unwrap();
        assert!(l.has_room());
        // A freed ticket is reused: the slab does not grow with the messages produced.
        assert_eq!(l.produced(msg(1)).unwrap(), huge);
    }

    #[test]
    fn the_oldest_message_is_reported_with_its_topic() {
        let mut l = InFlightLedger::new(Lsn(0), CAPS);
        l.begin().unwrap();
        let first = l
            .produced(Outgoing {
                topic: "payments",
                commit_unix_micros: 5,
                ..msg(1)
            })
            .unwrap();
        l.produced(Outgoing {
            commit_unix_micros: 9,
            ..msg(1)
        })
        .unwrap();
        let oldest = l.oldest().copied().unwrap();
        assert_eq!(l.topic_name(&oldest), "payments");
        assert_eq!(l.oldest_commit_unix_micros(), Some(5));
        l.delivered(first, Outcome::Acked).unwrap();
        assert_eq!(l.oldest_commit_unix_micros(), Some(9));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Produce, refuse, ack and fail in any order against a plain model: the slab and
        /// the per-transaction counts always agree, the caps see exact counts, and W never
        /// passes an undone transaction's commit nor moves after a failure.
        #[test]
        fn the_two_halves_agree_with_a_model(
            ops in prop::collection::vec((0u8..7, 0usize..1000), 0..400),
        ) {
            let mut l = InFlightLedger::new(Lsn(100), CAPS);
            // Per transaction: (commit_lsn, end_lsn once committed, unacked messages).
            let mut model: Vec<(u64, Option<u64>, usize)> = Vec::new();
            let mut flying: Vec<(Ticket, usize, usize)> = Vec::new(); // ticket, txn, bytes
            let (mut pos, mut open, mut frozen, mut last_w) = (100u64, false, None, l.watermark());
            for (op, k) in ops {
                match op {
                    0 if !open => {
                        l.begin().unwrap();
                        model.push((pos + 1, None, 0));
                        open = true;
                    }
                    1 | 2 if open => {
                        let i = model.len() - 1;
                        let t = l.produced(msg(k)).unwrap();
                        if op == 2 {
                            // Refused; its dead letter takes its place.
                            prop_assert_eq!(l.refused(t).unwrap().bytes, k);
                            flying.push((l.produced(msg(1)).unwrap(), i, 1));
                        } else {
                            flying.push((t, i, k));
                        }
                        model[i].2 += 1;
                    }
                    3 if open => {
                        let i = model.len() - 1;
                        model[i].0 = pos + 2;
                        pos += 3 + u64::try_from(k % 5).unwrap();
                        model[i].1 = Some(pos);
                        l.commit(Lsn(pos)).unwrap();
                        open = false;
                    }
                    4 | 5 if !flying.is_empty() => {
                        let (t, i, bytes) = flying.swap_remove(k % flying.len());
                        let outcome = if op == 5 && k % 7 == 0 { Outcome::Failed } else { Outcome::Acked };
                        prop_assert_eq!(l.delivered(t, outcome).unwrap().bytes, bytes);
                        if outcome == Outcome::Failed {
                            frozen.get_or_insert(l.watermark());
                        }
                        model[i].2 -= 1;
                    }
                    6 if !open => {
                        l.on_keepalive(Lsn(pos));
                    }
                    _ => {}
                }
                let bytes: usize = flying.iter().map(|f| f.2).sum();
                prop_assert_eq!((l.len(), l.bytes()), (flying.len(), bytes));
                prop_assert_eq!(u64::try_from(l.len()).unwrap(), l.acks().in_flight_messages());
                prop_assert_eq!(l.has_room(), CAPS.has_room(flying.len(), bytes));
                let w = l.watermark();
                prop_assert!(w >= last_w);
                last_w = w;
                if let Some(f) = frozen {
                    prop_assert_eq!(w, f, "W moved after a failure");
                }
                if let Some(&(commit, _, _)) = model.iter().find(|m| m.1.is_none() || m.2 > 0) {
                    prop_assert!(w.0 < commit, "W {} passed an undone commit {}", w.0, commit);
                }
            }
        }
    }
}
