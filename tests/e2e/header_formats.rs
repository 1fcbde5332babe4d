//! What a consumer sees with the opt-in header settings: seed 004's idempotency_key and
//! version columns as headers (NULL leaves the header out), a topic routed by another
//! column, a configured column missing from the table as a shape error naming it, and
//! CloudEvents attributes (Kafka protocol binding, binary content mode) that a consumer
//! parses back into an event.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::{read_topics, Received};
use support::relay::Relay;
use support::schema;

/// Seed 004's outbox table: the usual columns plus idempotency_key, version and the
/// polling relay's bookkeeping columns (which outboxd does not need, and ignores), and a
/// tenant column to route topics by.
const SEED_004_DDL: &str = "CREATE TABLE public.outbox (
    id              uuid        PRIMARY KEY,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    idempotency_key text        NULL,
    version         bigint      NOT NULL,
    tenant          text        NOT NULL,
    status          text        NOT NULL DEFAULT 'pending',
    retry_count     int         NOT NULL DEFAULT 0,
    next_retry_at   timestamptz NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz NULL
)";

const IDS: [&str; 3] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
];

async fn insert_seed_004(
    client: &tokio_postgres::Client,
    id: &str,
    tenant: &str,
    key: Option<&str>,
    version: i64,
) {
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, \
             idempotency_key, version, tenant) VALUES ($1::text::uuid, 'order', 'order-42', \
             'OrderPaid', jsonb_build_object('v', $3::bigint), $2, $3, $4)",
            &[&id, &key, &version, &tenant],
        )
        .await
        .expect("insert");
}

fn by_id<'a>(received: &'a [Received], id: &str) -> &'a Received {
    received
        .iter()
        .find(|r| r.header("id") == Some(id))
        .unwrap_or_else(|| panic!("event {id} not received: {received:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn seed_004_columns_as_headers_and_topic_by_column() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("hdr_columns").await;
    let outbox = schema::setup_custom(&db, SEED_004_DDL, Some("publish = 'insert'")).await;
    let acme = format!("{}.acme.order", outbox.topic_prefix);
    let globex = format!("{}.globex.order", outbox.topic_prefix);
    broker
        .create_topics(&[&acme, &globex, &outbox.dead_letter_topic()], 2)
        .await;
    let template = format!("{}.{{tenant}}.{{aggregate_type}}", outbox.topic_prefix);
    let _relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[
                ("OUTBOXD_HEADER_COLUMNS", "idempotency_key,version"),
                ("OUTBOXD_TOPIC", &template),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    insert_seed_004(
        &client,
        IDS[0],
        "acme",
        Some("settlement:order:42:payment:1"),
        1,
    )
    .await;
    insert_seed_004(&client, IDS[1], "acme", None, 2).await;
    insert_seed_004(&client, IDS[2], "globex", Some("k-3"), 1).await;

    let received = read_topics(
        &broker.bootstrap(),
        &[acme.clone(), globex.clone()],
        3,
        // Idle limit: the first record waits for the relay's start-up (slow when loaded).
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    assert_eq!(received.len(), 3, "{received:?}");
    let first = by_id(&received, IDS[0]);
    assert_eq!(first.topic, acme);
    assert_eq!(
        first.header("idempotency_key"),
        Some("settlement:order:42:payment:1")
    );
    assert_eq!(first.header("version"), Some("1"));
    // The documented headers are all still there, after the columns.
    let names: Vec<&str> = first.headers.iter().map(|(k, _)| k.as_str()).collect();
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
    let second = by_id(&received, IDS[1]);
    assert_eq!(second.topic, acme);
    assert_eq!(second.header("idempotency_key"), None, "NULL: no header");
    assert!(second.headers.iter().all(|(k, _)| k != "idempotency_key"));
    assert_eq!(second.header("version"), Some("2"));
    let third = by_id(&received, IDS[2]);
    assert_eq!(third.topic, globex);
    assert_eq!(third.header("idempotency_key"), Some("k-3"));
    // Versions of one aggregate arrive in order on its partition.
    let acme_versions: Vec<&str> = received
        .iter()
        .filter(|r| r.topic == acme)
        .filter_map(|r| r.header("version"))
        .collect();
    assert_eq!(acme_versions, ["1", "2"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_header_column_is_a_shape_error_naming_it() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("hdr_missing").await;
    let outbox = schema::setup_custom(&db, SEED_004_DDL, Some("publish = 'insert'")).await;
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_HEADER_COLUMNS", "idempotency_key,revision")],
    );
    // `outboxd check` names it before anything runs...
    let (code, out) = support::relay::run_to_end(&env, &["check"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("\"revision\""), "{out}");
    // ...and `run` stops with exit 3 at bind time, naming it, before publishing anything.
    let mut relay = Relay::start(env, &["run"]);
    let client = db.client().await;
    insert_seed_004(&client, IDS[0], "acme", Some("k"), 1).await;
    let status = relay.wait_exit(Duration::from_secs(30));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("no column \"revision\""), "{log}");
    assert!(log.contains("header column"), "{log}");
}

/// An RFC 3339 `date-time` (section 5.6), as a consumer's parser reads it, to Unix
/// microseconds. Panics on anything else.
fn parse_rfc3339(s: &str) -> i64 {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> i64 {
        let t = &s[r];
        assert!(t.bytes().all(|c| c.is_ascii_digit()), "{s}: {t}");
        t.parse().unwrap()
    };
    assert!(b.len() >= 20, "{s}");
    assert_eq!((b[4], b[7], b[13], b[16]), (b'-', b'-', b':', b':'), "{s}");
    assert!(b[10] == b'T' || b[10] == b't', "{s}");
    let (y, mo, d) = (num(0..4), num(5..7), num(8..10));
    let (h, mi, sec) = (num(11..13), num(14..16), num(17..19));
    assert!((1..=12).contains(&mo) && (1..=31).contains(&d), "{s}");
    assert!(h < 24 && mi < 60 && sec < 61, "{s}");
    let mut rest = &s[19..];
    let mut micros = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        assert!(digits > 0, "{s}");
        let padded = format!("{:0<6}", &frac[..digits.min(6)]);
        micros = padded.parse::<i64>().unwrap();
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        o => {
            assert_eq!(o.len(), 6, "{s}");
            let sign = match &o[..1] {
                "+" => 1,
                "-" => -1,
                _ => panic!("{s}"),
            };
            sign * (o[1..3].parse::<i64>().unwrap() * 3600 + o[4..6].parse::<i64>().unwrap() * 60)
        }
    };
    // days_from_civil
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + h * 3600 + mi * 60 + sec - offset_secs) * 1_000_000 + micros
}

#[test]
fn rfc3339_parser_of_the_test() {
    assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), 0);
    assert_eq!(
        parse_rfc3339("2026-12-01T10:41:55.5+01:00"),
        1_796_118_115_500_000
    );
}

/// The CloudEvents attributes of a Kafka record in binary content mode: `ce_`-prefixed
/// headers, and `content-type` as `datacontenttype`.
fn cloudevent_attributes(r: &Received) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::new();
    for (k, v) in &r.headers {
        let v = String::from_utf8(v.clone()).expect("CloudEvents headers are UTF-8");
        if let Some(name) = k.strip_prefix("ce_") {
            // Attribute names: lower-case a-z and 0-9 (CloudEvents 1.0, section 3.1.1).
            assert!(
                name.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
                "{k}"
            );
            assert!(attrs.insert(name.to_owned(), v).is_none(), "{k} twice");
        } else if k == "content-type" {
            assert!(
                attrs.insert("datacontenttype".to_owned(), v).is_none(),
                "{k} twice"
            );
        }
    }
    attrs
}

#[tokio::test(flavor = "multi_thread")]
async fn cloudevents_headers_parse_as_attributes() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("hdr_cloudevents").await;
    let outbox = schema::setup(&db).await;
    let topic = outbox.topic("order");
    broker
        .create_topics(&[&topic, &outbox.dead_letter_topic()], 2)
        .await;
    let _relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[
                ("OUTBOXD_HEADER_FORMAT", "cloudevents"),
                ("OUTBOXD_CLOUDEVENTS_SOURCE", "/shop/orders"),
            ],
        ),
        &["run"],
    );
    let client = db.client().await;
    let before = pgoutput::PgTimestamp::now().unix_micros();
    for (i, id) in IDS.iter().enumerate() {
        let n = i64::try_from(i).unwrap();
        client
            .execute(
                "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ($1::text::uuid, 'order', 'order-7', 'OrderPaid', jsonb_build_object('n', $2::bigint))",
                &[id, &n],
            )
            .await
            .expect("insert");
    }
    let after = pgoutput::PgTimestamp::now().unix_micros();
    // Rows that cannot be CloudEvents: an empty type (CloudEvents: "MUST be a non-empty
    // string"), and row headers repeating the binding's. Dead-lettered, not sent with two
    // ce_type headers.
    let bad = [
        ("00000000-0000-4000-8000-0000000000b1", "", "{}"),
        (
            "00000000-0000-4000-8000-0000000000b2",
            "OrderPaid",
            r#"{"ce_type": "Other", "traceparent": "00-1"}"#,
        ),
        (
            "00000000-0000-4000-8000-0000000000b3",
            "OrderPaid",
            r#"{"content-type": "text/xml"}"#,
        ),
    ];
    for (id, event_type, headers) in bad {
        client
            .execute(
                "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ($1::text::uuid, 'order', 'order-8', $2, '{}', $3::text::jsonb)",
                &[&id, &event_type, &headers],
            )
            .await
            .expect("insert");
    }
    let dlq = outbox.dead_letter_topic();
    let received = read_topics(
        &broker.bootstrap(),
        &[topic.clone(), dlq.clone()],
        IDS.len() + bad.len(),
        // Idle limit: the first record waits for the relay's start-up (slow when loaded).
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    assert_eq!(received.len(), IDS.len() + bad.len(), "{received:?}");
    for (id, _, _) in bad {
        let r = by_id(&received, id);
        assert_eq!(r.topic, dlq, "{id} dead-lettered");
        assert_eq!(r.header("outboxd.error_kind"), Some("invalid_cloudevent"));
    }
    for (i, id) in IDS.iter().enumerate() {
        let r = by_id(&received, id);
        let attrs = cloudevent_attributes(r);
        let keys: Vec<&str> = attrs.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "datacontenttype",
                "id",
                "source",
                "specversion",
                "time",
                "type"
            ]
        );
        assert_eq!(attrs["specversion"], "1.0");
        assert_eq!(attrs["id"], *id);
        assert_eq!(attrs["type"], "OrderPaid");
        assert_eq!(attrs["source"], "/shop/orders");
        assert_eq!(attrs["datacontenttype"], "application/json");
        // time: RFC 3339, the commit time: the record timestamp and outboxd's header to
        // the millisecond, and between the inserts' bounds.
        let time = parse_rfc3339(&attrs["time"]);
        assert_eq!(
            Some(time.div_euclid(1000)),
            r.timestamp_millis,
            "{}",
            attrs["time"]
        );
        let commit_ms: i64 = r.header("outboxd.commit_time").unwrap().parse().unwrap();
        assert_eq!(time.div_euclid(1000), commit_ms);
        assert!(
            (before - 1_000_000..=after + 1_000_000).contains(&time),
            "{} not within the inserts' time",
            attrs["time"]
        );
        // Binary mode: the value is the data, the payload as stored.
        let data: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(data, serde_json::json!({ "n": i }));
        // outboxd's own headers stay for consumers that deduplicate on them.
        assert_eq!(r.header("id"), Some(*id));
    }
}
