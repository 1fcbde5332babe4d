//! The pure pipeline logic of outboxd: what happens between a decoded pgoutput message
//! and a Kafka produce call, and between a delivery report and the flush position sent
//! back to PostgreSQL. No IO here: no sockets, no runtime, no Kafka client, so all of it is
//! unit-tested with hand-built messages.
//!
//! ```text
//!  pgoutput stream                    this crate                          relay (IO)
//!  ───────────────                    ──────────                          ──────────
//!  Relation ─────────▶ BoundTable::bind (columns by name, types checked)
//!  Begin ────────────▶ InFlightLedger::begin
//!  Insert ───────────▶ BoundTable::map_insert ─▶ OutboxRecord ─┬▶ check_size
//!  Message (prefix) ─▶ EmitMapper::map_message ─▶ OutboxRecord ┘
//!                      InFlightLedger::produced ─▶ Ticket ───────────▶ produce (opaque)
//!                      InFlightLedger::has_room ─────────────────────▶ pause reading
//!  Commit ───────────▶ InFlightLedger::commit(end_lsn)
//!  Keepalive ────────▶ InFlightLedger::on_keepalive(wal_end)
//!                      InFlightLedger::delivered(Ticket, Outcome) ◀──── delivery report
//!                      InFlightLedger::watermark ────────────────────▶ status update (flush)
//!                      Backoff::after_session ───────────────────────▶ reconnect delay
//! ```
//!
//! [`InFlightLedger`] is the one record of what is in flight: a slab entry per message
//! ([`inflight`], indexed by the [`Ticket`]) and the [`AckTracker`]'s count per
//! transaction ([`TxnSeq`]), kept together so a message is registered and settled once.
//!
//! - **Mapping** ([`mapping`], [`emit`], [`topic`]): an outbox row (or an emitted
//!   message's JSON envelope) becomes one record: key = aggregate id (so an aggregate's
//!   events stay ordered in one partition), value = the payload exactly as stored, topic
//!   from a template such as `outbox.{aggregate_type}`, headers = the row's headers then
//!   `id`, `event_type`, `aggregate_type`, `outboxd.commit_lsn`, `outboxd.commit_time`.
//! - **Bad rows** are [`RowError`]s with a [`RowErrorKind`] label and a message saying what
//!   to fix; [`dlq`] builds a dead-letter record for them. A table that does not match the
//!   configuration is a [`ShapeError`] naming the column and the `ALTER TABLE` to run.
//! - **Progress** ([`ledger`], [`ack`]): the flush position is the `end_lsn` of the
//!   newest transaction whose messages, and all earlier ones', the broker acknowledged;
//!   keepalives advance it only when nothing is open or unacknowledged; a failed delivery
//!   freezes it until the relay restarts from the slot.
//! - **Replays** ([`delivered`]): transactions PostgreSQL sends again after a restart
//!   are skipped when the relay knows Kafka has them, narrowly (same history only).
//! - **Between sessions** ([`life`]): [`LifeCore`] decides the claim a session starts
//!   with (this process's own, or the progress record's), refuses another cluster, an
//!   older timeline and what the record forbids, and carries a claim by how a session ended.
//! - **Replay rules of a session** ([`replay`]): [`ReplayCore`] holds, drops, releases
//!   and resumes, and builds the session's claim.
//! - **A session's rules** ([`session`]): [`SessionCore`] puts the above together:
//!   messages, keepalives and delivery reports in; records to send, the position to
//!   confirm and the claim out. The relay and the simulator both drive it.
//! - **Back-pressure** ([`budget`]): caps on in-flight messages and bytes, always letting
//!   one message through; [`InFlightLedger::has_room`] applies [`InFlightCaps::has_room`]
//!   to the exact counts of its slab.
//! - **Reconnects** ([`backoff`]): capped exponential backoff with equal jitter, the random
//!   source passed in by the relay.
//! - **Binary values** ([`binary`]): whether a session may ask pgoutput for binary
//!   column values, which decode to the same bytes as the text form.
//! - **The slot's fate** ([`slot_fate`]): a missing or invalidated slot streams, is
//!   created, or stops the relay with the time to re-publish from; one that existed is
//!   never created again silently.
//! - **The progress record's cadence** ([`cadence`]): [`RecordCadence`] says when a
//!   session writes its record and reads it back for another writer.
//! - **A sharded outbox's layout** ([`shard`]): whether the table is partitioned as
//!   `OUTBOXD_SHARD_COUNT` shards, and the fix as a [`shard::Plan`] of actions.
//! - **A clean shutdown** ([`shutdown`]): [`Shutdown`], the order of its steps (finish the
//!   open transaction, acks or the Kafka commit, a last look, confirm, the final record).
//! - **Exactly-once** ([`kafka_txn`]): [`KafkaTxnCore`] says when a Kafka transaction
//!   commits or splits, when the slot may move, and what each error class leads to.
//! - Every error type has a [`ErrorClass`] (permanent or retryable) decided in one place.

pub mod ack;
pub mod backoff;
pub mod binary;
pub mod budget;
pub mod cadence;
pub mod delivered;
pub mod dlq;
pub mod emit;
pub mod error;
pub mod inflight;
mod json;
pub mod kafka_txn;
pub mod ledger;
pub mod left_open;
pub mod life;
pub mod mapping;
pub mod pgtype;
pub mod publication;
pub mod record;
pub mod replay;
pub mod session;
pub mod shard;
pub mod shutdown;
pub mod slot_fate;
pub mod topic;
mod value;

pub use ack::{AckTracker, TxnSeq};
pub use backoff::Backoff;
pub use binary::{text_only_column, BinaryMode, OutputSettings, ReadAs, TextOnly};
pub use budget::InFlightCaps;
pub use cadence::{CadenceRules, RecordAcks, RecordCadence, RecordFacts, RecordTurn};
pub use delivered::{
    Begin as ReplayBegin, DeliveredPosition, Doubt, Fingerprint, PartialTxn, ReplayProof, RowId,
    RowLedger, Settle, TxnId, TxnMark,
};
pub use dlq::{dead_letter_message, dead_letter_message_head, dead_letter_record};
pub use emit::EmitMapper;
pub use error::{
    short_id, AckError, ColumnRole, ConfigError, ErrorClass, RowError, RowErrorKind, ShapeError,
    TopicNameProblem,
};
pub use inflight::InFlightEntry;
pub use kafka_txn::{lost_slot_claim, CommitStep, KafkaTxnCore, TxnError, TxnNext, TxnRules};
pub use ledger::{InFlightLedger, Outcome, Outgoing, Ticket};
pub use left_open::{AbortedSpans, FirstWrites, LeftOpen, OpenBelow, Regions, TopicPartition};
pub use life::{Claim, Ended, Known, LifeCore, RecordRead, Refusal, SlotView};
pub use mapping::{BoundTable, OutboxColumns, TableSpec};
pub use publication::{CatalogLook, Look, Looked, PublicationWatch, WatchStop};
pub use record::{
    check_size, frame_limit, header, oversize_error, oversize_row_error, record_wire_size,
    rfc3339_utc, rfc3339_utc_seconds, CommitContext, HeaderFormat, HeaderName, OutboxRecord,
    CLOUDEVENTS_SPEC_VERSION, RECORD_MAX_OVERHEAD,
};
pub use replay::{Held, NextRow, PartialMismatch, ReplayCore, ReplayStart, Step};
pub use session::{
    After, BadRowPolicy, CoreConfig, Observe, RelationRole, Sent, SessionCore, SessionError,
    Skipped, ToSend, PUBLICATION_GUARD_PREFIX,
};
pub use shutdown::{BeforeBadRow, Happened, LookEnd, Shutdown, ShutdownRules, ShutdownStep};
pub use topic::{validate_topic_name, EventFields, TopicField, TopicName, TopicTemplate};
pub use value::PayloadKind;
