//! `outboxd status`: where the slot stands, for an operator (text) or a script (`--json`).

use pgoutput::Lsn;
use pgrepl::preflight;
use serde_json::{json, Value};

use super::{EXIT_INTERNAL, EXIT_OK};
use crate::config::Settings;
use crate::wiring;

/// Exit code when the slot is missing or lost, as for the relay's permanent Postgres errors.
const EXIT_SLOT: i32 = 3;

pub async fn status(s: &Settings, json: bool) -> i32 {
    match status_inner(s, json).await {
        Ok(code) => code,
        Err(e) => {
            if json {
                // Scripts parse stdout: even a failure is one JSON object there.
                println!("{}", json!({ "slot": s.slot, "error": format!("{e:#}") }));
            }
            eprintln!("outboxd status failed: {e:#}");
            EXIT_INTERNAL
        }
    }
}

async fn status_inner(s: &Settings, json: bool) -> anyhow::Result<i32> {
    let sql = wiring::connect_config(s).connect_sql().await?;
    let current = preflight::current_wal_lsn(&sql).await?;
    let Some(slot) = preflight::slot_state(&sql, &s.slot).await? else {
        if json {
            println!(
                "{}",
                json!({ "slot": s.slot, "exists": false, "server_wal_lsn": current.to_string() })
            );
        } else {
            println!("slot {}: does not exist (run `outboxd init`)", s.slot);
        }
        return Ok(EXIT_SLOT);
    };
    let behind = |l: Option<Lsn>| l.map(|l| current.0.saturating_sub(l.0));
    let lag = behind(slot.confirmed_flush_lsn);
    let retained = behind(slot.restart_lsn);
    let lsn_text = |l: Option<Lsn>| l.map(|l| l.to_string());
    if json {
        let doc: Value = json!({
            "slot": s.slot,
            "exists": true,
            "plugin": slot.plugin,
            "server_wal_lsn": current.to_string(),
            "confirmed_flush_lsn": lsn_text(slot.confirmed_flush_lsn),
            "lag_bytes": lag,
            "restart_lsn": lsn_text(slot.restart_lsn),
            "retained_wal_bytes": retained,
            "wal_status": slot.wal_status,
            "safe_wal_size": slot.safe_wal_size,
            "active": slot.active,
            "active_pid": slot.active_pid,
        });
        println!("{doc}");
    } else {
        println!("slot               {}", s.slot);
        println!("server WAL         {current}");
        println!(
            "confirmed          {} (lag {} bytes)",
            lsn_text(slot.confirmed_flush_lsn).unwrap_or_default(),
            lag.unwrap_or(0)
        );
        println!(
            "restart            {} (retained WAL {} bytes)",
            lsn_text(slot.restart_lsn).unwrap_or_default(),
            retained.unwrap_or(0)
        );
        println!(
            "wal_status         {}",
            slot.wal_status.as_deref().unwrap_or("unknown")
        );
        if let Some(safe) = slot.safe_wal_size {
            println!("safe_wal_size      {safe} bytes");
        }
        match slot.active_pid {
            Some(pid) => println!("active             yes, walsender pid {pid}"),
            None => println!("active             no (no outboxd is streaming)"),
        }
    }
    Ok(if slot.wal_status.as_deref() == Some("lost") {
        EXIT_SLOT
    } else {
        EXIT_OK
    })
}
