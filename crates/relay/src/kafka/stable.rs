//! Partitions' last stable offsets, where the oldest transaction still open in each
//! begins, and the records open there: the exactly-once mode's check for a transaction
//! Kafka left open (`outbox_core::left_open`).

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use outbox_core::{Regions, TopicPartition};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
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
    /// A read_uncommitted reader of regions left open, made at the first such read.
    regions: OnceLock<Option<BaseConsumer<LogContext>>>,
    settings: ProducerSettings,
}

/// A record's content as [`StableOffsets::read_regions`] compares it: key, value and
/// headers, each told apart from an absent one. The same in the producer's delivery report
/// and in a reader's fetch of the same record. Not a proof against an adversary, who
/// would need to write into the relay's open transaction's partitions anyway.
pub fn content_hash<M: Message>(m: &M) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    m.key().hash(&mut h);
    m.payload().hash(&mut h);
    match m.headers() {
        None => 0usize.hash(&mut h),
        Some(headers) => {
            headers.count().hash(&mut h);
            for header in headers.iter() {
                header.key.hash(&mut h);
                header.value.hash(&mut h);
            }
        }
    }
    h.finish()
}

impl StableOffsets {
    pub fn new(settings: &ProducerSettings) -> Result<Self, KafkaSetupError> {
        let reader = reader_config(settings, "stable-offsets")?
            .set("isolation.level", "read_committed")
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(settings.scrub(&e.to_string())))?;
        Ok(StableOffsets {
            reader,
            regions: OnceLock::new(),
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

    /// The contents of the records of each region `(partition, from, to)`, offsets `from`
    /// to `to - 1`, as a read_uncommitted client reads them (records of transactions still
    /// open or aborted included, commit and abort markers not: an offset no record is read
    /// at leaves the region out). A region not read whole within `timeout` is left out.
    /// Blocks.
    pub fn read_regions(
        &self,
        wanted: &[(TopicPartition, i64, i64)],
        timeout: Duration,
    ) -> Regions {
        let deadline = Instant::now() + timeout;
        let mut read = Regions::new();
        let Some(reader) = self.regions.get_or_init(|| self.uncommitted()) else {
            return read;
        };
        for ((topic, partition), from, to) in wanted {
            if let Some(contents) =
                self.read_region(reader, (topic, *partition), (*from, *to), deadline)
            {
                read.insert((topic.clone(), *partition), contents);
            }
        }
        // Not left fetching the relay's busiest partitions for the rest of the session.
        if let Err(e) = reader.unassign() {
            tracing::debug!("the reader of records left open: {e}");
        }
        read
    }

    fn uncommitted(&self) -> Option<BaseConsumer<LogContext>> {
        let made = reader_config(&self.settings, "left-open").and_then(|mut config| {
            config
                .set("isolation.level", "read_uncommitted")
                .create_with_context(LogContext)
                .map_err(|e| KafkaSetupError::Client(self.settings.scrub(&e.to_string())))
        });
        made.map_err(|e| tracing::warn!("a reader of records left open: {e}"))
            .ok()
    }

    fn read_region(
        &self,
        reader: &BaseConsumer<LogContext>,
        (topic, partition): (&str, i32),
        (from, to): (i64, i64),
        deadline: Instant,
    ) -> Option<Vec<u64>> {
        let mut at = TopicPartitionList::new();
        at.add_partition_offset(topic, partition, Offset::Offset(from))
            .ok()?;
        reader
            .assign(&at)
            .map_err(|e| tracing::warn!(topic, partition, "reading records left open: {e}"))
            .ok()?;
        let mut contents = Vec::new();
        let mut next = from;
        while next < to {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match reader.poll(left.min(Duration::from_millis(200))) {
                None | Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => {
                    tracing::warn!(topic, partition, "reading records left open: {e}");
                    return None;
                }
                // What an earlier assignment fetched.
                Some(Ok(m)) if m.topic() != topic || m.partition() != partition => continue,
                // An offset skipped is a marker's (or a compacted record's): not ours
                // one for one.
                Some(Ok(m)) if m.offset() != next => return None,
                Some(Ok(m)) => {
                    contents.push(content_hash(&m));
                    next += 1;
                }
            }
        }
        Some(contents)
    }
}
