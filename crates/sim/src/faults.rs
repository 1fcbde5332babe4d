//! Faults and operator actions: kills, delivery failures, server restarts, restores,
//! copies, settings and publication changes, a progress topic that expires records,
//! clock steps, a clean shutdown, another writer of the progress record.

use std::time::Duration;

use outbox_core::slot_fate::SlotNow;
use outbox_core::{
    Doubt, Happened, LifeCore, LookEnd, PartialTxn, Shutdown, ShutdownRules, ShutdownStep, TxnId,
};

use crate::life::Life;
use crate::model::{Change, Config, Record, PARTITIONS};
use crate::{Sim, Violation};

/// A clean shutdown here: a turn of the relay's loop stands for a millisecond, so the
/// deadline is 10,000 turns.
pub(crate) const SHUTDOWN: ShutdownRules = ShutdownRules {
    exactly_once: false,
    watches_publication: true,
    keeps_record: true,
    timeout: Duration::from_secs(10),
    final_record_min: Duration::from_secs(1),
};
const TURN: Duration = Duration::from_millis(1);

impl Sim {
    /// A progress topic with retention instead of compaction deletes a key's records
    /// once they are old; a relay that starts then has no claim.
    pub(crate) fn expire_records(&mut self) {
        if self.uncompacted {
            let key = self.rng.index(3);
            self.kafka.records.remove(&u8::try_from(key).unwrap_or(0));
        }
    }

    pub(crate) fn checkpoint(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cl = &mut self.clusters[c];
        cl.persisted = cl.confirmed;
    }

    pub(crate) fn kill(&mut self) {
        let c = self.rng.index(self.clusters.len());
        self.kill_cluster(c);
    }

    fn kill_cluster(&mut self, c: usize) {
        if let Some(life) = self.lives[c].take() {
            self.stats.kills += 1;
            self.end_life(life, false);
        }
        self.processes[c] += 1;
    }

    /// A delivery error: the session ends soon (at its next read); the process starts
    /// another from the slot.
    pub(crate) fn fail_delivery(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let p = self.rng.index(PARTITIONS);
        let clock = self.clock;
        match self.lives[c].as_mut() {
            Some(life) => fail_front(life, p, clock),
            None => Ok(()),
        }
    }

    /// The server restarts (fast or immediate): the session ends; an older server falls
    /// back to the slot position of its last checkpoint.
    pub(crate) fn restart_postgres(&mut self) {
        let c = self.rng.index(self.clusters.len());
        if let Some(life) = self.lives[c].take() {
            self.end_life(life, true);
        }
        let cl = &mut self.clusters[c];
        if cl.falls_back && self.rng.chance(700) {
            cl.confirmed = cl.persisted;
        } else {
            cl.persisted = cl.confirmed;
        }
    }

    pub(crate) fn take_snapshot(&mut self) {
        // Not of a server whose slot is lost: a backup is taken of a working setup.
        if self.snapshot.is_none() && self.clusters[0].slot == SlotNow::Usable {
            let mut snap = self.clusters[0].clone();
            snap.confirmed = snap.persisted;
            self.snapshot = Some(snap);
        }
    }

    /// An older backup of the first cluster replaces it (same system identifier; on the
    /// same timeline or a new one).
    pub(crate) fn restore(&mut self) {
        let Some(mut snap) = self.snapshot.take() else {
            return;
        };
        if self.rng.chance(500) {
            snap.timeline += 1;
        }
        // The relay process lives on across the restore half the time: its next session
        // connects to the restored server with what it carries (the relay's rules drop
        // its claim on a new timeline, and keep it on the same one).
        let lives_on = self.rng.chance(500);
        if let Some(life) = self.lives[0].take() {
            self.end_life(life, lives_on);
        }
        if !lives_on {
            self.carry[0] = LifeCore::new(false);
            self.processes[0] += 1;
        }
        let old = std::mem::replace(&mut self.clusters[0], snap);
        self.archive.push(old.history);
    }

    /// A live copy of the first cluster, with its own relay sharing the Kafka cluster and
    /// (unless named apart) the progress record's key; its relay publishes to other
    /// topics, or to the same ones.
    pub(crate) fn clone_cluster(&mut self) {
        if self.clusters.len() > 1 || self.clusters[0].slot != SlotNow::Usable {
            return;
        }
        let mut copy = self.clusters[0].clone();
        copy.confirmed = copy.persisted;
        copy.tag = u8::from(self.rng.chance(500));
        copy.key = u8::from(self.rng.chance(200));
        let cfg = Config {
            tag: copy.tag,
            ..self.configs[0]
        };
        // A bad transaction skipped by hand before the copy's slot position is skipped in
        // the copy too.
        let from = self.configs[0].tag & 1;
        let inherited: Vec<(u8, u64)> = copy
            .history
            .iter()
            .filter(|t| !t.decoded_from(copy.confirmed))
            .flat_map(|t| &t.changes)
            .filter_map(Change::event_id)
            .filter(|id| self.skipped_by_hand.contains(&(from, *id)))
            .map(|id| (copy.tag & 1, id))
            .collect();
        self.skipped_by_hand.extend(inherited);
        self.clusters.push(copy);
        self.lives.push(None);
        self.carry.push(LifeCore::new(false));
        self.configs.push(cfg);
        self.steady.push(self.steady[0]);
        self.processes.push(0);
        self.epochs.push(0);
    }

    /// Retention drops the outbox's partition: rows written to it that no relay has read
    /// yet are in the WAL alone, and the catalog no longer calls it a partition.
    pub(crate) fn drop_partition(&mut self) {
        let c = self.rng.index(self.clusters.len());
        self.clusters[c].partition_dropped = true;
    }

    /// The operator changes a relay's settings; its next process uses them.
    pub(crate) fn change_config(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cfg = &mut self.configs[c];
        match self.rng.below(5) {
            // An emit-only relay keeps relaying them: it has nothing else.
            0 if !cfg.relay_table => {}
            0 => {
                cfg.relay_messages = !cfg.relay_messages;
                self.steady[c] = false;
            }
            1 => cfg.heartbeat = !cfg.heartbeat,
            2 => cfg.other_published = !cfg.other_published,
            3 => cfg.dead_letter = !cfg.dead_letter,
            // OUTBOXD_TOPIC to other topics (once): what the old ones hold proves nothing
            // there.
            _ => cfg.tag |= 2,
        }
        if let Some(life) = self.lives[c].take() {
            self.end_life(life, false);
        }
        self.carry[c] = LifeCore::new(false);
        self.processes[c] += 1;
    }

    /// Someone takes the outbox out of the publication, or puts it back: the rows
    /// committed meanwhile are never decoded.
    pub(crate) fn change_publication(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cl = &mut self.clusters[c];
        cl.outbox_published = !cl.outbox_published;
        cl.publication += 1;
        if self.guarded {
            self.clock += 1;
            cl.commit_guard(self.clock);
        }
        // One in two waits for a synchronous standby: looks meanwhile see the old catalog.
        if self.rng.chance(2) {
            cl.visible = cl.publication;
        }
    }

    /// The server's clock steps: commit times only get compared for equality.
    pub(crate) fn clock_jump(&mut self) {
        if self.rng.chance(500) {
            self.clock += 10_000_000;
        } else {
            self.clock -= 5_000_000;
            self.clock_back += 5_000_000;
        }
    }

    /// SIGTERM: the relay's clean shutdown, in `outbox_core::Shutdown`'s order: it reads
    /// on to the open transaction's end (turns of its loop stand for the time), awaits
    /// the acks (one stop in five, the broker is slow and not all come), takes a last look at the publication (which may fail,
    /// or find it changed: the relay stops), confirms, writes its record and exits; the
    /// next process starts from the slot.
    pub(crate) fn graceful_stop(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let Some(life) = self.lives[c].take() else {
            return Ok(());
        };
        if let Some(life) = self.drive_stop(life, Shutdown::new(SHUTDOWN, Duration::ZERO))? {
            self.stats.clean_stops += 1;
            self.end_life(life, false);
            self.processes[c] += 1;
        }
        Ok(())
    }

    /// Drives `stop` for `life`'s session as the relay's `drain` does: the session back
    /// when it is done, or `None` when it ended otherwise (a failure, or a publication
    /// change), handled as the relay's would be. The broker is slow now and then: not
    /// every ack comes before the deadline.
    pub(crate) fn drive_stop(
        &mut self,
        mut life: Life,
        mut stop: Shutdown,
    ) -> Result<Option<Life>, Violation> {
        let c = life.cluster;
        let mut now = Duration::ZERO;
        loop {
            let happened = match stop.step() {
                ShutdownStep::ReadOn => {
                    now += TURN;
                    let turn = Happened::Turn {
                        now,
                        may_stop: life.core.may_stop(),
                    };
                    if stop.on(turn) != ShutdownStep::ReadOn {
                        continue;
                    }
                    if life.failing {
                        self.end_life(life, true);
                        return Ok(None);
                    }
                    if self.rng.chance(500) {
                        self.ack_all(&mut life)?;
                        continue;
                    }
                    let result = self.read_one(&mut life);
                    self.after_rules(&mut life)?;
                    // The last look below stands in for the guard's.
                    life.guard_seen();
                    if let Err(e) = result {
                        self.settle_read(life, Err(e))?;
                        return Ok(None);
                    }
                    self.hand_on(&mut life)?;
                    continue;
                }
                // Not in these schedules (at-least-once).
                ShutdownStep::FinishKafkaTxn => Happened::KafkaTxnCommitted,
                ShutdownStep::AwaitAcks => {
                    if stop.left(now).is_zero() {
                    } else if self.rng.chance(20) {
                        // A delivery fails while draining: the rest of the steps go on,
                        // and confirm only what was acked before it.
                        self.ack_some(&mut life)?;
                        let p = self.rng.index(PARTITIONS);
                        fail_front(&mut life, p, self.clock)?;
                        self.stats.drain_failures += u64::from(life.failing);
                    } else if self.rng.chance(200) {
                        self.ack_some(&mut life)?;
                    } else {
                        self.ack_all(&mut life)?;
                    }
                    Happened::AcksAwaited
                }
                ShutdownStep::LastLook => {
                    let end = if stop.look_time(now).is_zero() {
                        LookEnd::TimedOut
                    } else if self.rng.chance(100) {
                        LookEnd::Failed
                    } else {
                        match self.look_at_once(c, &mut life) {
                            Ok(_) => LookEnd::Answered,
                            Err(e) => {
                                if stop.on(Happened::Looked(LookEnd::Stopped)) == ShutdownStep::Stop
                                {
                                    self.stopped_by_publication(life, e);
                                    return Ok(None);
                                }
                                continue;
                            }
                        }
                    };
                    Happened::Looked(end)
                }
                ShutdownStep::Stop => {
                    // Only a changed publication stops, and that returned above.
                    self.end_life(life, false);
                    self.processes[c] += 1;
                    return Ok(None);
                }
                ShutdownStep::Confirm => {
                    self.hand_on(&mut life)?;
                    let cl = &mut self.clusters[c];
                    cl.confirmed = cl.confirmed.max(life.core.confirmed());
                    Happened::Confirmed
                }
                ShutdownStep::WriteRecord => {
                    self.lives[c] = Some(life);
                    self.write_record_of(c)?;
                    let Some(back) = self.lives[c].take() else {
                        return Ok(None);
                    };
                    life = back;
                    Happened::RecordWritten
                }
                ShutdownStep::Done => return Ok(Some(life)),
            };
            stop.on(happened);
        }
    }

    /// A slow broker: it acks some of what the session sent, a prefix of each partition.
    fn ack_some(&mut self, life: &mut Life) -> Result<(), Violation> {
        for p in 0..PARTITIONS {
            for _ in 0..self.rng.below(3) {
                self.broker_acks(life, p)?;
            }
        }
        Ok(())
    }

    /// The broker acks everything the session sent.
    fn ack_all(&mut self, life: &mut Life) -> Result<(), Violation> {
        for p in 0..PARTITIONS {
            while self.broker_acks(life, p)? {}
        }
        Ok(())
    }

    /// The relay reads its record back and finds another lineage wrote it: its claims
    /// prove nothing any more.
    pub(crate) fn foreign_writer(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        self.foreign_writer_of(c)
    }

    /// Cluster `c`'s session learns that another lineage wrote its record.
    pub(crate) fn foreign_writer_of(&mut self, c: usize) -> Result<(), Violation> {
        let Some(mut life) = self.lives[c].take() else {
            return Ok(());
        };
        let result = life
            .core
            .doubt(Doubt::ForeignWriter)
            .and_then(|()| life.pump().map(|_| ()));
        crate::give_up_unproven(&mut life, &result);
        self.after_rules(&mut life)?;
        self.settle_read(life, result)
    }

    /// A principal that may write the progress topic (and should not) raises the count of
    /// a partly delivered transaction in the newest record, or names one that was never
    /// delivered, without the digest of those rows; the relay is restarted and reads it.
    pub(crate) fn forge_partial(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cl = &self.clusters[c];
        let Some(last) = self.kafka.records.get(&cl.key).and_then(|r| r.last()) else {
            return;
        };
        let mut forged = last.claim.clone();
        let extra = 1 + self.rng.below(3);
        forged.partial = match forged.partial {
            Some(p) => Some(PartialTxn {
                rows: p.rows + extra,
                ..p
            }),
            None => {
                let Some(t) = cl
                    .history
                    .iter()
                    .find(|t| t.commit_lsn >= forged.lsn && !t.bare)
                else {
                    return;
                };
                Some(PartialTxn {
                    txn: TxnId {
                        commit_lsn: t.commit_lsn,
                        xid: t.xid,
                        commit_time: t.commit_time,
                    },
                    rows: extra,
                    digest: Some(self.rng.next_u64()),
                })
            }
        };
        if self.trace {
            eprintln!("  forged record on cluster {c}: {:?}", forged.partial);
        }
        let record = Record {
            claim: forged,
            lineage: last.lineage,
            writer: (c, u64::MAX, 0),
            written_at: self.clock,
        };
        self.kafka.records.entry(cl.key).or_default().push(record);
        self.stats.forged += 1;
        self.kill_cluster(c);
    }
}

/// The delivery of the first message in flight to partition `p` fails (if any is).
fn fail_front(life: &mut Life, p: usize, clock: i64) -> Result<(), Violation> {
    if let Some((ticket, _)) = life.queues[p].pop_front() {
        // An idempotent producer leaves no gap: what came after it in the partition fails
        // too.
        life.queues[p].clear();
        life.core
            .on_delivery(ticket, false, clock)
            .map_err(|e| Violation(format!("fail: {e}")))?;
        life.failing = true;
    }
    Ok(())
}
