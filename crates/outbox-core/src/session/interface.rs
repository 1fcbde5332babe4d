//! What a session takes and reports: the settings its rules need, why it stops, and
//! what it tells an observer as it goes.

use pgoutput::{Lsn, Message, PgTimestamp, TupleData};

use crate::budget::InFlightCaps;
use crate::delivered::{Doubt, TxnId};
use crate::emit::EmitMapper;
use crate::error::{AckError, RowError, ShapeError};
use crate::mapping::TableSpec;
use crate::record::OutboxRecord;
use crate::replay::PartialMismatch;
use crate::topic::TopicName;

/// What becomes of a row that cannot be published as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRowPolicy {
    DeadLetter,
    Stop,
}

/// What the rules need of the relay's settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub table: TableSpec,
    /// false: only emitted messages are relayed, and the table need not be published. An
    /// explicit choice, never inferred from the publication.
    pub relay_table: bool,
    /// Emitted logical messages with this mapper's prefix are relayed too.
    pub emit: Option<EmitMapper>,
    pub dead_letter_topic: TopicName,
    pub bad_row_policy: BadRowPolicy,
    pub max_message_bytes: usize,
    pub caps: InFlightCaps,
    /// Keepalives may move the position over WAL with nothing for the relay.
    pub idle_flush: bool,
    /// `OUTBOXD_FORMER_PARTITIONS`: relations (`schema.name`) that were partitions of the
    /// table when rows were written to them, detached or dropped since: their inserts
    /// still in the WAL are the table's rows.
    pub former_partitions: Vec<String>,
}

impl CoreConfig {
    /// The settings that decide what is published, as one number: a claim recorded under
    /// other settings proves nothing (`heartbeat`: heartbeats are streamed; `publication`
    /// and `catalog`: its name and catalog identity).
    pub fn fingerprint(&self, heartbeat: bool, publication: &str, catalog: &str) -> u64 {
        let on = |b: bool| if b { "on" } else { "off" };
        let f = crate::delivered::Fingerprint::default()
            .add("table", &format!("{:?}", self.table))
            .add("relay_table", on(self.relay_table))
            .add("emit", &format!("{:?}", self.emit))
            .add("heartbeat", on(heartbeat))
            .add("dead_letter_topic", self.dead_letter_topic.as_str())
            .add("bad_row_policy", &format!("{:?}", self.bad_row_policy))
            .add("max_message_bytes", &self.max_message_bytes.to_string())
            .add("publication", publication)
            .add("publication_catalog", catalog);
        // Only when set, so that claims recorded before the setting existed still count.
        let f = match self.former_partitions.is_empty() {
            true => f,
            false => f.add("former_partitions", &self.former_partitions.join(",")),
        };
        f.finish()
    }
}

/// Why a session stops. The texts end with the remedy ([`SessionError::remedy`]), so the
/// relay prints them as they are.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("ack tracking error: {0}")]
    Ack(#[from] AckError),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error("replication protocol error: {0}")]
    Protocol(String),
    #[error("the partly delivered transaction committing at {}: {}", .0, remedy(self))]
    PartialReplay(PartialMismatch),
    /// The proof of a replay failed after its hold spilled (`ReplayCore::spill`): rows were
    /// dropped unproven, so the session ends before anything past them is confirmed, and
    /// the next one publishes them.
    #[error("a replay too long to hold in memory was not proven delivered ({}): the next session publishes it again", .0.explain())]
    ReplayUnproven(Doubt),
    /// Under [`BadRowPolicy::Stop`]; the slot stays before `commit_lsn`. `skip_to`: the
    /// slot position past it and nothing later (`commit_lsn + 1` for a transaction, whose
    /// commit record starts there; a non-transactional message's own position, where the
    /// next record may start).
    #[error("bad outbox row{}: {error}", shown_id(error))]
    BadRow {
        error: RowError,
        commit_lsn: Lsn,
        skip_to: Lsn,
    },
    #[error("bad outbox row{}: {error}; {}", shown_id(error), remedy(self))]
    DeadLetterTooLarge { error: RowError, size: usize },
    /// A record held while its replay was proven, then released, was refused as too large:
    /// its transaction is committed, so no dead letter can take its place.
    #[error("a replayed record for topic {topic} was refused as too large ({size} bytes) after it was held; {}", self.remedy().unwrap_or_default())]
    ReleasedTooLarge { topic: String, size: usize },
    /// Inserts into a relation shaped like the outbox that the catalog does not call a
    /// partition of it (one detached or dropped since its rows were written).
    #[error(
        "the stream carries inserts into {relation}, which has the outbox's columns {}",
        remedy(self)
    )]
    OutboxLikeRelation { relation: String, table: String },
}

impl SessionError {
    /// The replay this session judged could not be proven delivered (a spilled hold
    /// doubted, or a partly delivered transaction whose rows do not match its record): the
    /// next session skips nothing ([`crate::LifeCore::replay_unproven`]), or it would meet
    /// the same record the same way and end again, for ever.
    pub fn doubts_replay(&self) -> bool {
        matches!(
            self,
            SessionError::PartialReplay(_) | SessionError::ReplayUnproven(_)
        )
    }

    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            SessionError::ReleasedTooLarge { .. } => String::from("nothing past it is confirmed"),
            SessionError::PartialReplay(m) => format!(
                "it is published again whole from the slot (duplicates, never a loss){}",
                if m.reason == Doubt::PartialDigest {
                    "; likely a record outboxd did not write: allow only outboxd's own \
                     Kafka principal to write OUTBOXD_PROGRESS_TOPIC \
                     (docs/replay-skip.md#who-may-write-the-progress-topic)"
                } else {
                    ""
                }
            ),
            SessionError::DeadLetterTooLarge { size, .. } => format!(
                "its dead-letter record of {size} bytes does not fit OUTBOXD_MAX_MESSAGE_BYTES \
                either, so outboxd stopped without acknowledging the row. Raise \
                OUTBOXD_MAX_MESSAGE_BYTES (with the broker's message.max.bytes) and restart"
            ),
            SessionError::OutboxLikeRelation { relation, table } => format!(
                "but is neither {table} nor, in the current catalog, one of its partitions: \
                probably a partition detached or dropped before outboxd relayed its rows. \
                Ignoring them could lose events, so outboxd stopped before confirming them. \
                If {relation} was a partition of {table} when they were written, note \
                `SELECT pg_current_wal_lsn()`, set OUTBOXD_FORMER_PARTITIONS={relation} \
                (comma-separated, with any named before) and restart: its rows still in \
                the WAL are published as {table}'s. Unset it once `outboxd status` shows \
                the slot confirmed past the noted position and a CHECKPOINT has run since \
                (a crash before one takes the slot back; a later table of that name would \
                be published too; with OUTBOXD_IDLE_FLUSH=false the slot gets there with \
                the next outbox row). If {relation} really is another table, take it out \
                of the publication instead"
            ),
            _ => return None,
        };
        Some(text)
    }
}

fn remedy(e: &SessionError) -> String {
    e.remedy().unwrap_or_default()
}

/// A bad row's event id as its error's text shows it (` id=…`), if it has one.
fn shown_id(error: &RowError) -> String {
    error
        .event_id()
        .map(|id| format!(" id={}", crate::error::short_id(id)))
        .unwrap_or_default()
}

/// A row left unpublished because Kafka has it.
#[derive(Debug, Clone, Copy)]
pub enum Skipped<'a> {
    /// A held record of a replay proven delivered, or dropped by a spilled hold (proven
    /// later, or the session ends: see [`crate::SessionCore::proving_skips`]).
    Held(&'a OutboxRecord),
    /// A leading row of the partly delivered transaction, before it was mapped.
    Row(&'a TupleData),
    /// The same, for an emitted message.
    Message(&'a Message),
}

/// What the rules report as they go: metrics and logs in the relay, checks in the
/// simulator. Every method defaults to nothing.
pub trait Observe {
    fn skipped(&mut self, _what: Skipped<'_>) {}
    /// A bad row's dead-letter record was queued (or held with its replay); under
    /// [`BadRowPolicy::Stop`] nothing is: the row was not dead-lettered.
    fn dead_lettered(&mut self, _error: &RowError, _topic: &TopicName) {}
    /// The broker acknowledged a message of a transaction committed at
    /// `commit_unix_micros`; the report came at `acked_at_unix_micros`.
    fn acked(&mut self, _commit_unix_micros: i64, _acked_at_unix_micros: i64) {}
    fn delivery_failed(&mut self) {}
    /// How many records the replay holds now.
    fn held(&mut self, _n: usize) {}
    fn doubt(&mut self, _d: Doubt, _held: usize) {}
    /// A partly delivered transaction begins: its first `rows` rows are skipped.
    fn resuming(&mut self, _txn: TxnId, _rows: u64) {}
}

/// How the producer took a [`crate::ToSend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// Refused for `message.max.bytes`, as the producer measured it: a bad row, since
    /// the same record is refused on every replay.
    TooLarge {
        size: usize,
    },
}

/// What [`crate::SessionCore::on_relation`] made of a relation: the caller's checks of the
/// outbox's columns (binary values) follow the rules' word, not a second reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationRole {
    /// The outbox table, or a partition of it.
    Outbox,
    /// Another published relation.
    Ignored,
}

/// What the caller does after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum After {
    Nothing,
    /// A publication-guard message: the transaction it is in changed a publication, so
    /// look at it now (`commit`: where re-publishing would start).
    LookAtPublication {
        commit: Option<(Lsn, PgTimestamp)>,
    },
}
