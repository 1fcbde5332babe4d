//! Text or binary column values for a session (`OUTBOXD_PGOUTPUT_BINARY`).
//!
//! The choice is made before START_REPLICATION, from the catalog's column types and the
//! walsender's output settings (the Relation messages that carry the stream's types come
//! only after it), and checked again against every Relation of the outbox: a column
//! whose type changed to one without a binary decoder ends the session, and the next one
//! streams text (`auto`) or outboxd stops (`on`). Either way no record is published from
//! a value outboxd cannot turn into its text form's bytes (see `outbox_core::binary`).

use outbox_core::{text_only_column, BinaryMode, OutputSettings, TextOnly};
use pgoutput::Relation;
use pgrepl::{preflight, ReplicationConnection};
use tokio_postgres::Client;

use super::config::RelayConfig;
use super::error::RelayError;
use outbox_core::BadRowPolicy;

/// The settings binary values were chosen under, or `None` for text.
pub(super) type Binary = Option<OutputSettings>;

/// Decides the session's format. `ruled_out`: what ended an earlier binary session of
/// this process (a Relation the catalog did not foresee); `auto` then stays with text.
pub(super) async fn choose(
    cfg: &RelayConfig,
    sql: &Client,
    conn: &mut ReplicationConnection,
    ruled_out: Option<&TextOnly>,
) -> Result<Binary, RelayError> {
    if cfg.binary == BinaryMode::Off {
        return Ok(None);
    }
    let settings = OutputSettings {
        time_zone: conn.show("TimeZone").await?,
        date_style: conn.show("DateStyle").await?,
        bytea_output: conn.show("bytea_output").await?,
    };
    let found = match ruled_out {
        Some(found) => Some(found.clone()),
        None if !cfg.rules.relay_table => None,
        None => {
            let t = &cfg.rules.table;
            // A partition has its parent's column types (in its own order), so the
            // parent's columns decide for all of them.
            match preflight::table_columns(sql, &t.schema, &t.table).await? {
                Some(columns) => text_only_column(
                    t,
                    columns.iter().map(|(name, _, oid)| (name.as_str(), *oid)),
                    dead_letters(cfg),
                    &settings,
                ),
                // Missing: the session's preflight says so; text is the safe default.
                None => return Ok(None),
            }
        }
    };
    match (found, cfg.binary) {
        (None, _) => {
            tracing::info!("pgoutput binary mode: on (every column outboxd reads decodes to the bytes of its text form)");
            Ok(Some(settings))
        }
        (Some(found), BinaryMode::On) => Err(RelayError::BinaryRuledOut { found }),
        (Some(found), _) => {
            tracing::info!(reason = %found, "pgoutput binary mode: off for this table, streaming text values");
            Ok(None)
        }
    }
}

/// Checks a Relation of the outbox (or of a partition) against the session's binary
/// choice.
pub(super) fn verify_relation(
    cfg: &RelayConfig,
    binary: &Binary,
    relation: &Relation,
) -> Result<(), RelayError> {
    let Some(settings) = binary else {
        return Ok(());
    };
    let columns = relation
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid));
    match text_only_column(&cfg.rules.table, columns, dead_letters(cfg), settings) {
        None => Ok(()),
        Some(found) if cfg.binary == BinaryMode::On => Err(RelayError::BinaryRuledOut { found }),
        Some(found) => Err(RelayError::BinaryRuledOutByRelation {
            relation: format!("{}.{}", relation.namespace, relation.name),
            found,
        }),
    }
}

fn dead_letters(cfg: &RelayConfig) -> bool {
    cfg.rules.bad_row_policy == BadRowPolicy::DeadLetter
}
