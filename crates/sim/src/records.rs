//! The slot's progress record: when a session writes it and reads it back (the relay's
//! `outbox_core::RecordCadence`), and the record as the model's progress topic keeps it.

use std::collections::HashMap;
use std::time::Duration;

use outbox_core::{RecordAcks, RecordFacts};

use crate::{Record, Rng, Sim, Violation};

/// Progress-record writes the broker has not answered. The relay writes in the background,
/// one write at a time (`ProgressStore::write_in_background`): the answer may come turns
/// later, or be a failure; and a write sent by a process that then died may still land,
/// after anything a later process wrote.
pub(crate) struct RecordWrites {
    /// The writes' fates: their own stream, so the other draws stay as they were.
    rng: Rng,
    /// This schedule's writes can be slow and fail; in the others each lands at once.
    slow: bool,
    /// Per cluster: the write its relay process sent and has not had answered, and the
    /// session that sent it. The store is the process's: a next session of the process
    /// waits for it, and is told of its ack (`RecordAcks::any_this_session`).
    in_flight: HashMap<usize, (Record, u64)>,
    /// Sent by a process that is gone, under the key it wrote to.
    orphans: Vec<(u8, Record)>,
    /// Sessions started, to tell them apart.
    pub(crate) sessions: u64,
}

impl RecordWrites {
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7265_636f_7264_7331);
        let slow = rng.chance(400);
        RecordWrites {
            rng,
            slow,
            in_flight: HashMap::new(),
            orphans: Vec::new(),
            sessions: 0,
        }
    }
}

impl Sim {
    /// A turn of a session's loop, as far as its progress record goes: the relay's
    /// cadence (`outbox_core::RecordCadence`, on the relay's clock) says whether the
    /// record is written (at once, and acked) and whether it is read back for another
    /// lineage (which ends the claims, as the relay's tick does).
    pub(crate) fn write_record(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        self.land_orphans()?;
        self.answer_record_write(c)?;
        let now = self.relay_clock();
        let key = self.clusters[c].key;
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        if !life.cadence.looks(now, life.watch.compared()) {
            return Ok(());
        }
        let (claim, lineage) = life.core.claim();
        let facts = RecordFacts {
            position: claim.lsn,
            partial: claim.partial,
            lineage,
        };
        let lineages = life.core.lineages();
        let acks = RecordAcks {
            any_this_session: life.any_record_acked,
            own_lineage: life.record_acked == Some(lineages.0),
        };
        let turn = life.cadence.turn(now, facts, acks);
        // Read before this turn's write lands: the relay's read runs beside it.
        let foreign = turn.check_lineage
            && self
                .kafka
                .records
                .get(&key)
                .and_then(|r| r.last())
                .is_some_and(|r| {
                    r.lineage != 0 && r.lineage != lineages.0 && r.lineage != lineages.1
                });
        // Skipped while an earlier write is unanswered, as the relay's store does: due
        // again next time.
        if turn.write && self.send_record(c)? {
            self.stats.records_written += 1;
            if let Some(life) = self.lives[c].as_mut() {
                life.cadence.sent(now, facts);
            }
        }
        if foreign {
            self.stats.lineage_checks_found += 1;
            return self.foreign_writer_of(c);
        }
        Ok(())
    }

    /// The relay's monotonic clock: the simulated one without its steps back.
    pub(crate) fn relay_clock(&self) -> Duration {
        Duration::from_micros(u64::try_from(self.clock + self.clock_back).unwrap_or(0))
    }

    /// The session's claim as its progress record, as sent now.
    fn record_of(&mut self, c: usize) -> Option<Record> {
        let life = self.lives[c].as_mut()?;
        let (claim, lineage) = life.core.claim();
        Some(Record {
            claim,
            lineage,
            writer: (c, life.process, self.epochs[c]),
            written_at: self.clock,
        })
    }

    /// The session's record sent; true if the store took it (no write unanswered).
    fn send_record(&mut self, c: usize) -> Result<bool, Violation> {
        if self.record_writes.in_flight.contains_key(&c) {
            return Ok(false);
        }
        let Some(record) = self.record_of(c) else {
            return Ok(false);
        };
        let session = self.lives[c].as_ref().map_or(0, |l| l.session);
        if self.record_writes.slow && self.record_writes.rng.chance(700) {
            self.record_writes.in_flight.insert(c, (record, session));
            return Ok(true);
        }
        self.record_acked(c, record, session)?;
        Ok(true)
    }

    /// A record of cluster `c`'s process landed, sent by `session`: that session's own
    /// lineage is acked, and any session of the process sees an ack.
    fn record_acked(&mut self, c: usize, record: Record, session: u64) -> Result<(), Violation> {
        let lineage = record.lineage;
        self.land_record(self.clusters[c].key, record)?;
        if let Some(life) = self.lives[c].as_mut() {
            life.any_record_acked = true;
            if life.session == session {
                life.record_acked = Some(lineage);
            }
        }
        Ok(())
    }

    /// The broker answers the unanswered write of cluster `c`'s process, or not yet. A
    /// process that is gone left it to land some time later, or never.
    fn answer_record_write(&mut self, c: usize) -> Result<(), Violation> {
        let Some((record, session)) = self.record_writes.in_flight.remove(&c) else {
            return Ok(());
        };
        if record.writer.1 != self.processes[c] {
            if self.record_writes.rng.chance(500) {
                self.record_writes
                    .orphans
                    .push((self.clusters[c].key, record));
            }
            return Ok(());
        }
        match self.record_writes.rng.below(10) {
            0..=4 => {
                self.stats.records_slow += 1;
                self.record_acked(c, record, session)?;
            }
            5 => self.stats.records_failed += 1,
            _ => {
                self.record_writes.in_flight.insert(c, (record, session));
            }
        }
        Ok(())
    }

    /// Writes of processes that are gone land, some of them.
    fn land_orphans(&mut self) -> Result<(), Violation> {
        let mut i = 0;
        while i < self.record_writes.orphans.len() {
            if self.record_writes.rng.chance(300) {
                let (key, record) = self.record_writes.orphans.remove(i);
                self.stats.records_orphaned += 1;
                self.land_record(key, record)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The session's claim written as the slot's progress record, at once (a clean
    /// shutdown's final record: the relay waits for it). An unanswered earlier write of
    /// the same producer is answered first.
    pub(crate) fn write_record_of(&mut self, c: usize) -> Result<(), Violation> {
        let key = self.clusters[c].key;
        if let Some((earlier, session)) = self.record_writes.in_flight.remove(&c) {
            if self.record_writes.rng.chance(500) {
                self.record_acked(c, earlier, session)?;
            }
        }
        let Some(record) = self.record_of(c) else {
            return Ok(());
        };
        if self.record_writes.slow && self.record_writes.rng.chance(200) {
            // Timed out: given up by the shutdown, perhaps written later all the same.
            self.stats.records_failed += 1;
            if self.record_writes.rng.chance(500) {
                self.record_writes.orphans.push((key, record));
            }
            return Ok(());
        }
        self.land_record(key, record)
    }

    /// A record the broker appends under `key`.
    fn land_record(&mut self, key: u8, record: Record) -> Result<(), Violation> {
        let records = self.kafka.records.entry(key).or_default();
        // One process's records never move back while it keeps its claim (a doubt, or a
        // restart after a restore, may: the claim was wrong). One producer's writes land
        // in the order it sent them.
        if let Some(prev) = records.iter().rev().find(|r| r.writer == record.writer) {
            if record.claim.lsn < prev.claim.lsn {
                return Err(Violation(format!(
                    "the progress record moved back: {:?} after {:?}",
                    record.claim.lsn, prev.claim.lsn
                )));
            }
        }
        records.push(record);
        Ok(())
    }
}
