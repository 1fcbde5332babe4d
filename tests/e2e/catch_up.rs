//! A relay that starts behind says so: a line when it starts a backlog, progress lines
//! (bytes and time behind, events/s, an estimate) every few seconds, one line when caught
//! up. And `outboxd status --json` is the slot as pg_replication_slots has it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::load::insert_events;
use support::ops::{self, slot_row};
use support::relay::Relay;
use support::scenario::Scenario;
use support::schema::parse_lsn;

/// `outboxd status [--json]` with `env`: (exit code, stdout alone, stderr).
fn status(env: &[(String, String)], args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("status")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run outboxd status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn parse(stdout: &str) -> Value {
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn lsn_field(doc: &Value, name: &str) -> u64 {
    parse_lsn(
        doc[name]
            .as_str()
            .unwrap_or_else(|| panic!("{name} in {doc}")),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn status_json_matches_pg_replication_slots() {
    let s = Scenario::new("status_json").partitions(4).await;
    let (db, outbox, _, _, _) = s.parts();
    let client = db.client().await;
    // A backlog, so lag and retained WAL are not zero.
    insert_events(&client, &outbox.table, 200, 10, 5).await;
    let env = s.env(&[]);

    let before = slot_row(&client, &outbox.slot).await.unwrap();
    let (code, stdout, stderr) = status(&env, &["--json"]);
    let after = slot_row(&client, &outbox.slot).await.unwrap();
    assert_eq!(code, 0, "{stdout}{stderr}");
    let doc = parse(&stdout);
    assert_eq!(doc["slot"], outbox.slot.as_str());
    assert_eq!(doc["exists"], true);
    assert_eq!(doc["plugin"], "pgoutput");
    assert_eq!(doc["active"], false);
    assert!(doc["active_pid"].is_null(), "{doc}");
    assert_eq!(doc["wal_status"], before.wal_status.as_deref().unwrap());
    // No relay ran: the slot's positions do not move between the two reads.
    assert_eq!(
        Some(lsn_field(&doc, "confirmed_flush_lsn")),
        before.confirmed_flush
    );
    assert_eq!(Some(lsn_field(&doc, "restart_lsn")), before.restart);
    let server = lsn_field(&doc, "server_wal_lsn");
    assert!(
        (before.current_wal..=after.current_wal).contains(&server),
        "{doc}"
    );
    let lag = doc["lag_bytes"].as_u64().unwrap();
    assert_eq!(lag, server - before.confirmed_flush.unwrap());
    assert!(lag >= before.lag() && lag <= after.lag(), "{doc}");
    assert!(lag > 0, "200 events are pending: {doc}");
    let retained = doc["retained_wal_bytes"].as_u64().unwrap();
    assert_eq!(retained, server - before.restart.unwrap());

    // While a relay streams: its walsender's pid, as pg_replication_slots says.
    let relay = Relay::start(env.clone(), &["run"]);
    let pid = s.wait_active(&client, Duration::from_secs(120)).await;
    // The format can also come from the environment.
    let env_json = [
        env.clone(),
        vec![("OUTBOXD_STATUS_FORMAT".into(), "json".into())],
    ]
    .concat();
    let (code, stdout, stderr) = status(&env_json, &[]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let doc = parse(&stdout);
    assert_eq!(doc["active"], true);
    assert_eq!(doc["active_pid"].as_i64(), Some(i64::from(pid)));
    drop(relay);

    // A missing slot: exists false, exit 3, still one JSON object.
    let env_missing = [env, vec![("OUTBOXD_SLOT".into(), "no_such_slot".into())]].concat();
    let (code, stdout, _) = status(&env_missing, &["--json"]);
    assert_eq!(code, 3, "{stdout}");
    let doc = parse(&stdout);
    assert_eq!(doc["exists"], false);
    assert_eq!(doc["slot"], "no_such_slot");
    // Anything but --json is refused.
    let (code, _, stderr) = status(&env_missing, &["--yaml"]);
    assert_eq!(code, 2, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_logs_progress_then_caught_up() {
    let s = Scenario::new("catch_up").partitions(4).await;
    let (db, outbox, topics, bootstrap, _) = s.parts();
    let client = db.client().await;
    // Downtime: events committed while no relay ran, old enough to be a backlog.
    let events = insert_events(&client, &outbox.table, 15_000, 100, 50).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // A small in-flight cap and a long linger slow the catch-up down to some seconds,
    // so progress lines are due before it ends.
    let relay = s.relay(&[
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "10"),
        ("OUTBOXD_KAFKA_LINGER_MS", "20"),
    ]);
    let received = ops::read_all_blocking(bootstrap, topics, &events, Duration::from_secs(180));
    assert!(received.len() >= events.len());
    // "Caught up" needs the lag under 256 kB of the server's end. The cluster is shared:
    // while another test writes WAL quickly (a 1M-row transaction, a load), the idle
    // relay's confirmed position trails the server's end by more than that until the
    // burst ends, so the line may come only then (a minute on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(180);
    while !relay.log_text().contains("caught up:") {
        assert!(
            Instant::now() < deadline,
            "no caught-up line:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = relay.log_text();
    let start = log
        .lines()
        .find(|l| l.contains("catching up a backlog:"))
        .unwrap_or_else(|| panic!("no backlog line:\n{log}"));
    assert!(start.contains("of WAL behind"), "{start}");
    assert!(start.contains("committed"), "{start}");
    let progress: Vec<&str> = log.lines().filter(|l| l.contains("catching up:")).collect();
    assert!(!progress.is_empty(), "no progress line:\n{log}");
    for line in &progress {
        for needle in [
            " behind (",
            "behind in time)",
            "events/s",
            "to go",
            "lag_bytes=",
        ] {
            assert!(line.contains(needle), "{needle:?} in {line}");
        }
    }
    // Some line has a rate and an estimate (a number of seconds, not "?").
    assert!(
        progress.iter().any(|l| l.contains("eta_secs=")),
        "{progress:?}"
    );
    let done = log.lines().find(|l| l.contains("caught up:")).unwrap();
    eprintln!("{start}\n{}\n{done}", progress.join("\n"));
    assert!(done.contains("events in"), "{done}");
    // One caught-up line, after the progress lines.
    assert_eq!(log.matches("caught up:").count(), 1, "{log}");
    assert!(log.find("caught up:") > log.find("catching up:"));
}
