//! An instance of the exactly-once schedules: one relay process after another, each with
//! the relay's rules between its sessions (`outbox_core::LifeCore`, exactly-once: the
//! record read through read_committed is the whole truth), and what ends its sessions and
//! its processes: errors judged as the relay judges them, kill -9, SIGSTOP and a zombie
//! (SIGTERM, the clean shutdown, is `eos_shutdown.rs`).

use std::time::Duration;

use outbox_core::slot_fate::SlotNow;
use outbox_core::{
    Ended, FirstWrites, KafkaTxnCore, LifeCore, RecordRead, Refusal, ReplayStart, SlotView,
    TxnError, TxnNext,
};

use super::{Eos, Failure, Session, TIMEOUT};
use crate::eos_broker::Commit;
use crate::life::{Cursor, Life};
use crate::Violation;

/// The one server's system identifier and address: its relays never see another.
const SYSTEM: &str = "sim";
const SERVER: &str = "primary";

/// One instance of the relay (a supervisor restarts its process when it exits).
pub(super) struct Instance {
    pub(super) session: Option<Session>,
    /// SIGSTOPped at this time.
    pub(super) stopped_at: Option<Duration>,
    /// Which relay process runs it.
    pub(super) process: u64,
    /// The process's memory between its sessions, by the relay's rules.
    pub(super) carry: LifeCore<()>,
    /// This process streamed from the slot: the witness that it existed.
    pub(super) streamed: bool,
    /// Transactions this process aborted without asking to commit them, where the broker
    /// may have left them open (`outbox_core::left_open`).
    pub(super) aborted_spans: outbox_core::AbortedSpans,
    /// The first epoch of the sessions whose aborts the relay remembers (after its last
    /// start or takeover).
    pub(super) known_since: u64,
    /// It stood by: the next session it starts forgets.
    forgets: bool,
}

impl Instance {
    pub(super) fn new() -> Self {
        Instance {
            session: None,
            stopped_at: None,
            process: 0,
            carry: LifeCore::new(true),
            streamed: false,
            aborted_spans: outbox_core::AbortedSpans::new(),
            known_since: 0,
            forgets: true,
        }
    }

    /// The process exits (or is killed): the next one remembers nothing.
    pub(super) fn new_process(&mut self) {
        self.process += 1;
        self.carry = LifeCore::new(true);
        self.streamed = false;
        self.aborted_spans.clear();
        self.forgets = true;
    }
}

/// A start refused: never, with one server on one timeline and its own record.
fn refused(i: usize, r: Refusal<String>) -> Violation {
    Violation(format!(
        "exactly-once: instance {i} refused to start: {r:?}"
    ))
}

impl Eos {
    /// An instance starts a session, as the relay's `run_session` does: it connects
    /// (`LifeCore::connected`), stands by while another instance's walsender holds the
    /// slot, else takes it: `init_transactions` (a new epoch, the previous holder's open
    /// transaction aborted), the record read (read_committed: committed transactions
    /// only), and a session from the slot's position with the claim the rules allow.
    pub(super) fn start(&mut self, i: usize) -> Result<(), Violation> {
        let inst = &mut self.instances[i];
        if inst.session.is_some() || inst.stopped_at.is_some() {
            return Ok(());
        }
        let server = (SERVER.to_owned(), 5432);
        let timeline = self.cluster.timeline;
        inst.carry
            .connected::<String>(SYSTEM, timeline, server)
            .map_err(|r| refused(i, r))?;
        if self.holder.is_some() {
            // The slot is in use: the other instance writes the record from now on, under
            // the same producer id (the relay forgets its aborted spans when it takes
            // over, `pipeline/mod.rs`).
            inst.carry.ended(Ended::SlotTaken);
            inst.aborted_spans.clear();
            inst.forgets = true;
            return Ok(());
        }
        if self.cluster.slot != SlotNow::Usable && !self.slot_at_start(i)? {
            return Ok(());
        }
        self.holder = Some(i);
        let skipped = self.skipped_markers();
        let epoch = self.broker.init_transactions(&skipped);
        self.judge_decided(None)?;
        self.epoch_owners
            .insert(epoch, (i, self.instances[i].process));
        if std::mem::take(&mut self.instances[i].forgets) {
            self.instances[i].known_since = epoch;
        }
        let inst = &mut self.instances[i];
        inst.streamed = true;
        // Now and then Kafka does not answer the record's read in time: the replay
        // publishes everything (its own stream of draws).
        let unread = self.hangs.chance(40);
        self.stats.records_unread += u64::from(unread);
        let read = match inst.carry.needs_record() {
            true if unread => RecordRead::NotRead,
            true => RecordRead::Read(SlotView {
                ours: self.broker.last_record(),
                last_look: None,
                other_cluster: None,
                backfill_unfinished: None,
                writers_alternate: false,
            }),
            false => RecordRead::NotKept,
        };
        let known = inst.carry.known(read).map_err(|r| refused(i, r))?;
        let (claim, record_trusted) = (known.claim.clone(), known.record_trusted());
        let start = self.cluster.confirmed;
        if self.trace {
            eprintln!(
                "  instance {i} starts at {start:?}, epoch {epoch}, spans it aborted {:?}, claim {claim:?}",
                self.instances[i].aborted_spans
            );
        }
        let replay = ReplayStart {
            timeline,
            start,
            server_end: self.cluster.wal_end,
            claim,
            fingerprint: self
                .cfg
                .fingerprint()
                .map_err(|e| Violation(format!("settings: {e}")))?,
            foreign_writer: false,
            mark_every: crate::model::caps(self.cap).mark_every(),
            // A sixteenth of the relay's (`InFlightCaps::tracked_rows`), so that transactions
            // stop being followed here.
            tracked_rows: self.cap / 2,
            new_lineage: self.rng.next_u64() | 1,
            doubt_lineage: self.rng.next_u64() | 1,
        };
        let first = self
            .cluster
            .history
            .iter()
            .position(|t| t.decoded_from(start))
            .unwrap_or(self.cluster.history.len());
        let process = self.instances[i].process;
        let mut life = Life::new(
            i,
            process,
            self.cfg,
            self.cap,
            replay,
            Cursor::Before(first),
            crate::life::Seen {
                identity: 1,
                wal_lsn: start,
            },
        )?;
        let mut txn = KafkaTxnCore::new(self.rules);
        txn.starts_from(life.core.claim().0);
        *txn.first_writes() = FirstWrites::new(self.instances[i].aborted_spans.clone());
        txn.first_writes().allow_copies(record_trusted);
        self.instances[i].session = Some(Session {
            life,
            txn,
            epoch,
            stream_lost: false,
            flush: start,
            spilled: false,
            lost_slot_checked: None,
        });
        Ok(())
    }

    /// The session ends with `e`: an open transaction aborted, a fence judged, and the
    /// instance goes on (a new session, a new producer) or stops.
    pub(super) fn end_session(
        &mut self,
        i: usize,
        mut s: Session,
        e: Failure,
    ) -> Result<(), Violation> {
        let e = self.abort_open(i, &mut s, e)?;
        self.instances[i].aborted_spans = s.txn.first_writes().spans().clone();
        self.judged(i, &s, e)
    }

    /// The session failed with `e`: what its process carries, and its open transaction
    /// aborted (as the relay's `abort_open_txn`); the error it ends with.
    pub(super) fn abort_open(
        &mut self,
        i: usize,
        s: &mut Session,
        e: Failure,
    ) -> Result<TxnError, Violation> {
        let unproven = matches!(e, Failure::Unproven(_));
        let left_open = matches!(e, Failure::Txn(TxnError::LeftOpen(_)));
        let e = match e {
            Failure::Violation(v) => return Err(v),
            Failure::Rules(e) => return Err(Violation(format!("the rules failed: {e}"))),
            Failure::Session(why) | Failure::Unproven(why) => TxnError::Abortable(why),
            Failure::Txn(e) => e,
        };
        // What the relay's `run_session` hands its process once a session ran (exactly-once
        // keeps no claim of it); a retry carries it into the next session (`judged`).
        let carry = &mut self.instances[i].carry;
        carry.session_ran(Some(s.life.core.claim()), None);
        if unproven {
            carry.replay_unproven();
        }
        if s.txn.aborting(self.now) {
            self.stats.aborts += 1;
            let serial = self.broker.open_serial();
            // librdkafka's abort first waits for the requests in flight (a slow broker is
            // often why the session failed): the broker may expire the transaction
            // meanwhile, and then answers the abort as fenced.
            if self.abort_waits.chance(300) {
                let most = u64::try_from(TIMEOUT.as_millis()).unwrap_or(1_000);
                self.now += Duration::from_millis(1 + self.abort_waits.below(most));
                self.expire();
            }
            let skipped = self.skipped_markers();
            let abort = self.broker.end_txn(s.epoch, Commit::Abort, &skipped);
            let by = super::left_open::By {
                i,
                left_open,
                serial,
            };
            self.judge_decided(Some(by))?;
            s.txn.abort_answered(self.now);
            // Anything but fenced or broken leaves the transaction to the next start.
            return Ok(KafkaTxnCore::after_abort(e, abort));
        }
        Ok(e)
    }

    pub(super) fn judged(&mut self, i: usize, s: &Session, e: TxnError) -> Result<(), Violation> {
        let fence = matches!(e, TxnError::Fenced(_));
        // The relay asks which walsender holds the slot: its own, or none once
        // PostgreSQL ended its walsender, is its own.
        let ours = self.holder.is_none_or(|h| h == i && !s.stream_lost);
        let e = match e {
            TxnError::Fenced(why) => s.txn.judge_fence(why, ours),
            e => e,
        };
        // No instance registered since this session did, and the slot is its own: only the
        // broker's timeout ended its epoch. Stopping as fenced would take the relay down
        // (exit 5, "another instance took over") for an expiry to resume from.
        if matches!(e, TxnError::Fenced(_)) && self.broker.last_init <= s.epoch && ours {
            return Err(Violation(format!(
                "exactly-once: instance {i} stops as fenced, though only the broker's timeout aborted its transaction ({e})"
            )));
        }
        if self.trace {
            eprintln!("  instance {i}'s session ended: {e}");
        }
        // The broker knows whether another instance registered since this session did
        // (only a slot holder does): then the fence is a takeover, and this zombie must
        // stop while that instance holds the slot, whatever it made of it (its own
        // transaction may have expired first). One that took over and left has recorded
        // what it delivered: starting over from that record is any restart.
        let taken = self.holder.is_some_and(|h| h != i);
        if fence && e.next() != TxnNext::Stop && self.broker.last_init > s.epoch && taken {
            return Err(Violation(format!(
                "exactly-once: instance {i}, fenced by another's takeover, goes on ({e})"
            )));
        }
        if self.holder == Some(i) {
            self.holder = None;
        }
        match e.next() {
            TxnNext::Stop => {
                if matches!(e, TxnError::Fenced(_)) {
                    self.stats.fenced += 1;
                }
                // The process exits; its supervisor starts another, which stands by.
                self.instances[i].new_process();
            }
            TxnNext::AbortAndResume | TxnNext::CallAgain => {
                self.stats.expired += u64::from(matches!(e, TxnError::Expired(_)));
                self.instances[i].carry.ended(Ended::Retry);
            }
        }
        Ok(())
    }

    /// kill -9 of an instance, at any step: between sending and committing too. Its open
    /// transaction stays open until the next `init_transactions` or the timeout.
    pub(super) fn kill(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        if inst.session.take().is_some() {
            self.stats.kills += 1;
        }
        inst.stopped_at = None;
        inst.new_process();
        if self.holder == Some(i) {
            self.holder = None;
        }
    }

    /// SIGSTOP: the instance does nothing until resumed; its walsender times out later.
    pub(super) fn stop(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        if inst.session.is_some() && inst.stopped_at.is_none() {
            inst.stopped_at = Some(self.now);
        }
    }

    /// SIGCONT: a zombie if another took over meanwhile; it goes on where it was.
    pub(super) fn resume(&mut self, i: usize) -> Result<(), Violation> {
        let Some(at) = self.instances[i].stopped_at.take() else {
            return Ok(());
        };
        let zombie = self.holder != Some(i);
        self.stats.zombies += u64::from(zombie && self.now - at >= TIMEOUT);
        // It acts at once: a commit if one is due (the oldest zombie's first wish).
        self.relay_turn(i, false)
    }

    /// A zombie: the instance is stopped past the timeout and its walsender's, the other
    /// takes the slot over (a new epoch) and runs a while, then the zombie resumes.
    pub(super) fn zombie(&mut self, i: usize) -> Result<(), Violation> {
        if self.instances[i].session.is_none() {
            return Ok(());
        }
        self.stop(i);
        while self.holder == Some(i) {
            self.pass_time(200)?;
            self.expire();
        }
        let other = 1 - i;
        self.start(other)?;
        for _ in 0..self.rng.below(20) {
            let read = self.rng.chance(600);
            self.relay_turn(other, read)?;
        }
        self.resume(i)
    }

    /// An abortable error mid-transaction (a produce failed): the session aborts and the
    /// next resumes from the record.
    pub(super) fn fail_abortable(&mut self, i: usize) -> Result<(), Violation> {
        if self.instances[i].stopped_at.is_some() {
            return Ok(());
        }
        let Some(s) = self.instances[i].session.take() else {
            return Ok(());
        };
        self.end_session(
            i,
            s,
            Failure::Txn(TxnError::Abortable("a produce failed".into())),
        )
    }
}
