//! Outbox events sent as logical decoding messages instead of table rows.
//!
//! ```sql
//! SELECT pg_logical_emit_message(true, 'outbox', '{"id": "4f1c…", "aggregate_type": "Order",
//!   "aggregate_id": "42", "event_type": "OrderCreated", "payload": {"total": 10},
//!   "headers": {"traceparent": "00-…"}}');
//! ```
//!
//! No table, no bloat, no cleanup; needs the `messages` replication option (PG14+).
//! The envelope is a JSON object:
//!
//! | field | type | becomes |
//! |---|---|---|
//! | `id` | string or number | the `id` header (the event id) |
//! | `aggregate_type` | string | the `aggregate_type` header, topic placeholder |
//! | `aggregate_id` | string or number, non-empty | the Kafka key |
//! | `event_type` | string | the `event_type` header |
//! | `payload` | any JSON, required | the Kafka value |
//! | `headers` | object, optional | extra headers, as for the table's headers column |
//!
//! The value is the *exact* text of `payload` as written in the message, not re-encoded,
//! except when `payload` is a JSON string: then the value is the decoded string (so a
//! producer can send non-JSON text, e.g. base64 or XML, without it arriving quoted).
//! `"payload": null` gives a record with a null value (a tombstone). Unknown fields are
//! ignored, except that header columns (`OUTBOXD_HEADER_COLUMNS`) and topic template
//! column placeholders are read from the envelope's top-level fields of the same name
//! (a string as its text, another value as its JSON text, null or absent: no value).
//! The record is the same as for a table row, headers included.
//!
//! Both transactional (`pg_logical_emit_message(true, …)`) and non-transactional messages
//! are relayed. A non-transactional message is decoded as soon as it is written, **even if
//! the transaction that emitted it later rolls back**: that is PostgreSQL's semantics, so
//! use `true` for outbox events.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::Message;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{ConfigError, RowError, RowErrorKind};
use crate::json::{self, HeadersProblem, JsonType};
use crate::record::{assemble, CommitContext, EventParts, HeaderFormat, HeaderName, OutboxRecord};
use crate::topic::{EventFields, TopicTemplate};

/// The envelope with every value borrowed raw from the message content.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    aggregate_type: &'a RawValue,
    #[serde(borrow)]
    aggregate_id: &'a RawValue,
    #[serde(borrow)]
    event_type: &'a RawValue,
    #[serde(borrow)]
    payload: &'a RawValue,
    #[serde(borrow, default)]
    headers: Option<&'a RawValue>,
}

/// Maps emitted messages with one prefix to records.
#[derive(Debug, Clone)]
pub struct EmitMapper {
    prefix: String,
    topic: Arc<TopicTemplate>,
    header_columns: Vec<String>,
    header_format: HeaderFormat,
}

impl EmitMapper {
    /// `prefix` is the second argument of `pg_logical_emit_message`; messages with other
    /// prefixes are ignored. Share `topic` with the [`crate::TableSpec`] to share its cache.
    pub fn new(prefix: impl Into<String>, topic: Arc<TopicTemplate>) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        if prefix.is_empty() {
            return Err(ConfigError::EmitPrefix(
                "the prefix is empty; set the prefix passed to pg_logical_emit_message".into(),
            ));
        }
        Ok(EmitMapper {
            prefix,
            topic,
            header_columns: Vec::new(),
            header_format: HeaderFormat::default(),
        })
    }

    /// The same header columns and format as the table's ([`crate::TableSpec`]): an
    /// envelope's top-level fields play the columns' part.
    pub fn with_headers(mut self, header_columns: Vec<String>, format: HeaderFormat) -> Self {
        self.header_columns = header_columns;
        self.header_format = format;
        self
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The record for `message`, `Ok(None)` if its prefix is not ours. For a
    /// non-transactional message pass [`CommitContext::non_transactional`].
    pub fn map_message(
        &self,
        message: &Message,
        ctx: &CommitContext,
    ) -> Result<Option<OutboxRecord>, RowError> {
        if message.prefix != self.prefix {
            return Ok(None);
        }
        let src = &message.content;
        let env: Envelope<'_> = serde_json::from_slice(src).map_err(|e| {
            RowError::new(
                RowErrorKind::InvalidEnvelope,
                format!(
                    "the message with prefix {:?} at {} is not a valid outbox envelope ({e}). \
                     Send a JSON object with string fields id, aggregate_type, aggregate_id, \
                     event_type, a payload, and optionally a headers object",
                    self.prefix, message.lsn
                ),
            )
        })?;
        let id = field(src, env.id, "id", true, None)?;
        let id_str = utf8(&id)?;
        let eid = Some(id_str);
        let aggregate_id = field(src, env.aggregate_id, "aggregate_id", true, eid)?;
        if aggregate_id.is_empty() {
            return Err(RowError::new(
                RowErrorKind::EmptyAggregateId,
                "the envelope's aggregate_id is empty; it is the Kafka key that keeps an \
                 aggregate's events in order: send the aggregate's id",
            )
            .with_event_id(eid));
        }
        let aggregate_type = field(src, env.aggregate_type, "aggregate_type", false, eid)?;
        let event_type = field(src, env.event_type, "event_type", false, eid)?;
        let value = match JsonType::of(env.payload) {
            JsonType::Null => None,
            _ => Some(json::value_bytes(src, env.payload).map_err(|e| {
                envelope_error(format!("its payload string cannot be decoded ({e})"), eid)
            })?),
        };
        let mut headers = match env.headers.filter(|h| JsonType::of(h) != JsonType::Null) {
            None => Vec::new(),
            Some(raw) => {
                json::headers_object(&src.slice_ref(raw.get().as_bytes())).map_err(|p| {
                    let kind = match p {
                        HeadersProblem::NotObject(_) => RowErrorKind::HeadersNotObject,
                        HeadersProblem::Invalid(_) => RowErrorKind::InvalidEnvelope,
                    };
                    RowError::new(
                        kind,
                        format!(
                            "the envelope's headers cannot be used as Kafka headers: {p}. \
                             Send an object of header names to values, or leave it out"
                        ),
                    )
                    .with_event_id(eid)
                })?
            }
        };
        let topic_columns = self.topic.columns();
        let extra = if self.header_columns.is_empty() && topic_columns.is_empty() {
            HashMap::new()
        } else {
            // A second pass only when columns are configured: the envelope struct above
            // ignores unknown fields, and a flattened map cannot borrow raw values.
            serde_json::from_slice::<HashMap<String, &RawValue>>(src)
                .map_err(|e| envelope_error(format!("{e}"), eid))?
        };
        let extra_text = |name: &str| -> Result<Option<Bytes>, RowError> {
            match extra.get(name) {
                None => Ok(None),
                Some(raw) => match JsonType::of(raw) {
                    JsonType::Null => Ok(None),
                    JsonType::String => json::value_bytes(src, raw).map(Some).map_err(|e| {
                        envelope_error(format!("its {name} cannot be decoded ({e})"), eid)
                    }),
                    _ => Ok(Some(src.slice_ref(raw.get().as_bytes()))),
                },
            }
        };
        for name in &self.header_columns {
            if let Some(text) = extra_text(name)? {
                headers.push((HeaderName::Owned(name.clone()), text));
            }
        }
        let mut column_bytes = Vec::with_capacity(topic_columns.len());
        for name in &topic_columns {
            column_bytes.push((*name, extra_text(name)?));
        }
        let mut columns = Vec::with_capacity(column_bytes.len());
        for (name, bytes) in &column_bytes {
            let text = match bytes {
                Some(b) => Some(utf8(b)?),
                None => None,
            };
            columns.push((*name, text));
        }
        let content_type = match JsonType::of(env.payload) {
            // A JSON string payload is sent decoded: its media type is unknown.
            JsonType::String | JsonType::Null => None,
            _ => Some("application/json"),
        };
        let fields = EventFields {
            id: id_str,
            aggregate_type: utf8(&aggregate_type)?,
            aggregate_id: utf8(&aggregate_id)?,
            event_type: utf8(&event_type)?,
            columns: &columns,
        };
        let topic = self.topic.render(&fields)?;
        let event_id = id_str.to_owned();
        let parts = EventParts {
            id,
            aggregate_type,
            aggregate_id,
            event_type,
            event_id,
            content_type,
        };
        assemble(topic, parts, value, headers, ctx, &self.header_format).map(Some)
    }
}

/// A text field of the envelope: a string (decoded), or a number's text if allowed.
fn field(
    src: &Bytes,
    raw: &RawValue,
    name: &str,
    number_ok: bool,
    eid: Option<&str>,
) -> Result<Bytes, RowError> {
    match JsonType::of(raw) {
        JsonType::String => json::value_bytes(src, raw)
            .map_err(|e| envelope_error(format!("its {name} cannot be decoded ({e})"), eid)),
        JsonType::Number if number_ok => Ok(src.slice_ref(raw.get().as_bytes())),
        JsonType::Null if name == "aggregate_id" => Err(RowError::new(
            RowErrorKind::NullAggregateId,
            "the envelope's aggregate_id is null; it is the Kafka key that keeps an \
             aggregate's events in order: send the aggregate's id",
        )
        .with_event_id(eid)),
        JsonType::Null => Err(RowError::new(
            RowErrorKind::NullColumn,
            format!("the envelope's {name} is null; send a string"),
        )
        .with_event_id(eid)),
        other => Err(envelope_error(
            format!(
                "its {name} is {}, expected a string{}",
                other.as_str(),
                if number_ok { " or a number" } else { "" }
            ),
            eid,
        )),
    }
}

fn envelope_error(what: String, eid: Option<&str>) -> RowError {
    RowError::new(
        RowErrorKind::InvalidEnvelope,
        format!("invalid outbox envelope: {what}"),
    )
    .with_event_id(eid)
}

/// Decoded JSON text is always UTF-8; the check only avoids an unchecked conversion.
fn utf8(b: &Bytes) -> Result<&str, RowError> {
    std::str::from_utf8(b).map_err(|e| {
        RowError::new(
            RowErrorKind::UnreadableValue,
            format!("envelope text is not UTF-8 ({e})"),
        )
    })
}

#[cfg(test)]
#[path = "emit_tests.rs"]
mod tests;
