//! A clean shutdown's order (on SIGTERM): [`Shutdown`], the steps the relay's session and
//! the simulator both go through, fed what happened at each.
//!
//! 1. Read on only to finish the open transaction (its acked messages are then confirmed,
//!    not sent again after the restart), until no transaction is open or the deadline.
//! 2. Exactly-once: commit the Kafka transaction (whole or not at all; a commit that
//!    failed stops the shutdown with its error, nothing confirmed: the next start
//!    resumes from the last committed record). Otherwise: await the acks of what is in
//!    flight, until the deadline.
//! 3. A last look at the publication, so the final position can cover what was acked
//!    since the look before. A changed or dropped publication stops with that error; a
//!    look that failed or ran out of time leaves the slot at the look before.
//! 4. Confirm: the final position, in a status update.
//! 5. The final progress record, after the status update (not in exactly-once mode: the
//!    record went with the last commit), with what is left of the deadline but at least a
//!    moment: a record left older only records that the slot exists.
//!
//! One deadline covers it all, so an orchestrator's grace period sized from the shutdown
//! timeout is enough. The clock is the caller's, a monotonic [`Duration`] since any
//! origin.
//!
//! A bad row's stop (under `OUTBOXD_BAD_ROW_POLICY=stop`) goes through steps 2 to 4 too
//! ([`Shutdown::before_bad_row`]), so that [`BeforeBadRow`] can tell whether skipping the
//! bad transaction by hand skips nothing else.

use std::time::Duration;

use pgoutput::Lsn;

use crate::{Observe, SessionCore};

/// What the session has, and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownRules {
    /// Exactly-once mode: a Kafka transaction to commit; the record goes with it.
    pub exactly_once: bool,
    /// A publication is watched (some table is relayed): a last look is taken.
    pub watches_publication: bool,
    /// A progress record is kept.
    pub keeps_record: bool,
    /// From the request to the end of the last step but the record's.
    pub timeout: Duration,
    /// The final record's write gets at least this long, even past the deadline.
    pub final_record_min: Duration,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownStep {
    /// Read the stream on, to the open transaction's end.
    ReadOn,
    /// Exactly-once: commit the open Kafka transaction.
    FinishKafkaTxn,
    /// Await the acks of what is in flight, until the deadline.
    AwaitAcks,
    /// Look at the publication once more, with what is left of the deadline.
    LastLook,
    /// End with the error of the step before: the last look found the publication
    /// changed or dropped, or the Kafka commit failed. Nothing more is confirmed.
    Stop,
    /// Confirm the final position (advance, send the status update).
    Confirm,
    /// Write the final progress record, within [`Shutdown::record_time`].
    WriteRecord,
    /// The session ends.
    Done,
}

/// How the last look at the publication ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookEnd {
    /// It was answered (the cap raised if it counts).
    Answered,
    /// The publication changed or was dropped.
    Stopped,
    /// The query failed.
    Failed,
    /// Out of time.
    TimedOut,
}

/// What happened at the step asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Happened {
    /// A turn of the reading loop at `now`; `may_stop`: no transaction is open.
    Turn {
        now: Duration,
        may_stop: bool,
    },
    KafkaTxnCommitted,
    /// The Kafka commit failed (fenced, expired, aborted, or its outcome unknown); the
    /// transaction was aborted, or is left to the next start's `init_transactions`.
    KafkaTxnFailed,
    /// The acks were awaited (all of them or until the deadline).
    AcksAwaited,
    Looked(LookEnd),
    Confirmed,
    /// The final record was written, or failed, or ran out of time.
    RecordWritten,
}

/// One clean shutdown, from the request on.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rules: ShutdownRules,
    deadline: Duration,
    step: ShutdownStep,
    /// The last look gets at least this long, even past the deadline.
    look_min: Duration,
}

impl Shutdown {
    /// Requested at `now`.
    pub fn new(rules: ShutdownRules, now: Duration) -> Self {
        Shutdown {
            rules,
            deadline: now.saturating_add(rules.timeout),
            step: ShutdownStep::ReadOn,
            look_min: Duration::ZERO,
        }
    }

    /// A bad row's stop at `now`: the transaction it is in is never finished, so there is
    /// no reading on; what was sent before it is awaited, looked at and confirmed, and no
    /// record is written (the next start claims from the slot). Exactly-once has no such
    /// stop: its open Kafka transaction is aborted ([`BeforeBadRow::Aborted`]).
    pub fn before_bad_row(rules: ShutdownRules, now: Duration) -> Self {
        let rules = ShutdownRules {
            exactly_once: false,
            keeps_record: false,
            ..rules
        };
        Shutdown {
            rules,
            deadline: now.saturating_add(rules.timeout),
            step: ShutdownStep::AwaitAcks,
            // Acks that took the whole timeout would leave the look none, and the advance
            // would then never be offered: the process is stopping anyway.
            look_min: rules.final_record_min,
        }
    }

    /// What to do now.
    pub fn step(&self) -> ShutdownStep {
        self.step
    }

    /// When the steps up to the final record must be done.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// What is left of the deadline at `now`.
    pub fn left(&self, now: Duration) -> Duration {
        self.deadline.saturating_sub(now)
    }

    /// How long the last look may take at `now`.
    pub fn look_time(&self, now: Duration) -> Duration {
        self.left(now).max(self.look_min)
    }

    /// How long the final record's write may take at `now`: with Kafka down it would
    /// otherwise hold the shutdown for its own timeout.
    pub fn record_time(&self, now: Duration) -> Duration {
        self.left(now).max(self.rules.final_record_min)
    }

    /// Takes what happened at the step asked for; returns the next. Anything else leaves
    /// the step as it is.
    pub fn on(&mut self, happened: Happened) -> ShutdownStep {
        use ShutdownStep as S;
        self.step = match (self.step, happened) {
            (S::ReadOn, Happened::Turn { now, may_stop }) => {
                if may_stop || now >= self.deadline {
                    self.after_reading()
                } else {
                    S::ReadOn
                }
            }
            (S::FinishKafkaTxn, Happened::KafkaTxnCommitted)
            | (S::AwaitAcks, Happened::AcksAwaited) => self.after_acks(),
            // Confirming now would pass the slot over what the aborted transaction held.
            (S::FinishKafkaTxn, Happened::KafkaTxnFailed) => S::Stop,
            (S::LastLook, Happened::Looked(LookEnd::Stopped)) => S::Stop,
            // A failed look, or one out of time, leaves the slot at the look before: the
            // cap is where that one put it.
            (S::LastLook, Happened::Looked(_)) => S::Confirm,
            (S::Confirm, Happened::Confirmed) => {
                if self.rules.keeps_record && !self.rules.exactly_once {
                    S::WriteRecord
                } else {
                    S::Done
                }
            }
            (S::WriteRecord, Happened::RecordWritten) => S::Done,
            (step, _) => step,
        };
        self.step
    }

    fn after_reading(&self) -> ShutdownStep {
        if self.rules.exactly_once {
            ShutdownStep::FinishKafkaTxn
        } else {
            ShutdownStep::AwaitAcks
        }
    }

    fn after_acks(&self) -> ShutdownStep {
        if self.rules.watches_publication {
            ShutdownStep::LastLook
        } else {
            ShutdownStep::Confirm
        }
    }
}

/// Where the transactions before a bad row's stand once its stop went through
/// [`Shutdown::before_bad_row`]. Advancing the slot past the bad transaction by hand skips
/// every transaction the slot has not confirmed too, so that way is offered only when they
/// are all in Kafka and confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeBadRow {
    /// Every one acknowledged by Kafka and confirmed.
    Delivered,
    /// Not all acknowledged in time (Kafka slow, a delivery failed, a replay unproven), or
    /// no look at the publication vouched for them: the slot is confirmed at `confirmed`.
    Unacked { confirmed: Lsn },
    /// Exactly-once: the Kafka transaction holding them was aborted.
    Aborted,
}

impl<O: Observe> SessionCore<O> {
    /// Judged after a bad row's stop was confirmed (see [`BeforeBadRow`]).
    pub fn before_bad_row(&self) -> BeforeBadRow {
        let confirmed = self.confirmed();
        if self.ledger().acked_up_to_open() && confirmed >= self.ledger().watermark() {
            BeforeBadRow::Delivered
        } else {
            BeforeBadRow::Unacked { confirmed }
        }
    }
}

#[cfg(test)]
#[path = "shutdown_tests.rs"]
mod tests;
