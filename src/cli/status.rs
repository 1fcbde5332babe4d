//! `outboxd status`: where the slot stands, for an operator.

use pgrepl::preflight;

use super::{EXIT_INTERNAL, EXIT_OK};
use crate::config::Settings;
use crate::wiring;

pub async fn status(s: &Settings) -> i32 {
    match status_inner(s).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("outboxd status failed: {e:#}");
            EXIT_INTERNAL
        }
    }
}

async fn status_inner(s: &Settings) -> anyhow::Result<i32> {
    let sql = wiring::connect_config(s).connect_sql().await?;
    let current = preflight::current_wal_lsn(&sql).await?;
    let Some(slot) = preflight::slot_state(&sql, &s.slot).await? else {
        println!("slot {}: does not exist (run `outboxd init`)", s.slot);
        return Ok(3);
    };
    let behind = |l: Option<pgoutput::Lsn>| l.map_or(0, |l| current.0.saturating_sub(l.0));
    println!("slot               {}", s.slot);
    println!("server WAL         {current}");
    println!(
        "confirmed          {} (lag {} bytes)",
        slot.confirmed_flush_lsn
            .map(|l| l.to_string())
            .unwrap_or_default(),
        behind(slot.confirmed_flush_lsn)
    );
    println!(
        "restart            {} (retained WAL {} bytes)",
        slot.restart_lsn.map(|l| l.to_string()).unwrap_or_default(),
        behind(slot.restart_lsn)
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
    Ok(if slot.wal_status.as_deref() == Some("lost") {
        3
    } else {
        EXIT_OK
    })
}
