//! Operations: how the relay reacts to each class of failure. Transient ones (a Postgres
//! restart, a broker outage) heal without help and lose nothing; permanent ones (slot
//! dropped, publication dropped, slot invalidated) stop the relay with exit code 3 and a
//! message that names the fix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, Instant};

use pgtest::{ClusterOptions, PgCluster, StopMode};
use support::broker::Broker;
use support::consume::check_delivery;
use support::ops::{self, LoadGen, LoadShape};
use support::relay::Relay;
use support::scenario::Scenario;

fn dedicated(conf: &[&str]) -> PgCluster {
    PgCluster::start(ClusterOptions {
        conf: conf.iter().map(|s| (*s).to_owned()).collect(),
        ..ClusterOptions::default()
    })
    .expect("dedicated cluster")
}

/// Postgres restarted twice under load (fast, then immediate = crash recovery): the relay
/// reconnects on its own, every committed event arrives, and none twice (the replay of
/// what Kafka already has is skipped).
#[tokio::test(flavor = "multi_thread")]
async fn postgres_restart_fast_and_immediate_loses_nothing() {
    let started = Instant::now();
    let cluster = dedicated(&[]);
    let s = Scenario::on(&cluster, "ops_pg_restart").partitions(4).await;
    let (db, outbox, topics, _, broker) = s.parts();
    let mut relay = s.relay(&[]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    drop(client);

    let load = LoadGen::spawn(db.conn_string(), outbox.table.clone(), LoadShape::default());
    load.wait_committed(300, Duration::from_secs(30)).await;
    for mode in [StopMode::Fast, StopMode::Immediate] {
        let before = load.committed();
        tokio::task::block_in_place(|| cluster.restart(mode)).expect("pg_ctl restart");
        eprintln!("restarted Postgres ({mode:?})");
        // Inserts continue after the restart, and the relay is streaming again.
        load.wait_committed(before + 300, Duration::from_secs(60))
            .await;
        let client = ops::connect(&db.conn_string()).await;
        s.wait_active(&client, Duration::from_secs(120)).await;
    }
    let events = load.stop().await;
    assert!(relay.is_running(), "the relay must survive restarts");
    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(120));
    let log = relay.log_text();
    assert!(relay.is_running(), "relay exited; log:\n{log}");
    eprintln!(
        "pg restart: {} events committed, {} unique arrived, {} duplicates, {} reconnect warnings, {:?}",
        events.len(),
        report.unique,
        report.duplicates,
        log.matches("retry_in_ms").count(),
        started.elapsed()
    );
    // The replay after each restart is of events Kafka already has: skipped.
    assert_eq!(
        report.duplicates, 0,
        "a PostgreSQL restart must not publish anything twice"
    );
    relay.kill();
}

/// All brokers down for 60 s while events keep coming, with wal_sender_timeout = 5 s and
/// a small in-flight cap so the relay stops reading: status updates keep the walsender
/// alive (same pid throughout), nothing is lost, and delivery resumes by itself.
#[tokio::test(flavor = "multi_thread")]
async fn broker_down_60s_keeps_walsender_and_loses_nothing() {
    let started = Instant::now();
    let cluster = dedicated(&["wal_sender_timeout = '5s'"]);
    let s = Scenario::on(&cluster, "ops_broker_down")
        .broker(Broker::kafka(1))
        .partitions(4)
        .await;
    let (db, outbox, topics, _, broker) = s.parts();
    let mut relay = s.relay(&[("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "200")]);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;
    let load = paced_load(db, outbox);
    load.wait_committed(200, Duration::from_secs(30)).await;

    broker.set_all_down(true);
    let down_at = Instant::now();
    let committed_at_outage = load.committed();
    let mut pids = Vec::new();
    while down_at.elapsed() < Duration::from_secs(60) {
        let row = ops::slot_row(&client, &outbox.slot).await.expect("slot");
        pids.push(row.active_pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    broker.set_all_down(false);
    let committed_during_outage = load.committed() - committed_at_outage;
    assert!(
        pids.iter().all(|p| *p == Some(pid)),
        "the walsender changed or went away during the outage (wal_sender_timeout 5 s): {pids:?}\nthe server log's end:\n{}",
        log_tail(&cluster.log(), 30)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = load.stop().await;
    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(120));
    let row = ops::slot_row(&client, &outbox.slot).await.expect("slot");
    assert_eq!(
        row.active_pid,
        Some(pid),
        "the same walsender streams after the outage"
    );
    let server_log = cluster.log();
    assert!(
        !server_log.contains("replication timeout"),
        "walsender timed out:\n{}",
        log_tail(&server_log, 30)
    );
    assert!(relay.is_running());
    eprintln!(
        "broker down 60 s: {} events ({} during the outage), {} duplicates, walsender pid {pid} kept, {:?}",
        events.len(),
        committed_during_outage,
        report.duplicates,
        started.elapsed()
    );
    relay.kill();
}

/// Inserts that go on through the test, a pause between transactions.
fn paced_load(db: &pgtest::TestDb<'_>, outbox: &support::schema::Outbox) -> LoadGen {
    LoadGen::spawn(
        db.conn_string(),
        outbox.table.clone(),
        LoadShape {
            pause: Duration::from_millis(20),
            ..LoadShape::default()
        },
    )
}

/// The last `n` lines of `log`: why a walsender ended is at the end, and a whole server
/// log would push the relay's log out of what CI keeps of the output.
fn log_tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Terminates the slot's walsender and drops the slot before the relay reconnects.
async fn terminate_and_drop_slot(client: &tokio_postgres::Client, slot: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        client
            .execute(
                "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&slot],
            )
            .await
            .expect("pg_terminate_backend");
        match client
            .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
            .await
        {
            Ok(_) => return,
            // The relay re-acquired it in between: try again.
            Err(e) => assert!(Instant::now() < deadline, "cannot drop slot {slot}: {e}"),
        }
    }
}

/// The slot dropped under a running relay: exit 3, saying that recreating it would skip
/// the events committed in between (so the relay must not do it silently).
#[tokio::test(flavor = "multi_thread")]
async fn slot_dropped_while_running_exits_3() {
    let mut s = ops::streaming_relay("ops_slot_dropped", &[]).await;
    s.relay_events(50).await;
    let (client, outbox, relay) = (&s.client, &s.outbox, &mut s.relay);

    terminate_and_drop_slot(client, &outbox.slot).await;
    let status = relay.wait_exit(Duration::from_secs(30));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(3), "exit code; log:\n{log}");
    assert!(log.contains("was dropped"), "{log}");
    assert!(
        log.contains("Recreating it silently would skip"),
        "the message says why it is not recreated:\n{log}"
    );
    assert!(
        ops::slot_row(client, &outbox.slot).await.is_none(),
        "the relay must not recreate a slot dropped under it"
    );
}

/// The publication dropped while streaming: Postgres reports "publication ... does not
/// exist" on the replication stream at the next change; the relay exits 3 naming the
/// publication and the fix.
#[tokio::test(flavor = "multi_thread")]
async fn publication_dropped_while_running_exits_3() {
    let mut s = ops::streaming_relay("ops_pub_dropped", &[]).await;
    s.relay_events(20).await;
    let (client, outbox, relay) = (&s.client, &s.outbox, &mut s.relay);

    client
        .batch_execute(&format!("DROP PUBLICATION \"{}\"", outbox.publication))
        .await
        .expect("drop publication");
    // The next decoded change makes pgoutput look the publication up.
    support::load::insert_events(client, &outbox.table, 1, 1, 1).await;
    let status = relay.wait_exit(Duration::from_secs(30));
    let log = relay.log_text();
    assert_eq!(status.code(), Some(3), "exit code; log:\n{log}");
    let error = log
        .lines()
        .find(|l| l.contains("outboxd stopped"))
        .unwrap_or_else(|| panic!("no final error line:\n{log}"));
    assert!(
        error.contains(&format!("publication \\\"{}\\\"", outbox.publication))
            || error.contains(&format!("publication \"{}\"", outbox.publication)),
        "the error names the publication: {error}"
    );
    assert!(
        error.contains("CREATE PUBLICATION"),
        "the error says how to fix it: {error}"
    );
    assert!(
        error.contains("class=\"permanent\"") || error.contains("class=permanent"),
        "{error}"
    );
}

/// A slot invalidated by max_slot_wal_keep_size while the relay was stopped: the relay
/// refuses to start (exit 3, naming the fix), `outboxd status` exits 3 and
/// `outboxd check` reports it.
#[tokio::test(flavor = "multi_thread")]
async fn invalidated_slot_exits_3() {
    let cluster = dedicated(&["max_slot_wal_keep_size = '16MB'"]);
    let s = Scenario::on(&cluster, "ops_slot_lost").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let env = s.env(&[]);
    let mut relay = Relay::start(env.clone(), &["run"]);
    let client = db.client().await;
    s.wait_active(&client, Duration::from_secs(120)).await;
    let events = support::load::insert_events(&client, &outbox.table, 20, 5, 5).await;
    let received = ops::read_all_blocking(bootstrap, topics, &events, Duration::from_secs(60));
    check_delivery(&events, &received);
    relay.signal("TERM");
    assert_eq!(relay.wait_exit(Duration::from_secs(30)).code(), Some(0));

    // ~80 MB of WAL past the slot, then a checkpoint invalidates it.
    ops::invalidate_slot(&client, &outbox.slot).await;

    let (code, out) = support::relay::run_to_end(&env, &["run"]);
    assert_eq!(code, 3, "run on a lost slot:\n{out}");
    assert!(out.contains("invalidated"), "{out}");
    assert!(out.contains("outboxd init"), "the fix is named:\n{out}");
    assert!(out.contains("re-publish"), "{out}");
    let (code, out) = support::relay::run_to_end(&env, &["status"]);
    assert_eq!(code, 3, "status on a lost slot:\n{out}");
    assert!(out.contains("lost"), "{out}");
    let (code, out) = support::relay::run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "check on a lost slot:\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL  slot") && l.contains("invalidated")),
        "{out}"
    );
}

/// Whether process `pid`'s log thread (`outboxd-log`) is in the write system call now
/// (x86-64 Linux: number 1), as /proc says; `None` if it cannot be told.
fn log_thread_in_write(pid: u32) -> Option<bool> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        if comm.trim() == "outboxd-log" {
            let call = std::fs::read_to_string(dir.join("syscall")).ok()?;
            return Some(call.split_whitespace().next() == Some("1"));
        }
    }
    None
}

/// Kills the relay when the test ends, passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The relay's stderr is a pipe nobody reads (a log shipper that fell behind, journald
/// under load, a disk stalled by another process's fsyncs): logging must not hold up the
/// relay's thread, which also writes the walsender's status updates. The same walsender
/// streams throughout (wal_sender_timeout 5 s) and every event arrives.
#[tokio::test(flavor = "multi_thread")]
async fn an_unread_stderr_stops_neither_status_updates_nor_delivery() {
    let cluster = dedicated(&["wal_sender_timeout = '5s'"]);
    let s = Scenario::on(&cluster, "ops_log_stall").partitions(4).await;
    let (db, outbox, topics, _, broker) = s.parts();
    // Trace: lines for every message and status update, so the pipe's 64 KiB fill at once.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(s.env(&[("OUTBOXD_LOG", "trace")]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn outboxd");
    let relay_pid = child.id();
    let _relay = KillOnDrop(child);
    let client = db.client().await;
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;
    let load = paced_load(db, outbox);
    load.wait_committed(500, Duration::from_secs(30)).await;
    let mut pids = Vec::new();
    for _ in 0..15 {
        pids.push(
            ops::slot_row(&client, &outbox.slot)
                .await
                .and_then(|r| r.active_pid),
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Not vacuous: the pipe is full, and the relay's log thread waits in write(2) on it.
    let blocked = log_thread_in_write(relay_pid);
    let events = load.stop().await;
    assert!(
        pids.iter().all(|p| *p == Some(pid)),
        "the walsender changed or went away while stderr was not read: {pids:?}"
    );
    assert_eq!(
        blocked,
        Some(true),
        "the relay's log thread is not waiting in write(2) on the unread pipe"
    );
    let report = ops::read_and_check(broker, topics, &events, Duration::from_secs(60));
    eprintln!(
        "unread stderr: {} events, {} duplicates, walsender pid {pid} kept",
        events.len(),
        report.duplicates
    );
}
