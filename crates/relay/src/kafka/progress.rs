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

use outbox_core::{DeliveredPosition, TxnMark};
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
    /// `OUTBOXD_CLUSTER_NAME`: keeps apart copies of one cluster (same system identifier)
    /// that share one Kafka. Empty by default.
    pub cluster: String,
    /// `IDENTIFY_SYSTEM`'s system identifier: the same on a primary and its standbys, and
    /// on every clone, snapshot or restored backup of it.
    pub system_id: String,
    pub database: String,
    pub slot: String,
}

impl SlotIdentity {
    pub fn key(&self) -> String {
        if self.cluster.is_empty() {
            format!("{}/{}/{}", self.system_id, self.database, self.slot)
        } else {
            format!(
                "{}@{}/{}/{}",
                self.cluster, self.system_id, self.database, self.slot
            )
        }
    }
}

/// This process as a writer of progress records: host, process id and start time. Only
/// for operators reading the record; what ties records into one history is the lineage.
pub fn writer_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("{host}/{}/{started}", std::process::id())
    })
}

/// What a record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRecord {
    /// What it claims Kafka has: a position the slot had confirmed (everything before it
    /// is in Kafka), the transactions its last writes ended at (what a replay must show
    /// before it skips anything), its base, the partly acked transaction and the writer's
    /// settings fingerprint (see `outbox_core::delivered`).
    pub claim: DeliveredPosition,
    /// When it was written, Unix milliseconds.
    pub recorded_at_unix_ms: u64,
    /// false: written just before creating the slot, which may never have happened (the
    /// process died while CREATE_REPLICATION_SLOT waited), so a missing slot is then no
    /// proof of a lost one. Set by every later write.
    pub slot_created: bool,
    /// Which chain of claims this record continues: kept by a writer that proved (or
    /// started past) the record it read, new for one that doubted it. Two lineages
    /// alternating on one key are two live copies of one cluster.
    pub lineage: u64,
    /// Host, process id and start time of the process that wrote it (`writer_id`).
    pub writer: String,
}

impl ProgressRecord {
    /// A record of a position alone (a slot's start): it proves nothing delivered.
    pub fn now(timeline: u32, confirmed_lsn: Lsn) -> Self {
        ProgressRecord::of(DeliveredPosition::at(timeline, confirmed_lsn, 0), 0)
    }

    /// The record of a claim, in lineage `lineage`.
    pub fn of(claim: DeliveredPosition, lineage: u64) -> Self {
        ProgressRecord {
            claim,
            recorded_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            slot_created: true,
            lineage,
            writer: writer_id().to_owned(),
        }
    }

    /// The position the slot had confirmed when it was written.
    pub fn confirmed_lsn(&self) -> Lsn {
        self.claim.lsn
    }

    /// The record written before the slot is created.
    pub fn before_creation(timeline: u32, position: Lsn) -> Self {
        ProgressRecord {
            slot_created: false,
            ..ProgressRecord::now(timeline, position)
        }
    }

    fn to_json(&self, id: &SlotIdentity) -> String {
        // Marks as [seq, commit_lsn, end_lsn, xid, commit_time]: ~160 of them per record.
        let c = &self.claim;
        let marks: Vec<serde_json::Value> = c
            .marks
            .iter()
            .map(|m| {
                serde_json::json!([
                    m.seq,
                    m.commit_lsn.to_string(),
                    m.end_lsn.to_string(),
                    m.xid,
                    m.commit_time
                ])
            })
            .collect();
        serde_json::json!({
            "version": 2,
            "cluster": id.cluster,
            "system_id": id.system_id,
            "database": id.database,
            "slot": id.slot,
            "timeline": c.timeline,
            "confirmed_lsn": c.lsn.to_string(),
            "base_lsn": c.base.to_string(),
            "recorded_at_unix_ms": self.recorded_at_unix_ms,
            "slot_created": self.slot_created,
            "marks": marks,
            "partial": c.partial.map(|p| serde_json::json!({
                "commit_lsn": p.txn.commit_lsn.to_string(),
                "xid": p.txn.xid,
                "commit_time": p.txn.commit_time,
                "rows": p.rows,
            })),
            "fingerprint": format!("{:016x}", c.fingerprint),
            "lineage": format!("{:016x}", self.lineage),
            "writer": self.writer,
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
        // Absent in records written before it existed: those were all written for slots.
        let slot_created = v
            .get("slot_created")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        // Version 1 records have no marks, no fingerprint and a partial transaction named
        // by its position alone: they prove nothing, so they skip nothing. A field that
        // does not read whole is left out the same way.
        let lsn_of = |v: &serde_json::Value| v.as_str().and_then(|t| t.parse::<Lsn>().ok());
        let marks = v
            .get("marks")
            .and_then(serde_json::Value::as_array)
            .map(|all| {
                all.iter()
                    .take(outbox_core::delivered::MAX_MARKS)
                    .filter_map(|m| {
                        Some(TxnMark {
                            seq: m.get(0)?.as_u64()?,
                            commit_lsn: lsn_of(m.get(1)?)?,
                            end_lsn: lsn_of(m.get(2)?)?,
                            xid: u32::try_from(m.get(3)?.as_u64()?).ok()?,
                            commit_time: m.get(4)?.as_i64()?,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let partial = v.get("partial").and_then(|p| {
            Some(outbox_core::PartialTxn {
                txn: outbox_core::TxnId {
                    commit_lsn: lsn_of(p.get("commit_lsn")?)?,
                    xid: u32::try_from(p.get("xid")?.as_u64()?).ok()?,
                    commit_time: p.get("commit_time")?.as_i64()?,
                },
                rows: p.get("rows")?.as_u64()?,
            })
        });
        let hex = |name: &str| {
            v.get(name)
                .and_then(serde_json::Value::as_str)
                .and_then(|t| u64::from_str_radix(t, 16).ok())
        };
        let fingerprint = hex("fingerprint");
        let base = v.get("base_lsn").and_then(lsn_of);
        let (marks, partial, base) = match (fingerprint, base) {
            (Some(_), Some(base)) => (marks, partial, base),
            _ => (Vec::new(), None, confirmed_lsn),
        };
        Ok(ProgressRecord {
            claim: DeliveredPosition {
                timeline,
                lsn: confirmed_lsn,
                base,
                marks,
                partial,
                fingerprint: fingerprint.unwrap_or(0),
            },
            recorded_at_unix_ms,
            slot_created,
            lineage: hex("lineage").unwrap_or(0),
            writer: v
                .get("writer")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_owned(),
        })
    }

    /// Whose record this is (from the fields inside it), and what it says; `None` for a
    /// value that is not a readable record.
    fn owner_from_json(bytes: &[u8]) -> Option<(SlotIdentity, Self)> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let text = |name: &str| v.get(name)?.as_str().map(str::to_owned);
        let owner = SlotIdentity {
            cluster: text("cluster").unwrap_or_default(),
            system_id: text("system_id")?,
            database: text("database")?,
            slot: text("slot")?,
        };
        Some((owner, ProgressRecord::from_json(bytes).ok()?))
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
    /// Lineages of this slot's most recent records still in the topic (the last few
    /// runs), oldest first, repeats in a row folded: `[a, b, a]` means two live writers
    /// take turns.
    pub lineages: Vec<u64>,
}

impl SlotRecords {
    /// Whether the retained records of this key show two lineages taking turns (A, B,
    /// A): two live copies of one cluster record under one key.
    pub fn writers_alternate(&self) -> bool {
        self.lineages
            .iter()
            .enumerate()
            .any(|(i, l)| self.lineages[i + 1..].iter().skip(1).any(|m| m == l))
    }
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

/// Lineage runs of a key kept from one read of the topic: enough to see two live writers
/// take turns, few enough that an alternation long gone (a takeover and back, days ago,
/// still in the active segment of a tiny compacted topic) ages out.
const RECENT_LINEAGES: usize = 6;

/// What one read of the topic found for one slot.
struct SlotScan {
    key: String,
    /// Keys end with the database and slot: a cheap filter before parsing the value.
    same_slot_suffix: String,
    latest: Option<Option<Vec<u8>>>,
    lineages: Vec<u64>,
    /// Newest value per key of another cluster's record of this slot (None: deleted).
    others: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl SlotScan {
    fn new(id: &SlotIdentity) -> Self {
        SlotScan {
            key: id.key(),
            same_slot_suffix: format!("/{}/{}", id.database, id.slot),
            latest: None,
            lineages: Vec::new(),
            others: BTreeMap::new(),
        }
    }

    fn see(&mut self, key: &[u8], payload: Option<&[u8]>) {
        if key == self.key.as_bytes() {
            let lineage = payload
                .and_then(|p| ProgressRecord::from_json(p).ok())
                .map(|r| r.lineage);
            if let Some(l) = lineage.filter(|l| *l != 0) {
                if self.lineages.last() != Some(&l) {
                    self.lineages.push(l);
                    // Only recent history: every clean restart starts a lineage.
                    if self.lineages.len() > RECENT_LINEAGES {
                        self.lineages.remove(0);
                    }
                }
            }
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
                // A record of this system identifier under another OUTBOXD_CLUSTER_NAME is
                // another copy of this cluster, named apart on purpose: neither ours nor
                // another cluster's.
                (owner.database == id.database
                    && owner.slot == id.slot
                    && owner.system_id != id.system_id)
                    .then_some((owner.system_id, record))
            })
            .collect();
        Ok(SlotRecords {
            ours,
            other_clusters,
            lineages: self.lineages,
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
    /// Another lineage was seen writing this store's slot record: from then on this
    /// process skips nothing for it (see `outbox_core::delivered`).
    foreign_writer: AtomicBool,
    lineage_check_in_flight: AtomicBool,
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
                foreign_writer: AtomicBool::new(false),
                lineage_check_in_flight: AtomicBool::new(false),
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
        // Compaction never touches the active segment, and a record is written every
        // interval while the slot moves: a 10-minute segment keeps what a start-up reads
        // to ~10 minutes of records per slot (a week's, at Kafka's default).
        let compacted_rolled = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "600000");
        let compacted = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact");
        let plain = NewTopic::new(&self.inner.topic, 1, TopicReplication::Fixed(-1));
        for topic in [compacted_rolled, compacted, plain] {
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
    use super::*;

    #[test]
    fn record_round_trips_and_dates_render() {
        let id = SlotIdentity {
            cluster: String::new(),
            system_id: "7312".into(),
            database: "shop".into(),
            slot: "outboxd".into(),
        };
        let r = ProgressRecord {
            claim: DeliveredPosition {
                timeline: 3,
                lsn: Lsn(0x1_0000_00A0),
                base: Lsn(0x1_0000_0010),
                marks: vec![TxnMark {
                    seq: 4,
                    commit_lsn: Lsn(0x1_0000_0050),
                    end_lsn: Lsn(0x1_0000_00A0),
                    xid: 771,
                    commit_time: 817_000_000_123_456,
                }],
                partial: Some(outbox_core::PartialTxn {
                    txn: outbox_core::TxnId {
                        commit_lsn: Lsn(0x1_0000_0100),
                        xid: 772,
                        commit_time: 817_000_000_223_456,
                    },
                    rows: 12,
                }),
                fingerprint: 0xfeed_beef_0000_0001,
            },
            recorded_at_unix_ms: 1_764_590_400_000,
            slot_created: true,
            lineage: 0x0123_4567_89ab_cdef,
            writer: "host/1/2".into(),
        };
        let json = r.to_json(&id);
        assert_eq!(ProgressRecord::from_json(json.as_bytes()), Ok(r.clone()));
        let mut whole = r.clone();
        whole.claim.partial = None;
        assert_eq!(
            ProgressRecord::from_json(whole.to_json(&id).as_bytes()),
            Ok(whole)
        );
        assert_eq!(id.key(), "7312/shop/outboxd");
        let named = SlotIdentity {
            cluster: "staging".into(),
            ..id
        };
        assert_eq!(named.key(), "staging@7312/shop/outboxd");
        // A version 1 record proves nothing: no marks, no partial transaction.
        let v1 = br#"{"version":1,"system_id":"7312","database":"shop","slot":"outboxd","timeline":1,"confirmed_lsn":"0/10","recorded_at_unix_ms":1,"last_commit_unix_micros":5,"slot_created":true,"partial_commit_lsn":"0/20","partial_rows_acked":3}"#;
        let old = ProgressRecord::from_json(v1).unwrap();
        assert_eq!(
            (
                old.claim.marks.len(),
                old.claim.partial,
                old.claim.fingerprint
            ),
            (0, None, 0)
        );
        assert_eq!(r.recorded_at_text(), "2025-12-01T12:00:00Z");
        assert!(ProgressRecord::from_json(b"{}").is_err());
    }

    #[test]
    fn a_copy_named_apart_is_not_another_cluster() {
        let unnamed = SlotIdentity {
            cluster: String::new(),
            system_id: "7312".into(),
            database: "shop".into(),
            slot: "outboxd".into(),
        };
        let named = SlotIdentity {
            cluster: "staging".into(),
            ..unnamed.clone()
        };
        let other = SlotIdentity {
            system_id: "9999".into(),
            ..unnamed.clone()
        };
        let record = ProgressRecord::now(1, Lsn(0x10));
        let mut scan = SlotScan::new(&named);
        for id in [&unnamed, &other] {
            scan.see(id.key().as_bytes(), Some(record.to_json(id).as_bytes()));
        }
        let found = scan.records(&named).unwrap();
        assert_eq!(found.ours, None);
        let others: Vec<&str> = found
            .other_clusters
            .iter()
            .map(|(s, _)| s.as_str())
            .collect();
        assert_eq!(
            others,
            ["9999"],
            "the unnamed copy of 7312 is not another cluster"
        );
    }
}
