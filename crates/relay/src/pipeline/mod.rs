//! The relay loop: sessions of replication → Kafka, reconnected with backoff on retryable
//! errors, ended by a permanent error or a shutdown request.

mod backfill;
mod binary;
mod catchup;
mod error;
mod observe;
mod session;
mod shard;
mod slot;
mod slot_history;

use std::time::Duration;

use outbox_core::{Backoff, BinaryMode, EmitMapper, TableSpec, TextOnly, TopicName};
use pgrepl::{ConnectConfig, ReplicationConnection, StartOptions};
use tokio::sync::watch;
use tracing::Instrument;

pub use backfill::{
    refuse_unfinished_backfill, resume_command, Backfill, BackfillError, SlotSnapshot, ORDER_COLUMN,
};
pub use error::{DecidingCode, ErrorClass, OtherClusterRecord, RelayError};
pub use observe::Observer;
pub use session::publication::{
    compare as compare_publication, judge_unrecorded as judge_unrecorded_publication,
    look as look_at_publication,
};
pub use session::SessionEnd;
pub use shard::{judge_shard_layout, verify_shard_layout, ShardSpec};
pub use slot::{
    create_checked, judge_publication, judge_server, judge_slot, missing_table, outbox_rows,
    table_candidates, CreatedSlot, FailoverSlot, SlotStart, SlotStats, Verdict,
};
pub use slot_history::{judge_missing_slot, Consent, Creation, History};

use outbox_core::{DeliveredPosition, ReplayStart};

use crate::kafka::{
    build_producer, build_transactional_producer, BrokerProbe, ProducerSettings, ProgressError,
    ProgressRecord, ProgressStore, PublicationSeen, SlotIdentity, SlotRecords,
};
use session::{Session, SessionStart};

pub use outbox_core::BadRowPolicy;

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
    /// How long a stream start waits for the progress record before it skips nothing.
    pub progress_read_wait: Duration,
    /// How often the publication is looked at (see `session::publication`); the slot is
    /// confirmed only up to the last look that matched.
    pub publication_check_interval: Duration,
    /// `OUTBOXD_CLUSTER_NAME`, part of the progress record's key (see `SlotIdentity`).
    pub cluster_name: String,
    /// Slot statistics are polled every this many 1-second ticks.
    pub slot_stats_every_ticks: u64,
    /// Set when `table` is one shard (hash partition) of a sharded outbox: the layout is
    /// verified with the publication, so a partition no shard reads stops the relay.
    pub shard: Option<ShardSpec>,
    /// `OUTBOXD_PGOUTPUT_BINARY`: whether sessions ask pgoutput for binary values.
    pub binary: BinaryMode,
}

/// The event trigger of `sql/publication-guard.sql`.
pub const PUBLICATION_GUARD_TRIGGER: &str = "outboxd_publication_guard";

/// How long a session whose server went away waits for in-flight acks (see
/// `Session::settle_in_flight`).
const SETTLE_AFTER_SERVER_LOSS: Duration = Duration::from_secs(5);

/// The least `init_transactions` waits: it waits for the previous holder's open
/// transaction to be aborted.
const INIT_TRANSACTIONS_MIN: Duration = Duration::from_secs(30);

/// Asks the brokers every few seconds whether they answer, for readiness and the
/// `kafka_brokers_up` metric.
fn spawn_broker_probe(
    producer: &ProducerSettings,
    observers: Vec<Observer>,
) -> Result<tokio::task::JoinHandle<()>, RelayError> {
    let probe = std::sync::Arc::new(BrokerProbe::new(producer)?);
    Ok(tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Two misses in a row before "no broker answers": one slow answer on a loaded
        // host is not an outage worth failing readiness for.
        let mut misses = 0u32;
        loop {
            every.tick().await;
            let p = std::sync::Arc::clone(&probe);
            match tokio::task::spawn_blocking(move || p.brokers_up(Duration::from_secs(4))).await {
                Ok(0) => {
                    misses = misses.saturating_add(1);
                    if misses >= 2 {
                        observers.iter().for_each(|o| o.kafka_brokers_up(0));
                    }
                }
                Ok(n) => {
                    misses = 0;
                    observers.iter().for_each(|o| o.kafka_brokers_up(n));
                }
                Err(_) => return,
            }
        }
    }))
}

/// What one session hands the next within a process.
#[derive(Debug, Default)]
struct Carry {
    /// This process has streamed from the slot: a missing slot was dropped under us.
    seen_slot: bool,
    /// The last session made progress (resets the reconnect backoff).
    progressed: bool,
    /// What the last session claims Kafka has, and its lineage: replays of it are skipped
    /// once proven, like the progress record's.
    delivered: Option<(DeliveredPosition, u64)>,
    /// The server settings' warnings were logged.
    settings_warned: bool,
    /// The cluster (system identifier, timeline) the first connection found.
    seen_system: Option<SeenSystem>,
    /// The server the last session streamed from (host, port).
    seen_host: Option<(String, u16)>,
    /// Standing by for a slot that another instance holds (logged on entry and takeover).
    standing_by: bool,
    /// The publication at the last session's last look that matched, and whether that
    /// look was compared with the record's: the next session compares with it, like with
    /// the progress record's.
    publication: Option<(PublicationSeen, bool)>,
    /// A Relation ruled binary values out in an earlier session: later ones stream text.
    binary_ruled_out: Option<TextOnly>,
}

/// What the coming replay may skip once the stream proves it: the claim of the previous
/// session of this process, or else the progress record's, with the lineage it continues.
/// No record, an unreadable one, or one this process saw another live writer write:
/// nothing (see `outbox_core::delivered`).
async fn replay_claim(
    cfg: &RelayConfig,
    obs: &Observer,
    carry: &Carry,
    progress: Option<&ProgressStore>,
    identity: &SlotIdentity,
) -> Result<Known, RelayError> {
    if let Some(claim) = &carry.delivered {
        let (publication, read) = match &carry.publication {
            Some((look, compared)) => (Some(look.clone()), *compared),
            None => (None, true),
        };
        return Ok(Known {
            claim: Some(claim.clone()),
            publication,
            timeline: None,
            read,
            unrecorded: false,
        });
    }
    let Some(p) = progress else {
        return Ok(Known {
            read: true,
            ..Known::default()
        });
    };
    // Bounded: the stream is already started and waits for this optimisation (and the
    // identity check it brings is then skipped: it may only ever stop a relay, never be
    // why one cannot start).
    let wait = cfg.progress_read_wait;
    p.check_durable_in_background();
    let read = tokio::time::timeout(wait, p.read_slot(identity)).await;
    match read.unwrap_or(Err(ProgressError::Timeout(wait))) {
        Ok(records) => {
            refuse_other_cluster(&records, p, identity)?;
            refuse_unfinished_backfill(&records, p.topic(), identity)?;
            if records.writers_alternate() && p.mark_foreign_writer() {
                obs.progress_foreign_write();
                warn_foreign_writer(identity, p.topic());
            }
            let publication = records.last_look().cloned();
            let timeline = records.ours.as_ref().map(|r| r.claim.timeline);
            Ok(Known {
                unrecorded: publication.is_none(),
                claim: records.ours.map(|r| (r.claim, r.lineage)),
                publication,
                timeline,
                read: true,
            })
        }
        Err(ProgressError::Unreadable(why)) => {
            // Not a record outboxd writes: read, and holding nothing. Waiting for a
            // readable one would hold the slot, and the primary's WAL, forever.
            unreadable_record(obs, identity, p.topic(), &why);
            Ok(Known {
                read: true,
                unrecorded: true,
                ..Known::default()
            })
        }
        Err(e) => {
            obs.progress_record_unread();
            tracing::warn!(
                "no progress record to skip replayed events, or to compare the publication with ({e}): replayed events are published again, and the slot is not confirmed past its start until the record is read and the publication compared with it"
            );
            Ok(Known::default())
        }
    }
}

/// A slot that has decoded nothing yet (a slot made by hand, or its statistics reset by
/// a crash): before its first stream, a look at the publication is recorded unless the
/// record holds one, so that no stream of this slot ever runs without a look to compare
/// with. Without it a later start could only judge the slot's catalog horizon, which
/// flags a slot made just after its publication (it keeps an older `catalog_xmin` until
/// it confirms) as changed. Until Kafka answers, the slot is not streamed: nothing could
/// be published anyway.
async fn record_first_look(
    cfg: &RelayConfig,
    (pg, sql): (&ConnectConfig, &tokio_postgres::Client),
    progress: &ProgressStore,
    identity: &SlotIdentity,
    obs: &Observer,
    record: ProgressRecord,
) -> Result<(), RelayError> {
    let failed = |reason: String| RelayError::FirstLookUnrecorded {
        publication: cfg.publication.clone(),
        progress_topic: progress.topic().to_owned(),
        reason,
    };
    let waited = |what: &str| failed(format!("{what} within {FIRST_LOOK_WAIT:?}"));
    let records = match tokio::time::timeout(FIRST_LOOK_WAIT, progress.read_slot(identity)).await {
        Ok(Ok(records)) => records,
        Ok(Err(ProgressError::Unreadable(why))) => {
            unreadable_record(obs, identity, progress.topic(), &why);
            SlotRecords::default()
        }
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(waited("Kafka did not answer the read")),
    };
    refuse_other_cluster(&records, progress, identity)?;
    // Its resume drops and creates the slot again: a record would make that a lost slot.
    refuse_unfinished_backfill(&records, progress.topic(), identity)?;
    if records.last_look().is_some() || records.ours.is_some() {
        return Ok(());
    }
    let table = (cfg.table.schema.as_str(), cfg.table.table.as_str());
    let looked =
        session::publication::look(sql, (pg, &mut None), &cfg.publication, Some(table)).await?;
    let Some(seen) = looked.seen.filter(|_| looked.settled) else {
        // Unsettled: the start's own look decides as before (`StandbysUnsettled`); no
        // publication: the session stops on it.
        return Ok(());
    };
    let record = ProgressRecord {
        publication: Some(seen),
        ..record
    };
    match tokio::time::timeout(FIRST_LOOK_WAIT, progress.write_and_wait(identity, &record)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(waited("Kafka did not acknowledge the write")),
    }
}

/// How long a slot's first start waits for Kafka to read and record its first look.
const FIRST_LOOK_WAIT: Duration = Duration::from_secs(30);

/// Says that the slot's record is not one outboxd writes, which then counts as none.
pub(super) fn unreadable_record(obs: &Observer, identity: &SlotIdentity, topic: &str, why: &str) {
    obs.progress_record_invalid();
    tracing::error!(
        key = %identity.key(),
        progress_topic = %topic,
        "this slot's progress record is not one outboxd writes ({why}): nothing is skipped on it, the publication is compared with the slot instead, and the next write replaces it. Something other than outboxd writes this topic: only outboxd's Kafka principal may (docs/operations.md, \"OutboxdProgressRecordInvalid\")"
    );
}

/// What the last session of this process, or the progress record, knew.
#[derive(Debug, Default)]
struct Known {
    claim: Option<(DeliveredPosition, u64)>,
    publication: Option<PublicationSeen>,
    /// The record's timeline: a server on an older one is an abandoned history.
    timeline: Option<u32>,
    /// Whether the record (or the last session) was read: if not, the publication is
    /// compared once it is (see `session::publication`).
    read: bool,
    /// The record was read and holds no look at the publication for this slot, under
    /// any name of this cluster.
    unrecorded: bool,
}

/// Refuses a server on an older timeline than the one recorded: a primary left running
/// after a standby was promoted (see [`RelayError::TimelineWentBack`]).
pub(super) fn refuse_older_timeline(
    recorded: u32,
    now: u32,
    server: &(String, u16),
) -> Result<(), RelayError> {
    if now < recorded {
        return Err(RelayError::TimelineWentBack {
            host: server.0.clone(),
            port: server.1,
            seen: recorded,
            found: now,
        });
    }
    Ok(())
}

/// The loud warning for two live writers of one key (see `Doubt::ForeignWriter`).
pub(super) fn warn_foreign_writer(identity: &SlotIdentity, topic: &str) {
    tracing::error!(
        key = %identity.key(),
        progress_topic = %topic,
        "another relay writes this slot's progress record with another history: two live copies of one cluster (a clone, snapshot or restored backup) share this Kafka. Replays are published again from now on (duplicates, never a loss). Set OUTBOXD_CLUSTER_NAME to a different value on each copy (or give each its own OUTBOXD_PROGRESS_TOPIC)"
    );
}

/// The fingerprint of what decides which rows this relay publishes, and where: a claim
/// written under another one proves nothing (see `outbox_core::delivered`).
/// `publication` is the catalog's identity of the publication (oid and flags).
fn fingerprint(cfg: &RelayConfig, publication: &str) -> u64 {
    cfg.rules().fingerprint(
        cfg.heartbeat_interval.is_some(),
        &cfg.publication,
        publication,
    )
}

impl RelayConfig {
    /// What the session's rules (`outbox_core::SessionCore`) need of these settings.
    pub fn rules(&self) -> outbox_core::CoreConfig {
        outbox_core::CoreConfig {
            table: self.table.clone(),
            relay_table: self.relay_table,
            emit: self.emit.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
            bad_row_policy: self.bad_row_policy,
            max_message_bytes: self.max_message_bytes,
            caps: outbox_core::InFlightCaps {
                max_messages: self.max_in_flight_messages,
                max_bytes: self.max_in_flight_bytes,
            },
            idle_flush: self.idle_flush,
        }
    }
}

/// Stops a relay whose slot has a record only from another cluster (see
/// [`RelayError::RecordOfOtherCluster`]); `check` reports the same error.
pub fn refuse_other_cluster(
    records: &SlotRecords,
    progress: &ProgressStore,
    identity: &SlotIdentity,
) -> Result<(), RelayError> {
    match records.only_other_cluster() {
        None => Ok(()),
        Some((recorded, record)) => Err(RelayError::RecordOfOtherCluster(Box::new(
            OtherClusterRecord {
                slot: identity.slot.clone(),
                database: identity.database.clone(),
                progress_topic: progress.topic().to_owned(),
                found: identity.system_id.clone(),
                recorded: recorded.clone(),
                last_confirmed: record.confirmed_lsn(),
                recorded_at: record
                    .since_text()
                    .unwrap_or_else(|| record.recorded_at_text()),
            },
        ))),
    }
}

/// The oldest PostgreSQL outboxd supports: pgoutput's `messages` option, the
/// `CREATE_REPLICATION_SLOT` forms and the catalog views it relies on (and the versions
/// its tests run on) start here.
pub const MIN_SERVER_VERSION_NUM: u32 = 140_000;

fn check_server_version(version_num: u32) -> Result<(), RelayError> {
    if version_num < MIN_SERVER_VERSION_NUM {
        return Err(RelayError::UnsupportedServer { version_num });
    }
    Ok(())
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
    server: (&str, u16),
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
        // A promotion only ever moves to a newer timeline. An older one is a primary that
        // was left running after a standby took over (split brain): its history was
        // abandoned, and what it holds past the fork is not the cluster's.
        Some(s) if now.timeline < s.timeline => Err(RelayError::TimelineWentBack {
            host: server.0.to_owned(),
            port: server.1,
            seen: s.timeline,
            found: now.timeline,
        }),
        Some(s) if s.timeline != now.timeline => {
            let previous = s.timeline;
            s.timeline = now.timeline;
            Ok(Some(previous))
        }
        Some(_) => Ok(None),
    }
}

/// Runs several relays (the shards of a sharded outbox) side by side, each with its own
/// slot, producer, ack tracking, flush position and progress record, until `shutdown`
/// turns true. A permanent error in one drains the others and is returned: a process
/// that relays only some of its shards would look alive while one of them is not.
pub async fn run_all(
    relays: Vec<(RelayConfig, Observer)>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let Some((first, _)) = relays.first() else {
        return Ok(());
    };
    let probe = spawn_broker_probe(
        &first.producer,
        relays.iter().map(|(_, o)| o.clone()).collect(),
    )?;
    let (stop_tx, stop_rx) = watch::channel(*shutdown.borrow());
    let stop_tx = &stop_tx;
    let runs = relays.iter().map(|(cfg, obs)| {
        let stop = stop_rx.clone();
        let run = async move {
            let result = run_one(cfg, obs, stop).await;
            if result.is_err() {
                let _ = stop_tx.send(true);
            }
            result
        };
        let span = match &cfg.shard {
            Some(shard) => tracing::info_span!("shard", shard = shard.index),
            None => tracing::Span::none(),
        };
        run.instrument(span)
    });
    let all = futures_util::future::join_all(runs);
    tokio::pin!(all);
    let mut listening = true;
    let results = loop {
        tokio::select! {
            results = &mut all => break results,
            changed = shutdown.changed(), if listening => {
                // A dropped sender can never ask for a shutdown: stop listening.
                listening = changed.is_ok();
                if listening && *shutdown.borrow() {
                    let _ = stop_tx.send(true);
                }
            }
        }
    };
    probe.abort();
    results
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .map(|_| ())
}

async fn run_one(
    cfg: &RelayConfig,
    obs: &Observer,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(Duration::from_millis(200), cfg.reconnect_max_backoff);
    let progress = match &cfg.progress_topic {
        Some(topic) => Some(ProgressStore::new(&cfg.producer, topic)?),
        None => None,
    };
    let result = relay_loop(cfg, obs, progress.as_ref(), &mut shutdown, &mut backoff).await;
    if let Some(p) = &progress {
        p.abandon_pending();
    }
    result
}

async fn relay_loop(
    cfg: &RelayConfig,
    obs: &Observer,
    progress: Option<&ProgressStore>,
    shutdown: &mut watch::Receiver<bool>,
    backoff: &mut Backoff,
) -> Result<(), RelayError> {
    let mut carry = Carry::default();
    // A standby's one connection for watching the slot, kept across attempts.
    let mut watcher: Option<tokio_postgres::Client> = None;
    // A standby's way to ask whether Kafka answers it, made at its first takeover.
    let mut probe: Option<std::sync::Arc<BrokerProbe>> = None;
    loop {
        carry.progressed = false;
        let result = run_session(cfg, obs, progress, shutdown, &mut carry).await;
        obs.connected(false, false);
        match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Err(e) if e.class() == ErrorClass::Retryable => {
                if *shutdown.borrow() {
                    return Ok(());
                }
                if e.is_slot_in_use() {
                    // Another instance streams now and writes the record: what this one
                    // knew is older than what the record will say at the takeover.
                    carry.delivered = None;
                    carry.publication = None;
                    if !carry.standing_by {
                        // Once: a standby may wait for days.
                        tracing::info!("{e}; standing by until the slot is released (watching it over one connection)");
                        carry.standing_by = true;
                    }
                    obs.standby(true);
                    if wait_for_takeover(cfg, &mut watcher, &mut probe, shutdown).await? {
                        return Ok(());
                    }
                    continue;
                }
                watcher = None;
                obs.standby(false);
                let d = backoff.after_session(carry.progressed, &mut rand::thread_rng());
                tracing::warn!(retry_in_ms = d.as_millis(), "{e}");
                obs.reconnect();
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How often a standby looks at the slot it waits for.
const STANDBY_POLL: Duration = Duration::from_secs(1);

/// How long a released slot may stay free, no broker answering this standby, before it
/// takes the slot anyway: another standby that reaches Kafka has had time to take it, and
/// an outage of Kafka for every instance (credentials, certificates) must surface as the
/// session's own Kafka errors rather than a wait that holds WAL without a word.
const TAKE_UNANSWERED_SLOT_AFTER: Duration = Duration::from_secs(60);

/// A standby waits until the slot is released and a Kafka broker answers it: one that
/// cannot reach Kafka would take the slot and hold it, relaying nothing, while another
/// standby that can waits (at most [`TAKE_UNANSWERED_SLOT_AFTER`]). Returns true on
/// shutdown.
async fn wait_for_takeover(
    cfg: &RelayConfig,
    watcher: &mut Option<tokio_postgres::Client>,
    probe: &mut Option<std::sync::Arc<BrokerProbe>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, RelayError> {
    let mut said = false;
    let mut free_since: Option<std::time::Instant> = None;
    loop {
        let asked = std::time::Instant::now();
        if wait_for_slot_release(cfg, watcher, shutdown).await {
            return Ok(true);
        }
        if asked.elapsed() > STANDBY_POLL * 3 {
            // Held again meanwhile (another standby took it): a new release.
            free_since = None;
        }
        let free = *free_since.get_or_insert_with(std::time::Instant::now);
        if free.elapsed() >= TAKE_UNANSWERED_SLOT_AFTER {
            tracing::warn!("the slot stayed free for {TAKE_UNANSWERED_SLOT_AFTER:?} with no Kafka broker answering this instance: taking it");
            return Ok(false);
        }
        let p = match probe {
            Some(p) => std::sync::Arc::clone(p),
            None => std::sync::Arc::clone(
                probe.insert(std::sync::Arc::new(BrokerProbe::new(&cfg.producer)?)),
            ),
        };
        let up = tokio::task::spawn_blocking(move || p.brokers_up(STANDBY_POLL * 2))
            .await
            .unwrap_or(0);
        if up > 0 {
            return Ok(false);
        }
        if !std::mem::replace(&mut said, true) {
            tracing::warn!("the slot is free, but no Kafka broker answers this instance: not taking it (another instance that reaches Kafka may), standing by");
        }
    }
}

/// A standby waits here, over one SQL connection kept in `watcher`, until the slot it
/// waits for is no longer active (or the connection fails, or the slot is gone: the next
/// session attempt then reports what it finds). Returns true on shutdown.
async fn wait_for_slot_release(
    cfg: &RelayConfig,
    watcher: &mut Option<tokio_postgres::Client>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STANDBY_POLL) => {}
            _ = shutdown.changed() => return true,
        }
        if watcher
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            match cfg.pg.connect_sql_target().await {
                Ok((_, client)) => *watcher = Some(client),
                Err(e) => {
                    tracing::debug!("standby: cannot watch the slot: {e}");
                    *watcher = None;
                    return false;
                }
            }
        }
        let Some(client) = watcher.as_ref() else {
            return false;
        };
        let state = tokio::time::timeout(
            Duration::from_secs(10),
            pgrepl::preflight::slot_state(client, &cfg.slot),
        )
        .await;
        match state {
            Ok(Ok(Some(state))) if state.active => continue,
            Ok(Ok(_)) => return false,
            Ok(Err(_)) | Err(_) => {
                *watcher = None;
                return false;
            }
        }
    }
}

async fn run_session(
    cfg: &RelayConfig,
    obs: &Observer,
    progress: Option<&ProgressStore>,
    shutdown: &mut watch::Receiver<bool>,
    carry: &mut Carry,
) -> Result<SessionEnd, RelayError> {
    // With several hosts, the first that is a primary; the session keeps to it.
    let (pg, sql) = cfg.pg.connect_sql_target().await?;
    if !cfg.pg.other_hosts.is_empty() {
        tracing::info!(host = %pg.host, port = pg.port, "connected to the primary among the configured hosts");
    }
    let pg = &pg;
    // On a standby a synced slot exists but cannot be streamed from, and a missing one
    // must not be judged lost: neither is permanent while a promotion may be under way.
    if pgrepl::preflight::in_recovery(&sql).await? {
        return Err(RelayError::InRecovery {
            host: pg.host.clone(),
            port: pg.port,
        });
    }
    // Warnings once per process: a standby checks every second.
    slot::check_server(&sql, &cfg.slot, !carry.settings_warned).await?;
    carry.settings_warned = true;
    let mut conn = ReplicationConnection::connect(pg).await?;
    check_server_version(conn.server_version_num().await?)?;
    let system = conn.identify_system().await?;
    let previous_timeline = check_system(&mut carry.seen_system, &system, (&pg.host, pg.port))?;
    let host = (pg.host.clone(), pg.port);
    if previous_timeline.is_some() || carry.seen_host.as_ref().is_some_and(|h| *h != host) {
        // Another server's history: what this process proved delivered is proven again
        // from the progress record, never carried over.
        carry.delivered = None;
    }
    carry.seen_host = Some(host);
    let identity = SlotIdentity {
        cluster: cfg.cluster_name.clone(),
        system_id: system.system_id.clone(),
        database: pg.dbname.clone(),
        slot: cfg.slot.clone(),
    };
    if let Some(shard) = &cfg.shard {
        shard::verify_shard_layout(&sql, shard).await?;
    }
    let prepared = slot::prepare(
        &sql,
        pg,
        &cfg.slot,
        &cfg.publication,
        cfg.create_slot,
        carry.seen_slot,
        cfg.relay_table.then_some(&cfg.table),
    )
    .await?;
    let created = prepared.is_none();
    let start = match prepared {
        Some(start) => {
            slot::ensure_failover(&sql, &mut conn, &cfg.slot, cfg.failover_slot).await?;
            start
        }
        None => {
            slot::create_if_new(
                cfg,
                pg,
                &sql,
                progress,
                &identity,
                system.timeline,
                system.xlog_pos,
            )
            .await?
        }
    };
    // sql/publication-guard.sql's trigger marks publication changes with a message,
    // which the stream carries only when messages are asked for.
    let guarded = cfg.relay_table
        && pgrepl::preflight::event_trigger_enabled(&sql, PUBLICATION_GUARD_TRIGGER).await?;
    let binary = binary::choose(cfg, &sql, &mut conn, carry.binary_ruled_out.as_ref()).await?;
    // The side connection takes every reload the walsender takes: its settings from now
    // on stand for the walsender's (see `Session::watch_output_settings`).
    let output_settings = match &binary {
        Some(walsender) => {
            let side = pgrepl::preflight::output_settings(&sql).await?;
            let shown = [
                &walsender.time_zone,
                &walsender.date_style,
                &walsender.bytea_output,
            ];
            if side.iter().zip(shown).any(|(a, b)| a != b) {
                // Set per connection somewhere (or a reload just now): a change from
                // here on still shows.
                tracing::warn!(side = ?side, walsender = ?shown, "the SQL connection's output settings differ from the replication connection's");
            }
            Some(side)
        }
        None => None,
    };
    let options = StartOptions {
        slot: cfg.slot.clone(),
        // 0/0: the server starts at the slot's confirmed_flush_lsn.
        start_lsn: pgoutput::Lsn::ZERO,
        publication_names: vec![cfg.publication.clone()],
        // The heartbeat is a logical message: without `messages` pgoutput drops it, its
        // transaction is empty and skipped (PG15+), and the slot would not advance.
        messages: cfg.emit.is_some() || cfg.heartbeat_interval.is_some() || guarded,
        proto_version: None,
        binary: binary.is_some(),
        // Not `start`: the slot may have moved since it was read (another instance held
        // it until just now), and PostgreSQL <= 16 takes a lower flush as given. The
        // server ignores a flush of 0/0 until the real position is known below.
        initial_flush: pgoutput::Lsn::ZERO,
        status_interval: cfg.status_interval,
        // A longer message is read through, not held: one message's size never sets
        // the memory used.
        frame_limit: outbox_core::frame_limit(cfg.max_message_bytes),
    };
    // Before the stream starts: from then on the walsender counts what it decodes.
    let decoded_before = match (cfg.relay_table, progress) {
        (true, Some(p)) => {
            let decoded = pgrepl::preflight::slot_decoded(&sql, &cfg.slot).await?;
            // A slot held by another instance: this one stands by and records nothing.
            if !decoded && !start.held && carry.delivered.is_none() {
                let at = ProgressRecord::slot_created(system.timeline, start.confirmed_flush, None);
                record_first_look(cfg, (pg, &sql), p, &identity, obs, at).await?;
            }
            decoded
        }
        _ => false,
    };
    let mut stream = conn.start_replication(options).await?;
    obs.pgoutput_binary(binary.is_some());
    let table = cfg
        .relay_table
        .then_some((cfg.table.schema.as_str(), cfg.table.table.as_str()));
    carry.seen_slot = true;
    // The slot is ours now and cannot move under us: this is where the stream starts.
    let confirmed_flush = slot::confirmed_flush(&sql, &cfg.slot)
        .await?
        .unwrap_or(start.confirmed_flush);
    stream.flush_handle().advance(confirmed_flush);
    // Exactly-once: this session's walsender, which holds the slot now, to tell a fence by
    // another instance from the broker's own abort (`Session::judge_fence`).
    let walsender = match cfg.producer.transactions {
        Some(_) => slot::holder(&sql, &cfg.slot).await?,
        None => None,
    };
    if let Some(previous) = previous_timeline {
        tracing::warn!(
            slot = %cfg.slot,
            previous_timeline = previous,
            timeline = system.timeline,
            resumed_from = %confirmed_flush,
            "the server's timeline changed: a standby was promoted (failover); streaming from the slot's confirmed position on the new primary"
        );
    }
    // This look is the session's baseline: a change since the record's last look shows
    // here, and a later one at the ticks (or at once, at a guard message).
    let mut settler = None;
    let looked = match table {
        Some(table) => Some(
            session::publication::look(&sql, (pg, &mut settler), &cfg.publication, Some(table))
                .await?,
        ),
        None => None,
    };
    let settled = looked.as_ref().is_none_or(|l| l.settled);
    let mut publication = looked.and_then(|l| l.seen);
    let fingerprint = fingerprint(
        cfg,
        publication.as_ref().map_or("", |p| p.identity.as_str()),
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Exactly-once: the slot's transactional.id is registered before the record is read,
    // so an instance that held the slot before is fenced and its open transaction aborted
    // first, and the record (written only inside committed transactions) is the whole
    // truth of what Kafka has: it, not this process's memory, says what to skip.
    let transactional = match cfg.producer.transactions {
        Some(_) => {
            carry.delivered = None;
            let producer = build_transactional_producer(
                &cfg.producer,
                tx.clone(),
                &identity.transactional_id(),
            )?;
            let wait = cfg
                .producer
                .transaction_timeout()
                .max(INIT_TRANSACTIONS_MIN);
            producer
                .init_transactions(wait)
                .await
                .map_err(RelayError::Transaction)?;
            Some(producer)
        }
        None => None,
    };
    let known = replay_claim(cfg, obs, carry, progress, &identity).await?;
    let server = (pg.host.clone(), pg.port);
    if let Some(recorded) = known.timeline {
        refuse_older_timeline(recorded, system.timeline, &server)?;
    }
    let mut start_settled = settled;
    if let (Some(last), Some(_)) = (&known.publication, table) {
        session::publication::compare(&cfg.publication, last, publication.as_ref())?;
        if !settled {
            // A commit not yet visible may have changed it before this look: a change
            // seen later is named from the recorded look, not from this one.
            publication = Some(last.clone());
            start_settled = true;
        }
    } else if !settled && known.read && table.is_some() {
        return Err(RelayError::StandbysUnsettled {
            publication: cfg.publication.clone(),
        });
    }
    // No look recorded though the slot decoded before (a new progress topic, a record
    // deleted): the slot's catalog horizon says whether the publication may have changed
    // since it last decoded.
    if let (Some(p), true, true, true) =
        (progress, known.unrecorded, decoded_before, table.is_some())
    {
        session::publication::judge_unrecorded(
            &sql,
            &cfg.publication,
            &cfg.slot,
            identity.key(),
            p.topic(),
        )
        .await?;
    }
    let claim = known.claim;
    let replay = ReplayStart {
        timeline: system.timeline,
        start: confirmed_flush,
        // IDENTIFY_SYSTEM answered before this session created the slot, whose record
        // names the slot's position: the server wrote its WAL that far, so that position
        // is no sign of another copy's record.
        server_end: if created {
            system.xlog_pos.max(confirmed_flush)
        } else {
            system.xlog_pos
        },
        claim,
        fingerprint,
        foreign_writer: progress.is_some_and(ProgressStore::foreign_writer),
        new_lineage: rand::random(),
        doubt_lineage: rand::random(),
    };
    let producer = match transactional {
        Some(producer) => producer,
        None => build_producer(&cfg.producer, tx)?,
    };
    obs.connected(true, true);
    if std::mem::take(&mut carry.standing_by) {
        tracing::info!(slot = %cfg.slot, "took over the slot: this instance is the active one now");
    }
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
        SessionStart {
            replay,
            progress: progress.map(|p| (p.clone(), identity)),
            publication: publication.map(|p| (p, known.read)),
            settling: session::publication::Settling {
                pg: pg.clone(),
                settler,
                start_settled,
            },
            server,
            binary,
            output_settings,
        },
    );
    let result = match session.run(&mut stream, shutdown).await {
        Err(e) => {
            let e = session.explain(e).await;
            let e = session.abort_open_txn(e).await;
            Err(session.judge_fence(e, walsender).await)
        }
        ok => ok,
    };
    if let Err(RelayError::BinaryRuledOutByRelation { found, .. }) = &result {
        carry.binary_ruled_out = Some(found.clone());
    }
    if result.as_ref().is_err_and(RelayError::is_server_gone) {
        session.settle_in_flight(SETTLE_AFTER_SERVER_LOSS).await;
    }
    carry.progressed = session.made_progress();
    carry.delivered = Some(session.delivered()).filter(|_| cfg.producer.transactions.is_none());
    carry.publication = session.publication_seen();
    match &result {
        Ok(_) => {
            // Bounded: the final position was already sent; CopyDone is a courtesy.
            match tokio::time::timeout(Duration::from_secs(2), stream.stop()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("closing the replication stream: {e}"),
                Err(_) => tracing::warn!("closing the replication stream timed out"),
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
        let at = ("db1", 5432);
        assert_eq!(check_system(&mut seen, &info("7", 1), at).ok(), Some(None));
        assert_eq!(check_system(&mut seen, &info("7", 1), at).ok(), Some(None));
        assert_eq!(
            check_system(&mut seen, &info("7", 2), at).ok(),
            Some(Some(1))
        );
        assert_eq!(check_system(&mut seen, &info("7", 2), at).ok(), Some(None));
        // Back to timeline 1: an old primary left running after the promotion.
        let back = check_system(&mut seen, &info("7", 1), at).err();
        assert!(
            matches!(&back, Some(e @ RelayError::TimelineWentBack { seen: 2, found: 1, .. }) if e.exit_code() == 3),
            "{back:?}"
        );
        let err = check_system(&mut seen, &info("8", 2), at).err();
        assert!(
            matches!(&err, Some(e @ RelayError::OtherCluster { .. }) if e.exit_code() == 3 && e.class() == ErrorClass::Permanent),
            "{err:?}"
        );
    }

    #[test]
    fn servers_before_14_are_refused_with_exit_3() {
        let e = check_server_version(130_015).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().contains("PostgreSQL 14 or newer"), "{e}");
        assert!(check_server_version(140_000).is_ok());
        assert!(check_server_version(180_001).is_ok());
    }
}
