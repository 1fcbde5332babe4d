//! One replication session: from START_REPLICATION until an error or a shutdown.
//!
//! A single task reads the stream, maps outbox inserts to records, hands them to the
//! producer, and turns delivery reports into the flush position. Reading stops at the
//! in-flight cap; the status writer inside `pgrepl` keeps talking to the server meanwhile.
//! What is in flight, and the watermark, is `outbox_core::InFlightLedger`'s bookkeeping.
//!
//! The rules (what is published, held, skipped, dead-lettered and confirmed) are
//! `outbox_core::SessionCore`'s, with no IO; this file is the IO around it: the stream
//! loop, the producer and delivery reports. Beside it: `relations` (the catalog's word on
//! partitions, and ignored rows' reports), `progress` (the progress record), `publication`
//! (looks at the publication), `shutdown` (a clean shutdown's steps), `tick` (periodic
//! checks, metrics and reports) and `kafka_txn` (the exactly-once mode's Kafka
//! transactions).

use std::time::{Duration, Instant};

use outbox_core::{
    After, CadenceRules, Doubt, Happened, KafkaTxnCore, Observe, RelationRole, ReplayStart,
    RowError, Sent, SessionCore, SessionError, Shutdown, ShutdownStep, Skipped, Ticket, TopicName,
    TxnId, TxnRules,
};
use pgoutput::{LogicalMessage, PgTimestamp};
use pgrepl::{preflight, FlushHandle, ReplicationEvent, ReplicationStream};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_postgres::Client;

use super::catchup::CatchUp;
use super::config::RelayConfig;
use super::error::{BeforeBadRow, ErrorClass, RelayError};
use super::observe::Observer;
use crate::kafka::{Delivery, ProgressStore, RelayProducer, SendError, SlotIdentity};

mod kafka_txn;
mod progress;
pub(super) mod publication;
mod relations;
mod shutdown;
mod tick;

use progress::ProgressWriter;

/// The longest a delivery report waits to be taken when nothing else wakes the session
/// (see `Session::run`): it holds back only the slot's confirmation.
const REPORTS_WAIT: Duration = Duration::from_millis(10);

/// How long asking the brokers whether a topic exists may take, after a delivery failed
/// with "unknown topic or partition" (status updates wait meanwhile: well under half of
/// any sane wal_sender_timeout).
const TOPIC_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause before asking a second time (metadata reaches every broker within it).
const TOPIC_LOOKUP_AGAIN: Duration = Duration::from_secs(2);

/// Most events taken from the stream's buffer in one turn of the session's loop: enough
/// to amortise the turn, few enough that a delivery report or a tick waits little.
const BURST: usize = 256;

/// The delivery ticket of the progress record produced inside a Kafka transaction
/// (exactly-once mode): no ledger entry stands for it.
const PROGRESS_TICKET: usize = usize::MAX;

/// How long a session stopped by a fatal producer error waits for the refused batch's
/// reports ([`Session::refused_for_good`]): they follow the fatal error at once, while
/// batches in flight behind it are put back and never reported.
const FATAL_REPORTS_WAIT: Duration = Duration::from_millis(500);

/// How often a commit whose outcome is unknown (a timeout) is tried again before the
/// session gives up (and the next one's `init_transactions` settles it).
const COMMIT_ATTEMPTS: u32 = 5;

/// How long aborting a Kafka transaction may take when a session ends with an error.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a query on the side SQL connection (a few rows, normally
/// milliseconds).
const SQL_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The rules: what is in flight, published, held, skipped and confirmed
    /// (`outbox_core::session`); everything else here is IO around them.
    core: SessionCore<Reports>,
    flush: FlushHandle,
    /// The session's one clock: the times its cores are given (the Kafka transaction's,
    /// the record's cadence, the shutdown's) count from here.
    started_at: Instant,
    /// Status updates of this stream already added to the metrics.
    status_updates_reported: u64,
    progress: Option<ProgressWriter>,
    /// When a stuck event was last reported.
    last_stuck_report: Option<Instant>,
    /// When delivery reports were last taken from the channel.
    reports_taken_at: Instant,
    catchup: CatchUp,
    /// The publication at the last look that matched (see `publication`); `None` when no
    /// table is relayed.
    publication: Option<publication::PublicationWatch>,
    /// The server's timeline and address, for a record that says it was newer.
    timeline: u32,
    server: (String, u16),
    /// The progress topic's retention was found to delete records (logged once).
    durability_warned: bool,
    /// Binary column values, and the settings they were chosen under (`binary.rs`).
    binary: super::binary::Binary,
    /// With binary values: the side connection's output settings at the start. A reload
    /// that changes them changes the walsender's too, and ends the session (`tick`).
    output_settings: Option<[String; 3]>,
    /// The topic of the message whose delivery failed, for an error that names it.
    failed_topic: Option<String>,
    /// Exactly-once mode: the Kafka transaction (docs/transactional-mode.md).
    txn: Option<KafkaTxnCore>,
    /// Exactly-once mode: the reader of last stable offsets, made at the first check.
    stable_offsets: Option<std::sync::Arc<crate::kafka::StableOffsets>>,
}

/// What the rules report, as metrics and logs.
struct Reports {
    obs: Observer,
    /// A replayed transaction was published in doubt in this session (logged once; the
    /// metric counts each).
    doubted: bool,
}

impl Observe for Reports {
    fn skipped(&mut self, _: Skipped<'_>) {
        self.obs.skipped_as_delivered();
    }

    fn dead_lettered(&mut self, error: &RowError, topic: &TopicName) {
        tracing::warn!(
            event_id = %outbox_core::short_id(error.event_id().unwrap_or("")),
            kind = error.kind().as_str(),
            topic = %topic.as_str(),
            "dead-lettering a row: {error}"
        );
        self.obs.dead_lettered(error.kind());
    }

    fn acked(&mut self, commit_unix_micros: i64, acked_at_unix_micros: i64) {
        self.obs.published(commit_unix_micros, acked_at_unix_micros);
    }

    fn delivery_failed(&mut self) {
        self.obs.delivery_error();
    }

    fn held(&mut self, n: usize) {
        self.obs.replay_held(n);
    }

    fn doubt(&mut self, d: Doubt, held: usize) {
        self.obs.replay_doubt(d);
        if !std::mem::replace(&mut self.doubted, true) {
            tracing::warn!(
                reason = d.as_str(),
                held,
                "publishing replayed events again instead of skipping them: {}",
                d.explain()
            );
        }
    }

    fn resuming(&mut self, txn: TxnId, rows: u64) {
        tracing::info!(
            commit_lsn = %txn.commit_lsn,
            xid = txn.xid,
            rows,
            "resuming inside a partly delivered transaction: its first {rows} published rows are already in Kafka"
        );
    }
}

/// How a session starts beyond its connections: where it is in the server's history,
/// what it may skip once proven, and where it keeps its progress record.
pub(super) struct SessionStart {
    pub replay: ReplayStart,
    pub progress: Option<(ProgressStore, SlotIdentity)>,
    /// The publication as looked at before streaming, compared with the look known before
    /// (see `publication::PublicationWatch::start`).
    pub publication: Option<publication::PublicationWatch>,
    /// The server streamed from (host, port).
    pub server: (String, u16),
    pub binary: super::binary::Binary,
    /// See `Session::output_settings`.
    pub output_settings: Option<[String; 3]>,
    /// Exactly-once mode: spans of transactions this process aborted without asking to
    /// commit them (`outbox_core::left_open`).
    pub aborted_spans: outbox_core::AbortedSpans,
    /// The replay skips just what the newest record claims (`Known::record_trusted`).
    pub record_trusted: bool,
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
        let timeline = begin.replay.timeline;
        let reports = Reports {
            obs: obs.clone(),
            doubted: false,
        };
        let mut session = Session {
            cfg,
            obs,
            sql,
            producer,
            deliveries,
            core: SessionCore::new(
                cfg.rules.clone(),
                begin.replay,
                begin.publication.is_some(),
                reports,
            ),
            flush,
            started_at: Instant::now(),
            status_updates_reported: 0,
            last_stuck_report: None,
            reports_taken_at: Instant::now(),
            progress: begin.progress.map(|(store, identity)| {
                let rules = CadenceRules {
                    interval: cfg.progress_interval,
                    rewrite_idle_every: progress::REWRITE_IDLE_EVERY,
                    lineage_check_every: progress::LINEAGE_CHECK_EVERY,
                    exactly_once: cfg.producer.transactions.is_some(),
                };
                ProgressWriter::new(store, identity, rules)
            }),
            catchup: CatchUp::default(),
            publication: begin.publication,
            timeline,
            server: begin.server,
            durability_warned: false,
            failed_topic: None,
            binary: begin.binary,
            output_settings: begin.output_settings,
            txn: cfg.producer.transactions.map(|settings| {
                KafkaTxnCore::new(TxnRules {
                    commit_every: settings.commit_every,
                    commit_events: settings.commit_events,
                    timeout: cfg.producer.transaction_timeout(),
                    commit_attempts: COMMIT_ATTEMPTS,
                })
            }),
            stable_offsets: None,
        };
        let start = session.core.claim().0;
        if let Some(t) = session.txn.as_mut() {
            t.starts_from(start);
            *t.first_writes() = outbox_core::FirstWrites::new(begin.aborted_spans);
            t.first_writes().allow_copies(begin.record_trusted);
        }
        session
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
        self.core.settle_acked();
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
        while self.core.awaiting_reports() > 0 {
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

    /// A bad row's stop: what was sent before it is given the shutdown timeout to be
    /// acknowledged, looked at and confirmed (`Shutdown::before_bad_row`, the steps of a
    /// clean shutdown), so that the error can tell whether skipping the bad transaction by
    /// hand skips nothing else. Exactly-once: the open Kafka transaction is aborted next.
    pub(super) async fn settle_before_bad_row(
        &mut self,
        e: RelayError,
        stream: &mut ReplicationStream,
    ) -> RelayError {
        let RelayError::Session(SessionError::BadRow {
            error,
            commit_lsn,
            skip_to,
        }) = e
        else {
            return e;
        };
        let before = if self.txn.is_some() {
            BeforeBadRow::Aborted
        } else {
            let mut s = Shutdown::before_bad_row(self.shutdown_rules(), self.since_start());
            match self.drain(stream, &mut s).await {
                Ok(_) => {}
                Err(
                    e @ (RelayError::PublicationChanged { .. }
                    | RelayError::PublicationDropped { .. }),
                ) => return e,
                // The stream failed (a failed delivery is settled inside the drain):
                // what was acked before still counts, and the judgement below says the
                // rest.
                Err(e) => {
                    tracing::warn!("settling what came before the bad row: {e}");
                    self.advance();
                    if let Err(e) = stream.send_status_now().await {
                        tracing::warn!("confirming what was acked before the bad row: {e}");
                    }
                }
            }
            self.core.before_bad_row()
        };
        RelayError::BadRow {
            error,
            slot: self.cfg.slot.clone(),
            commit_lsn,
            skip_to,
            before,
        }
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
        // The order and the one deadline of a clean shutdown: `outbox_core::Shutdown`.
        let mut stop: Option<Shutdown> = None;
        let failure = stream.failure();
        loop {
            if *shutdown.borrow() && stop.is_none() {
                tracing::info!(
                    "shutdown requested: finishing the open transaction, then draining acks"
                );
                stop = Some(self.shutdown_requested());
            }
            // On shutdown, keep reading only to finish an open transaction, so its acked
            // messages are confirmed and not re-sent after the restart.
            let stopping = stop.is_some();
            if let Some(s) = stop.as_mut() {
                let turn = Happened::Turn {
                    now: self.since_start(),
                    may_stop: self.core.may_stop(),
                };
                if s.on(turn) != ShutdownStep::ReadOn {
                    return self.drain(stream, s).await;
                }
            }
            let deadline = stop.as_ref().map(|s| self.instant(s.deadline()));
            // Reports that came meanwhile, without a wake-up of their own (see below).
            self.take_reports()?;
            let room = self.room().await?;
            stream.set_reading_paused(!room);
            let early_look = self.early_look_at().map(tokio::time::Instant::from_std);
            // A delivery report wakes the loop only when it is needed at once: for room in
            // flight, or to finish a shutdown. Otherwise reports wait for the next turn
            // (the stream wakes it every transaction under load) or, at most
            // REPORTS_WAIT after the last were taken, for a timer: one wake-up per batch
            // of reports instead of one per ProduceResponse. Kafka's consumers see the
            // records as early either way; only the slot's confirmation waits.
            let reports_now = !room || stopping;
            let reports_at = (!reports_now && self.core.awaiting_reports() > 0)
                .then(|| tokio::time::Instant::from_std(self.reports_taken_at + REPORTS_WAIT));
            let commit_at = self.commit_at().map(tokio::time::Instant::from_std);
            tokio::select! {
                biased;
                changed = shutdown.changed(), if !stopping => {
                    if changed.is_err() {
                        // The sender is gone: treat as a shutdown request.
                        stop = Some(self.shutdown_requested());
                    }
                }
                // Unconditionally: at the in-flight cap the stream is not read, and a
                // failed status write is then the only sign that the server is gone
                // (terminated walsender, partition). Carrying on would let a standby
                // take over the slot while this instance still produces.
                e = failure.wait() => return Err(RelayError::Postgres(e)),
                d = self.deliveries.recv(), if reports_now => {
                    self.on_delivery(d.ok_or_else(channel_closed)?)?;
                    self.take_reports()?;
                }
                _ = sleep_until_some(reports_at) => self.take_reports()?,
                _ = sleep_until_some(commit_at) => {}
                _ = sleep_until_some(deadline) => {}
                // Wakes the loop for the early look (after it, below).
                _ = sleep_until_some(early_look) => {}
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
                    self.on_burst(stream, stopping).await?;
                }
            }
            self.advance();
            if self.commit_due() {
                self.commit_kafka_txn(deadline).await?;
            }
            if self.early_look_at().is_some_and(|at| at <= Instant::now()) {
                self.watch_publication().await?;
                self.advance();
            }
            self.update_progress();
        }
    }

    /// Whether there is room in flight to read on. A hold given up for it is sent first:
    /// the rules' records are answered before their next input.
    async fn room(&mut self) -> Result<bool, RelayError> {
        let room = self.core.make_room()?;
        self.send_queued().await?;
        Ok(room)
    }

    /// Every delivery report waiting in the channel.
    fn take_reports(&mut self) -> Result<(), RelayError> {
        self.reports_taken_at = Instant::now();
        loop {
            match self.deliveries.try_recv() {
                Ok(d) => self.on_delivery(d)?,
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    return Err(channel_closed())
                }
            }
        }
    }

    /// The rest of what the stream has already read, up to [`BURST`] events, while there
    /// is room: one turn of the loop per burst, not per message (each turn polls every
    /// branch of the `select!` and registers their wake-ups again).
    /// While `stopping`, only up to the open transaction's end (as the loop reads).
    async fn on_burst(
        &mut self,
        stream: &mut ReplicationStream,
        stopping: bool,
    ) -> Result<(), RelayError> {
        for _ in 1..BURST {
            if stopping && self.core.may_stop() {
                break;
            }
            if !self.room().await? {
                break;
            }
            let ev = stream
                .next_buffered()
                .map_err(|e| RelayError::from_stream(e, &self.cfg.publication))?;
            match ev {
                Some(ev) => self.on_event(ev).await?,
                None => break,
            }
        }
        Ok(())
    }

    /// The session's clock for its cores: the time since it started.
    pub(super) fn since_start(&self) -> Duration {
        self.started_at.elapsed()
    }

    /// The instant of a time on [`Self::since_start`]'s clock.
    pub(super) fn instant(&self, at: Duration) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.started_at + at)
    }

    fn advance(&mut self) {
        let moved = self.core.advance();
        let Some(txn) = self.txn.as_mut() else {
            if let Some(w) = moved {
                self.flush.advance(w);
                self.obs.confirmed(w);
            }
            return;
        };
        if let Some(w) = txn.confirmable(self.core.confirmed()) {
            self.flush.advance(w);
            self.obs.confirmed(w);
        }
    }

    async fn on_event(&mut self, ev: ReplicationEvent) -> Result<(), RelayError> {
        match ev {
            ReplicationEvent::Keepalive { wal_end, .. } => {
                self.obs.server_wal_end(wal_end);
                self.core.on_keepalive(wal_end)?;
            }
            ReplicationEvent::XLogData {
                wal_end, message, ..
            } => {
                self.obs.received(wal_end);
                let after = match message {
                    LogicalMessage::Relation(r) => {
                        let parent = match self.core.asks_parent(&r) {
                            false => None,
                            true => Some(self.is_partition_of_outbox(r.rel_id).await?),
                        };
                        let role = self.core.on_relation(&r, parent);
                        // Only the outbox's columns (and its partitions') can rule binary
                        // values out; the rules said which relation that is.
                        if let Ok(RelationRole::Outbox) = role {
                            super::binary::verify_relation(self.cfg, &self.binary, &r)?;
                        }
                        role.map(|_| After::Nothing)
                    }
                    other => self.core.on_message(other, PgTimestamp::now()),
                };
                self.after(after).await?;
            }
            ReplicationEvent::Oversized {
                wal_end, message, ..
            } => {
                self.obs.received(wal_end);
                let after = self.core.on_truncated(message, PgTimestamp::now());
                self.after(after).await?;
            }
        }
        self.send_queued().await
    }

    async fn after(&mut self, after: Result<After, SessionError>) -> Result<(), RelayError> {
        match after? {
            After::Nothing => Ok(()),
            After::LookAtPublication { commit } => {
                self.send_queued().await?;
                self.on_publication_guard(commit).await
            }
        }
    }

    /// Hands the records the rules queued to the producer, answering each.
    async fn send_queued(&mut self) -> Result<(), RelayError> {
        let mut sent_any = false;
        while let Some(send) = self.core.take_send() {
            sent_any = true;
            // Reports taken while librdkafka's queue was full go to the rules after this
            // send's answer: nothing comes between a send and its answer.
            let mut reports = Vec::new();
            let sent = self.send(&send.record, send.ticket, &mut reports).await;
            // A record not sent gets no report, and the session ends: it is settled as a
            // failed delivery, which also keeps the watermark where it is.
            let (answer, error) = match sent {
                Ok(Some(how)) => (self.core.sent(send, how), None),
                // The failed report among `reports` is the error.
                Ok(None) => (self.core.send_failed(send), None),
                Err(e) => (self.core.send_failed(send), Some(e)),
            };
            if let Err(e) = answer {
                // The session ends on it; the acks taken meanwhile still count (a bad row's
                // stop judges what was acked before it).
                for d in reports {
                    if self.on_delivery(d).is_err() {
                        break;
                    }
                }
                return Err(e.into());
            }
            for d in reports {
                self.on_delivery(d)?;
            }
            if let Some(e) = error {
                return Err(e);
            }
        }
        // Only after a send, as before the core existed: this runs after every message.
        if sent_any {
            self.obs
                .in_flight(self.core.ledger().len(), self.core.ledger().bytes());
        }
        Ok(())
    }

    /// Hands one record to the producer. `None`: not sent, because a delivery failed
    /// while librdkafka's queue was full (its report is the last of `reports`, which
    /// gathers the reports taken while waiting for room).
    async fn send(
        &mut self,
        rec: &outbox_core::OutboxRecord,
        ticket: Ticket,
        reports: &mut Vec<Delivery>,
    ) -> Result<Option<Sent>, RelayError> {
        let now = self.since_start();
        if let Some(txn) = self.txn.as_mut() {
            if txn.on_send(now) {
                if let Err(e) = self.producer.begin_transaction() {
                    txn.begin_failed();
                    return Err(e.into());
                }
            }
        }
        loop {
            match self.producer.send_outbox(rec, ticket.index()) {
                Ok(()) => return Ok(Some(Sent::Queued)),
                Err(SendError::MessageTooLarge { size }) => {
                    return Ok(Some(Sent::TooLarge { size }))
                }
                Err(SendError::QueueFull) => {
                    // librdkafka's own queue is full (its cap is at least ours, so rare):
                    // a delivery report frees a place; try again. A failed one ends the
                    // session, so trying stops there.
                    let d = self.deliveries.recv().await.ok_or_else(channel_closed)?;
                    let failed = d.outcome.is_err();
                    reports.push(d);
                    if failed {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn on_delivery(&mut self, d: Delivery) -> Result<(), RelayError> {
        if d.ticket == PROGRESS_TICKET {
            if let (Ok(at), Some(p), Some(txn)) = (&d.outcome, &self.progress, &mut self.txn) {
                first_write(txn, p.store.topic(), at);
            }
            return d.outcome.map(|_| ()).map_err(RelayError::Delivery);
        }
        let ticket = Ticket::from_index(d.ticket);
        let acked = d.outcome.is_ok();
        if d.outcome.is_err() {
            self.failed_topic = self.core.ledger().topic_of(ticket).map(str::to_owned);
        }
        if let (Ok(at), Some(txn)) = (&d.outcome, &mut self.txn) {
            // Past the ledger's bound on topic names the partition goes unchecked: its
            // commit is one in doubt (docs/transactional-mode.md).
            match self.core.ledger().named_topic_of(ticket) {
                Some(topic) => first_write(txn, topic, at),
                None => txn.first_writes().unplaced(),
            }
        }
        self.core.on_delivery(ticket, acked, d.at_unix_micros)?;
        match d.outcome {
            Ok(_) => Ok(()),
            Err(failure) => Err(RelayError::Delivery(failure)),
        }
    }

    /// The session's error, told apart where the brokers can say more than the code:
    /// "unknown topic or partition" is also what a partition without a leader for now
    /// gives, so a topic is called missing only when the brokers' metadata says so.
    /// Retrying a missing topic would re-send every message behind it on each attempt.
    pub(super) async fn explain(&mut self, e: RelayError) -> RelayError {
        let e = match self.producer.is_fatal() {
            Some(_) if e.class() == ErrorClass::Retryable => {
                self.refused_for_good().await.unwrap_or(e)
            }
            _ => e,
        };
        match (e, &self.failed_topic) {
            (RelayError::Delivery(f), Some(topic)) if f.may_be_a_missing_topic() => {
                // Twice, a moment apart: one broker that has not yet learned of a topic
                // (just created, or recreated) must not stop a healthy relay.
                let lookup = || self.producer.topic_is_missing(topic, TOPIC_LOOKUP_TIMEOUT);
                let missing = lookup().await && {
                    tokio::time::sleep(TOPIC_LOOKUP_AGAIN).await;
                    lookup().await
                };
                if missing {
                    RelayError::Delivery(f.missing_topic(topic))
                } else {
                    RelayError::Delivery(f)
                }
            }
            (e, _) => e,
        }
    }

    /// A producer stopped by a fatal error (the gap-less guarantee: a batch refused for
    /// good) also fails what was queued behind that batch (purged), and the session may
    /// notice either first (a send, a tick, a purged message's report). The refused
    /// batch's own reports say whether the broker refused it for good (a timestamp, an
    /// authorization) and why; they come within moments. A permanent one among the
    /// reports still to come is the session's error: retrying would meet it again.
    async fn refused_for_good(&mut self) -> Option<RelayError> {
        let deadline = Instant::now() + FATAL_REPORTS_WAIT;
        let mut last_look = false;
        loop {
            match self.deliveries.try_recv() {
                // Through the ledger, so that what was acked still counts (the acked
                // prefix, an open Kafka transaction's first writes).
                Ok(d) => match self.on_delivery(d) {
                    Err(RelayError::Delivery(f)) if !f.retriable => {
                        return Some(RelayError::Delivery(f))
                    }
                    _ => {}
                },
                // Once librdkafka holds nothing (or the wait is over), one more look: a
                // report may have been handed over in between.
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) if !last_look => {
                    last_look = self.producer.in_flight() == 0 || Instant::now() >= deadline;
                    if !last_look {
                        tokio::time::sleep(REPORTS_WAIT).await;
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Whether the catalog calls relation `rel_id` a partition (any depth) of the outbox.
    async fn is_partition_of_outbox(&self, rel_id: u32) -> Result<bool, RelayError> {
        let table = &self.cfg.rules.table;
        bounded("looking up a relation's partition parent", async {
            Ok(preflight::is_partition_of(&self.sql, rel_id, &table.schema, &table.table).await?)
        })
        .await
    }
}

/// Sleeps until `at`; never wakes without one (a `select!` branch that is off).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn channel_closed() -> RelayError {
    RelayError::Protocol("the producer's delivery channel closed".into())
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

/// An acked record of the open Kafka transaction: where its records begin in the
/// partition, and what they are (`outbox_core::left_open`).
fn first_write(txn: &mut outbox_core::KafkaTxnCore, topic: &str, at: &crate::kafka::Delivered) {
    let writes = txn.first_writes();
    writes.acked(topic, at.partition, at.offset);
    if let Some(content) = at.content {
        writes.content(topic, at.partition, content);
    }
}
