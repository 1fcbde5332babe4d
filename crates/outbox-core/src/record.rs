//! The Kafka record an outbox event becomes, and the size check against the broker limit.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{Lsn, Message, PgTimestamp};

use crate::error::{RowError, RowErrorKind};

/// A Kafka header name: static for the relay's own headers, owned for the row's.
pub type HeaderName = Cow<'static, str>;

/// Names of the headers outboxd sets.
pub mod header {
    /// The event id (outbox `id`): what consumers deduplicate on.
    pub const ID: &str = "id";
    pub const EVENT_TYPE: &str = "event_type";
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// `X/Y` commit LSN of the source transaction.
    pub const COMMIT_LSN: &str = "outboxd.commit_lsn";
    /// Commit time, Unix milliseconds as decimal text.
    pub const COMMIT_TIME: &str = "outboxd.commit_time";
    /// Dead-letter records: the error text.
    pub const ERROR: &str = "outboxd.error";
    /// Dead-letter records: the [`crate::RowErrorKind`] label.
    pub const ERROR_KIND: &str = "outboxd.error_kind";
    /// Dead-letter records of table rows: `schema.table`.
    pub const SOURCE_TABLE: &str = "outboxd.source_table";
    /// Dead-letter records of emitted messages: the message prefix.
    pub const SOURCE_PREFIX: &str = "outboxd.source_prefix";
    /// Dead-letter records: comma-separated columns left out (as null) to fit the size limit.
    pub const OMITTED_COLUMNS: &str = "outboxd.omitted_columns";
}

/// Where and when the source transaction committed; stamped on every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitContext {
    /// The Begin's `final_lsn` (= the Commit's `commit_lsn`).
    pub commit_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

impl CommitContext {
    pub fn new(commit_lsn: Lsn, commit_time: PgTimestamp) -> Self {
        CommitContext {
            commit_lsn,
            commit_time,
        }
    }

    /// For a non-transactional emitted message, which has no commit: its own LSN and the
    /// time it was received.
    pub fn non_transactional(message: &Message, received: PgTimestamp) -> Self {
        CommitContext {
            commit_lsn: message.lsn,
            commit_time: received,
        }
    }
}

/// One Kafka record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    pub topic: Arc<str>,
    /// The aggregate id: events of one aggregate share a partition, hence an order.
    /// `None` only for dead-letter records whose aggregate id was unreadable.
    pub key: Option<Bytes>,
    /// The payload as stored. `None` (a tombstone) when the payload is SQL NULL / JSON null.
    pub value: Option<Bytes>,
    /// Row headers first, then outboxd's, so `lastHeader(name)` finds outboxd's value.
    pub headers: Vec<(HeaderName, Bytes)>,
    /// Commit time in Unix milliseconds: the Kafka record timestamp.
    pub timestamp_millis: i64,
    /// The event id as text; empty for a dead-letter record whose id was unreadable.
    pub event_id: String,
}

impl OutboxRecord {
    /// Key + value + header names and values, in bytes: what in-flight byte caps and the
    /// size check count. Kafka's own framing adds some tens of bytes on top.
    pub fn approx_size(&self) -> usize {
        let headers = self.headers.iter().fold(0usize, |n, (k, v)| {
            n.saturating_add(k.len()).saturating_add(v.len())
        });
        self.key
            .as_ref()
            .map_or(0, Bytes::len)
            .saturating_add(self.value.as_ref().map_or(0, Bytes::len))
            .saturating_add(headers)
    }

    /// The value of the last header called `name`.
    pub fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// Reject a record over `max_bytes` ([`OutboxRecord::approx_size`]) with a
/// [`RowErrorKind::Oversize`] error, before the broker does.
pub fn check_size(record: &OutboxRecord, max_bytes: usize) -> Result<(), RowError> {
    let size = record.approx_size();
    if size <= max_bytes {
        return Ok(());
    }
    let value = record.value.as_ref().map_or(0, Bytes::len);
    Err(RowError::new(
        RowErrorKind::Oversize,
        format!(
            "the Kafka record for topic {topic} is {size} bytes (value {value}), over the \
             {max_bytes}-byte limit. Fix: make the event smaller, or raise \
             OUTBOXD_MAX_MESSAGE_BYTES together with the broker's message.max.bytes and the \
             topic's max.message.bytes",
            topic = record.topic,
        ),
    )
    .with_event_id(Some(&record.event_id)))
}

/// The textual fields of one event, already checked.
pub(crate) struct EventParts {
    pub id: Bytes,
    pub aggregate_type: Bytes,
    pub aggregate_id: Bytes,
    pub event_type: Bytes,
    pub event_id: String,
}

/// Assemble a record: row headers first, then outboxd's own.
pub(crate) fn assemble(
    topic: Arc<str>,
    parts: EventParts,
    value: Option<Bytes>,
    mut headers: Vec<(HeaderName, Bytes)>,
    ctx: &CommitContext,
) -> OutboxRecord {
    let millis = ctx.commit_time.unix_millis();
    headers.reserve(5);
    headers.push((Cow::Borrowed(header::ID), parts.id));
    headers.push((Cow::Borrowed(header::EVENT_TYPE), parts.event_type));
    headers.push((Cow::Borrowed(header::AGGREGATE_TYPE), parts.aggregate_type));
    headers.push((
        Cow::Borrowed(header::COMMIT_LSN),
        Bytes::from(ctx.commit_lsn.to_string()),
    ));
    headers.push((
        Cow::Borrowed(header::COMMIT_TIME),
        Bytes::from(millis.to_string()),
    ));
    OutboxRecord {
        topic,
        key: Some(parts.aggregate_id),
        value,
        headers,
        timestamp_millis: millis,
        event_id: parts.event_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> OutboxRecord {
        OutboxRecord {
            topic: Arc::from("t"),
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::from_static(b"12345")),
            headers: vec![
                (Cow::Borrowed("ab"), Bytes::from_static(b"c")),
                (Cow::Owned("ab".to_owned()), Bytes::from_static(b"d")),
            ],
            timestamp_millis: 0,
            event_id: "e".into(),
        }
    }

    #[test]
    fn approx_size_counts_key_value_headers() {
        let mut r = record();
        assert_eq!(r.approx_size(), 3 + 5 + 3 + 3);
        r.key = None;
        r.value = None;
        assert_eq!(r.approx_size(), 6);
        assert_eq!(r.header("ab").map(|b| &b[..]), Some(&b"d"[..]));
        assert_eq!(r.header("zz"), None);
    }

    #[test]
    fn size_check_message() {
        let r = record();
        assert!(check_size(&r, 14).is_ok());
        let e = check_size(&r, 13).unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::Oversize);
        assert_eq!(e.event_id(), Some("e"));
        let msg = e.to_string();
        for needle in [
            "14 bytes",
            "13-byte",
            "OUTBOXD_MAX_MESSAGE_BYTES",
            "message.max.bytes",
        ] {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
    }

    #[test]
    fn non_transactional_context() {
        let m = Message {
            xid: None,
            flags: 0,
            lsn: Lsn(77),
            prefix: "p".into(),
            content: Bytes::new(),
        };
        let c = CommitContext::non_transactional(&m, PgTimestamp(5));
        assert_eq!(c, CommitContext::new(Lsn(77), PgTimestamp(5)));
    }
}
