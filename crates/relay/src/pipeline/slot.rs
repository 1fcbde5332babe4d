//! The slot and publication as outboxd finds them at the start of each session.

use pgrepl::{preflight, ConnectConfig, Lsn, ReplicationConnection};
use tokio_postgres::Client;

use super::error::RelayError;

/// The slot as checked before START_REPLICATION.
#[derive(Debug, Clone, Copy)]
pub struct SlotStart {
    /// The slot's confirmed_flush_lsn when checked: only a fallback for the session's
    /// start, which is read again once the slot is ours ([`confirmed_flush`]), because
    /// another instance may advance it until then.
    pub confirmed_flush: Lsn,
}

/// Checks the publication and the slot, creating the slot if allowed.
///
/// `seen_slot` is true once this process has streamed from the slot: a slot missing
/// after that was dropped under us, and recreating it would silently skip every event
/// committed in between, so it is a permanent error rather than a fresh start.
pub async fn prepare(
    sql: &Client,
    pg: &ConnectConfig,
    slot: &str,
    publication: &str,
    create_slot: bool,
    seen_slot: bool,
) -> Result<SlotStart, RelayError> {
    // Checked first: a slot created before its publication cannot see it.
    if !preflight::publication_exists(sql, publication).await? {
        return Err(RelayError::PublicationMissing {
            publication: publication.to_owned(),
        });
    }
    let state = match preflight::slot_state(sql, slot).await? {
        Some(state) => state,
        None if seen_slot => {
            return Err(RelayError::SlotDropped {
                slot: slot.to_owned(),
            })
        }
        None if create_slot => {
            let mut conn = ReplicationConnection::connect(pg).await?;
            let created = conn.create_logical_slot(slot, false).await?;
            tracing::warn!(
                slot,
                consistent_point = %created.consistent_point,
                "created replication slot; events committed before this point are not relayed"
            );
            return Ok(SlotStart {
                confirmed_flush: created.consistent_point,
            });
        }
        None => {
            return Err(RelayError::SlotMissing {
                slot: slot.to_owned(),
            })
        }
    };
    let unusable = |problem: String| RelayError::SlotUnusable {
        slot: slot.to_owned(),
        problem,
    };
    if state.slot_type != "logical" {
        return Err(unusable(format!(
            "it is a {} slot; outboxd needs a logical slot with the pgoutput plugin",
            state.slot_type
        )));
    }
    if state.plugin.as_deref() != Some("pgoutput") {
        return Err(unusable(format!(
            "it uses the output plugin {:?}; drop it and let outboxd create one with pgoutput",
            state.plugin.as_deref().unwrap_or("")
        )));
    }
    if let Some(db) = state.database.as_deref() {
        if db != pg.dbname {
            return Err(unusable(format!(
                "it belongs to database {db:?}, not {:?}; set PGDATABASE or OUTBOXD_SLOT",
                pg.dbname
            )));
        }
    }
    if state.wal_status.as_deref() == Some("lost") {
        return Err(RelayError::SlotInvalidated {
            slot: slot.to_owned(),
            reason: "wal_status = lost".into(),
        });
    }
    Ok(SlotStart {
        confirmed_flush: state.confirmed_flush_lsn.unwrap_or(Lsn::ZERO),
    })
}

/// The slot's `confirmed_flush_lsn` now. Read once START_REPLICATION succeeded, when the
/// slot is held by our walsender and only our status updates can move it; `None` if the
/// slot has none (or is gone).
pub async fn confirmed_flush(sql: &Client, slot: &str) -> Result<Option<Lsn>, RelayError> {
    Ok(preflight::slot_state(sql, slot)
        .await?
        .and_then(|s| s.confirmed_flush_lsn))
}

/// Slot health as the metrics report it, polled over SQL.
#[derive(Debug, Clone)]
pub struct SlotStats {
    pub current_wal: Lsn,
    pub retained_bytes: u64,
    pub lag_bytes: u64,
    pub wal_status: Option<String>,
}

/// `None` when the slot no longer exists.
pub async fn stats(sql: &Client, slot: &str) -> Result<Option<SlotStats>, RelayError> {
    let current_wal = preflight::current_wal_lsn(sql).await?;
    let Some(state) = preflight::slot_state(sql, slot).await? else {
        return Ok(None);
    };
    let behind = |lsn: Option<Lsn>| lsn.map_or(0, |l| current_wal.0.saturating_sub(l.0));
    Ok(Some(SlotStats {
        current_wal,
        retained_bytes: behind(state.restart_lsn),
        lag_bytes: behind(state.confirmed_flush_lsn),
        wal_status: state.wal_status,
    }))
}
