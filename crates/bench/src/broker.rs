//! The brokers of a run: librdkafka's mock cluster (as `outboxd-dev broker`, so its CPU is
//! not the benchmark's) and tansu, each a fresh process per run with the benchmark topic
//! created beforehand. Starting and filling them is `outboxd-test-broker`'s, shared with
//! the end-to-end tests.

use std::path::Path;

use anyhow::{Context, Result};

pub use outboxd_test_broker::{find_tansu, free_port, Broker};

pub const PARTITIONS: i32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Mock,
    Tansu,
}

impl BrokerKind {
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Mock => "mock",
            BrokerKind::Tansu => "tansu",
        }
    }
}

/// A `kind` broker with `topics` of [`PARTITIONS`] partitions; `bins` holds outboxd-dev.
pub async fn start(kind: BrokerKind, bins: &Path, tansu: &Path, topics: &[&str]) -> Result<Broker> {
    let broker = match kind {
        BrokerKind::Mock => {
            return Broker::mock_process(&bins.join("outboxd-dev"), 1, topics, PARTITIONS)
                .context("starting outboxd-dev broker");
        }
        BrokerKind::Tansu => Broker::tansu(tansu).context("starting tansu")?,
    };
    broker
        .create_topics(topics, PARTITIONS)
        .await
        .with_context(|| format!("creating topics on {}", broker.name()))?;
    Ok(broker)
}
