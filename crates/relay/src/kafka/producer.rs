//! The relay's one producer: built from settings, sends borrowed records with a ticket,
//! and reports each ticket exactly once through the delivery sink.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, PurgeConfig};
use rdkafka::types::RDKafkaErrorCode;

use super::config::{admin_config, producer_config, transactional_producer_config};
use super::context::{LogContext, RelayContext};
use super::delivery::DeliverySink;
use super::error::KafkaSetupError;
use super::settings::ProducerSettings;

/// A record to produce, borrowed from the pipeline's own record type; librdkafka makes
/// the only copy.
#[derive(Debug, Clone, Copy)]
pub struct OutgoingRecord<'a> {
    pub topic: &'a str,
    /// Partitioned by murmur2 like Java clients; `None` spreads at random.
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, &'a [u8])],
    /// `None` lets librdkafka stamp the current time.
    pub timestamp_millis: Option<i64>,
}

impl OutgoingRecord<'_> {
    /// The size librdkafka compares with `message.max.bytes`
    /// ([`outbox_core::record_wire_size`]), as reported in [`SendError::MessageTooLarge`].
    pub fn wire_size(&self) -> usize {
        outbox_core::record_wire_size(
            self.key.map_or(0, <[u8]>::len),
            self.value.map_or(0, <[u8]>::len),
            self.headers.iter().map(|(k, v)| (k.len(), v.len())),
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// librdkafka's queue is full: back-pressure. Wait for deliveries, then send again.
    #[error("Kafka producer queue is full")]
    QueueFull,
    /// This record can never be produced with the current `message.max.bytes`:
    /// dead-letter it. `size` is [`OutgoingRecord::wire_size`].
    #[error("record of {size} bytes (with Kafka's framing) is larger than the producer's message.max.bytes")]
    MessageTooLarge { size: usize },
    /// The topic name cannot be used (e.g. contains NUL): dead-letter the record.
    #[error("invalid Kafka topic name {0:?}")]
    InvalidTopic(String),
    /// The producer is unusable; build a new one and restart from the slot.
    #[error("Kafka producer failed fatally: {0}")]
    Fatal(String),
    #[error("producing to Kafka failed: {code} ({code:?})")]
    Other { code: RDKafkaErrorCode },
}

#[derive(Debug, thiserror::Error)]
#[error("Kafka flush did not complete: {code} ({code:?})")]
pub struct FlushError {
    pub code: RDKafkaErrorCode,
}

pub use outbox_core::TxnError;

/// librdkafka's error class of a transaction call's failure.
fn txn_error(error: &KafkaError) -> TxnError {
    match error {
        KafkaError::Transaction(e) => {
            let text = format!("{} ({:?}): {}", e.name(), e.code(), e.string());
            let fenced = matches!(
                e.code(),
                RDKafkaErrorCode::Fenced
                    | RDKafkaErrorCode::ProducerFenced
                    | RDKafkaErrorCode::InvalidProducerEpoch
            );
            if fenced {
                TxnError::Fenced(text)
            } else if e.is_fatal() {
                TxnError::Fatal(text)
            } else if e.txn_requires_abort() {
                TxnError::Abortable(text)
            } else if e.is_retriable() {
                TxnError::Retriable(text)
            } else {
                // A state error: a bug here, which a fresh producer clears.
                TxnError::Abortable(text)
            }
        }
        // The flush before a commit timed out: the commit itself was not tried.
        KafkaError::Flush(code) => TxnError::Retriable(format!("flush: {code} ({code:?})")),
        other => TxnError::Abortable(other.to_string()),
    }
}

/// What `check_broker_reachable` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub cluster_id: Option<String>,
    /// The broker that answered the metadata request.
    pub answered_by: String,
    pub brokers: Vec<BrokerAddress>,
    pub topic_count: usize,
    /// The topics the brokers listed without an error: those that exist and that this
    /// principal may Describe.
    pub topics: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

/// How long one call of the polling thread waits for events. rust-rdkafka's poll loop
/// rounds its remaining time down to whole milliseconds and spins through the last one
/// (`rd_kafka_queue_poll(0)` until the deadline): ~1 ms of busy CPU per call. Its
/// `ThreadedProducer` calls it every 100 ms: 0.5-1 % of a core per producer, busy or
/// idle (measured ~7 ms/s on an idle one: ~7 µs per event at 1,000 events/s). Within the
/// call every event is served as it comes; only the stop flag is looked at less often.
const POLL_PERIOD: Duration = Duration::from_secs(1);

/// rust-rdkafka's `commit_transaction` flushes first, and its flush, with anything still
/// in flight, sits in a `poll` of up to 100 ms for an event that the polling thread
/// ([`spawn_poller`]) takes instead: every commit took ~100 ms longer. The session waits
/// for the last delivery report before committing, but the polling thread frees that
/// message (or serves another event) just after handing the report over, and 2 % of
/// commits still lost the race. So what is left is flushed in steps this short first.
const COMMIT_FLUSH_STEP: Duration = Duration::from_millis(1);

/// Polls `producer` on a detached thread, [`POLL_PERIOD`] per call (events are served as
/// they come), until the returned flag is set; the thread then drops its handle, and with the
/// last one librdkafka's teardown runs there, not in whoever dropped the producer.
pub(crate) fn spawn_poller<C>(
    producer: &Arc<BaseProducer<C>>,
) -> Result<Arc<AtomicBool>, KafkaSetupError>
where
    C: rdkafka::producer::ProducerContext + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let (polled, stopped) = (Arc::clone(producer), Arc::clone(&stop));
    std::thread::Builder::new()
        .name("kafka-poll".into())
        .spawn(move || {
            // Not `poll(ZERO)` on a timer while messages are in flight (one wake-up per
            // batch of reports rather than per ProduceResponse): it serves a single
            // event per call, and at 5,000 events/s the reports fell behind until the
            // in-flight cap stopped the stream for seconds (tried, measured, reverted).
            while !stopped.load(Ordering::Acquire) {
                polled.poll(POLL_PERIOD);
            }
        })
        .map_err(|e| {
            KafkaSetupError::Client(format!("starting the producer's polling thread: {e}"))
        })?;
    Ok(stop)
}

/// The relay's producer. Deliveries go to the sink given to [`build_producer`].
pub struct RelayProducer {
    inner: Arc<BaseProducer<RelayContext>>,
    /// Tells the polling thread to end after its current wait.
    stop: Arc<AtomicBool>,
    settings: ProducerSettings,
    /// Made with a transactional.id (exactly-once mode).
    transactional: bool,
}

impl Drop for RelayProducer {
    fn drop(&mut self) {
        // Nothing may reach the broker once the pipeline let go of the producer (a late
        // write would land after a replay from the slot), so purge now rather than when
        // the polling thread drops the last handle (within POLL_PERIOD; librdkafka's own
        // drop purges again and waits briefly for the purge reports there).
        self.inner
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
        self.stop.store(true, Ordering::Release);
    }
}

/// The one constructor for Kafka clients: every setting and safety check goes through
/// here (and `config.rs`), auxiliary clients reuse the same settings.
pub fn build_producer(
    settings: &ProducerSettings,
    deliveries: DeliverySink,
) -> Result<RelayProducer, KafkaSetupError> {
    build(settings, deliveries, None)
}

/// [`build_producer`] for the exactly-once mode: a transactional producer, with
/// `transactional_id` (the slot's, see [`crate::kafka::SlotIdentity::transactional_id`]).
/// Call [`RelayProducer::init_transactions`] before anything else.
pub fn build_transactional_producer(
    settings: &ProducerSettings,
    deliveries: DeliverySink,
    transactional_id: &str,
) -> Result<RelayProducer, KafkaSetupError> {
    build(settings, deliveries, Some(transactional_id))
}

fn build(
    settings: &ProducerSettings,
    deliveries: DeliverySink,
    transactional_id: Option<&str>,
) -> Result<RelayProducer, KafkaSetupError> {
    let config = match transactional_id {
        Some(id) => transactional_producer_config(settings, id)?,
        None => producer_config(settings)?,
    };
    let inner: Arc<BaseProducer<RelayContext>> = Arc::new(
        config
            .create_with_context(RelayContext::new(deliveries, transactional_id.is_some()))
            .map_err(|e| KafkaSetupError::Client(settings.scrub(&e.to_string())))?,
    );
    let stop = spawn_poller(&inner)?;
    tracing::info!(settings = %settings.redacted(), "Kafka producer created");
    Ok(RelayProducer {
        inner,
        stop,
        settings: settings.clone(),
        transactional: transactional_id.is_some(),
    })
}

impl RelayProducer {
    /// Sends a record of the mapping ([`outbox_core::OutboxRecord`]) as it is: streamed
    /// and back-filled rows alike.
    pub fn send_outbox(
        &self,
        rec: &outbox_core::OutboxRecord,
        ticket: usize,
    ) -> Result<(), SendError> {
        let headers: Vec<(&str, &[u8])> = rec
            .headers
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .collect();
        self.send(
            &OutgoingRecord {
                topic: &rec.topic,
                key: rec.key.as_deref(),
                value: rec.value.as_deref(),
                headers: &headers,
                timestamp_millis: Some(rec.timestamp_millis),
            },
            ticket,
        )
    }

    /// Enqueues one record; `ticket` comes back in exactly one `Delivery`. Never blocks.
    pub fn send(&self, rec: &OutgoingRecord<'_>, ticket: usize) -> Result<(), SendError> {
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(rec.topic, ticket);
        if let Some(key) = rec.key {
            record = record.key(key);
        }
        if let Some(value) = rec.value {
            record = record.payload(value);
        }
        if let Some(ts) = rec.timestamp_millis {
            record = record.timestamp(ts);
        }
        if !rec.headers.is_empty() {
            let headers = rec.headers.iter().fold(
                OwnedHeaders::new_with_capacity(rec.headers.len()),
                |acc, &(key, value)| {
                    acc.insert(Header {
                        key,
                        value: Some(value),
                    })
                },
            );
            record = record.headers(headers);
        }
        self.inner
            .send(record)
            .map_err(|(error, _)| self.send_error(&error, rec))
    }

    fn send_error(&self, error: &KafkaError, rec: &OutgoingRecord<'_>) -> SendError {
        match error {
            KafkaError::Nul(_) => return SendError::InvalidTopic(rec.topic.to_owned()),
            KafkaError::MessageProduction(code) => match code {
                RDKafkaErrorCode::QueueFull => return SendError::QueueFull,
                RDKafkaErrorCode::MessageSizeTooLarge => {
                    return SendError::MessageTooLarge {
                        size: rec.wire_size(),
                    }
                }
                RDKafkaErrorCode::InvalidTopic => {
                    return SendError::InvalidTopic(rec.topic.to_owned())
                }
                RDKafkaErrorCode::Fatal => {
                    let reason = self.is_fatal().unwrap_or_else(|| error.to_string());
                    return SendError::Fatal(reason);
                }
                _ => {}
            },
            _ => {}
        }
        SendError::Other {
            code: error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// Registers the transactional.id with its coordinator: bumps the epoch, which fences
    /// any other producer with the same id and aborts its open transaction (waiting for
    /// that). Runs off the runtime's thread.
    pub async fn init_transactions(&self, timeout: Duration) -> Result<(), TxnError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.init_transactions(timeout))
            .await
            .map_err(|e| TxnError::Fatal(format!("init_transactions task failed: {e}")))?
            .map_err(|e| txn_error(&e))
    }

    /// Begins a Kafka transaction (local: no request).
    pub fn begin_transaction(&self) -> Result<(), TxnError> {
        self.inner.begin_transaction().map_err(|e| txn_error(&e))
    }

    /// Flushes and commits the open transaction. Runs off the runtime's thread. Call it
    /// once every delivery report came, or each commit may take 100 ms longer: see
    /// `COMMIT_FLUSH_STEP`.
    pub async fn commit_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let until = std::time::Instant::now() + timeout;
            while inner.in_flight_count() > 0 && std::time::Instant::now() < until {
                // A timeout here is only the next step's business.
                let _ = inner.flush(COMMIT_FLUSH_STEP);
            }
            inner.commit_transaction(timeout)
        })
        .await
        .map_err(|e| TxnError::Fatal(format!("commit_transaction task failed: {e}")))?
        .map_err(|e| txn_error(&e))
    }

    /// Aborts the open transaction. Runs off the runtime's thread.
    pub async fn abort_transaction(&self, timeout: Duration) -> Result<(), TxnError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.abort_transaction(timeout))
            .await
            .map_err(|e| TxnError::Fatal(format!("abort_transaction task failed: {e}")))?
            .map_err(|e| txn_error(&e))
    }

    /// Enqueues a keyed record for partition 0 of `topic` (the progress record's place,
    /// see `ProgressStore::write_and_wait`); `ticket` comes back like [`Self::send`]'s.
    pub fn send_to_first_partition(
        &self,
        topic: &str,
        key: &[u8],
        value: &[u8],
        ticket: usize,
    ) -> Result<(), SendError> {
        let record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(topic, ticket)
            .partition(0)
            .key(key)
            .payload(value);
        let rec = OutgoingRecord {
            topic,
            key: Some(key),
            value: Some(value),
            headers: &[],
            timestamp_millis: None,
        };
        self.inner
            .send(record)
            .map_err(|(error, _)| self.send_error(&error, &rec))
    }

    /// Messages librdkafka holds (queued, in flight, or with a report not yet handed to
    /// the sink).
    pub fn in_flight(&self) -> usize {
        usize::try_from(self.inner.in_flight_count()).unwrap_or(0)
    }

    /// The fatal error, if the producer has one: it will not deliver anything again.
    pub fn is_fatal(&self) -> Option<String> {
        if let Some((code, reason)) = self.inner.client().fatal_error() {
            return Some(format!("{code} ({code:?}): {reason}"));
        }
        self.inner.context().fatal().map(str::to_owned)
    }

    /// Waits until librdkafka holds no messages. Blocks the calling thread (use
    /// `spawn_blocking`); delivery reports may be handed to the sink from this thread.
    pub fn flush(&self, timeout: Duration) -> Result<(), FlushError> {
        self.inner.flush(timeout).map_err(|e| FlushError {
            code: e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
        })
    }

    /// Abandons the producer after an error: drops queued and in-flight messages so none
    /// of them reaches the broker after the pipeline restarts from the slot (a late
    /// write there would land after, and out of order with, the replay). Purged messages
    /// are reported to the sink as failed; create a fresh sink for the next producer.
    /// Does not block: librdkafka's own teardown runs on the polling thread.
    pub fn purge_and_close(self) {
        // Drop purges (see `Drop for RelayProducer`).
        drop(self);
    }

    /// Whether the brokers say `topic` does not exist: a metadata answer that names it
    /// with UNKNOWN_TOPIC_OR_PARTITION. `false` when they cannot be asked, or know it
    /// (perhaps without a leader for now). Blocks up to `timeout`.
    pub async fn topic_is_missing(&self, topic: &str, timeout: Duration) -> bool {
        let inner = Arc::clone(&self.inner);
        let topic = topic.to_owned();
        // librdkafka's metadata call blocks: off the runtime's only thread.
        tokio::task::spawn_blocking(move || {
            let Ok(metadata) = inner.client().fetch_metadata(Some(&topic), timeout) else {
                return false;
            };
            metadata.topics().iter().any(|t| {
                t.name() == topic
                    && matches!(
                        t.error().map(RDKafkaErrorCode::from),
                        Some(
                            RDKafkaErrorCode::UnknownTopicOrPartition
                                | RDKafkaErrorCode::UnknownTopic
                        )
                    )
            })
        })
        .await
        .unwrap_or(false)
    }

    /// Fetches cluster metadata, proving the brokers are reachable with these settings.
    /// Blocks up to `timeout`. One request for all topics: asking for a named topic is
    /// what makes a broker with `auto.create.topics.enable` create it.
    pub fn check_broker_reachable(&self, timeout: Duration) -> Result<BrokerInfo, KafkaSetupError> {
        let client = self.inner.client();
        let metadata =
            client
                .fetch_metadata(None, timeout)
                .map_err(|e| KafkaSetupError::Unreachable {
                    servers: self.settings.bootstrap_servers.clone(),
                    message: self.settings.scrub(&e.to_string()),
                })?;
        let brokers = metadata
            .brokers()
            .iter()
            .map(|b| BrokerAddress {
                id: b.id(),
                host: b.host().to_owned(),
                port: b.port(),
            })
            .collect();
        Ok(BrokerInfo {
            cluster_id: client.fetch_cluster_id(timeout),
            answered_by: metadata.orig_broker_name().to_owned(),
            brokers,
            topic_count: metadata.topics().len(),
            topics: metadata
                .topics()
                .iter()
                .filter(|t| t.error().is_none())
                .map(|t| t.name().to_owned())
                .collect(),
        })
    }

    /// Whether broker `id` creates a topic when a client first asks for it
    /// (`auto.create.topics.enable`), as its configuration says (DescribeConfigs on the
    /// cluster). The relay's producer asks for every topic it writes, so on such brokers
    /// a missing topic is created with the brokers' defaults rather than refused.
    pub async fn broker_creates_topics(
        &self,
        id: i32,
        timeout: Duration,
    ) -> Result<bool, KafkaSetupError> {
        Ok(self
            .broker_config(id, "auto.create.topics.enable", timeout)
            .await?
            .is_some_and(|v| v.eq_ignore_ascii_case("true")))
    }

    /// Broker `id`'s setting `name` as its configuration says (DescribeConfigs on the
    /// cluster); `None` when it has no value.
    pub async fn broker_config(
        &self,
        id: i32,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<String>, KafkaSetupError> {
        let admin: AdminClient<LogContext> = admin_config(&self.settings)?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(self.settings.scrub(&e.to_string())))?;
        let options = AdminOptions::new().request_timeout(Some(timeout));
        let described = admin
            .describe_configs(&[ResourceSpecifier::Broker(id)], &options)
            .await
            .map_err(|e| KafkaSetupError::Admin(self.settings.scrub(&e.to_string())))?;
        match described.into_iter().next() {
            Some(Ok(resource)) => Ok(resource.get(name).and_then(|e| e.value.clone())),
            Some(Err(code)) => Err(KafkaSetupError::Admin(format!(
                "describing broker {id}'s configuration: {code} ({code:?})"
            ))),
            None => Err(KafkaSetupError::Admin(format!(
                "describing broker {id}'s configuration: no answer"
            ))),
        }
    }

    /// Creates missing topics (existing ones are left as they are). For tests and
    /// development; production topics belong to the platform team.
    pub async fn ensure_topics(
        &self,
        topics: &[String],
        partitions: i32,
        replication: i32,
        timeout: Duration,
    ) -> Result<(), KafkaSetupError> {
        let admin: AdminClient<LogContext> = admin_config(&self.settings)?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(self.settings.scrub(&e.to_string())))?;
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
            .collect();
        let options = AdminOptions::new()
            .operation_timeout(Some(timeout))
            .request_timeout(Some(timeout));
        let results = admin
            .create_topics(&new_topics, &options)
            .await
            .map_err(|e| KafkaSetupError::Admin(self.settings.scrub(&e.to_string())))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(KafkaSetupError::TopicCreation { topic, code }),
            }
        }
        Ok(())
    }
}
