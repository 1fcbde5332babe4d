//! Failover slots (PG17+) and the standbys that keep copies of them.

use tokio_postgres::Client;

use crate::error::ReplError;

/// A slot's failover columns of `pg_replication_slots` (PG17+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotFailover {
    /// Created or altered with FAILOVER: standbys with `sync_replication_slots` copy it.
    pub failover: bool,
    /// On a standby: a copy maintained by slot sync (usable after promotion only when
    /// also not temporary).
    pub synced: bool,
    pub temporary: bool,
    /// Why the slot was invalidated, `None` while usable.
    pub invalidation_reason: Option<String>,
}

/// `None` when the slot does not exist. Only for PostgreSQL 17+: older servers have no
/// such columns.
pub async fn slot_failover(client: &Client, name: &str) -> Result<Option<SlotFailover>, ReplError> {
    let row = client
        .query_opt(
            "SELECT failover, synced, temporary, invalidation_reason \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await?;
    row.map(|row| {
        Ok(SlotFailover {
            failover: row.try_get(0)?,
            synced: row.try_get(1)?,
            temporary: row.try_get(2)?,
            invalidation_reason: row.try_get(3)?,
        })
    })
    .transpose()
}

/// `synchronized_standby_slots` on a primary (PG17+): the physical slots of the standbys
/// that must confirm WAL before a failover slot's changes are sent, so a promoted
/// standby never lacks what a consumer already saw. Empty when unset.
pub async fn synchronized_standby_slots(client: &Client) -> Result<Vec<String>, ReplError> {
    let text: Option<String> = client
        .query_one(
            "SELECT pg_catalog.current_setting('synchronized_standby_slots', true)",
            &[],
        )
        .await?
        .try_get(0)?;
    Ok(text
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

/// A physical slot named in `synchronized_standby_slots`, as the primary sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySlot {
    pub name: String,
    /// `None`: no slot of that name (logical decoding of failover slots then waits).
    pub slot_type: Option<String>,
    pub active: bool,
    pub invalidation_reason: Option<String>,
}

/// The primary's view of each slot named in `synchronized_standby_slots` (PG17+).
pub async fn standby_slots(
    client: &Client,
    names: &[String],
) -> Result<Vec<StandbySlot>, ReplError> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let row = client
            .query_opt(
                "SELECT slot_type, active, invalidation_reason \
                 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                &[name],
            )
            .await?;
        out.push(match row {
            Some(row) => StandbySlot {
                name: name.clone(),
                slot_type: row.try_get(0)?,
                active: row.try_get(1)?,
                invalidation_reason: row.try_get(2)?,
            },
            None => StandbySlot {
                name: name.clone(),
                slot_type: None,
                active: false,
                invalidation_reason: None,
            },
        });
    }
    Ok(out)
}

/// `server_version_num` over SQL.
pub async fn server_version_num(client: &Client) -> Result<u32, ReplError> {
    let text: String = client
        .query_one("SHOW server_version_num", &[])
        .await?
        .try_get(0)?;
    text.trim()
        .parse()
        .map_err(|_| ReplError::Protocol(format!("invalid server_version_num {text:?}")))
}

/// What slot sync needs on a standby (PG17+), read on the standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbySettings {
    pub in_recovery: bool,
    pub sync_replication_slots: Option<String>,
    pub hot_standby_feedback: Option<String>,
    pub primary_slot_name: Option<String>,
    /// `None` when the role may not read it (superuser or pg_read_all_settings only).
    pub primary_conninfo: Option<String>,
    /// The standby's copy of `slot`, if any.
    pub slot: Option<SlotFailover>,
}

pub async fn standby_settings(client: &Client, slot: &str) -> Result<StandbySettings, ReplError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(), \
                    pg_catalog.current_setting('sync_replication_slots', true), \
                    pg_catalog.current_setting('hot_standby_feedback', true), \
                    pg_catalog.current_setting('primary_slot_name', true), \
                    CASE WHEN pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') \
                         THEN pg_catalog.current_setting('primary_conninfo', true) END",
            &[],
        )
        .await?;
    Ok(StandbySettings {
        in_recovery: row.try_get(0)?,
        sync_replication_slots: row.try_get(1)?,
        hot_standby_feedback: row.try_get(2)?,
        primary_slot_name: row.try_get(3)?,
        primary_conninfo: row.try_get(4)?,
        slot: slot_failover(client, slot).await?,
    })
}

/// `pg_is_in_recovery()`: true on a standby.
pub async fn in_recovery(client: &Client) -> Result<bool, ReplError> {
    Ok(client
        .query_one("SELECT pg_catalog.pg_is_in_recovery()", &[])
        .await?
        .try_get(0)?)
}
