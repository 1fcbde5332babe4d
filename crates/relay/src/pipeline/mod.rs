//! The relay loop: sessions of replication → Kafka, reconnected with backoff on retryable
//! errors, ended by a permanent error or a shutdown request.

mod backoff;
mod error;
mod inflight;
mod observe;
mod session;
mod slot;

use std::time::Duration;

use outbox_core::{EmitMapper, TableSpec, TopicName};
use pgrepl::{ConnectConfig, ReplicationConnection, StartOptions};
use tokio::sync::watch;

pub use backoff::Backoff;
pub use error::{ErrorClass, RelayError};
pub use observe::Observer;
pub use session::SessionEnd;
pub use slot::{judge_publication, FailoverSlot, SlotStart, SlotStats};

use crate::kafka::{
    build_producer, ProducerSettings, ProgressError, ProgressRecord, ProgressStore, SlotIdentity,
};
use session::Session;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRowPolicy {
    DeadLetter,
    Stop,
}

/// Everything the relay needs, already validated.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub pg: ConnectConfig,
    pub slot: String,
    pub publication: String,
    pub create_slot: bool,
    /// Whether the slot is (made) a failover slot.
    pub failover_slot: FailoverSlot,
    pub table: TableSpec,
    /// false: only emitted logical messages are relayed, and the table need not be
    /// published. An explicit choice, never inferred from the publication.
    pub relay_table: bool,
    /// Emitted logical messages with this mapper's prefix are relayed too.
    pub emit: Option<EmitMapper>,
    pub dead_letter_topic: TopicName,
    pub bad_row_policy: BadRowPolicy,
    pub max_message_bytes: usize,
    pub max_in_flight_messages: usize,
    pub max_in_flight_bytes: usize,
    pub producer: ProducerSettings,
    pub status_interval: Option<Duration>,
    pub idle_flush: bool,
    pub heartbeat_interval: Option<Duration>,
    pub shutdown_timeout: Duration,
    pub reconnect_max_backoff: Duration,
    /// Topic of the per-slot progress record; `None`: no record, and then a missing slot
    /// is never created at start-up (only `outboxd init` creates it).
    pub progress_topic: Option<String>,
    /// How often the progress record is brought up to date while streaming.
    pub progress_interval: Duration,
    /// Slot statistics are polled every this many 1-second ticks.
    pub slot_stats_every_ticks: u64,
}

/// Creates the missing slot, but only once the progress record shows that no earlier slot
/// of this name existed, and only after recording that this one will: a slot must never
/// exist without a record, or its loss could go unnoticed.
async fn create_slot_if_new(
    cfg: &RelayConfig,
    progress: Option<&ProgressStore>,
    identity: &SlotIdentity,
    timeline: u32,
    position: pgoutput::Lsn,
) -> Result<SlotStart, RelayError> {
    let Some(progress) = progress else {
        // Without a record nothing can tell a first start from a lost slot.
        return Err(RelayError::SlotMissing {
            slot: cfg.slot.clone(),
        });
    };
    let unknown = |e: ProgressError| RelayError::SlotHistoryUnknown {
        slot: cfg.slot.clone(),
        progress_topic: progress.topic().to_owned(),
        reason: e.to_string(),
    };
    if let Some(record) = progress.read_latest(identity).await.map_err(unknown)? {
        return Err(RelayError::SlotLost {
            slot: cfg.slot.clone(),
            progress_topic: progress.topic().to_owned(),
            last_confirmed: record.confirmed_lsn,
            recorded_at: record.recorded_at_text(),
        });
    }
    progress
        .write_and_wait(identity, &ProgressRecord::now(timeline, position))
        .await
        .map_err(unknown)?;
    slot::create(&cfg.pg, &cfg.slot, cfg.failover_slot).await
}

/// The cluster this process streams from, as the first connection found it.
#[derive(Debug, Clone)]
struct SeenSystem {
    system_id: String,
    timeline: u32,
}

/// Refuses a connection to another cluster (a different system identifier: a restored
/// backup or a wrong host, whose LSNs mean nothing for our slot), and returns the earlier
/// timeline when it changed (a promotion keeps the identifier and starts a new timeline).
fn check_system(
    seen: &mut Option<SeenSystem>,
    now: &pgrepl::SystemInfo,
) -> Result<Option<u32>, RelayError> {
    match seen {
        None => {
            *seen = Some(SeenSystem {
                system_id: now.system_id.clone(),
                timeline: now.timeline,
            });
            Ok(None)
        }
        Some(s) if s.system_id != now.system_id => Err(RelayError::OtherCluster {
            expected: s.system_id.clone(),
            found: now.system_id.clone(),
        }),
        Some(s) if s.timeline != now.timeline => {
            let previous = s.timeline;
            s.timeline = now.timeline;
            Ok(Some(previous))
        }
        Some(_) => Ok(None),
    }
}

/// Runs until `shutdown` turns true (Ok) or a permanent error (Err).
pub async fn run(
    cfg: &RelayConfig,
    obs: &Observer,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(Duration::from_millis(200), cfg.reconnect_max_backoff);
    let progress = match &cfg.progress_topic {
        Some(topic) => Some(ProgressStore::new(&cfg.producer, topic)?),
        None => None,
    };
    let mut seen_slot = false;
    let mut seen_system = None;
    loop {
        let mut progressed = false;
        let result = run_session(
            cfg,
            obs,
            progress.as_ref(),
            &mut shutdown,
            &mut seen_slot,
            &mut seen_system,
            &mut progressed,
        )
        .await;
        obs.connected(false, false);
        match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Err(e) if e.class() == ErrorClass::Retryable => {
                if *shutdown.borrow() {
                    return Ok(());
                }
                let delay = if e.is_slot_in_use() {
                    // Another instance holds the slot: stand by and poll quickly, so we
                    // take over within seconds of it dying.
                    tracing::info!("{e}; standing by");
                    Duration::from_secs(1)
                } else {
                    let d = backoff.after_session(progressed);
                    tracing::warn!(retry_in_ms = d.as_millis(), "{e}");
                    obs.reconnect();
                    d
                };
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

async fn run_session(
    cfg: &RelayConfig,
    obs: &Observer,
    progress: Option<&ProgressStore>,
    shutdown: &mut watch::Receiver<bool>,
    seen_slot: &mut bool,
    seen_system: &mut Option<SeenSystem>,
    progressed: &mut bool,
) -> Result<SessionEnd, RelayError> {
    let sql = cfg.pg.connect_sql().await?;
    // On a standby a synced slot exists but cannot be streamed from, and a missing one
    // must not be judged lost: neither is permanent while a promotion may be under way.
    if pgrepl::preflight::in_recovery(&sql).await? {
        return Err(RelayError::InRecovery {
            host: cfg.pg.host.clone(),
            port: cfg.pg.port,
        });
    }
    let mut conn = ReplicationConnection::connect(&cfg.pg).await?;
    let system = conn.identify_system().await?;
    let previous_timeline = check_system(seen_system, &system)?;
    let identity = SlotIdentity {
        system_id: system.system_id.clone(),
        database: cfg.pg.dbname.clone(),
        slot: cfg.slot.clone(),
    };
    let prepared = slot::prepare(
        &sql,
        &cfg.pg,
        &cfg.slot,
        &cfg.publication,
        cfg.create_slot,
        *seen_slot,
        cfg.relay_table.then_some(&cfg.table),
    )
    .await?;
    let start = match prepared {
        Some(start) => {
            slot::ensure_failover(&sql, &mut conn, &cfg.slot, cfg.failover_slot).await?;
            start
        }
        None => {
            create_slot_if_new(cfg, progress, &identity, system.timeline, system.xlog_pos).await?
        }
    };
    let options = StartOptions {
        slot: cfg.slot.clone(),
        // 0/0: the server starts at the slot's confirmed_flush_lsn.
        start_lsn: pgoutput::Lsn::ZERO,
        publication_names: vec![cfg.publication.clone()],
        // The heartbeat is a logical message: without `messages` pgoutput drops it, its
        // transaction is empty and skipped (PG15+), and the slot would not advance.
        messages: cfg.emit.is_some() || cfg.heartbeat_interval.is_some(),
        proto_version: None,
        binary: false,
        // Not `start`: the slot may have moved since it was read (another instance held
        // it until just now), and PostgreSQL <= 16 takes a lower flush as given. The
        // server ignores a flush of 0/0 until the real position is known below.
        initial_flush: pgoutput::Lsn::ZERO,
        status_interval: cfg.status_interval,
    };
    let mut stream = conn.start_replication(options).await?;
    *seen_slot = true;
    // The slot is ours now and cannot move under us: this is where the stream starts.
    let confirmed_flush = slot::confirmed_flush(&sql, &cfg.slot)
        .await?
        .unwrap_or(start.confirmed_flush);
    stream.flush_handle().advance(confirmed_flush);
    if let Some(previous) = previous_timeline {
        tracing::warn!(
            slot = %cfg.slot,
            previous_timeline = previous,
            timeline = system.timeline,
            resumed_from = %confirmed_flush,
            "the server's timeline changed: a standby was promoted (failover); streaming from the slot's confirmed position on the new primary"
        );
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let producer = build_producer(&cfg.producer, tx)?;
    obs.connected(true, true);
    tracing::info!(
        slot = %cfg.slot,
        confirmed_flush = %confirmed_flush,
        "streaming"
    );
    let mut session = Session::new(
        cfg,
        obs,
        sql,
        producer,
        rx,
        stream.flush_handle(),
        confirmed_flush,
        progress.map(|p| (p.clone(), identity, system.timeline)),
    );
    let result = session.run(&mut stream, shutdown).await;
    *progressed = session.made_progress();
    match &result {
        Ok(_) => {
            if let Err(e) = stream.stop().await {
                tracing::warn!("closing the replication stream: {e}");
            }
        }
        Err(_) => drop(stream),
    }
    session.abandon();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(system_id: &str, timeline: u32) -> pgrepl::SystemInfo {
        pgrepl::SystemInfo {
            system_id: system_id.into(),
            timeline,
            xlog_pos: pgoutput::Lsn::ZERO,
            dbname: None,
        }
    }

    #[test]
    fn another_cluster_is_refused_and_a_new_timeline_reported_once() {
        let mut seen = None;
        assert_eq!(check_system(&mut seen, &info("7", 1)).ok(), Some(None));
        assert_eq!(check_system(&mut seen, &info("7", 1)).ok(), Some(None));
        assert_eq!(check_system(&mut seen, &info("7", 2)).ok(), Some(Some(1)));
        assert_eq!(check_system(&mut seen, &info("7", 2)).ok(), Some(None));
        let err = check_system(&mut seen, &info("8", 2)).err();
        assert!(
            matches!(&err, Some(e @ RelayError::OtherCluster { .. }) if e.exit_code() == 3 && e.class() == ErrorClass::Permanent),
            "{err:?}"
        );
    }
}
