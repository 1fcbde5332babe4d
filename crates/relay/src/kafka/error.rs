//! Errors from setting up or inspecting Kafka clients. librdkafka messages are kept as
//! scrubbed strings because some of them echo configuration values, secrets included.

use rdkafka::types::RDKafkaErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum KafkaSetupError {
    /// An override would weaken ordering or acknowledgement guarantees.
    #[error("Kafka property `{property}` = `{value}` is refused: {reason}")]
    RefusedOverride {
        property: String,
        value: String,
        reason: &'static str,
    },
    #[error("invalid Kafka producer settings: {0}")]
    InvalidSettings(String),
    /// librdkafka refused a property's name or value.
    #[error("Kafka property `{property}` is refused by librdkafka: {message}")]
    InvalidProperty { property: String, message: String },
    /// librdkafka rejected the configuration or could not create the client.
    #[error("creating the Kafka client failed: {0}")]
    Client(String),
    #[error("Kafka brokers {servers} not reachable: {message}")]
    Unreachable { servers: String, message: String },
    #[error("creating Kafka topic `{topic}` failed: {code} ({code:?})")]
    TopicCreation {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("Kafka admin request failed: {0}")]
    Admin(String),
}
