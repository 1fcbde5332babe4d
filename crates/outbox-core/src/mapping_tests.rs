//! Tests of table-row mapping and dead-letter records, on hand-built Relation/TupleData.

use super::*;
use crate::dlq::dead_letter_record;
use crate::error::ErrorClass;
use crate::record::{check_size, header};
use crate::topic::TopicName;
use pgoutput::{Column, Lsn, PgTimestamp, ReplicaIdentity};

fn col(name: &str, type_oid: u32) -> Column {
    Column {
        flags: 0,
        name: name.to_owned(),
        type_oid,
        type_modifier: -1,
    }
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

fn dlq_topic() -> TopicName {
    TopicName::parse("outbox.dlq").unwrap()
}

#[test]
fn dead_letter_record_carries_the_raw_row() {
    let table = bind(&standard(pgtype::JSONB));
    let mut tuple = row(t(r#"{"a":"b"}"#), TupleValue::Null);
    tuple.columns[1] = t("Order Items");
    let err = table.map_insert(&tuple, &ctx()).unwrap_err();
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 1_000_000);
    assert_eq!(&*d.topic, "outbox.dlq");
    assert_eq!(d.key.as_deref(), Some(&b"order-42"[..]));
    assert_eq!(d.event_id, ID);
    assert_eq!(d.timestamp_millis, 1_704_067_200_123);
    let v: serde_json::Value = serde_json::from_slice(d.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "id": ID,
            "aggregate_type": "Order Items",
            "aggregate_id": "order-42",
            "event_type": "OrderCreated",
            "payload": "{\"a\":\"b\"}",
            "headers": null,
            "created_at": "2024-01-01 00:00:00+00",
        })
    );
    // Column order is kept.
    let text = std::str::from_utf8(d.value.as_deref().unwrap()).unwrap();
    assert!(text.starts_with("{\"id\":"), "{text}");
    let h = |name: &str| {
        d.header(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(h(header::ID).as_deref(), Some(ID));
    assert_eq!(h(header::ERROR), Some(err.to_string()));
    assert_eq!(h(header::ERROR_KIND).as_deref(), Some("invalid_topic"));
    assert_eq!(h(header::SOURCE_TABLE).as_deref(), Some("public.outbox"));
    assert_eq!(h(header::COMMIT_LSN).as_deref(), Some("1/AB"));
    assert_eq!(h(header::OMITTED_COLUMNS), None);
}

#[test]
fn dead_letter_record_without_readable_id_or_key() {
    let table = bind(&standard(pgtype::BYTEA));
    let mut tuple = row(bin(&[0xde, 0xad]), TupleValue::Null);
    tuple.columns[0] = TupleValue::Null;
    tuple.columns[2] = TupleValue::Null;
    let err = table.map_insert(&tuple, &ctx()).unwrap_err();
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 1_000_000);
    assert_eq!(d.key, None);
    assert_eq!(d.event_id, "");
    assert_eq!(d.header(header::ID), None);
    let v: serde_json::Value = serde_json::from_slice(d.value.as_deref().unwrap()).unwrap();
    assert_eq!(v["payload"], "\\xdead");
    assert_eq!(v["id"], serde_json::Value::Null);
}

#[test]
fn dead_letter_record_of_oversize_row_omits_payload() {
    let table = bind(&standard(pgtype::JSONB));
    let big = format!("{{\"blob\": \"{}\"}}", "y".repeat(5000));
    let tuple = row(t(&big), t(r#"{"h": "v"}"#));
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    let max = 1000;
    let err = check_size(&r, max).unwrap_err();
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), max);
    assert!(d.wire_size() <= max, "{} > {max}", d.wire_size());
    assert_eq!(
        d.header(header::TRUNCATED),
        None,
        "only the payload had to go"
    );
    assert_eq!(
        d.header(header::OMITTED_COLUMNS).map(|v| &v[..]),
        Some(&b"payload"[..])
    );
    assert_eq!(
        d.header(header::ERROR_KIND).map(|v| &v[..]),
        Some(&b"oversize"[..])
    );
    let v: serde_json::Value = serde_json::from_slice(d.value.as_deref().unwrap()).unwrap();
    assert_eq!(v["payload"], serde_json::Value::Null);
    assert_eq!(v["headers"], "{\"h\": \"v\"}");
    assert_eq!(v["aggregate_id"], "order-42");
}

#[test]
fn dead_letter_record_omits_largest_columns_until_it_fits() {
    let table = bind(&standard(pgtype::TEXT));
    let mut tuple = row(t(&"p".repeat(3000)), TupleValue::Null);
    tuple.columns[6] = t(&"c".repeat(2000));
    let err = RowError::new(RowErrorKind::Oversize, "too big");
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 1500);
    assert!(d.wire_size() <= 1500);
    assert_eq!(
        d.header(header::OMITTED_COLUMNS).map(|v| &v[..]),
        Some(&b"payload,created_at"[..])
    );
    // A limit that cannot be met still yields a record, as small as it gets.
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 10);
    assert_eq!(d.value, None);
    assert_eq!(
        d.header(header::TRUNCATED).map(|v| &v[..]),
        Some(&b"key,value"[..])
    );
}

/// Worst cases for the dead-letter record itself: a 100 kB aggregate id (the key and a
/// column), a 100 kB event id (a header, a column and part of the error text), long
/// column and table names. It fits the smallest limit librdkafka accepts, exactly
/// measured, and says what was cut.
#[test]
fn dead_letter_record_fits_however_large_its_key_and_id() {
    let long = |c: &str| c.repeat(63);
    let rel = Relation {
        namespace: long("s"),
        name: long("t"),
        columns: vec![
            col(&long("i"), pgtype::TEXT),
            col(&long("a"), pgtype::TEXT),
            col(&long("k"), pgtype::TEXT),
            col(&long("e"), pgtype::TEXT),
            col(&long("p"), pgtype::JSONB),
            col(&long("h"), pgtype::JSONB),
            col(&long("c"), pgtype::TEXT),
            col(&long("d"), pgtype::TEXT),
        ],
        ..relation(vec![])
    };
    let spec = TableSpec {
        schema: long("s"),
        table: long("t"),
        columns: OutboxColumns {
            id: long("i"),
            aggregate_type: long("a"),
            aggregate_id: long("k"),
            event_type: long("e"),
            payload: long("p"),
            headers: Some(long("h")),
            headers_required: true,
            header_columns: Vec::new(),
        },
        ..TableSpec::default()
    };
    let table = BoundTable::bind(&rel, &spec).unwrap();
    let huge_key = "k".repeat(100_000);
    let huge_id = "é".repeat(50_000);
    let tuple = |id: &str, key: &str| TupleData {
        columns: vec![
            t(id),
            t("Order"),
            t(key),
            t("E"),
            t("{}"),
            TupleValue::Null,
            t(&"c".repeat(500)),
            t(&"d".repeat(500)),
        ],
    };
    for (id, key, cut) in [
        (ID, huge_key.as_str(), "key"),
        (huge_id.as_str(), "order-1", "id"),
        (huge_id.as_str(), huge_key.as_str(), "key,id"),
    ] {
        let tuple = tuple(id, key);
        let r = table.map_insert(&tuple, &ctx()).unwrap();
        let err = check_size(&r, 1000).unwrap_err();
        for max in [1000, 2000, 10_000] {
            let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), max);
            assert!(d.wire_size() <= max, "{} > {max} ({cut})", d.wire_size());
            if max == 10_000 {
                let what = d.header(header::TRUNCATED).map(|v| &v[..]);
                assert_eq!(what, Some(cut.as_bytes()), "what was cut");
                if cut.contains("key") {
                    assert_eq!(d.key, None);
                }
                if cut.contains("id") {
                    let id = d.header(header::ID).unwrap();
                    let id = std::str::from_utf8(id).expect("cut at a character boundary");
                    assert!(id.ends_with('…') && id.len() <= 70, "{id}");
                }
            }
        }
    }
    // The smallest limit: everything that can be cut is.
    let tuple = tuple(&huge_id, &huge_key);
    let err =
        RowError::new(RowErrorKind::Oversize, "x".repeat(10_000)).with_event_id(Some(&huge_id));
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 1000);
    assert!(d.wire_size() <= 1000, "{}", d.wire_size());
    let d = dead_letter_record(&table, &tuple, &err, &ctx(), &dlq_topic(), 0);
    assert!(d.wire_size() <= 760, "the floor: {}", d.wire_size());
    assert_eq!(
        d.header(header::TRUNCATED).map(|v| &v[..]),
        Some(&b"key,id,error,value,headers"[..])
    );
}

/// Seed 004's table: idempotency_key and version beside the usual columns.
fn seed_004_relation() -> Relation {
    relation(vec![
        col("id", pgtype::UUID),
        col("aggregate_type", pgtype::TEXT),
        col("aggregate_id", pgtype::TEXT),
        col("event_type", pgtype::TEXT),
        col("payload", pgtype::JSONB),
        col("idempotency_key", pgtype::TEXT),
        col("version", pgtype::INT8),
        col("tenant", pgtype::TEXT),
    ])
}

fn seed_004_row(key: TupleValue, version: TupleValue) -> TupleData {
    TupleData {
        columns: vec![
            t(ID),
            t("Order"),
            t("order-42"),
            t("OrderPaid"),
            t("{\"total\": 10}"),
            key,
            version,
            t("acme"),
        ],
    }
}

fn seed_004_spec(format: HeaderFormat) -> TableSpec {
    TableSpec {
        columns: OutboxColumns {
            header_columns: vec!["idempotency_key".into(), "version".into()],
            ..OutboxColumns::default()
        },
        topic: Arc::new(TopicTemplate::parse("{tenant}.{aggregate_type}").unwrap()),
        header_format: format,
        ..TableSpec::default()
    }
}

#[test]
fn header_columns_and_column_placeholders() {
    let table =
        BoundTable::bind(&seed_004_relation(), &seed_004_spec(HeaderFormat::Outboxd)).unwrap();
    let r = table
        .map_insert(
            &seed_004_row(t("settlement:order:42:payment:7"), t("3")),
            &ctx(),
        )
        .unwrap();
    assert_eq!(&*r.topic, "acme.Order");
    let names: Vec<String> = headers_of(&r).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        names,
        [
            "idempotency_key",
            "version",
            "id",
            "event_type",
            "aggregate_type",
            "outboxd.commit_lsn",
            "outboxd.commit_time"
        ]
    );
    assert_eq!(
        r.header("idempotency_key").map(|v| &v[..]),
        Some(&b"settlement:order:42:payment:7"[..])
    );
    assert_eq!(r.header("version").map(|v| &v[..]), Some(&b"3"[..]));
    // NULL leaves the header out.
    let r = table
        .map_insert(&seed_004_row(TupleValue::Null, t("4")), &ctx())
        .unwrap();
    assert_eq!(r.header("idempotency_key"), None);
    assert_eq!(r.header("version").map(|v| &v[..]), Some(&b"4"[..]));
    // A NULL topic column is a bad row naming the column.
    let mut tuple = seed_004_row(t("k"), t("1"));
    tuple.columns[7] = TupleValue::Null;
    let e = table.map_insert(&tuple, &ctx()).unwrap_err();
    assert_eq!(e.kind(), RowErrorKind::InvalidTopic);
    assert!(e.to_string().contains("tenant"), "{e}");
}

#[test]
fn missing_header_or_topic_column_is_a_shape_error() {
    let mut rel = seed_004_relation();
    rel.columns.retain(|c| c.name != "version");
    let e = BoundTable::bind(&rel, &seed_004_spec(HeaderFormat::Outboxd)).unwrap_err();
    assert!(
        matches!(&e, ShapeError::MissingColumn { column, role: ColumnRole::HeaderColumn, .. } if column == "version"),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"version\""), "{e}");
    let mut rel = seed_004_relation();
    rel.columns.retain(|c| c.name != "tenant");
    let e = BoundTable::bind(&rel, &seed_004_spec(HeaderFormat::Outboxd)).unwrap_err();
    assert!(
        matches!(&e, ShapeError::MissingColumn { column, role: ColumnRole::TopicPlaceholder, .. } if column == "tenant"),
        "{e:?}"
    );
}

#[test]
fn default_headers_unchanged() {
    // Existing users: the documented headers, in the documented order, nothing more.
    let r = bind(&standard(pgtype::JSONB))
        .map_insert(&row(t("{}"), TupleValue::Null), &ctx())
        .unwrap();
    let names: Vec<String> = headers_of(&r).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        names,
        [
            "id",
            "event_type",
            "aggregate_type",
            "outboxd.commit_lsn",
            "outboxd.commit_time"
        ]
    );
}

#[test]
fn cloudevents_binary_mode_headers() {
    let format = HeaderFormat::CloudEvents {
        source: Bytes::from_static(b"/shop/orders"),
    };
    let table = BoundTable::bind(&seed_004_relation(), &seed_004_spec(format)).unwrap();
    let r = table
        .map_insert(&seed_004_row(t("k"), t("1")), &ctx())
        .unwrap();
    let h = |name: &str| {
        r.header(name)
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    };
    assert_eq!(h("ce_specversion").as_deref(), Some("1.0"));
    assert_eq!(h("ce_id").as_deref(), Some(ID));
    assert_eq!(h("ce_type").as_deref(), Some("OrderPaid"));
    assert_eq!(h("ce_source").as_deref(), Some("/shop/orders"));
    assert_eq!(h("ce_time").as_deref(), Some("2024-01-01T00:00:00.123456Z"));
    assert_eq!(h("content-type").as_deref(), Some("application/json"));
    // outboxd's own headers stay; the value is the payload.
    assert_eq!(h("id").as_deref(), Some(ID));
    assert_eq!(r.value.as_deref(), Some(&b"{\"total\": 10}"[..]));
    // bytea payloads carry no content-type; a NULL payload neither.
    let mut rel = seed_004_relation();
    rel.columns[4].type_oid = pgtype::BYTEA;
    let format = HeaderFormat::CloudEvents {
        source: Bytes::from_static(b"s"),
    };
    let table = BoundTable::bind(&rel, &seed_004_spec(format.clone())).unwrap();
    let mut tuple = seed_004_row(t("k"), t("1"));
    tuple.columns[4] = t("\\x00ff");
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(r.header("content-type"), None);
    assert!(r.header("ce_id").is_some());
    let table = BoundTable::bind(&seed_004_relation(), &seed_004_spec(format)).unwrap();
    let mut tuple = seed_004_row(t("k"), t("1"));
    tuple.columns[4] = TupleValue::Null;
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    assert_eq!(r.header("content-type"), None);
}
