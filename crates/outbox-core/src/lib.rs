//! The pure pipeline logic of outboxd: what happens between a decoded pgoutput message
//! and a Kafka produce call, and between a delivery report and the flush position sent
//! back to PostgreSQL. No IO here: no sockets, no runtime, no Kafka client, so all of it is
//! unit-tested with hand-built messages.
//!
//! ```text
//!  pgoutput stream                    this crate                          relay (IO)
//!  ───────────────                    ──────────                          ──────────
//!  Relation ─────────▶ BoundTable::bind (columns by name, types checked)
//!  Begin ────────────▶ AckTracker::begin
//!  Insert ───────────▶ BoundTable::map_insert ─▶ OutboxRecord ─┬▶ check_size ─▶ produce
//!  Message (prefix) ─▶ EmitMapper::map_message ─▶ OutboxRecord ┘   (in-flight caps gate
//!                      AckTracker::track_message ─▶ Ticket (delivery opaque)   reading)
//!  Commit ───────────▶ AckTracker::commit(end_lsn)
//!  Keepalive ────────▶ AckTracker::on_keepalive(wal_end)
//!                      AckTracker::ack / fail ◀──────────────────────── delivery report
//!                      AckTracker::watermark ────────────────────────▶ status update (flush)
//! ```
//!
//! - **Mapping** ([`mapping`], [`emit`], [`topic`]): an outbox row (or an emitted
//!   message's JSON envelope) becomes one record: key = aggregate id (so an aggregate's
//!   events stay ordered in one partition), value = the payload exactly as stored, topic
//!   from a template such as `outbox.{aggregate_type}`, headers = the row's headers then
//!   `id`, `event_type`, `aggregate_type`, `outboxd.commit_lsn`, `outboxd.commit_time`.
//! - **Bad rows** are [`RowError`]s with a [`RowErrorKind`] label and a message saying what
//!   to fix; [`dlq`] builds a dead-letter record for them. A table that does not match the
//!   configuration is a [`ShapeError`] naming the column and the `ALTER TABLE` to run.
//! - **Progress** ([`ack`]): the flush position is the `end_lsn` of the newest transaction
//!   whose messages, and all earlier ones', the broker acknowledged; keepalives advance it
//!   only when nothing is open or unacknowledged; a failed delivery freezes it until the
//!   relay restarts from the slot.
//! - **Replays** ([`delivered`]): transactions PostgreSQL sends again after a restart
//!   are skipped when the relay knows Kafka has them, narrowly (same history only).
//! - **Back-pressure** ([`budget`]): caps on in-flight messages and bytes, always letting
//!   one message through; the relay applies [`InFlightCaps::has_room`] to the counts of its
//!   in-flight slab (`crates/relay/src/pipeline/inflight.rs`).
//! - Every error type has a [`ErrorClass`] (permanent or retryable) decided in one place.

pub mod ack;
pub mod budget;
pub mod delivered;
pub mod dlq;
pub mod emit;
pub mod error;
mod json;
pub mod mapping;
pub mod pgtype;
pub mod record;
pub mod topic;
mod value;

pub use ack::{AckTracker, Ticket};
pub use budget::InFlightCaps;
pub use delivered::{DeliveredPosition, PartialTxn, Replay, RowId, RowLedger, SkipRange};
pub use dlq::{dead_letter_message, dead_letter_record};
pub use emit::EmitMapper;
pub use error::{
    short_id, AckError, ColumnRole, ConfigError, ErrorClass, RowError, RowErrorKind, ShapeError,
    TopicNameProblem,
};
pub use mapping::{BoundTable, OutboxColumns, TableSpec};
pub use record::{
    check_size, header, oversize_error, record_wire_size, rfc3339_utc, CommitContext, HeaderFormat,
    HeaderName, OutboxRecord, CLOUDEVENTS_SPEC_VERSION, RECORD_MAX_OVERHEAD,
};
pub use topic::{validate_topic_name, EventFields, TopicField, TopicName, TopicTemplate};
pub use value::PayloadKind;
