//! `outboxd init`: creates what is missing, in the safe order: table, publication, slot.

use outbox_core::pgtype::quote_ident;
use pgrepl::{preflight, ReplicationConnection};

use super::{EXIT_INTERNAL, EXIT_OK};
use crate::config::Settings;
use crate::wiring;

pub async fn init(s: &Settings) -> i32 {
    match init_inner(s).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("outboxd init failed: {e:#}");
            if let Some(relay) = e.downcast_ref::<outboxd_relay::pipeline::RelayError>() {
                return relay.exit_code();
            }
            if format!("{e:#}").contains("permission denied") {
                3
            } else {
                EXIT_INTERNAL
            }
        }
    }
}

async fn init_inner(s: &Settings) -> anyhow::Result<()> {
    let pg = wiring::connect_config(s);
    let sql = pg.connect_sql().await?;
    let table = format!(
        "{}.{}",
        quote_ident(&s.table_schema),
        quote_ident(&s.table_name)
    );
    let headers = s
        .column_headers
        .as_deref()
        .map(|h| format!(",\n    {} jsonb NULL", quote_ident(h)))
        .unwrap_or_default();
    let ddl = format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    {} uuid PRIMARY KEY,\n    {} text NOT NULL,\n    {} text NOT NULL,\n    {} text NOT NULL,\n    {} jsonb NOT NULL{headers},\n    created_at timestamptz NOT NULL DEFAULT now()\n)",
        quote_ident(&s.column_id),
        quote_ident(&s.column_aggregate_type),
        quote_ident(&s.column_aggregate_id),
        quote_ident(&s.column_event_type),
        quote_ident(&s.column_payload),
    );
    sql.batch_execute(&ddl).await?;
    println!("ok  table {table}");
    if preflight::publication_exists(&sql, &s.publication).await? {
        println!("ok  publication {} (exists)", s.publication);
    } else {
        sql.batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {table} WITH (publish = 'insert', publish_via_partition_root = true)",
            quote_ident(&s.publication)
        ))
        .await?;
        println!("ok  publication {} (created)", s.publication);
    }
    let mut conn = ReplicationConnection::connect(&pg).await?;
    let failover = wiring::failover_slot(s).wanted(conn.supports_failover_slots().await?)?;
    if preflight::slot_state(&sql, &s.slot).await?.is_some() {
        let switch = failover
            && !preflight::slot_failover(&sql, &s.slot)
                .await?
                .is_some_and(|f| f.failover);
        if switch {
            conn.set_slot_failover(&s.slot, true).await?;
            println!("ok  slot {} (exists; switched to a failover slot)", s.slot);
        } else {
            println!("ok  slot {} (exists)", s.slot);
        }
    } else {
        let created = conn
            .create_logical_slot_with(&s.slot, false, failover)
            .await?;
        println!(
            "ok  slot {} (created at {}{}; events committed from here on are relayed)",
            s.slot,
            created.consistent_point,
            if failover { ", failover" } else { "" }
        );
    }
    Ok(())
}
