//! Tests of the emitted-message envelope and its dead-letter record.

use super::*;
use crate::dlq::dead_letter_message;
use crate::record::header;
use crate::topic::TopicName;
use pgoutput::{Lsn, PgTimestamp};

fn mapper() -> EmitMapper {
    EmitMapper::new("outbox", Arc::new(TopicTemplate::default())).unwrap()
}

fn msg(prefix: &str, content: &str) -> Message {
    Message {
        xid: None,
        flags: 1,
        lsn: Lsn(0x10),
        prefix: prefix.to_owned(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }
}

fn ctx() -> CommitContext {
    CommitContext::new(Lsn(0x20), PgTimestamp(0))
}

fn map(content: &str) -> Result<Option<OutboxRecord>, RowError> {
    mapper().map_message(&msg("outbox", content), &ctx())
}

fn ok(content: &str) -> OutboxRecord {
    map(content).unwrap().unwrap()
}

fn err(content: &str) -> RowError {
    map(content).unwrap_err()
}

#[test]
fn envelope_maps_like_a_row() {
    let content = r#"{"id":"e-1","aggregate_type":"Order","aggregate_id":"42","event_type":"Created",
        "payload":  {"b": 1,   "a": [true]} ,"headers":{"trace":"t-1","n":3}}"#;
    let m = msg("outbox", content);
    let r = mapper().map_message(&m, &ctx()).unwrap().unwrap();
    assert_eq!(&*r.topic, "outbox.Order");
    assert_eq!(r.key.as_deref(), Some(&b"42"[..]));
    // The exact payload text, whitespace and key order included, sliced not copied.
    let value = r.value.clone().unwrap();
    assert_eq!(&value[..], br#"{"b": 1,   "a": [true]}"#);
    let offset = content.find("{\"b\"").unwrap();
    assert_eq!(value.as_ptr(), m.content[offset..].as_ptr());
    assert_eq!(r.event_id, "e-1");
    assert_eq!(r.timestamp_millis, 946_684_800_000);
    let names: Vec<&str> = r.headers.iter().map(|(k, _)| &**k).collect();
    assert_eq!(
        names,
        [
            "trace",
            "n",
            "id",
            "event_type",
            "aggregate_type",
            "outboxd.commit_lsn",
            "outboxd.commit_time"
        ]
    );
    assert_eq!(r.header("n").map(|v| &v[..]), Some(&b"3"[..]));
    assert_eq!(
        r.header(header::COMMIT_LSN).map(|v| &v[..]),
        Some(&b"0/20"[..])
    );
    assert_eq!(
        r.header("event_type").map(|v| &v[..]),
        Some(&b"Created"[..])
    );
}

#[test]
fn other_prefixes_are_ignored() {
    assert_eq!(
        mapper().map_message(&msg("other", "not even json"), &ctx()),
        Ok(None)
    );
    assert_eq!(mapper().prefix(), "outbox");
    assert!(EmitMapper::new("", Arc::new(TopicTemplate::default())).is_err());
}

#[test]
fn string_payload_is_decoded_and_numbers_are_ids() {
    let r = ok(
        r#"{"id":17,"aggregate_type":"A","aggregate_id":-5,"event_type":"E","payload":"line\nbreak é"}"#,
    );
    assert_eq!(r.value.as_deref(), Some("line\nbreak é".as_bytes()));
    assert_eq!(r.event_id, "17");
    assert_eq!(r.key.as_deref(), Some(&b"-5"[..]));
    let r = ok(
        r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":"plain"}"#,
    );
    assert_eq!(r.value.as_deref(), Some(&b"plain"[..]));
    let r = ok(
        r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":[1, 2]}"#,
    );
    assert_eq!(r.value.as_deref(), Some(&b"[1, 2]"[..]));
    let r = ok(
        r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":12.50}"#,
    );
    assert_eq!(r.value.as_deref(), Some(&b"12.50"[..]));
}

#[test]
fn null_payload_is_a_tombstone_and_null_headers_are_none() {
    let r = ok(
        r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":null,"headers":null,"extra":1}"#,
    );
    assert_eq!(r.value, None);
    assert_eq!(r.headers.len(), 5);
}

#[test]
fn non_transactional_messages_are_relayed() {
    let mut m = msg(
        "outbox",
        r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":{}}"#,
    );
    m.flags = 0;
    let c = CommitContext::non_transactional(&m, PgTimestamp(1000));
    let r = mapper().map_message(&m, &c).unwrap().unwrap();
    assert_eq!(
        r.header(header::COMMIT_LSN).map(|v| &v[..]),
        Some(&b"0/10"[..])
    );
}

#[test]
fn envelope_errors() {
    let cases: &[(&str, RowErrorKind, &str)] = &[
        (
            "not json",
            RowErrorKind::InvalidEnvelope,
            "not a valid outbox envelope",
        ),
        (
            "[1]",
            RowErrorKind::InvalidEnvelope,
            "not a valid outbox envelope",
        ),
        (
            r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E"}"#,
            RowErrorKind::InvalidEnvelope,
            "missing field `payload`",
        ),
        (
            r#"{"id":"x","aggregate_type":"A","aggregate_id":null,"event_type":"E","payload":1}"#,
            RowErrorKind::NullAggregateId,
            "aggregate_id is null",
        ),
        (
            r#"{"id":"x","aggregate_type":"A","aggregate_id":"","event_type":"E","payload":1}"#,
            RowErrorKind::EmptyAggregateId,
            "empty",
        ),
        (
            r#"{"id":"x","aggregate_type":1,"aggregate_id":"k","event_type":"E","payload":1}"#,
            RowErrorKind::InvalidEnvelope,
            "aggregate_type is a number, expected a string",
        ),
        (
            r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":null,"payload":1}"#,
            RowErrorKind::NullColumn,
            "event_type is null",
        ),
        (
            r#"{"id":{"a":1},"aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":1}"#,
            RowErrorKind::InvalidEnvelope,
            "id is an object, expected a string or a number",
        ),
        (
            r#"{"id":"x","aggregate_type":"A","aggregate_id":"k","event_type":"E","payload":1,"headers":"h"}"#,
            RowErrorKind::HeadersNotObject,
            "a string, not a JSON object",
        ),
        (
            r#"{"id":"x","aggregate_type":"A B","aggregate_id":"k","event_type":"E","payload":1}"#,
            RowErrorKind::InvalidTopic,
            "outbox.A B",
        ),
    ];
    for (content, kind, needle) in cases {
        let e = err(content);
        assert_eq!(e.kind(), *kind, "{content}: {e}");
        assert!(e.to_string().contains(needle), "{content}: {e}");
    }
    // The id is attached once readable.
    let e =
        err(r#"{"id":"x","aggregate_type":"A","aggregate_id":"","event_type":"E","payload":1}"#);
    assert_eq!(e.event_id(), Some("x"));
    // Non-UTF-8 content.
    let mut m = msg("outbox", "");
    m.content = Bytes::from_static(b"\xff\xfe");
    let e = mapper().map_message(&m, &ctx()).unwrap_err();
    assert_eq!(e.kind(), RowErrorKind::InvalidEnvelope);
}

#[test]
fn dead_letter_message_record() {
    let topic = TopicName::parse("dlq").unwrap();
    let content =
        r#"{"id":"x","aggregate_type":"A B","aggregate_id":"k","event_type":"E","payload":1}"#;
    let m = msg("outbox", content);
    let e = mapper().map_message(&m, &ctx()).unwrap_err();
    let d = dead_letter_message(&m, &e, &ctx(), &topic, 10_000);
    assert_eq!(&*d.topic, "dlq");
    assert_eq!(d.key, None);
    assert_eq!(d.value.as_deref(), Some(content.as_bytes()));
    assert_eq!(d.event_id, "x");
    assert_eq!(d.header(header::ID).map(|v| &v[..]), Some(&b"x"[..]));
    assert_eq!(
        d.header(header::SOURCE_PREFIX).map(|v| &v[..]),
        Some(&b"outbox"[..])
    );
    assert_eq!(
        d.header(header::ERROR_KIND).map(|v| &v[..]),
        Some(&b"invalid_topic"[..])
    );
    // Too large: no value, and it says so.
    let d = dead_letter_message(&m, &e, &ctx(), &topic, 50);
    assert_eq!(d.value, None);
    assert_eq!(
        d.header(header::OMITTED_COLUMNS).map(|v| &v[..]),
        Some(&b"content"[..])
    );
}

#[test]
fn envelope_fields_as_header_columns_topic_columns_and_cloudevents() {
    let m = EmitMapper::new(
        "outbox",
        Arc::new(TopicTemplate::parse("{tenant}.{aggregate_type}").unwrap()),
    )
    .unwrap()
    .with_headers(
        vec!["idempotency_key".into(), "version".into(), "absent".into()],
        HeaderFormat::CloudEvents {
            source: Bytes::from_static(b"/shop"),
        },
    );
    let content = r#"{"id":"e-1","aggregate_type":"Order","aggregate_id":"42","event_type":"Paid",
        "payload":{"a":1},"idempotency_key":"pay:7","version":3,"tenant":"acme"}"#;
    let r = m
        .map_message(&msg("outbox", content), &ctx())
        .unwrap()
        .unwrap();
    assert_eq!(&*r.topic, "acme.Order");
    assert_eq!(
        r.header("idempotency_key").map(|v| &v[..]),
        Some(&b"pay:7"[..])
    );
    assert_eq!(r.header("version").map(|v| &v[..]), Some(&b"3"[..]));
    assert_eq!(r.header("absent"), None);
    assert_eq!(r.header("ce_id").map(|v| &v[..]), Some(&b"e-1"[..]));
    assert_eq!(r.header("ce_type").map(|v| &v[..]), Some(&b"Paid"[..]));
    assert_eq!(
        r.header("ce_time").map(|v| &v[..]),
        Some(&b"2000-01-01T00:00:00.000000Z"[..])
    );
    assert_eq!(
        r.header("content-type").map(|v| &v[..]),
        Some(&b"application/json"[..])
    );
    // Without the topic column the event cannot be routed: a bad row.
    let content = r#"{"id":"e-2","aggregate_type":"Order","aggregate_id":"42","event_type":"Paid",
        "payload":"text"}"#;
    let e = m.map_message(&msg("outbox", content), &ctx()).unwrap_err();
    assert_eq!(e.kind(), RowErrorKind::InvalidTopic);
    // An empty id is no CloudEvent id; an envelope header repeating ce_type is refused.
    for (content, needle) in [
        (
            r#"{"id":"","aggregate_type":"Order","aggregate_id":"42","event_type":"Paid",
            "payload":{},"tenant":"acme"}"#,
            "the id is empty",
        ),
        (
            r#"{"id":"e-3","aggregate_type":"Order","aggregate_id":"42","event_type":"Paid",
            "payload":{},"tenant":"acme","headers":{"ce_type":"Other"}}"#,
            "\"ce_type\", which outboxd writes itself",
        ),
    ] {
        let e = m.map_message(&msg("outbox", content), &ctx()).unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::InvalidCloudEvent, "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
}
