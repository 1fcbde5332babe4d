//! The exactly-once mode's Kafka transactions (docs/transactional-mode.md): when one is
//! due, its commit (every ack, a look at the publication, the progress record last, then
//! `EndTxn`, and only then the position to PostgreSQL), its abort, and telling a fence
//! by another instance from the broker's own abort of a transaction open too long.

use std::time::{Duration, Instant};

use super::{bounded, channel_closed, Session, ABORT_TIMEOUT, COMMIT_ATTEMPTS, PROGRESS_TICKET};
use crate::kafka::TxnError;
use crate::pipeline::error::RelayError;
use crate::telemetry::TxnAbortCause;

/// The exactly-once mode's Kafka transaction. Nothing is confirmed to PostgreSQL while
/// one is open: the slot moves only after `commit_transaction` returned OK.
pub(super) struct KafkaTxn {
    pub(super) settings: crate::kafka::Transactions,
    /// Commit even inside a PostgreSQL transaction once open this long: half of
    /// `transaction.timeout.ms`, after which the broker would abort it.
    pub(super) split_after: Duration,
    pub(super) timeout: Duration,
    /// When the open transaction began; `None`: none is open.
    pub(super) open_since: Option<Instant>,
    /// When the last commit began (see [`commit_due_at`]).
    pub(super) last_commit: Option<Instant>,
    pub(super) events: usize,
    /// The position last passed on to the server.
    pub(super) confirmed: pgoutput::Lsn,
    /// How long the transaction the session aborted after failing had been open: the
    /// broker expires only transactions open `timeout` or longer (see `judge_fence`).
    pub(super) age_at_abort: Option<Duration>,
}

impl KafkaTxn {
    /// The open transaction's last moment to have everything of it acknowledged, or it is
    /// aborted: `transaction.timeout.ms` after it opened, less a tenth for the commit.
    fn acks_deadline(&self) -> Option<Instant> {
        self.open_since
            .map(|since| acks_deadline(since, self.timeout))
    }
}

/// [`KafkaTxn::acks_deadline`] of a transaction opened at `since`. The broker's clock
/// starts later (at its first `AddPartitionsToTxn`); the tenth left is for the look, the
/// progress record and `EndTxn`, so that outboxd aborts before the broker does (which
/// would bump the producer's epoch).
fn acks_deadline(since: Instant, timeout: Duration) -> Instant {
    since + timeout - timeout / 10
}

/// When a transaction opened at `since` is due to commit by time, at a PostgreSQL commit:
/// `every` after the previous commit began, not after this transaction opened. Events
/// that arrive during a commit open the next transaction only once it ends, and would
/// otherwise wait that commit and a whole interval. Open at least half an interval,
/// so that commits slower than `every` do not turn into a string of tiny ones.
fn commit_due_at(since: Instant, last_commit: Option<Instant>, every: Duration) -> Instant {
    let floor = since + every / 2;
    match last_commit {
        Some(last) => (last + every).max(floor),
        None => since + every,
    }
}

impl Session<'_> {
    /// Takes delivery reports until the progress record's (true) or `deadline` (false);
    /// its failure is the error.
    pub(super) async fn await_progress_ack(
        &mut self,
        deadline: tokio::time::Instant,
    ) -> Result<bool, RelayError> {
        loop {
            tokio::select! {
                d = self.deliveries.recv() => {
                    let d = d.ok_or_else(channel_closed)?;
                    let progress = d.ticket == PROGRESS_TICKET;
                    self.on_delivery(d)?;
                    if progress {
                        return Ok(true);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Ok(false),
            }
        }
    }

    /// When the open Kafka transaction is due to commit by time (then at the next
    /// PostgreSQL commit, or inside a transaction that long).
    pub(super) fn commit_at(&self) -> Option<Instant> {
        let txn = self.txn.as_ref()?;
        let since = txn.open_since?;
        // Never later than half the timeout after it opened, between PostgreSQL
        // transactions too: an interval near `transaction.timeout.ms` would otherwise
        // leave no time for the acks, and every commit would be aborted and replayed.
        let split = since + txn.split_after;
        Some(match self.core.in_transaction() {
            false => commit_due_at(since, txn.last_commit, txn.settings.commit_every).min(split),
            true => split,
        })
    }

    /// Whether to commit now: at a PostgreSQL commit after the interval or event count,
    /// or anywhere once the transaction nears `transaction.timeout.ms` (a PostgreSQL
    /// transaction split over Kafka transactions, each ending with a partial record).
    pub(super) fn commit_due(&self) -> bool {
        let by_count = || {
            self.txn.as_ref().is_some_and(|txn| {
                txn.open_since.is_some() && txn.events >= txn.settings.commit_events
            }) && !self.core.in_transaction()
        };
        self.commit_at().is_some_and(|at| Instant::now() >= at) || by_count()
    }

    /// Commits the open Kafka transaction, its last record the progress record of what it
    /// holds, then confirms that to PostgreSQL.
    pub(super) async fn commit_kafka_txn(&mut self) -> Result<(), RelayError> {
        let Some((timeout, deadline)) = self
            .txn
            .as_ref()
            .and_then(|t| Some((t.timeout, t.acks_deadline()?)))
        else {
            return Ok(());
        };
        // What is left of transaction.timeout.ms since the transaction opened, not all of
        // it from now: past it the broker aborts the transaction itself.
        let deadline = tokio::time::Instant::from_std(deadline);
        let began = Instant::now();
        let split = self.core.in_transaction();
        if let Some(txn) = self.txn.as_mut() {
            txn.last_commit = Some(began);
        }
        let too_slow = |what: &str| {
            RelayError::Transaction(TxnError::Abortable(format!(
                "{what} within transaction.timeout.ms ({timeout:?}, less a tenth for the commit) of the Kafka transaction's start: raise OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS, or find why Kafka acknowledges slowly"
            )))
        };
        // The record claims what is acked: every report first.
        if !self.await_acks(deadline, false).await? {
            return Err(too_slow(
                "the transaction's messages were not all acknowledged",
            ));
        }
        let acked = Instant::now();
        // The record carries the session's look: never one not yet compared with the
        // record's (it would bury that look, and a change made while outboxd was stopped).
        while self.publication.as_ref().is_some_and(|w| !w.compared()) {
            self.compare_with_record()?;
            if self.publication.as_ref().is_some_and(|w| w.compared()) {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(too_slow(
                    "the progress record was not read to compare the publication with it",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A look now lets the record claim everything acked (the confirmed position
        // waits for a look that began after the ack).
        if self.publication.is_some() {
            self.watch_publication().await?;
        }
        let looked = Instant::now();
        self.core.advance();
        let record = self.progress_record();
        let Some(p) = self.progress.as_ref() else {
            return Err(RelayError::Protocol(
                "exactly-once delivery without a progress topic".into(),
            ));
        };
        p.store
            .produce_in_transaction(&self.producer, &p.identity, &record, PROGRESS_TICKET)
            .map_err(RelayError::Send)?;
        // Its report first, as `commit_transaction` asks (or the commit can take 100 ms
        // longer), and its failure is this session's error.
        if !self.await_progress_ack(deadline).await? {
            return Err(too_slow("the progress record was not acknowledged"));
        }
        let recorded = Instant::now();
        let mut attempt = 1;
        loop {
            match self.producer.commit_transaction(timeout).await {
                Ok(()) => break,
                // Never aborted: the commit may have happened.
                Err(TxnError::Retriable(why)) if attempt < COMMIT_ATTEMPTS => {
                    attempt += 1;
                    tracing::warn!(attempt, "committing the Kafka transaction again: {why}");
                }
                Err(e) => return Err(RelayError::Transaction(e)),
            }
        }
        self.obs.kafka_txn_committed(began.elapsed(), split);
        if let Some(txn) = self.txn.as_mut() {
            // Where a commit's time goes (what this mode's latency is made of).
            tracing::debug!(
                open = ?txn.open_since.map(|since| began - since),
                events = txn.events,
                acks = ?(acked - began),
                look = ?(looked - acked),
                record = ?(recorded - looked),
                end_txn = ?recorded.elapsed(),
                "committed the Kafka transaction"
            );
            txn.open_since = None;
            txn.events = 0;
        }
        self.take_reports()?;
        self.obs.progress_recorded(record.confirmed_lsn());
        self.advance();
        if attempt > 1 {
            // librdkafka has no KIP-890 (transactions v2): after an EndTxn that timed out,
            // a late request of the old transaction could land in the next one.
            return Err(RelayError::Transaction(TxnError::Retriable(
                "a Kafka commit had to be retried: starting over with a new producer".into(),
            )));
        }
        Ok(())
    }

    /// After the session failed: aborts an open Kafka transaction, so its records are
    /// never visible to read_committed consumers and the next start need not wait for it.
    /// A fenced producer makes that the session's error: another instance took over.
    pub(in crate::pipeline) async fn abort_open_txn(&mut self, e: RelayError) -> RelayError {
        if self.txn.as_ref().is_none_or(|t| t.open_since.is_none()) {
            return e;
        }
        if let Some(txn) = self.txn.as_mut() {
            txn.age_at_abort = txn.open_since.take().map(|since| since.elapsed());
        }
        // Not counted when fenced: the process exits, or `judge_fence` finds it expired.
        let cause = match e {
            RelayError::Transaction(TxnError::Abortable(_)) => Some(TxnAbortCause::Abortable),
            RelayError::Transaction(TxnError::Fenced(_)) => None,
            _ => Some(TxnAbortCause::Restart),
        };
        let count = |obs: &super::Observer| {
            if let Some(cause) = cause {
                obs.kafka_txn_aborted(cause);
            }
        };
        match self.producer.abort_transaction(ABORT_TIMEOUT).await {
            Ok(()) => {
                count(self.obs);
                e
            }
            Err(fatal @ (TxnError::Fenced(_) | TxnError::Fatal(_))) => {
                tracing::error!("{e}");
                RelayError::Transaction(fatal)
            }
            Err(why) => {
                // Aborted all the same, by the next start's `init_transactions`.
                count(self.obs);
                tracing::warn!("aborting the Kafka transaction: {why}; the next start aborts it");
                e
            }
        }
    }

    /// Tells a fenced producer from one whose transaction the broker aborted: both bump
    /// the epoch, and librdkafka reports both as fenced. Only an instance holding the slot
    /// calls `init_transactions`, so while `walsender` (this session's) still holds it, no
    /// other instance of this server can have: the transaction expired, and the next
    /// session resumes with a new producer. But an instance on another server of the same
    /// system identifier (a promoted standby while the old primary still runs) shares the
    /// transactional.id, so expiry also needs its evidence: the aborted transaction had
    /// been open at least `transaction.timeout.ms`, the least the broker expires. Held by
    /// no walsender (this one ended) counts as this one's. Held by another walsender,
    /// younger, or in doubt: fenced.
    pub(in crate::pipeline) async fn judge_fence(
        &self,
        e: RelayError,
        walsender: Option<i32>,
    ) -> RelayError {
        let RelayError::Transaction(TxnError::Fenced(why)) = e else {
            return e;
        };
        let old_enough = self
            .txn
            .as_ref()
            .is_some_and(|t| t.age_at_abort.is_some_and(|age| age >= t.timeout));
        if !old_enough {
            return RelayError::Transaction(TxnError::Fenced(why));
        }
        let holder = match walsender {
            Some(_) => {
                bounded("reading which walsender holds the slot", async {
                    crate::pipeline::slot::holder(&self.sql, &self.cfg.slot).await
                })
                .await
            }
            None => Ok(None),
        };
        // Held by nobody: PostgreSQL ended this session's walsender too (stopped past
        // wal_sender_timeout). An instance of this server that took over since and left
        // has recorded what it delivered, and the next session reads that record with a
        // new epoch, as after any restart.
        let ours = match holder {
            Ok(Some(pid)) => Some(pid) == walsender,
            Ok(None) => walsender.is_some(),
            Err(_) => false,
        };
        if ours {
            self.obs.kafka_txn_aborted(TxnAbortCause::Expired);
            RelayError::Transaction(TxnError::Expired(why))
        } else {
            RelayError::Transaction(TxnError::Fenced(why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_deadline_counts_from_the_transactions_start() {
        let since = Instant::now();
        let timeout = Duration::from_secs(60);
        assert_eq!(
            acks_deadline(since, timeout),
            since + Duration::from_secs(54)
        );
        // Not from the commit: a transaction open 50 s has 4 s left, not 54.
        let commit = since + Duration::from_secs(50);
        assert_eq!(
            acks_deadline(since, timeout).saturating_duration_since(commit),
            Duration::from_secs(4)
        );
        let short = Duration::from_millis(1_000);
        assert_eq!(
            acks_deadline(since, short),
            since + Duration::from_millis(900)
        );
    }

    #[test]
    fn commits_keep_their_cadence() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let every = ms(100);
        // The session's first transaction: an interval after it opened.
        assert_eq!(commit_due_at(t, None, every), t + ms(100));
        // Opened 20 ms after the last commit began (when it ended): 80 ms open, so
        // events that came during that commit wait no longer than an interval.
        assert_eq!(commit_due_at(t + ms(20), Some(t), every), t + ms(100));
        // A commit slower than half an interval: the transaction stays open half of one.
        assert_eq!(commit_due_at(t + ms(70), Some(t), every), t + ms(120));
        // After a quiet spell: half an interval after it opened.
        assert_eq!(commit_due_at(t + ms(5_000), Some(t), every), t + ms(5_050));
    }
}
