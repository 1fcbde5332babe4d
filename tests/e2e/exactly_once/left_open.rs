//! A transaction open in an event partition before the relay's first records there. The
//! relay must not commit past it: a commit marker of the relay's own producer id would make
//! visible any records of it that Kafka left open after answering that they were aborted
//! (docs/transactional-mode.md, "A transaction Kafka left open"). Another producer's open
//! transaction stands in for such records: the relay cannot tell them apart by offsets.

use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::{assert_exactly_once, wait_confirmed_while_running, EXACTLY_ONCE};
use crate::support;
use support::load::insert_events;
use support::scenario::Scenario;
use support::schema;

/// A transaction opened by another producer in every event partition (one record each)
/// before the relay starts: each session's commit finds it open below its own records,
/// waits for it until nine tenths of `transaction.timeout.ms`, and aborts instead of
/// committing, so nothing is confirmed. Once that transaction is aborted, the next session
/// commits: every event exactly once in read_committed, the slot confirmed past them.
#[tokio::test(flavor = "multi_thread")]
async fn an_older_open_transaction_in_a_partition_holds_the_commit_until_it_ends() {
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
    let aborted = "outboxd_kafka_transactions_aborted_total{cause=\"abortable\"}";
    support::ops::wait_for(
        "two sessions' commits aborted for the open transaction",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async { (relay.metric_series(aborted).unwrap_or(0.0) >= 2.0).then_some(()) },
    )
    .await;
    assert!(
        schema::confirmed_flush_lsn(db).await < wal_after,
        "the slot was confirmed past events whose Kafka transaction was not committed"
    );
    assert_eq!(
        relay
            .metric("outboxd_kafka_transactions_committed_total")
            .unwrap_or(0.0),
        0.0,
        "a commit past the open transaction"
    );
    assert!(relay.is_running(), "{}", relay.log_text());
    tokio::task::block_in_place(|| other.abort_transaction(Duration::from_secs(30)))
        .expect("the other producer's abort");
    wait_confirmed_while_running(&mut relay, db, wal_after).await;
    assert_exactly_once(
        bootstrap,
        topics,
        &events,
        "after an older open transaction ended",
    );
    relay.kill();
}
