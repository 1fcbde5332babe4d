//! Taking over from a polling relay (issue 32): a poller built on another Kafka client
//! placed each aggregate with its client's default partitioner; outboxd, set to the same
//! partitioner, must put the aggregate's next events on the same partition, or a consumer
//! sees them out of order across the switch. Seed 004's shape: `order` aggregates with
//! OrderCreated written by the poller, then OrderPaid relayed by outboxd.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use pgtest::PgCluster;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use support::broker::Broker;
use support::consume::check_delivery;
use support::load::{insert_batch, Event};
use support::ops::{read_all_blocking, wait_active_pid};
use support::relay::Relay;
use support::schema;

const AGGREGATES: usize = 20;
const PARTITIONS: i32 = 6;

fn order_events(event_type: &str, amount: u32) -> Vec<Event> {
    (0..AGGREGATES)
        .map(|a| Event {
            id: uuid::Uuid::new_v4().to_string(),
            aggregate_type: "order".into(),
            aggregate_id: format!("order-{}", 1001 + a),
            event_type: event_type.into(),
            payload: format!(
                "{{\"amount\": {}, \"currency\": \"KRW\", \"orderId\": \"order-{}\"}}",
                amount + u32::try_from(a).unwrap(),
                1001 + a
            ),
        })
        .collect()
}

/// The poller: a plain librdkafka producer with `partitioner`, keyed by aggregate id,
/// with the `id` header outboxd also sets. Returns once every record is acked.
fn poller_publish(bootstrap: &str, topic: &str, partitioner: &str, events: &[Event]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", partitioner)
        .set("enable.idempotence", "true")
        .create()
        .expect("poller producer");
    for e in events {
        let headers = OwnedHeaders::new().insert(Header {
            key: "id",
            value: Some(e.id.as_bytes()),
        });
        producer
            .send(
                BaseRecord::to(topic)
                    .key(e.aggregate_id.as_bytes())
                    .payload(e.payload.as_bytes())
                    .headers(headers),
            )
            .map_err(|(err, _)| err)
            .expect("poller send");
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("poller records acked");
}

/// Each aggregate's partitions among `received` records of `topic`.
fn partitions_by_aggregate(
    received: &[support::consume::Received],
    ids: &BTreeSet<&str>,
) -> BTreeMap<String, BTreeSet<i32>> {
    let mut by_agg: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for r in received {
        if r.header("id").is_some_and(|id| ids.contains(id)) {
            by_agg
                .entry(r.key_str().to_owned())
                .or_default()
                .insert(r.partition);
        }
    }
    by_agg
}

/// Poller with `partitioner` writes OrderCreated; outboxd, set to the same partitioner
/// (`None`: its default), relays OrderPaid. Returns each aggregate's partition before
/// the handover, after asserting that none moved.
async fn handover(name: &str, partitioner: &str, outboxd: Option<&str>) -> BTreeMap<String, i32> {
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let topic = outbox.topic("order");
    broker
        .create_topics(&[&topic, &outbox.dead_letter_topic()], PARTITIONS)
        .await;
    let topics = vec![topic.clone()];

    let created = order_events("OrderCreated", 10_000);
    tokio::task::block_in_place(|| {
        poller_publish(&broker.bootstrap(), &topic, partitioner, &created);
    });

    let extra: Vec<(&str, &str)> = outboxd
        .map(|p| vec![("OUTBOXD_KAFKA_PARTITIONER", p)])
        .unwrap_or_default();
    let relay = Relay::start(
        Relay::env_for(&db, &outbox, &broker.bootstrap(), &extra),
        &["run"],
    );
    let client = db.client().await;
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(60)).await;
    let paid = order_events("OrderPaid", 20_000);
    insert_batch(&client, &outbox.table, &paid).await;

    let all = [created.clone(), paid.clone()].concat();
    let received = read_all_blocking(&broker.bootstrap(), &topics, &all, Duration::from_secs(60));
    drop(relay);

    let before =
        partitions_by_aggregate(&received, &created.iter().map(|e| e.id.as_str()).collect());
    let after = partitions_by_aggregate(&received, &paid.iter().map(|e| e.id.as_str()).collect());
    let moved: Vec<String> = before
        .iter()
        .filter(|(agg, p)| after.get(*agg) != Some(*p))
        .map(|(agg, p)| format!("{agg}: {p:?} -> {:?}", after.get(agg)))
        .collect();
    assert!(
        moved.is_empty(),
        "{} of {AGGREGATES} aggregates moved partition at the handover from a {partitioner} poller: {moved:?}",
        moved.len()
    );
    // Each aggregate's OrderCreated comes before its OrderPaid on its one partition.
    check_delivery(&all, &received);
    before
        .into_iter()
        .map(|(agg, p)| (agg, p.into_iter().next().expect("a partition")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_murmur2_and_a_crc32_poller_hand_over_without_moving_an_aggregate() {
    // Java clients (and franz-go, kafka-python, kafkajs): murmur2; outboxd's default.
    let java = handover("handover_murmur2", "murmur2_random", None).await;
    // confluent-kafka-python/-go/-dotnet: librdkafka's default, CRC32.
    let crc32 = handover(
        "handover_crc32",
        "consistent_random",
        Some("consistent_random"),
    )
    .await;
    // The two pollers disagree for most aggregates: what a mismatched partitioner would
    // have moved, so the test above can tell a wrong setting from a right one.
    let differ = java
        .iter()
        .filter(|(agg, p)| crc32.get(*agg) != Some(*p))
        .count();
    assert!(differ > AGGREGATES / 3, "only {differ} aggregates differ");
    eprintln!("murmur2 and CRC32 placed {differ} of {AGGREGATES} aggregates differently");
}
