//! Events sent with pg_logical_emit_message(true, 'outbox', envelope) are published like
//! rows: topic from the aggregate type, key = aggregate id, the envelope's headers plus
//! outboxd's, and the payload's exact JSON text as the value. Other prefixes and rolled
//! back messages are not published; rows and messages of one transaction keep their order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::{read_until_ids, Received};
use support::relay::Relay;
use support::schema;
use tokio_postgres::GenericClient;

fn envelope(
    id: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    payload: &str,
    headers: &str,
) -> String {
    format!(
        r#"{{"id": "{id}", "aggregate_type": "{aggregate_type}", "aggregate_id": "{aggregate_id}", "event_type": "Emitted", "payload": {payload}, "headers": {headers}}}"#
    )
}

async fn emit(client: &impl GenericClient, prefix: &str, content: &str) {
    client
        .execute(
            "SELECT pg_logical_emit_message(true, $1::text, $2::text)",
            &[&prefix, &content],
        )
        .await
        .expect("pg_logical_emit_message");
}

async fn insert_row(client: &impl GenericClient, id: &str, aggregate_id: &str, n: i32) {
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1::text::uuid, 'order', $2, 'Row', jsonb_build_object('n', $3::int))",
            &[&id, &aggregate_id, &n],
        )
        .await
        .expect("insert");
}

fn ids_of<'r>(records: &'r [Received], topic: &str) -> Vec<&'r str> {
    records
        .iter()
        .filter(|r| r.topic == topic)
        .map(|r| r.header("id").unwrap_or("<no id>"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn emitted_messages_are_published_like_rows() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("logical_messages").await;
    let outbox = schema::setup(&db).await;
    let invoice = outbox.topic("invoice");
    let order = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    broker.create_topics(&[&invoice, &order, &dlq], 3).await;
    let relay = Relay::start(
        Relay::env_for(
            &db,
            &outbox,
            &broker.bootstrap(),
            &[("OUTBOXD_MESSAGE_PREFIX", "outbox")],
        ),
        &["run"],
    );
    let mut client = db.client().await;
    let id = || uuid::Uuid::new_v4().to_string();

    // m1: a message on its own, with odd spacing that jsonb would normalise away.
    let m1 = id();
    let m1_payload = r#"{"b": 1,   "a": [1, 2.50], "s": "x\u00e9"}"#;
    emit(
        &client,
        "outbox",
        &envelope(
            &m1,
            "invoice",
            "inv-1",
            m1_payload,
            r#"{"trace": "abc", "n": 5}"#,
        ),
    )
    .await;
    // Another prefix, and a valid envelope: ignored.
    let other = id();
    emit(
        &client,
        "outbox-other",
        &envelope(&other, "invoice", "inv-1", "{}", "{}"),
    )
    .await;
    emit(
        &client,
        "audit",
        &envelope(&other, "invoice", "inv-1", "{}", "{}"),
    )
    .await;
    // A message whose transaction rolls back: not published.
    let rolled_back = id();
    {
        let tx = client.transaction().await.expect("begin");
        emit(
            &tx,
            "outbox",
            &envelope(&rolled_back, "invoice", "inv-1", "{}", "{}"),
        )
        .await;
        tx.rollback().await.expect("rollback");
    }
    // A string payload arrives as the string's bytes.
    let m4 = id();
    emit(
        &client,
        "outbox",
        &envelope(&m4, "invoice", "inv-1", r#""plain <xml/> text""#, "null"),
    )
    .await;
    // Rows and messages mixed in one transaction, one aggregate.
    let (r1, m2, r2, m3) = (id(), id(), id(), id());
    {
        let tx = client.transaction().await.expect("begin");
        insert_row(&tx, &r1, "mix-1", 1).await;
        emit(
            &tx,
            "outbox",
            &envelope(&m2, "order", "mix-1", r#"{"n": 2}"#, "{}"),
        )
        .await;
        insert_row(&tx, &r2, "mix-1", 3).await;
        emit(
            &tx,
            "outbox",
            &envelope(&m3, "order", "mix-1", r#"{"n": 4}"#, "{}"),
        )
        .await;
        tx.commit().await.expect("commit");
    }
    let sentinel = id();
    insert_row(&client, &sentinel, "mix-1", 5).await;

    let want: HashSet<String> = [m1.clone(), m4.clone(), sentinel.clone()]
        .into_iter()
        .collect();
    let got = read_until_ids(
        &broker.bootstrap(),
        &[invoice.clone(), order.clone(), dlq.clone()],
        &want,
        Duration::from_secs(2),
        Duration::from_secs(60),
    );

    assert_eq!(
        ids_of(&got, &invoice),
        vec![m1.as_str(), m4.as_str()],
        "only the committed 'outbox' messages, in order; not {other} (other prefixes) or {rolled_back} (rolled back)"
    );
    assert_eq!(
        ids_of(&got, &order),
        vec![
            r1.as_str(),
            m2.as_str(),
            r2.as_str(),
            m3.as_str(),
            sentinel.as_str()
        ],
        "rows and messages of one transaction keep their order"
    );
    assert!(ids_of(&got, &dlq).is_empty(), "nothing dead-lettered");

    let rec = |id: &str| {
        got.iter()
            .find(|r| r.header("id") == Some(id))
            .expect("record")
    };
    let r = rec(&m1);
    assert_eq!(r.key_str(), "inv-1");
    assert_eq!(
        r.value.as_deref(),
        Some(m1_payload.as_bytes()),
        "the payload's exact text"
    );
    assert_eq!(r.header("trace"), Some("abc"));
    assert_eq!(r.header("n"), Some("5"));
    assert_eq!(r.header("event_type"), Some("Emitted"));
    assert_eq!(r.header("aggregate_type"), Some("invoice"));
    assert!(r
        .header("outboxd.commit_lsn")
        .is_some_and(|l| l.contains('/')));
    let commit_ms: i64 = r
        .header("outboxd.commit_time")
        .expect("commit time")
        .parse()
        .expect("millis");
    assert_eq!(r.timestamp_millis, Some(commit_ms));
    assert_eq!(rec(&m4).value.as_deref(), Some(&b"plain <xml/> text"[..]));
    assert_eq!(rec(&m2).value.as_deref(), Some(&b"{\"n\": 2}"[..]));
    // The mixed transaction's records share its commit LSN.
    let lsns: HashSet<&str> = [&r1, &m2, &r2, &m3]
        .iter()
        .map(|id| rec(id).header("outboxd.commit_lsn").expect("lsn"))
        .collect();
    assert_eq!(lsns.len(), 1, "one transaction, one commit LSN: {lsns:?}");
    drop(relay);
}

/// Any role that can execute pg_logical_emit_message (PUBLIC, by default) could forge
/// events if emitted messages were relayed: under the default configuration they are
/// not, whoever emits them. With a prefix configured, `check` fails while PUBLIC holds
/// the grant, and passes once it is revoked.
#[tokio::test(flavor = "multi_thread")]
async fn emitted_messages_are_off_by_default_and_check_flags_the_public_grant() {
    let broker = Broker::default_for_tests();
    let db = PgCluster::shared().fresh_database("emit_forgery").await;
    let outbox = schema::setup(&db).await;
    let payments = outbox.topic("payments");
    let order = outbox.topic("order");
    broker
        .create_topics(&[&payments, &order, &outbox.dead_letter_topic()], 1)
        .await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    support::ops::wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;

    // A role with no privilege on the outbox table forges a refund.
    client
        .batch_execute("CREATE ROLE forger NOLOGIN")
        .await
        .expect("role");
    let forged = uuid::Uuid::new_v4().to_string();
    client
        .batch_execute("SET ROLE forger")
        .await
        .expect("set role");
    emit(
        &client,
        "outbox",
        &envelope(&forged, "payments", "acct-1", r#"{"refund": 1000}"#, "{}"),
    )
    .await;
    client
        .batch_execute("RESET ROLE")
        .await
        .expect("reset role");
    // A real event after it: once it arrives, the forged one had its chance.
    let real = uuid::Uuid::new_v4().to_string();
    insert_row(&client, &real, "o-1", 1).await;
    let want: HashSet<String> = [real.clone()].into();
    let received = tokio::task::block_in_place(|| {
        read_until_ids(
            &broker.bootstrap(),
            &[payments.clone(), order.clone()],
            &want,
            Duration::from_secs(2),
            Duration::from_secs(60),
        )
    });
    assert!(
        ids_of(&received, &payments).is_empty(),
        "a forged emitted message was published: {:?}",
        ids_of(&received, &payments)
    );
    assert_eq!(ids_of(&received, &order), vec![real.as_str()]);
    drop(relay);

    let with_prefix = [
        env.clone(),
        vec![("OUTBOXD_MESSAGE_PREFIX".to_owned(), "outbox".to_owned())],
    ]
    .concat();
    let (code, out) = support::relay::run_to_end(&with_prefix, &["check"]);
    assert_eq!(code, 6, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL  emitted messages")
            && l.contains("REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message")),
        "check names the REVOKE:\n{out}"
    );
    client
        .batch_execute(
            // Every overload: PostgreSQL 17 gave both a fourth argument (flush).
            "DO $$ DECLARE f regprocedure; BEGIN \
               FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p \
                 WHERE p.proname = 'pg_logical_emit_message' \
                   AND p.pronamespace = 'pg_catalog'::regnamespace LOOP \
                 EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f); \
               END LOOP; END $$",
        )
        .await
        .expect("revoke");
    let (code, out) = support::relay::run_to_end(&with_prefix, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("ok    emitted messages")),
        "{out}"
    );
}
