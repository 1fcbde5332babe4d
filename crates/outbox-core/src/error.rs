//! Error types of the pipeline, each with the class that tells the relay what to do.
//!
//! - [`ConfigError`]: a setting is wrong (topic template, topic name). Permanent: exit.
//! - [`ShapeError`]: the outbox table does not have the configured shape. Permanent: exit
//!   with the message, which names the table, the column and the fix.
//! - [`RowError`]: one row (or emitted message) cannot become a Kafka record. Permanent for
//!   that row: dead-letter it (see [`crate::dlq`]) or stop, per configuration.
//! - [`AckError`]: the begin/track/commit/ack sequence was violated: a bug, which replaying
//!   the same WAL meets again. Nothing was confirmed past the watermark, so stopping loses
//!   nothing: permanent.
//!
//! The class is [`pgoutput::ErrorClass`], the workspace's one.

use std::fmt;

pub use pgoutput::ErrorClass;

/// Why a string is not a valid Kafka topic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicNameProblem {
    Empty,
    TooLong { len: usize },
    InvalidChar(char),
    DotOrDotDot,
}

impl fmt::Display for TopicNameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicNameProblem::Empty => f.write_str("it is empty"),
            TopicNameProblem::TooLong { len } => {
                write!(f, "it is {len} characters long, the maximum is 249")
            }
            TopicNameProblem::InvalidChar(c) => write!(
                f,
                "it contains {c:?}; only ASCII letters, digits, '.', '_' and '-' are allowed"
            ),
            TopicNameProblem::DotOrDotDot => f.write_str("\".\" and \"..\" are reserved"),
        }
    }
}

/// A configuration value is invalid. Always [`ErrorClass::Permanent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid topic template {template:?}: {reason}")]
    TopicTemplate { template: String, reason: String },
    #[error("invalid Kafka topic name {name:?}: {problem}")]
    TopicName {
        name: String,
        problem: TopicNameProblem,
    },
    #[error("invalid emitted-message prefix: {0}")]
    EmitPrefix(String),
}

impl ConfigError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

/// The part a column plays in the outbox table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnRole {
    Id,
    AggregateType,
    AggregateId,
    EventType,
    Payload,
    Headers,
    /// A column sent as a header of its own (`OUTBOXD_HEADER_COLUMNS`).
    HeaderColumn,
    /// A column named by a topic template placeholder.
    TopicPlaceholder,
}

impl ColumnRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnRole::Id => "id",
            ColumnRole::AggregateType => "aggregate type",
            ColumnRole::AggregateId => "aggregate id",
            ColumnRole::EventType => "event type",
            ColumnRole::Payload => "payload",
            ColumnRole::Headers => "headers",
            ColumnRole::HeaderColumn => "header",
            ColumnRole::TopicPlaceholder => "topic placeholder",
        }
    }

    /// The column types outboxd accepts for this role, in words.
    pub fn accepted_types(self) -> &'static str {
        match self {
            ColumnRole::Id | ColumnRole::HeaderColumn | ColumnRole::TopicPlaceholder => "any type",
            ColumnRole::AggregateType | ColumnRole::EventType => "text, varchar, char or name",
            ColumnRole::AggregateId => {
                "text, varchar, char, name, uuid, smallint, integer or bigint"
            }
            ColumnRole::Payload => "jsonb, json, text, varchar or bytea",
            ColumnRole::Headers => "jsonb or json",
        }
    }
}

impl fmt::Display for ColumnRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outbox table does not have the shape the configuration expects.
/// Always [`ErrorClass::Permanent`]: the relay exits with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("relation {found} is not the configured outbox table {expected}; {}", self.remedy().unwrap_or_default())]
    WrongTable { expected: String, found: String },
    #[error("table {table} has no column {column:?} (configured as the {role} column); its columns are: {available}. {}", self.remedy().unwrap_or_default())]
    MissingColumn {
        table: String,
        column: String,
        role: ColumnRole,
        available: String,
    },
    #[error(
        "column {column:?} of table {table} (the {role} column) has type {found}; \
         outboxd accepts {} there. Fix: {fix}", role.accepted_types()
    )]
    WrongType {
        table: String,
        column: String,
        role: ColumnRole,
        found: String,
        fix: String,
    },
}

impl ShapeError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            ShapeError::WrongTable { .. } => String::from(
                "check the publication (it should contain only the outbox table) or the table \
                setting",
            ),
            ShapeError::MissingColumn { .. } => {
                String::from("Fix: configure the right column name, or add the column to the table")
            }
            _ => return None,
        };
        Some(text)
    }

    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

/// What is wrong with a row; stable snake_case labels for metrics via [`RowErrorKind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowErrorKind {
    /// The aggregate id (the Kafka key) is NULL.
    NullAggregateId,
    /// The aggregate id is the empty string.
    EmptyAggregateId,
    /// Another required column (id, aggregate type, event type) is NULL.
    NullColumn,
    /// A value could not be read: bad UTF-8, bad bytea hex, unknown binary format, bad JSON.
    UnreadableValue,
    /// The headers value is not a JSON object.
    HeadersNotObject,
    /// The rendered topic is not a valid Kafka topic name.
    InvalidTopic,
    /// An unchanged-TOAST marker where a full value is required.
    UnchangedToast,
    /// The tuple does not have the columns its Relation announced.
    MalformedTuple,
    /// The record is larger than the configured maximum message size.
    Oversize,
    /// An emitted message's content is not a valid outbox envelope.
    InvalidEnvelope,
    /// With the CloudEvents header format: the event is not a valid CloudEvent (an empty
    /// id or type, or row headers that clash with the binding's).
    InvalidCloudEvent,
}

impl RowErrorKind {
    pub const ALL: [RowErrorKind; 11] = [
        RowErrorKind::NullAggregateId,
        RowErrorKind::EmptyAggregateId,
        RowErrorKind::NullColumn,
        RowErrorKind::UnreadableValue,
        RowErrorKind::HeadersNotObject,
        RowErrorKind::InvalidTopic,
        RowErrorKind::UnchangedToast,
        RowErrorKind::MalformedTuple,
        RowErrorKind::Oversize,
        RowErrorKind::InvalidEnvelope,
        RowErrorKind::InvalidCloudEvent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RowErrorKind::NullAggregateId => "null_aggregate_id",
            RowErrorKind::EmptyAggregateId => "empty_aggregate_id",
            RowErrorKind::NullColumn => "null_column",
            RowErrorKind::UnreadableValue => "unreadable_value",
            RowErrorKind::HeadersNotObject => "headers_not_object",
            RowErrorKind::InvalidTopic => "invalid_topic",
            RowErrorKind::UnchangedToast => "unchanged_toast",
            RowErrorKind::MalformedTuple => "malformed_tuple",
            RowErrorKind::Oversize => "oversize",
            RowErrorKind::InvalidEnvelope => "invalid_envelope",
            RowErrorKind::InvalidCloudEvent => "invalid_cloudevent",
        }
    }
}

impl fmt::Display for RowErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One outbox row (or emitted message) cannot become a Kafka record.
///
/// The message says what is wrong and what to fix; `event_id` is the row's id when it
/// could be read. Always [`ErrorClass::Permanent`]: the same row fails the same way on
/// every replay, so the relay dead-letters it or stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", EventIdPrefix(.event_id.as_deref()))]
pub struct RowError {
    kind: RowErrorKind,
    event_id: Option<String>,
    message: String,
}

struct EventIdPrefix<'a>(Option<&'a str>);

impl fmt::Display for EventIdPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => write!(f, "outbox event {:?}: ", short_id(id)),
            None => Ok(()),
        }
    }
}

/// Longest event id shown in messages; ids are row data and may be huge, and a message
/// must stay readable (and fit a dead-letter header) with the fix it names.
const MAX_SHOWN_ID: usize = 128;

/// `id` as error messages show it: cut after `MAX_SHOWN_ID` bytes, ending with `…`.
pub fn short_id(id: &str) -> std::borrow::Cow<'_, str> {
    if id.len() <= MAX_SHOWN_ID {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut cut = MAX_SHOWN_ID;
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", id.get(..cut).unwrap_or_default()))
}

impl RowError {
    pub fn new(kind: RowErrorKind, message: impl Into<String>) -> Self {
        RowError {
            kind,
            event_id: None,
            message: message.into(),
        }
    }

    /// Attach the row's id (the event id), when it was readable.
    pub fn with_event_id(mut self, event_id: Option<&str>) -> Self {
        if self.event_id.is_none() {
            self.event_id = event_id.map(str::to_owned);
        }
        self
    }

    pub fn kind(&self) -> RowErrorKind {
        self.kind
    }

    pub fn event_id(&self) -> Option<&str> {
        self.event_id.as_deref()
    }

    /// The description without the event-id prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

/// The ack sequence was violated (a relay or decoder bug, or a protocol surprise).
///
/// [`ErrorClass::Permanent`]: replaying the same WAL would meet the same sequence again,
/// so the relay stops (exit 1) with this message instead of looping. The watermark never
/// moved past unacknowledged work, so the next start loses nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    #[error("Begin received while transaction #{open} is still open (no Commit seen)")]
    TransactionAlreadyOpen { open: u64 },
    #[error("{operation} outside a transaction (no Begin seen)")]
    NoOpenTransaction { operation: &'static str },
    #[error("delivery report for unknown transaction #{seq} (already complete or never issued)")]
    UnknownTxn { seq: u64 },
    #[error("more delivery reports than messages for transaction #{seq}")]
    TooManyReports { seq: u64 },
    /// A delivery report whose ticket is not in flight: a duplicate or stale report.
    #[error("delivery report for unknown message {ticket}")]
    UnknownDelivery { ticket: usize },
    #[error(
        "Commit end_lsn {end_lsn} is below the previous transaction's end_lsn {previous}; \
         commits must arrive in WAL order"
    )]
    EndLsnRegressed {
        end_lsn: pgoutput::Lsn,
        previous: pgoutput::Lsn,
    },
}

impl AckError {
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_error_display_includes_event_id_once() {
        let e = RowError::new(RowErrorKind::NullAggregateId, "aggregate_id is NULL")
            .with_event_id(Some("42"))
            .with_event_id(Some("43"));
        assert_eq!(e.to_string(), "outbox event \"42\": aggregate_id is NULL");
        assert_eq!(e.event_id(), Some("42"));
        assert_eq!(e.kind().as_str(), "null_aggregate_id");
        assert_eq!(e.class(), ErrorClass::Permanent);
        let e = RowError::new(RowErrorKind::Oversize, "too big");
        assert_eq!(e.to_string(), "too big");
    }

    #[test]
    fn kind_labels_are_unique_snake_case() {
        let mut labels: Vec<_> = RowErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert!(labels
            .iter()
            .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), RowErrorKind::ALL.len());
    }

    #[test]
    fn classes() {
        // The relay stops on it (exit 1): see RelayError::class.
        assert_eq!(
            AckError::UnknownTxn { seq: 1 }.class(),
            ErrorClass::Permanent
        );
        let e = ConfigError::EmitPrefix("empty".into());
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert_eq!(ErrorClass::Permanent.to_string(), "permanent");
    }
}
