//! A transaction open in an event partition before the relay's first records there, not
//! one this process aborted: the relay commits over it (docs/transactional-mode.md, "A
//! transaction Kafka left open"). Its check reads the partition's last stable offset
//! before the session's first commit there; only a span this process proved aborted makes
//! it abort instead.

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::{assert_exactly_once, wait_confirmed_while_running, EXACTLY_ONCE};
use crate::support;
use support::load::insert_events;
use support::scenario::Scenario;
use support::schema;

/// Another producer's transaction, open in every event partition (one record each) before
/// the relay starts. The relay's first commit finds it below its own records, does not
/// wait for it or abort, and commits: the slot is confirmed past the events while that
/// transaction is still open (read_committed consumers wait for it, as for any open
/// transaction). Once it is aborted, every event is there exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn another_producers_open_transaction_does_not_hold_the_relay() {
    let s = Scenario::new("eos_left_open").partitions(1).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let other: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", format!("left-open-{}", outbox.slot))
        .set("transaction.timeout.ms", "300000")
        .create()
        .expect("a transactional producer");
    tokio::task::block_in_place(|| {
        other
            .init_transactions(Duration::from_secs(60))
            .expect("init_transactions");
        other.begin_transaction().expect("begin_transaction");
        for topic in topics {
            other
                .send(
                    BaseRecord::to(topic)
                        .partition(0)
                        .key("other")
                        .payload("{}"),
                )
                .map_err(|(e, _)| e)
                .expect("send");
        }
        other.flush(Duration::from_secs(30)).expect("flush");
    });
    let mut relay = s.relay(&[
        EXACTLY_ONCE,
        ("OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS", "3000"),
    ]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let events = insert_events(&client, &outbox.table, 200, 10, 20).await;
    let wal_after = schema::current_wal_lsn(db).await;
    wait_confirmed_while_running(&mut relay, db, wal_after).await;
    assert!(
        relay
            .metric("outboxd_kafka_transactions_committed_total")
            .unwrap_or(0.0)
            >= 1.0,
        "committed while the other transaction is open"
    );
    assert_eq!(
        relay
            .metric_series("outboxd_kafka_transactions_aborted_total{cause=\"abortable\"}")
            .unwrap_or(0.0),
        0.0,
        "aborted over another producer's transaction"
    );
    // What an operator sees of it: the commits made in doubt over it, counted.
    assert!(
        relay
            .metric("outboxd_kafka_partitions_committed_in_doubt_total")
            .unwrap_or(0.0)
            >= 1.0,
        "the doubt is counted"
    );
    tokio::task::block_in_place(|| other.abort_transaction(Duration::from_secs(30)))
        .expect("the other producer's abort");
    assert_exactly_once(
        bootstrap,
        topics,
        &events,
        "after an older open transaction ended",
    );
    relay.kill();
}
