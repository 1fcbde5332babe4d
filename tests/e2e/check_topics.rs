//! `outboxd check` and the topics the relay will write: every topic the template renders
//! from the rows now in the table, the dead-letter topic and the progress topic, asked of
//! the brokers without creating any (issue 30 item 11).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::load::{insert_batch, Event};
use support::ops;
use support::relay::{run_to_end, Relay};
use support::schema;

fn event(aggregate_type: &str, n: usize) -> Event {
    Event {
        id: uuid::Uuid::new_v4().to_string(),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: format!("agg-{n}"),
        event_type: "Created".into(),
        payload: format!("{{\"n\": {n}}}"),
    }
}

fn fail_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("FAIL")).collect()
}

/// Rows of aggregate types A and B, topic A exists and B does not (the shared broker does
/// not create topics): check fails naming B only; once B is created as the line says,
/// check passes and `run` relays every row.
#[tokio::test(flavor = "multi_thread")]
async fn check_names_a_missing_event_topic_then_run_relays_everything() {
    let db = PgCluster::shared().fresh_database("check_topics").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let (a, b) = (outbox.topic("A"), outbox.topic("B"));
    broker
        .create_topics(&[&a, &outbox.dead_letter_topic()], 2)
        .await;
    let client = db.client().await;
    let events: Vec<Event> = (0..20)
        .map(|n| event(if n % 2 == 0 { "A" } else { "B" }, n))
        .collect();
    insert_batch(&client, "public.outbox", &events).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let fails = fail_lines(&out);
    assert_eq!(fails.len(), 1, "one FAIL, for the missing topic:\n{out}");
    assert!(fails[0].contains(&b), "names {b}:\n{out}");
    assert!(
        !fails[0].contains(&format!("{a} ")) && !fails[0].contains(&format!("{a},")),
        "does not name {a}, which exists:\n{out}"
    );
    assert!(fails[0].contains("create each"), "says the fix:\n{out}");
    assert!(
        !broker.topic_names().contains(&b),
        "check created {b}:\n{out}"
    );

    // The fix the line names.
    broker.create_topics(&[&b], 2).await;
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");

    let mut relay = Relay::start(env, &["run"]);
    let report = ops::read_and_check(
        &broker,
        &[a.clone(), b.clone()],
        &events,
        Duration::from_secs(60),
    );
    relay.kill();
    // read_and_check asserts every event arrived (0 lost) and in order per aggregate.
    assert_eq!(report.unique, events.len(), "events lost");
}

/// With the dead-letter policy, a missing dead-letter topic fails check (the relay would
/// stop at the first bad row); with `stop` it is not needed.
#[tokio::test(flavor = "multi_thread")]
async fn check_fails_on_a_missing_dead_letter_topic() {
    let db = PgCluster::shared().fresh_database("check_topics_dlq").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::default_for_tests();
    let dlq = outbox.dead_letter_topic();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let fails = fail_lines(&out);
    assert_eq!(fails.len(), 1, "{out}");
    assert!(fails[0].contains(&dlq), "names {dlq}:\n{out}");

    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_BAD_ROW_POLICY", "stop")],
    );
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
    assert!(!broker.topic_names().contains(&dlq), "{out}");
}

/// check asks for metadata of all topics at once and creates nothing: not the missing
/// event or dead-letter topic, nor a missing progress topic. Brokers that do not create
/// topics: each missing one fails the check.
#[tokio::test(flavor = "multi_thread")]
async fn check_creates_no_topic() {
    let out = check_leaves_topics_alone(&Broker::default_for_tests(), "check_topics_none", 6).await;
    assert_eq!(
        fail_lines(&out).len(),
        2,
        "event and dead-letter topic:\n{out}"
    );
}

/// On brokers that create a topic when a client asks for its metadata
/// (`auto.create.topics.enable=true`), check still creates none, and a missing topic is
/// a warning: the relay's first write creates it.
#[tokio::test(flavor = "multi_thread")]
async fn check_creates_no_topic_on_an_auto_creating_broker() {
    let broker = Broker::kafka_auto_creating(1);
    let out = check_leaves_topics_alone(&broker, "check_topics_auto", 0).await;
    let warned: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("warn  event topics") || l.starts_with("warn  dead-letter topic"))
        .collect();
    assert_eq!(warned.len(), 2, "{out}");
    assert!(
        warned
            .iter()
            .all(|l| l.contains("auto.create.topics.enable=true")),
        "{out}"
    );
}

/// Runs check with a row of type A and no topic at all (progress topic included); returns
/// its output after asserting the exit code and that the brokers list none of the topics.
async fn check_leaves_topics_alone(broker: &Broker, name: &str, code_wanted: i32) -> String {
    let db = PgCluster::shared().fresh_database(name).await;
    let outbox = schema::setup(&db).await;
    let client = db.client().await;
    insert_batch(&client, "public.outbox", &[event("A", 0)]).await;
    let progress = format!("{}.progress", outbox.topic_prefix);
    let env = Relay::env_for(
        &db,
        &outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_PROGRESS_TOPIC", progress.as_str())],
    );
    let (code, out) = run_to_end(&env, &["check"]);
    let after = broker.topic_names();
    for topic in [&outbox.topic("A"), &outbox.dead_letter_topic(), &progress] {
        assert!(!after.contains(topic), "check created {topic}:\n{out}");
    }
    assert_eq!(code, code_wanted, "{out}");
    out
}
