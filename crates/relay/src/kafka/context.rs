//! librdkafka callbacks: logs into `tracing`, global errors (remembering a fatal one so
//! the pipeline restarts), and delivery reports into the [`DeliverySink`].

use std::sync::OnceLock;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use super::delivery::{Delivered, Delivery, DeliveryFailure, DeliverySink};

/// Context of the relay's producer.
pub(crate) struct RelayContext {
    sink: DeliverySink,
    /// The first fatal error reported through the error callback. librdkafka also keeps
    /// it (`rd_kafka_fatal_error`), but the callback may fire before that is visible.
    fatal: OnceLock<String>,
    /// Transactional: each acked record's content goes with its report, for the check
    /// of a transaction Kafka left open (`outbox_core::left_open`).
    contents: bool,
}

impl RelayContext {
    pub(crate) fn new(sink: DeliverySink, contents: bool) -> Self {
        Self {
            sink,
            fatal: OnceLock::new(),
            contents,
        }
    }

    pub(crate) fn fatal(&self) -> Option<&str> {
        self.fatal.get().map(String::as_str)
    }
}

impl ClientContext for RelayContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        route_log(level, fac, message);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        log_stats(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            tracing::error!(target: "librdkafka", %error, reason, "fatal Kafka producer error");
            // Only the first fatal error matters; librdkafka raises at most one.
            let _ = self.fatal.set(format!("{error}: {reason}"));
        } else if let Some(suppressed) = NOISE.admit(&format!("error:{error}")) {
            tracing::warn!(target: "librdkafka", %error, reason, suppressed, "Kafka client error");
        }
    }
}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, ticket: usize) {
        let outcome = match result {
            Ok(message) => Ok(Delivered {
                partition: message.partition(),
                offset: message.offset(),
                content: self.contents.then(|| super::stable::content_hash(message)),
            }),
            Err((error, _)) => Err(DeliveryFailure::from_kafka_error(error)),
        };
        let at_unix_micros = pgoutput::PgTimestamp::now().unix_micros();
        let report = Delivery {
            ticket,
            outcome,
            at_unix_micros,
        };
        if self.sink.send(report).is_err() {
            // The pipeline dropped its receiver: it is abandoning this producer, and
            // purged messages are reported here one last time.
            tracing::debug!(target: "librdkafka", ticket, "delivery report after receiver closed");
        }
    }
}

/// Context for auxiliary clients (admin): same log routing, nothing to track.
pub(crate) struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        route_log(level, fac, message);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        log_stats(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(suppressed) = NOISE.admit(&format!("admin:{error}")) {
            tracing::warn!(target: "librdkafka", %error, reason, suppressed, "Kafka admin client error");
        }
    }
}

/// Context of the progress store's producer: log routing, and each delivery answered on
/// the oneshot channel its record was sent with.
pub(crate) struct AckContext;

/// Where a progress write learns its outcome.
pub(crate) type AckSender = tokio::sync::oneshot::Sender<Result<(), KafkaError>>;

impl ClientContext for AckContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        route_log(level, fac, message);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        log_stats(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(suppressed) = NOISE.admit(&format!("error:{error}")) {
            tracing::warn!(target: "librdkafka", %error, reason, suppressed, "Kafka client error");
        }
    }
}

impl ProducerContext for AckContext {
    type DeliveryOpaque = Box<AckSender>;

    fn delivery(&self, result: &DeliveryResult<'_>, done: Box<AckSender>) {
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((error, _)) => Err(error.clone()),
        };
        // The writer may have given up waiting (its own timeout): nothing to tell.
        let _ = done.send(outcome);
    }
}

/// An outage makes librdkafka repeat the same complaint for every broker every second or
/// so; one line per kind every [`NOISE_WINDOW`], with how many were left out, says the
/// same without burying everything else.
static NOISE: RateLimit = RateLimit::new();

const NOISE_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

struct RateLimit {
    seen: std::sync::Mutex<Option<std::collections::HashMap<String, (std::time::Instant, u64)>>>,
}

impl RateLimit {
    const fn new() -> Self {
        RateLimit {
            seen: std::sync::Mutex::new(None),
        }
    }

    /// `Some(suppressed since the last admitted one)` when a line of this kind may be
    /// logged now. Kinds are few (error codes, log facilities), so the map stays small.
    fn admit(&self, kind: &str) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let map = guard.get_or_insert_with(std::collections::HashMap::new);
        match map.get_mut(kind) {
            Some((last, suppressed)) if now.duration_since(*last) < NOISE_WINDOW => {
                *suppressed = suppressed.saturating_add(1);
                None
            }
            Some((last, suppressed)) => {
                let n = *suppressed;
                *last = now;
                *suppressed = 0;
                Some(n)
            }
            None => {
                map.insert(kind.to_owned(), (now, 0));
                Some(0)
            }
        }
    }
}

fn route_log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    use RDKafkaLogLevel as L;
    // librdkafka warns at every producer's creation that a property outboxd sets on
    // purpose is experimental; the operator can do nothing about it.
    if fac == "CONFWARN" && message.contains("enable.gapless.guarantee is experimental") {
        tracing::debug!(target: "librdkafka", fac, "{message}");
        return;
    }
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
            let Some(suppressed) = NOISE.admit(&format!("log:{fac}")) else {
                return;
            };
            if matches!(level, L::Warning) {
                tracing::warn!(target: "librdkafka", fac, suppressed, "{message}")
            } else {
                tracing::error!(target: "librdkafka", fac, suppressed, "{message}")
            }
        }
        L::Notice | L::Info => tracing::info!(target: "librdkafka", fac, "{message}"),
        L::Debug => tracing::debug!(target: "librdkafka", fac, "{message}"),
    }
}

/// Only emitted when the operator sets `statistics.interval.ms`; passed on raw rather
/// than parsed, since the JSON is large and meant for external tooling.
fn log_stats(statistics: &[u8]) {
    tracing::debug!(target: "librdkafka", stats = %String::from_utf8_lossy(statistics), "statistics");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_complaints_are_admitted_once_per_window() {
        let limit = RateLimit::new();
        assert_eq!(limit.admit("a"), Some(0));
        assert_eq!(limit.admit("a"), None);
        assert_eq!(limit.admit("a"), None);
        assert_eq!(limit.admit("b"), Some(0), "kinds are limited separately");
    }

    #[test]
    fn fatal_global_error_is_remembered_others_are_not() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let ctx = RelayContext::new(tx, false);
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "3/3 brokers are down",
        );
        assert_eq!(ctx.fatal(), None);
        ctx.error(
            KafkaError::Global(RDKafkaErrorCode::Fatal),
            "producer fenced",
        );
        ctx.error(KafkaError::Global(RDKafkaErrorCode::Fatal), "second");
        let fatal = ctx.fatal().unwrap();
        assert!(fatal.contains("producer fenced"), "{fatal}");
    }
}
