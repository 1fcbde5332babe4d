//! Delivery reports as the pipeline sees them, and the single decision about which
//! delivery errors are permanent.
//!
//! Any failed delivery stops progress: re-sending one message alone would reorder its
//! aggregate (docs/replication-protocol.md §5), so the pipeline tears the producer down and
//! replays from the slot. The classification only decides whether that replay can
//! possibly help (retryable) or an operator must act first (permanent).

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Where deliveries go. Unbounded on purpose: librdkafka calls `delivery()` on its poll
/// thread, which must never block (a blocked poll thread also stalls `flush()` and
/// purge reports, and the pipeline may be the one waiting on those). Memory stays
/// bounded because the pipeline caps messages in flight: every queued `Delivery`
/// belongs to a message it counted as sent and has not yet received a report for,
/// so the channel never holds more than the cap.
pub type DeliverySink = tokio::sync::mpsc::UnboundedSender<Delivery>;

/// One delivery report, exactly one per successfully enqueued message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The ticket passed to `RelayProducer::send`.
    pub ticket: usize,
    pub outcome: Result<Delivered, DeliveryFailure>,
    /// When librdkafka reported it (Unix microseconds): the pipeline takes reports in
    /// batches, so its own clock would add the batch's wait to the commit-to-ack time.
    pub at_unix_micros: i64,
}

/// Where the broker stored the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
    /// The record's content hashed ([`crate::kafka::content_hash`]), from a
    /// transactional producer only.
    pub content: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Kafka delivery failed: {message} ({code:?}, {})", if *.retriable { "retryable" } else { "permanent" })]
pub struct DeliveryFailure {
    pub code: RDKafkaErrorCode,
    pub message: String,
    /// Whether restarting from the slot can succeed without operator action.
    pub retriable: bool,
}

impl DeliveryFailure {
    /// Whether the code is one a topic that does not exist gives (it is also what a
    /// partition without a leader for now gives, so it alone proves nothing).
    pub fn may_be_a_missing_topic(&self) -> bool {
        matches!(
            self.code,
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic
        )
    }

    /// The failure once the brokers said `topic` does not exist: a configuration error.
    /// Retrying would re-send every message behind it on each attempt, forever.
    pub fn missing_topic(self, topic: &str) -> Self {
        Self {
            message: format!(
                "{}: topic {topic:?} does not exist, and the brokers do not create topics on \
                 first use. Create it (kafka-topics --bootstrap-server BROKER --create --topic \
                 {topic} --partitions N --replication-factor R), or fix the setting that named \
                 it if the name is wrong (OUTBOXD_TOPIC, or OUTBOXD_DEAD_LETTER_TOPIC for dead \
                 letters), then start outboxd again: nothing was confirmed past this event, so \
                 it is published then",
                self.message
            ),
            retriable: false,
            ..self
        }
    }

    pub(crate) fn from_kafka_error(err: &KafkaError) -> Self {
        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        let message = match fix(code) {
            Some(fix) => format!("{err}: {fix}"),
            None => err.to_string(),
        };
        Self {
            code,
            message,
            retriable: !is_permanent(code),
        }
    }
}

/// The timestamp check's cause and fix, said once for both codes that carry it.
// outboxd stamps each record with its transaction's commit time, and Kafka refuses a
// timestamp further ahead of the broker's clock than the topic's
// message.timestamp.after.max.ms (one hour by default since Kafka 4). Against Apache Kafka
// 4.4, librdkafka 2.12 reported that refusal as INVALID_RECORD; other brokers and versions
// say INVALID_TIMESTAMP.
macro_rules! timestamp_fix {
    () => {
        "outboxd stamps each record with its transaction's commit time on the primary, and \
         Kafka refuses a timestamp further ahead of the broker's clock than the topic's \
         message.timestamp.after.max.ms (Kafka 3.6+; 1 hour by default from Kafka 4), or \
         older than message.timestamp.before.max.ms (raise that one for an old backlog). \
         Compare the primary's clock with the broker's. Transactions already committed keep \
         their commit times, so fixing the clock alone does not let them through: raise the \
         setting on every outboxd topic (the event topics and the dead-letter topic), e.g. \
         kafka-configs --bootstrap-server BROKER --alter --entity-type topics --entity-name \
         TOPIC --add-config message.timestamp.after.max.ms=86400000, fix the clock, and start \
         outboxd again: nothing was confirmed past this transaction, so it is published then"
    };
}

/// What an operator does about a permanent error whose broker message does not say it.
fn fix(code: RDKafkaErrorCode) -> Option<&'static str> {
    match code {
        RDKafkaErrorCode::InvalidTimestamp => Some(timestamp_fix!()),
        RDKafkaErrorCode::InvalidRecord => Some(concat!(
            "the broker refused the record. If the primary's clock runs ahead of the \
             broker's, this is the timestamp check: ",
            timestamp_fix!(),
            ". Otherwise: a record without a key on a compacted topic (dead letters of rows \
             without an aggregate id have none: the dead-letter topic must not be compacted), \
             or a record validator of the cluster; the broker's log names it"
        )),
        _ => None,
    }
}

/// Errors that replaying the same records cannot fix: the record or batch is too big
/// for the broker, the topic is invalid or forbidden, or the broker refuses the record
/// or its format. Everything else (timeouts, leader changes, transport, purges after a
/// restart, even a fatal idempotence error that a fresh producer clears) is retryable.
pub fn is_permanent(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::MessageSizeTooLarge
            | C::MessageBatchTooLarge
            | C::InvalidTopic
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::InvalidRecord
            | C::PolicyViolation
            | C::InvalidRequiredAcks
            | C::InvalidTimestamp
            | C::UnsupportedCompressionType
            | C::UnsupportedForMessageFormat
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    #[test]
    fn classification_table() {
        let table: &[(RDKafkaErrorCode, bool)] = &[
            (C::MessageSizeTooLarge, true),
            (C::MessageBatchTooLarge, true),
            (C::TopicAuthorizationFailed, true),
            (C::ClusterAuthorizationFailed, true),
            (C::InvalidTopic, true),
            (C::InvalidRecord, true),
            (C::PolicyViolation, true),
            (C::SaslAuthenticationFailed, true),
            (C::UnsupportedCompressionType, true),
            (C::InvalidTimestamp, true),
            (C::MessageTimedOut, false),
            (C::RequestTimedOut, false),
            (C::NotLeaderForPartition, false),
            (C::LeaderNotAvailable, false),
            (C::NotEnoughReplicas, false),
            (C::NotEnoughReplicasAfterAppend, false),
            (C::BrokerTransportFailure, false),
            (C::AllBrokersDown, false),
            (C::UnknownTopicOrPartition, false),
            (C::UnknownTopic, false),
            (C::OutOfOrderSequenceNumber, false),
            (C::PurgeQueue, false),
            (C::PurgeInflight, false),
            (C::Fatal, false),
            (C::Fail, false),
        ];
        for (code, permanent) in table {
            assert_eq!(is_permanent(*code), *permanent, "{code:?}");
        }
    }

    #[test]
    fn a_missing_topic_is_permanent_and_named() {
        let f = DeliveryFailure::from_kafka_error(&KafkaError::MessageProduction(
            C::UnknownTopicOrPartition,
        ));
        assert!(f.retriable && f.may_be_a_missing_topic());
        let f = f.missing_topic("outbox.order");
        assert!(!f.retriable);
        assert!(f.message.contains("\"outbox.order\" does not exist"), "{f}");
        assert!(f.message.contains("--create --topic outbox.order"), "{f}");
    }

    #[test]
    fn a_refused_timestamp_names_the_clock_and_the_topic_setting() {
        for code in [C::InvalidTimestamp, C::InvalidRecord] {
            let f = DeliveryFailure::from_kafka_error(&KafkaError::MessageProduction(code));
            assert!(!f.retriable);
            assert!(f.message.contains("message.timestamp.after.max.ms"), "{f}");
            assert!(f.message.contains("clock"), "{f}");
        }
    }

    #[test]
    fn failure_from_error_carries_code_and_class() {
        let f = DeliveryFailure::from_kafka_error(&KafkaError::MessageProduction(
            C::TopicAuthorizationFailed,
        ));
        assert_eq!(f.code, C::TopicAuthorizationFailed);
        assert!(!f.retriable);
        assert!(f.to_string().contains("permanent"), "{f}");
        let f =
            DeliveryFailure::from_kafka_error(&KafkaError::MessageProduction(C::RequestTimedOut));
        assert!(f.retriable);
    }
}
