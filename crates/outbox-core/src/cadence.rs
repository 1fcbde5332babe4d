//! When a session writes the slot's progress record, and when it reads it back to see
//! whether another relay writes it: [`RecordCadence`], the same for the relay (which
//! makes the store's calls) and the simulator.
//!
//! The clock is the caller's: a monotonic time since any origin, passed in as a
//! [`Duration`]. The rules never read one.

use std::time::Duration;

use pgoutput::Lsn;

use crate::PartialTxn;

/// How often the record is looked at, rewritten and read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CadenceRules {
    /// The record is looked at (built, which scans the ledger) at most this often.
    pub interval: Duration,
    /// An idle slot's record is written again this often: a record that is never rewritten
    /// is the first a topic's retention or a stray delete takes, and the newest write of a
    /// key is what says the slot exists.
    pub rewrite_idle_every: Duration,
    /// How often a writing session reads the record back to see whether another lineage
    /// wrote it.
    pub lineage_check_every: Duration,
    /// Exactly-once: the record is written only inside each Kafka transaction, as its last
    /// record (one outside could claim what an abort then takes back): never here.
    pub exactly_once: bool,
}

/// What a record says that decides whether it is worth writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts {
    /// The position it claims delivered.
    pub position: Lsn,
    pub partial: Option<PartialTxn>,
    pub lineage: u64,
}

/// What the store answered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordAcks {
    /// Some write of this session was acknowledged. Until then the record may not exist at
    /// all (a slot made by `outboxd init`, with Kafka down at the first write), so a write
    /// is due even without progress.
    pub any_this_session: bool,
    /// The newest acknowledged record carries this session's lineage: only then is reading
    /// it back a sign of another writer (before, the newest may well be the previous
    /// session's, of another lineage).
    pub own_lineage: bool,
}

/// What to do this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordTurn {
    /// Write the record (and call [`RecordCadence::sent`] if the store took it).
    pub write: bool,
    /// Read the record back for another lineage.
    pub check_lineage: bool,
}

/// The progress record's cadence for one session.
#[derive(Debug, Clone)]
pub struct RecordCadence {
    rules: CadenceRules,
    /// What the last record sent by this session said; `None`: none yet, so the first look
    /// writes one even without progress (a slot from before records existed).
    written: Option<RecordFacts>,
    /// When the record was last looked at.
    last_look: Duration,
    /// When a write was last sent.
    last_sent: Duration,
    /// When the record was last read back.
    last_lineage_check: Duration,
}

impl RecordCadence {
    /// A session's cadence, starting at `now`.
    pub fn new(rules: CadenceRules, now: Duration) -> Self {
        RecordCadence {
            rules,
            written: None,
            last_look: now,
            last_sent: now,
            last_lineage_check: now,
        }
    }

    /// Whether this turn looks at the record: then build it and call [`Self::turn`].
    /// `compared`: the publication at the start was compared with the record's look (a
    /// record written before would replace that look with one never compared, and the
    /// position cannot move meanwhile anyway). Cheap: called on every turn of the loop.
    pub fn looks(&self, now: Duration, compared: bool) -> bool {
        !self.rules.exactly_once
            && compared
            && (self.written.is_none() || now.saturating_sub(self.last_look) >= self.rules.interval)
    }

    /// The look at `record`, as the session would write it now.
    pub fn turn(&mut self, now: Duration, record: RecordFacts, acks: RecordAcks) -> RecordTurn {
        let write = match self.written {
            None => true,
            Some(w) => {
                record.position > w.position
                    || record.partial != w.partial
                    // A new lineage (after a doubt) is written at once, or the record
                    // would go on naming the doubted claim.
                    || record.lineage != w.lineage
                    || !acks.any_this_session
                    || now.saturating_sub(self.last_sent) >= self.rules.rewrite_idle_every
            }
        };
        self.last_look = now;
        let check_lineage = acks.own_lineage
            && now.saturating_sub(self.last_lineage_check) >= self.rules.lineage_check_every;
        if check_lineage {
            self.last_lineage_check = now;
        }
        RecordTurn {
            write,
            check_lineage,
        }
    }

    /// The store took the write of `record` (one skipped while an earlier is unanswered
    /// is not: it is due again at the next look).
    pub fn sent(&mut self, now: Duration, record: RecordFacts) {
        self.last_sent = now;
        self.written = Some(record);
    }
}

#[cfg(test)]
#[path = "cadence_tests.rs"]
mod tests;
