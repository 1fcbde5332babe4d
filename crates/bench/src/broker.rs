//! The brokers of a run: Apache Kafka 4.4 (one KRaft node, a JVM of its own: the default)
//! and librdkafka's mock cluster (as `outboxd-dev broker`, so its CPU is not the
//! benchmark's), each a fresh process per run with the benchmark topic created beforehand.
//! Starting and filling them is `outboxd-test-broker`'s, shared with the end-to-end tests.

use std::path::Path;

use anyhow::{bail, Context, Result};

pub use outboxd_test_broker::{free_port, Broker};

pub const PARTITIONS: i32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Kafka,
    Mock,
}

impl BrokerKind {
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Kafka => "kafka",
            BrokerKind::Mock => "mock",
        }
    }

    pub fn parse(name: &str) -> Result<BrokerKind> {
        match name {
            "kafka" => Ok(BrokerKind::Kafka),
            "mock" => Ok(BrokerKind::Mock),
            other => bail!("unknown broker {other:?} (expected kafka or mock)"),
        }
    }
}

/// The brokers named in the comma-separated list `var` (default `default`).
pub fn kinds(var: &str, default: &str) -> Result<Vec<BrokerKind>> {
    crate::list(var, default)
        .iter()
        .map(|n| BrokerKind::parse(n).with_context(|| var.to_owned()))
        .collect()
}

/// A `kind` broker with `topics` of [`PARTITIONS`] partitions; `bins` holds outboxd-dev.
pub async fn start(kind: BrokerKind, bins: &Path, topics: &[&str]) -> Result<Broker> {
    let broker = match kind {
        BrokerKind::Mock => {
            return Broker::mock_process(&bins.join("outboxd-dev"), 1, topics, PARTITIONS)
                .context("starting outboxd-dev broker");
        }
        BrokerKind::Kafka => Broker::kafka_for_throughput().context("starting Apache Kafka")?,
    };
    if !topics.is_empty() {
        broker
            .create_topics(topics, PARTITIONS)
            .await
            .with_context(|| format!("creating topics on {}", broker.name()))?;
    }
    Ok(broker)
}
