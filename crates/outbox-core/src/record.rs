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
    /// Dead-letter records: comma-separated fields cut short or left out to fit the size
    /// limit (`error`, `key`, `id`, `value`, `headers`); cut texts end with `…`.
    pub const TRUNCATED: &str = "outboxd.truncated";
    /// CloudEvents attributes in the Kafka protocol binding's binary content mode.
    pub const CE_SPECVERSION: &str = "ce_specversion";
    pub const CE_ID: &str = "ce_id";
    pub const CE_SOURCE: &str = "ce_source";
    pub const CE_TYPE: &str = "ce_type";
    pub const CE_TIME: &str = "ce_time";
    /// The binding maps `datacontenttype` to this header, not to a `ce_` one.
    pub const CONTENT_TYPE: &str = "content-type";
}

/// Which headers outboxd adds after the row's own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HeaderFormat {
    /// `id`, `event_type`, `aggregate_type`, `outboxd.commit_lsn`, `outboxd.commit_time`.
    #[default]
    Outboxd,
    /// The same, then the CloudEvents attributes of the Kafka protocol binding (binary
    /// content mode): `ce_specversion`, `ce_id`, `ce_source`, `ce_type`, `ce_time` and,
    /// when the payload's type is known, `content-type`. The value stays the payload.
    /// outboxd's own headers stay so that consumers deduplicating on `id` keep working
    /// when the format is switched on.
    CloudEvents {
        /// The `source` attribute (a URI-reference naming the producing context).
        source: Bytes,
    },
}

/// The CloudEvents spec version outboxd writes.
pub const CLOUDEVENTS_SPEC_VERSION: &str = "1.0";

/// `unix_micros` as an RFC 3339 UTC timestamp with microseconds
/// (`2026-12-01T09:41:55.123456Z`), as CloudEvents' `time` wants it.
pub fn rfc3339_utc(unix_micros: i64) -> String {
    let micros = unix_micros.rem_euclid(1_000_000);
    format!(
        "{}.{micros:06}Z",
        date_and_time(unix_micros.div_euclid(1_000_000))
    )
}

/// `unix_secs` as an RFC 3339 UTC timestamp to the second (`2026-12-01T09:41:55Z`), for
/// messages that name a moment.
pub fn rfc3339_utc_seconds(unix_secs: i64) -> String {
    format!("{}Z", date_and_time(unix_secs))
}

fn date_and_time(unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`), so no date crate is needed for one format.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    /// Key + value + header names and values, in bytes: what the in-flight byte cap
    /// counts. The size limit is checked with [`OutboxRecord::wire_size`] instead.
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

    /// The size librdkafka compares with `message.max.bytes` for this record
    /// ([`record_wire_size`]).
    pub fn wire_size(&self) -> usize {
        record_wire_size(
            self.key.as_ref().map_or(0, Bytes::len),
            self.value.as_ref().map_or(0, Bytes::len),
            self.headers.iter().map(|(k, v)| (k.len(), v.len())),
        )
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

/// The framing librdkafka adds to every record when it checks the record against
/// `message.max.bytes` (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`): the v2 record's Length,
/// Attributes, TimestampDelta, OffsetDelta, KeyLength, ValueLength and HeaderCount at the
/// largest size their varints can take (5 + 1 + 10 + 5 + 5 + 5 + 5). It is counted in
/// full whatever the actual values, so a record is refused by its lengths alone.
pub const RECORD_MAX_OVERHEAD: usize = 36;

/// The size librdkafka checks against `message.max.bytes` when a record is produced
/// (`rd_kafka_msg_max_wire_size`, librdkafka 2.x): [`RECORD_MAX_OVERHEAD`], plus key and
/// value, plus the serialized headers, each header being its name and value with their
/// lengths as zig-zag varints. A record is refused when this is *greater* than the
/// limit, so one of exactly `message.max.bytes` is accepted. `headers` yields (name
/// length, value length).
pub fn record_wire_size(
    key_len: usize,
    value_len: usize,
    headers: impl IntoIterator<Item = (usize, usize)>,
) -> usize {
    headers.into_iter().fold(
        RECORD_MAX_OVERHEAD
            .saturating_add(key_len)
            .saturating_add(value_len),
        |n, (name, value)| n.saturating_add(header_wire_size(name, value)),
    )
}

/// One serialized header: varint name length, name, varint value length, value.
pub(crate) fn header_wire_size(name_len: usize, value_len: usize) -> usize {
    zigzag_varint_len(name_len)
        .saturating_add(name_len)
        .saturating_add(zigzag_varint_len(value_len))
        .saturating_add(value_len)
}

/// Bytes of the zig-zag varint of a non-negative length: 7 bits of `2 * n` per byte.
fn zigzag_varint_len(n: usize) -> usize {
    let mut v = u128::try_from(n).unwrap_or(u128::MAX).saturating_mul(2);
    let mut bytes = 1;
    while v > 0x7f {
        v >>= 7;
        bytes += 1;
    }
    bytes
}

/// Reject a record whose [`OutboxRecord::wire_size`] is over `max_bytes` with a
/// [`RowErrorKind::Oversize`] error, before the producer does.
pub fn check_size(record: &OutboxRecord, max_bytes: usize) -> Result<(), RowError> {
    let size = record.wire_size();
    if size <= max_bytes {
        return Ok(());
    }
    Err(oversize_error(record, size, max_bytes))
}

/// The smallest frame limit; below it, rows whose unused columns are large would be cut
/// for no memory worth saving.
const MIN_FRAME_LIMIT: usize = 16 << 20;

/// The longest replication message held whole, for a record limit of `max_bytes`
/// (`OUTBOXD_MAX_MESSAGE_BYTES`): four times it, at least 16 MiB. A row's text form
/// on the stream is at most about twice its record (bytea's hex is the widest), so a
/// row over this cannot become a record within `max_bytes`, unless columns the record
/// does not use make up most of it; it is read through and dealt with as a bad row of
/// kind [`RowErrorKind::Oversize`] (see [`oversize_row_error`]), never buffered.
pub fn frame_limit(max_bytes: usize) -> usize {
    max_bytes.saturating_mul(4).max(MIN_FRAME_LIMIT)
}

/// The [`RowErrorKind::Oversize`] error for a row or emitted message of `len` bytes on
/// the replication stream, over [`frame_limit`]: it was read through, not held.
pub fn oversize_row_error(what: &str, len: usize, max_bytes: usize) -> RowError {
    RowError::new(
        RowErrorKind::Oversize,
        format!(
            "{what} is {len} bytes on the replication stream, over the {limit}-byte limit of \
             what outboxd holds whole (4 x OUTBOXD_MAX_MESSAGE_BYTES, at least 16 MiB), so its \
             Kafka record would be over the {max_bytes}-byte limit; it was read through \
             without being kept. Fix: make the event smaller, or raise \
             OUTBOXD_MAX_MESSAGE_BYTES together with the broker's message.max.bytes and the \
             topic's max.message.bytes",
            limit = frame_limit(max_bytes),
        ),
    )
}

/// The [`RowErrorKind::Oversize`] error for `record`, measured at `size` bytes (by
/// [`check_size`], or by the producer when it refused the record).
pub fn oversize_error(record: &OutboxRecord, size: usize, max_bytes: usize) -> RowError {
    let value = record.value.as_ref().map_or(0, Bytes::len);
    let key = record.key.as_ref().map_or(0, Bytes::len);
    RowError::new(
        RowErrorKind::Oversize,
        format!(
            "the Kafka record for topic {topic} is {size} bytes with Kafka's framing (key \
             {key}, value {value}), over the {max_bytes}-byte limit. Fix: make the event \
             smaller, or raise OUTBOXD_MAX_MESSAGE_BYTES together with the broker's \
             message.max.bytes and the topic's max.message.bytes",
            topic = record.topic,
        ),
    )
    .with_event_id(Some(&record.event_id))
}

/// The textual fields of one event, already checked.
pub(crate) struct EventParts {
    pub id: Bytes,
    pub aggregate_type: Bytes,
    pub aggregate_id: Bytes,
    pub event_type: Bytes,
    pub event_id: String,
    /// The payload's media type, when its column type (or JSON type) says it.
    pub content_type: Option<&'static str>,
}

/// Assemble a record: row headers first, then outboxd's own (and the CloudEvents
/// attributes last, when on). With CloudEvents, a row that would not be a valid event
/// (see [`check_cloudevent`]) is a [`RowErrorKind::InvalidCloudEvent`] error.
pub(crate) fn assemble(
    topic: Arc<str>,
    parts: EventParts,
    value: Option<Bytes>,
    mut headers: Vec<(HeaderName, Bytes)>,
    ctx: &CommitContext,
    format: &HeaderFormat,
) -> Result<OutboxRecord, RowError> {
    let millis = ctx.commit_time.unix_millis();
    headers.reserve(11);
    if let HeaderFormat::CloudEvents { source } = format {
        let writes_content_type = value.is_some() && parts.content_type.is_some();
        check_cloudevent(&parts, &headers, writes_content_type)
            .map_err(|e| e.with_event_id(Some(&parts.event_id)))?;
        // Pushed below, after outboxd's own; prepared here while `parts` is whole.
        let ce = [
            (
                header::CE_SPECVERSION,
                Bytes::from_static(CLOUDEVENTS_SPEC_VERSION.as_bytes()),
            ),
            (header::CE_ID, parts.id.clone()),
            (header::CE_SOURCE, source.clone()),
            (header::CE_TYPE, parts.event_type.clone()),
            (
                header::CE_TIME,
                Bytes::from(rfc3339_utc(ctx.commit_time.unix_micros())),
            ),
        ];
        let content_type = value
            .as_ref()
            .and(parts.content_type)
            .map(|t| (header::CONTENT_TYPE, Bytes::from_static(t.as_bytes())));
        let mut record = assemble(topic, parts, value, headers, ctx, &HeaderFormat::Outboxd)?;
        record.headers.extend(
            ce.into_iter()
                .chain(content_type)
                .map(|(k, v)| (Cow::Borrowed(k), v)),
        );
        return Ok(record);
    }
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
    Ok(OutboxRecord {
        topic,
        key: Some(parts.aggregate_id),
        value,
        headers,
        timestamp_millis: millis,
        event_id: parts.event_id,
    })
}

/// The binding's headers outboxd writes in CloudEvents mode (`content-type` only when it
/// knows the payload's type).
const CLOUDEVENTS_HEADERS: [&str; 5] = [
    header::CE_SPECVERSION,
    header::CE_ID,
    header::CE_SOURCE,
    header::CE_TYPE,
    header::CE_TIME,
];

/// Whether the event can be a CloudEvent: CloudEvents 1.0 says `id` and `type` "MUST be
/// a non-empty string", and a consumer's SDK reads each attribute from one header, so
/// the row's own headers (its headers column and header columns) must not repeat one
/// outboxd writes, nor one another's `ce_` names. A row's other `ce_` headers pass as
/// extension attributes when their names are valid ones; its `content-type` passes
/// when outboxd writes none (a bytea payload: the row names its media type).
fn check_cloudevent(
    parts: &EventParts,
    row_headers: &[(HeaderName, Bytes)],
    writes_content_type: bool,
) -> Result<(), RowError> {
    let invalid = |what: String| RowError::new(RowErrorKind::InvalidCloudEvent, what);
    for (value, attribute, header, role) in [
        (&parts.id, "id", header::CE_ID, "id"),
        (&parts.event_type, "type", header::CE_TYPE, "event type"),
    ] {
        if value.is_empty() {
            return Err(invalid(format!(
                "the {role} is empty, and with OUTBOXD_HEADER_FORMAT=cloudevents it is the \
                 {header} header: CloudEvents' {attribute} MUST be a non-empty string. Fix: \
                 insert a non-empty {role}"
            )));
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for (name, _) in row_headers {
        let name: &str = name;
        let binding = CLOUDEVENTS_HEADERS.contains(&name)
            || (name == header::CONTENT_TYPE && writes_content_type);
        if binding {
            return Err(invalid(format!(
                "the row's headers set {name:?}, which outboxd writes itself with \
                 OUTBOXD_HEADER_FORMAT=cloudevents; two {name} headers would make the \
                 CloudEvent ambiguous. Fix: remove {name:?} from the row's headers (the \
                 event's id, type and time come from its columns, the content-type from the \
                 payload column's type, the source from OUTBOXD_CLOUDEVENTS_SOURCE)"
            )));
        }
        if let Some(attribute) = name.strip_prefix("ce_") {
            if attribute == "datacontenttype" {
                return Err(invalid(format!(
                    "the row's headers set {name:?}; the Kafka binding carries \
                     datacontenttype in the content-type header. Fix: name the header \
                     content-type"
                )));
            }
            let valid_name = !attribute.is_empty()
                && attribute
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !valid_name {
                return Err(invalid(format!(
                    "the row's header {name:?} is not a CloudEvents attribute: after ce_, \
                     attribute names are lower-case ASCII letters and digits. Fix: rename \
                     it, or drop the ce_ prefix for a plain Kafka header"
                )));
            }
        } else if name != header::CONTENT_TYPE {
            continue;
        }
        if seen.contains(&name) {
            return Err(invalid(format!(
                "the row's headers set {name:?} twice (its headers column and a header \
                 column?). Fix: keep one"
            )));
        }
        seen.push(name);
    }
    Ok(())
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

    /// librdkafka's rule spelled out: 36 bytes of framing, key, value, and per header a
    /// zig-zag varint of the name length (2n as 7-bit groups), the name, the same for the
    /// value length, the value.
    #[test]
    fn wire_size_follows_librdkafkas_formula() {
        let r = record();
        // Headers "ab"/"c" twice: 1 + 2 + 1 + 1 each.
        assert_eq!(r.wire_size(), 36 + 3 + 5 + 2 * (1 + 2 + 1 + 1));
        assert_eq!(record_wire_size(0, 0, []), RECORD_MAX_OVERHEAD);
        // A length's varint grows when 2n needs another 7 bits: 63 -> 1 byte, 64 -> 2.
        assert_eq!(header_wire_size(63, 0), 1 + 63 + 1);
        assert_eq!(header_wire_size(64, 0), 2 + 64 + 1);
        assert_eq!(header_wire_size(0, 8191), 1 + 2 + 8191);
        assert_eq!(header_wire_size(0, 8192), 1 + 3 + 8192);
        assert_eq!(header_wire_size(0, (1 << 20) - 1), 1 + 3 + (1 << 20) - 1);
        assert_eq!(header_wire_size(0, 1 << 20), 1 + 4 + (1 << 20));
        // Key and value lengths are inside the fixed framing, however long.
        assert_eq!(record_wire_size(100_000, 1, []), 36 + 100_001);
        assert_eq!(record_wire_size(usize::MAX, 1, [(1, 1)]), usize::MAX);
    }

    #[test]
    fn size_check_message() {
        let r = record();
        let size = r.wire_size();
        assert!(
            check_size(&r, size).is_ok(),
            "a record of exactly the limit fits"
        );
        let e = check_size(&r, size - 1).unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::Oversize);
        assert_eq!(e.event_id(), Some("e"));
        let msg = e.to_string();
        for needle in [
            &format!("{size} bytes"),
            &format!("{}-byte", size - 1),
            "OUTBOXD_MAX_MESSAGE_BYTES",
            "message.max.bytes",
        ] {
            assert!(msg.contains(needle), "{needle}: {msg}");
        }
    }

    #[test]
    fn rfc3339() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00.000000Z");
        // date -u -d @1796118115: 2026-12-01 09:41:55 UTC
        assert_eq!(
            rfc3339_utc(1_796_118_115_123_456),
            "2026-12-01T09:41:55.123456Z"
        );
        assert_eq!(
            rfc3339_utc(951_782_400_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
        assert_eq!(rfc3339_utc(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(rfc3339_utc_seconds(1_796_118_115), "2026-12-01T09:41:55Z");
        assert_eq!(rfc3339_utc_seconds(5_097_600), "1970-03-01T00:00:00Z");
        // PostgreSQL's epoch, the commit time of a zeroed timestamp.
        assert_eq!(
            rfc3339_utc(946_684_800_000_000),
            "2000-01-01T00:00:00.000000Z"
        );
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
