//! The once-a-second tick: metrics, the publication, shard layout and slot checks, stuck
//! events and catch-up reports; and the heartbeat.

use std::time::{Duration, Instant};

use outbox_core::slot_fate::{self, SlotNow};
use pgoutput::{Lsn, PgTimestamp};
use pgrepl::ReplicationStream;

use super::{bounded, Session, SQL_TIMEOUT};
use crate::kafka::SendError;
use crate::pipeline::catchup::{self, Report, Sample};
use crate::pipeline::error::RelayError;
use crate::pipeline::{shard_catalog, slot};

/// How long an unacked event waits before it is reported, and how often after that.
const STUCK_REPORT_EVERY: Duration = Duration::from_secs(30);

impl Session<'_> {
    pub(super) async fn on_tick(
        &mut self,
        stream: &ReplicationStream,
        ticks: u64,
    ) -> Result<(), RelayError> {
        self.report_ignored_rows();
        // The progress record is kept current by the loop after every turn, this one too.
        self.obs.server_wal_end(stream.server_wal_end());
        let sent = stream.status_updates_sent();
        self.obs
            .status_updates_sent(sent.saturating_sub(self.status_updates_reported));
        self.status_updates_reported = sent;
        let ledger = self.core.ledger();
        self.obs.in_flight(ledger.len(), ledger.bytes());
        // The lag breakdown's acked position (before the publication's cap).
        self.obs.acked(ledger.watermark());
        self.obs.oldest_unacked(ledger.oldest_commit_unix_micros());
        self.report_stuck_event();
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.store.foreign_writer())
        {
            // Another live copy records under this key: its claims prove nothing here.
            self.core.doubt(outbox_core::Doubt::ForeignWriter)?;
            self.send_queued().await?;
        }
        if let Some(Err(e)) = self
            .progress
            .as_ref()
            .and_then(|p| p.store.durability_verdict())
        {
            // Refused at slot creation and by `check`; a running relay only warns, once:
            // its record is rewritten every few minutes, so only a long outage loses it.
            if !self.durability_warned {
                self.durability_warned = true;
                tracing::warn!("{e}");
            }
        }
        // A change undone since the last look leaves the coverage as it was.
        self.compare_with_record().await?;
        self.watch_output_settings().await?;
        if self.publication_look_due() {
            self.watch_publication().await?;
        }
        if let Some(fatal) = self.producer.is_fatal() {
            return Err(RelayError::Send(SendError::Fatal(fatal)));
        }
        // Also at the first tick: a session that starts behind says so at once.
        if ticks == 1 || ticks.is_multiple_of(self.cfg.slot_stats_every_ticks) {
            if self.cfg.rules.relay_table {
                // ALTER PUBLICATION ... DROP TABLE stops the server sending the table's
                // rows without any message on the stream: look.
                self.unless_locked(
                    bounded(
                        "checking the publication",
                        slot::verify_publication(
                            &self.sql,
                            &self.cfg.publication,
                            &self.cfg.rules.table,
                        ),
                    )
                    .await,
                )?;
            }
            if let Some(shard) = &self.cfg.shard {
                // A partition added outside the shards is published by none of them.
                self.unless_locked(
                    bounded(
                        "checking the shard layout",
                        shard_catalog::verify_shard_layout(&self.sql, shard),
                    )
                    .await,
                )?;
            }
            // Bounded: a query on a dead connection would block this loop, and with it
            // the reaction to a failed replication connection, until TCP gives up.
            let stats = bounded(
                "reading the slot's statistics",
                slot::stats(&self.sql, &self.cfg.slot),
            )
            .await?;
            let now = match &stats {
                None => SlotNow::Absent,
                Some(s) if s.wal_status.as_deref() == Some("lost") => SlotNow::Invalidated,
                Some(_) => SlotNow::Usable,
            };
            // Building the claim folds the ledger: only for a slot that stops the session.
            // Exactly-once: the last commit's, not what the open transaction acked.
            if now != SlotNow::Usable {
                let txn = self.txn.as_ref();
                let claim = outbox_core::lost_slot_claim(txn, &mut self.core);
                slot_fate::streaming(now, &claim)
                    .map_err(|stop| slot::stop_error(stop, &self.cfg.slot))?;
            }
            if let Some(stats) = stats {
                self.obs.slot_stats(&stats);
                self.report_catch_up(stats.current_wal);
            }
            self.obs.catalog_checked();
        }
        Ok(())
    }

    /// A periodic check that gave up waiting for a table's lock (the session's
    /// `lock_timeout`) is done again at the next check: the lock's holder is the
    /// application's DDL, and this session's loop must not wait behind it.
    fn unless_locked<T>(&self, checked: Result<T, RelayError>) -> Result<Option<T>, RelayError> {
        match checked {
            Err(RelayError::Postgres(e)) if e.is_lock_timeout() => {
                tracing::warn!("a catalog check met a table another transaction locks, checking again later: {e}");
                self.obs.catalog_check_deferred();
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// Logs the backlog's progress (see `catchup`) against the server's WAL end.
    fn report_catch_up(&mut self, server_wal: Lsn) {
        // How far back in time reading is: the newest commit read (0: none yet).
        let last_commit = self.core.last_commit_unix_micros();
        let commit_age = (last_commit > 0).then(|| {
            let micros = PgTimestamp::now().unix_micros().saturating_sub(last_commit);
            Duration::from_micros(u64::try_from(micros).unwrap_or(0))
        });
        let sample = Sample {
            at: self.since_start(),
            server_wal,
            confirmed: self.core.confirmed(),
            events: self.core.events_acked(),
            commit_age,
        };
        let age = |a: Option<Duration>| a.map_or("?".to_owned(), catchup::human_duration);
        match self.catchup.observe(sample) {
            None => {}
            Some(Report::Behind {
                lag_bytes,
                commit_age,
            }) => tracing::info!(
                lag_bytes,
                behind_secs = commit_age.map_or(0, |a| a.as_secs()),
                "catching up a backlog: {} of WAL behind, reading transactions committed {} ago",
                catchup::human_bytes(lag_bytes),
                age(commit_age),
            ),
            Some(Report::Progress {
                lag_bytes,
                commit_age,
                events_per_sec,
                bytes_per_sec,
                eta,
            }) => tracing::info!(
                lag_bytes,
                behind_secs = commit_age.map_or(0, |a| a.as_secs()),
                events_per_sec,
                bytes_per_sec,
                eta_secs = eta.map(|e| e.as_secs()),
                "catching up: {} behind ({} behind in time), {events_per_sec} events/s, {}/s, about {} to go",
                catchup::human_bytes(lag_bytes),
                age(commit_age),
                catchup::human_bytes(bytes_per_sec),
                eta.map_or("? (nothing confirmed yet)".to_owned(), catchup::human_duration),
            ),
            Some(Report::CaughtUp { took, events }) => tracing::info!(
                took_secs = took.as_secs(),
                events,
                "caught up: {events} events in {}",
                catchup::human_duration(took),
            ),
        }
    }

    /// A message unacked for long (a topic that does not exist, a partition without a
    /// leader, a broker refusing writes) holds the slot back without any error: say which
    /// topic, every so often, so the on-call engineer does not have to guess.
    fn report_stuck_event(&mut self) {
        let ledger = self.core.ledger();
        let Some(oldest) = ledger.oldest() else {
            self.last_stuck_report = None;
            return;
        };
        let now_micros = PgTimestamp::now().unix_micros();
        let age = Duration::from_micros(
            u64::try_from(now_micros.saturating_sub(oldest.commit_unix_micros)).unwrap_or(0),
        );
        let due = self
            .last_stuck_report
            .is_none_or(|at| at.elapsed() >= STUCK_REPORT_EVERY);
        if age >= STUCK_REPORT_EVERY && due {
            self.last_stuck_report = Some(Instant::now());
            tracing::warn!(
                topic = ledger.topic_name(oldest),
                unacked = ledger.len(),
                age_s = age.as_secs(),
                "an event to topic {} has waited {} s for Kafka's ack, holding the slot back; check that the topic exists (or that brokers create topics) and that its partitions have a leader",
                ledger.topic_name(oldest),
                age.as_secs()
            );
        }
    }

    /// A transactional logical message: a tiny transaction of our own whose Commit lets
    /// the slot advance even when keepalives alone would not (e.g. idle flush disabled).
    pub(super) async fn emit_heartbeat(&mut self) -> Result<(), RelayError> {
        let emit = self.sql.execute(
            "SELECT pg_catalog.pg_logical_emit_message(true, 'outboxd.heartbeat'::text, ''::text)",
            &[],
        );
        tokio::time::timeout(SQL_TIMEOUT, emit)
            .await
            .map_err(|_| {
                RelayError::Postgres(pgrepl::ReplError::Timeout("emitting a heartbeat"))
            })??;
        Ok(())
    }

    /// Binary values give the bytes of the text form under the settings they were chosen
    /// under; a reload that changes them (seen on the side connection, which takes the
    /// same reload) ends the session, and the next one chooses again.
    async fn watch_output_settings(&mut self) -> Result<(), RelayError> {
        let Some(was) = &self.output_settings else {
            return Ok(());
        };
        let now = bounded("reading the output settings", async {
            Ok(pgrepl::preflight::output_settings(&self.sql).await?)
        })
        .await?;
        if &now != was {
            return Err(RelayError::OutputSettingsChanged {
                was: was.join(", "),
                now: now.join(", "),
            });
        }
        Ok(())
    }
}
