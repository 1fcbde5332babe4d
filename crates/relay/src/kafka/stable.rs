//! Partitions' last stable offsets, where the oldest transaction still open in each
//! begins: the exactly-once mode's check for a transaction Kafka left open
//! (`outbox_core::left_open`).

use std::time::Duration;

use outbox_core::TopicPartition;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::config::reader_config;
use super::context::LogContext;
use super::error::KafkaSetupError;
use super::settings::ProducerSettings;

/// A read_committed reader of partitions' last stable offsets: asked for the latest
/// offset, a read_committed client gets the last stable one (librdkafka's ListOffsets
/// carries the client's isolation level). A session makes one at its first check.
pub struct StableOffsets {
    reader: BaseConsumer<LogContext>,
    settings: ProducerSettings,
}

impl StableOffsets {
    pub fn new(settings: &ProducerSettings) -> Result<Self, KafkaSetupError> {
        let reader = reader_config(settings, "stable-offsets")?
            .set("isolation.level", "read_committed")
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(settings.scrub(&e.to_string())))?;
        Ok(StableOffsets {
            reader,
            settings: settings.clone(),
        })
    }

    /// The last stable offset of each of `parts`, in order (`None`: not read within
    /// `timeout`), in one request per partition leader. Blocks.
    pub fn read(&self, parts: &[TopicPartition], timeout: Duration) -> Vec<Option<i64>> {
        let mut latest = TopicPartitionList::new();
        for (topic, partition) in parts {
            // The latest offset is asked for as the timestamp -1 (ListOffsets' LATEST).
            if let Err(e) = latest.add_partition_offset(topic, *partition, Offset::End) {
                tracing::warn!("asking for a last stable offset: {e}");
            }
        }
        let answer = match self.reader.offsets_for_times(latest, timeout) {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(
                    "reading last stable offsets: {}",
                    self.settings.scrub(&e.to_string())
                );
                return vec![None; parts.len()];
            }
        };
        parts
            .iter()
            .map(|(topic, partition)| {
                let found = answer.find_partition(topic, *partition)?;
                if let Err(e) = found.error() {
                    tracing::warn!(topic = %topic, partition, "reading the last stable offset: {e}");
                    return None;
                }
                match found.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                }
            })
            .collect()
    }
}
