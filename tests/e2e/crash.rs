//! The real binary is SIGKILLed at random moments while a 50k-event load runs, and
//! restarted each time: afterwards every committed event is in the topics and, per
//! aggregate, the first arrivals are in commit order (replays of a suffix are allowed).
//! With the progress record the replays after each kill are bounded: what the killed
//! relay (or, if it published nothing, the last one that did) published past its last
//! record the broker acked (`outboxd_progress_recorded_lsn`, at most one progress
//! interval behind), plus what was in flight.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use support::broker::Broker;
use support::consume::{check_delivery, ids, read_until_ids};
use support::load::{insert_events, Event};
use support::relay::Relay;
use support::scenario::Scenario;
use support::schema;

const TOTAL: usize = 50_000;
const CHUNK: usize = 1_000;
const MIN_KILLS: usize = 20;
const IN_FLIGHT_CAP: u32 = 2000;

/// How many events in Kafka the durable progress record of a killed relay does not
/// cover, from the relay's samples of (events published, position the broker acked a
/// record of) taken through its life, the last one at the kill, and what the lives
/// before it left uncovered (`carried`).
///
/// Records are written one at a time and the gauge is set before the next write may
/// start, so the last record was built after the gauge showed the one before it: what
/// was published before that showed (`covered`) is in the record, but for what was
/// acked out of order (at most the in-flight cap). The life's stream starts with what
/// the lives before left uncovered, so once the record covers more than that plus the
/// cap, it covers all of it; until then it is still carried. Scrapes that failed read as
/// 0, which only loosens the bound.
fn unrecorded_at_kill(samples: &[(f64, f64)], carried: f64) -> f64 {
    let Some(&(published, recorded)) = samples.last() else {
        return carried;
    };
    let first_showing = |value: f64| samples.iter().position(|&(_, r)| r == value);
    let covered = match first_showing(recorded) {
        Some(i) if i > 0 && recorded != 0.0 => {
            let before = samples[i - 1].1;
            match first_showing(before) {
                Some(j) if j > 0 && before != 0.0 => samples[j - 1].0,
                _ => 0.0,
            }
        }
        _ => 0.0,
    };
    let still_carried = if covered > carried + f64::from(IN_FLIGHT_CAP) {
        0.0
    } else {
        carried
    };
    still_carried + published - covered
}

/// High watermark of each partition of `topics`.
fn watermarks(bootstrap: &str, topics: &[String]) -> HashMap<(String, i32), i64> {
    let mut out = HashMap::new();
    for t in topics {
        let marks =
            outboxd_test_broker::watermarks(bootstrap, "read_committed", t, 6).expect("watermarks");
        for (p, (_, high)) in (0..).zip(marks) {
            out.insert((t.clone(), p), high);
        }
    }
    out
}

/// The relay's stream starts so far could not read the progress record in time.
fn record_unread(relay: &Relay) -> bool {
    relay
        .metric("outboxd_progress_record_unread_total")
        .is_some_and(|n| n > 0.0)
}

async fn killed_at_random_moments_loses_nothing(broker: Broker, name: &str) {
    let started = Instant::now();
    let s = Scenario::new(name).broker(broker).partitions(6).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let cap = IN_FLIGHT_CAP.to_string();
    let mut relay = s.relay(&[
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", &cap),
        // Every restart reads the record (the default 3 s may run out on a loaded
        // machine, and then a restart re-sends by design): the bound is exact.
        ("OUTBOXD_PROGRESS_READ_WAIT_MS", "60000"),
    ]);

    // The load: chunks one after another, so the concatenation is commit order.
    let client = db.client().await;
    let table = outbox.table.clone();
    // Kills so far, published after `kills_during_load` counted them. The load waits for
    // its share of kills before each chunk, so it outlasts MIN_KILLS of them whatever the
    // relative speed of inserting and killing (a kill includes reading watermarks from
    // the broker, slow with tansu on a loaded machine; a fixed pace could let the load
    // finish first and fail "only N kills during the load").
    let kills_seen = Arc::new(AtomicUsize::new(0));
    let chunks = TOTAL / CHUNK;
    let inserter = tokio::spawn({
        let kills_seen = Arc::clone(&kills_seen);
        async move {
            let mut events: Vec<Event> = Vec::with_capacity(TOTAL);
            let mut chunk = 0;
            while events.len() < TOTAL {
                chunk += 1;
                while kills_seen.load(Ordering::Relaxed) * chunks < chunk * MIN_KILLS {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                events.extend(insert_events(&client, &table, CHUNK, 50, 200).await);
                // Paced so the load also spreads over the kills (~1 s apart).
                tokio::time::sleep(Duration::from_millis(450)).await;
            }
            events
        }
    });

    let mut kills = 0;
    // Per kill: the topics' high watermarks right after it (what the next relay writes
    // starts there), and what the killed relay published that its record did not cover
    // (many lives publish nothing: the killed relay's walsender still holds the slot
    // until it notices, and the new relay stands by; such a life hands on what the ones
    // before it left).
    let mut after_kill: Vec<HashMap<(String, i32), i64>> = Vec::new();
    let mut unrecorded: Vec<f64> = Vec::new();
    let kill_deadline = Instant::now() + Duration::from_secs(600);
    let mut kills_during_load = 0;
    while kills < MIN_KILLS || !inserter.is_finished() {
        let pause = Duration::from_millis(rand::thread_rng().gen_range(200..=1500));
        let started_pause = Instant::now();
        let mut samples: Vec<(f64, f64)> = Vec::new();
        let sample = |relay: &Relay| {
            // The record's gauge first: a later read of the counter can only be higher,
            // which loosens the bound, never tightens it.
            let recorded = relay.metric("outboxd_progress_recorded_lsn").unwrap_or(0.0);
            let published = relay
                .metric("outboxd_events_published_total")
                .unwrap_or(0.0);
            (published, recorded)
        };
        while started_pause.elapsed() < pause {
            samples.push(sample(&relay));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        samples.push(sample(&relay));
        assert!(
            !record_unread(&relay),
            "a restarted relay did not read the progress record"
        );
        // SIGKILL, then start again at once: if the killed relay's walsender still holds
        // the slot, the new relay stands by and retries every second.
        relay.kill();
        let carried = unrecorded.last().copied().unwrap_or(0.0);
        unrecorded.push(unrecorded_at_kill(&samples, carried));
        after_kill.push(watermarks(bootstrap, topics));
        relay.restart();
        kills += 1;
        if !inserter.is_finished() {
            kills_during_load += 1;
        }
        kills_seen.store(kills, Ordering::Relaxed);
        assert!(
            Instant::now() < kill_deadline,
            "the load did not finish within 10 minutes ({kills} kills)"
        );
    }
    assert!(
        kills_during_load >= MIN_KILLS,
        "only {kills_during_load} kills during the load"
    );
    let events = inserter.await.expect("inserter task");
    let wal_after = schema::current_wal_lsn(db).await;
    assert_eq!(events.len(), TOTAL);

    let received = read_until_ids(
        bootstrap,
        topics,
        &ids(&events),
        Duration::from_secs(3),
        Duration::from_secs(300),
    );
    let report = check_delivery(&events, &received);
    assert!(
        !record_unread(&relay),
        "the last relay did not read the progress record"
    );
    // Each duplicate is charged to the kill before the relay that wrote it.
    let mut first_seen: HashSet<&str> = HashSet::new();
    let mut by_partition: HashMap<(String, i32), Vec<&support::consume::Received>> = HashMap::new();
    for r in &received {
        by_partition
            .entry((r.topic.clone(), r.partition))
            .or_default()
            .push(r);
    }
    let mut per_kill = vec![0usize; kills];
    // An id always lands in one partition (its key's), so a duplicate follows its first
    // copy in that partition; the watermarks taken at each kill split every partition into
    // the relays' lifetimes.
    let mut lifetimes: Vec<Vec<&support::consume::Received>> = vec![Vec::new(); kills + 1];
    for ((topic, partition), records) in &mut by_partition {
        records.sort_by_key(|r| r.offset);
        for r in records.iter() {
            let life = after_kill
                .iter()
                .take_while(|w| {
                    w.get(&(topic.clone(), *partition))
                        .is_some_and(|&h| r.offset >= h)
                })
                .count();
            lifetimes[life].push(r);
        }
    }
    for (life, records) in lifetimes.iter().enumerate() {
        for r in records {
            let id = r.header("id").expect("id header");
            if !first_seen.insert(id) && life > 0 {
                per_kill[life - 1] += 1;
            }
        }
    }
    // Past the record: what was published and not covered, what was acked out of order
    // at the record's making, and what reached the broker unacked at the kill; each of
    // the last two is at most the in-flight cap.
    let slack = 2.0 * f64::from(IN_FLIGHT_CAP);
    let over: Vec<String> = per_kill
        .iter()
        .zip(&unrecorded)
        .enumerate()
        .filter(|(_, (d, acked))| **d as f64 > **acked + slack)
        .map(|(k, (d, acked))| {
            format!("kill {k}: {d} duplicates, {acked} acked and not yet recorded")
        })
        .collect();
    let mut sorted = per_kill.clone();
    sorted.sort_unstable();
    println!(
        "{name}: duplicates per kill min {} / median {} / max {} (all: {per_kill:?}); acked and not yet recorded at each kill: {unrecorded:?}",
        sorted.first().copied().unwrap_or(0),
        sorted.get(sorted.len() / 2).copied().unwrap_or(0),
        sorted.last().copied().unwrap_or(0),
    );
    assert!(
        over.is_empty(),
        "duplicates beyond what the durable progress record did not cover plus twice the in-flight cap ({slack}): {over:?}"
    );
    println!(
        "{name}: {kills} SIGKILLs during {TOTAL} events; {} records read, {} unique, {} duplicates (replays after kills); {:.1?} total",
        received.len(),
        report.unique,
        report.duplicates,
        started.elapsed()
    );
    assert_eq!(
        report.unique, TOTAL,
        "nothing but the committed events arrived"
    );
    assert!(relay.is_running(), "the last relay is still running");
    schema::wait_confirmed_at_least(db, wal_after, Duration::from_secs(60)).await;
    drop(relay);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_load() {
    killed_at_random_moments_loses_nothing(Broker::default_for_tests(), "crash").await;
}
