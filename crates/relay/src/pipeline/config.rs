//! The relay's settings, validated, and what the rules take of them.

use std::time::Duration;

use outbox_core::{BadRowPolicy, BinaryMode, EmitMapper, TableSpec, TopicName};
use pgrepl::ConnectConfig;

use super::shard::ShardSpec;
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
    pub table: TableSpec,
    /// false: only emitted logical messages are relayed, and the table need not be
    /// published. An explicit choice, never inferred from the publication.
    pub relay_table: bool,
    /// Emitted logical messages with this mapper's prefix are relayed too.
    pub emit: Option<EmitMapper>,
    pub dead_letter_topic: TopicName,
    pub bad_row_policy: BadRowPolicy,
    pub max_message_bytes: usize,
    pub max_in_flight_messages: usize,
    pub max_in_flight_bytes: usize,
    pub producer: ProducerSettings,
    pub status_interval: Option<Duration>,
    pub idle_flush: bool,
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
    /// Set when `table` is one shard (hash partition) of a sharded outbox: the layout is
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
        self.rules().fingerprint(
            self.heartbeat_interval.is_some(),
            &self.publication,
            publication,
        )
    }

    /// The in-flight caps.
    pub fn caps(&self) -> outbox_core::InFlightCaps {
        outbox_core::InFlightCaps {
            max_messages: self.max_in_flight_messages,
            max_bytes: self.max_in_flight_bytes,
        }
    }

    /// What the session's rules (`outbox_core::SessionCore`) need of these settings.
    pub fn rules(&self) -> outbox_core::CoreConfig {
        outbox_core::CoreConfig {
            table: self.table.clone(),
            relay_table: self.relay_table,
            emit: self.emit.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            bad_row_policy: self.bad_row_policy,
            max_message_bytes: self.max_message_bytes,
            caps: self.caps(),
            idle_flush: self.idle_flush,
        }
    }
}
