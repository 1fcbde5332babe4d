//! The inbox's rules against a real PostgreSQL: a key applies once (redelivery, racing
//! consumers), versions at or below the last applied are skipped, a gap is held (or
//! applied when asked), a failed change records nothing, and records are read from
//! outboxd's headers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use outboxd_inbox::{
    Apply, BoxError, GapPolicy, Inbox, InboxError, InboxEvent, Outcome, Positions,
};
use pgtest::PgCluster;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
use tokio_postgres::{Client, Transaction};

/// The consumer's own change: add the event's amount (its payload) to the balance of the
/// account (its aggregate id).
struct Credit {
    fail: bool,
}

impl Apply for Credit {
    type Output = i64;

    async fn apply(&mut self, tx: &Transaction<'_>, event: &InboxEvent) -> Result<i64, BoxError> {
        let amount: i64 = std::str::from_utf8(event.payload.as_deref().unwrap_or(b"0"))?.parse()?;
        let account = event.aggregate_id.clone().unwrap_or_default();
        let row = tx
            .query_one(
                "INSERT INTO balances (account, balance) VALUES ($1, $2) \
                 ON CONFLICT (account) DO UPDATE SET balance = balances.balance + $2 \
                 RETURNING balance",
                &[&account, &amount],
            )
            .await?;
        if self.fail {
            return Err("the handler failed after writing".into());
        }
        Ok(row.get(0))
    }
}

fn event(key: &str, account: &str, version: Option<i64>, amount: i64) -> InboxEvent {
    InboxEvent {
        key: key.to_owned(),
        event_id: format!("id-{key}"),
        aggregate_type: Some("account".into()),
        aggregate_id: Some(account.to_owned()),
        version,
        event_type: Some("Credited".into()),
        topic: "outbox.account".into(),
        partition: 0,
        offset: 0,
        payload: Some(amount.to_string().into_bytes()),
    }
}

async fn setup(name: &str) -> (pgtest::TestDb<'static>, Client) {
    let db = PgCluster::shared().fresh_database(name).await;
    let mut client = db.client().await;
    Inbox::install(&mut client).await.unwrap();
    client
        .batch_execute("CREATE TABLE balances (account text PRIMARY KEY, balance bigint NOT NULL)")
        .await
        .unwrap();
    (db, client)
}

async fn balance(client: &Client, account: &str) -> Option<i64> {
    client
        .query_opt(
            "SELECT balance FROM balances WHERE account = $1",
            &[&account],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

async fn keys(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM inbox_processed", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_applies_once_and_versions_apply_in_order() {
    let (_db, mut client) = setup("inbox_rules").await;
    let inbox = Inbox::new("balances");
    let mut credit = Credit { fail: false };

    let e1 = event("k1", "acct-1", Some(1), 10);
    assert_eq!(
        inbox.process(&mut client, &e1, &mut credit).await.unwrap(),
        Outcome::Applied(10)
    );
    // Redelivered (a relay crash, a rebalance): skipped, counted once.
    let again = inbox.process(&mut client, &e1, &mut credit).await.unwrap();
    assert_eq!(again, Outcome::Duplicate);
    assert!(again.commit_offset());
    assert_eq!(balance(&client, "acct-1").await, Some(10));

    // A different key for a version already applied: stale, recorded, skipped.
    let stale = event("k1-bis", "acct-1", Some(1), 99);
    assert_eq!(
        inbox
            .process(&mut client, &stale, &mut credit)
            .await
            .unwrap(),
        Outcome::Stale { known: 1, got: 1 }
    );
    assert_eq!(
        inbox
            .process(&mut client, &stale, &mut credit)
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(balance(&client, "acct-1").await, Some(10));

    // Version 3 before 2: a gap, held: nothing applied, nothing recorded, offset kept.
    let e3 = event("k3", "acct-1", Some(3), 300);
    let gap = inbox.process(&mut client, &e3, &mut credit).await.unwrap();
    assert_eq!(gap, Outcome::Gap { known: 1, got: 3 });
    assert!(!gap.commit_offset());
    assert_eq!(balance(&client, "acct-1").await, Some(10));
    assert_eq!(keys(&client).await, 2);
    // Once 2 arrives (repaired), 3 applies.
    let e2 = event("k2", "acct-1", Some(2), 20);
    assert_eq!(
        inbox.process(&mut client, &e2, &mut credit).await.unwrap(),
        Outcome::Applied(30)
    );
    assert_eq!(
        inbox.process(&mut client, &e3, &mut credit).await.unwrap(),
        Outcome::Applied(330)
    );
    // Version 2 again under a new key: stale.
    assert_eq!(
        inbox
            .process(
                &mut client,
                &event("k2-late", "acct-1", Some(2), 5),
                &mut credit
            )
            .await
            .unwrap(),
        Outcome::Stale { known: 3, got: 2 }
    );
    assert_eq!(balance(&client, "acct-1").await, Some(330));

    // Aggregates are independent; the first version seen applies whatever it is.
    assert_eq!(
        inbox
            .process(&mut client, &event("o7", "acct-2", Some(7), 1), &mut credit)
            .await
            .unwrap(),
        Outcome::Applied(1)
    );
    // With GapPolicy::Apply (full-state events) a gap applies.
    let lenient = Inbox::new("balances").on_gap(GapPolicy::Apply);
    assert_eq!(
        lenient
            .process(&mut client, &event("o9", "acct-2", Some(9), 1), &mut credit)
            .await
            .unwrap(),
        Outcome::Applied(2)
    );
    // Another consumer name has its own keys and versions.
    let other = Inbox::new("audit");
    assert_eq!(
        other.process(&mut client, &e1, &mut credit).await.unwrap(),
        Outcome::Applied(340)
    );
    // Unversioned events: the key alone decides.
    let plain = event("p1", "acct-3", None, 5);
    assert_eq!(
        inbox
            .process(&mut client, &plain, &mut credit)
            .await
            .unwrap(),
        Outcome::Applied(5)
    );
    assert_eq!(
        inbox
            .process(&mut client, &plain, &mut credit)
            .await
            .unwrap(),
        Outcome::Duplicate
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_change_records_nothing() {
    let (_db, mut client) = setup("inbox_fail").await;
    let inbox = Inbox::new("balances");
    let e = event("k", "acct", Some(1), 10);
    let err = inbox
        .process(&mut client, &e, &mut Credit { fail: true })
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Apply(_)), "{err}");
    assert_eq!(balance(&client, "acct").await, None, "rolled back");
    assert_eq!(keys(&client).await, 0);
    // The retry applies it.
    assert_eq!(
        inbox
            .process(&mut client, &e, &mut Credit { fail: false })
            .await
            .unwrap(),
        Outcome::Applied(10)
    );
}

/// Two consumers get the same events at once (a rebalance): each applies exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn racing_consumers_apply_each_event_once() {
    let (db, _client) = setup("inbox_race").await;
    let events: Vec<InboxEvent> = (1..=50)
        .map(|v| event(&format!("k{v}"), "acct", Some(v), 1))
        .collect();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut client = db.client().await;
        let events = events.clone();
        tasks.push(tokio::spawn(async move {
            let inbox = Inbox::new("balances");
            let mut applied = 0;
            for e in &events {
                if let Outcome::Applied(_) = inbox
                    .process(&mut client, e, &mut Credit { fail: false })
                    .await
                    .unwrap()
                {
                    applied += 1;
                }
            }
            applied
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let client = db.client().await;
    assert_eq!(total, 50, "each event applied by one of the two");
    assert_eq!(balance(&client, "acct").await, Some(50));
    assert_eq!(keys(&client).await, 50);
}

fn record(headers: &[(&str, &str)], key: Option<&str>) -> OwnedMessage {
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    OwnedMessage::new(
        Some(b"{}".to_vec()),
        key.map(|k| k.as_bytes().to_vec()),
        "outbox.account".into(),
        Timestamp::NotAvailable,
        2,
        41,
        Some(h),
    )
}

#[test]
fn events_are_read_from_outboxd_headers() {
    let inbox = Inbox::new("c");
    let e = inbox
        .event(&record(
            &[
                ("idempotency_key", "pay:7"),
                ("version", "3"),
                ("id", "e-1"),
                ("event_type", "Credited"),
                ("aggregate_type", "account"),
            ],
            Some("acct-1"),
        ))
        .unwrap();
    assert_eq!(e.key, "pay:7");
    assert_eq!(e.event_id, "e-1");
    assert_eq!(e.version, Some(3));
    assert_eq!(e.aggregate_type.as_deref(), Some("account"));
    assert_eq!(e.aggregate_id.as_deref(), Some("acct-1"));
    assert_eq!((e.partition, e.offset), (2, 41));
    // No idempotency key: the event id is the key; no version: unversioned.
    let e = inbox.event(&record(&[("id", "e-2")], Some("a"))).unwrap();
    assert_eq!((e.key.as_str(), e.version), ("e-2", None));
    // The last header of a name wins (outboxd's come after the row's).
    let e = inbox
        .event(&record(&[("id", "row's"), ("id", "outboxd's")], None))
        .unwrap();
    assert_eq!(e.event_id, "outboxd's");
    for (headers, needle) in [
        (vec![("version", "1")], "no id header"),
        (
            vec![("id", "e"), ("version", "three")],
            "not a whole number",
        ),
    ] {
        let err = inbox.event(&record(&headers, None)).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}

/// A mock cluster with the one-partition topic `outbox.account`.
fn mock_cluster(
) -> rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
    cluster.create_topic("outbox.account", 1, 1).unwrap();
    cluster
}

/// Sends (record key, event id, version, amount as the payload) records to
/// `outbox.account`, in order.
fn produce(bootstrap: &str, records: &[(&str, &str, i64, i64)]) {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let producer: ThreadedProducer<_> = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for (key, id, version, amount) in records {
        let version = version.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "version",
                value: Some(version.as_bytes()),
            })
            .insert(Header {
                key: "id",
                value: Some(id.as_bytes()),
            });
        let amount = amount.to_string();
        producer
            .send(
                BaseRecord::to("outbox.account")
                    .key(*key)
                    .payload(&amount)
                    .headers(headers),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(std::time::Duration::from_secs(10)).unwrap();
}

/// A consumer of `group` on `outbox.account`, assigned (not subscribed: the group's
/// committed offset without waiting for a rebalance to hand the partition over).
fn assigned_consumer(
    bootstrap: &str,
    group: &str,
    extra: &[(&str, &str)],
) -> rdkafka::consumer::StreamConsumer {
    use rdkafka::consumer::Consumer;
    let mut config = outboxd_inbox::consumer_config(bootstrap, group);
    config.set("auto.commit.interval.ms", "100");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    let c: rdkafka::consumer::StreamConsumer = config.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("outbox.account", 0, rdkafka::Offset::Stored)
        .unwrap();
    c.assign(&tpl).unwrap();
    c
}

/// The next record, within a deadline.
async fn next(c: &rdkafka::consumer::StreamConsumer) -> rdkafka::message::OwnedMessage {
    tokio::time::timeout(std::time::Duration::from_secs(30), c.recv())
        .await
        .expect("a record within 30 s")
        .unwrap()
        .detach()
}

/// Through Kafka (librdkafka's mock cluster): [`Inbox::handle`] applies each record once
/// and stores the offset past it for librdkafka's periodic commit, so a consumer of the
/// same group that starts later reads only what is left; a record redelivered anyway (a
/// re-sent event) is skipped.
#[tokio::test(flavor = "multi_thread")]
async fn handle_commits_the_offset_after_the_database() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::Message;
    use std::time::Duration;

    let (_db, mut client) = setup("inbox_kafka").await;
    let cluster = mock_cluster();
    let bootstrap = cluster.bootstrap_servers();
    // Versions 1, 2, 3 and a re-send of version 2 (same id), as outboxd does after a crash.
    produce(
        &bootstrap,
        &[
            ("acct", "e1", 1, 10),
            ("acct", "e2", 2, 20),
            ("acct", "e3", 3, 30),
            ("acct", "e2", 2, 20),
        ],
    );
    let consumer = |group: &str| assigned_consumer(&bootstrap, group, &[]);
    let inbox = Inbox::new("balances");
    let mut credit = Credit { fail: false };
    let mut positions = Positions::default();
    let first = consumer("g");
    let mut outcomes = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // Read the first two records only, then "crash" (drop the consumer).
    while outcomes.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "{outcomes:?}");
        let Ok(m) = tokio::time::timeout(Duration::from_millis(200), first.recv()).await else {
            continue;
        };
        let m = m.unwrap();
        outcomes.push(
            inbox
                .handle(&mut client, &first, &mut positions, &m, &mut credit)
                .await
                .unwrap()
                .remove(0)
                .outcome,
        );
    }
    assert_eq!(outcomes, [Outcome::Applied(10), Outcome::Applied(30)]);
    // librdkafka commits the stored offset on its timer: wait for it.
    let committed_past = |c: &StreamConsumer| -> Option<i64> {
        let tpl = c.committed(Duration::from_secs(5)).ok()?;
        tpl.elements().first().and_then(|e| e.offset().to_raw())
    };
    while committed_past(&first) != Some(2) {
        assert!(std::time::Instant::now() < deadline, "offset not committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    // A new consumer is a new place in the partitions.
    let mut positions = Positions::default();

    // The group resumes after the committed offset: e3, then the re-sent e2 (skipped).
    let second = consumer("g");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut offsets = Vec::new();
    while outcomes.len() < 4 {
        assert!(std::time::Instant::now() < deadline, "{outcomes:?}");
        let Ok(m) = tokio::time::timeout(Duration::from_millis(200), second.recv()).await else {
            continue;
        };
        let m = m.unwrap();
        offsets.push(m.offset());
        outcomes.push(
            inbox
                .handle(&mut client, &second, &mut positions, &m, &mut credit)
                .await
                .unwrap()
                .remove(0)
                .outcome,
        );
    }
    assert_eq!(offsets, [2, 3]);
    assert_eq!(outcomes[2..], [Outcome::Applied(60), Outcome::Duplicate]);
    assert_eq!(balance(&client, "acct").await, Some(60));
}

/// Retention: [`Inbox::prune`] deletes this consumer's keys older than the window, in
/// batches, oldest first, and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn prune_deletes_old_keys_of_one_consumer_in_batches() {
    use std::time::Duration;
    let (_db, mut client) = setup("inbox_prune").await;
    let inbox = Inbox::new("balances");
    let mut credit = Credit { fail: false };
    for k in ["old1", "old2", "old3", "new"] {
        inbox
            .process(&mut client, &event(k, "acct", None, 1), &mut credit)
            .await
            .unwrap();
    }
    Inbox::new("audit")
        .process(
            &mut client,
            &event("old-audit", "acct", None, 1),
            &mut credit,
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE inbox_processed SET processed_at = now() - interval '15 days' \
             WHERE key LIKE 'old%'",
            &[],
        )
        .await
        .unwrap();
    let keep = Duration::from_secs(14 * 86_400);
    assert_eq!(inbox.prune(&client, keep, 2).await.unwrap(), 2);
    assert_eq!(inbox.prune(&client, keep, 2).await.unwrap(), 1);
    assert_eq!(inbox.prune(&client, keep, 2).await.unwrap(), 0);
    let left: Vec<String> = client
        .query("SELECT key FROM inbox_processed ORDER BY key", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        ["new", "old-audit"],
        "recent keys and other consumers' stay"
    );
    // A window of nothing would forget every key: refused, in Rust and in SQL.
    let err = inbox.prune(&client, Duration::ZERO, 10).await.unwrap_err();
    assert!(matches!(err, InboxError::Retention(_)), "{err}");
    let err = client
        .query_one("SELECT public.inbox_prune('balances', interval '0')", &[])
        .await
        .unwrap_err();
    assert!(
        err.as_db_error()
            .is_some_and(|e| e.message().contains("must be a positive interval")),
        "{err:?}"
    );
}

/// A held gap in a real consumer: the stored (and so committed) offset stays at the held
/// record while later records of other aggregates apply; the missing version releases
/// the held ones in order and the offset moves past them all. A consumer that stores
/// offsets itself, and too many held records, are errors that name the fix.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_gap_keeps_the_stored_offset_at_it() {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    use std::time::{Duration, Instant};

    let (_db, mut client) = setup("inbox_held").await;
    let cluster = mock_cluster();
    let bootstrap = cluster.bootstrap_servers();
    produce(
        &bootstrap,
        &[
            ("acct", "a1", 1, 10),
            ("acct", "a3", 3, 30),
            ("other", "o1", 1, 1),
            ("acct", "a4", 4, 40),
            ("acct", "a2", 2, 20),
        ],
    );
    let consumer = assigned_consumer(&bootstrap, "g", &[]);
    let inbox = Inbox::new("balances");
    let mut positions = Positions::default();
    let mut credit = Credit { fail: false };
    let committed = |c: &rdkafka::consumer::StreamConsumer| -> Option<i64> {
        let tpl = c.committed(Duration::from_secs(5)).ok()?;
        tpl.elements().first().and_then(|e| e.offset().to_raw())
    };
    let wait_committed = |want: i64| {
        let consumer = &consumer;
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while committed(consumer) != Some(want) {
                assert!(
                    Instant::now() < deadline,
                    "committed {:?}, want {want}",
                    committed(consumer)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut seen = Vec::new();
    for _ in 0..4 {
        let m = next(&consumer).await;
        let handled = inbox
            .handle(&mut client, &consumer, &mut positions, &m, &mut credit)
            .await
            .unwrap();
        let outcomes: Vec<_> = handled.into_iter().map(|h| h.outcome).collect();
        seen.push((
            m.offset(),
            outcomes,
            positions.committable("outbox.account", 0),
        ));
    }
    assert_eq!(
        seen,
        [
            (0, vec![Outcome::Applied(10)], Some(1)),
            (1, vec![Outcome::Gap { known: 1, got: 3 }], Some(1)),
            (2, vec![Outcome::Applied(1)], Some(1)),
            (3, vec![Outcome::Gap { known: 1, got: 4 }], Some(1)),
        ]
    );
    let held: Vec<i64> = positions
        .held("outbox.account", 0)
        .iter()
        .map(|e| e.offset)
        .collect();
    assert_eq!(held, [1, 3]);
    // librdkafka's periodic commit goes no further than the held record.
    wait_committed(1).await;
    assert_eq!(balance(&client, "acct").await, Some(10));

    // Version 2 arrives: it applies, then 3 and 4, in order; the offset passes them all.
    let m = next(&consumer).await;
    let handled = inbox
        .handle(&mut client, &consumer, &mut positions, &m, &mut credit)
        .await
        .unwrap();
    let order: Vec<_> = handled
        .iter()
        .map(|h| (h.event.offset, h.outcome.clone()))
        .collect();
    assert_eq!(
        order,
        [
            (4, Outcome::Applied(30)),
            (1, Outcome::Applied(60)),
            (3, Outcome::Applied(100)),
        ]
    );
    assert!(positions.held("outbox.account", 0).is_empty());
    assert_eq!(positions.committable("outbox.account", 0), Some(5));
    wait_committed(5).await;
    drop(consumer);

    // librdkafka storing offsets itself would commit past held records: refused.
    let auto = assigned_consumer(&bootstrap, "auto", &[("enable.auto.offset.store", "true")]);
    let m = next(&auto).await;
    let err = Inbox::new("auto")
        .handle(
            &mut client,
            &auto,
            &mut Positions::default(),
            &m,
            &mut credit,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::AutoOffsetStore), "{err}");
    assert!(
        err.to_string().contains("enable.auto.offset.store=false"),
        "{err}"
    );

    // Held records live in memory: past the limit, an error naming the first of them.
    let tight = Inbox::new("tight").with_max_held(1);
    let c = assigned_consumer(&bootstrap, "tight", &[]);
    let mut positions = Positions::default();
    let err = loop {
        let m = next(&c).await;
        match tight
            .handle(&mut client, &c, &mut positions, &m, &mut credit)
            .await
        {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            InboxError::TooManyHeld {
                held: 2,
                first_offset: 1,
                version: 3,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("with_max_held"), "{err}");
}
