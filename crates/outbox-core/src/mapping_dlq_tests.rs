//! Dead-letter records of bad table rows: the raw row kept, cut to fit the size limit.

use super::*;

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
