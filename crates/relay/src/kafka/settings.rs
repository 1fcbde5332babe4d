//! What the operator configured for the producer, and the one place that decides which
//! librdkafka properties are secrets (so nothing else has to remember to redact them).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Prefix of the environment variables passed through to librdkafka.
pub const KAFKA_ENV_PREFIX: &str = "OUTBOXD_KAFKA_";

/// Text shown instead of a secret value.
const REDACTED: &str = "[redacted]";

/// Producer configuration. `Debug` is redacted, so this can be logged as a whole.
#[derive(Clone, PartialEq, Eq)]
pub struct ProducerSettings {
    pub bootstrap_servers: String,
    pub client_id: String,
    /// librdkafka properties set by the operator (see [`kafka_property_from_env`]).
    /// Checked against the relay's safety settings by `build_producer`.
    pub overrides: BTreeMap<String, String>,
    /// Becomes `message.max.bytes`: larger records fail locally and are dead-lettered.
    pub max_message_bytes: usize,
    pub linger_ms: u32,
    /// Becomes `queue.buffering.max.messages`; must be at least the relay's in-flight cap,
    /// otherwise librdkafka's queue, not the relay, becomes the back-pressure point.
    pub queue_max_messages: usize,
    /// Becomes `queue.buffering.max.kbytes`; must hold the relay's in-flight byte cap plus
    /// one message: librdkafka refuses a message that would pass it, even into an empty
    /// queue, and the relay would wait forever for a report that makes room.
    pub queue_max_kbytes: usize,
    /// `OUTBOXD_DELIVERY=exactly-once`: events go out in Kafka transactions
    /// (docs/transactional-mode.md); `None`: at-least-once.
    pub transactions: Option<Transactions>,
}

/// When the exactly-once mode commits a Kafka transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transactions {
    /// Commit at the first PostgreSQL commit after a Kafka transaction was open this long.
    pub commit_every: Duration,
    /// Or at the first PostgreSQL commit after this many events.
    pub commit_events: usize,
}

/// librdkafka's default `queue.buffering.max.kbytes` (1 GiB).
pub const QUEUE_MAX_KBYTES_DEFAULT: usize = 1_048_576;

/// librdkafka's default `transaction.timeout.ms`.
const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// `transaction.timeout.ms` as a producer with these librdkafka `overrides` gets it.
pub fn transaction_timeout_in(overrides: &BTreeMap<String, String>) -> Duration {
    overrides
        .get("transaction.timeout.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_TRANSACTION_TIMEOUT, Duration::from_millis)
}

impl ProducerSettings {
    /// Defaults for everything but the servers.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            client_id: "outboxd".to_owned(),
            overrides: BTreeMap::new(),
            max_message_bytes: 1_000_000,
            linger_ms: 5,
            queue_max_messages: 100_000,
            queue_max_kbytes: QUEUE_MAX_KBYTES_DEFAULT,
            transactions: None,
        }
    }

    /// `transaction.timeout.ms` as the producer gets it: the override, else librdkafka's
    /// default. The broker aborts a Kafka transaction open longer than this.
    pub fn transaction_timeout(&self) -> Duration {
        transaction_timeout_in(&self.overrides)
    }

    /// A view for logs: secret override values replaced.
    pub fn redacted(&self) -> RedactedSettings<'_> {
        RedactedSettings(self)
    }

    /// Replaces every secret value that occurs verbatim in `text`. librdkafka echoes the
    /// value in some configuration errors ("Invalid value \"..\" for ..."), and those
    /// errors end up in logs.
    pub(crate) fn scrub(&self, text: &str) -> String {
        self.overrides
            .iter()
            .filter(|(name, value)| is_secret_property(name) && !value.is_empty())
            .fold(text.to_owned(), |acc, (_, value)| {
                acc.replace(value.as_str(), REDACTED)
            })
    }
}

impl fmt::Debug for ProducerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.redacted(), f)
    }
}

/// Log view of [`ProducerSettings`]; see [`ProducerSettings::redacted`].
pub struct RedactedSettings<'a>(&'a ProducerSettings);

impl RedactedSettings<'_> {
    /// The overrides with secret values replaced.
    pub fn overrides(&self) -> BTreeMap<&str, &str> {
        self.0
            .overrides
            .iter()
            .map(|(name, value)| {
                let shown = if is_secret_property(name) {
                    REDACTED
                } else {
                    value.as_str()
                };
                (name.as_str(), shown)
            })
            .collect()
    }
}

impl fmt::Display for RedactedSettings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        f.debug_struct("ProducerSettings")
            .field("bootstrap_servers", &s.bootstrap_servers)
            .field("client_id", &s.client_id)
            .field("overrides", &self.overrides())
            .field("max_message_bytes", &s.max_message_bytes)
            .field("linger_ms", &s.linger_ms)
            .field("queue_max_messages", &s.queue_max_messages)
            .field("queue_max_kbytes", &s.queue_max_kbytes)
            .finish()
    }
}

impl fmt::Debug for RedactedSettings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether a librdkafka property holds a credential. Errs on the side of hiding: any name
/// mentioning a password, secret or token, inline private keys, and the OAUTHBEARER
/// config string (which may embed a client secret).
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
        || name == "ssl.key.pem"
        || name == "ssl_key"
        || name == "sasl.oauthbearer.config"
}

/// Maps `OUTBOXD_KAFKA_SASL_MECHANISM` to `sasl.mechanism`: the part after the prefix,
/// lowercased, `_` → `.`. `None` when the name lacks the prefix or would not make a
/// property name (empty, empty segments, characters other than `A-Z`, `0-9`, `_`).
/// librdkafka has no string-settable property with an underscore, so no escape is needed.
pub fn kafka_property_from_env(var_name: &str) -> Option<String> {
    let rest = var_name.strip_prefix(KAFKA_ENV_PREFIX)?;
    let valid_chars = rest
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if rest.is_empty() || !valid_chars || rest.split('_').any(str::is_empty) {
        return None;
    }
    Some(rest.to_ascii_lowercase().replace('_', "."))
}

/// The variable [`kafka_property_from_env`] maps to `property`: `sasl.mechanism` →
/// `OUTBOXD_KAFKA_SASL_MECHANISM`, for messages that name what the operator set.
pub fn env_var_of_property(property: &str) -> String {
    format!(
        "{KAFKA_ENV_PREFIX}{}",
        property.trim().to_ascii_uppercase().replace('.', "_")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_property_from_env_cases() {
        let cases: &[(&str, Option<&str>)] = &[
            ("OUTBOXD_KAFKA_SASL_MECHANISM", Some("sasl.mechanism")),
            ("OUTBOXD_KAFKA_SECURITY_PROTOCOL", Some("security.protocol")),
            ("OUTBOXD_KAFKA_SSL_CA_LOCATION", Some("ssl.ca.location")),
            ("OUTBOXD_KAFKA_LINGER_MS", Some("linger.ms")),
            ("OUTBOXD_KAFKA_DEBUG", Some("debug")),
            (
                "OUTBOXD_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
                Some("sasl.oauthbearer.client.secret"),
            ),
            ("OUTBOXD_KAFKA_X509V3", Some("x509v3")),
            ("OUTBOXD_KAFKA_", None),
            ("OUTBOXD_KAFKA", None),
            ("OUTBOXD_KAFKA__DEBUG", None),
            ("OUTBOXD_KAFKA_DEBUG_", None),
            ("OUTBOXD_KAFKA_SASL__MECHANISM", None),
            ("OUTBOXD_KAFKA_sasl_mechanism", None),
            ("OUTBOXD_KAFKA_SASL-MECHANISM", None),
            ("OUTBOXD_PG_HOST", None),
            ("KAFKA_SASL_MECHANISM", None),
            ("outboxd_kafka_debug", None),
        ];
        for (var, want) in cases {
            assert_eq!(kafka_property_from_env(var).as_deref(), *want, "{var}");
        }
        for (var, want) in cases {
            if let Some(property) = want {
                assert_eq!(env_var_of_property(property), *var);
            }
        }
    }

    #[test]
    fn secret_property_names() {
        for name in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "ssl.key.pem",
            "SASL.PASSWORD",
            "some.future.secret.thing",
        ] {
            assert!(is_secret_property(name), "{name}");
        }
        for name in [
            "sasl.username",
            "sasl.mechanism",
            "ssl.ca.location",
            "linger.ms",
        ] {
            assert!(!is_secret_property(name), "{name}");
        }
    }

    fn with_secrets() -> ProducerSettings {
        let mut s = ProducerSettings::new("broker:9092");
        for (k, v) in [
            ("sasl.password", "hunter2"),
            ("ssl.key.password", "keypw"),
            ("ssl.keystore.password", "storepw"),
            ("sasl.oauthbearer.client.secret", "oauth-s3cr3t"),
            ("sasl.username", "relay-user"),
        ] {
            s.overrides.insert(k.to_owned(), v.to_owned());
        }
        s
    }

    #[test]
    fn redacted_view_and_debug_hide_secrets() {
        let s = with_secrets();
        for text in [
            s.redacted().to_string(),
            format!("{:?}", s),
            format!("{:?}", s.redacted()),
        ] {
            for secret in ["hunter2", "keypw", "storepw", "oauth-s3cr3t"] {
                assert!(!text.contains(secret), "{secret} leaked in {text}");
            }
            assert!(text.contains("relay-user"), "{text}");
            assert!(text.contains("sasl.password"), "{text}");
            assert!(text.contains(REDACTED), "{text}");
        }
        assert_eq!(
            s.redacted().overrides().get("sasl.password"),
            Some(&REDACTED)
        );
    }

    #[test]
    fn scrub_removes_echoed_secret_values() {
        let s = with_secrets();
        let msg = "Invalid value \"hunter2\" for configuration property \"sasl.password\"";
        let scrubbed = s.scrub(msg);
        assert!(!scrubbed.contains("hunter2"));
        assert!(scrubbed.contains("sasl.password"));
    }
}
