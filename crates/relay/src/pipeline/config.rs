//! The relay's settings, validated, and what the rules take of them.

use std::time::Duration;

use outbox_core::{BinaryMode, CoreConfig};
use pgrepl::ConnectConfig;

use super::shard_catalog::ShardSpec;
use super::slot::FailoverSlot;
use crate::kafka::ProducerSettings;

/// Everything the relay needs, already validated.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub pg: ConnectConfig,
    pub slot: String,
    pub publication: String,
    pub create_slot: bool,
    /// Whether the slot is (made) a failover slot.
    pub failover_slot: FailoverSlot,
    /// What the session's rules (`outbox_core::SessionCore`) take: the table, what is
    /// relayed, the dead letters, the size and in-flight limits.
    pub rules: CoreConfig,
    pub producer: ProducerSettings,
    pub status_interval: Option<Duration>,
    pub heartbeat_interval: Option<Duration>,
    pub shutdown_timeout: Duration,
    pub reconnect_max_backoff: Duration,
    /// Topic of the per-slot progress record; `None`: no record, and then a missing slot
    /// is never created at start-up (only `outboxd init` creates it).
    pub progress_topic: Option<String>,
    /// How often the progress record is brought up to date while streaming.
    pub progress_interval: Duration,
    /// How long a stream start waits for the progress record before it skips nothing.
    pub progress_read_wait: Duration,
    /// How often the publication is looked at (see `session::publication`); the slot is
    /// confirmed only up to the last look that matched.
    pub publication_check_interval: Duration,
    /// `OUTBOXD_CLUSTER_NAME`, part of the progress record's key (see `SlotIdentity`).
    pub cluster_name: String,
    /// Slot statistics are polled every this many 1-second ticks.
    pub slot_stats_every_ticks: u64,
    /// Set when `rules.table` is one shard (hash partition) of a sharded outbox: the layout is
    /// verified with the publication, so a partition no shard reads stops the relay.
    pub shard: Option<ShardSpec>,
    /// `OUTBOXD_PGOUTPUT_BINARY`: whether sessions ask pgoutput for binary values.
    pub binary: BinaryMode,
}

impl RelayConfig {
    /// The fingerprint of what decides which rows this relay publishes, and where: a claim
    /// written under another one proves nothing (see `outbox_core::delivered`).
    /// `publication` is the catalog's identity of the publication (oid and flags).
    pub(super) fn fingerprint(&self, publication: &str) -> u64 {
        self.rules.fingerprint(
            self.heartbeat_interval.is_some(),
            &self.publication,
            publication,
        )
    }
}
