//! SIGTERM in the exactly-once schedules: the relay's clean shutdown, stepped through
//! `outbox_core::Shutdown` with `exactly_once` as the relay's `session/shutdown.rs` does.
//! The instance reads on to the open PostgreSQL transaction's end or the deadline
//! (committing when due, as any turn), commits its Kafka transaction whole or not at all,
//! the progress record inside it (the commit may be fenced, expire, fail or lose its answer
//! as any commit), looks at the publication once more, confirms, and its process exits;
//! the next process starts from the slot. A commit that failed aborts the transaction and
//! stops the shutdown with its error, nothing confirmed.

use std::time::Duration;

use outbox_core::{Happened, LookEnd, Shutdown, ShutdownRules, ShutdownStep, TxnError};

use super::{Eos, Failure, Session, TIMEOUT};
use crate::model::PARTITIONS;
use crate::Violation;

/// A SIGTERM one step in this many, drawn from a stream of its own (with the instance and
/// every draw of the shutdown but its turns'), so a schedule without one keeps its draws.
pub(super) const EVERY: u64 = 200;

impl Eos {
    /// SIGTERM to instance `i`: a stopped process handles it only once resumed (not
    /// modelled), one without a session (a standby) exits at once.
    pub(super) fn sigterm(&mut self, i: usize) -> Result<(), Violation> {
        if self.instances[i].stopped_at.is_some() {
            return Ok(());
        }
        if self.instances[i].session.is_none() {
            self.exit(i);
            return Ok(());
        }
        self.stats.shutdowns += 1;
        // Now and then shorter than a transaction takes to read: the commit is then split
        // inside it, its record naming the leading rows delivered.
        let timeout = match self.sigterms.chance(200) {
            true => Duration::from_millis(1 + self.sigterms.below(40)),
            false => 2 * TIMEOUT,
        };
        let rules = ShutdownRules {
            exactly_once: true,
            watches_publication: true,
            keeps_record: true,
            timeout,
            final_record_min: Duration::from_millis(100),
        };
        let mut stop = Shutdown::new(rules, self.now);
        if self.trace {
            eprintln!("  instance {i}: SIGTERM, deadline {:?}", stop.deadline());
        }
        // Reading on: turns of the relay's loop, acks taken at once.
        loop {
            let Some(s) = self.instances[i].session.as_ref() else {
                // The session ended with an error: the process exits.
                self.exit(i);
                return Ok(());
            };
            let turn = Happened::Turn {
                now: self.now,
                may_stop: s.life.core.may_stop(),
            };
            if stop.on(turn) != ShutdownStep::ReadOn {
                break;
            }
            let read = self.sigterms.chance(600);
            self.relay_turn(i, read)?;
            self.expire();
        }
        let Some(s) = self.instances[i].session.take() else {
            self.exit(i);
            return Ok(());
        };
        self.drain(i, s, stop)
    }

    /// The steps after reading, as `session/shutdown.rs`'s `drain`.
    fn drain(&mut self, i: usize, mut s: Session, mut stop: Shutdown) -> Result<(), Violation> {
        // The error `ShutdownStep::Stop` ends with.
        let mut failed: Option<TxnError> = None;
        loop {
            let happened = match stop.step() {
                ShutdownStep::FinishKafkaTxn => match self.finish_kafka_txn(i, &mut s) {
                    Ok(()) => Happened::KafkaTxnCommitted,
                    Err(e) => {
                        failed = Some(self.abort_open(i, &mut s, e)?);
                        Happened::KafkaTxnFailed
                    }
                },
                // Not asked for in exactly-once mode: the relay takes every ack.
                ShutdownStep::AwaitAcks => {
                    for p in 0..PARTITIONS {
                        while !s.life.queues[p].is_empty() {
                            if let Err(e) = self.ack_partition(&mut s, p) {
                                return self.failed(i, s, e);
                            }
                        }
                    }
                    Happened::AcksAwaited
                }
                // The publication never changes here: a look that answers raises the cap
                // to what is acked.
                ShutdownStep::LastLook => {
                    let end = if stop.left(self.now).is_zero() {
                        LookEnd::TimedOut
                    } else if self.sigterms.chance(100) {
                        LookEnd::Failed
                    } else {
                        let acked = s.life.core.watermark();
                        s.life.core.raise_cap(acked);
                        LookEnd::Answered
                    };
                    Happened::Looked(end)
                }
                ShutdownStep::Confirm => {
                    if s.stream_lost || self.holder != Some(i) {
                        let why = "the final status update failed: the walsender went away";
                        return self.failed(i, s, Failure::Session(why.into()));
                    }
                    s.life.core.advance();
                    if let Some(w) = s.txn.confirmable(s.life.core.confirmed()) {
                        s.flush = w;
                    }
                    self.confirm(s.flush)?;
                    Happened::Confirmed
                }
                // Never in exactly-once mode: the relay's final write, outside any
                // transaction.
                ShutdownStep::WriteRecord => {
                    let claim = s.life.core.claim().0;
                    self.broker.write_record(claim, self.server_clock());
                    Happened::RecordWritten
                }
                ShutdownStep::Stop => {
                    if let Some(e) = failed.take() {
                        self.judged(i, &s, e)?;
                    }
                    self.exit(i);
                    return Ok(());
                }
                ShutdownStep::ReadOn | ShutdownStep::Done => {
                    self.stopped_cleanly(i, &mut s)?;
                    self.exit(i);
                    return Ok(());
                }
            };
            stop.on(happened);
        }
    }

    /// The commit of `session/kafka_txn.rs`, at a shutdown: now and then the broker is slow
    /// (the transaction ages meanwhile, and may expire) or a produce fails.
    fn finish_kafka_txn(&mut self, i: usize, s: &mut Session) -> Result<(), Failure> {
        if self.sigterms.chance(100) {
            let most = u64::try_from(TIMEOUT.as_millis()).unwrap_or(1_000);
            self.now += Duration::from_millis(1 + self.sigterms.below(most));
            self.expire();
        }
        if s.txn.is_open() && self.sigterms.chance(50) {
            return Err(Failure::Txn(TxnError::Abortable(
                "a produce failed at the shutdown's commit".into(),
            )));
        }
        self.commit(i, s)
    }

    /// The session failed at a shutdown's step: aborted, judged, and the process exits.
    fn failed(&mut self, i: usize, s: Session, e: Failure) -> Result<(), Violation> {
        self.end_session(i, s, e)?;
        self.exit(i);
        Ok(())
    }

    /// A clean shutdown's promise (README: it finishes the open transaction and sends the
    /// final position): nothing left open to abort, and the slot at what it committed, so
    /// the next process reads none of it again.
    fn stopped_cleanly(&mut self, i: usize, s: &mut Session) -> Result<(), Violation> {
        self.stats.clean_stops += 1;
        if s.txn.is_open() {
            return Err(Violation(format!(
                "exactly-once: instance {i} shut down cleanly with its Kafka transaction open: what it read since its last commit is aborted and read again"
            )));
        }
        let committed = s.life.core.confirmed();
        if self.cluster.confirmed < committed {
            return Err(Violation(format!(
                "exactly-once: instance {i} shut down cleanly with the slot at {:?}, short of {committed:?} that it committed",
                self.cluster.confirmed
            )));
        }
        Ok(())
    }

    /// The process exits (its stream closed, so the walsender ends): the next one, which
    /// its supervisor starts, remembers nothing.
    fn exit(&mut self, i: usize) {
        let inst = &mut self.instances[i];
        inst.session = None;
        inst.new_process();
        if self.holder == Some(i) {
            self.holder = None;
        }
    }
}
