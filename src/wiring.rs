//! Turns validated settings into the library configurations.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use outbox_core::{CoreConfig, EmitMapper, TableSpec, TopicName, TopicTemplate};
use outboxd_relay::kafka::{
    check_producer_settings, env_var_of_property, KafkaSetupError, ProducerSettings,
};
use outboxd_relay::pipeline::RelayConfig;
use pgrepl::{ConnectConfig, TargetSessionAttrs};

use crate::config::{self, Settings};

/// `run`, `init` and `check` work on the primary: they settle on the host that is not in
/// recovery. `read-write` asks the same of libpq and `any` is taken as `primary`; the
/// standby-seeking values cannot work for them and are refused.
pub fn needs_primary(s: &Settings) -> Result<(), config::ConfigError> {
    match s.pg.target_session_attrs {
        TargetSessionAttrs::Any | TargetSessionAttrs::Primary | TargetSessionAttrs::ReadWrite => {
            Ok(())
        }
        other => Err(config::ConfigError::new(
            "PGTARGETSESSIONATTRS",
            other.as_str(),
            "primary, read-write or any for run, init and check (they stream from and write to the primary); other values only for status",
        )),
    }
}

/// The connection for `run`, `init` and `check`: the primary among the hosts. (`status`
/// takes `Settings::pg` as it is: PGTARGETSESSIONATTRS as given, else the primary.)
pub fn connect_config(s: &Settings) -> ConnectConfig {
    let mut c = s.pg.clone();
    if c.target_session_attrs != TargetSessionAttrs::ReadWrite {
        c.target_session_attrs = TargetSessionAttrs::Primary;
    }
    c
}

pub fn table_spec(s: &Settings) -> anyhow::Result<TableSpec> {
    let topic = Arc::new(
        TopicTemplate::parse(&s.topic_template)
            .with_context(|| format!("OUTBOXD_TOPIC={:?}", s.topic_template))?,
    );
    Ok(TableSpec {
        schema: s.table_schema.clone(),
        table: s.table_name.clone(),
        columns: s.columns.clone(),
        topic,
        header_format: s.header_format.clone(),
    })
}

/// The producer settings as the producer will get them, refused now (before anything is
/// connected to) if the producer would refuse them, naming the variable that was set.
pub fn checked_producer_settings(s: &Settings) -> anyhow::Result<ProducerSettings> {
    check_producer_settings(&s.producer).map_err(|e| {
        let var = match &e {
            KafkaSetupError::RefusedOverride { property, .. }
            | KafkaSetupError::InvalidProperty { property, .. } => env_var_of_property(property),
            _ => "the Kafka producer settings".to_owned(),
        };
        anyhow::Error::new(e).context(var)
    })?;
    Ok(s.producer.clone())
}

/// What the session's rules take of the settings, around `table` (from [`table_spec`]).
fn rules(s: &Settings, table: TableSpec) -> anyhow::Result<CoreConfig> {
    let emit = match &s.message_prefix {
        Some(prefix) => Some(
            EmitMapper::new(prefix.clone(), Arc::clone(&table.topic))
                .context("OUTBOXD_MESSAGE_PREFIX")?
                .with_headers(s.columns.header_columns.clone(), s.header_format.clone()),
        ),
        None => None,
    };
    Ok(CoreConfig {
        table,
        relay_table: s.relay_table,
        emit,
        dead_letter_topic: TopicName::parse(&s.dead_letter_topic)
            .with_context(|| format!("OUTBOXD_DEAD_LETTER_TOPIC={:?}", s.dead_letter_topic))?,
        bad_row_policy: s.bad_row_policy,
        max_message_bytes: s.producer.max_message_bytes,
        caps: s.caps,
        idle_flush: s.idle_flush,
        former_partitions: s.former_partitions.clone(),
    })
}

pub fn relay_config(s: &Settings) -> anyhow::Result<RelayConfig> {
    // Of two bad settings, the topic template is named first, then the producer's.
    let table = table_spec(s)?;
    let producer = checked_producer_settings(s)?;
    let rules = rules(s, table)?;
    Ok(RelayConfig {
        pg: connect_config(s),
        slot: s.slot.clone(),
        publication: s.publication.clone(),
        create_slot: s.create_slot,
        failover_slot: s.failover_slot,
        rules,
        producer,
        status_interval: s.status_interval,
        heartbeat_interval: s.heartbeat_interval,
        shutdown_timeout: s.shutdown_timeout,
        reconnect_max_backoff: s.reconnect_max_backoff,
        slot_stats_every_ticks: 5,
        progress_topic: s.progress_topic.clone(),
        progress_interval: s.progress_interval,
        progress_read_wait: s.progress_read_wait,
        publication_check_interval: s.publication_check_interval,
        cluster_name: s.cluster_name.clone(),
        shard: s.shard.clone(),
        binary: s.pgoutput_binary,
    })
}

pub const BROKER_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
