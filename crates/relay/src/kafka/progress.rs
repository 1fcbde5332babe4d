//! The progress record: one small record per slot in a compacted Kafka topic, saying that
//! the slot exists and how far it was confirmed.
//!
//! Its first job is to make a lost slot loud. A logical slot that was dropped, or lost in
//! a failover without failover slots, leaves no trace in PostgreSQL; creating it again
//! starts at the current WAL position and skips, silently, every event committed in
//! between. The relay writes the record before it ever creates a slot and keeps it
//! current while streaming, so "the slot is missing and a record for it exists" means
//! "an earlier slot was lost", and the relay refuses to paper over it.
//!
//! The record is keyed by `system identifier / database / slot`, so a different cluster
//! (another system identifier) or another slot name never matches it. It is only ever
//! written with positions already confirmed to PostgreSQL, never ahead of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgoutput::Lsn;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::config::{admin_config, producer_config, reader_config};
use super::context::{AckContext, LogContext};
use super::error::KafkaSetupError;
use super::producer::spawn_poller;
use super::settings::ProducerSettings;

impl ConsumerContext for LogContext {}

/// Which slot a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotIdentity {
    /// `IDENTIFY_SYSTEM`'s system identifier: the same on a primary and its standbys.
    pub system_id: String,
    pub database: String,
    pub slot: String,
}

impl SlotIdentity {
    fn key(&self) -> String {
        format!("{}/{}/{}", self.system_id, self.database, self.slot)
    }
}

/// What a record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRecord {
    pub timeline: u32,
    /// A position the slot had confirmed (everything before it is in Kafka).
    pub confirmed_lsn: Lsn,
    /// When it was written, Unix milliseconds.
    pub recorded_at_unix_ms: u64,
    /// Commit time of the newest transaction read when it was written (0: unknown).
    pub last_commit_unix_micros: i64,
    /// false: written just before creating the slot, which may never have happened (the
    /// process died while CREATE_REPLICATION_SLOT waited), so a missing slot is then no
    /// proof of a lost one. Set by every later write.
    pub slot_created: bool,
    /// A transaction at or past `confirmed_lsn` whose leading rows are acked.
    pub partial: Option<outbox_core::PartialTxn>,
}

impl ProgressRecord {
    pub fn now(timeline: u32, confirmed_lsn: Lsn, last_commit_unix_micros: i64) -> Self {
        ProgressRecord {
            timeline,
            confirmed_lsn,
            last_commit_unix_micros,
            recorded_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            slot_created: true,
            partial: None,
        }
    }

    /// The record written before the slot is created.
    pub fn before_creation(timeline: u32, position: Lsn) -> Self {
        ProgressRecord {
            slot_created: false,
            ..ProgressRecord::now(timeline, position, 0)
        }
    }

    fn to_json(&self, id: &SlotIdentity) -> String {
        serde_json::json!({
            "version": 1,
            "system_id": id.system_id,
            "database": id.database,
            "slot": id.slot,
            "timeline": self.timeline,
            "confirmed_lsn": self.confirmed_lsn.to_string(),
            "recorded_at_unix_ms": self.recorded_at_unix_ms,
            "last_commit_unix_micros": self.last_commit_unix_micros,
            "slot_created": self.slot_created,
            "partial_commit_lsn": self.partial.map(|p| p.commit_lsn.to_string()),
            "partial_rows_acked": self.partial.map(|p| p.rows),
        })
        .to_string()
    }

    fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let field = |name: &str| v.get(name).ok_or_else(|| format!("no field {name:?}"));
        let confirmed_lsn = field("confirmed_lsn")?
            .as_str()
            .ok_or("confirmed_lsn is not a string")?
            .parse::<Lsn>()
            .map_err(|e| format!("confirmed_lsn: {e}"))?;
        let timeline = field("timeline")?
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or("timeline is not a 32-bit number")?;
        let recorded_at_unix_ms = field("recorded_at_unix_ms")?
            .as_u64()
            .ok_or("recorded_at_unix_ms is not a number")?;
        // Absent in records written before it existed: 0 skips nothing (see delivered).
        let last_commit_unix_micros = v
            .get("last_commit_unix_micros")
            .and_then(serde_json::Value::as_i64)
            .unwrap_or(0);
        // Absent in records written before it existed: those were all written for slots.
        let slot_created = v
            .get("slot_created")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        // Absent in older records, null when no transaction was partly acked; a field
        // that does not read as a position and a count skips nothing.
        let partial_lsn = v
            .get("partial_commit_lsn")
            .and_then(serde_json::Value::as_str)
            .and_then(|t| t.parse::<Lsn>().ok());
        let partial_rows = v
            .get("partial_rows_acked")
            .and_then(serde_json::Value::as_u64);
        let partial = match (partial_lsn, partial_rows) {
            (Some(commit_lsn), Some(rows)) => Some(outbox_core::PartialTxn { commit_lsn, rows }),
            _ => None,
        };
        Ok(ProgressRecord {
            timeline,
            confirmed_lsn,
            recorded_at_unix_ms,
            last_commit_unix_micros,
            slot_created,
            partial,
        })
    }

    /// Whose record this is (from the fields inside it), and what it says; `None` for a
    /// value that is not a readable record.
    fn owner_from_json(bytes: &[u8]) -> Option<(SlotIdentity, Self)> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let text = |name: &str| v.get(name)?.as_str().map(str::to_owned);
        let owner = SlotIdentity {
            system_id: text("system_id")?,
            database: text("database")?,
            slot: text("slot")?,
        };
        Some((owner, ProgressRecord::from_json(bytes).ok()?))
    }

    /// What the record says Kafka has, for skipping replays.
    pub fn delivered(&self) -> outbox_core::DeliveredPosition {
        outbox_core::DeliveredPosition {
            timeline: self.timeline,
            lsn: self.confirmed_lsn,
            last_commit_unix_micros: self.last_commit_unix_micros,
            partial: self.partial,
        }
    }

    /// `recorded_at` as RFC 3339 UTC text for error messages.
    pub fn recorded_at_text(&self) -> String {
        let secs = i64::try_from(self.recorded_at_unix_ms / 1000).unwrap_or(i64::MAX);
        outbox_core::rfc3339_utc_seconds(secs)
    }
}

/// What the progress topic holds for one database and slot name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotRecords {
    /// The record of this cluster's slot.
    pub ours: Option<ProgressRecord>,
    /// Records of a slot with the same database and name on other clusters (system
    /// identifier, record): the relay streamed from another cluster before, or another
    /// cluster's relay shares the topic.
    pub other_clusters: Vec<(String, ProgressRecord)>,
}

impl SlotRecords {
    /// Another cluster's record of a slot that existed there, and none of ours: the relay
    /// is pointed at a new cluster (a wrong host, or a migration) until an operator says
    /// it is meant to be (`outboxd init` writes our record).
    pub fn only_other_cluster(&self) -> Option<&(String, ProgressRecord)> {
        if self.ours.is_some() {
            return None;
        }
        self.other_clusters
            .iter()
            .filter(|(_, r)| r.slot_created)
            .max_by_key(|(_, r)| r.recorded_at_unix_ms)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error(transparent)]
    Setup(#[from] KafkaSetupError),
    #[error("{0}")]
    Kafka(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("the record for this slot is unreadable ({0}); delete it only if you know the slot never existed")]
    Unreadable(String),
}

/// What one read of the topic found for one slot.
struct SlotScan {
    key: String,
    /// Keys end with the database and slot: a cheap filter before parsing the value.
    same_slot_suffix: String,
    latest: Option<Option<Vec<u8>>>,
    /// Newest value per key of another cluster's record of this slot (None: deleted).
    others: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl SlotScan {
    fn new(id: &SlotIdentity) -> Self {
        SlotScan {
            key: id.key(),
            same_slot_suffix: format!("/{}/{}", id.database, id.slot),
            latest: None,
            others: BTreeMap::new(),
        }
    }

    fn see(&mut self, key: &[u8], payload: Option<&[u8]>) {
        if key == self.key.as_bytes() {
            self.latest = Some(payload.map(<[u8]>::to_vec));
        } else if key.ends_with(self.same_slot_suffix.as_bytes()) {
            self.others
                .insert(key.to_vec(), payload.map(<[u8]>::to_vec));
        }
    }

    fn records(self, id: &SlotIdentity) -> Result<SlotRecords, ProgressError> {
        let ours = match self.latest.flatten() {
            None => None,
            Some(bytes) => {
                Some(ProgressRecord::from_json(&bytes).map_err(ProgressError::Unreadable)?)
            }
        };
        // Another cluster's records only count when they say so themselves; an
        // unreadable one is not ours to judge.
        let other_clusters = self
            .others
            .into_values()
            .flatten()
            .filter_map(|bytes| {
                let (owner, record) = ProgressRecord::owner_from_json(&bytes)?;
                (owner.database == id.database
                    && owner.slot == id.slot
                    && owner.system_id != id.system_id)
                    .then_some((owner.system_id, record))
            })
            .collect();
        Ok(SlotRecords {
            ours,
            other_clusters,
        })
    }
}

/// Reads and writes progress records. Cheap to clone.
#[derive(Clone)]
pub struct ProgressStore {
    inner: Arc<Inner>,
}

struct Inner {
    topic: String,
    settings: ProducerSettings,
    producer: Arc<BaseProducer<AckContext>>,
    /// Ends the producer's polling thread (see `producer::spawn_poller`).
    stop_polling: Arc<AtomicBool>,
    /// A periodic write is skipped while the previous one is unanswered, so a broker
    /// outage cannot queue records without bound.
    write_in_flight: AtomicBool,
    topic_ready: AtomicBool,
    /// Writes the broker acknowledged.
    writes_acked: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_polling.store(true, Ordering::Release);
    }
}

const OPERATION_TIMEOUT: Duration = Duration::from_secs(15);
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

impl ProgressStore {
    /// Builds the clients; contacts no broker.
    pub fn new(settings: &ProducerSettings, topic: &str) -> Result<Self, KafkaSetupError> {
        let mut config = producer_config(settings)?;
        config.set("client.id", format!("{}-progress", settings.client_id));
        // Durable like the events (acks=all, idempotent), but bounded: a record that
        // cannot be written is simply written again later.
        config.set("message.timeout.ms", "30000");
        // Not rdkafka's FutureProducer: its 100 ms polling thread spins ~1 ms per poll
        // (see `producer::POLL_PERIOD`).
        let producer: Arc<BaseProducer<AckContext>> = Arc::new(
            config
                .create_with_context(AckContext)
                .map_err(|e| KafkaSetupError::Client(settings.scrub(&e.to_string())))?,
        );
        let stop_polling = spawn_poller(&producer)?;
        Ok(ProgressStore {
            inner: Arc::new(Inner {
                topic: topic.to_owned(),
                settings: settings.clone(),
                producer,
                stop_polling,
                write_in_flight: AtomicBool::new(false),
                topic_ready: AtomicBool::new(false),
                writes_acked: AtomicU64::new(0),
            }),
        })
    }

    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Writes the broker acknowledged so far.
    pub fn writes_acked(&self) -> u64 {
        self.inner.writes_acked.load(Ordering::Acquire)
    }

    /// A consumer on the store's connection settings. Consumers do not auto-create
    /// topics on metadata requests, so looking never creates the topic by accident.
    fn consumer(&self) -> Result<BaseConsumer<LogContext>, KafkaSetupError> {
        let s = &self.inner.settings;
        reader_config(s, "progress-reader")?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))
    }

    /// Whether the topic exists, asking the brokers (an unreachable cluster is an error,
    /// never "no").
    fn topic_exists(&self, consumer: &BaseConsumer<LogContext>) -> Result<bool, ProgressError> {
        let s = &self.inner.settings;
        let metadata = consumer
            .fetch_metadata(Some(&self.inner.topic), OPERATION_TIMEOUT)
            .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.inner.topic);
        match topic.map(|t| t.error()) {
            Some(None) => Ok(true),
            Some(Some(e))
                if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition =>
            {
                Ok(false)
            }
            None => Ok(false),
            Some(Some(e)) => Err(ProgressError::Kafka(format!(
                "metadata for topic {:?}: {}",
                self.inner.topic,
                RDKafkaErrorCode::from(e)
            ))),
        }
    }

    /// Creates the topic (compacted, one partition) if it does not exist. A broker that
    /// cannot create topics through the admin API (librdkafka's mock cluster, some
    /// managed services) gets a warning: the first write may still auto-create it.
    async fn ensure_topic(&self) -> Result<(), ProgressError> {
        if self.inner.topic_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let this = self.clone();
        let exists = tokio::task::spawn_blocking(move || {
            let consumer = this.consumer()?;
            this.topic_exists(&consumer)
        })
        .await
        .map_err(|e| ProgressError::Kafka(format!("metadata task failed: {e}")))??;
        if !exists {
            if let Err(e) = self.create_topic().await {
                tracing::warn!(
                    topic = %self.inner.topic,
                    "could not create the progress topic ({e}); create it yourself with one partition and cleanup.policy=compact. Writing to it anyway, in case the brokers create topics on first use"
                );
            }
        }
        self.inner.topic_ready.store(true, Ordering::Release);
        Ok(())
    }

    async fn create_topic(&self) -> Result<(), ProgressError> {
        let s = &self.inner.settings;
        let admin: AdminClient<LogContext> = admin_config(s)?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))?;
        let options = AdminOptions::new()
            .operation_timeout(Some(ADMIN_TIMEOUT))
            .request_timeout(Some(ADMIN_TIMEOUT));
        let compacted = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact");
        let plain = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1));
        for topic in [compacted, plain] {
            let results = admin
                .create_topics(&[topic], &options)
                .await
                .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
            match results.into_iter().next() {
                Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => {
                    return Ok(());
                }
                // Brokers that refuse topic configs (some Kafka-compatible ones): the
                // record is tiny, an uncompacted topic works too.
                Some(Err((
                    _,
                    RDKafkaErrorCode::InvalidConfig
                    | RDKafkaErrorCode::PolicyViolation
                    | RDKafkaErrorCode::UnsupportedVersion,
                ))) => continue,
                Some(Err((topic, code))) => {
                    return Err(KafkaSetupError::TopicCreation { topic, code }.into())
                }
            }
        }
        Err(ProgressError::Kafka(
            "the broker refused both topic definitions".into(),
        ))
    }

    /// The newest record for `id`, and those for the same database and slot written on
    /// other clusters (other system identifiers), in one read of the topic.
    pub async fn read_slot(&self, id: &SlotIdentity) -> Result<SlotRecords, ProgressError> {
        let mut read = self.read_slots(std::slice::from_ref(id)).await?;
        read.pop().unwrap_or_else(|| Ok(SlotRecords::default()))
    }

    /// [`ProgressStore::read_slot`] for several slots (the shards `init` sets up) in one
    /// read of the topic: one result per slot, in the order of `ids` (a slot whose own
    /// record is unreadable fails alone).
    pub async fn read_slots(
        &self,
        ids: &[SlotIdentity],
    ) -> Result<Vec<Result<SlotRecords, ProgressError>>, ProgressError> {
        self.ensure_topic().await?;
        let this = self.clone();
        let ids = ids.to_vec();
        tokio::task::spawn_blocking(move || this.read_blocking(&ids, OPERATION_TIMEOUT))
            .await
            .map_err(|e| ProgressError::Kafka(format!("reader task failed: {e}")))?
    }

    fn read_blocking(
        &self,
        ids: &[SlotIdentity],
        timeout: Duration,
    ) -> Result<Vec<Result<SlotRecords, ProgressError>>, ProgressError> {
        let s = &self.inner.settings;
        let topic = self.inner.topic.as_str();
        let nothing = || ids.iter().map(|_| Ok(SlotRecords::default())).collect();
        let consumer = self.consumer()?;
        if !self.topic_exists(&consumer)? {
            // No topic, no record: nothing was ever recorded on this cluster.
            return Ok(nothing());
        }
        let deadline = Instant::now() + timeout;
        let (low, high) = consumer
            .fetch_watermarks(topic, 0, timeout)
            .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        if high <= low {
            return Ok(nothing());
        }
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Offset(low))
            .map_err(|e| ProgressError::Kafka(e.to_string()))?;
        consumer
            .assign(&assignment)
            .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        let mut found: Vec<SlotScan> = ids.iter().map(SlotScan::new).collect();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProgressError::Timeout(timeout));
            }
            match consumer.poll(remaining.min(Duration::from_millis(500))) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => return Err(ProgressError::Kafka(s.scrub(&e.to_string()))),
                Some(Ok(m)) => {
                    if let Some(k) = m.key() {
                        for scan in &mut found {
                            scan.see(k, m.payload());
                        }
                    }
                    if m.offset() >= high - 1 {
                        break;
                    }
                }
            }
        }
        Ok(ids
            .iter()
            .zip(found)
            .map(|(id, scan)| scan.records(id))
            .collect())
    }

    /// Writes a record and waits for the broker's ack. Always to partition 0, the only one
    /// [`ProgressStore::read_slot`] reads: a topic with more partitions (made with a
    /// cluster's default count, or auto-created on the first write) would otherwise
    /// scatter records by key where no reader looks.
    pub async fn write_and_wait(
        &self,
        id: &SlotIdentity,
        record: &ProgressRecord,
    ) -> Result<(), ProgressError> {
        self.ensure_topic().await?;
        let key = id.key();
        let value = record.to_json(id);
        let (done, acked) = tokio::sync::oneshot::channel();
        let record = BaseRecord::with_opaque_to(&self.inner.topic, Box::new(done))
            .partition(0)
            .key(&key)
            .payload(&value);
        if let Err((e, _)) = self.inner.producer.send(record) {
            return Err(ProgressError::Kafka(
                self.inner.settings.scrub(&e.to_string()),
            ));
        }
        match tokio::time::timeout(OPERATION_TIMEOUT * 2, acked).await {
            Ok(Ok(Ok(()))) => {
                self.inner.writes_acked.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(ProgressError::Kafka(
                self.inner.settings.scrub(&e.to_string()),
            )),
            // librdkafka reports every message exactly once; a dropped sender means the
            // producer is being torn down.
            Ok(Err(_)) => Err(ProgressError::Kafka("the producer was closed".into())),
            Err(_) => Err(ProgressError::Timeout(OPERATION_TIMEOUT * 2)),
        }
    }

    /// Drops records still waiting for a broker, so a shutdown during a Kafka outage does
    /// not wait for them: they would only have been an older position anyway.
    pub fn abandon_pending(&self) {
        self.inner
            .producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }

    /// Writes a record in the background; skipped while an earlier one is unanswered.
    /// `answered` hears the outcome before the next write can start, so what it reports
    /// (the recorded position) is never overtaken by a later record. A failure is also
    /// logged: it only leaves an older record in place.
    pub fn write_in_background(
        &self,
        id: &SlotIdentity,
        record: ProgressRecord,
        answered: impl FnOnce(Result<Lsn, &ProgressError>) + Send + 'static,
    ) {
        if self.inner.write_in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let result = this.write_and_wait(&id, &record).await;
            answered(result.as_ref().map(|()| record.confirmed_lsn));
            this.inner.write_in_flight.store(false, Ordering::Release);
            if let Err(e) = result {
                tracing::warn!(
                    topic = %this.inner.topic,
                    "writing the progress record failed: {e}; it stays at an older position (harmless: it only records that the slot exists)"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_dates_render() {
        let id = SlotIdentity {
            system_id: "7312".into(),
            database: "shop".into(),
            slot: "outboxd".into(),
        };
        let r = ProgressRecord {
            timeline: 3,
            confirmed_lsn: Lsn(0x1_0000_00A0),
            recorded_at_unix_ms: 1_764_590_400_000,
            last_commit_unix_micros: 1_764_590_399_000_000,
            slot_created: true,
            partial: Some(outbox_core::PartialTxn {
                commit_lsn: Lsn(0x1_0000_0100),
                rows: 12,
            }),
        };
        let json = r.to_json(&id);
        assert_eq!(ProgressRecord::from_json(json.as_bytes()), Ok(r.clone()));
        let whole = ProgressRecord { partial: None, ..r };
        assert_eq!(
            ProgressRecord::from_json(whole.to_json(&id).as_bytes()),
            Ok(whole)
        );
        assert_eq!(id.key(), "7312/shop/outboxd");
        assert_eq!(r.recorded_at_text(), "2025-12-01T12:00:00Z");
        assert!(ProgressRecord::from_json(b"{}").is_err());
    }
}
