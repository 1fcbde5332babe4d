//! `outboxd status`: where the slot stands, for an operator (text) or a script (`--json`).

use pgoutput::Lsn;
use pgrepl::preflight;
use serde_json::{json, Value};

use pgrepl::ReplError;

use super::{say, EXIT_OK, EXIT_POSTGRES, EXIT_UNREACHABLE};
use crate::config::Settings;

pub async fn status(s: &Settings, json: bool) -> i32 {
    match status_inner(s, json).await {
        Ok(code) => code,
        Err(e) => {
            if json {
                // Scripts parse stdout: even a failure is one JSON object there.
                say!("{}", json!({ "slot": s.slot, "error": e.to_string() }));
            }
            // Every failure here is on the PostgreSQL side; the message says which and
            // where. A script must tell "try again" from "the slot is gone".
            eprintln!("outboxd status failed: {e}");
            if unreachable(&e) {
                EXIT_UNREACHABLE
            } else {
                EXIT_POSTGRES
            }
        }
    }
}

/// No server could be talked to at all (refused, timed out, reset, starting up or
/// shutting down). A server that answered and refused (authentication, TLS, a standby
/// where a primary is wanted) is a permanent problem, not this.
fn unreachable(e: &ReplError) -> bool {
    match e.root() {
        ReplError::Io { .. } | ReplError::Timeout(_) | ReplError::Closed(_) => true,
        ReplError::NoHost { tried, .. } => !tried.is_empty() && tried.iter().all(unreachable),
        ReplError::Sql(sql) if sql.is_closed() => true,
        ReplError::Server(_) | ReplError::Sql(_) => e
            .sqlstate()
            .is_some_and(|c| c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

async fn status_inner(s: &Settings, json: bool) -> Result<i32, pgrepl::ReplError> {
    let (_, sql) = s.pg.connect_sql_target().await?;
    let current = preflight::current_wal_lsn(&sql).await?;
    let mut code = EXIT_OK;
    let mut docs = Vec::new();
    for view in s.all_shards() {
        let report = slot_report(&view, &sql, current).await?;
        code = code.max(report.code);
        if json {
            docs.push(report.doc);
        } else {
            if let Some(shard) = &view.shard {
                say!("shard              {} of {}", shard.index, shard.count);
            }
            for line in &report.lines {
                say!("{line}");
            }
        }
    }
    if json {
        if s.shards.is_some() {
            say!("{}", json!({ "shards": docs }));
        } else if let Some(doc) = docs.pop() {
            say!("{doc}");
        }
    }
    Ok(code)
}

struct SlotReport {
    doc: Value,
    lines: Vec<String>,
    code: i32,
}

async fn slot_report(
    s: &Settings,
    sql: &tokio_postgres::Client,
    current: Lsn,
) -> Result<SlotReport, pgrepl::ReplError> {
    let shard = s.shard.as_ref().map(|sh| sh.index);
    let with_shard = |mut doc: Value| {
        if let (Some(shard), Some(map)) = (shard, doc.as_object_mut()) {
            map.insert("shard".into(), shard.into());
        }
        doc
    };
    let Some(slot) = preflight::slot_state(sql, &s.slot).await? else {
        return Ok(SlotReport {
            doc: with_shard(
                json!({ "slot": s.slot, "exists": false, "server_wal_lsn": current.to_string() }),
            ),
            lines: vec![format!(
                "slot {}: does not exist (run `outboxd init`)",
                s.slot
            )],
            code: EXIT_POSTGRES,
        });
    };
    let behind = |l: Option<Lsn>| l.map(|l| current.0.saturating_sub(l.0));
    let lag = behind(slot.confirmed_flush_lsn);
    let retained = behind(slot.restart_lsn);
    let lsn_text = |l: Option<Lsn>| l.map(|l| l.to_string());
    let doc = with_shard(json!({
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
    }));
    let mut lines = vec![
        format!("slot               {}", s.slot),
        format!("server WAL         {current}"),
        format!(
            "confirmed          {} (lag {} bytes)",
            lsn_text(slot.confirmed_flush_lsn).unwrap_or_default(),
            lag.unwrap_or(0)
        ),
        format!(
            "restart            {} (retained WAL {} bytes)",
            lsn_text(slot.restart_lsn).unwrap_or_default(),
            retained.unwrap_or(0)
        ),
        format!(
            "wal_status         {}",
            slot.wal_status.as_deref().unwrap_or("unknown")
        ),
    ];
    if let Some(safe) = slot.safe_wal_size {
        lines.push(format!("safe_wal_size      {safe} bytes"));
    }
    lines.push(match slot.active_pid {
        Some(pid) => format!("active             yes, walsender pid {pid}"),
        None => "active             no (no outboxd is streaming)".to_owned(),
    });
    let code = if slot.wal_status.as_deref() == Some("lost") {
        EXIT_POSTGRES
    } else {
        EXIT_OK
    };
    Ok(SlotReport { doc, lines, code })
}
