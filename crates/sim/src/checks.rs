//! The invariants: what the rules hand on as confirmable, and what Kafka holds once the
//! system is quiet.

use std::collections::{HashMap, HashSet};

use pgoutput::Lsn;

use crate::life::Life;
use crate::model::{Change, Config};
use crate::{Sim, Violation};

impl Sim {
    /// The rules' position, as the relay takes it after every turn of its loop: it may be
    /// sent with any status update, so it is checked at once.
    pub(crate) fn hand_on(&mut self, life: &mut Life) -> Result<(), Violation> {
        match life.core.advance() {
            Some(w) => self.check_confirmable(life.cluster, w, life.start, life.cfg),
            None => Ok(()),
        }
    }

    /// `w`, handed on by a session of cluster `c` that started at `start` with `cfg`, is
    /// a transaction's end (never its commit, never one past), and every outbox row (and,
    /// when it relays messages, every event message) that session confirms with it is in
    /// Kafka, in its topics or as a dead letter; a row hidden by a publication change
    /// counts once the operator published it again.
    pub(crate) fn check_confirmable(
        &self,
        c: usize,
        w: Lsn,
        start: Lsn,
        cfg: Config,
    ) -> Result<(), Violation> {
        let messages = cfg.relay_messages;
        let cl = &self.clusters[c];
        if w != start && !cl.history.iter().any(|t| t.end_lsn == w) {
            return Err(Violation(format!(
                "cluster {c}: the position {w:?} is neither a transaction's end nor where the session started"
            )));
        }
        let confirmed_by_it = cl.history.iter().filter(|t| {
            if t.bare {
                // Decoded alone, and passed once the position reaches its end.
                t.commit_lsn > start && t.commit_lsn <= w
            } else {
                t.end_lsn > start && t.end_lsn <= w
            }
        });
        for t in confirmed_by_it {
            for ch in &t.changes {
                if ch
                    .event_id()
                    .is_some_and(|id| self.skipped_by_hand.contains(&(cfg.tag & 1, id)))
                {
                    continue;
                }
                let id = match *ch {
                    Change::Outbox { id, .. } if !(t.hidden && cl.republished.contains(&id)) => id,
                    Change::Message {
                        event: Some((id, _)),
                    } if messages => id,
                    _ => continue,
                };
                if !self.kafka.written.contains(&(cfg.tag, id)) {
                    return Err(Violation(format!(
                        "cluster {c} confirmed {w:?} past event {id} (transaction {:?}{}) that Kafka does not have",
                        t.commit_lsn,
                        if t.hidden { ", hidden by a publication change" } else { "" }
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every event of the first cluster's history is in its topics (or dead-lettered),
    /// and per aggregate the first arrivals (in the topics the relay published to: it may
    /// have been switched to others, once) are in commit order.
    pub(crate) fn check_final(&mut self) -> Result<(), Violation> {
        let cl = &self.clusters[0];
        let family = [cl.tag & 1, (cl.tag & 1) | 2];
        let mut commit_index: HashMap<u64, usize> = HashMap::new();
        for t in &cl.history {
            if t.hidden {
                // Published again, later in the history: its copies are checked.
                continue;
            }
            for ch in &t.changes {
                if let Change::Outbox { id, bad, .. } = *ch {
                    if self.skipped_by_hand.contains(&(cl.tag & 1, id)) {
                        continue;
                    }
                    if !family
                        .iter()
                        .any(|&tag| self.kafka.written.contains(&(tag, id)))
                    {
                        return Err(Violation(format!(
                            "event {id} (transaction {:?}) never reached Kafka",
                            t.commit_lsn
                        )));
                    }
                    let next = commit_index.len();
                    if !bad
                        && !cl.republished.contains(&id)
                        && !self.skipped_by_hand.contains(&(cl.tag & 1, id))
                    {
                        commit_index.entry(id).or_insert(next);
                    }
                }
            }
        }
        if self.steady[0] {
            // Event messages exist in the WAL alone: each reached Kafka, or was lost with
            // a slot as the operator was told.
            for t in &cl.history {
                for ch in &t.changes {
                    if let Change::Message {
                        event: Some((id, _)),
                    } = *ch
                    {
                        let arrived = family
                            .iter()
                            .any(|&tag| self.kafka.written.contains(&(tag, id)));
                        if !arrived
                            && !self.lost_messages.contains(&id)
                            && !self.skipped_by_hand.contains(&(cl.tag & 1, id))
                        {
                            return Err(Violation(format!(
                                "event message {id} (transaction {:?}) never reached Kafka",
                                t.commit_lsn
                            )));
                        }
                    }
                }
            }
        }
        // One the producer refused as too large went to the dead-letter topic (a replay
        // after the limit was raised may publish it too, late).
        let dead: HashSet<u64> = self
            .kafka
            .log
            .iter()
            .flatten()
            .filter(|w| w.dead)
            .map(|w| w.id)
            .collect();
        // As a consumer of both sets of topics sees them: an aggregate's partition holds
        // both topics' records in the order they were written.
        let mut seen = HashSet::new();
        let mut last: HashMap<u32, (usize, u64)> = HashMap::new();
        for w in self.kafka.log.iter().flatten() {
            if !family.contains(&w.tag) || w.dead || dead.contains(&w.id) {
                continue;
            }
            let Some(&at) = commit_index.get(&w.id) else {
                continue;
            };
            if !seen.insert(w.id) {
                self.stats.duplicates += 1;
                continue;
            }
            if let Some(&(before, prev)) = last.get(&w.agg) {
                if at < before {
                    return Err(Violation(format!(
                            "aggregate {}: event {} arrived after event {prev}, which was committed after it",
                            w.agg, w.id
                        )));
                }
            }
            last.insert(w.agg, (at, w.id));
        }
        Ok(())
    }
}
