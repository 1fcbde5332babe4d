//! Turns [`ProducerSettings`] into a librdkafka configuration: the relay's safety
//! settings first, then the operator's overrides, refusing those that would break the
//! guarantees the ack watermark depends on (docs/replication-protocol.md §5).
//!
//! Policy, in one place:
//! - `enable.idempotence`, `acks`/`request.required.acks`, `message.timeout.ms`/
//!   `delivery.timeout.ms`, `queuing.strategy`, `retries`/`message.send.max.retries`,
//!   `delivery.report.only.error`: accepted only with the value the relay sets itself.
//! - `max.in.flight(.requests.per.connection)`: 1..=5 (idempotent ordering limit).
//! - `partitioner`: any of librdkafka's deterministic ones ([`KEYED_PARTITIONERS`]), so
//!   that outboxd can take over from a poller that used another client's default and
//!   keep each aggregate on its partition; `random` is refused. The `_random` variants
//!   differ from their plain ones only for NULL keys (and `consistent_random` for empty
//!   ones), and every record the relay writes to an outbox topic has a non-empty key (an
//!   empty or NULL aggregate id is dead-lettered), so each of them maps one key to one
//!   partition.
//! - `transactional.id`: refused: `OUTBOXD_DELIVERY=exactly-once` derives it from the
//!   slot's identity (one id per slot, shared by the active instance and its standby, so
//!   the one that takes over fences the other).
//! - `transaction.timeout.ms`: applied as given; in exactly-once mode it also becomes
//!   `message.timeout.ms` (librdkafka requires it to be no longer), and a message that
//!   times out aborts its Kafka transaction, which leaves no gap.
//! - `bootstrap.servers`, `message.max.bytes`, `queue.buffering.max.messages`: come from
//!   the relay's own settings; an override must agree with them.
//! - `queue.buffering.max.kbytes`: at least the relay's in-flight byte cap plus one message
//!   (librdkafka's default of 1 GiB unless the cap needs more); an override below it is
//!   refused.
//! - `enable.gapless.guarantee`: must stay `true` (set by the relay): without it librdkafka
//!   answers a batch refused for good by sending the records after it, which land ahead
//!   of the replay from the slot. It does nothing for the transactional producer, whose
//!   refused batch aborts the Kafka transaction.
//! - Everything else (security, SASL, SSL, compression, linger, batching, socket,
//!   debug, statistics, client.id, ...) is applied as given, after the defaults.
//!
//! Batching keeps librdkafka's defaults (`batch.num.messages` 10000, `batch.size` 1 MB,
//! both further capped by `message.max.bytes`).

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::ClientConfig;

use super::error::KafkaSetupError;
use super::settings::ProducerSettings;

/// librdkafka's idempotent producer keeps order with at most this many requests in flight.
const MAX_IDEMPOTENT_IN_FLIGHT: u32 = 5;
/// librdkafka's bounds for `message.max.bytes`.
const MESSAGE_MAX_BYTES_RANGE: std::ops::RangeInclusive<usize> = 1000..=1_000_000_000;
/// librdkafka's bound for `queue.buffering.max.messages`.
const QUEUE_MAX_MESSAGES_MAX: usize = 2_147_483_647;
/// librdkafka's bound for `queue.buffering.max.kbytes`.
const QUEUE_MAX_KBYTES_MAX: usize = 2_147_483_647;

/// librdkafka partitioners that send a non-empty key to the same partition every time
/// (CONFIGURATION.md, `partitioner`).
const KEYED_PARTITIONERS: [&str; 6] = [
    "murmur2",
    "murmur2_random",
    "consistent",
    "consistent_random",
    "fnv1a",
    "fnv1a_random",
];

const ORDERING_REASON: &str = "the relay needs the idempotent producer (acks=all, FIFO, unlimited retries, no message timeout) so that every acked event is durable and each key's events stay in order without gaps";

/// Configuration for the relay's producer: connection settings plus the fixed safety
/// settings plus accepted overrides.
pub(crate) fn producer_config(
    settings: &ProducerSettings,
) -> Result<ClientConfig, KafkaSetupError> {
    validate_settings(settings)?;
    for (name, value) in &settings.overrides {
        check_override(settings, name, value)?;
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.bootstrap_servers)
        .set("client.id", &settings.client_id)
        .set("enable.idempotence", "true")
        // Without it librdkafka answers a batch refused for good by bumping the epoch and
        // sending the records after it: they land before the replay of the refused one.
        // With it the producer stops (a fatal error), and the session resumes from the slot.
        .set("enable.gapless.guarantee", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "0")
        .set("max.in.flight.requests.per.connection", "5")
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4")
        .set("linger.ms", settings.linger_ms.to_string())
        .set("message.max.bytes", settings.max_message_bytes.to_string())
        .set(
            "queue.buffering.max.messages",
            settings.queue_max_messages.to_string(),
        )
        .set(
            "queue.buffering.max.kbytes",
            settings.queue_max_kbytes.to_string(),
        );
    apply_overrides(&mut config, settings);
    Ok(config)
}

/// [`producer_config`] for the exactly-once mode's transactional producer.
pub(crate) fn transactional_producer_config(
    settings: &ProducerSettings,
    transactional_id: &str,
) -> Result<ClientConfig, KafkaSetupError> {
    let mut config = producer_config(settings)?;
    config.set("transactional.id", transactional_id).set(
        "message.timeout.ms",
        settings.transaction_timeout().as_millis().to_string(),
    );
    Ok(config)
}

/// Everything `producer_config` and librdkafka would refuse when the producer is built,
/// checked without creating a client, so that `run` can refuse a setting before it
/// connects to anything: the relay's own rules, then librdkafka's for each property's
/// name and value (one at a time, so the error names the property).
pub fn check_producer_settings(settings: &ProducerSettings) -> Result<(), KafkaSetupError> {
    let config = producer_config(settings)?;
    for (name, value) in config.config_map() {
        let mut one = ClientConfig::new();
        one.set(name, value);
        one.create_native_config()
            .map_err(|e| KafkaSetupError::InvalidProperty {
                property: (*name).to_owned(),
                message: settings.scrub(&e.to_string()),
            })?;
    }
    Ok(())
}

/// Configuration for auxiliary clients (admin): same connection and security settings,
/// none of the producer's idempotence machinery.
pub(crate) fn admin_config(settings: &ProducerSettings) -> Result<ClientConfig, KafkaSetupError> {
    for (name, value) in &settings.overrides {
        check_override(settings, name, value)?;
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.bootstrap_servers)
        .set("client.id", format!("{}-admin", settings.client_id));
    apply_overrides(&mut config, settings);
    // An admin client needs no idempotent producer id from the cluster (and librdkafka
    // refuses the gap-less guarantee without idempotence).
    config.set("enable.idempotence", "false");
    config.remove("enable.gapless.guarantee");
    config.remove("transactional.id");
    Ok(config)
}

/// Configuration for the relay's read-only helper consumers (`role`: progress-reader,
/// probe): the admin settings, never a group member's commits, and no topic created by
/// merely asking for its metadata.
pub(crate) fn reader_config(
    settings: &ProducerSettings,
    role: &str,
) -> Result<ClientConfig, KafkaSetupError> {
    let mut config = admin_config(settings)?;
    config.remove("enable.idempotence");
    config
        .set("client.id", format!("{}-{role}", settings.client_id))
        .set("group.id", format!("outboxd-{role}"))
        .set("enable.auto.commit", "false")
        .set("allow.auto.create.topics", "false");
    Ok(config)
}

fn apply_overrides(config: &mut ClientConfig, settings: &ProducerSettings) {
    for (name, value) in &settings.overrides {
        config.set(normalize(name), value);
    }
    config.set_log_level(log_level(settings));
}

/// librdkafka drops log lines above its own level before they reach `tracing`, so pick
/// the level the subscriber will actually show (and debug when `debug` contexts are on).
fn log_level(settings: &ProducerSettings) -> RDKafkaLogLevel {
    let debug_requested = settings.overrides.keys().any(|k| normalize(k) == "debug");
    if debug_requested || tracing::enabled!(target: "librdkafka", tracing::Level::DEBUG) {
        RDKafkaLogLevel::Debug
    } else if tracing::enabled!(target: "librdkafka", tracing::Level::INFO) {
        RDKafkaLogLevel::Info
    } else {
        RDKafkaLogLevel::Warning
    }
}

fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase()
}

fn validate_settings(s: &ProducerSettings) -> Result<(), KafkaSetupError> {
    if s.bootstrap_servers.trim().is_empty() {
        return Err(KafkaSetupError::InvalidSettings(
            "bootstrap servers are empty".into(),
        ));
    }
    if !MESSAGE_MAX_BYTES_RANGE.contains(&s.max_message_bytes) {
        return Err(KafkaSetupError::InvalidSettings(format!(
            "max message bytes {} is outside librdkafka's range {:?}",
            s.max_message_bytes, MESSAGE_MAX_BYTES_RANGE
        )));
    }
    if s.queue_max_messages == 0 || s.queue_max_messages > QUEUE_MAX_MESSAGES_MAX {
        return Err(KafkaSetupError::InvalidSettings(format!(
            "queue max messages {} must be between 1 and {QUEUE_MAX_MESSAGES_MAX}",
            s.queue_max_messages
        )));
    }
    if s.queue_max_kbytes == 0 || s.queue_max_kbytes > QUEUE_MAX_KBYTES_MAX {
        return Err(KafkaSetupError::InvalidSettings(format!(
            "queue max kbytes {} must be between 1 and {QUEUE_MAX_KBYTES_MAX}: lower \
             OUTBOXD_MAX_IN_FLIGHT_BYTES",
            s.queue_max_kbytes
        )));
    }
    Ok(())
}

fn check_override(s: &ProducerSettings, name: &str, value: &str) -> Result<(), KafkaSetupError> {
    let property = normalize(name);
    let v = value.trim().to_ascii_lowercase();
    let refuse = |reason: &'static str| {
        Err(KafkaSetupError::RefusedOverride {
            property: property.clone(),
            value: value.to_owned(),
            reason,
        })
    };
    let require = |ok: bool, reason: &'static str| if ok { Ok(()) } else { refuse(reason) };
    match property.as_str() {
        "enable.idempotence" | "enable.gapless.guarantee" => require(v == "true", ORDERING_REASON),
        "acks" | "request.required.acks" => require(v == "all" || v == "-1", ORDERING_REASON),
        "message.timeout.ms" | "delivery.timeout.ms" => require(
            v == "0",
            "a timed-out message leaves a gap that a retry would fill out of order; the relay waits for every delivery and restarts from the slot on errors",
        ),
        "queuing.strategy" => require(v == "fifo", ORDERING_REASON),
        "retries" | "message.send.max.retries" => require(
            v == i32::MAX.to_string(),
            "a message that runs out of retries fails the pipeline; the idempotent producer retries without limit",
        ),
        "max.in.flight" | "max.in.flight.requests.per.connection" => require(
            v.parse::<u32>().is_ok_and(|n| (1..=MAX_IDEMPOTENT_IN_FLIGHT).contains(&n)),
            "the idempotent producer keeps order only with 1 to 5 requests in flight",
        ),
        "partitioner" => require(
            KEYED_PARTITIONERS.contains(&v.as_str()),
            "each aggregate's events must go to one partition: use the partitioner your earlier producer used, one of murmur2, murmur2_random (Java clients, franz-go, kafka-python, kafkajs), consistent_random, consistent (librdkafka-based clients' CRC32 default), fnv1a, fnv1a_random (sarama's default); `random` scatters an aggregate's events",
        ),
        "delivery.report.only.error" => require(
            v == "false",
            "the relay advances the slot from a delivery report for every message",
        ),
        "transactional.id" => refuse(
            "outboxd derives it from the slot's identity with OUTBOXD_DELIVERY=exactly-once; set that instead",
        ),
        "bootstrap.servers" | "metadata.broker.list" => require(
            value.trim() == s.bootstrap_servers.trim(),
            "conflicts with the relay's bootstrap servers setting; set it there",
        ),
        "message.max.bytes" => require(
            v == s.max_message_bytes.to_string(),
            "conflicts with the relay's max message bytes setting (which also decides dead-lettering); set it there",
        ),
        "queue.buffering.max.messages" => require(
            v == s.queue_max_messages.to_string(),
            "conflicts with the relay's producer queue setting, which is sized to the in-flight cap; set it there",
        ),
        "queue.buffering.max.kbytes" => require(
            v.parse::<usize>().is_ok_and(|kb| kb >= s.queue_max_kbytes),
            "below the in-flight byte cap plus one message: librdkafka would refuse a message the relay then waits on forever; lower OUTBOXD_MAX_IN_FLIGHT_BYTES instead",
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_override(name: &str, value: &str) -> ProducerSettings {
        let mut s = ProducerSettings::new("localhost:9092");
        s.overrides.insert(name.to_owned(), value.to_owned());
        s
    }

    #[test]
    fn fixed_safety_settings() {
        let c = producer_config(&ProducerSettings::new("b:9092")).unwrap();
        for (k, v) in [
            ("enable.idempotence", "true"),
            ("enable.gapless.guarantee", "true"),
            ("acks", "all"),
            ("message.timeout.ms", "0"),
            ("max.in.flight.requests.per.connection", "5"),
            ("partitioner", "murmur2_random"),
            ("compression.type", "lz4"),
            ("linger.ms", "5"),
            ("message.max.bytes", "1000000"),
            ("queue.buffering.max.messages", "100000"),
            ("queue.buffering.max.kbytes", "1048576"),
            ("bootstrap.servers", "b:9092"),
        ] {
            assert_eq!(c.get(k), Some(v), "{k}");
        }
        assert_eq!(c.get("queuing.strategy"), None);
    }

    #[test]
    fn refused_overrides_name_the_property() {
        let refused = [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "120000"),
            ("max.in.flight.requests.per.connection", "6"),
            ("max.in.flight", "100"),
            ("max.in.flight", "0"),
            ("retries", "3"),
            ("message.send.max.retries", "10"),
            ("queuing.strategy", "lifo"),
            ("partitioner", "random"),
            ("partitioner", "crc32"),
            ("transactional.id", "relay-1"),
            ("delivery.report.only.error", "true"),
            ("bootstrap.servers", "elsewhere:9092"),
            ("message.max.bytes", "5000000"),
            ("queue.buffering.max.messages", "10"),
            ("queue.buffering.max.kbytes", "1024"),
            ("ACKS", "1"),
        ];
        for (name, value) in refused {
            let err = producer_config(&with_override(name, value)).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, KafkaSetupError::RefusedOverride { .. }),
                "{name}={value}: {text}"
            );
            assert!(text.contains(&name.to_ascii_lowercase()), "{text}");
            assert!(text.contains("refused"), "{text}");
        }
    }

    #[test]
    fn accepted_overrides_are_applied() {
        let accepted = [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
            ("ssl.ca.location", "/etc/ca.pem"),
            ("compression.type", "zstd"),
            ("linger.ms", "20"),
            ("batch.size", "500000"),
            ("batch.num.messages", "5000"),
            ("client.id", "relay-a"),
            ("socket.keepalive.enable", "true"),
            ("debug", "broker,msg"),
            ("statistics.interval.ms", "10000"),
            ("enable.idempotence", "true"),
            ("acks", "-1"),
            ("message.timeout.ms", "0"),
            ("max.in.flight", "1"),
            ("partitioner", "murmur2"),
            ("queue.buffering.max.kbytes", "2097152"),
            ("partitioner", "consistent_random"),
            ("partitioner", "consistent"),
            ("partitioner", "fnv1a"),
            ("partitioner", "fnv1a_random"),
            ("enable.gapless.guarantee", "true"),
            ("message.max.bytes", "1000000"),
            ("bootstrap.servers", "localhost:9092"),
        ];
        for (name, value) in accepted {
            let c = producer_config(&with_override(name, value)).unwrap();
            assert_eq!(c.get(name), Some(value), "{name}");
        }
    }

    #[test]
    fn admin_config_keeps_security_drops_idempotence() {
        let s = with_override("security.protocol", "SSL");
        let c = admin_config(&s).unwrap();
        assert_eq!(c.get("security.protocol"), Some("SSL"));
        assert_eq!(c.get("enable.idempotence"), Some("false"));
        assert!(admin_config(&with_override("acks", "1")).is_err());
    }

    #[test]
    fn invalid_settings() {
        let mut s = ProducerSettings::new("b:9092");
        s.max_message_bytes = 10;
        assert!(matches!(
            producer_config(&s),
            Err(KafkaSetupError::InvalidSettings(_))
        ));
        let mut s = ProducerSettings::new(" ");
        s.queue_max_messages = 1;
        assert!(matches!(
            producer_config(&s),
            Err(KafkaSetupError::InvalidSettings(_))
        ));
        let mut s = ProducerSettings::new("b:9092");
        s.queue_max_messages = 0;
        assert!(matches!(
            producer_config(&s),
            Err(KafkaSetupError::InvalidSettings(_))
        ));
    }
}
