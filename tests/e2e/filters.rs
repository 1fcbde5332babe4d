//! Only inserts are events: insert-then-delete publishes the insert once; UPDATE, DELETE
//! and TRUNCATE of the outbox publish nothing, both when the publication filters them
//! (publish = 'insert') and when it sends everything and the relay has to ignore them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::consume::read_until_ids;
use support::relay::Relay;
use support::schema::{self, Outbox};
use tokio_postgres::Client;

async fn insert(client: &Client, id: &str, event_type: &str, n: i32) {
    client
        .execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1::text::uuid, 'order', 'a1', $2, jsonb_build_object('n', $3::int))",
            &[&id, &event_type, &n],
        )
        .await
        .expect("insert");
}

async fn only_inserts_are_published(name: &str, publish_all: bool, broker: Broker) {
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox: Outbox = if publish_all {
        schema::setup_publish_all(&db).await
    } else {
        schema::setup(&db).await
    };
    let topic = outbox.topic("order");
    let dlq = outbox.dead_letter_topic();
    broker.create_topics(&[&topic, &dlq], 3).await;
    let relay = Relay::start(
        Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]),
        &["run"],
    );
    let mut client = db.client().await;
    let id = || uuid::Uuid::new_v4().to_string();
    let (b, a, c, sentinel) = (id(), id(), id(), id());

    // B: a plain event, later updated and deleted.
    insert(&client, &b, "Created", 1).await;
    // A: insert-then-delete in one transaction (the table stays empty).
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES ($1::text::uuid, 'order', 'a1', 'Shipped', '{\"n\": 2}')",
        &[&a],
    )
    .await
    .expect("insert A");
    let deleted = tx
        .execute("DELETE FROM public.outbox WHERE id = $1::text::uuid", &[&a])
        .await
        .expect("delete A");
    assert_eq!(deleted, 1);
    tx.commit().await.expect("commit");
    // Updates and deletes of existing rows, and a truncate, are not events.
    client
        .execute(
            "UPDATE public.outbox SET event_type = 'Updated', payload = '{\"n\": 99}' WHERE id = $1::text::uuid",
            &[&b],
        )
        .await
        .expect("update");
    client
        .execute("DELETE FROM public.outbox WHERE id = $1::text::uuid", &[&b])
        .await
        .expect("delete B");
    insert(&client, &c, "Paid", 3).await;
    client
        .batch_execute(
            "UPDATE public.outbox SET headers = '{\"x\": \"y\"}'; TRUNCATE public.outbox",
        )
        .await
        .expect("update + truncate");
    insert(&client, &sentinel, "Sentinel", 4).await;

    let want: HashSet<String> = [sentinel.clone()].into_iter().collect();
    let got = read_until_ids(
        &broker.bootstrap(),
        &[topic.clone(), dlq.clone()],
        &want,
        Duration::from_secs(2),
        Duration::from_secs(60),
    );
    let seen: Vec<(&str, &str, &str)> = got
        .iter()
        .map(|r| {
            (
                r.header("id").unwrap_or("<no id>"),
                r.header("event_type").unwrap_or("<none>"),
                std::str::from_utf8(r.value.as_deref().unwrap_or_default()).unwrap_or("<bin>"),
            )
        })
        .collect();
    let expected = vec![
        (b.as_str(), "Created", "{\"n\": 1}"),
        (a.as_str(), "Shipped", "{\"n\": 2}"),
        (c.as_str(), "Paid", "{\"n\": 3}"),
        (sentinel.as_str(), "Sentinel", "{\"n\": 4}"),
    ];
    assert_eq!(
        seen, expected,
        "exactly the four inserts, once each, in commit order (publish_all={publish_all})"
    );
    assert!(
        got.iter().all(|r| r.topic == topic),
        "nothing dead-lettered"
    );
    assert!(
        !relay.log_text().contains("ERROR"),
        "relay logged errors:\n{}",
        relay.log_text()
    );
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn publication_with_inserts_only() {
    only_inserts_are_published("filters_insert", false, Broker::default_for_tests()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn publication_with_every_operation_relay_ignores_non_inserts() {
    only_inserts_are_published("filters_all", true, Broker::default_for_tests()).await;
}
