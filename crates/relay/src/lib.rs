//! The relay runtime: reads the replication stream, produces outbox events to Kafka, and
//! advances the slot only to the end of transactions whose every message the broker acked.

pub mod kafka;
pub mod pipeline;
pub mod telemetry;
