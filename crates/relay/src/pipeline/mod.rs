//! The relay loop: sessions of replication → Kafka, reconnected with backoff on retryable
//! errors, ended by a permanent error or a shutdown request.

mod backfill;
mod binary;
mod carry;
mod catchup;
mod claim;
mod config;
mod error;
mod observe;
mod server;
mod server_settings;
mod session;
mod shard_catalog;
mod slot;
mod slot_history;

use std::time::Duration;

use outbox_core::Backoff;
use pgrepl::{ReplicationConnection, StartOptions};
use tokio::sync::watch;
use tracing::Instrument;

pub use backfill::{
    refuse_unfinished_backfill, resume_command, Backfill, BackfillError, SlotSnapshot, ORDER_COLUMN,
};
pub use claim::refuse_other_cluster;
pub use config::RelayConfig;
pub use error::{BeforeBadRow, DecidingCode, ErrorClass, OtherClusterRecord, RelayError};
pub use observe::Observer;
pub use server::MIN_SERVER_VERSION_NUM;
pub use server_settings::{judge_server, Verdict};
pub use session::publication::{
    compare as compare_publication, judge_unrecorded as judge_unrecorded_publication,
    look as look_at_publication,
};
pub use session::SessionEnd;
pub use shard_catalog::{
    judge_leftover_shards, judge_shard_layout, leftover_shards, verify_shard_layout, ShardSpec,
};
pub use slot::{
    create_checked, judge_publication, judge_slot, missing_table, outbox_rows, table_candidates,
    CreatedSlot, FailoverSlot, SlotStart, SlotStats,
};
pub use slot_history::{judge_missing_slot, Consent, Creation, History};

use outbox_core::{Ended, ReplayStart};

use crate::kafka::{
    build_producer, build_transactional_producer, BrokerProbe, ProducerSettings, ProgressRecord,
    ProgressStore, SlotIdentity,
};
use carry::Carry;
use claim::{record_first_look, replay_claim};
use server::{check_server_version, refused};
use session::{Session, SessionStart};

pub use outbox_core::BadRowPolicy;

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
    let mut carry = Carry::new(cfg.producer.transactions.is_some());
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
                    carry.life.ended(Ended::SlotTaken);
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
                carry.life.ended(Ended::Retry);
                watcher = None;
                obs.standby(false);
                let d = backoff.after_session(carry.progressed, &mut rand::thread_rng());
                tracing::warn!(retry_in_ms = d.as_millis(), "{e}");
                if e.is_producer_fatal() {
                    obs.delivery_error();
                }
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

/// The streaming session's wait for a table's lock: shorter than PostgreSQL's default
/// `deadlock_timeout` (1 s).
const LOCK_TIMEOUT: &str = "SET lock_timeout = '500ms'";

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
    server_settings::check_server(&sql, &cfg.slot, !carry.settings_warned).await?;
    carry.settings_warned = true;
    let mut conn = ReplicationConnection::connect(pg).await?;
    check_server_version(conn.server_version_num().await?)?;
    let system = conn.identify_system().await?;
    let server = (pg.host.clone(), pg.port);
    let previous_timeline = carry
        .life
        .connected(&system.system_id, system.timeline, server.clone())
        .map_err(|r| refused(r, &server))?;
    let identity = SlotIdentity {
        cluster: cfg.cluster_name.clone(),
        system_id: system.system_id.clone(),
        database: pg.dbname.clone(),
        slot: cfg.slot.clone(),
    };
    if let Some(shard) = &cfg.shard {
        shard_catalog::verify_shard_layout(&sql, shard).await?;
    }
    let prepared = slot::prepare(
        &sql,
        pg,
        &cfg.slot,
        &cfg.publication,
        cfg.create_slot,
        carry.seen_slot,
        cfg.rules.relay_table.then_some(&cfg.rules.table),
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
    let guarded = cfg.rules.relay_table
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
        messages: cfg.rules.emit.is_some() || cfg.heartbeat_interval.is_some() || guarded,
        proto_version: None,
        binary: binary.is_some(),
        // Not `start`: the slot may have moved since it was read (another instance held
        // it until just now), and PostgreSQL <= 16 takes a lower flush as given. The
        // server ignores a flush of 0/0 until the real position is known below.
        initial_flush: pgoutput::Lsn::ZERO,
        status_interval: cfg.status_interval,
        // A longer message is read through, not held: one message's size never sets
        // the memory used.
        frame_limit: outbox_core::frame_limit(cfg.rules.max_message_bytes),
    };
    // Before the stream starts: from then on the walsender counts what it decodes.
    let decoded_before = match (cfg.rules.relay_table, progress) {
        (true, Some(p)) => {
            let decoded = pgrepl::preflight::slot_decoded(&sql, &cfg.slot).await?;
            // A slot held by another instance: this one stands by and records nothing.
            if !decoded && !start.held && !carry.life.carries_claim() {
                let at = ProgressRecord::slot_created(system.timeline, start.confirmed_flush, None);
                record_first_look(cfg, (pg, &sql), p, &identity, obs, at).await?;
            }
            decoded
        }
        _ => false,
    };
    // Streaming from here: the application's DDL may hold a lock on an outbox table for
    // long (a DEFAULT partition's scan by `CREATE TABLE ... PARTITION OF`, `VACUUM
    // FULL`), and the periodic checks that open a table give up rather than stall the
    // session's loop (`Session::unless_locked`). The start's checks above wait: the
    // read of a new slot's snapshot must not be given up.
    sql.batch_execute(LOCK_TIMEOUT)
        .await
        .map_err(pgrepl::ReplError::Sql)?;
    let mut stream = conn.start_replication(options).await?;
    obs.pgoutput_binary(binary.is_some());
    let table = cfg.rules.relay_table.then_some((
        cfg.rules.table.schema.as_str(),
        cfg.rules.table.table.as_str(),
    ));
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
    let fingerprint = cfg.fingerprint(
        looked
            .as_ref()
            .and_then(|l| l.seen.as_ref())
            .map_or("", |p| p.identity.as_str()),
    );
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Exactly-once: the slot's transactional.id is registered before the record is read,
    // so an instance that held the slot before is fenced and its open transaction aborted
    // first, and the record (written only inside committed transactions) is the whole
    // truth of what Kafka has: it, not this process's memory, says what to skip.
    let transactional = match cfg.producer.transactions {
        Some(_) => {
            let producer = build_transactional_producer(
                &cfg.producer,
                tx.clone(),
                &identity.transactional_id(),
            )?;
            let wait = cfg
                .producer
                .transaction_timeout()
                .max(INIT_TRANSACTIONS_MIN);
            producer.init_transactions(wait).await?;
            Some(producer)
        }
        None => None,
    };
    let known = replay_claim(cfg, obs, carry, progress, (&identity, &server)).await?;
    let publication = session::publication::PublicationWatch::start(
        &cfg.publication,
        looked,
        &known,
        (pg.clone(), settler),
        decoded_before,
    )?;
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
    let record_trusted = known.record_trusted();
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
        mark_every: cfg.rules.caps.mark_every(),
        tracked_rows: cfg.rules.caps.tracked_rows(),
        new_lineage: rand::random(),
        doubt_lineage: rand::random(),
    };
    let producer = match transactional {
        Some(producer) => producer,
        None => build_producer(&cfg.producer, tx)?,
    };
    obs.connected(true, true);
    if std::mem::take(&mut carry.standing_by) {
        // Another instance wrote meanwhile, under the same producer id: records of its
        // below this process's aborted spans would be taken for them.
        carry.aborted_spans.clear();
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
            publication,
            server,
            binary,
            output_settings,
            aborted_spans: carry.aborted_spans.clone(),
            record_trusted,
        },
    );
    let result = match session.run(&mut stream, shutdown).await {
        Err(e) => {
            let e = session.explain(e).await;
            let e = session.settle_before_bad_row(e, &mut stream).await;
            let e = session.abort_open_txn(e, None).await;
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
    carry.aborted_spans = session.aborted_spans();
    // Kept for the next session only if this one ends in a retry (`relay_loop`).
    carry
        .life
        .session_ran(Some(session.delivered()), session.publication_seen());
    if let Err(RelayError::Session(e)) = &result {
        if e.doubts_replay() {
            carry.life.replay_unproven();
        }
    }
    match &result {
        // A bad row's stop confirmed what Kafka acknowledged before it: CopyDone makes the
        // walsender read that status update before the connection goes.
        Ok(_) | Err(RelayError::BadRow { .. }) => {
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
