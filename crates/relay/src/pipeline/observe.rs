//! What the pipeline reports to metrics and readiness, in the pipeline's own terms.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use outbox_core::RowErrorKind;
use pgoutput::Lsn;

use super::slot::SlotStats;
use crate::telemetry::{Health, Metrics, SlotWalStatus, TxnAbortCause};

#[derive(Clone)]
pub struct Observer {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl Observer {
    pub fn new(metrics: Arc<Metrics>, health: Arc<Health>) -> Self {
        Observer { metrics, health }
    }

    pub(super) fn confirmed(&self, lsn: Lsn) {
        self.metrics.set_confirmed_lsn(lsn.0);
        self.health.record_progress(Instant::now());
    }

    pub(super) fn received(&self, wal_end: Lsn) {
        if wal_end > Lsn::ZERO {
            self.metrics.set_received_lsn(wal_end.0);
        }
    }

    /// Everything before `lsn` is acknowledged by Kafka.
    pub(super) fn acked(&self, lsn: Lsn) {
        self.metrics.set_acked_lsn(lsn.0);
    }

    pub(super) fn server_wal_end(&self, lsn: Lsn) {
        self.metrics.set_server_wal_end_lsn(lsn.0);
    }

    /// The session's stream carries binary column values.
    pub(super) fn pgoutput_binary(&self, binary: bool) {
        self.metrics.set_pgoutput_binary(binary);
    }

    /// `delta` more standby status updates were sent.
    pub(super) fn status_updates_sent(&self, delta: u64) {
        for _ in 0..delta {
            self.metrics.inc_status_updates_sent();
        }
    }

    pub(super) fn in_flight(&self, messages: usize, bytes: usize) {
        self.metrics.set_in_flight(
            u64::try_from(messages).unwrap_or(u64::MAX),
            u64::try_from(bytes).unwrap_or(u64::MAX),
        );
    }

    /// Oldest unacked commit time; also tells readiness whether work is outstanding.
    pub(super) fn oldest_unacked(&self, commit_unix_micros: Option<i64>) {
        let since = commit_unix_micros
            .and_then(|m| u64::try_from(m).ok())
            .map(|m| UNIX_EPOCH + Duration::from_micros(m));
        self.metrics.set_oldest_unacked(since);
        self.health.set_unacked(since.is_some(), Instant::now());
    }

    /// One event acked by Kafka at `acked_unix_micros`.
    pub(super) fn published(&self, commit_unix_micros: i64, acked_unix_micros: i64) {
        self.metrics.add_events_published(1);
        let latency =
            u64::try_from(acked_unix_micros.saturating_sub(commit_unix_micros)).unwrap_or(0);
        self.metrics
            .observe_commit_to_ack(Duration::from_micros(latency));
    }

    /// A bad row's dead-letter record was queued (under `stop` nothing is counted: the
    /// row was not dead-lettered).
    pub(super) fn dead_lettered(&self, kind: RowErrorKind) {
        self.metrics.inc_dead_lettered(kind);
    }

    /// `n` inserts of a relation that is not the outbox; true the first time it is seen.
    pub(super) fn ignored_rows(&self, relation: &str, n: u64) -> bool {
        self.metrics.add_ignored_rows(relation, n)
    }

    /// The broker acknowledged a progress record holding `lsn`.
    pub(super) fn progress_recorded(&self, lsn: Lsn) {
        self.metrics.set_progress_recorded_lsn(lsn.0);
    }

    /// A progress record write failed: the record stays older (more replays, no loss).
    pub(super) fn progress_write_failed(&self) {
        self.metrics.inc_progress_write_errors();
    }

    /// The progress record could not be read at a stream start: replays are published again.
    pub(super) fn progress_record_unread(&self) {
        self.metrics.inc_progress_record_unread();
    }

    /// The slot's record is not one outboxd writes (see [`crate::kafka::ProgressError::Unreadable`]).
    pub(super) fn progress_record_invalid(&self) {
        self.metrics.inc_progress_record_invalid();
    }

    /// A look at the publication could not count: see `PublicationLook::settled`.
    pub(super) fn publication_look_unsettled(&self) {
        self.metrics.inc_publication_looks_unsettled();
    }

    /// A round of the periodic catalog checks was done.
    pub(super) fn catalog_checked(&self) {
        self.metrics.inc_catalog_checks();
    }

    /// A periodic catalog check gave up waiting for a table's lock.
    pub(super) fn catalog_check_deferred(&self) {
        self.metrics.inc_catalog_checks_deferred();
    }

    /// A replayed event Kafka already had was not published again.
    pub(super) fn replay_doubt(&self, reason: outbox_core::Doubt) {
        self.metrics.inc_replay_doubt(reason);
    }

    pub(super) fn progress_foreign_write(&self) {
        self.metrics.inc_progress_foreign_writes();
    }

    pub(super) fn replay_held(&self, n: usize) {
        self.metrics.set_replay_held_messages(n);
    }

    pub(super) fn skipped_as_delivered(&self) {
        self.metrics.inc_events_skipped();
    }

    pub(super) fn kafka_brokers_up(&self, n: usize) {
        self.metrics
            .set_kafka_brokers_up(u64::try_from(n).unwrap_or(u64::MAX));
        self.health.set_kafka_reachable(n > 0);
    }

    /// A Kafka transaction committed in `took`; `split`: inside a PostgreSQL transaction.
    pub(super) fn kafka_txn_committed(&self, took: Duration, split: bool) {
        self.metrics.observe_kafka_txn_commit(took, split);
    }

    pub(super) fn kafka_txn_in_doubt(&self) {
        self.metrics.inc_kafka_txn_in_doubt();
    }

    pub(super) fn kafka_txn_aborted(&self, cause: TxnAbortCause) {
        self.metrics.inc_kafka_txn_aborted(cause);
    }

    pub(super) fn delivery_error(&self) {
        self.metrics.inc_delivery_errors();
    }

    pub(super) fn slot_stats(&self, s: &SlotStats) {
        self.metrics.set_lag_bytes(s.lag_bytes);
        self.metrics.set_slot_retained_wal_bytes(s.retained_bytes);
        self.metrics.set_slot_safe_wal_size(s.safe_wal_size);
        self.metrics
            .set_slot_wal_status(SlotWalStatus::from_pg(s.wal_status.as_deref()));
        self.metrics.set_server_wal_end_lsn(s.current_wal.0);
        self.metrics.set_slot_failover_ready(s.failover_ready);
    }

    pub(super) fn connected(&self, replication: bool, producer: bool) {
        if replication {
            self.health.set_standby(false);
            self.metrics.set_standby(false);
        }
        self.metrics.set_replication_connected(replication);
        self.metrics.set_producer_healthy(producer);
        self.health.set_replication_connected(replication);
        self.health.set_producer_healthy(producer);
    }

    /// Waiting for the slot held by another instance (`true`), or not (`false`).
    pub(super) fn standby(&self, standby: bool) {
        self.health.set_standby(standby);
        self.metrics.set_standby(standby);
    }

    pub(super) fn reconnect(&self) {
        self.metrics.inc_reconnects();
    }
}
