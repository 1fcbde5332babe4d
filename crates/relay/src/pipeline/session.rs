//! One replication session: from START_REPLICATION until an error or a shutdown.
//!
//! A single task reads the stream, maps outbox inserts to records, hands them to the
//! producer, and turns delivery reports into the flush position. Reading stops at the
//! in-flight cap; the status writer inside `pgrepl` keeps talking to the server meanwhile.
//! What is in flight, and the watermark, is `outbox_core::InFlightLedger`'s bookkeeping.
//!
//! This file is the stream loop: events in, records produced, delivery reports settled.
//! Beside it: `relations` (what each relation is to the relay), `skip` (replayed
//! transactions Kafka already has), `progress` (the progress record and what is known
//! delivered) and `tick` (periodic checks, metrics and reports).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{
    check_size, dead_letter_message, dead_letter_record, oversize_error, CommitContext,
    InFlightCaps, InFlightLedger, NextRow, OutboxRecord, Outcome, Outgoing, ReplayCore,
    ReplayStart, RowError, RowId, Step, Ticket, TxnId,
};
use pgoutput::{Insert, LogicalMessage, Lsn, Message, PgTimestamp};
use pgrepl::{FlushHandle, ReplicationEvent, ReplicationStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_postgres::Client;

use super::catchup::CatchUp;
use super::error::RelayError;
use super::observe::Observer;
use super::{BadRowPolicy, RelayConfig};
use crate::kafka::{
    Delivery, OutgoingRecord, ProgressStore, RelayProducer, SendError, SlotIdentity,
};

mod progress;
pub(super) mod publication;
mod relations;
mod skip;
mod tick;

use progress::ProgressWriter;
use relations::RelationRole;

/// The final progress record gets at least this long, even past the shutdown deadline.
const FINAL_PROGRESS_WRITE_MIN: Duration = Duration::from_secs(1);

/// Longest wait for a query on the side SQL connection (a few rows, normally
/// milliseconds).
const SQL_TIMEOUT: Duration = Duration::from_secs(10);

/// What became of a record handed to [`Session::produce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Produced {
    Queued,
    /// The producer refused it for `message.max.bytes` (`size` as it measured): a bad
    /// row, not a Kafka failure, since the same record is refused on every replay.
    TooLarge {
        size: usize,
    },
}

/// How a session that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    Shutdown,
}

pub(super) struct Session<'a> {
    cfg: &'a RelayConfig,
    obs: &'a Observer,
    sql: Client,
    producer: RelayProducer,
    deliveries: UnboundedReceiver<Delivery>,
    /// What is in flight: per message and per transaction, and the watermark.
    ledger: InFlightLedger,
    relations: HashMap<u32, RelationRole>,
    txn: Option<CommitContext>,
    /// End of the last transaction received, for emitted non-transactional messages.
    last_end_lsn: Lsn,
    flush: FlushHandle,
    confirmed: Lsn,
    start: Lsn,
    started_at: Instant,
    /// Status updates of this stream already added to the metrics.
    status_updates_reported: u64,
    progress: Option<ProgressWriter>,
    /// When a stuck event was last reported.
    last_stuck_report: Option<Instant>,
    /// The replay rules: held records, the proof, the partly delivered transaction, and
    /// the session's claim for its progress record (see `outbox_core::replay`).
    replay: ReplayCore<OutboxRecord>,
    /// Commit time of the newest transaction read, for the catch-up reports only.
    last_commit_unix_micros: i64,
    /// A doubt was logged in this session (once is enough; the metric counts each).
    doubt_logged: bool,
    catchup: CatchUp,
    /// Events acknowledged in this session, for the catch-up rate.
    events_acked: u64,
    /// The publication at the last look that matched, and how far that lets the slot be
    /// confirmed (see `publication`); `None` when no table is relayed.
    publication: Option<publication::PublicationWatch>,
    /// The server's timeline and address, for a record that says it was newer.
    timeline: u32,
    server: (String, u16),
    /// The progress topic's retention was found to delete records (logged once).
    durability_warned: bool,
    /// Binary column values, and the settings they were chosen under (`binary.rs`).
    binary: super::binary::Binary,
}

/// How a session starts beyond its connections: where it is in the server's history,
/// what it may skip once proven, and where it keeps its progress record.
pub(super) struct SessionStart {
    pub replay: ReplayStart,
    pub progress: Option<(ProgressStore, SlotIdentity)>,
    /// The publication as looked at before streaming, and whether it was compared with
    /// the record's (false: the record could not be read in time).
    pub publication: Option<(crate::kafka::PublicationSeen, bool)>,
    /// The server streamed from (host, port).
    pub server: (String, u16),
    pub binary: super::binary::Binary,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        cfg: &'a RelayConfig,
        obs: &'a Observer,
        sql: Client,
        producer: RelayProducer,
        deliveries: UnboundedReceiver<Delivery>,
        flush: FlushHandle,
        begin: SessionStart,
    ) -> Self {
        // The caller raised the handle to the slot's confirmed position: the start.
        let start = flush.get();
        let timeline = begin.replay.timeline;
        Session {
            cfg,
            obs,
            sql,
            producer,
            deliveries,
            ledger: InFlightLedger::new(
                start,
                InFlightCaps {
                    max_messages: cfg.max_in_flight_messages,
                    max_bytes: cfg.max_in_flight_bytes,
                },
            ),
            relations: HashMap::new(),
            txn: None,
            last_end_lsn: start,
            flush,
            confirmed: start,
            start,
            started_at: Instant::now(),
            status_updates_reported: 0,
            last_stuck_report: None,
            replay: ReplayCore::new(begin.replay),
            last_commit_unix_micros: 0,
            doubt_logged: false,
            progress: begin
                .progress
                .map(|(store, identity)| ProgressWriter::new(store, identity)),
            catchup: CatchUp::default(),
            events_acked: 0,
            publication: begin
                .publication
                .map(|(look, compared)| publication::PublicationWatch::new(look, start, compared)),
            timeline,
            server: begin.server,
            durability_warned: false,
            binary: begin.binary,
        }
    }

    /// After the server went away (not Kafka): waits a little for the acks of what is in
    /// flight, so the next session knows them delivered and skips them in the replay
    /// instead of publishing them twice. A delivery error ends the wait (and is then the
    /// session's business no more: the producer is dropped anyway).
    pub(super) async fn settle_in_flight(&mut self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        // A delivery error only ends the wait: what was acked before it still counts.
        let _ = self.await_acks(deadline, false).await;
        // Only ever the acked prefix; the stream is gone, so nothing is sent with it.
        let w = self.ledger.watermark();
        self.confirmed = self.confirmed.max(w);
    }

    /// Takes delivery reports until nothing is in flight (true) or `deadline` (false);
    /// `confirm_as_acked` passes each new watermark on to the server as it comes.
    async fn await_acks(
        &mut self,
        deadline: tokio::time::Instant,
        confirm_as_acked: bool,
    ) -> Result<bool, RelayError> {
        // Held records get no report: they stay unconfirmed, and the next session proves
        // them again.
        while self.ledger.len() > self.replay.held_len() {
            tokio::select! {
                d = self.deliveries.recv() => match d {
                    Some(d) => self.on_delivery(d)?,
                    None => return Ok(false),
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(false),
            }
            if confirm_as_acked {
                self.advance();
            }
        }
        Ok(true)
    }

    /// Drops the producer without sending what it still holds: after an error the
    /// session's unacked messages are replayed from the slot by the next session.
    pub(super) fn abandon(self) {
        self.producer.purge_and_close();
    }

    pub(super) async fn run(
        &mut self,
        stream: &mut ReplicationStream,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<SessionEnd, RelayError> {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heartbeat = self.cfg.heartbeat_interval.map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut ticks: u64 = 0;
        // One deadline for the whole shutdown: finishing the open transaction, draining
        // acks and the final progress record all fit in OUTBOXD_SHUTDOWN_TIMEOUT_MS, so an
        // orchestrator's grace period sized from it is enough.
        let mut deadline: Option<tokio::time::Instant> = None;
        let failure = stream.failure();
        // What the claim's first look found (cut at the server's end, other settings).
        self.report_doubts();
        loop {
            if *shutdown.borrow() && deadline.is_none() {
                tracing::info!(
                    "shutdown requested: finishing the open transaction, then draining acks"
                );
                deadline = Some(tokio::time::Instant::now() + self.cfg.shutdown_timeout);
            }
            // On shutdown, keep reading only to finish an open transaction, so its acked
            // messages are confirmed and not re-sent after the restart.
            let stopping = deadline.is_some();
            if let Some(at) = deadline {
                if !self.ledger.in_transaction() || tokio::time::Instant::now() >= at {
                    return self.drain(stream, at).await;
                }
            }
            if self.replay.held_len() > 0 && !self.ledger.has_room() {
                // Nothing held is ever acked: waiting for room would wait forever.
                let step = self.replay.hold_full();
                self.apply(step).await?;
            }
            let room = self.ledger.has_room();
            stream.set_reading_paused(!room);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if !stopping => {
                    if changed.is_err() {
                        // The sender is gone: treat as a shutdown request.
                        deadline = Some(tokio::time::Instant::now() + self.cfg.shutdown_timeout);
                    }
                }
                // Unconditionally: at the in-flight cap the stream is not read, and a
                // failed status write is then the only sign that the server is gone
                // (terminated walsender, partition). Carrying on would let a standby
                // take over the slot while this instance still produces.
                e = failure.wait() => return Err(RelayError::Postgres(e)),
                d = self.deliveries.recv() => {
                    let d = d.ok_or_else(|| RelayError::Protocol("the producer's delivery channel closed".into()))?;
                    self.on_delivery(d)?;
                    while let Ok(d) = self.deliveries.try_recv() {
                        self.on_delivery(d)?;
                    }
                }
                _ = async { match deadline { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
                _ = tick.tick() => {
                    ticks += 1;
                    self.on_tick(stream, ticks).await?;
                }
                _ = async { match heartbeat.as_mut() { Some(t) => t.tick().await, None => std::future::pending().await } } => {
                    self.emit_heartbeat().await?;
                }
                // Last: under a continuous backlog the stream is always ready, and a biased
                // select would otherwise starve the ticks (metrics, slot checks).
                ev = stream.next(), if room => {
                    match ev.map_err(|e| RelayError::from_stream(e, &self.cfg.publication))? {
                        Some(ev) => self.on_event(ev).await?,
                        None => return Err(RelayError::StreamClosed),
                    }
                }
            }
            self.advance();
            self.update_progress();
        }
    }

    fn advance(&mut self) {
        let w = self.ledger.watermark();
        // No further than the last look at the publication that matched.
        let w = self.publication.as_ref().map_or(w, |p| w.min(p.cap));
        if w > self.confirmed {
            self.flush.advance(w);
            self.confirmed = w;
            self.obs.confirmed(w);
        }
    }

    async fn on_event(&mut self, ev: ReplicationEvent) -> Result<(), RelayError> {
        match ev {
            ReplicationEvent::Keepalive { wal_end, .. } => {
                self.obs.server_wal_end(wal_end);
                if self.txn.is_none() {
                    let step = self.replay.keepalive(wal_end);
                    self.apply(step).await?;
                    if self.cfg.idle_flush {
                        self.ledger.on_keepalive(wal_end);
                    }
                }
                Ok(())
            }
            ReplicationEvent::XLogData {
                wal_end, message, ..
            } => {
                self.obs.received(wal_end);
                self.on_message(message).await
            }
        }
    }

    async fn on_message(&mut self, message: LogicalMessage) -> Result<(), RelayError> {
        match message {
            LogicalMessage::Begin(b) => {
                self.ledger.begin()?;
                let txn = TxnId::new(b.final_lsn, b.xid, b.commit_time);
                self.txn = Some(CommitContext::new(b.final_lsn, b.commit_time));
                self.last_commit_unix_micros = b.commit_time.unix_micros();
                let step = self.replay.begin(txn);
                if let Step::Resume { rows } = step {
                    tracing::info!(
                        commit_lsn = %txn.commit_lsn,
                        xid = txn.xid,
                        rows,
                        "resuming inside a partly delivered transaction: its first {rows} published rows are already in Kafka"
                    );
                }
                self.apply(step).await?;
            }
            LogicalMessage::Commit(c) => {
                // Before the ledger's: a mismatch must leave the transaction unconfirmed.
                let step = self.replay.commit(c.end_lsn);
                self.report_doubts();
                let step = step.map_err(|m| RelayError::PartialReplay {
                    commit_lsn: m.commit_lsn,
                    recorded: m.recorded,
                    read: m.read,
                })?;
                self.ledger.commit(c.end_lsn)?;
                self.txn = None;
                self.last_end_lsn = self.last_end_lsn.max(c.end_lsn);
                self.apply(step).await?;
            }
            LogicalMessage::Relation(r) => self.on_relation(&r).await?,
            LogicalMessage::Insert(i) => self.on_insert(&i).await?,
            LogicalMessage::Message(m) => self.on_emitted(&m).await?,
            // Deletes (insert-then-delete), updates and truncates are not events.
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Truncate(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Type(_) => {}
            other => {
                return Err(RelayError::Protocol(format!(
                    "unexpected pgoutput message {:?} (streaming and two-phase are not requested)",
                    char::from(other.tag())
                )))
            }
        }
        Ok(())
    }

    async fn on_insert(&mut self, ins: &Insert) -> Result<(), RelayError> {
        let table = match self.relations.get_mut(&ins.rel_id) {
            Some(RelationRole::Outbox(t)) => Arc::clone(t),
            Some(RelationRole::Ignored { unreported, .. }) => {
                *unreported = unreported.saturating_add(1);
                return Ok(());
            }
            None => {
                return Err(RelayError::Protocol(format!(
                    "insert into relation {} before its Relation message",
                    ins.rel_id
                )))
            }
        };
        let ctx = self
            .txn
            .ok_or_else(|| RelayError::Protocol("insert outside a transaction".into()))?;
        // Every outbox row is published: as its record or as a dead letter.
        let NextRow::Publish(row) = self.next_row() else {
            return Ok(());
        };
        let max = self.cfg.max_message_bytes;
        let mapped = table
            .map_insert(&ins.new_tuple, &ctx)
            .and_then(|r| check_size(&r, max).map(|()| r));
        let error = match mapped {
            Ok(record) => match self.produce(&record, ctx, row).await? {
                Produced::Queued => return Ok(()),
                // Only if librdkafka's measure ever differs from check_size's.
                Produced::TooLarge { size } => oversize_error(&record, size, max),
            },
            Err(error) => error,
        };
        let dlq = dead_letter_record(
            &table,
            &ins.new_tuple,
            &error,
            &ctx,
            &self.cfg.dead_letter_topic,
            max,
        );
        self.bad_row(error, dlq, ctx, row).await
    }

    async fn on_emitted(&mut self, m: &Message) -> Result<(), RelayError> {
        if m.prefix == publication::PUBLICATION_GUARD_PREFIX && m.is_transactional() {
            return self.on_publication_guard().await;
        }
        let Some(mapper) = self.cfg.emit.as_ref() else {
            return Ok(());
        };
        if m.prefix != mapper.prefix() {
            return Ok(());
        }
        // A non-transactional message arrives outside Begin/Commit; it gets a transaction
        // of its own in the ledger that completes at the last commit end, so it holds
        // the watermark until acked but never moves it past anything unseen.
        let own_txn = self.txn.is_none();
        let ctx = match self.txn {
            Some(ctx) => ctx,
            None => CommitContext::non_transactional(m, PgTimestamp::now()),
        };
        let max = self.cfg.max_message_bytes;
        let mapped = mapper
            .map_message(m, &ctx)
            .and_then(|r| r.map(|r| check_size(&r, max).map(|()| r)).transpose());
        // Only what is published (a record or a dead letter) is a row of the transaction.
        let Some(mapped) = mapped.transpose() else {
            return Ok(());
        };
        let NextRow::Publish(row) = self.next_row() else {
            return Ok(());
        };
        if own_txn {
            self.ledger.begin()?;
        }
        let error = match mapped {
            Ok(record) => match self.produce(&record, ctx, row).await {
                Ok(Produced::Queued) => None,
                Ok(Produced::TooLarge { size }) => Some(Ok(oversize_error(&record, size, max))),
                Err(e) => Some(Err(e)),
            },
            Err(error) => Some(Ok(error)),
        };
        let result = match error {
            None => Ok(()),
            Some(Err(e)) => Err(e),
            Some(Ok(error)) => {
                let dlq = dead_letter_message(m, &error, &ctx, &self.cfg.dead_letter_topic, max);
                self.bad_row(error, dlq, ctx, row).await
            }
        };
        if own_txn {
            self.ledger.commit(self.last_end_lsn)?;
        }
        result
    }

    async fn bad_row(
        &mut self,
        error: RowError,
        dead_letter: OutboxRecord,
        ctx: CommitContext,
        row: Option<RowId>,
    ) -> Result<(), RelayError> {
        match self.cfg.bad_row_policy {
            // Not counted as dead-lettered: it was not, and the slot stays before it.
            BadRowPolicy::Stop => Err(RelayError::BadRow {
                error,
                slot: self.cfg.slot.clone(),
                commit_lsn: ctx.commit_lsn,
            }),
            BadRowPolicy::DeadLetter => {
                tracing::warn!(
                    event_id = %outbox_core::short_id(error.event_id().unwrap_or("")),
                    kind = error.kind().as_str(),
                    topic = %self.cfg.dead_letter_topic.as_str(),
                    "dead-lettering a row: {error}"
                );
                match self.produce(&dead_letter, ctx, row).await? {
                    Produced::Queued => {
                        self.obs.dead_lettered(error.kind());
                        Ok(())
                    }
                    // Dead-letter records are shrunk to fit; only a limit below what they
                    // can shrink to gets here. Stop rather than confirm past the row.
                    Produced::TooLarge { size } => {
                        Err(RelayError::DeadLetterTooLarge { error, size })
                    }
                }
            }
        }
    }

    async fn produce(
        &mut self,
        rec: &OutboxRecord,
        ctx: CommitContext,
        row: Option<RowId>,
    ) -> Result<Produced, RelayError> {
        let ticket = self.ledger.produced(Outgoing {
            topic: &rec.topic,
            bytes: rec.approx_size(),
            commit_unix_micros: ctx.commit_time.unix_micros(),
            row,
        })?;
        if self.replay.holding() {
            self.replay.hold(ticket, rec.clone(), row);
            return Ok(Produced::Queued);
        }
        self.send(rec, ticket).await
    }

    /// Hands a registered record to the producer.
    async fn send(&mut self, rec: &OutboxRecord, ticket: Ticket) -> Result<Produced, RelayError> {
        let headers: Vec<(&str, &[u8])> = rec
            .headers
            .iter()
            .map(|(k, v)| (k.as_ref(), v.as_ref()))
            .collect();
        let out = OutgoingRecord {
            topic: &rec.topic,
            key: rec.key.as_deref(),
            value: rec.value.as_deref(),
            headers: &headers,
            timestamp_millis: Some(rec.timestamp_millis),
        };
        loop {
            match self.producer.send(&out, ticket.index()) {
                Ok(()) => {
                    self.obs.in_flight(self.ledger.len(), self.ledger.bytes());
                    return Ok(Produced::Queued);
                }
                Err(SendError::MessageTooLarge { size }) => {
                    self.ledger.refused(ticket)?;
                    return Ok(Produced::TooLarge { size });
                }
                Err(SendError::QueueFull) => {
                    // librdkafka's own queue is full (its cap is at least ours, so rare):
                    // wait for one delivery and try again.
                    let d = self.deliveries.recv().await.ok_or_else(|| {
                        RelayError::Protocol("the producer's delivery channel closed".into())
                    })?;
                    self.on_delivery(d)?;
                }
                Err(e) => {
                    // No report will come, and the session ends with this error: settle it
                    // as a failed delivery, which also keeps the watermark where it is.
                    self.ledger.delivered(ticket, Outcome::Failed)?;
                    return Err(e.into());
                }
            }
        }
    }

    fn on_delivery(&mut self, d: Delivery) -> Result<(), RelayError> {
        let ticket = Ticket::from_index(d.ticket);
        match d.outcome {
            Ok(_) => {
                let entry = self.ledger.delivered(ticket, Outcome::Acked)?;
                if let Some(row) = entry.row {
                    self.replay.acked(row);
                }
                self.events_acked = self.events_acked.saturating_add(1);
                self.obs.published(entry.commit_unix_micros);
                Ok(())
            }
            Err(failure) => {
                self.ledger.delivered(ticket, Outcome::Failed)?;
                self.obs.delivery_error();
                Err(RelayError::Delivery(failure))
            }
        }
    }

    /// Stop reading, wait (bounded) for in-flight acks, confirm, and end the stream.
    async fn drain(
        &mut self,
        stream: &mut ReplicationStream,
        deadline: tokio::time::Instant,
    ) -> Result<SessionEnd, RelayError> {
        if !self.await_acks(deadline, true).await? {
            tracing::warn!(
                unacked = self.ledger.len(),
                "shutdown timeout: unacknowledged messages will be re-sent after restart"
            );
        }
        // A last look, so the final position can cover what was acked since the one before.
        if self.publication.is_some() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.watch_publication()).await {
                Ok(Ok(())) => {}
                Ok(Err(e @ RelayError::PublicationChanged { .. })) => return Err(e),
                Ok(Err(e)) => tracing::warn!("the last look at the publication failed ({e}): the slot stays confirmed at the look before, and what was acked since is sent again after the restart"),
                Err(_) => tracing::warn!("the last look at the publication timed out: the slot stays confirmed at the look before"),
            }
        }
        self.advance();
        tracing::info!(confirmed = %self.confirmed, "confirming the final position and closing the stream");
        stream.send_status_now().await?;
        // After the status update, and within what is left of the deadline (at least a
        // moment): with Kafka down the write would otherwise hold the shutdown for its own
        // 30 s timeout. A record left older only records that the slot exists.
        let record = self.progress.is_some().then(|| self.progress_record());
        if let (Some(p), Some(record)) = (&self.progress, record) {
            let left = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(FINAL_PROGRESS_WRITE_MIN);
            match tokio::time::timeout(left, p.store.write_and_wait(&p.identity, &record)).await {
                Ok(Ok(())) => self.obs.progress_recorded(record.confirmed_lsn()),
                Ok(Err(e)) => {
                    self.obs.progress_write_failed();
                    tracing::warn!("writing the final progress record failed: {e}");
                }
                Err(_) => tracing::warn!(
                    "writing the final progress record timed out after {left:?}; it stays at an older position"
                ),
            }
        }
        Ok(SessionEnd::Shutdown)
    }
}

/// A side-connection query that gives up after [`SQL_TIMEOUT`].
async fn bounded<T>(
    what: &'static str,
    query: impl std::future::Future<Output = Result<T, RelayError>>,
) -> Result<T, RelayError> {
    tokio::time::timeout(SQL_TIMEOUT, query)
        .await
        .map_err(|_| RelayError::Postgres(pgrepl::ReplError::Timeout(what)))?
}
