//! The slot's progress record: when a session writes it and reads it back (the relay's
//! `outbox_core::RecordCadence`), and the record as the model's progress topic keeps it.

use std::time::Duration;

use outbox_core::{RecordAcks, RecordFacts};

use crate::{Record, Sim, Violation};

impl Sim {
    /// A turn of a session's loop, as far as its progress record goes: the relay's
    /// cadence (`outbox_core::RecordCadence`, on the relay's clock) says whether the
    /// record is written (at once, and acked) and whether it is read back for another
    /// lineage (which ends the claims, as the relay's tick does).
    pub(crate) fn write_record(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
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
            any_this_session: life.record_acked.is_some(),
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
        if turn.write {
            self.write_record_of(c)?;
            self.stats.records_written += 1;
            if let Some(life) = self.lives[c].as_mut() {
                life.cadence.sent(now, facts);
                life.record_acked = Some(lineage);
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

    /// The session's claim written as the slot's progress record, at once.
    pub(crate) fn write_record_of(&mut self, c: usize) -> Result<(), Violation> {
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        let (claim, lineage) = life.core.claim();
        let writer = (c, life.process, self.epochs[c]);
        let key = self.clusters[c].key;
        let records = self.kafka.records.entry(key).or_default();
        // One process's records never move back while it keeps its claim (a doubt, or a
        // restart after a restore, may: the claim was wrong).
        if let Some(prev) = records.iter().rev().find(|r| r.writer == writer) {
            if claim.lsn < prev.claim.lsn {
                return Err(Violation(format!(
                    "the progress record moved back: {:?} after {:?}",
                    claim.lsn, prev.claim.lsn
                )));
            }
        }
        records.push(Record {
            claim,
            lineage,
            writer,
            written_at: self.clock,
        });
        Ok(())
    }
}
