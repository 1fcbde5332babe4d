//! The rules of one replication session, with no IO: decoded pgoutput messages,
//! keepalives and delivery reports in; records to send, the position to confirm and the
//! session's claim out. The relay's session (`crates/relay`) feeds it from the stream and
//! the producer; the simulator (`crates/sim`) feeds it seeded histories and faults. Both
//! run this code, so what the simulator checks is what the relay does.
//!
//! What it decides:
//! - what each relation is (the outbox, a partition of it, another table);
//! - which rows become which records, which are dead-lettered or stop the session
//!   ([`BadRowPolicy`]), and which of a replay are already in Kafka ([`ReplayCore`]);
//! - what is in flight and how far the slot may be confirmed ([`InFlightLedger`]),
//!   capped at the publication's last matching look;
//! - that a shutdown first finishes the open transaction ([`SessionCore::may_stop`]).
//!
//! Records go out through [`SessionCore::take_send`]; the caller hands each to the
//! producer and answers [`SessionCore::sent`] (or [`SessionCore::send_failed`]) before
//! the next input, since a record the producer refuses as too large becomes a dead letter
//! in the same transaction. After any [`SessionError`] the session is over: the caller
//! drops the core (and the producer) and starts again from the slot.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use pgoutput::{
    Insert, LogicalMessage, Lsn, Message, PgTimestamp, Relation, Truncated, TruncatedMessage,
    TupleData,
};

use crate::delivered::{row_identity, DeliveredPosition, Doubt, RowId, TxnId};
use crate::dlq::{dead_letter_message, dead_letter_message_head, dead_letter_record};
use crate::error::RowError;
use crate::ledger::{InFlightLedger, Outcome, Outgoing, Ticket};
use crate::mapping::BoundTable;
use crate::record::{check_size, oversize_error, oversize_row_error, CommitContext, OutboxRecord};
use crate::replay::{Held, NextRow, ReplayCore, ReplayStart, Step};

/// The prefix of the transactional message `sql/publication-guard.sql`'s event trigger
/// emits in every transaction that changes a publication: the exact WAL position of the
/// change, where polling the catalog only brackets it.
pub const PUBLICATION_GUARD_PREFIX: &str = "outboxd.publication";

mod interface;

pub use interface::{
    After, BadRowPolicy, CoreConfig, Observe, RelationRole, Sent, SessionError, Skipped,
};

/// A record to hand to the producer under `ticket`, answered with
/// [`SessionCore::sent`] or [`SessionCore::send_failed`] before the next input: one
/// dropped unanswered holds the position (and a non-transactional message's own
/// transaction) open for good.
#[derive(Debug)]
#[must_use]
pub struct ToSend {
    pub ticket: Ticket,
    pub record: OutboxRecord,
    origin: Origin,
    /// The non-transactional message's own ledger transaction ends with this send.
    closes_own_txn: bool,
}

impl ToSend {
    /// Whether it was held while its replay was proven: refused now, nothing can take
    /// its place in its transaction, which is already committed, so the session stops.
    pub fn was_held(&self) -> bool {
        matches!(self.origin, Origin::Released)
    }
}

/// What a record came from, for the dead letter it becomes if it is refused.
#[derive(Debug)]
enum Origin {
    Row {
        table: Arc<BoundTable>,
        tuple: TupleData,
        ctx: CommitContext,
        row: Option<RowId>,
    },
    Message {
        message: Message,
        ctx: CommitContext,
        row: Option<RowId>,
    },
    DeadLetter {
        error: RowError,
    },
    /// Held while its replay was proven, then doubted.
    Released,
}

/// What the rules make of a relation of the stream.
#[derive(Debug)]
enum Role {
    /// The outbox table, or a partition of it (any depth; bound by column names).
    Outbox(Arc<BoundTable>),
    /// Another published relation: its inserts are counted, not published.
    Ignored { name: String, unreported: u64 },
}

/// See the module docs.
pub struct SessionCore<O> {
    cfg: CoreConfig,
    obs: O,
    ledger: InFlightLedger,
    relations: HashMap<u32, Role>,
    txn: Option<CommitContext>,
    /// End of the last transaction received, for emitted non-transactional messages.
    last_end_lsn: Lsn,
    confirmed: Lsn,
    start: Lsn,
    replay: ReplayCore<OutboxRecord>,
    /// Confirm no further (`None`: no publication is watched).
    cap: Option<Lsn>,
    sends: VecDeque<ToSend>,
    last_commit_unix_micros: i64,
    events_acked: u64,
}

impl<O: Observe> SessionCore<O> {
    /// `replay.start` is the slot's confirmed position; `watch_publication`: the slot is
    /// confirmed only up to [`SessionCore::raise_cap`].
    pub fn new(cfg: CoreConfig, replay: ReplayStart, watch_publication: bool, obs: O) -> Self {
        let start = replay.start;
        let mut core = SessionCore {
            ledger: InFlightLedger::new(start, cfg.caps),
            cfg,
            obs,
            relations: HashMap::new(),
            txn: None,
            last_end_lsn: start,
            confirmed: start,
            start,
            replay: ReplayCore::new(replay),
            cap: watch_publication.then_some(start),
            sends: VecDeque::new(),
            last_commit_unix_micros: 0,
            events_acked: 0,
        };
        // What the claim's first look found (cut at the server's end, other settings).
        core.report_doubts();
        core
    }

    pub fn observer(&mut self) -> &mut O {
        &mut self.obs
    }

    /// Whether the stream may be read: room in flight, and in the row ledger (rows acked
    /// past one that is not: [`crate::RowLedger`]). A hold that fills either spills first
    /// (see [`ReplayCore::spill`]: nothing held is ever acked, so waiting for room would
    /// wait forever). With nothing awaiting a report, no ack could make room.
    pub fn make_room(&mut self) -> Result<bool, SessionError> {
        let room = |s: &Self| {
            s.ledger.has_room() && (s.replay.rows_have_room() || s.awaiting_reports() == 0)
        };
        if self.replay.held_len() > 0 && !room(self) {
            for h in self.replay.spill() {
                self.drop_delivered(h)?;
            }
            self.obs.held(self.replay.held_len());
        }
        // The record a spill keeps back gets no report until the proof, which lies ahead
        // in the stream: alone in flight, it must not stop the reading (a cap of 1, or a
        // byte cap below one record).
        let only_kept_back = self.replay.spilled() && self.awaiting_reports() == 0;
        Ok(room(self) || only_kept_back)
    }

    /// A held record left unpublished as delivered: its ticket settles as acked.
    fn drop_delivered(&mut self, h: Held<OutboxRecord>) -> Result<(), SessionError> {
        self.ledger.delivered(h.ticket, Outcome::Acked)?;
        self.obs.skipped(Skipped::Held(&h.record));
        Ok(())
    }

    /// The next record to hand to the producer.
    pub fn take_send(&mut self) -> Option<ToSend> {
        self.sends.pop_front()
    }

    /// A keepalive with the server's WAL end.
    pub fn on_keepalive(&mut self, wal_end: Lsn) -> Result<(), SessionError> {
        if self.txn.is_none() {
            let step = self.replay.keepalive(wal_end);
            self.apply(step)?;
            if self.cfg.idle_flush {
                self.ledger.on_keepalive(wal_end);
            }
        }
        Ok(())
    }

    /// Whether a Relation message needs the catalog's word on whether it is a partition of
    /// the outbox, for [`SessionCore::on_relation`].
    pub fn asks_parent(&self, r: &Relation) -> bool {
        self.cfg.relay_table && !self.cfg.table.matches(r)
    }

    /// `partition_of_outbox`: the catalog's answer when [`SessionCore::asks_parent`].
    pub fn on_relation(
        &mut self,
        r: &Relation,
        partition_of_outbox: Option<bool>,
    ) -> Result<RelationRole, SessionError> {
        let table = &self.cfg.table;
        let bound = if !self.cfg.relay_table {
            None
        } else if table.matches(r) {
            Some(BoundTable::bind(r, table)?)
        } else if partition_of_outbox.ok_or_else(|| {
            SessionError::Protocol(format!(
                "relation {} taken without the catalog's word on its parent",
                r.rel_id
            ))
        })? {
            Some(BoundTable::bind_partition(r, table)?)
        } else if let Ok(bound) = BoundTable::bind_partition(r, table) {
            // Shaped like the outbox but, in today's catalog, neither it nor a partition
            // of it: ignoring it could drop events, unless the operator named it.
            let relation = crate::pgtype::relation_setting_name(&r.namespace, &r.name);
            if !self.cfg.former_partitions.contains(&relation) {
                let table = table.qualified_name();
                return Err(SessionError::OutboxLikeRelation { relation, table });
            }
            Some(bound)
        } else {
            None
        };
        let (role, told) = match bound {
            Some(bound) => (Role::Outbox(Arc::new(bound)), RelationRole::Outbox),
            None => (
                Role::Ignored {
                    name: crate::pgtype::relation_setting_name(&r.namespace, &r.name),
                    // A re-sent Relation (after a schema change) keeps the count not reported.
                    unreported: match self.relations.get(&r.rel_id) {
                        Some(Role::Ignored { unreported, .. }) => *unreported,
                        _ => 0,
                    },
                },
                RelationRole::Ignored,
            ),
        };
        self.relations.insert(r.rel_id, role);
        Ok(told)
    }

    /// Any other message of the stream; `now` dates a non-transactional message.
    pub fn on_message(
        &mut self,
        message: LogicalMessage,
        now: PgTimestamp,
    ) -> Result<After, SessionError> {
        match message {
            LogicalMessage::Begin(b) => {
                self.ledger.begin()?;
                let txn = TxnId::new(b.final_lsn, b.xid, b.commit_time);
                self.txn = Some(CommitContext::new(b.final_lsn, b.commit_time));
                self.last_commit_unix_micros = b.commit_time.unix_micros();
                let step = self.replay.begin(txn);
                if let Step::Resume { rows } = step {
                    self.obs.resuming(txn, rows);
                }
                self.apply(step)?;
            }
            LogicalMessage::Commit(c) => {
                // Before the ledger's: a mismatch must leave the transaction unconfirmed.
                let step = self.replay.commit(c.end_lsn);
                self.report_doubts();
                let step = step.map_err(SessionError::PartialReplay)?;
                self.ledger.commit(c.end_lsn)?;
                self.txn = None;
                self.last_end_lsn = self.last_end_lsn.max(c.end_lsn);
                self.apply(step)?;
            }
            LogicalMessage::Relation(r) => {
                if self.asks_parent(&r) {
                    return Err(SessionError::Protocol(format!(
                        "relation {} needs on_relation with its parent looked up",
                        r.rel_id
                    )));
                }
                self.on_relation(&r, None)?;
            }
            LogicalMessage::Insert(i) => self.on_insert(i)?,
            LogicalMessage::Message(m) => return self.on_emitted(m, None, now),
            // Deletes (insert-then-delete), updates and truncates are not events.
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Type(_) => {}
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected pgoutput message {:?} (streaming and two-phase are not requested)",
                    char::from(other.tag())
                )))
            }
        }
        Ok(After::Nothing)
    }

    /// A message too long to hold whole, read through with only its start kept (see
    /// [`crate::record::frame_limit`]): treated as its whole version would be, except
    /// that what would be published cannot be, so it is a bad row of kind
    /// [`crate::RowErrorKind::Oversize`].
    pub fn on_truncated(
        &mut self,
        message: TruncatedMessage,
        now: PgTimestamp,
    ) -> Result<After, SessionError> {
        match &message.kind {
            Truncated::Insert {
                rel_id, leading, ..
            } => {
                let Some((table, ctx)) = self.outbox_insert(*rel_id)? else {
                    return Ok(After::Nothing);
                };
                let identity = table.row_identity(leading);
                let Some(row) = self.next_row(identity, Skipped::Row(leading))? else {
                    return Ok(After::Nothing);
                };
                let max = self.cfg.max_message_bytes;
                let error = oversize_row_error("the row", message.len, max)
                    .with_event_id(table.event_id_text(leading).as_deref());
                let dlq = dead_letter_record(
                    &table,
                    leading,
                    &error,
                    &ctx,
                    &self.cfg.dead_letter_topic,
                    max,
                );
                self.bad_row(error, dlq, ctx, row, false)?;
                Ok(After::Nothing)
            }
            // As for whole ones: not events.
            Truncated::Update { .. } | Truncated::Delete { .. } => Ok(After::Nothing),
            // A prefix longer than the head kept is neither outboxd's nor the guard's.
            Truncated::Message { .. } => match message.kind.as_message() {
                Some(m) => self.on_emitted(m, Some(message.len), now),
                None => Ok(After::Nothing),
            },
        }
    }

    /// The table and transaction of an insert into `rel_id` when it is an outbox row;
    /// `None` (counted) for an ignored relation.
    fn outbox_insert(
        &mut self,
        rel_id: u32,
    ) -> Result<Option<(Arc<BoundTable>, CommitContext)>, SessionError> {
        let table = match self.relations.get_mut(&rel_id) {
            Some(Role::Outbox(t)) => Arc::clone(t),
            Some(Role::Ignored { unreported, .. }) => {
                *unreported = unreported.saturating_add(1);
                return Ok(None);
            }
            None => {
                return Err(SessionError::Protocol(format!(
                    "insert into relation {rel_id} before its Relation message"
                )))
            }
        };
        let ctx = self
            .txn
            .ok_or_else(|| SessionError::Protocol("insert outside a transaction".into()))?;
        Ok(Some((table, ctx)))
    }

    /// The replay's word on the next published row: `None` if Kafka has it (skipped).
    fn next_row(
        &mut self,
        identity: u64,
        skipped: Skipped<'_>,
    ) -> Result<Option<Option<RowId>>, SessionError> {
        let next = self.replay.next_row(identity);
        self.report_doubts();
        match next.map_err(SessionError::PartialReplay)? {
            NextRow::Publish(row) => Ok(Some(row)),
            NextRow::InKafka => {
                self.obs.skipped(skipped);
                Ok(None)
            }
        }
    }

    fn on_insert(&mut self, ins: Insert) -> Result<(), SessionError> {
        let Some((table, ctx)) = self.outbox_insert(ins.rel_id)? else {
            return Ok(());
        };
        // Every outbox row is published: as its record or as a dead letter.
        let identity = table.row_identity(&ins.new_tuple);
        let Some(row) = self.next_row(identity, Skipped::Row(&ins.new_tuple))? else {
            return Ok(());
        };
        let max = self.cfg.max_message_bytes;
        let mapped = table
            .map_insert(&ins.new_tuple, &ctx)
            .and_then(|r| check_size(&r, max).map(|()| r));
        match mapped {
            Ok(record) => {
                let origin = Origin::Row {
                    table,
                    tuple: ins.new_tuple,
                    ctx,
                    row,
                };
                self.produce(record, origin, ctx, row, false)
            }
            Err(error) => {
                let dlq = dead_letter_record(
                    &table,
                    &ins.new_tuple,
                    &error,
                    &ctx,
                    &self.cfg.dead_letter_topic,
                    max,
                );
                self.bad_row(error, dlq, ctx, row, false)
            }
        }
    }

    /// `whole_len`: the message was read through for its size, this long, and `m` has
    /// no content.
    fn on_emitted(
        &mut self,
        m: Message,
        whole_len: Option<usize>,
        now: PgTimestamp,
    ) -> Result<After, SessionError> {
        if m.prefix == PUBLICATION_GUARD_PREFIX && m.is_transactional() {
            let commit = self.txn.map(|t| (t.commit_lsn, t.commit_time));
            return Ok(After::LookAtPublication { commit });
        }
        let Some(mapper) = self.cfg.emit.as_ref() else {
            return Ok(After::Nothing);
        };
        if m.prefix != mapper.prefix() {
            return Ok(After::Nothing);
        }
        // A non-transactional message arrives outside Begin/Commit; it gets a transaction
        // of its own in the ledger that completes at the last commit end, so it holds
        // the watermark until acked but never moves it past anything unseen.
        let own_txn = self.txn.is_none();
        let ctx = match self.txn {
            Some(ctx) => ctx,
            None => CommitContext::non_transactional(&m, now),
        };
        let max = self.cfg.max_message_bytes;
        let mapped = match whole_len {
            // The prefix is ours: published whole, it would be a record or a dead letter.
            Some(len) => Err(oversize_row_error(
                &format!("the message with prefix {:?} at {}", m.prefix, m.lsn),
                len,
                max,
            )),
            None => mapper
                .map_message(&m, &ctx)
                .and_then(|r| r.map(|r| check_size(&r, max).map(|()| r)).transpose()),
        };
        // Only what is published (a record or a dead letter) is a row of the transaction.
        let Some(mapped) = mapped.transpose() else {
            return Ok(After::Nothing);
        };
        // Its position is where it is in the WAL: the same on every replay.
        let identity = row_identity(b'm', &m.lsn.0.to_be_bytes());
        let Some(row) = self.next_row(identity, Skipped::Message(&m))? else {
            return Ok(After::Nothing);
        };
        if own_txn {
            self.ledger.begin()?;
        }
        match mapped {
            Ok(record) => {
                let origin = Origin::Message {
                    message: m,
                    ctx,
                    row,
                };
                self.produce(record, origin, ctx, row, own_txn)?;
            }
            Err(error) => {
                let topic = &self.cfg.dead_letter_topic;
                let dlq = match whole_len {
                    Some(_) => dead_letter_message_head(&m, &error, &ctx, topic, max),
                    None => dead_letter_message(&m, &error, &ctx, topic, max),
                };
                self.bad_row(error, dlq, ctx, row, own_txn)?;
            }
        }
        Ok(After::Nothing)
    }

    fn bad_row(
        &mut self,
        error: RowError,
        dead_letter: OutboxRecord,
        ctx: CommitContext,
        row: Option<RowId>,
        closes_own_txn: bool,
    ) -> Result<(), SessionError> {
        match self.cfg.bad_row_policy {
            // Not dead-lettered: the slot stays before it.
            BadRowPolicy::Stop => Err(SessionError::BadRow {
                error,
                commit_lsn: ctx.commit_lsn,
                skip_to: match closes_own_txn {
                    true => ctx.commit_lsn,
                    false => Lsn(ctx.commit_lsn.0.saturating_add(1)),
                },
            }),
            BadRowPolicy::DeadLetter => {
                let origin = Origin::DeadLetter { error };
                self.produce(dead_letter, origin, ctx, row, closes_own_txn)
            }
        }
    }

    /// Registers a record in flight, then holds it (a replay being proven) or queues it.
    fn produce(
        &mut self,
        record: OutboxRecord,
        origin: Origin,
        ctx: CommitContext,
        row: Option<RowId>,
        closes_own_txn: bool,
    ) -> Result<(), SessionError> {
        let ticket = self.ledger.produced(Outgoing {
            topic: &record.topic,
            bytes: record.approx_size(),
            commit_unix_micros: ctx.commit_time.unix_micros(),
            row,
        })?;
        if self.replay.holding() {
            if let Origin::DeadLetter { error } = &origin {
                self.obs.dead_lettered(error, &self.cfg.dead_letter_topic);
            }
            if let Some(dropped) = self.replay.hold(ticket, record, row) {
                self.drop_delivered(dropped)?;
            }
            self.obs.held(self.replay.held_len());
            if closes_own_txn {
                self.ledger.commit(self.last_end_lsn)?;
            }
            return Ok(());
        }
        self.sends.push_back(ToSend {
            ticket,
            record,
            origin,
            closes_own_txn,
        });
        Ok(())
    }

    /// The producer's answer to a [`ToSend`] taken from [`SessionCore::take_send`].
    pub fn sent(&mut self, send: ToSend, how: Sent) -> Result<(), SessionError> {
        let size = match how {
            Sent::Queued => {
                if let Origin::DeadLetter { error } = &send.origin {
                    self.obs.dead_lettered(error, &self.cfg.dead_letter_topic);
                }
                if send.closes_own_txn {
                    self.ledger.commit(self.last_end_lsn)?;
                }
                return Ok(());
            }
            Sent::TooLarge { size } => size,
        };
        if matches!(send.origin, Origin::DeadLetter { .. } | Origin::Released) {
            // Nothing replaces it: the session stops, and the position stays before it
            // even for a caller that would confirm what is acked after an error.
            self.ledger.delivered(send.ticket, Outcome::Failed)?;
        } else {
            // Its dead letter takes its place in the transaction.
            self.ledger.refused(send.ticket)?;
        }
        let max = self.cfg.max_message_bytes;
        let own = send.closes_own_txn;
        match send.origin {
            // Only if the producer's measure ever differs from check_size's.
            Origin::Row {
                table,
                tuple,
                ctx,
                row,
            } => {
                let error = oversize_error(&send.record, size, max);
                let dlq = dead_letter_record(
                    &table,
                    &tuple,
                    &error,
                    &ctx,
                    &self.cfg.dead_letter_topic,
                    max,
                );
                self.bad_row(error, dlq, ctx, row, own)
            }
            Origin::Message { message, ctx, row } => {
                let error = oversize_error(&send.record, size, max);
                let dlq =
                    dead_letter_message(&message, &error, &ctx, &self.cfg.dead_letter_topic, max);
                self.bad_row(error, dlq, ctx, row, own)
            }
            // Dead letters are shrunk to fit: only a limit below what they can shrink to
            // gets here. Stop rather than confirm past the row.
            Origin::DeadLetter { error } => Err(SessionError::DeadLetterTooLarge { error, size }),
            Origin::Released => Err(SessionError::ReleasedTooLarge {
                topic: send.record.topic.to_string(),
                size,
            }),
        }
    }

    /// The producer failed to take a [`ToSend`]: no report will come, and the session ends.
    pub fn send_failed(&mut self, send: ToSend) -> Result<(), SessionError> {
        self.ledger.delivered(send.ticket, Outcome::Failed)?;
        Ok(())
    }

    /// A delivery report (`acked`: the broker has it), reported at `at_unix_micros` (the
    /// producer's clock: reports may be taken in batches, later). A failure freezes the
    /// position; the caller ends the session.
    pub fn on_delivery(
        &mut self,
        ticket: Ticket,
        acked: bool,
        at_unix_micros: i64,
    ) -> Result<(), SessionError> {
        if acked {
            let entry = self.ledger.delivered(ticket, Outcome::Acked)?;
            if let Some(row) = entry.row {
                self.replay.acked(row);
            }
            self.events_acked = self.events_acked.saturating_add(1);
            self.obs.acked(entry.commit_unix_micros, at_unix_micros);
        } else {
            self.ledger.delivered(ticket, Outcome::Failed)?;
            self.obs.delivery_failed();
        }
        Ok(())
    }

    /// A doubt from outside the stream (another writer of the progress record).
    pub fn doubt(&mut self, d: Doubt) -> Result<(), SessionError> {
        let step = self.replay.doubt(d);
        self.apply(step)
    }

    /// Carries out what the replay rules decided.
    fn apply(&mut self, step: Step<OutboxRecord>) -> Result<(), SessionError> {
        self.report_doubts();
        match step {
            Step::Nothing | Step::Resume { .. } => {}
            Step::Drop(held) => {
                for h in held {
                    self.drop_delivered(h)?;
                }
            }
            Step::Unproven(d) => return Err(SessionError::ReplayUnproven(d)),
            Step::Release(_, held) => {
                for h in held {
                    self.sends.push_back(ToSend {
                        ticket: h.ticket,
                        record: h.record,
                        origin: Origin::Released,
                        closes_own_txn: false,
                    });
                }
            }
        }
        self.obs.held(self.replay.held_len());
        Ok(())
    }

    fn report_doubts(&mut self) {
        for d in self.replay.take_doubts() {
            self.obs.doubt(d, self.replay.held_len());
        }
    }

    /// The position to confirm, when it moved: every transaction up to it is acked,
    /// and it is no further than the publication's last matching look.
    pub fn advance(&mut self) -> Option<Lsn> {
        let w = self.ledger.watermark();
        let w = self.cap.map_or(w, |cap| w.min(cap));
        (w > self.confirmed).then(|| {
            self.confirmed = w;
            w
        })
    }

    /// After the server went away: what was acked counts as confirmed for the claim the
    /// next session of the process starts from (nothing is sent with it).
    pub fn settle_acked(&mut self) {
        self.confirmed = self.confirmed.max(self.ledger.watermark());
    }

    /// A look at the publication matched, and began when this much was acked: the slot may
    /// be confirmed that far.
    pub fn raise_cap(&mut self, acked: Lsn) {
        if let Some(cap) = self.cap.as_mut() {
            *cap = (*cap).max(acked);
        }
    }

    /// Whether a shutdown may end the stream now: an open transaction is finished first,
    /// so its acked messages are confirmed and not sent again after the restart.
    pub fn may_stop(&self) -> bool {
        !self.ledger.in_transaction()
    }

    /// Whether rows reported skipped are not proven in Kafka yet: the open transaction's
    /// leading rows ([`ReplayCore::proving_partial`]), or a spilled hold's
    /// ([`ReplayCore::spilled`]). A proof confirms them; a failed one ends the session.
    pub fn proving_skips(&self) -> bool {
        self.replay.proving_partial() || self.replay.spilled()
    }

    /// See [`ReplayCore::spilled`].
    pub fn spilled(&self) -> bool {
        self.replay.spilled()
    }

    /// What this session claims Kafka has, and its lineage: the progress record's body.
    pub fn claim(&mut self) -> (DeliveredPosition, u64) {
        self.replay.claim_at(self.confirmed)
    }

    /// The lineages a record of this session may carry (see `ReplayCore::lineages`).
    pub fn lineages(&self) -> (u64, u64) {
        self.replay.lineages()
    }

    /// Takes the inserts of ignored relations counted since the last call.
    pub fn take_ignored_rows(&mut self, mut report: impl FnMut(&str, u64)) {
        for role in self.relations.values_mut() {
            if let Role::Ignored { name, unreported } = role {
                if *unreported > 0 {
                    report(name, *unreported);
                    *unreported = 0;
                }
            }
        }
    }

    pub fn ledger(&self) -> &InFlightLedger {
        &self.ledger
    }

    /// Messages in flight that will get a delivery report (held ones get none).
    pub fn awaiting_reports(&self) -> usize {
        self.ledger.len().saturating_sub(self.replay.held_len())
    }

    pub fn held_len(&self) -> usize {
        self.replay.held_len()
    }

    /// Rows the row ledger keeps past its transactions' leading done rows.
    pub fn rows_kept(&self) -> usize {
        self.replay.rows_kept()
    }

    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    pub fn start(&self) -> Lsn {
        self.start
    }

    /// The acked prefix: what a look at the publication beginning now may let be confirmed.
    pub fn watermark(&self) -> Lsn {
        self.ledger.watermark()
    }

    pub fn in_transaction(&self) -> bool {
        self.txn.is_some()
    }

    pub fn last_commit_unix_micros(&self) -> i64 {
        self.last_commit_unix_micros
    }

    pub fn events_acked(&self) -> u64 {
        self.events_acked
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
