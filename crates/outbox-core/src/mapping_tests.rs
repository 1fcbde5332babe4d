//! Tests of table-row mapping on hand-built Relation/TupleData; dead-letter records and
//! header columns (seed 004) in the two files beside this one.

use super::*;
use crate::dlq::dead_letter_record;
use crate::error::ErrorClass;
use crate::record::{check_size, header};
use crate::topic::TopicName;
use pgoutput::{Column, Lsn, PgTimestamp, ReplicaIdentity};

#[path = "mapping_dlq_tests.rs"]
mod dead_letters;
#[path = "mapping_header_tests.rs"]
mod header_columns;

fn col(name: &str, type_oid: u32) -> Column {
    Column::new(name, type_oid)
}

fn relation(columns: Vec<Column>) -> Relation {
    Relation {
        xid: None,
        rel_id: 16384,
        namespace: "public".to_owned(),
        name: "outbox".to_owned(),
        replica_identity: ReplicaIdentity::Default,
        columns,
    }
}

/// The usual outbox table, payload of the given type, with a jsonb headers column.
fn standard(payload_oid: u32) -> Relation {
    relation(vec![
        col("id", pgtype::UUID),
        col("aggregate_type", pgtype::VARCHAR),
        col("aggregate_id", pgtype::TEXT),
        col("event_type", pgtype::TEXT),
        col("payload", payload_oid),
        col("headers", pgtype::JSONB),
        col("created_at", pgtype::TIMESTAMPTZ),
    ])
}

fn t(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn bin(b: &[u8]) -> TupleValue {
    TupleValue::Binary(Bytes::copy_from_slice(b))
}

const ID: &str = "0b7e6a52-9d4f-4c1e-8f6a-1b2c3d4e5f60";

fn row(payload: TupleValue, headers: TupleValue) -> TupleData {
    TupleData {
        columns: vec![
            t(ID),
            t("Order"),
            t("order-42"),
            t("OrderCreated"),
            payload,
            headers,
            t("2024-01-01 00:00:00+00"),
        ],
    }
}

fn ctx() -> CommitContext {
    // 2024-01-01T00:00:00.123456Z in PostgreSQL microseconds.
    let unix_micros = 1_704_067_200_123_456i64;
    CommitContext::new(
        Lsn(0x1_0000_00AB),
        PgTimestamp(unix_micros - pgoutput::time::PG_EPOCH_OFFSET_MICROS),
    )
}

fn bind(rel: &Relation) -> BoundTable {
    BoundTable::bind(rel, &TableSpec::default()).unwrap()
}

fn headers_of(r: &OutboxRecord) -> Vec<(String, String)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

fn err_of(rel: &Relation, tuple: &TupleData) -> RowError {
    bind(rel).map_insert(tuple, &ctx()).unwrap_err()
}

#[test]
fn jsonb_row_maps_to_record() {
    let payload = Bytes::from_static(br#"{"total": 10, "items": [1, 2]}"#);
    let tuple = row(
        TupleValue::Text(payload.clone()),
        t(r#"{"traceparent": "00-abc-01", "attempt": 2}"#),
    );
    let table = bind(&standard(pgtype::JSONB));
    assert_eq!(table.payload_kind(), PayloadKind::Jsonb);
    assert!(table.has_headers_column());
    assert_eq!(table.rel_id(), 16384);
    assert_eq!(table.table_name(), "public.outbox");
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(&*r.topic, "outbox.Order");
    assert_eq!(r.key.as_deref(), Some(&b"order-42"[..]));
    let value = r.value.clone().unwrap();
    assert_eq!(value, payload);
    assert_eq!(value.as_ptr(), payload.as_ptr(), "payload is not copied");
    assert_eq!(r.timestamp_millis, 1_704_067_200_123);
    assert_eq!(r.event_id, ID);
    assert_eq!(
        headers_of(&r),
        vec![
            ("traceparent".into(), "00-abc-01".into()),
            ("attempt".into(), "2".into()),
            ("id".into(), ID.into()),
            ("event_type".into(), "OrderCreated".into()),
            ("aggregate_type".into(), "Order".into()),
            ("outboxd.commit_lsn".into(), "1/AB".into()),
            ("outboxd.commit_time".into(), "1704067200123".into()),
        ]
    );
    let expected_size = 8
        + value.len()
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    assert_eq!(r.approx_size(), expected_size);
}

#[test]
fn json_and_text_payloads_are_sent_as_stored() {
    for (oid, kind, stored) in [
        (pgtype::JSON, PayloadKind::Json, "{ \"b\":1,   \"a\" : 2 }"),
        (pgtype::TEXT, PayloadKind::Text, "not json at all"),
        (pgtype::VARCHAR, PayloadKind::Text, "<xml/>"),
    ] {
        let table = bind(&standard(oid));
        assert_eq!(table.payload_kind(), kind);
        let r = table
            .map_insert(&row(t(stored), TupleValue::Null), &ctx())
            .unwrap();
        assert_eq!(r.value.as_deref(), Some(stored.as_bytes()));
    }
}

#[test]
fn bytea_payload_is_decoded() {
    let table = bind(&standard(pgtype::BYTEA));
    assert_eq!(table.payload_kind(), PayloadKind::Bytea);
    let r = table
        .map_insert(&row(t("\\x00ff10"), TupleValue::Null), &ctx())
        .unwrap();
    assert_eq!(r.value.as_deref(), Some(&[0u8, 0xff, 0x10][..]));
    // Binary format: already raw.
    let r = table
        .map_insert(&row(bin(&[0, 0xff, 0x10]), TupleValue::Null), &ctx())
        .unwrap();
    assert_eq!(r.value.as_deref(), Some(&[0u8, 0xff, 0x10][..]));
    // Bad hex: a row error naming the column.
    let e = table
        .map_insert(&row(t("\\x0g"), TupleValue::Null), &ctx())
        .unwrap_err();
    assert_eq!(e.kind(), RowErrorKind::UnreadableValue);
    assert_eq!(e.event_id(), Some(ID));
    assert!(
        e.to_string().contains("column payload of public.outbox"),
        "{e}"
    );
}

#[test]
fn binary_format_values() {
    let rel = relation(vec![
        col("id", pgtype::INT8),
        col("aggregate_type", pgtype::TEXT),
        col("aggregate_id", pgtype::UUID),
        col("event_type", pgtype::TEXT),
        col("payload", pgtype::JSONB),
        col("headers", pgtype::JSONB),
    ]);
    let uuid = [0x11u8; 16];
    let tuple = TupleData {
        columns: vec![
            bin(&77i64.to_be_bytes()),
            bin(b"Order"),
            bin(&uuid),
            bin(b"Created"),
            bin(b"\x01{\"a\": 1}"),
            bin(b"\x01{\"h\": \"v\"}"),
        ],
    };
    let r = bind(&rel).map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(r.event_id, "77");
    assert_eq!(
        r.key.as_deref(),
        Some(&b"11111111-1111-1111-1111-111111111111"[..])
    );
    assert_eq!(r.value.as_deref(), Some(&b"{\"a\": 1}"[..]));
    assert_eq!(r.header("h").map(|v| &v[..]), Some(&b"v"[..]));
    assert_eq!(r.header("id").map(|v| &v[..]), Some(&b"77"[..]));
}

#[test]
fn null_payload_is_a_tombstone() {
    let r = bind(&standard(pgtype::JSONB))
        .map_insert(&row(TupleValue::Null, TupleValue::Null), &ctx())
        .unwrap();
    assert_eq!(r.value, None);
    assert_eq!(r.key.as_deref(), Some(&b"order-42"[..]));
}

#[test]
fn columns_are_bound_by_name_in_any_order() {
    let rel = relation(vec![
        col("payload", pgtype::JSON),
        col("extra", pgtype::INT4),
        col("event_type", pgtype::TEXT),
        col("aggregate_id", pgtype::INT4),
        col("id", pgtype::INT8),
        col("aggregate_type", pgtype::TEXT),
    ]);
    let table = bind(&rel);
    assert!(
        !table.has_headers_column(),
        "default headers column is optional"
    );
    let tuple = TupleData {
        columns: vec![t("{}"), t("5"), t("Shipped"), t("9"), t("1"), t("Parcel")],
    };
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(&*r.topic, "outbox.Parcel");
    assert_eq!(r.key.as_deref(), Some(&b"9"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"{}"[..]));
    assert_eq!(r.event_id, "1");
    assert_eq!(
        r.header("event_type").map(|v| &v[..]),
        Some(&b"Shipped"[..])
    );
}

#[test]
fn custom_column_names_schema_and_topic() {
    let spec = TableSpec {
        schema: "events".into(),
        table: "Outbox".into(),
        columns: OutboxColumns {
            id: "event_id".into(),
            aggregate_type: "aggregatetype".into(),
            aggregate_id: "aggregateid".into(),
            event_type: "type".into(),
            payload: "body".into(),
            headers: Some("meta".into()),
            headers_required: true,
            header_columns: Vec::new(),
        },
        topic: Arc::new(TopicTemplate::parse("{aggregate_type}.{event_type}").unwrap()),
        header_format: HeaderFormat::default(),
    };
    let mut rel = relation(vec![
        col("event_id", pgtype::TEXT),
        col("aggregatetype", pgtype::TEXT),
        col("aggregateid", pgtype::TEXT),
        col("type", pgtype::TEXT),
        col("body", pgtype::JSONB),
        col("meta", pgtype::JSON),
    ]);
    rel.namespace = "events".into();
    rel.name = "Outbox".into();
    let table = BoundTable::bind(&rel, &spec).unwrap();
    assert_eq!(table.table_name(), "events.\"Outbox\"");
    let tuple = TupleData {
        columns: vec![
            t("e1"),
            t("Order"),
            t("7"),
            t("Paid"),
            t("[]"),
            t("{\"k\":\"v\"}"),
        ],
    };
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(&*r.topic, "Order.Paid");
    assert_eq!(r.header("k").map(|v| &v[..]), Some(&b"v"[..]));

    // headers_required: a missing headers column is a shape error.
    rel.columns.pop();
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert!(matches!(
        e,
        ShapeError::MissingColumn {
            role: ColumnRole::Headers,
            ..
        }
    ));
}

#[test]
fn topic_template_shared_across_rebinds() {
    let spec = TableSpec::default();
    let a = BoundTable::bind(&standard(pgtype::JSONB), &spec).unwrap();
    let b = BoundTable::bind(&standard(pgtype::JSONB), &spec).unwrap();
    assert!(Arc::ptr_eq(a.topic_template(), b.topic_template()));
    let tuple = row(t("{}"), TupleValue::Null);
    let ra = a.map_insert(&tuple, &ctx()).unwrap();
    let rb = b.map_insert(&tuple, &ctx()).unwrap();
    assert!(
        Arc::ptr_eq(&ra.topic, &rb.topic),
        "rendered topic is cached"
    );
}

#[test]
fn shape_errors_name_table_column_type_and_fix() {
    let spec = TableSpec::default();
    // Wrong payload type.
    let mut rel = standard(pgtype::INT4);
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Permanent);
    let msg = e.to_string();
    for needle in [
        "\"payload\"",
        "public.outbox",
        "type integer",
        "jsonb, json, text, varchar or bytea",
        "ALTER TABLE public.outbox ALTER COLUMN payload TYPE jsonb",
    ] {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
    // Wrong text-ish type.
    rel = standard(pgtype::JSONB);
    rel.columns[1].type_oid = pgtype::INT4;
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert!(matches!(
        &e,
        ShapeError::WrongType { role: ColumnRole::AggregateType, column, .. } if column == "aggregate_type"
    ));
    // Aggregate id of an unsupported type.
    rel = standard(pgtype::JSONB);
    rel.columns[2].type_oid = pgtype::NUMERIC;
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert!(e.to_string().contains("uuid"), "{e}");
    // Headers not json.
    rel = standard(pgtype::JSONB);
    rel.columns[5].type_oid = pgtype::TEXT;
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert!(e.to_string().contains("jsonb or json"), "{e}");
    // Missing column lists what exists.
    rel = standard(pgtype::JSONB);
    rel.columns.remove(3);
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("no column \"event_type\""), "{msg}");
    assert!(
        msg.contains("id, aggregate_type, aggregate_id, payload"),
        "{msg}"
    );
    // Another table.
    rel = standard(pgtype::JSONB);
    rel.name = "orders".into();
    assert!(!spec.matches(&rel));
    let e = BoundTable::bind(&rel, &spec).unwrap_err();
    assert!(matches!(e, ShapeError::WrongTable { .. }));
    assert!(e.to_string().contains("public.orders"), "{e}");
    // Id accepts any type.
    rel = standard(pgtype::JSONB);
    rel.columns[0].type_oid = pgtype::NUMERIC;
    assert!(BoundTable::bind(&rel, &spec).is_ok());
}

#[test]
fn pg_catalog_namespace_is_empty_on_the_wire() {
    let spec = TableSpec {
        schema: "pg_catalog".into(),
        ..TableSpec::default()
    };
    let mut rel = standard(pgtype::JSONB);
    rel.namespace = String::new();
    assert!(spec.matches(&rel));
}

#[test]
fn bad_rows() {
    let rel = standard(pgtype::JSONB);
    let base = || row(t("{}"), TupleValue::Null);

    let mut r = base();
    r.columns[2] = TupleValue::Null;
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::NullAggregateId);
    assert_eq!(e.event_id(), Some(ID));
    assert!(e.to_string().contains("NOT NULL"), "{e}");

    r = base();
    r.columns[2] = t("");
    assert_eq!(err_of(&rel, &r).kind(), RowErrorKind::EmptyAggregateId);

    r = base();
    r.columns[0] = TupleValue::Null;
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::NullColumn);
    assert_eq!(e.event_id(), None);
    assert!(
        e.to_string()
            .starts_with("column id of public.outbox is NULL"),
        "{e}"
    );

    r = base();
    r.columns[3] = TupleValue::Null;
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::NullColumn);
    assert!(e.to_string().contains("event_type"), "{e}");

    r = base();
    r.columns[1] = TupleValue::Text(Bytes::from_static(b"Or\xffder"));
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::UnreadableValue);
    assert!(e.to_string().contains("UTF-8"), "{e}");

    r = base();
    r.columns[1] = t("Order Items");
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::InvalidTopic);
    assert_eq!(e.event_id(), Some(ID));

    r = base();
    r.columns[4] = TupleValue::UnchangedToast;
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::UnchangedToast);
    assert!(e.to_string().contains("publish = 'insert'"), "{e}");

    r = base();
    r.columns[5] = t("[1, 2]");
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::HeadersNotObject);
    assert!(e.to_string().contains("an array, not a JSON object"), "{e}");

    r = base();
    r.columns[5] = t("{broken");
    assert_eq!(err_of(&rel, &r).kind(), RowErrorKind::UnreadableValue);

    r = base();
    r.columns[5] = bin(b"\x07{}");
    assert_eq!(err_of(&rel, &r).kind(), RowErrorKind::UnreadableValue);

    r = base();
    r.columns.pop();
    let e = err_of(&rel, &r);
    assert_eq!(e.kind(), RowErrorKind::MalformedTuple);
    assert!(e.to_string().contains("6 columns"), "{e}");

    // Every row error is permanent.
    assert_eq!(e.class(), ErrorClass::Permanent);
}

#[test]
fn null_headers_mean_none_and_row_headers_come_first() {
    let table = bind(&standard(pgtype::JSONB));
    let r = table
        .map_insert(&row(t("{}"), TupleValue::Null), &ctx())
        .unwrap();
    assert_eq!(r.headers.len(), 5);
    // A row header named like an outboxd header: both are kept, outboxd's last.
    let r = table
        .map_insert(&row(t("{}"), t(r#"{"id": "spoof"}"#)), &ctx())
        .unwrap();
    assert_eq!(r.headers[0].1, Bytes::from_static(b"spoof"));
    assert_eq!(r.header("id").map(|v| &v[..]), Some(ID.as_bytes()));
}

#[test]
fn oversize_check() {
    let table = bind(&standard(pgtype::TEXT));
    let big = "x".repeat(2000);
    let r = table
        .map_insert(&row(t(&big), TupleValue::Null), &ctx())
        .unwrap();
    assert!(check_size(&r, r.wire_size()).is_ok());
    assert!(check_size(&r, r.wire_size() - 1).is_err());
    let e = check_size(&r, 1000).unwrap_err();
    assert_eq!(e.kind(), RowErrorKind::Oversize);
    assert_eq!(e.event_id(), Some(ID));
    assert!(e.to_string().contains("OUTBOXD_MAX_MESSAGE_BYTES"), "{e}");
}
