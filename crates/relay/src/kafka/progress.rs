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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgoutput::Lsn;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
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

mod owed;
mod record;

pub use owed::RepublishOwed;
use record::SlotScan;
pub use record::{
    pg_time_text, republish_text, BackfillState, ProgressRecord, PublicationSeen, SlotIdentity,
    SlotRecords, EMITTED_LOST_TEXT,
};

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
    #[error("the progress topic {topic:?} keeps records only for a while (cleanup.policy={policy}, retention.ms={retention_ms}): {}", self.remedy().unwrap_or_default())]
    NotDurable {
        topic: String,
        policy: String,
        retention_ms: String,
    },
}

impl ProgressError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            ProgressError::NotDurable { topic, .. } => format!(
                "once the slot's record is deleted, a lost slot can no longer be told from a \
                first start. Make it compacted: kafka-configs --bootstrap-server BROKER --alter --entity-type topics \
                --entity-name {topic} --add-config cleanup.policy=compact (or \
                retention.ms=-1), then start outboxd again"
            ),
            _ => return None,
        };
        Some(text)
    }

    /// Whether the brokers refused for want of a permission: an ACL is the fix.
    pub fn is_denied(&self) -> bool {
        matches!(
            self,
            ProgressError::Setup(KafkaSetupError::TopicCreation {
                code: RDKafkaErrorCode::TopicAuthorizationFailed
                    | RDKafkaErrorCode::ClusterAuthorizationFailed,
                ..
            })
        )
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
    /// Another lineage was seen writing this store's slot record: from then on this
    /// process skips nothing for it (see `outbox_core::delivered`).
    foreign_writer: AtomicBool,
    lineage_check_in_flight: AtomicBool,
    /// The topic's retention as the brokers described it, once (see
    /// [`ProgressStore::check_durable`]).
    durability: tokio::sync::OnceCell<Durability>,
}

/// The rule for a topic's retention settings as DescribeConfigs gives them: kept for good
/// only when compacted alone (`compact,delete` still deletes old segments), or when
/// neither time nor size deletes anything.
/// A broker the reader could not connect to. librdkafka reports every broker of the
/// cluster it fails to reach, also one that leads nothing this read needs: the read goes
/// on with the partition's leader, bounded by its deadline (which names the timeout if
/// the leader itself is what is down).
fn broker_unreachable(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown
        )
    )
}

fn judge_retention(
    policy: Option<String>,
    retention_ms: Option<String>,
    retention_bytes: Option<String>,
) -> Durability {
    let Some(policy) = policy else {
        return Durability::Unknown;
    };
    let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
    let compacted_only = policies == ["compact"];
    let forever = retention_ms.as_deref().is_some_and(|r| r.trim() == "-1")
        && retention_bytes.as_deref().is_none_or(|b| b.trim() == "-1");
    if compacted_only || forever {
        Durability::Kept
    } else {
        Durability::Expires(policy, retention_ms.unwrap_or_else(|| "?".into()))
    }
}

/// Whether the progress topic keeps a slot's record for good.
#[derive(Debug, Clone)]
enum Durability {
    /// Compacted, or kept forever.
    Kept,
    /// Deleted after a while: `(cleanup.policy, retention.ms)`.
    Expires(String, String),
    /// The brokers would not say (librdkafka's mock cluster has no DescribeConfigs).
    Unknown,
}

/// For a read_committed reader at its end: whether the last stable offset (its end) has
/// reached `high`, so nothing below `high` is left to read. Its position cannot say it:
/// the commit and abort markers at the end are offsets no message is read at.
fn stable_to(consumer: &BaseConsumer<LogContext>, topic: &str, high: i64) -> bool {
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(5))
        .is_ok_and(|(_, stable)| stable >= high)
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
        // One key, each record superseding the last: a record refused for good is simply
        // written again, where a producer stopped by a gap would never write again.
        config.set("enable.gapless.guarantee", "false");
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
                foreign_writer: AtomicBool::new(false),
                lineage_check_in_flight: AtomicBool::new(false),
                durability: tokio::sync::OnceCell::new(),
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

    /// Whether another lineage was seen writing this slot's record (sticky).
    pub fn foreign_writer(&self) -> bool {
        self.inner.foreign_writer.load(Ordering::Acquire)
    }

    /// Records that another lineage writes this slot's record; true the first time.
    pub fn mark_foreign_writer(&self) -> bool {
        !self.inner.foreign_writer.swap(true, Ordering::AcqRel)
    }

    /// Reads the slot's record in the background (one read at a time) and calls `found`
    /// with its lineage when that is neither of `ours` (the writer's current and previous
    /// lineage): another live writer recorded under this key since this process's last
    /// acknowledged write. A failed read says nothing.
    pub fn check_lineage_in_background(
        &self,
        id: &SlotIdentity,
        ours: (u64, u64),
        found: impl FnOnce(u64, String) + Send + 'static,
    ) {
        if self.writes_acked() == 0
            || self
                .inner
                .lineage_check_in_flight
                .swap(true, Ordering::AcqRel)
        {
            return;
        }
        let this = self.clone();
        let id = id.clone();
        tokio::spawn(async move {
            if let Ok(records) = this.read_slot(&id).await {
                let foreign = |l: u64| l != 0 && l != ours.0 && l != ours.1;
                if let Some(r) = records.ours.filter(|r| foreign(r.lineage)) {
                    found(r.lineage, r.writer);
                }
            }
            this.inner
                .lineage_check_in_flight
                .store(false, Ordering::Release);
        });
    }

    /// A consumer on the store's connection settings. Consumers do not auto-create
    /// topics on metadata requests, so looking never creates the topic by accident.
    fn consumer(&self) -> Result<BaseConsumer<LogContext>, KafkaSetupError> {
        let s = &self.inner.settings;
        reader_config(s, "progress-reader")?
            // Says when a read_committed scan reached the last stable offset (see
            // `stable_to`).
            .set("enable.partition.eof", "true")
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))
    }

    /// A reader that sees transactions not yet committed: only for the high watermark.
    fn uncommitted_consumer(&self) -> Result<BaseConsumer<LogContext>, KafkaSetupError> {
        let s = &self.inner.settings;
        reader_config(s, "progress-reader")?
            .set("isolation.level", "read_uncommitted")
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))
    }

    /// Produces `record` for `id` with the exactly-once mode's transactional producer,
    /// inside its open transaction (the transaction's last record), to partition 0 like
    /// [`ProgressStore::write_and_wait`].
    pub fn produce_in_transaction(
        &self,
        producer: &super::producer::RelayProducer,
        id: &SlotIdentity,
        record: &ProgressRecord,
        ticket: usize,
    ) -> Result<(), super::producer::SendError> {
        producer.send_to_first_partition(
            &self.inner.topic,
            id.key().as_bytes(),
            record.to_json(id).as_bytes(),
            ticket,
        )
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

    /// Refuses a progress topic that deletes records after a while: a slot's record would
    /// go, and with it the only sign that the slot existed. Asked once per process; a
    /// broker that cannot describe topics gets a warning, not a refusal.
    pub async fn check_durable(&self) -> Result<(), ProgressError> {
        self.ensure_topic().await?;
        let durability = self
            .inner
            .durability
            .get_or_init(|| async {
                match self.describe_retention().await {
                    Ok(d) => d,
                    Err(e) => {
                        tracing::warn!(
                            topic = %self.inner.topic,
                            "cannot read the progress topic's configuration ({e}); make sure it is compacted (cleanup.policy=compact) or keeps records forever (retention.ms=-1)"
                        );
                        Durability::Unknown
                    }
                }
            })
            .await;
        self.judge_durability(durability)
    }

    /// What [`ProgressStore::check_durable`] found, if it ran: never waits.
    pub fn durability_verdict(&self) -> Option<Result<(), ProgressError>> {
        self.inner
            .durability
            .get()
            .map(|d| self.judge_durability(d))
    }

    /// Runs [`ProgressStore::check_durable`] in the background, for
    /// [`ProgressStore::durability_verdict`] to read: a broker that never answers
    /// DescribeConfigs (the mock cluster times out) must not delay streaming.
    pub fn check_durable_in_background(&self) {
        if self.inner.durability.initialized() {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let _ = this.check_durable().await;
        });
    }

    fn judge_durability(&self, durability: &Durability) -> Result<(), ProgressError> {
        match durability {
            Durability::Kept | Durability::Unknown => Ok(()),
            Durability::Expires(policy, retention_ms) => Err(ProgressError::NotDurable {
                topic: self.inner.topic.clone(),
                policy: policy.clone(),
                retention_ms: retention_ms.clone(),
            }),
        }
    }

    async fn describe_retention(&self) -> Result<Durability, ProgressError> {
        let s = &self.inner.settings;
        let admin: AdminClient<LogContext> = admin_config(s)?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))?;
        // Short: a broker answers in milliseconds, and librdkafka's mock cluster (which has
        // no DescribeConfigs) only by timing out.
        let wait = Duration::from_secs(2);
        let options = AdminOptions::new().request_timeout(Some(wait));
        let described = tokio::time::timeout(
            wait * 2,
            admin.describe_configs(&[ResourceSpecifier::Topic(&self.inner.topic)], &options),
        )
        .await
        .map_err(|_| ProgressError::Timeout(wait * 2))?
        .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        let resource = match described.into_iter().next() {
            Some(Ok(resource)) => resource,
            Some(Err(code)) => return Err(ProgressError::Kafka(format!("{code:?}"))),
            None => return Ok(Durability::Unknown),
        };
        let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
        Ok(judge_retention(
            value("cleanup.policy"),
            value("retention.ms"),
            value("retention.bytes"),
        ))
    }

    /// From now on this store never creates its topic: it reads what exists (none: no
    /// record). For `outboxd check`, which changes nothing.
    pub fn never_create_topic(&self) {
        self.inner.topic_ready.store(true, Ordering::Release);
    }

    /// Whether the brokers would let [`ProgressStore`] create its missing topic: the
    /// first definition it tries, sent as a validate-only CreateTopics, which proves the
    /// Create permission without creating anything.
    pub async fn may_create_topic(&self) -> Result<(), ProgressError> {
        let options = AdminOptions::new()
            .operation_timeout(Some(ADMIN_TIMEOUT))
            .request_timeout(Some(ADMIN_TIMEOUT))
            .validate_only(true);
        let [first, ..] = self.topic_definitions();
        let results = self
            .admin()?
            .create_topics(&[first], &options)
            .await
            .map_err(|e| ProgressError::Kafka(self.inner.settings.scrub(&e.to_string())))?;
        match results.into_iter().next() {
            Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => Ok(()),
            Some(Err((topic, code))) => Err(KafkaSetupError::TopicCreation { topic, code }.into()),
        }
    }

    fn admin(&self) -> Result<AdminClient<LogContext>, KafkaSetupError> {
        let s = &self.inner.settings;
        admin_config(s)?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(s.scrub(&e.to_string())))
    }

    /// The topic as outboxd creates it, in order of preference.
    fn topic_definitions(&self) -> [NewTopic<'_>; 3] {
        // Compaction never touches the active segment, and a record is written every
        // interval while the slot moves: a 10-minute segment keeps what a start-up reads
        // to ~10 minutes of records per slot (a week's, at Kafka's default).
        let compacted_rolled = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "600000");
        let compacted = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact");
        // Kept forever instead, for brokers that refuse compaction: records are small. Never
        // a plain topic: its retention would delete the record that says a slot existed.
        let kept = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("retention.ms", "-1")
            .set("retention.bytes", "-1");
        [compacted_rolled, compacted, kept]
    }

    async fn create_topic(&self) -> Result<(), ProgressError> {
        let s = &self.inner.settings;
        let admin = self.admin()?;
        let options = AdminOptions::new()
            .operation_timeout(Some(ADMIN_TIMEOUT))
            .request_timeout(Some(ADMIN_TIMEOUT));
        for topic in self.topic_definitions() {
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
            "the broker refused every topic definition that keeps records (compacted, or retention.ms=-1)".into(),
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
        let nothing = |had_records: bool| {
            ids.iter()
                .map(|_| {
                    Ok(SlotRecords {
                        topic_had_records: had_records,
                        ..SlotRecords::default()
                    })
                })
                .collect()
        };
        let consumer = self.consumer()?;
        if !self.topic_exists(&consumer)? {
            // No topic, no record: nothing was ever recorded on this cluster.
            return Ok(nothing(false));
        }
        let deadline = Instant::now() + timeout;
        // The high watermark as a read_uncommitted client sees it, then a read_committed
        // scan up to it (Materialize's way): a read_committed client's end is the last
        // stable offset, which another writer's open transaction holds back, and the last
        // offset of a transactional write is a commit marker no message is read at.
        let (low, high) = self
            .uncommitted_consumer()?
            .fetch_watermarks(topic, 0, timeout)
            .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        if high <= low {
            return Ok(nothing(high > 0));
        }
        // Everything below `high` decided (committed or aborted) before the scan: a
        // read_committed reader's end is the last stable offset of its fetch, and an end
        // reached below `high` would pass for the scan's end once it moved on.
        while !stable_to(&consumer, topic, high) {
            if Instant::now() >= deadline {
                return Err(ProgressError::Timeout(timeout));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Offset(low))
            .map_err(|e| ProgressError::Kafka(e.to_string()))?;
        consumer
            .assign(&assignment)
            .map_err(|e| ProgressError::Kafka(s.scrub(&e.to_string())))?;
        let mut found: Vec<SlotScan> = ids.iter().map(SlotScan::new).collect();
        // The reader reached its end (the last stable offset) since the last message.
        let mut at_end = false;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ProgressError::Timeout(timeout));
            }
            match consumer.poll(remaining.min(Duration::from_millis(500))) {
                None if at_end && stable_to(&consumer, topic, high) => break,
                None => continue,
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    at_end = true;
                    if stable_to(&consumer, topic, high) {
                        break;
                    }
                }
                Some(Err(e)) if broker_unreachable(&e) => continue,
                Some(Err(e)) => return Err(ProgressError::Kafka(s.scrub(&e.to_string()))),
                Some(Ok(m)) => {
                    at_end = false;
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
            .map(|(id, scan)| scan.records(id, true))
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
        self.write_keyed(&id.key(), &record.to_json(id)).await
    }

    /// Writes the record saying that the slot is about to be created, under its own key
    /// ([`SlotIdentity::creating_key`]), and waits for the ack.
    pub async fn write_intent(
        &self,
        id: &SlotIdentity,
        record: &ProgressRecord,
    ) -> Result<(), ProgressError> {
        self.write_keyed(&id.creating_key(), &record.to_json(id))
            .await
    }

    /// Writes the slot's back-fill state ([`SlotIdentity::backfill_key`]) and waits for the ack.
    pub async fn write_backfill(
        &self,
        id: &SlotIdentity,
        state: &BackfillState,
    ) -> Result<(), ProgressError> {
        self.write_keyed(&id.backfill_key(), &state.to_json()).await
    }

    /// Writes the slot's owed re-publish ([`SlotIdentity::republish_key`]) and waits for
    /// the ack.
    pub async fn write_republish(
        &self,
        id: &SlotIdentity,
        owed: &RepublishOwed,
    ) -> Result<(), ProgressError> {
        self.write_keyed(&id.republish_key(), &owed.to_json()).await
    }

    async fn write_keyed(&self, key: &str, value: &str) -> Result<(), ProgressError> {
        self.ensure_topic().await?;
        let (done, acked) = tokio::sync::oneshot::channel();
        let record = BaseRecord::with_opaque_to(&self.inner.topic, Box::new(done))
            .partition(0)
            .key(key)
            .payload(value);
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

    /// Writes a record in the background; skipped (false) while an earlier one is unanswered.
    /// `answered` hears the outcome before the next write can start, so what it reports
    /// (the recorded position) is never overtaken by a later record. A failure is also
    /// logged: it only leaves an older record in place.
    pub fn write_in_background(
        &self,
        id: &SlotIdentity,
        record: ProgressRecord,
        answered: impl FnOnce(Result<Lsn, &ProgressError>) + Send + 'static,
    ) -> bool {
        if self.inner.write_in_flight.swap(true, Ordering::AcqRel) {
            return false;
        }
        let this = self.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let result = this.write_and_wait(&id, &record).await;
            answered(result.as_ref().map(|()| record.confirmed_lsn()));
            this.inner.write_in_flight.store(false, Ordering::Release);
            if let Err(e) = result {
                tracing::warn!(
                    topic = %this.inner.topic,
                    "writing the progress record failed: {e}; it stays at an older position (harmless: it only records that the slot exists)"
                );
            }
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{judge_retention, Durability};

    #[test]
    fn only_a_topic_that_never_deletes_records_keeps_them() {
        let judge = |p: Option<&str>, ms: Option<&str>, bytes: Option<&str>| {
            judge_retention(
                p.map(str::to_owned),
                ms.map(str::to_owned),
                bytes.map(str::to_owned),
            )
        };
        let week = Some("604800000");
        assert!(matches!(
            judge(Some("compact"), week, None),
            Durability::Kept
        ));
        assert!(matches!(
            judge(Some("delete"), Some("-1"), Some("-1")),
            Durability::Kept
        ));
        assert!(matches!(
            judge(Some("delete"), Some("-1"), None),
            Durability::Kept
        ));
        // Compacted and deleted by age, deleted by age, or by size: the record goes.
        assert!(matches!(
            judge(Some("compact,delete"), week, None),
            Durability::Expires(..)
        ));
        assert!(matches!(
            judge(Some("delete"), week, Some("-1")),
            Durability::Expires(..)
        ));
        assert!(matches!(
            judge(Some("delete"), Some("-1"), Some("1073741824")),
            Durability::Expires(..)
        ));
        // A broker that does not say: a warning, not a refusal.
        assert!(matches!(judge(None, week, None), Durability::Unknown));
    }
}
