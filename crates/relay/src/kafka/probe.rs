//! Whether the brokers answer, asked on a timer by a client of its own: the producer alone
//! cannot tell "nothing to send" from "nobody to send to", so with all brokers down and no
//! event waiting, readiness and the metrics would otherwise look healthy.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::config::reader_config;
use super::context::LogContext;
use super::error::KafkaSetupError;
use super::settings::ProducerSettings;

pub struct BrokerProbe {
    client: BaseConsumer<LogContext>,
}

impl BrokerProbe {
    pub fn new(settings: &ProducerSettings) -> Result<Self, KafkaSetupError> {
        let client = reader_config(settings, "probe")?
            .create_with_context(LogContext)
            .map_err(|e| KafkaSetupError::Client(settings.scrub(&e.to_string())))?;
        Ok(BrokerProbe { client })
    }

    /// Brokers listed by a fresh metadata answer; 0 when none answered in `timeout`.
    /// Blocks: call from a blocking task.
    pub fn brokers_up(&self, timeout: Duration) -> usize {
        // A topic that never exists keeps the answer small on large clusters.
        match self.client.fetch_metadata(Some("__outboxd_probe"), timeout) {
            Ok(md) => md.brokers().len(),
            Err(_) => 0,
        }
    }
}
