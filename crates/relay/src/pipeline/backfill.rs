//! `outboxd init --backfill "<condition>"`: publishes the outbox rows a condition selects,
//! read in the snapshot a new slot exported at its consistent point, before anything is
//! streamed from it. Every row committed before that point is in the snapshot and none
//! after it (those the slot streams), so nothing falls between the two and nothing is
//! published by both.
//!
//! Rows go out in `created_at`, id order, mapped exactly as streamed rows are
//! ([`BoundTable::map_insert`] on the row's text values, the dead-letter policy alike),
//! in batches: each batch is acknowledged by Kafka before the state under the slot's
//! `#backfill` key ([`BackfillState`]) says where it ended.
//!
//! Resuming after a kill: the exported snapshot died with the process, but the slot did
//! not (nothing streamed from it: `run` refuses while the state is unfinished), and every
//! transaction committed after its consistent point is still the slot's to stream,
//! whatever the condition says of it now and even if its rows were deleted since. So the
//! slot is kept, and the rows still to publish are read in a fresh snapshot: every row
//! the condition selects past the recorded key. (Dropping the slot and reading a new
//! one's snapshot instead lost what was committed in between and then deleted, or no
//! longer selected.) Rows committed after the slot and selected are then published twice,
//! once read here and once streamed: telling them from older rows updated since (a new
//! `xmin` either way) is not possible from SQL, and a duplicate is the cost that loses
//! nothing.
//!
//! Only a slot that is gone (lost, and created again with `--recreate-lost-slot`) gets a
//! new snapshot: the rows still to publish are then those past the recorded key and those
//! the recorded snapshot did not see (committed between the two slots, whatever their key).

use std::time::Duration;

use bytes::Bytes;
use outbox_core::pgtype::quote_ident;
use outbox_core::{
    check_size, dead_letter_record, oversize_error, BoundTable, CommitContext, OutboxRecord,
    RowError, ShapeError,
};
use pgoutput::{Column, PgTimestamp, Relation, ReplicaIdentity, TupleData, TupleValue};
use pgrepl::{quote_literal, Lsn};
use tokio_postgres::{Client, SimpleQueryMessage};

use super::config::RelayConfig;
use super::error::RelayError;
use crate::kafka::{
    build_producer, BackfillState, Delivery, KafkaSetupError, ProgressError, ProgressStore,
    RelayProducer, SendError, SlotIdentity, SlotRecords,
};
use outbox_core::BadRowPolicy;

/// The column the back-fill orders by (then the id column): the order rows were written.
pub const ORDER_COLUMN: &str = "created_at";

/// Rows per batch: one acknowledged batch per state write.
const BATCH: usize = 500;

/// How long a batch may wait for Kafka's acknowledgements.
const ACK_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error("the back-fill's query failed: {}; {}", pgrepl::error_chain(.0), self.remedy().unwrap_or_default())]
    Sql(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Shape(#[from] ShapeError),
    #[error("{table} has no column {ORDER_COLUMN}: {}", self.remedy().unwrap_or_default())]
    NoOrderColumn { table: String },
    #[error("{table} was not found")]
    NoTable { table: String },
    #[error("rows of {table} matching the condition have a NULL {ORDER_COLUMN} or id: {}", self.remedy().unwrap_or_default())]
    NullOrder { table: String },
    #[error("a back-filled row cannot be published and OUTBOXD_BAD_ROW_POLICY is stop: {error}. {}", self.remedy().unwrap_or_default())]
    BadRow { error: RowError },
    #[error("{0}")]
    Kafka(#[from] KafkaSetupError),
    #[error("producing a back-filled row failed: {0}")]
    Send(#[from] SendError),
    #[error("Kafka did not acknowledge a back-filled row: {0}")]
    Delivery(String),
    #[error("writing the back-fill's state to the progress topic failed: {0}")]
    Progress(#[from] ProgressError),
}

impl BackfillError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            BackfillError::Sql { .. } => String::from(
                "check the condition (it is SQL, evaluated on the outbox table as `WHERE \
                (<condition>)`)",
            ),
            BackfillError::NoOrderColumn { table, .. } => format!(
                "the back-fill publishes rows in {ORDER_COLUMN}, id order (sql/outbox.sql has \
                it). Add it (ALTER TABLE {table} ADD COLUMN {ORDER_COLUMN} timestamptz NOT \
                NULL DEFAULT pg_catalog.now()), or re-publish the rows by hand"
            ),
            BackfillError::NullOrder { table, .. } => format!(
                "the back-fill publishes rows in {ORDER_COLUMN}, id order, and resumes by \
                them, so such a row could be passed over. Give them a value (UPDATE {table} \
                SET {ORDER_COLUMN} = pg_catalog.now() WHERE {ORDER_COLUMN} IS NULL; a row \
                without an id needs one too: consumers dedup by it), then run the same \
                command again"
            ),
            BackfillError::BadRow { .. } => String::from(
                "Fix the row with an UPDATE (the resume reads it again), or set \
                    OUTBOXD_BAD_ROW_POLICY=dead-letter; deleting it would publish it nowhere",
            ),
            _ => return None,
        };
        Some(text)
    }
}

/// Where the back-fill publishes and keeps its state.
pub struct Backfill<'a> {
    pub cfg: &'a RelayConfig,
    /// The SQL connection; the back-fill runs one read-only transaction on it.
    pub sql: &'a Client,
    pub store: &'a ProgressStore,
    pub identity: &'a SlotIdentity,
}

/// The slot the rows are read for: the snapshot it exported, and its consistent point.
pub struct SlotSnapshot<'a> {
    /// The snapshot the slot exported as it was created now; `None` when resuming over the
    /// slot a killed back-fill created, whose snapshot died with it: rows are then read in
    /// a fresh snapshot, those the state's recorded snapshot saw.
    pub exported: Option<&'a str>,
    pub consistent_point: Lsn,
    /// The server's clock just before the slot was created (PostgreSQL microseconds):
    /// every back-filled row committed before it, so its records carry it as commit time.
    pub created_at: i64,
}

/// The `outboxd init` command that resumes `state`, quoted for a POSIX shell.
pub fn resume_command(state: &BackfillState) -> String {
    let recreate = if state.recreate_lost_slot {
        " --recreate-lost-slot"
    } else {
        ""
    };
    format!(
        "outboxd init{recreate} --backfill {}",
        shell_quote(&state.condition)
    )
}

/// Stops `run` (and `init` without the same `--backfill`) while the slot's back-fill has
/// not finished: streaming would confirm positions past rows it has not published yet.
pub fn refuse_unfinished_backfill(
    records: &SlotRecords,
    progress_topic: &str,
    identity: &SlotIdentity,
) -> Result<(), RelayError> {
    match &records.backfill {
        Some(state) if !state.done => Err(RelayError::BackfillUnfinished {
            slot: identity.slot.clone(),
            key: identity.backfill_key(),
            progress_topic: progress_topic.to_owned(),
            published: state.published,
            command: resume_command(state),
        }),
        _ => Ok(()),
    }
}

/// `"text"` when nothing in it is special inside double quotes, else `'text'` with each
/// `'` written `'\''`.
fn shell_quote(text: &str) -> String {
    if !text.contains(['"', '$', '`', '\\', '!']) {
        return format!("\"{text}\"");
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

impl Backfill<'_> {
    /// Publishes the rows `state` still has to, in `slot`'s snapshot; `progress` hears
    /// the state after each acknowledged batch. `state.done` once every row is acked.
    pub async fn run(
        &self,
        slot: &SlotSnapshot<'_>,
        state: &mut BackfillState,
        progress: &mut dyn FnMut(&BackfillState),
    ) -> Result<(), BackfillError> {
        let table = self.cfg.rules.table.qualified_name();
        let begin = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
        self.sql
            .batch_execute(&match slot.exported {
                Some(exported) => {
                    format!(
                        "{begin}; SET TRANSACTION SNAPSHOT {}",
                        quote_literal(exported)
                    )
                }
                None => begin.to_owned(),
            })
            .await?;
        let result = self.in_snapshot(&table, slot, state, progress).await;
        // Read-only: ending it either way loses nothing.
        let ended = self.sql.batch_execute("ROLLBACK").await;
        result?;
        ended?;
        Ok(())
    }

    async fn in_snapshot(
        &self,
        table: &str,
        slot: &SlotSnapshot<'_>,
        state: &mut BackfillState,
        progress: &mut dyn FnMut(&BackfillState),
    ) -> Result<(), BackfillError> {
        let snapshot: String = self
            .sql
            .query_one("SELECT pg_catalog.pg_current_snapshot()::text", &[])
            .await?
            .try_get(0)?;
        let bound = self.bind(table).await?;
        let order_at = |name: &str| bound.1.iter().position(|c| c == name);
        let (Some(order_index), Some(id_index)) = (
            order_at(ORDER_COLUMN),
            order_at(&self.cfg.rules.table.columns.id),
        ) else {
            return Err(BackfillError::NoOrderColumn {
                table: table.to_owned(),
            });
        };
        let (bound, names) = bound;
        let columns: Vec<String> = names
            .iter()
            .map(|n| format!("t.{}", quote_ident(n)))
            .collect();
        let (order, id) = (
            format!("t.{}", quote_ident(ORDER_COLUMN)),
            format!("t.{}", quote_ident(&self.cfg.rules.table.columns.id)),
        );
        // A NULL sorts last and compares as unknown: a resume would pass such a row over.
        let nulls: bool = self
            .sql
            .query_one(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM {table} t WHERE ({}) AND ({order} IS NULL OR {id} IS NULL))",
                    state.condition
                ),
                &[],
            )
            .await?
            .try_get(0)?;
        if nulls {
            return Err(BackfillError::NullOrder {
                table: table.to_owned(),
            });
        }
        let past = |(at, key): &(String, String)| {
            format!(
                "({order}, {id}) > ({}, {})",
                quote_literal(at),
                quote_literal(key)
            )
        };
        let resume = match (slot.exported, &state.snapshot, &state.after) {
            // Over the slot the key was read for: every selected row past the key. Those
            // committed after the slot are streamed too (published twice): a row the slot's
            // snapshot saw and that was updated since has a new `xmin`, so "not seen" is
            // no proof that a row is the slot's to stream.
            (None, _, Some(after)) => format!(" AND {}", past(after)),
            (None, _, None) => String::new(),
            // A new slot after a lost one: also what the recorded snapshot did not see
            // (committed between the two slots, or updated since: published again).
            (Some(_), Some(seen), Some(after)) => {
                format!(" AND ({} OR NOT {})", past(after), seen_by(seen))
            }
            (Some(_), _, _) => String::new(),
        };
        if slot.exported.is_some() {
            // The new slot's snapshot, before any row: a kill from here on resumes over
            // this slot. Every row it saw is still to publish (`after` none), those of the
            // filter above included.
            state.snapshot = Some(snapshot.clone());
            state.consistent_point = Some(slot.consistent_point);
            state.slot_created_at = Some(slot.created_at);
            state.after = None;
            self.store.write_backfill(self.identity, state).await?;
        }
        // The condition is the operator's SQL (trusted, docs/operations.md); on this
        // connection it resolves functions and operators in pg_catalog only.
        self.sql
            .batch_execute(&format!(
                "DECLARE outboxd_backfill NO SCROLL CURSOR FOR SELECT {} FROM {table} t \
                 WHERE ({}){resume} ORDER BY {order}, {id}",
                columns.join(", "),
                state.condition
            ))
            .await?;
        let (sink, deliveries) = tokio::sync::mpsc::unbounded_channel();
        let producer = build_producer(&self.cfg.producer, sink)?;
        let mut acks = Acks {
            deliveries,
            outstanding: 0,
        };
        let ctx = CommitContext::new(slot.consistent_point, PgTimestamp(slot.created_at));
        loop {
            let rows = self
                .sql
                .simple_query(&format!("FETCH {BATCH} FROM outboxd_backfill"))
                .await?;
            let (mut sent, mut dead, mut last) = (0u64, 0u64, None);
            for message in rows {
                let SimpleQueryMessage::Row(row) = message else {
                    continue;
                };
                let values: Vec<Option<&str>> = (0..names.len()).map(|i| row.get(i)).collect();
                let tuple = TupleData {
                    columns: values
                        .iter()
                        .map(|v| match v {
                            Some(text) => TupleValue::Text(Bytes::copy_from_slice(text.as_bytes())),
                            None => TupleValue::Null,
                        })
                        .collect(),
                };
                let max = self.cfg.rules.max_message_bytes;
                let mapped = bound
                    .map_insert(&tuple, &ctx)
                    .and_then(|r| check_size(&r, max).map(|()| r));
                let refused = match mapped {
                    Ok(record) => acks
                        .send(&producer, &record)
                        .await?
                        .map(|size| oversize_error(&record, size, max)),
                    Err(error) => Some(error),
                };
                if let Some(error) = refused {
                    dead += 1;
                    let dlq = self.dead_letter(&bound, &tuple, error, &ctx)?;
                    if acks.send(&producer, &dlq).await?.is_some() {
                        return Err(BackfillError::Delivery(
                            "a dead letter is larger than the producer's message.max.bytes".into(),
                        ));
                    }
                }
                sent += 1;
                let text = |i: usize| {
                    values
                        .get(i)
                        .copied()
                        .flatten()
                        .unwrap_or_default()
                        .to_owned()
                };
                last = Some((text(order_index), text(id_index)));
            }
            let Some(last) = last else { break };
            acks.wait_all().await?;
            state.after = Some(last);
            state.published += sent;
            state.dead_lettered += dead;
            self.store.write_backfill(self.identity, state).await?;
            progress(state);
        }
        state.done = true;
        self.store.write_backfill(self.identity, state).await?;
        Ok(())
    }

    /// Binds the table as streamed rows are bound: its columns by name and type.
    async fn bind(&self, table: &str) -> Result<(BoundTable, Vec<String>), BackfillError> {
        let spec = &self.cfg.rules.table;
        let rows = self
            .sql
            .query(
                "SELECT a.attname::text, a.atttypid::oid FROM pg_catalog.pg_attribute a \
                 WHERE a.attrelid = pg_catalog.to_regclass($1::text)::oid AND a.attnum > 0::int2 \
                 AND NOT a.attisdropped ORDER BY a.attnum",
                &[&table],
            )
            .await?;
        if rows.is_empty() {
            return Err(BackfillError::NoTable {
                table: table.to_owned(),
            });
        }
        let mut columns = Vec::with_capacity(rows.len());
        for row in &rows {
            let name: String = row.try_get(0)?;
            let oid: u32 = row.try_get(1)?;
            columns.push(Column::new(&name, oid));
        }
        let names = columns.iter().map(|c| c.name.clone()).collect();
        let relation = Relation {
            xid: None,
            rel_id: 0,
            namespace: spec.schema.clone(),
            name: spec.table.clone(),
            replica_identity: ReplicaIdentity::Default,
            columns,
        };
        Ok((BoundTable::bind(&relation, spec)?, names))
    }

    fn dead_letter(
        &self,
        table: &BoundTable,
        tuple: &TupleData,
        error: RowError,
        ctx: &CommitContext,
    ) -> Result<OutboxRecord, BackfillError> {
        match self.cfg.rules.bad_row_policy {
            BadRowPolicy::Stop => Err(BackfillError::BadRow { error }),
            BadRowPolicy::DeadLetter => {
                tracing::warn!(error = %error, "back-filled row dead-lettered");
                Ok(dead_letter_record(
                    table,
                    tuple,
                    &error,
                    ctx,
                    &self.cfg.rules.dead_letter_topic,
                    self.cfg.rules.max_message_bytes,
                ))
            }
        }
    }
}

/// The producer's acknowledgements still owed.
struct Acks {
    deliveries: tokio::sync::mpsc::UnboundedReceiver<Delivery>,
    outstanding: usize,
}

impl Acks {
    /// Queues one record; `Some(size)` when it is too large for the producer.
    async fn send(
        &mut self,
        producer: &RelayProducer,
        rec: &OutboxRecord,
    ) -> Result<Option<usize>, BackfillError> {
        loop {
            match producer.send_outbox(rec, self.outstanding) {
                Ok(()) => {
                    self.outstanding += 1;
                    return Ok(None);
                }
                Err(SendError::MessageTooLarge { size }) => return Ok(Some(size)),
                // librdkafka's own queue is full (it holds more than a batch, so rare).
                Err(SendError::QueueFull) => self.one().await?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits for one acknowledgement; a failure stops the back-fill, which resumes from
    /// the last recorded batch: duplicates, never a gap, never a later row first.
    async fn one(&mut self) -> Result<(), BackfillError> {
        let d = tokio::time::timeout(ACK_WAIT, self.deliveries.recv())
            .await
            .map_err(|_| {
                BackfillError::Delivery(format!("no acknowledgement within {ACK_WAIT:?}"))
            })?
            .ok_or_else(|| BackfillError::Delivery("the producer was closed".into()))?;
        self.outstanding = self.outstanding.saturating_sub(1);
        d.outcome
            .map(|_| ())
            .map_err(|f| BackfillError::Delivery(f.to_string()))
    }

    async fn wait_all(&mut self) -> Result<(), BackfillError> {
        while self.outstanding > 0 {
            self.one().await?;
        }
        Ok(())
    }
}

/// SQL that is true when the row's inserting transaction is visible in `snapshot` (a
/// `pg_current_snapshot()` text of this cluster). `xmin` is 32 bits: it is widened with
/// the epoch of the current snapshot, which is right for any row written fewer than 2^31
/// transactions ago; an older (frozen) row widened wrong reads as "not seen", and is
/// published again.
fn seen_by(snapshot: &str) -> String {
    let now = "pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::int8";
    let widened = format!("((({now} >> 32) << 32) + t.xmin::text::int8)");
    format!(
        "pg_catalog.pg_visible_in_snapshot(GREATEST(CASE WHEN {widened} >= {now} THEN {widened} - 4294967296::int8 ELSE {widened} END, 0::int8)::text::xid8, {}::pg_snapshot)",
        quote_literal(snapshot)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_command_quotes_the_condition_for_a_shell() {
        let mut state = BackfillState {
            condition: "status = 'pending'".into(),
            ..BackfillState::default()
        };
        assert_eq!(
            resume_command(&state),
            "outboxd init --backfill \"status = 'pending'\""
        );
        state.condition = "note = \"$x\" and s = 'a'".into();
        state.recreate_lost_slot = true;
        assert_eq!(
            resume_command(&state),
            "outboxd init --recreate-lost-slot --backfill 'note = \"$x\" and s = '\\''a'\\'''"
        );
    }
}
