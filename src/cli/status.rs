//! `outboxd status`: where the slot stands, for an operator (text) or a script (`--json`).

use pgoutput::Lsn;
use pgrepl::preflight;
use serde_json::{json, Value};

use super::{say, EXIT_OK, EXIT_POSTGRES};
use crate::config::Settings;
use crate::wiring;

pub async fn status(s: &Settings, json: bool) -> i32 {
    match status_inner(s, json).await {
        Ok(code) => code,
        Err(e) => {
            if json {
                // Scripts parse stdout: even a failure is one JSON object there.
                say!("{}", json!({ "slot": s.slot, "error": e.to_string() }));
            }
            // Every failure here is on the PostgreSQL side (connection, authentication,
            // permission); the message says which and where.
            eprintln!("outboxd status failed: {e}");
            EXIT_POSTGRES
        }
    }
}

async fn status_inner(s: &Settings, json: bool) -> Result<i32, pgrepl::ReplError> {
    let (_, sql) = wiring::status_connect_config(s)
        .connect_sql_target()
        .await?;
    let current = preflight::current_wal_lsn(&sql).await?;
    let Some(slot) = preflight::slot_state(&sql, &s.slot).await? else {
        if json {
            say!(
                "{}",
                json!({ "slot": s.slot, "exists": false, "server_wal_lsn": current.to_string() })
            );
        } else {
            say!("slot {}: does not exist (run `outboxd init`)", s.slot);
        }
        return Ok(EXIT_POSTGRES);
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
        say!("{doc}");
    } else {
        say!("slot               {}", s.slot);
        say!("server WAL         {current}");
        say!(
            "confirmed          {} (lag {} bytes)",
            lsn_text(slot.confirmed_flush_lsn).unwrap_or_default(),
            lag.unwrap_or(0)
        );
        say!(
            "restart            {} (retained WAL {} bytes)",
            lsn_text(slot.restart_lsn).unwrap_or_default(),
            retained.unwrap_or(0)
        );
        say!(
            "wal_status         {}",
            slot.wal_status.as_deref().unwrap_or("unknown")
        );
        if let Some(safe) = slot.safe_wal_size {
            say!("safe_wal_size      {safe} bytes");
        }
        match slot.active_pid {
            Some(pid) => say!("active             yes, walsender pid {pid}"),
            None => say!("active             no (no outboxd is streaming)"),
        }
    }
    Ok(if slot.wal_status.as_deref() == Some("lost") {
        EXIT_POSTGRES
    } else {
        EXIT_OK
    })
}
