//! Partitions' last stable offsets, where the oldest transaction still open in each
//! begins: the exactly-once mode's check for a transaction Kafka left open
//! (`outbox_core::left_open`).

use std::time::Instant;

use outbox_core::TopicPartition;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::config::reader_config;
use super::context::LogContext;
use super::error::KafkaSetupError;
use super::settings::ProducerSettings;

/// A read_committed reader of partitions' last stable offsets: its high watermark is
/// the last stable offset (librdkafka asks with the reader's isolation level).
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

    /// The last stable offset of each of `parts`, in order, read until `deadline` or the
    /// first that cannot be read (the rest are left out: not known is not checked).
    /// Blocks.
    pub fn read(&self, parts: &[TopicPartition], deadline: Instant) -> Vec<i64> {
        let mut stable = Vec::with_capacity(parts.len());
        for (topic, partition) in parts {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reader.fetch_watermarks(topic, *partition, left) {
                Ok((_, high)) => stable.push(high),
                Err(e) => {
                    tracing::warn!(
                        topic = %topic,
                        partition,
                        "reading the partition's last stable offset: {}",
                        self.settings.scrub(&e.to_string())
                    );
                    break;
                }
            }
        }
        stable
    }
}
