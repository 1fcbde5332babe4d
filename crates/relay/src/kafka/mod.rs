//! Kafka side of the relay: one idempotent, ordered producer whose delivery reports feed
//! the ack watermark (docs/replication-protocol.md §5).
//!
//! - `settings`: what the operator configures, env-var mapping, secret redaction.
//! - `config`: the fixed safety settings and which overrides are refused, and why.
//! - `producer`: building the producer, sending, flushing, purging, metadata, topics.
//! - `context`: librdkafka callbacks (logs → `tracing`, fatal errors, deliveries).
//! - `delivery`: the delivery report type and permanent/retryable classification.
//! - `progress`: the per-slot progress record that makes a lost slot loud.
//! - `stable`: partitions' last stable offsets (a transaction Kafka left open).

mod config;
mod context;
mod delivery;
mod error;
mod probe;
mod producer;
mod progress;
mod settings;
mod stable;

#[cfg(test)]
mod mock_tests;

pub use config::check_producer_settings;
pub use delivery::{is_permanent, Delivered, Delivery, DeliveryFailure, DeliverySink};
pub use error::KafkaSetupError;
pub use probe::BrokerProbe;
pub use producer::{
    build_producer, build_transactional_producer, BrokerAddress, BrokerInfo, FlushError,
    OutgoingRecord, RelayProducer, SendError, TxnError,
};
pub use progress::{
    pg_time_text, republish_text, BackfillState, ProgressError, ProgressRecord, ProgressStore,
    PublicationSeen, RepublishOwed, SlotIdentity, SlotRecords, EMITTED_LOST_TEXT,
};
pub use rdkafka::types::RDKafkaErrorCode;
pub use settings::{
    env_var_of_property, is_secret_property, kafka_property_from_env, transaction_timeout_in,
    ProducerSettings, RedactedSettings, Transactions, KAFKA_ENV_PREFIX, QUEUE_MAX_KBYTES_DEFAULT,
};
pub use stable::{content_hash, StableOffsets};
