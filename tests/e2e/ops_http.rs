//! Operations: the HTTP endpoint. /metrics in the Prometheus text format with counters
//! that match what was relayed, LSN gauges that move and slot statistics from the 5 s
//! poll; /healthz; /readyz ready while streaming and not ready when Kafka is down with
//! work unacknowledged for longer than OUTBOXD_READY_STALL_MS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use support::consume::check_delivery;
use support::ops;
use support::relay::Relay;

fn get(relay: &Relay, path: &str) -> (u16, String) {
    relay
        .http_get(path)
        .unwrap_or_else(|| panic!("GET {path} failed; log:\n{}", relay.log_text()))
}

/// The /metrics text once `n` events are counted as published and timed (both counters
/// move with the ack, one after the other).
async fn wait_acked(relay: &Relay, n: f64) -> String {
    relay
        .wait_metrics(&format!("outboxd_events_published_total = {n}"), |body| {
            (ops::metric(body, "outboxd_events_published_total")? >= n
                && ops::metric(body, "outboxd_commit_to_ack_seconds_count")? >= n)
                .then(|| body.to_owned())
        })
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_health_and_readiness() {
    let ops::Streaming {
        db: _db,
        outbox,
        broker,
        topics,
        relay,
        client,
        ..
    } = ops::streaming_relay_on(
        support::broker::Broker::kafka(1),
        "ops_http",
        &[("OUTBOXD_READY_STALL_MS", "3000")],
    )
    .await;
    let (code, _) = get(&relay, "/healthz");
    assert_eq!(code, 200);
    // Deadlines here are generous: each waits for something that takes well under a
    // second on a quiet machine, and CI runs three tests at a time on two cores.
    ops::wait_for(
        "/readyz 200 while streaming",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async { (get(&relay, "/readyz").0 == 200).then_some(()) },
    )
    .await;
    // A first confirmed position: where the slot stood, which the bytes counter must not
    // count as relayed (a rate() over the position showed it as gigabytes per second).
    let before = relay
        .wait_metrics("a first confirmed position", |body| {
            (ops::metric(body, "outboxd_confirmed_lsn")? > 0.0).then(|| body.to_owned())
        })
        .await;
    let confirmed_before = ops::must_metric(&before, "outboxd_confirmed_lsn");
    let bytes_before = ops::must_metric(&before, "outboxd_confirmed_bytes_total");
    assert!(
        bytes_before < confirmed_before,
        "the first position is not throughput: {bytes_before} bytes counted at {confirmed_before}"
    );

    // 500 events in 50 transactions.
    let events = support::load::insert_events(&client, &outbox.table, 500, 20, 10).await;
    let wal_after = ops::current_wal(&client).await;
    let received = ops::read_all_blocking(
        &broker.bootstrap(),
        &topics,
        &events,
        Duration::from_secs(120),
    );
    check_delivery(&events, &received);
    let body = wait_acked(&relay, 500.0).await;
    // Text format: every sample has HELP and TYPE lines for its family.
    for family in [
        "outboxd_events_published_total",
        "outboxd_confirmed_lsn",
        "outboxd_received_lsn",
        "outboxd_lag_bytes",
        "outboxd_slot_retained_wal_bytes",
        "outboxd_commit_to_ack_seconds",
    ] {
        assert!(
            body.contains(&format!("# HELP {family} ")),
            "HELP {family}:\n{body}"
        );
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "TYPE {family}:\n{body}"
        );
    }
    assert_eq!(
        ops::must_metric(&body, "outboxd_events_published_total"),
        500.0
    );
    assert_eq!(
        ops::must_metric(&body, "outboxd_commit_to_ack_seconds_count"),
        500.0,
        "one latency observation per published event"
    );
    assert_eq!(
        ops::must_metric(&body, "outboxd_commit_to_ack_seconds_bucket{le=\"+Inf\"}"),
        500.0
    );
    assert!(ops::must_metric(&body, "outboxd_commit_to_ack_seconds_sum") > 0.0);
    assert_eq!(
        ops::must_metric(&body, "outboxd_delivery_errors_total"),
        0.0
    );
    assert!(
        ops::must_metric(&body, "outboxd_status_updates_sent_total") > 0.0,
        "status updates are counted"
    );
    assert_eq!(
        ops::must_metric(&body, "outboxd_replication_connected"),
        1.0
    );
    assert_eq!(ops::must_metric(&body, "outboxd_in_flight_messages"), 0.0);
    // The LSN gauges moved to the end of the inserts.
    let received_lsn = ops::must_metric(&body, "outboxd_received_lsn");
    assert!(
        received_lsn > confirmed_before,
        "received_lsn {received_lsn} did not move past {confirmed_before}"
    );
    let (confirmed, bytes) = ops::wait_for(
        "outboxd_confirmed_lsn to reach the end of the inserts",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let (_, body) = relay.http_get("/metrics")?;
            let c = ops::metric(&body, "outboxd_confirmed_lsn")?;
            let b = ops::metric(&body, "outboxd_confirmed_bytes_total")?;
            (c >= wal_after as f64).then_some((c, b))
        },
    )
    .await;
    // One session throughout: the counter moved exactly as the position did.
    assert_eq!(
        bytes - bytes_before,
        confirmed - confirmed_before,
        "outboxd_confirmed_bytes_total follows the confirmed position"
    );
    // Idle again: nothing waits to be received, acknowledged or confirmed.
    let stages = ["receive", "ack", "confirm"]
        .map(|stage| format!("outboxd_lag_breakdown_bytes{{stage=\"{stage}\"}}"));
    relay
        .wait_metrics("the lag breakdown's ack and confirm stages at 0", |body| {
            let v: Vec<f64> = stages
                .iter()
                .map(|s| ops::metric(body, s))
                .collect::<Option<_>>()?;
            (v[1] == 0.0 && v[2] == 0.0).then_some(())
        })
        .await;
    // The process's own metrics, as Prometheus exporters name them, and the build.
    let (_, body) = get(&relay, "/metrics");
    assert!(ops::must_metric(&body, "process_resident_memory_bytes") > 1e6);
    assert!(ops::must_metric(&body, "process_cpu_seconds_total") > 0.0);
    let fds = ops::must_metric(&body, "process_open_fds");
    assert!(fds > 0.0 && fds < ops::must_metric(&body, "process_max_fds"));
    assert!(ops::must_metric(&body, "process_start_time_seconds") > 1.6e9);
    assert!(
        body.contains(&format!(
            "outboxd_build_info{{version=\"{}\",",
            env!("CARGO_PKG_VERSION")
        )),
        "{body}"
    );
    // The slot statistics come from the 5 s poll. The cluster is shared: other tests'
    // WAL moves the server's end between the relay's poll and our reading of the slot,
    // and another test's long transaction holds every slot's restart_lsn back until it
    // ends, so a gauge polled just before such an end is far above the slot a moment
    // later (a CI-only failure of comparing one poll with a later reading). So each
    // bound is taken from the server's end read after the metrics (the poll came before
    // it, so its end is at most that) and from slot positions read before them, and a
    // poll that predates them is
    // simply waited past: a wrong gauge (another slot's, never updated, counted from the
    // wrong position) never fits, a right one fits at the next poll.
    const SLACK: f64 = 16.0 * 1024.0 * 1024.0;
    let deadline = Instant::now() + Duration::from_secs(90);
    let (retained, lag) = loop {
        let row = ops::slot_row(&client, &outbox.slot).await.expect("slot");
        let (_, body) = get(&relay, "/metrics");
        let gauges = (
            ops::metric(&body, "outboxd_slot_wal_status{status=\"reserved\"}"),
            ops::metric(&body, "outboxd_slot_retained_wal_bytes"),
            ops::metric(&body, "outboxd_lag_bytes"),
        );
        let server_end = ops::current_wal(&client).await as f64;
        if let (Some(1.0), Some(retained), Some(lag)) = gauges {
            // restart_lsn only moves forward: at a poll after `row`, the slot kept at
            // most the poll's server end minus the restart_lsn read before.
            let restart = row.restart.unwrap_or(0) as f64;
            let retained_ok = retained > 0.0 && retained <= (server_end - restart) + SLACK;
            // The relay had confirmed past the inserts before this loop; at a poll
            // after the slot got that position, the lag is at most the WAL written
            // after the inserts (by anyone) up to the poll.
            let lag_ok = lag <= (server_end - wal_after as f64).max(0.0) + SLACK;
            if retained_ok && lag_ok {
                break (retained, lag);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no slot statistics poll within 90 s agrees with the slot ({gauges:?}; slot before it {row:?}; inserts ended at {wal_after})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("metrics after 500 events: confirmed {confirmed}, received {received_lsn}, lag {lag} B, retained {retained} B");

    // Kafka down with events waiting: not ready once the stall passes 3 s.
    // The stall clock starts when the relay receives the first of these events, which is
    // after `inserting`: so a relay keeping its 3 s answers 200 until `inserting` + 3 s at
    // least, however slowly the inserts or the relay run. (Measuring from the end of the
    // inserts, as before, failed whenever they took more than 0.1 s after the first
    // commit reached the relay, i.e. on a loaded machine.)
    broker.set_all_down(true);
    let inserting = Instant::now();
    // Few transactions (up to 10 rows each), so slow inserts rarely skip the 200 check.
    let down_events = support::load::insert_events(&client, &outbox.table, 10, 10, 5).await;
    let (code, body) = get(&relay, "/readyz");
    let answered = inserting.elapsed();
    if answered < Duration::from_millis(2900) {
        assert_eq!(code, 200, "not stalled yet after {answered:?}: {body}");
    } else {
        eprintln!("the inserts took {answered:?}: too slow to see /readyz before the stall");
    }
    let body = ops::wait_for(
        "/readyz 503 with Kafka down",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let (code, body) = relay.http_get("/readyz")?;
            (code == 503).then_some(body)
        },
    )
    .await;
    let not_ready_after = inserting.elapsed();
    assert!(
        not_ready_after >= Duration::from_millis(2900),
        "503 only after the 3 s stall window, got it after {not_ready_after:?}"
    );
    // The stall's own reason: the broker probe's "no Kafka broker answers" would come
    // too, a few seconds later, from the brokers being down, and must not stand in for it.
    assert!(
        body.contains("no acknowledged progress"),
        "the reason is the stall: {body}"
    );
    assert_eq!(get(&relay, "/healthz").0, 200, "liveness is unaffected");
    let (_, metrics) = get(&relay, "/metrics");
    assert!(ops::must_metric(&metrics, "outboxd_in_flight_messages") > 0.0);
    assert!(ops::must_metric(&metrics, "outboxd_oldest_unacked_age_seconds") > 0.0);

    broker.set_all_down(false);
    ops::wait_for(
        "/readyz 200 after Kafka is back",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { (relay.http_get("/readyz")?.0 == 200).then_some(()) },
    )
    .await;
    let mut all = events;
    all.extend(down_events);
    let received =
        ops::read_all_blocking(&broker.bootstrap(), &topics, &all, Duration::from_secs(120));
    check_delivery(&all, &received);
    // A consumer can read a record before the relay has processed the broker's ack for
    // it: the counters are waited for (they must reach exactly 510, and not pass it).
    let metrics = wait_acked(&relay, 510.0).await;
    assert_eq!(
        ops::must_metric(&metrics, "outboxd_events_published_total"),
        510.0
    );
    assert_eq!(
        ops::must_metric(&metrics, "outboxd_commit_to_ack_seconds_count"),
        510.0
    );
    eprintln!("readyz: 503 {not_ready_after:?} after events got stuck (stall limit 3 s)");
}

/// `outboxd probe` (compose's health check) against the relay: its exit code and what it
/// printed. The address is given as a container's relay binds it, unspecified.
fn probe(relay: &Relay) -> (i32, String) {
    let addr = format!("0.0.0.0:{}", relay.http_port);
    support::relay::run_to_end(&[("OUTBOXD_HTTP_ADDR".into(), addr)], &["probe"])
}

/// All brokers down with nothing waiting: /readyz turns 503 and outboxd_kafka_brokers_up
/// 0 within seconds (no event has to be stuck first); both recover with the brokers.
/// `outboxd probe` follows /readyz: 0 when ready, 8 when not, 7 with no relay.
#[tokio::test(flavor = "multi_thread")]
async fn brokers_down_with_nothing_waiting_is_not_ready() {
    let ops::Streaming {
        db: _db,
        broker,
        mut relay,
        ..
    } = ops::streaming_relay_on(support::broker::Broker::kafka(1), "ops_http_brokers", &[]).await;
    ops::wait_for(
        "/readyz 200 and brokers up",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let up = relay.metric("outboxd_kafka_brokers_up")?;
            (get(&relay, "/readyz").0 == 200 && up > 0.0).then_some(())
        },
    )
    .await;
    broker.set_all_down(true);
    let started = Instant::now();
    let body = ops::wait_for(
        "/readyz 503 naming Kafka",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let (code, body) = get(&relay, "/readyz");
            (code == 503).then_some(body)
        },
    )
    .await;
    assert!(body.contains("Kafka"), "{body}");
    assert_eq!(relay.metric("outboxd_kafka_brokers_up"), Some(0.0));
    assert!(started.elapsed() < Duration::from_secs(30));
    // The brokers stay down, so /readyz stays 503 for the probe too.
    let (code, out) = probe(&relay);
    assert_eq!(code, 8, "{out}");
    assert!(out.contains("503") && out.contains("Kafka"), "{out}");
    broker.set_all_down(false);
    ops::wait_for(
        "/readyz 200 again",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let up = relay.metric("outboxd_kafka_brokers_up")?;
            (get(&relay, "/readyz").0 == 200 && up > 0.0).then_some(())
        },
    )
    .await;
    // Nothing makes it unready now (brokers up, nothing stalled).
    let (code, out) = probe(&relay);
    assert_eq!(code, 0, "{out}");
    relay.kill();
    let (code, out) = probe(&relay);
    assert_eq!(code, 7, "{out}");
    assert!(out.contains("cannot reach"), "{out}");
}

/// With max_slot_wal_keep_size set, how much WAL may still be written before the slot is
/// lost is exported (the alert an on-call engineer wants before a slot is invalidated).
#[tokio::test(flavor = "multi_thread")]
async fn safe_wal_size_is_exported_when_the_server_caps_slots() {
    let cluster = pgtest::PgCluster::start(pgtest::ClusterOptions {
        conf: vec!["max_slot_wal_keep_size = '64MB'".into()],
        ..pgtest::ClusterOptions::default()
    })
    .expect("dedicated cluster");
    let db = cluster.fresh_database("ops_http_safe_wal").await;
    let outbox = support::schema::setup(&db).await;
    let broker = support::broker::Broker::default_for_tests();
    ops::create_topics(&broker, &outbox).await;
    let relay = Relay::start(
        Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]),
        &["run"],
    );
    let safe = ops::wait_for(
        "outboxd_slot_safe_wal_size_bytes",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async { relay.metric("outboxd_slot_safe_wal_size_bytes") },
    )
    .await;
    // The server counts from the current segment's end, so up to a few segments over.
    assert!(
        safe > 0.0 && safe <= 128.0 * 1024.0 * 1024.0,
        "safe_wal_size {safe} should be near the 64MB cap"
    );
}
