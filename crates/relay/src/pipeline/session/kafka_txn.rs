//! The exactly-once mode's Kafka transactions (docs/transactional-mode.md): when one is
//! due, its commit (every ack, a look at the publication, the progress record last, then
//! `EndTxn`, and only then the position to PostgreSQL), its abort, and telling a fence
//! by another instance from the broker's own abort of a transaction open too long.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{CommitStep, KafkaTxnCore, TxnError};

use super::{bounded, channel_closed, Session, ABORT_TIMEOUT, PROGRESS_TICKET};
use crate::pipeline::error::RelayError;
use crate::telemetry::TxnAbortCause;

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
        let at = self.txn.as_ref()?.commit_at(self.core.in_transaction())?;
        Some(self.instant(at).into_std())
    }

    /// Whether to commit now (see `KafkaTxnCore::commit_due`).
    pub(super) fn commit_due(&self) -> bool {
        let now = self.since_start();
        self.txn
            .as_ref()
            .is_some_and(|txn| txn.commit_due(now, self.core.in_transaction()))
    }

    /// Commits the open Kafka transaction, its last record the progress record of what it
    /// holds, then confirms that to PostgreSQL. While shutting down, all of it within
    /// `stop_by`, the shutdown's deadline: a commit that cannot make it fails, and its
    /// transaction is aborted (nothing confirmed) rather than hold the shutdown past the
    /// grace period an orchestrator gives it.
    pub(super) async fn commit_kafka_txn(
        &mut self,
        stop_by: Option<tokio::time::Instant>,
    ) -> Result<(), RelayError> {
        let now = self.since_start();
        let Some((timeout, deadline, opened)) = self.txn.as_mut().and_then(|t| {
            let opened = t.open_for(now);
            let deadline = t.begin_commit(now)?;
            Some((t.rules().timeout, deadline, opened))
        }) else {
            return Ok(());
        };
        // What is left of transaction.timeout.ms since the transaction opened, not all of
        // it from now: past it the broker aborts the transaction itself.
        let txn_deadline = self.instant(deadline);
        let deadline = stop_by.map_or(txn_deadline, |s| s.min(txn_deadline));
        let began = Instant::now();
        let split = self.core.in_transaction();
        let too_slow = |what: &str| {
            RelayError::Transaction(TxnError::Abortable(match deadline < txn_deadline {
                true => format!(
                    "{what} before the shutdown's deadline (OUTBOXD_SHUTDOWN_TIMEOUT_MS): the \
                     Kafka transaction is aborted and the next start sends it again"
                ),
                false => format!(
                    "{what} within transaction.timeout.ms ({timeout:?}, less a tenth for the commit) of the Kafka transaction's start: raise OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS, or find why Kafka acknowledges slowly"
                ),
            }))
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
            self.compare_with_record().await?;
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
        if let Some(t) = self.txn.as_mut() {
            t.recording(record.claim.clone());
        }
        let Some(p) = self.progress.as_ref() else {
            return Err(RelayError::Protocol(
                "exactly-once delivery without a progress topic".into(),
            ));
        };
        p.store
            .produce_in_transaction(&self.producer, &p.identity, &record, PROGRESS_TICKET)?;
        // Its report first, as `commit_transaction` asks (or the commit can take 100 ms
        // longer), and its failure is this session's error.
        if !self.await_progress_ack(deadline).await? {
            return Err(too_slow("the progress record was not acknowledged"));
        }
        self.check_left_open(deadline).await?;
        if let Some(t) = self.txn.as_mut() {
            t.first_writes().commit_asked();
        }
        let recorded = Instant::now();
        let mut attempt = 1;
        loop {
            // While shutting down, what is left (a moment at least, for EndTxn's answer).
            let timeout = within_shutdown(timeout, stop_by);
            let Err(e) = self.producer.commit_transaction(timeout).await else {
                break;
            };
            let Some(txn) = self.txn.as_ref() else {
                return Err(e.into());
            };
            let why = e.to_string();
            match txn.after_commit_error(e, attempt) {
                CommitStep::Again => {
                    attempt += 1;
                    tracing::warn!(attempt, "committing the Kafka transaction again: {why}");
                }
                CommitStep::Fail(e) => return Err(e.into()),
            }
        }
        self.obs.kafka_txn_committed(began.elapsed(), split);
        // Where a commit's time goes (what this mode's latency is made of).
        tracing::debug!(
            open = ?opened.map(|(open, _)| open),
            events = opened.map_or(0, |(_, events)| events),
            acks = ?(acked - began),
            look = ?(looked - acked),
            record = ?(recorded - looked),
            end_txn = ?recorded.elapsed(),
            "committed the Kafka transaction"
        );
        let now = self.since_start();
        let committed = self
            .txn
            .as_mut()
            .map_or(Ok(()), |t| t.committed(now, attempt));
        self.take_reports()?;
        self.obs.progress_recorded(record.confirmed_lsn());
        self.advance();
        Ok(committed?)
    }

    /// Before the session's first commit into a partition: what is open there below this
    /// transaction's records (`outbox_core::left_open`). A transaction this process
    /// aborted is closed by aborting this one; anything else is committed in doubt.
    async fn check_left_open(&mut self, deadline: tokio::time::Instant) -> Result<(), RelayError> {
        let Some(txn) = self.txn.as_mut() else {
            return Ok(());
        };
        let parts = txn.first_writes().to_check();
        if parts.is_empty() {
            return Ok(());
        }
        let reader = match &self.stable_offsets {
            Some(r) => Arc::clone(r),
            None => {
                let r = Arc::new(crate::kafka::StableOffsets::new(&self.cfg.producer)?);
                self.stable_offsets = Some(Arc::clone(&r));
                r
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let read = Arc::clone(&reader);
        let stable = tokio::task::spawn_blocking(move || read.read(&parts, left))
            .await
            .map_err(|e| RelayError::Protocol(format!("reading last stable offsets: {e}")))?;
        let Some(txn) = self.txn.as_mut() else {
            return Ok(());
        };
        // Where something else is open below ours: is it a copy of our first records?
        // Not after publishing in doubt, or with another writer of the record's key.
        let foreign = self
            .progress
            .as_ref()
            .is_some_and(|p| p.store.foreign_writer());
        if self.core.observer().doubted || foreign {
            txn.first_writes().allow_copies(false);
        }
        let wanted = txn.first_writes().regions_to_read(&stable);
        let regions = match wanted.is_empty() {
            true => outbox_core::Regions::new(),
            false => {
                // Half of what is left at most: the rest is for the commit.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now()) / 2;
                tokio::task::spawn_blocking(move || reader.read_regions(&wanted, left))
                    .await
                    .map_err(|e| RelayError::Protocol(format!("reading records left open: {e}")))?
            }
        };
        let Some(txn) = self.txn.as_mut() else {
            return Ok(());
        };
        let doubts = txn
            .first_writes()
            .judge_with(&stable, &regions)
            .map_err(|why| RelayError::Transaction(TxnError::LeftOpen(why)))?;
        for d in doubts {
            self.obs.kafka_txn_in_doubt();
            let (topic, partition) = &d.at;
            match d.open_from {
                Some(open_from) => tracing::info!(
                    topic = %topic,
                    partition,
                    last_stable_offset = open_from,
                    first_of_ours = d.ours_from,
                    "a transaction older than this one is open in this partition, not one this process aborted: committing in doubt (were it one of this relay's that Kafka left open after an abort, its events are read twice; another producer's is not touched)"
                ),
                None => tracing::info!(
                    topic = %topic,
                    partition,
                    "the partition's last stable offset was not read, and this process aborted nothing there: committing in doubt"
                ),
            }
        }
        Ok(())
    }

    /// After the session failed: aborts an open Kafka transaction, so its records are
    /// never visible to read_committed consumers and the next start need not wait for it.
    /// A fenced producer makes that the session's error: another instance took over.
    /// Within `ABORT_TIMEOUT`, or `stop_by` while shutting down (a moment at least): an
    /// abort not answered is left to the next start's `init_transactions`.
    pub(in crate::pipeline) async fn abort_open_txn(
        &mut self,
        e: RelayError,
        stop_by: Option<tokio::time::Instant>,
    ) -> RelayError {
        let now = self.since_start();
        if !self.txn.as_mut().is_some_and(|t| t.aborting(now)) {
            return e;
        }
        let timeout = within_shutdown(ABORT_TIMEOUT, stop_by);
        let abort = self.producer.abort_transaction(timeout).await;
        let now = self.since_start();
        if let Some(t) = self.txn.as_mut() {
            t.abort_answered(now);
        }
        if let Err(why) = &abort {
            tracing::warn!(
                "aborting the Kafka transaction after {e}: {why}; the next start aborts it"
            );
        }
        // Not counted when fenced: the process exits, or `judge_fence` finds it expired.
        // Any other failed abort counts: the next start's `init_transactions` aborts it
        // all the same.
        let cause = match e {
            RelayError::Transaction(TxnError::Abortable(_) | TxnError::LeftOpen(_)) => {
                Some(TxnAbortCause::Abortable)
            }
            RelayError::Transaction(TxnError::Fenced(_)) => None,
            _ => Some(TxnAbortCause::Restart),
        };
        if let Some(cause) = cause.filter(|_| !matches!(abort, Err(TxnError::Fenced(_)))) {
            self.obs.kafka_txn_aborted(cause);
        }
        KafkaTxnCore::after_abort(e, abort)
    }

    /// Tells a fenced producer from one whose transaction the broker aborted
    /// (`KafkaTxnCore::judge_fence`), asking PostgreSQL which walsender holds the slot:
    /// this session's, or none (this one ended too), is this session's.
    pub(in crate::pipeline) async fn judge_fence(
        &self,
        e: RelayError,
        walsender: Option<i32>,
    ) -> RelayError {
        let RelayError::Transaction(TxnError::Fenced(why)) = e else {
            return e;
        };
        let Some(txn) = self.txn.as_ref().filter(|t| t.may_have_expired()) else {
            return TxnError::Fenced(why).into();
        };
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
        let judged = txn.judge_fence(why, ours);
        if matches!(judged, TxnError::Expired(_)) {
            self.obs.kafka_txn_aborted(TxnAbortCause::Expired);
        }
        judged.into()
    }
}

/// `timeout`, cut to what is left until `stop_by` while shutting down: a second at least,
/// so a broker that answers at once is still heard.
fn within_shutdown(timeout: Duration, stop_by: Option<tokio::time::Instant>) -> Duration {
    stop_by.map_or(timeout, |s| {
        s.saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_secs(1))
            .min(timeout)
    })
}
