//! Header columns and column placeholders in topics (seed 004), and CloudEvents headers.

use super::*;

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

/// CloudEvents 1.0: `id` and `type` "MUST be a non-empty string", and each attribute is
/// one header: a row whose headers repeat one outboxd writes is a bad row, not a record
/// with two `ce_type` headers.
#[test]
fn cloudevents_bad_rows() {
    let spec = |payload_oid| {
        let spec = TableSpec {
            header_format: HeaderFormat::CloudEvents {
                source: Bytes::from_static(b"/shop/orders"),
            },
            ..TableSpec::default()
        };
        BoundTable::bind(&standard(payload_oid), &spec).unwrap()
    };
    let table = spec(pgtype::JSONB);
    let map = |tuple: &TupleData| table.map_insert(tuple, &ctx());
    let refused = |tuple: &TupleData, needles: &[&str]| {
        let e = map(tuple).unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::InvalidCloudEvent, "{e}");
        assert_eq!(e.event_id(), Some(ID));
        for needle in needles {
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        }
    };
    let mut empty_type = row(t("{}"), TupleValue::Null);
    empty_type.columns[3] = t("");
    refused(
        &empty_type,
        &["event type is empty", "ce_type", "non-empty"],
    );
    for clash in ["ce_type", "ce_id", "ce_source", "ce_specversion", "ce_time"] {
        let headers = format!("{{\"{clash}\": \"x\"}}");
        refused(
            &row(t("{}"), t(&headers)),
            &[clash, "outboxd writes itself", "remove"],
        );
    }
    // A json payload gets outboxd's content-type: the row's would be a second one.
    refused(
        &row(t("{}"), t(r#"{"content-type": "text/xml"}"#)),
        &["content-type", "outboxd writes itself"],
    );
    refused(
        &row(t("{}"), t(r#"{"ce_datacontenttype": "text/xml"}"#)),
        &["name the header content-type"],
    );
    refused(
        &row(t("{}"), t(r#"{"ce_Subject": "x"}"#)),
        &["lower-case ASCII letters and digits"],
    );
    // Extension attributes and plain headers pass.
    let r = map(&row(
        t("{}"),
        t(r#"{"ce_subject": "order-42", "traceparent": "00-1", "Content-Type": "x"}"#),
    ))
    .unwrap();
    assert_eq!(
        r.header("ce_subject").map(|v| &v[..]),
        Some(&b"order-42"[..])
    );
    // A bytea payload has no content-type of outboxd's: the row's names the media type.
    let table = spec(pgtype::BYTEA);
    let tuple = row(t("\\x00ff"), t(r#"{"content-type": "application/avro"}"#));
    let r = table.map_insert(&tuple, &ctx()).unwrap();
    let content_types: Vec<_> = headers_of(&r)
        .into_iter()
        .filter(|(k, _)| k == "content-type")
        .collect();
    assert_eq!(
        content_types,
        [("content-type".into(), "application/avro".into())]
    );
    // The outboxd format keeps accepting all of these rows as they are.
    let plain = bind(&standard(pgtype::JSONB));
    assert!(plain.map_insert(&empty_type, &ctx()).is_ok());
    assert!(plain
        .map_insert(&row(t("{}"), t(r#"{"ce_type": "x"}"#)), &ctx())
        .is_ok());
}
