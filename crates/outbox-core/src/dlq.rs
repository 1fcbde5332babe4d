//! Dead-letter records for rows and emitted messages that cannot be relayed.
//!
//! A row record's value is the raw row as a JSON object `{column: text or null}` in
//! column order (binary values without a text form as `\x` hex). An emitted message's
//! record carries the message content.
//!
//! Headers: `id` (when readable), `outboxd.error`, `outboxd.error_kind`,
//! `outboxd.source_table` or `outboxd.source_prefix`, `outboxd.commit_lsn`,
//! `outboxd.commit_time`. The key is the aggregate id when readable.
//!
//! A dead-letter record must always fit `max_bytes` (measured as librdkafka does,
//! [`crate::record_wire_size`]): if it did not, the row could go nowhere and the relay
//! could only stop. So, while it does not fit, the largest of these is shrunk:
//!
//! - a column of the row, replaced by `null` (the payload first on ties) and listed in
//!   `outboxd.omitted_columns`; a message's content is left out the same way (`content`);
//! - the key (an oversize aggregate id), dropped, the `id` header or the error text, cut
//!   short, each listed in `outboxd.truncated` (`key`, `id`, `error`).
//!
//! If that is not enough, the value is dropped (`value`), then every header value is
//! cut short (`headers`). Cut texts end with `…`. The result is at most about 750
//! bytes, below librdkafka's smallest `message.max.bytes` (1000), so dead-lettering
//! cannot fail on size.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pgoutput::{Message, TupleData};

use crate::error::RowError;
use crate::json::push_json_string;
use crate::mapping::BoundTable;
use crate::record::{header, record_wire_size, CommitContext, HeaderName, OutboxRecord};
use crate::topic::TopicName;
use crate::value;

/// Longest `outboxd.error` header, in bytes; longer texts are cut at a character boundary.
const MAX_ERROR_TEXT: usize = 4096;
/// The error text once it has to be cut to make the record fit.
const SHORT_ERROR_TEXT: usize = 256;
/// Header values (the id first) once they have to be cut to make the record fit.
const SHORT_HEADER_VALUE: usize = 64;
/// What ends a cut text.
const ELLIPSIS: &str = "…";

/// The dead-letter record for a row of `table` that failed with `error`.
pub fn dead_letter_record(
    table: &BoundTable,
    tuple: &TupleData,
    error: &RowError,
    ctx: &CommitContext,
    topic: &TopicName,
    max_bytes: usize,
) -> OutboxRecord {
    let texts: Vec<(&str, Option<String>)> = table
        .columns()
        .enumerate()
        .map(|(i, (name, oid))| {
            let text = tuple
                .columns
                .get(i)
                .and_then(|v| value::display_text(v, oid));
            (name, text)
        })
        .collect();
    let readable = |i: usize| -> Option<String> {
        texts
            .get(i)
            .and_then(|(_, t)| t.clone())
            .filter(|t| !t.is_empty())
    };
    let key = readable(table.aggregate_id_index()).map(Bytes::from);
    let id = error
        .event_id()
        .map(str::to_owned)
        .or_else(|| readable(table.id_index()));

    let mut headers = base_headers(error, ctx, id.as_deref());
    headers.push((
        Cow::Borrowed(header::SOURCE_TABLE),
        Bytes::from(table.table_name().to_owned()),
    ));
    // A row read through for its size has only its leading columns: the rest are
    // listed as left out, not shown as null.
    let omitted = texts
        .iter()
        .skip(tuple.columns.len())
        .map(|(name, _)| *name)
        .collect();
    let columns = texts
        .into_iter()
        .map(|(name, t)| (name, t.map(|t| json_string(&t))))
        .collect();
    let draft = Draft {
        key,
        headers,
        value: Value::Row {
            columns,
            payload: table.payload_index(),
        },
        omitted,
        cut: Vec::new(),
        short_omitted: false,
    };
    draft
        .fit(max_bytes)
        .into_record(topic, ctx, id.unwrap_or_default())
}

/// The dead-letter record for an emitted message that failed with `error`.
pub fn dead_letter_message(
    message: &Message,
    error: &RowError,
    ctx: &CommitContext,
    topic: &TopicName,
    max_bytes: usize,
) -> OutboxRecord {
    message_dead_letter(
        message,
        Some(&message.content),
        error,
        ctx,
        topic,
        max_bytes,
    )
}

/// The same for a message read through for its size, whose content was not kept: it is
/// listed as left out (`content`).
pub fn dead_letter_message_head(
    message: &Message,
    error: &RowError,
    ctx: &CommitContext,
    topic: &TopicName,
    max_bytes: usize,
) -> OutboxRecord {
    message_dead_letter(message, None, error, ctx, topic, max_bytes)
}

fn message_dead_letter(
    message: &Message,
    content: Option<&Bytes>,
    error: &RowError,
    ctx: &CommitContext,
    topic: &TopicName,
    max_bytes: usize,
) -> OutboxRecord {
    let mut headers = base_headers(error, ctx, error.event_id());
    headers.push((
        Cow::Borrowed(header::SOURCE_PREFIX),
        Bytes::from(message.prefix.clone()),
    ));
    let draft = Draft {
        key: None,
        headers,
        value: Value::Content(content.cloned()),
        omitted: if content.is_none() {
            vec!["content"]
        } else {
            Vec::new()
        },
        cut: Vec::new(),
        short_omitted: false,
    };
    let id = error.event_id().unwrap_or_default().to_owned();
    draft.fit(max_bytes).into_record(topic, ctx, id)
}

/// A dead-letter record being shrunk to fit.
struct Draft<'a> {
    key: Option<Bytes>,
    /// Without the omitted-columns and truncated headers, which are added at the end.
    headers: Vec<(HeaderName, Bytes)>,
    value: Value<'a>,
    /// Columns (or `content`) left out.
    omitted: Vec<&'a str>,
    /// Fields cut short or dropped.
    cut: Vec<&'static str>,
    /// The omitted-columns list itself is cut short (many long column names).
    short_omitted: bool,
}

enum Value<'a> {
    /// The row as JSON: column names and their JSON-encoded values (`None`: null).
    Row {
        columns: Vec<(&'a str, Option<String>)>,
        payload: usize,
    },
    /// An emitted message's content.
    Content(Option<Bytes>),
    /// Dropped as a last resort.
    Dropped,
}

/// One thing [`Draft::fit`] can shrink.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Shrink {
    Column(usize),
    Content,
    Key,
    Id,
    Error,
}

impl Draft<'_> {
    fn fit(mut self, max_bytes: usize) -> Self {
        while self.wire_size() > max_bytes {
            let Some(step) = self.largest_shrinkable() else {
                break;
            };
            self.shrink(step);
        }
        if self.wire_size() > max_bytes && !matches!(self.value, Value::Dropped) {
            self.value = Value::Dropped;
            self.cut.push("value");
        }
        if self.wire_size() > max_bytes {
            let mut any = false;
            for (_, v) in &mut self.headers {
                if let Some(short) = shorten(v, SHORT_HEADER_VALUE) {
                    *v = short;
                    any = true;
                }
            }
            if let Some(list) = self.omitted_list() {
                any |= shorten(&list, SHORT_HEADER_VALUE).is_some();
                self.short_omitted = true;
            }
            if any {
                self.cut.push("headers");
            }
        }
        self
    }
    /// The biggest thing left to shrink, by its current size; the payload first on ties
    /// among columns. Ids and error texts already short are left alone.
    fn largest_shrinkable(&self) -> Option<Shrink> {
        let mut best: Option<(usize, bool, Shrink)> = None;
        let mut consider = |size: usize, favoured: bool, step: Shrink| {
            if best.is_none_or(|(s, f, _)| (size, favoured) > (s, f)) {
                best = Some((size, favoured, step));
            }
        };
        match &self.value {
            Value::Row { columns, payload } => {
                for (i, (_, v)) in columns.iter().enumerate() {
                    if let Some(v) = v {
                        consider(v.len(), i == *payload, Shrink::Column(i));
                    }
                }
            }
            Value::Content(Some(c)) => consider(c.len(), false, Shrink::Content),
            Value::Content(None) | Value::Dropped => {}
        }
        if let Some(k) = &self.key {
            consider(k.len(), false, Shrink::Key);
        }
        for (name, limit, step) in [
            (header::ID, SHORT_HEADER_VALUE, Shrink::Id),
            (header::ERROR, SHORT_ERROR_TEXT, Shrink::Error),
        ] {
            if let Some(v) = self.header(name).filter(|v| shorten(v, limit).is_some()) {
                consider(v.len(), false, step);
            }
        }
        best.map(|(_, _, step)| step)
    }

    fn shrink(&mut self, step: Shrink) {
        match step {
            Shrink::Column(i) => {
                if let Value::Row { columns, .. } = &mut self.value {
                    if let Some((name, v)) = columns.get_mut(i) {
                        *v = None;
                        self.omitted.push(name);
                    }
                }
            }
            Shrink::Content => {
                self.value = Value::Content(None);
                self.omitted.push("content");
            }
            Shrink::Key => {
                self.key = None;
                self.cut.push("key");
            }
            Shrink::Id => self.shorten_header(header::ID, SHORT_HEADER_VALUE, "id"),
            Shrink::Error => self.shorten_header(header::ERROR, SHORT_ERROR_TEXT, "error"),
        }
    }

    fn shorten_header(&mut self, name: &str, max: usize, label: &'static str) {
        for (k, v) in &mut self.headers {
            if k == name {
                if let Some(short) = shorten(v, max) {
                    *v = short;
                }
            }
        }
        self.cut.push(label);
    }

    fn header(&self, name: &str) -> Option<&Bytes> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    fn omitted_list(&self) -> Option<Bytes> {
        if self.omitted.is_empty() {
            return None;
        }
        let list = Bytes::from(self.omitted.join(","));
        if self.short_omitted {
            return Some(shorten(&list, SHORT_HEADER_VALUE).unwrap_or(list));
        }
        Some(list)
    }

    /// The extra headers the record ends with: omitted columns, then what was cut.
    fn trailing_headers(&self) -> Vec<(HeaderName, Bytes)> {
        let mut out = Vec::with_capacity(2);
        if let Some(list) = self.omitted_list() {
            out.push((Cow::Borrowed(header::OMITTED_COLUMNS), list));
        }
        if !self.cut.is_empty() {
            out.push((
                Cow::Borrowed(header::TRUNCATED),
                Bytes::from(self.cut.join(",")),
            ));
        }
        out
    }

    fn value_len(&self) -> usize {
        match &self.value {
            Value::Row { columns, .. } => row_json_len(columns),
            Value::Content(c) => c.as_ref().map_or(0, Bytes::len),
            Value::Dropped => 0,
        }
    }

    /// Exactly what librdkafka will count for the finished record.
    fn wire_size(&self) -> usize {
        let trailing = self.trailing_headers();
        record_wire_size(
            self.key.as_ref().map_or(0, Bytes::len),
            self.value_len(),
            self.headers
                .iter()
                .chain(trailing.iter())
                .map(|(k, v)| (k.len(), v.len())),
        )
    }

    fn into_record(self, topic: &TopicName, ctx: &CommitContext, event_id: String) -> OutboxRecord {
        let mut headers = self.headers.clone();
        headers.extend(self.trailing_headers());
        let value = match self.value {
            Value::Row { columns, .. } => Some(Bytes::from(row_json(&columns))),
            Value::Content(c) => c,
            Value::Dropped => None,
        };
        OutboxRecord {
            topic: Arc::clone(topic.as_arc()),
            key: self.key,
            value,
            headers,
            timestamp_millis: ctx.commit_time.unix_millis(),
            event_id,
        }
    }
}

/// `value` cut to at most `max` bytes plus an ellipsis, not splitting a UTF-8 character;
/// `None` if it is not longer than that already.
fn shorten(value: &Bytes, max: usize) -> Option<Bytes> {
    if value.len() <= max.saturating_add(ELLIPSIS.len()) {
        return None;
    }
    let head = value.get(..max)?;
    let keep = match std::str::from_utf8(head) {
        Ok(_) => max,
        // A character cut in two at the end: drop its first bytes too.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => max,
    };
    let mut out = BytesMut::with_capacity(keep.saturating_add(ELLIPSIS.len()));
    out.extend_from_slice(value.get(..keep)?);
    out.extend_from_slice(ELLIPSIS.as_bytes());
    Some(out.freeze())
}

fn base_headers(
    error: &RowError,
    ctx: &CommitContext,
    id: Option<&str>,
) -> Vec<(HeaderName, Bytes)> {
    let mut headers = Vec::with_capacity(8);
    if let Some(id) = id {
        headers.push((Cow::Borrowed(header::ID), Bytes::from(id.to_owned())));
    }
    headers.push((
        Cow::Borrowed(header::ERROR),
        Bytes::from(truncate(error.to_string(), MAX_ERROR_TEXT)),
    ));
    headers.push((
        Cow::Borrowed(header::ERROR_KIND),
        Bytes::from_static(error.kind().as_str().as_bytes()),
    ));
    headers.push((
        Cow::Borrowed(header::COMMIT_LSN),
        Bytes::from(ctx.commit_lsn.to_string()),
    ));
    headers.push((
        Cow::Borrowed(header::COMMIT_TIME),
        Bytes::from(ctx.commit_time.unix_millis().to_string()),
    ));
    headers
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_string(&mut out, s);
    out
}

fn row_json(cols: &[(&str, Option<String>)]) -> String {
    let mut out = String::with_capacity(row_json_len(cols));
    out.push('{');
    for (i, (name, value)) in cols.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_string(&mut out, name);
        out.push(':');
        out.push_str(value.as_deref().unwrap_or("null"));
    }
    out.push('}');
    out
}

/// Length of [`row_json`].
fn row_json_len(cols: &[(&str, Option<String>)]) -> usize {
    let commas = cols.len().saturating_sub(1);
    cols.iter()
        .fold(2usize.saturating_add(commas), |n, (name, value)| {
            n.saturating_add(json_string(name).len() + 1)
                .saturating_add(value.as_ref().map_or(4, String::len))
        })
}
