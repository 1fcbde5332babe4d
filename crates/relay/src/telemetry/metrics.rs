//! The relay's metrics: plain atomics updated from the hot path, read as a consistent
//! enough snapshot when scraped. One `Arc<Metrics>` is shared by every task.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{Doubt, RowErrorKind};

use super::histogram::{Histogram, HistogramSnapshot};

/// The dead-letter counter's `reason` label is the row error's kind, the same word the
/// dead-letter record carries in its `outboxd.error_kind` header.
fn kind_index(kind: RowErrorKind) -> Option<usize> {
    RowErrorKind::ALL.iter().position(|k| *k == kind)
}

/// `pg_replication_slots.wal_status`; `Unknown` until read (or on servers without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SlotWalStatus {
    Reserved,
    Extended,
    Unreserved,
    Lost,
    #[default]
    Unknown,
}

impl SlotWalStatus {
    pub const ALL: [Self; 5] = [
        Self::Reserved,
        Self::Extended,
        Self::Unreserved,
        Self::Lost,
        Self::Unknown,
    ];

    /// Parses the column value; anything unexpected (NULL, a future status) is `Unknown`.
    pub fn from_pg(value: Option<&str>) -> Self {
        match value {
            Some("reserved") => Self::Reserved,
            Some("extended") => Self::Extended,
            Some("unreserved") => Self::Unreserved,
            Some("lost") => Self::Lost,
            _ => Self::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Extended => "extended",
            Self::Unreserved => "unreserved",
            Self::Lost => "lost",
            Self::Unknown => "unknown",
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Self::Reserved => 0,
            Self::Extended => 1,
            Self::Unreserved => 2,
            Self::Lost => 3,
            Self::Unknown => 4,
        }
    }

    fn from_u8(v: u8) -> Self {
        Self::ALL
            .into_iter()
            .find(|s| s.to_u8() == v)
            .unwrap_or_default()
    }
}

/// Why the exactly-once mode's open Kafka transaction ended without a commit (its records
/// are never visible to `read_committed` consumers; the next session publishes them again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnAbortCause {
    /// librdkafka asked for the abort (a failed produce, acks not in by the deadline).
    Abortable,
    /// The session ended for another reason (PostgreSQL, a delivery error, a shutdown).
    Restart,
    /// The broker aborted it, open longer than `transaction.timeout.ms`.
    Expired,
}

impl TxnAbortCause {
    pub const ALL: [Self; 3] = [Self::Abortable, Self::Restart, Self::Expired];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abortable => "abortable",
            Self::Restart => "restart",
            Self::Expired => "expired",
        }
    }
}

/// All relay metrics. Counters only go up; gauges are overwritten by their owner.
#[derive(Debug)]
pub struct Metrics {
    events_published: AtomicU64,
    dead_lettered: [AtomicU64; RowErrorKind::ALL.len()],
    delivery_errors: AtomicU64,
    kafka_brokers_up: AtomicU64,
    events_skipped: AtomicU64,
    progress_record_unread: AtomicU64,
    progress_record_invalid: AtomicU64,
    publication_looks_unsettled: AtomicU64,
    catalog_checks: AtomicU64,
    catalog_checks_deferred: AtomicU64,
    progress_write_errors: AtomicU64,
    replay_doubts: [AtomicU64; Doubt::ALL.len()],
    progress_foreign_writes: AtomicU64,
    replay_held_messages: AtomicU64,
    progress_recorded_lsn: AtomicU64,
    reconnects: AtomicU64,
    status_updates_sent: AtomicU64,
    in_flight_messages: AtomicU64,
    in_flight_bytes: AtomicU64,
    received_lsn: AtomicU64,
    acked_lsn: AtomicU64,
    confirmed_lsn: AtomicU64,
    /// The highest confirmed position this process has seen: the bytes counter counts
    /// only advances past it, so a session that restarts lower does not count twice.
    confirmed_high: AtomicU64,
    confirmed_bytes: AtomicU64,
    server_wal_end_lsn: AtomicU64,
    lag_bytes: AtomicU64,
    slot_retained_wal_bytes: AtomicU64,
    /// `i64::MIN`: not reported by the server (no max_slot_wal_keep_size).
    slot_safe_wal_size: AtomicI64,
    slot_wal_status: AtomicU8,
    slot_failover_ready: AtomicBool,
    pgoutput_binary: AtomicBool,
    /// Microseconds since the Unix epoch of the oldest unacked event's commit; 0 = none.
    /// A timestamp rather than an age so the age is current at scrape time, not at the
    /// last update.
    oldest_unacked_unix_micros: AtomicU64,
    replication_connected: AtomicBool,
    standby: AtomicBool,
    producer_healthy: AtomicBool,
    commit_to_ack: Histogram,
    kafka_txn_committed: AtomicU64,
    /// Commits inside one PostgreSQL transaction (open half of `transaction.timeout.ms`).
    kafka_txn_split: AtomicU64,
    kafka_txn_doubts: AtomicU64,
    kafka_txn_aborted: [AtomicU64; TxnAbortCause::ALL.len()],
    kafka_txn_commit: Histogram,
    /// Inserts into published relations that are not the outbox table, by relation:
    /// "published 0" with rows arriving here is a configuration mistake to see at once.
    /// Updated in batches from the session's tick, so the lock is off the hot path.
    ignored_rows: Mutex<BTreeMap<String, u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            events_published: AtomicU64::new(0),
            dead_lettered: Default::default(),
            delivery_errors: AtomicU64::new(0),
            kafka_brokers_up: AtomicU64::new(0),
            events_skipped: AtomicU64::new(0),
            progress_record_unread: AtomicU64::new(0),
            progress_record_invalid: AtomicU64::new(0),
            publication_looks_unsettled: AtomicU64::new(0),
            catalog_checks: AtomicU64::new(0),
            catalog_checks_deferred: AtomicU64::new(0),
            progress_write_errors: AtomicU64::new(0),
            replay_doubts: Default::default(),
            progress_foreign_writes: AtomicU64::new(0),
            replay_held_messages: AtomicU64::new(0),
            progress_recorded_lsn: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            status_updates_sent: AtomicU64::new(0),
            in_flight_messages: AtomicU64::new(0),
            in_flight_bytes: AtomicU64::new(0),
            received_lsn: AtomicU64::new(0),
            acked_lsn: AtomicU64::new(0),
            confirmed_lsn: AtomicU64::new(0),
            confirmed_high: AtomicU64::new(0),
            confirmed_bytes: AtomicU64::new(0),
            server_wal_end_lsn: AtomicU64::new(0),
            lag_bytes: AtomicU64::new(0),
            slot_retained_wal_bytes: AtomicU64::new(0),
            slot_safe_wal_size: AtomicI64::new(i64::MIN),
            slot_wal_status: AtomicU8::new(SlotWalStatus::Unknown.to_u8()),
            slot_failover_ready: AtomicBool::new(false),
            pgoutput_binary: AtomicBool::new(false),
            oldest_unacked_unix_micros: AtomicU64::new(0),
            replication_connected: AtomicBool::new(false),
            standby: AtomicBool::new(false),
            producer_healthy: AtomicBool::new(false),
            commit_to_ack: Histogram::default(),
            kafka_txn_committed: AtomicU64::new(0),
            kafka_txn_split: AtomicU64::new(0),
            kafka_txn_doubts: AtomicU64::new(0),
            kafka_txn_aborted: Default::default(),
            kafka_txn_commit: Histogram::default(),
            ignored_rows: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Plain values read from [`Metrics`] at one instant, for rendering and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub events_published_total: u64,
    pub events_dead_lettered_total: Vec<(RowErrorKind, u64)>,
    pub delivery_errors_total: u64,
    /// Brokers in the last metadata answer of the probe; 0 when none answered.
    pub kafka_brokers_up: u64,
    /// Replayed events not published again because Kafka already had them.
    pub events_skipped_total: u64,
    pub progress_record_unread_total: u64,
    pub progress_record_invalid_total: u64,
    /// Looks at the publication that could not count: a commit was in the WAL that no
    /// query saw yet (waiting for a synchronous standby).
    pub publication_looks_unsettled_total: u64,
    /// Rounds of the periodic catalog checks done (those put off included).
    pub catalog_checks_total: u64,
    /// Periodic catalog checks put off because a table they open was locked.
    pub catalog_checks_deferred_total: u64,
    pub progress_write_errors_total: u64,
    /// Replays published instead of skipped, by the doubt that stopped the proof.
    pub replay_doubts_total: Vec<(Doubt, u64)>,
    /// Progress records of this slot found written by another lineage (another live copy).
    pub progress_foreign_writes_total: u64,
    /// Replayed messages held unpublished until the progress record is proven.
    pub replay_held_messages: u64,
    pub progress_recorded_lsn: u64,
    pub reconnects_total: u64,
    pub status_updates_sent_total: u64,
    pub in_flight_messages: u64,
    pub in_flight_bytes: u64,
    pub received_lsn: u64,
    /// Everything before it is acknowledged by Kafka (the ack watermark); the slot is
    /// confirmed up to it once the publication look allows.
    pub acked_lsn: u64,
    pub confirmed_lsn: u64,
    /// Bytes of WAL the confirmed position advanced in this process, from its first
    /// confirmed position on (that one is where the slot was, not throughput).
    pub confirmed_bytes_total: u64,
    pub server_wal_end_lsn: u64,
    pub lag_bytes: u64,
    pub slot_retained_wal_bytes: u64,
    /// `pg_replication_slots.safe_wal_size`; `None` when the server has no cap.
    pub slot_safe_wal_size: Option<i64>,
    pub slot_wal_status: SlotWalStatus,
    /// The slot would survive a promotion of a standby (PG17+ failover slot, standby
    /// slots configured on the primary and connected).
    pub slot_failover_ready: bool,
    /// The replication stream carries binary column values (`OUTBOXD_PGOUTPUT_BINARY`).
    pub pgoutput_binary: bool,
    /// Age of the oldest unacked event at snapshot time; zero when nothing is unacked.
    pub oldest_unacked_age: Duration,
    pub replication_connected: bool,
    /// Waiting for the slot that another instance holds.
    pub standby: bool,
    pub producer_healthy: bool,
    pub commit_to_ack: HistogramSnapshot,
    /// Kafka transactions committed (exactly-once mode), split ones included.
    pub kafka_txn_committed_total: u64,
    /// Commits inside one PostgreSQL transaction, which ran longer than half of
    /// `transaction.timeout.ms`.
    pub kafka_txn_split_total: u64,
    /// Partitions a Kafka transaction was committed into over an older transaction still
    /// open there that this process had not aborted (`outbox_core::left_open`).
    pub kafka_txn_in_doubt_total: u64,
    pub kafka_txn_aborted_total: Vec<(TxnAbortCause, u64)>,
    /// From the decision to commit to `commit_transaction`'s OK.
    pub kafka_txn_commit: HistogramSnapshot,
    /// `(schema.relation, inserts)` for published relations that are not the outbox.
    pub ignored_rows_total: Vec<(String, u64)>,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn set(gauge: &AtomicU64, v: u64) {
    gauge.store(v, Ordering::Relaxed);
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_events_published(&self, n: u64) {
        add(&self.events_published, n);
    }

    pub fn inc_dead_lettered(&self, reason: RowErrorKind) {
        if let Some(c) = kind_index(reason).and_then(|i| self.dead_lettered.get(i)) {
            add(c, 1);
        }
    }

    pub fn inc_events_skipped(&self) {
        add(&self.events_skipped, 1);
    }

    pub fn inc_progress_record_unread(&self) {
        add(&self.progress_record_unread, 1);
    }

    pub fn inc_progress_record_invalid(&self) {
        add(&self.progress_record_invalid, 1);
    }

    pub fn inc_publication_looks_unsettled(&self) {
        add(&self.publication_looks_unsettled, 1);
    }

    pub fn inc_catalog_checks(&self) {
        add(&self.catalog_checks, 1);
    }

    pub fn inc_catalog_checks_deferred(&self) {
        add(&self.catalog_checks_deferred, 1);
    }

    pub fn inc_replay_doubt(&self, reason: Doubt) {
        if let Some(c) = Doubt::ALL
            .iter()
            .position(|d| *d == reason)
            .and_then(|i| self.replay_doubts.get(i))
        {
            add(c, 1);
        }
    }

    pub fn inc_progress_foreign_writes(&self) {
        add(&self.progress_foreign_writes, 1);
    }

    pub fn set_replay_held_messages(&self, n: usize) {
        self.replay_held_messages
            .store(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn inc_progress_write_errors(&self) {
        add(&self.progress_write_errors, 1);
    }

    pub fn set_progress_recorded_lsn(&self, lsn: u64) {
        set(&self.progress_recorded_lsn, lsn);
    }

    pub fn set_kafka_brokers_up(&self, n: u64) {
        set(&self.kafka_brokers_up, n);
    }

    pub fn inc_delivery_errors(&self) {
        add(&self.delivery_errors, 1);
    }

    pub fn inc_reconnects(&self) {
        add(&self.reconnects, 1);
    }

    pub fn inc_status_updates_sent(&self) {
        add(&self.status_updates_sent, 1);
    }

    pub fn set_in_flight(&self, messages: u64, bytes: u64) {
        set(&self.in_flight_messages, messages);
        set(&self.in_flight_bytes, bytes);
    }

    pub fn set_received_lsn(&self, lsn: u64) {
        set(&self.received_lsn, lsn);
    }

    pub fn set_acked_lsn(&self, lsn: u64) {
        set(&self.acked_lsn, lsn);
    }

    pub fn set_confirmed_lsn(&self, lsn: u64) {
        set(&self.confirmed_lsn, lsn);
        let high = self.confirmed_high.fetch_max(lsn, Ordering::Relaxed);
        // 0: the first position of this process (a start, a takeover) is where the slot
        // stood, not WAL relayed now.
        if high != 0 && lsn > high {
            add(&self.confirmed_bytes, lsn - high);
        }
    }

    pub fn set_server_wal_end_lsn(&self, lsn: u64) {
        set(&self.server_wal_end_lsn, lsn);
    }

    pub fn set_lag_bytes(&self, bytes: u64) {
        set(&self.lag_bytes, bytes);
    }

    pub fn set_slot_safe_wal_size(&self, bytes: Option<i64>) {
        self.slot_safe_wal_size
            .store(bytes.unwrap_or(i64::MIN), Ordering::Relaxed);
    }

    pub fn set_slot_retained_wal_bytes(&self, bytes: u64) {
        set(&self.slot_retained_wal_bytes, bytes);
    }

    pub fn set_slot_wal_status(&self, status: SlotWalStatus) {
        self.slot_wal_status
            .store(status.to_u8(), Ordering::Relaxed);
    }

    pub fn set_slot_failover_ready(&self, ready: bool) {
        self.slot_failover_ready.store(ready, Ordering::Relaxed);
    }

    pub fn set_pgoutput_binary(&self, binary: bool) {
        self.pgoutput_binary.store(binary, Ordering::Relaxed);
    }

    /// The commit time of the oldest event not yet acked by Kafka, `None` when all are.
    pub fn set_oldest_unacked(&self, since: Option<SystemTime>) {
        let micros = since.map_or(0, |t| unix_micros(t).max(1));
        set(&self.oldest_unacked_unix_micros, micros);
    }

    pub fn set_replication_connected(&self, connected: bool) {
        self.replication_connected
            .store(connected, Ordering::Relaxed);
    }

    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }

    pub fn set_producer_healthy(&self, healthy: bool) {
        self.producer_healthy.store(healthy, Ordering::Relaxed);
    }

    /// `n` more inserts into `relation` were ignored. Returns true the first time the
    /// relation is seen by this process, so the caller logs it once.
    pub fn add_ignored_rows(&self, relation: &str, n: u64) -> bool {
        let mut map = self.ignored_rows.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(relation) {
            Some(count) => {
                *count = count.saturating_add(n);
                false
            }
            None => {
                map.insert(relation.to_owned(), n);
                true
            }
        }
    }

    /// Time from the PostgreSQL commit to the broker ack of the transaction's last event.
    pub fn observe_commit_to_ack(&self, latency: Duration) {
        self.commit_to_ack.observe(latency);
    }

    /// A Kafka transaction committed in `took` (the wait for its acks, the look at the
    /// publication, the progress record and `EndTxn`); `split`: inside a PostgreSQL one.
    pub fn observe_kafka_txn_commit(&self, took: Duration, split: bool) {
        add(&self.kafka_txn_committed, 1);
        if split {
            add(&self.kafka_txn_split, 1);
        }
        self.kafka_txn_commit.observe(took);
    }

    /// A partition committed into in doubt (see `kafka_txn_in_doubt_total`).
    pub fn inc_kafka_txn_in_doubt(&self) {
        add(&self.kafka_txn_doubts, 1);
    }

    pub fn inc_kafka_txn_aborted(&self, cause: TxnAbortCause) {
        if let Some(c) = TxnAbortCause::ALL
            .iter()
            .position(|k| *k == cause)
            .and_then(|i| self.kafka_txn_aborted.get(i))
        {
            add(c, 1);
        }
    }

    pub fn snapshot(&self, now: SystemTime) -> MetricsSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let oldest = load(&self.oldest_unacked_unix_micros);
        let oldest_unacked_age = if oldest == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(unix_micros(now).saturating_sub(oldest))
        };
        MetricsSnapshot {
            events_published_total: load(&self.events_published),
            events_dead_lettered_total: RowErrorKind::ALL
                .into_iter()
                .zip(&self.dead_lettered)
                .map(|(kind, n)| (kind, load(n)))
                .collect(),
            delivery_errors_total: load(&self.delivery_errors),
            kafka_brokers_up: load(&self.kafka_brokers_up),
            events_skipped_total: load(&self.events_skipped),
            progress_record_unread_total: load(&self.progress_record_unread),
            progress_record_invalid_total: load(&self.progress_record_invalid),
            publication_looks_unsettled_total: load(&self.publication_looks_unsettled),
            catalog_checks_total: load(&self.catalog_checks),
            catalog_checks_deferred_total: load(&self.catalog_checks_deferred),
            progress_write_errors_total: load(&self.progress_write_errors),
            replay_doubts_total: Doubt::ALL
                .into_iter()
                .zip(&self.replay_doubts)
                .map(|(d, n)| (d, load(n)))
                .collect(),
            progress_foreign_writes_total: load(&self.progress_foreign_writes),
            replay_held_messages: load(&self.replay_held_messages),
            progress_recorded_lsn: load(&self.progress_recorded_lsn),
            reconnects_total: load(&self.reconnects),
            status_updates_sent_total: load(&self.status_updates_sent),
            in_flight_messages: load(&self.in_flight_messages),
            in_flight_bytes: load(&self.in_flight_bytes),
            received_lsn: load(&self.received_lsn),
            acked_lsn: load(&self.acked_lsn),
            confirmed_lsn: load(&self.confirmed_lsn),
            confirmed_bytes_total: load(&self.confirmed_bytes),
            server_wal_end_lsn: load(&self.server_wal_end_lsn),
            lag_bytes: load(&self.lag_bytes),
            slot_retained_wal_bytes: load(&self.slot_retained_wal_bytes),
            slot_safe_wal_size: Some(self.slot_safe_wal_size.load(Ordering::Relaxed))
                .filter(|v| *v != i64::MIN),
            slot_wal_status: SlotWalStatus::from_u8(self.slot_wal_status.load(Ordering::Relaxed)),
            slot_failover_ready: self.slot_failover_ready.load(Ordering::Relaxed),
            pgoutput_binary: self.pgoutput_binary.load(Ordering::Relaxed),
            oldest_unacked_age,
            replication_connected: self.replication_connected.load(Ordering::Relaxed),
            standby: self.standby.load(Ordering::Relaxed),
            producer_healthy: self.producer_healthy.load(Ordering::Relaxed),
            commit_to_ack: self.commit_to_ack.snapshot(),
            kafka_txn_committed_total: load(&self.kafka_txn_committed),
            kafka_txn_split_total: load(&self.kafka_txn_split),
            kafka_txn_in_doubt_total: load(&self.kafka_txn_doubts),
            kafka_txn_aborted_total: TxnAbortCause::ALL
                .into_iter()
                .zip(&self.kafka_txn_aborted)
                .map(|(cause, n)| (cause, load(n)))
                .collect(),
            kafka_txn_commit: self.kafka_txn_commit.snapshot(),
            ignored_rows_total: self
                .ignored_rows
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        }
    }
}

fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip() {
        for s in SlotWalStatus::ALL {
            assert_eq!(SlotWalStatus::from_u8(s.to_u8()), s);
            assert_eq!(SlotWalStatus::from_pg(Some(s.as_str())), s);
        }
        assert_eq!(SlotWalStatus::from_pg(None), SlotWalStatus::Unknown);
        let indexes: Vec<Option<usize>> = RowErrorKind::ALL.into_iter().map(kind_index).collect();
        assert_eq!(
            indexes,
            (0..RowErrorKind::ALL.len()).map(Some).collect::<Vec<_>>()
        );
    }

    #[test]
    fn oldest_unacked_age_is_computed_at_snapshot_time() {
        let m = Metrics::new();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(m.snapshot(t0).oldest_unacked_age, Duration::ZERO);
        m.set_oldest_unacked(Some(t0));
        let later = t0 + Duration::from_millis(2500);
        assert_eq!(
            m.snapshot(later).oldest_unacked_age,
            Duration::from_millis(2500)
        );
        // Clock stepping backwards must not underflow.
        assert_eq!(
            m.snapshot(t0 - Duration::from_secs(5)).oldest_unacked_age,
            Duration::ZERO
        );
        m.set_oldest_unacked(None);
        assert_eq!(m.snapshot(later).oldest_unacked_age, Duration::ZERO);
    }

    #[test]
    fn confirmed_bytes_count_advances_after_the_first_position_only() {
        let m = Metrics::new();
        let start = 0x2_0000_0000;
        m.set_confirmed_lsn(start);
        assert_eq!(m.snapshot(SystemTime::now()).confirmed_bytes_total, 0);
        m.set_confirmed_lsn(start + 100);
        m.set_confirmed_lsn(start + 250);
        assert_eq!(m.snapshot(SystemTime::now()).confirmed_bytes_total, 250);
        // A new session starts lower (the slot's own position): only what passes the
        // highest seen counts.
        m.set_confirmed_lsn(start + 200);
        m.set_confirmed_lsn(start + 300);
        let s = m.snapshot(SystemTime::now());
        assert_eq!(
            (s.confirmed_lsn, s.confirmed_bytes_total),
            (start + 300, 300)
        );
    }

    #[test]
    fn counters_and_gauges() {
        let m = Metrics::new();
        m.add_events_published(3);
        m.add_events_published(2);
        m.inc_dead_lettered(RowErrorKind::Oversize);
        m.inc_dead_lettered(RowErrorKind::Oversize);
        m.set_in_flight(7, 700);
        m.set_slot_wal_status(SlotWalStatus::Extended);
        let s = m.snapshot(SystemTime::now());
        assert_eq!(s.events_published_total, 5);
        assert!(s
            .events_dead_lettered_total
            .contains(&(RowErrorKind::Oversize, 2)));
        assert!(s
            .events_dead_lettered_total
            .contains(&(RowErrorKind::NullAggregateId, 0)));
        assert_eq!((s.in_flight_messages, s.in_flight_bytes), (7, 700));
        assert_eq!(s.slot_wal_status, SlotWalStatus::Extended);
        assert!(!s.replication_connected && !s.producer_healthy);
    }

    #[test]
    fn kafka_transactions_count_commits_splits_and_aborts_by_cause() {
        let m = Metrics::new();
        m.observe_kafka_txn_commit(Duration::from_millis(30), false);
        m.observe_kafka_txn_commit(Duration::from_millis(400), true);
        m.inc_kafka_txn_aborted(TxnAbortCause::Restart);
        m.inc_kafka_txn_aborted(TxnAbortCause::Restart);
        m.inc_kafka_txn_aborted(TxnAbortCause::Expired);
        m.inc_kafka_txn_in_doubt();
        let s = m.snapshot(SystemTime::now());
        assert_eq!(s.kafka_txn_in_doubt_total, 1);
        assert_eq!(
            (s.kafka_txn_committed_total, s.kafka_txn_split_total),
            (2, 1)
        );
        assert_eq!(
            s.kafka_txn_aborted_total,
            vec![
                (TxnAbortCause::Abortable, 0),
                (TxnAbortCause::Restart, 2),
                (TxnAbortCause::Expired, 1)
            ]
        );
        assert_eq!(
            (s.kafka_txn_commit.count, s.kafka_txn_commit.sum_micros),
            (2, 430_000)
        );
    }
}
