//! `outboxd status`: where the slot stands, for an operator.

use pgrepl::preflight;

use super::{say, EXIT_OK, EXIT_POSTGRES};
use crate::config::Settings;
use crate::wiring;

pub async fn status(s: &Settings) -> i32 {
    match status_inner(s).await {
        Ok(code) => code,
        Err(e) => {
            // Every failure here is on the PostgreSQL side (connection, authentication,
            // permission); the message says which and where.
            eprintln!("outboxd status failed: {e}");
            EXIT_POSTGRES
        }
    }
}

async fn status_inner(s: &Settings) -> Result<i32, pgrepl::ReplError> {
    let sql = wiring::connect_config(s).connect_sql().await?;
    let current = preflight::current_wal_lsn(&sql).await?;
    let Some(slot) = preflight::slot_state(&sql, &s.slot).await? else {
        say!("slot {}: does not exist (run `outboxd init`)", s.slot);
        return Ok(EXIT_POSTGRES);
    };
    let behind = |l: Option<pgoutput::Lsn>| l.map_or(0, |l| current.0.saturating_sub(l.0));
    say!("slot               {}", s.slot);
    say!("server WAL         {current}");
    say!(
        "confirmed          {} (lag {} bytes)",
        slot.confirmed_flush_lsn
            .map(|l| l.to_string())
            .unwrap_or_default(),
        behind(slot.confirmed_flush_lsn)
    );
    say!(
        "restart            {} (retained WAL {} bytes)",
        slot.restart_lsn.map(|l| l.to_string()).unwrap_or_default(),
        behind(slot.restart_lsn)
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
    Ok(if slot.wal_status.as_deref() == Some("lost") {
        EXIT_POSTGRES
    } else {
        EXIT_OK
    })
}
