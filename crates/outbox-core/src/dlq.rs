//! Dead-letter records for rows and emitted messages that cannot be relayed.
//!
//! A row record's value is the raw row as a JSON object `{column: text or null}` in
//! column order (binary values without a text form as `\x` hex). If that does not fit
//! `max_bytes`, the largest columns are replaced by `null` until it does, and their names
//! are listed in the `outboxd.omitted_columns` header: an oversize row therefore arrives
//! without its payload, saying so. An emitted message's record carries the message
//! content, or no value (and `outboxd.omitted_columns: content`) if it is too large.
//!
//! Headers: `id` (when readable), `outboxd.error`, `outboxd.error_kind`,
//! `outboxd.source_table` or `outboxd.source_prefix`, `outboxd.commit_lsn`,
//! `outboxd.commit_time`. The key is the aggregate id when readable.

use std::borrow::Cow;

use bytes::Bytes;
use pgoutput::{Message, TupleData};

use crate::error::RowError;
use crate::json::push_json_string;
use crate::mapping::BoundTable;
use crate::record::{header, CommitContext, HeaderName, OutboxRecord};
use crate::topic::TopicName;
use crate::value;

/// Longest `outboxd.error` header, in bytes; longer texts are cut at a character boundary.
const MAX_ERROR_TEXT: usize = 4096;

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
    let fixed = fixed_size(&key, &headers);

    // Null the largest columns (the payload first on ties) until the row fits.
    let mut encoded: Vec<(&str, Option<String>)> = texts
        .into_iter()
        .map(|(name, t)| (name, t.map(|t| json_string(&t))))
        .collect();
    let mut omitted: Vec<&str> = Vec::new();
    let payload = table.payload_index();
    while fixed.saturating_add(row_json_len(&encoded, &omitted)) > max_bytes {
        let largest = encoded
            .iter()
            .enumerate()
            .filter_map(|(i, (_, v))| v.as_ref().map(|v| (v.len(), i == payload, i)))
            .max();
        let Some((_, _, i)) = largest else { break };
        if let Some((name, v)) = encoded.get_mut(i) {
            *v = None;
            omitted.push(name);
        }
    }
    if !omitted.is_empty() {
        headers.push((
            Cow::Borrowed(header::OMITTED_COLUMNS),
            Bytes::from(omitted.join(",")),
        ));
    }
    OutboxRecord {
        topic: topic.as_arc().clone(),
        key,
        value: Some(Bytes::from(row_json(&encoded))),
        headers,
        timestamp_millis: ctx.commit_time.unix_millis(),
        event_id: id.unwrap_or_default(),
    }
}

/// The dead-letter record for an emitted message that failed with `error`.
pub fn dead_letter_message(
    message: &Message,
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
    let fits = fixed_size(&None, &headers).saturating_add(message.content.len()) <= max_bytes;
    let value = if fits {
        Some(message.content.clone())
    } else {
        headers.push((
            Cow::Borrowed(header::OMITTED_COLUMNS),
            Bytes::from_static(b"content"),
        ));
        None
    };
    OutboxRecord {
        topic: topic.as_arc().clone(),
        key: None,
        value,
        headers,
        timestamp_millis: ctx.commit_time.unix_millis(),
        event_id: error.event_id().unwrap_or_default().to_owned(),
    }
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

/// Key and headers, plus room for the omitted-columns header.
fn fixed_size(key: &Option<Bytes>, headers: &[(HeaderName, Bytes)]) -> usize {
    headers
        .iter()
        .fold(key.as_ref().map_or(0, Bytes::len), |n, (k, v)| {
            n.saturating_add(k.len()).saturating_add(v.len())
        })
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
    let mut out = String::with_capacity(row_json_len(cols, &[]));
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

/// Length of [`row_json`] plus the omitted-columns header it would need.
fn row_json_len(cols: &[(&str, Option<String>)], omitted: &[&str]) -> usize {
    let body = cols.iter().fold(2usize, |n, (name, value)| {
        n.saturating_add(name.len() + 4)
            .saturating_add(value.as_ref().map_or(4, String::len))
    });
    let omitted_header = if omitted.is_empty() {
        0
    } else {
        omitted.iter().fold(header::OMITTED_COLUMNS.len(), |n, c| {
            n.saturating_add(c.len() + 1)
        })
    };
    body.saturating_add(omitted_header)
}
