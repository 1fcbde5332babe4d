//! `outboxd init --backfill`: adopting outboxd from a polling relay (the outbox of
//! seed 004: a `status` column a `SELECT … FOR UPDATE SKIP LOCKED` poller sets to
//! 'published'). The rows still pending when the poller stops are published from the new
//! slot's snapshot, then the slot streams the rest: nothing lost, nothing reordered, and
//! nothing committed after the slot published twice, even when the back-fill is killed
//! and resumed as the relay says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pgtest::{PgCluster, TestDb};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use support::consume::Received;
use support::load::{Event, EVENT_COLUMNS};
use support::ops::{self, read_all_blocking, wait_active_pid, LoadGen, LoadShape};
use support::relay::{run_to_end, Relay};
use support::schema::{self, Outbox};

/// Seed 004's outbox: the default columns plus the poller's bookkeeping.
const POLLER_DDL: &str = "
CREATE TABLE public.outbox (
    id             uuid        PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NULL,
    status         text        NOT NULL DEFAULT 'pending',
    retry_count    int         NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz NULL
);
CREATE INDEX outbox_pending ON public.outbox (created_at) WHERE status = 'pending';";

const CONDITION: &str = "status = 'pending'";

/// The table and its publication; no slot (`init` makes it).
async fn poller_outbox(db: &TestDb<'_>, broker: &support::broker::Broker) -> (Outbox, Vec<String>) {
    let client = db.client().await;
    client.batch_execute(POLLER_DDL).await.expect("table");
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            db.publication
        ))
        .await
        .expect("publication");
    let outbox = Outbox::for_db(db);
    let topics = ops::create_topics(broker, &outbox).await;
    (outbox, topics)
}

/// A polling relay as seed 004 describes it: lock a batch of pending rows (SKIP LOCKED),
/// publish them keyed by aggregate id (murmur2, as Java clients and outboxd partition),
/// mark them published, commit. Stopped, it finishes the batch in hand.
struct Poller {
    stop: Arc<AtomicBool>,
    published: Arc<AtomicUsize>,
    handle: tokio::task::JoinHandle<()>,
}

impl Poller {
    fn spawn(conn: String, bootstrap: String, outbox: Outbox) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicUsize::new(0));
        let (stopped, count) = (Arc::clone(&stop), Arc::clone(&published));
        let handle = tokio::spawn(async move {
            let producer: FutureProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("enable.idempotence", "true")
                .set("partitioner", "murmur2_random")
                .create()
                .expect("poller producer");
            let mut client = ops::connect(&conn).await;
            while !stopped.load(Ordering::Relaxed) {
                let txn = client.transaction().await.expect("begin");
                let rows = txn
                    .query(
                        &format!(
                            "SELECT {EVENT_COLUMNS} FROM public.outbox WHERE status = 'pending' \
                             ORDER BY created_at, id LIMIT 25 FOR UPDATE SKIP LOCKED"
                        ),
                        &[],
                    )
                    .await
                    .expect("poll");
                let events: Vec<Event> = rows.iter().map(Event::from_row).collect();
                for e in &events {
                    let topic = outbox.topic(&e.aggregate_type);
                    let headers =
                        rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
                            key: "id",
                            value: Some(e.id.as_str()),
                        });
                    producer
                        .send(
                            FutureRecord::to(&topic)
                                .key(&e.aggregate_id)
                                .payload(&e.payload)
                                .headers(headers),
                            Duration::from_secs(30),
                        )
                        .await
                        .expect("poller publish");
                }
                let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
                txn.execute(
                    "UPDATE public.outbox SET status = 'published', published_at = now() \
                     WHERE id = ANY($1::text[]::uuid[])",
                    &[&ids],
                )
                .await
                .expect("mark published");
                txn.commit().await.expect("commit");
                count.fetch_add(events.len(), Ordering::Relaxed);
                // A poller's interval: rows wait pending between polls.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            drop(client.batch_execute("SELECT 1").await);
        });
        Poller {
            stop,
            published,
            handle,
        }
    }

    fn published(&self) -> usize {
        self.published.load(Ordering::Relaxed)
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.await.expect("poller task");
    }
}

/// What a consumer that dedups by event id sees of `committed` in `received`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    lost: usize,
    duplicates: usize,
    /// First arrivals of an aggregate that came after a later event of that aggregate.
    reordered: usize,
}

fn tally(committed: &[Event], received: &[Received]) -> Tally {
    let position: HashMap<&str, usize> = committed
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.as_str(), i))
        .collect();
    let mut by_partition: HashMap<(&str, i32), Vec<&Received>> = HashMap::new();
    for r in received {
        by_partition
            .entry((&r.topic, r.partition))
            .or_default()
            .push(r);
    }
    let mut seen: HashSet<&str> = HashSet::new();
    let mut newest: HashMap<&str, usize> = HashMap::new();
    let mut t = Tally::default();
    for records in by_partition.values_mut() {
        records.sort_by_key(|r| r.offset);
        for r in records.iter() {
            let id = r.header("id").expect("id header");
            if !seen.insert(id) {
                t.duplicates += 1;
                continue;
            }
            let Some(&at) = position.get(id) else {
                continue;
            };
            let last = newest.entry(r.key_str()).or_insert(at);
            if at < *last {
                t.reordered += 1;
            } else {
                *last = at;
            }
        }
    }
    t.lost = committed
        .iter()
        .filter(|e| !seen.contains(e.id.as_str()))
        .count();
    t
}

async fn pending(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM public.outbox WHERE status = 'pending'",
            &[],
        )
        .await
        .expect("pending")
        .get(0)
}

fn shape() -> LoadShape {
    // One event per transaction: created_at (the transaction's start) then orders them
    // as they committed, the order a poller and the back-fill both publish in.
    LoadShape {
        max_txn: 1,
        aggregates: 12,
        pause: Duration::from_millis(3),
        ..LoadShape::default()
    }
}

/// (a) The documented hand-over (docs/operations.md, "Switching from a polling relay"),
/// under load: stop the poller, `init --backfill "status = 'pending'"`, start outboxd.
#[tokio::test(flavor = "multi_thread")]
async fn a_poller_hands_over_without_loss_or_reordering() {
    let db = PgCluster::shared()
        .fresh_database("backfill_handover")
        .await;
    let broker = support::broker::Broker::default_for_tests();
    let (outbox, topics) = poller_outbox(&db, &broker).await;
    let client = db.client().await;
    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), shape());
    let poller = Poller::spawn(db.conn_string(), broker.bootstrap(), outbox.clone());
    load.wait_committed(300, Duration::from_secs(60)).await;
    ops::wait_for(
        "the poller to publish",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async { (poller.published() >= 100).then_some(()) },
    )
    .await;

    // The switch, while the service keeps writing.
    poller.stop().await;
    let left = pending(&client).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let (code, out) = run_to_end(&env, &["init", "--backfill", CONDITION]);
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(60)).await;
    let at_switch = load.committed();
    load.wait_committed(at_switch + 200, Duration::from_secs(60))
        .await;
    let committed = load.stop().await;

    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &committed,
        Duration::from_secs(60),
    );
    let t = tally(&committed, &received);
    println!(
        "hand-over: {} committed, {left} pending at the switch: lost {}, duplicates {}, reordered {}",
        committed.len(),
        t.lost,
        t.duplicates,
        t.reordered
    );
    assert!(left > 0, "the switch should find pending rows");
    assert_eq!((t.lost, t.reordered), (0, 0), "{t:?}");
    drop(relay);
}

/// Runs a command line the relay printed, as an operator would paste it into a shell.
fn run_printed(env: &[(String, String)], command: &str) -> (i32, String) {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_outboxd"))
        .parent()
        .expect("bin dir")
        .display()
        .to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("sh")
        .args(["-c", command])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PATH", path)
        .output()
        .expect("sh");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The first `outboxd init …` command quoted in backticks in `text`.
fn printed_init_command(text: &str) -> String {
    text.split('`')
        .skip(1)
        .step_by(2)
        .find(|c| c.starts_with("outboxd init") && c.contains(&needle()))
        .unwrap_or_else(|| panic!("no `outboxd init` command in: {text}"))
        .to_owned()
}

fn needle() -> String {
    format!("--backfill \"{CONDITION}\"")
}

/// The rows the back-fill's condition selects.
async fn pending_events(client: &tokio_postgres::Client) -> Vec<Event> {
    client
        .query(
            &format!("SELECT {EVENT_COLUMNS} FROM public.outbox WHERE {CONDITION}"),
            &[],
        )
        .await
        .expect("pending rows")
        .iter()
        .map(Event::from_row)
        .collect()
}

/// `init --backfill` started, with what watches its records. A kill must land mid-way
/// whatever the machine's speed: each 500-row batch is acked before the next, and lingers
/// 50 ms.
fn slow_backfill(
    db: &TestDb<'_>,
    outbox: &Outbox,
    broker: &support::broker::Broker,
    topics: &[String],
) -> (Vec<(String, String)>, Relay, BaseConsumer) {
    let env = Relay::env_for(
        db,
        outbox,
        &broker.bootstrap(),
        &[("OUTBOXD_KAFKA_LINGER_MS", "50")],
    );
    let init = Relay::start(env.clone(), &["init", "--backfill", CONDITION]);
    let watch = support::consume::assigned_consumer(&broker.bootstrap(), topics);
    (env, init, watch)
}

/// Waits until `topics` hold `at_least` records, and says how many they hold; panics with
/// the back-fill's log after a minute.
fn wait_records(consumer: &BaseConsumer, topics: &[String], at_least: i64, init: &Relay) -> i64 {
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let now = records_on(consumer, topics);
            if now >= at_least {
                return now;
            }
            assert!(std::time::Instant::now() < deadline, "{}", init.log_text());
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// Records on `topics` so far (every partition's high watermark).
fn records_on(consumer: &BaseConsumer, topics: &[String]) -> i64 {
    let mut total = 0;
    for topic in topics {
        for p in 0..4 {
            if let Ok((low, high)) = consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                total += high - low;
            }
        }
    }
    total
}

/// `outboxd init --backfill` killed (-9) mid-way: `run` refuses, naming the command that
/// resumes it, which is run as printed. Nothing lost, rows committed after the kill and
/// deleted or not selected included; rows committed after the resume are published exactly
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn b_a_killed_backfill_resumes_as_the_relay_says() {
    let db = PgCluster::shared().fresh_database("backfill_killed").await;
    let broker = support::broker::Broker::default_for_tests();
    let (outbox, topics) = poller_outbox(&db, &broker).await;
    let mut client = db.client().await;
    // Pending rows (a poller stopped behind), and published ones not to repeat.
    client
        .batch_execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, status)
             SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN 'order' ELSE 'customer' END,
                    'agg-' || (i % 12), 'Changed', pg_catalog.jsonb_build_object('n', i),
                    CASE WHEN i <= 2000 THEN 'published' ELSE 'pending' END
               FROM generate_series(1, 60000) AS i",
        )
        .await
        .expect("rows");
    let before = pending_events(&client).await;
    // The ~100 batches left after the first 5,000 rows take seconds.
    let (env, mut init, watch) = slow_backfill(&db, &outbox, &broker, &topics);
    let started = wait_records(&watch, &topics, 1, &init);
    // The slot exists from here on: what the service writes now is after it.
    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), shape());
    wait_records(&watch, &topics, started + 5000, &init);
    init.kill();
    // Committed after the slot, so the slot's to stream: one inserted and deleted in its
    // transaction (the insert-then-delete outbox), one the condition does not select. A
    // resume that dropped the slot for a new one lost both.
    let mut gone = Vec::new();
    for (status, delete) in [("pending", true), ("new", false)] {
        let tx = client.transaction().await.expect("begin");
        let row = tx
            .query_one(
                &format!(
                    "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, status)
                     VALUES (gen_random_uuid(), 'order', 'agg-after-kill', 'Changed', '{{}}', $1)
                     RETURNING {EVENT_COLUMNS}"
                ),
                &[&status],
            )
            .await
            .expect("insert");
        let event = Event::from_row(&row);
        if delete {
            tx.execute(
                "DELETE FROM public.outbox WHERE id = $1::text::uuid",
                &[&event.id],
            )
            .await
            .expect("delete");
        }
        tx.commit().await.expect("commit");
        gone.push(event);
    }
    let key = format!(
        "{}#backfill",
        ops::progress_key(&client, &db.name, &outbox.slot).await
    );
    let state = ops::latest_progress_record(&broker.bootstrap(), &key).expect("back-fill state");
    assert_eq!(state["done"], false, "killed before it finished: {state}");

    // The relay refuses, and says how to resume; that is followed as printed.
    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("Resume it with `"), "{out}");
    let command = printed_init_command(&out);
    // The retention job, run meanwhile, deletes none of the rows the back-fill still owes
    // Kafka, and names the same command.
    let pending = schema::outbox_rows(&client).await;
    let (code, pruned) = run_to_end(&env, &["prune", "--older-than", "1s", "--wait", "1s"]);
    assert_eq!(code, 3, "{pruned}");
    assert_eq!(printed_init_command(&pruned), command, "{pruned}");
    let kept = schema::outbox_rows(&client).await;
    assert!(
        kept >= pending,
        "prune deleted {} rows: {pruned}",
        pending - kept
    );
    let (code, text) = run_printed(&env, &command);
    assert_eq!(code, 0, "{command}: {text}");
    // From here on the resume's snapshot is behind: streamed only.
    let at_resume = load.committed();

    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(60)).await;
    let at_start = load.committed();
    load.wait_committed(at_start + 100, Duration::from_secs(60))
        .await;
    let after = load.stop().await;

    let all = [before.clone(), gone.clone(), after.clone()].concat();
    let received = read_all_blocking(&broker.bootstrap(), &topics, &all, Duration::from_secs(90));
    let counts = ops::id_counts(&received);
    let lost: Vec<&Event> = all.iter().filter(|e| !counts.contains_key(&e.id)).collect();
    // Rows committed after the slot and before the resume are streamed and may be read
    // again by the resume (docs/operations.md, "Resuming"); later ones only streamed.
    let (until_resume, since_resume) = after.split_at(at_resume.min(after.len()));
    let twice_after: Vec<&Event> = since_resume.iter().filter(|e| counts[&e.id] > 1).collect();
    let twice_before = before.iter().filter(|e| counts[&e.id] > 1).count();
    let twice_until = until_resume
        .iter()
        .chain(&gone)
        .filter(|e| counts[&e.id] > 1)
        .count();
    println!(
        "killed back-fill: {} pending + {} written after the slot ({} of them before the resume): lost {}, duplicates {} (of rows before the slot), {} (after, before the resume), {} (after the resume)",
        before.len(),
        after.len() + gone.len(),
        until_resume.len() + gone.len(),
        lost.len(),
        twice_before,
        twice_until,
        twice_after.len()
    );
    assert!(lost.is_empty(), "never published: {lost:?}");
    assert!(
        twice_after.is_empty(),
        "committed after the resume, published twice: {:?}",
        twice_after.first()
    );
    assert!(
        gone.iter().all(|e| counts[&e.id] == 1),
        "a row the resume could not read is streamed once"
    );
    assert_eq!(
        received.len(),
        all.len() + twice_before + twice_until,
        "only pending rows and new ones are published"
    );
    drop(relay);
}

/// (c) Rows committed after the slot was created are streamed, not back-filled: with a
/// service writing throughout, every row arrives exactly once, in order per aggregate.
#[tokio::test(flavor = "multi_thread")]
async fn c_rows_after_the_slot_are_streamed_not_backfilled() {
    let db = PgCluster::shared().fresh_database("backfill_after").await;
    let broker = support::broker::Broker::default_for_tests();
    let (outbox, topics) = poller_outbox(&db, &broker).await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, status)
             SELECT gen_random_uuid(), 'order', 'old-' || i, 'Changed', '{}', 'published'
               FROM generate_series(1, 50) AS i",
        )
        .await
        .expect("published rows");
    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), shape());
    load.wait_committed(200, Duration::from_secs(60)).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    // Plain init refuses a table with rows, offering the back-fill: followed as printed.
    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    let command = printed_init_command(&out);
    let (code, out) = run_printed(&env, &command);
    assert_eq!(code, 0, "{command}: {out}");
    let backfilled_up_to = load.committed();
    let relay = Relay::start(env.clone(), &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(60)).await;
    load.wait_committed(backfilled_up_to + 200, Duration::from_secs(60))
        .await;
    let committed = load.stop().await;

    let received = read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &committed,
        Duration::from_secs(60),
    );
    let t = tally(&committed, &received);
    println!(
        "rows after the slot: {} committed ({backfilled_up_to} before init returned): {t:?}",
        committed.len()
    );
    assert_eq!(t, Tally::default());
    assert_eq!(received.len(), committed.len(), "no published row again");
    // Init is idempotent once the back-fill finished.
    let (code, out) = run_to_end(&env, &["init", "--backfill", CONDITION]);
    assert_eq!(code, 0, "{out}");
    drop(relay);
}

/// The publication changed while a back-fill was stopped: rows committed meanwhile are
/// after the slot, so only the stream could send them, and the change hid them from it.
/// The resume must not record the publication as it finds it (the record's look is what
/// `run` compares with): it refuses, naming the way past, which is followed as printed.
#[tokio::test(flavor = "multi_thread")]
async fn d_a_publication_change_while_a_backfill_was_stopped_is_seen() {
    let db = PgCluster::shared()
        .fresh_database("backfill_pub_change")
        .await;
    let broker = support::broker::Broker::default_for_tests();
    let (outbox, topics) = poller_outbox(&db, &broker).await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
             SELECT gen_random_uuid(), 'order', 'agg-' || (i % 12), 'Changed',
                    pg_catalog.jsonb_build_object('n', i)
               FROM generate_series(1, 20000) AS i",
        )
        .await
        .expect("rows");
    let pending = pending_events(&client).await;
    let (env, mut init, watch) = slow_backfill(&db, &outbox, &broker, &topics);
    wait_records(&watch, &topics, 1000, &init);
    init.kill();

    let since: String = client
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .expect("now")
        .get(0);
    let publication = &outbox.publication;
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{publication}\" DROP TABLE public.outbox"
        ))
        .await
        .expect("drop from the publication");
    // Not selected by the condition: the slot's to stream, never the back-fill's.
    let hidden: Vec<Event> = client
        .query(
            &format!(
                "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, status)
                 SELECT gen_random_uuid(), 'order', 'agg-hidden', 'Changed', '{{}}', 'new'
                   FROM generate_series(1, 20) RETURNING {EVENT_COLUMNS}"
            ),
            &[],
        )
        .await
        .expect("rows while out of the publication")
        .iter()
        .map(Event::from_row)
        .collect();
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION \"{publication}\" ADD TABLE public.outbox"
        ))
        .await
        .expect("add back");

    let (code, out) = run_to_end(&env, &["init", "--backfill", CONDITION]);
    assert_eq!(
        code, 3,
        "the resume must refuse the changed publication: {out}"
    );
    assert!(out.contains("--accept-publication-change"), "{out}");
    // The refusal holds: the same command again, and `run` started by a supervisor.
    let (code, out) = run_to_end(&env, &["init", "--backfill", CONDITION]);
    assert_eq!(code, 3, "init again must refuse too: {out}");
    let (code, out) = run_to_end(&env, &["run"]);
    assert_eq!(code, 3, "run must refuse the changed publication: {out}");
    // As printed: accept the publication, start outboxd, re-publish since the change.
    let (code, out) = run_to_end(&env, &["init", "--accept-publication-change"]);
    assert_eq!(code, 0, "{out}");
    let relay = Relay::start(env, &["run"]);
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(60)).await;
    let moved = support::schema::republish_since(&client, &since).await;
    assert_eq!(moved, 20, "the rows committed since the change");

    let all = [pending, hidden].concat();
    let received = read_all_blocking(&broker.bootstrap(), &topics, &all, Duration::from_secs(90));
    let counts = ops::id_counts(&received);
    let lost: Vec<&str> = all
        .iter()
        .filter(|e| !counts.contains_key(&e.id))
        .map(|e| e.id.as_str())
        .collect();
    assert!(
        lost.is_empty(),
        "lost {} of {}: {lost:?}",
        lost.len(),
        all.len()
    );
    drop(relay);
}
