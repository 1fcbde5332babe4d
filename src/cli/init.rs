//! `outboxd init`: creates what is missing, in the safe order: table, publication, slot.
//! It looks before it creates, so the least-privilege role (sql/role.sql) can run it once
//! an owner made the table and publication, and a missing privilege is named with its
//! GRANT before anything is attempted.

use outbox_core::pgtype::quote_ident;
use std::collections::BTreeMap;

use outboxd_relay::kafka::{
    republish_text, BackfillState, ProgressRecord, ProgressStore, PublicationSeen, RepublishOwed,
    SlotIdentity, SlotRecords, EMITTED_LOST_TEXT,
};
use outboxd_relay::pipeline::{
    compare_publication, create_checked, judge_missing_slot, judge_slot,
    judge_unrecorded_publication, leftover_shards, look_at_publication, outbox_rows,
    refuse_unfinished_backfill, resume_command, verify_shard_layout, Backfill, Consent, Creation,
    History, SlotSnapshot,
};
use pgoutput::Lsn;
use pgrepl::{preflight, ConnectConfig, ReplError, ReplicationConnection};
use tokio_postgres::Client;

use super::{say, EXIT_OK, EXIT_POSTGRES};
use crate::config::Settings;
use crate::wiring;

mod objects;
mod record;
use objects::{create_publication, create_table, verify_existing_publication};
use record::{mark_republished, record_cluster, record_owed, records_kept, settled_look};

/// Why init stopped. Every failure is on the PostgreSQL side: exit 3.
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("{0}")]
    Postgres(#[from] ReplError),
    #[error("SQL error: {}", pgrepl::error_chain(.0))]
    Sql(#[from] tokio_postgres::Error),
    /// A privilege or object outboxd needs and cannot get itself, with the fix.
    #[error("{0}")]
    Refused(String),
}

/// What the operator allowed on the command line.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--replace-progress-record`: overwrite this cluster's record too.
    pub replace_record: bool,
    /// `--recreate-lost-slot`, `--skip-existing-rows`.
    pub consent: Consent,
    /// `--accept-publication-change`: record the publication as it is now.
    pub accept_publication: bool,
    /// `--backfill "<condition>"`: publish the rows it selects from the new slot's
    /// snapshot before streaming (`outboxd_relay::pipeline::Backfill`).
    pub backfill: Option<String>,
    /// `--republish-done`: the rows an owed re-publish named are back in Kafka.
    pub republish_done: bool,
}

pub async fn init(s: &Settings, flags: Flags) -> i32 {
    match init_inner(s, flags).await {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("outboxd init failed: {e}");
            EXIT_POSTGRES
        }
    }
}

/// `"name"`, always quoted: for identifiers shown in a GRANT the operator copies.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

async fn init_inner(s: &Settings, flags: Flags) -> Result<(), InitError> {
    let (pg, sql) = wiring::connect_config(s).connect_sql_target().await?;
    let user = quote_ident(&s.pg.user);
    let table = s.table();
    if preflight::table_columns(&sql, &s.table_schema, &s.table_name)
        .await?
        .is_some()
    {
        say!("ok  table {table} (exists)");
    } else {
        create_table(s, &sql, &table, &user).await?;
        say!("ok  table {table} (created)");
    }
    let shards = s.all_shards();
    if flags.backfill.is_some() && s.shards.is_some() {
        return Err(InitError::Refused(
            "--backfill does not support a sharded outbox (OUTBOXD_SHARD_COUNT) yet: re-publish the rows by hand (docs/operations.md, \"A lost slot: re-publishing\")".into(),
        ));
    }
    if let Some(shard) = shards.first().and_then(|view| view.shard.as_ref()) {
        // The rule `run` applies: a table laid out otherwise is the operator's to change.
        verify_shard_layout(&sql, shard)
            .await
            .map_err(|e| InitError::Refused(e.to_string()))?;
        say!(
            "ok  table {table} is partitioned by hash of {} into {} shards",
            quote_ident(&s.columns.aggregate_id),
            shard.count
        );
        if let Some(advice) = leftover_shards(&sql, shard)
            .await
            .map_err(|e| InitError::Refused(e.to_string()))?
        {
            say!("warn {advice}");
        }
    }
    let mut shared = Shared {
        pg: &pg,
        all: &shards,
        replication: None,
        records: None,
        flags,
    };
    if shared.flags.republish_done {
        mark_republished(s, &mut shared).await?;
    }
    for view in &shards {
        init_shard(view, &sql, &mut shared).await?;
    }
    Ok(())
}

/// What the shards' steps share, opened where the first shard needs it (so a failure
/// stops init at the same step as with one shard): one replication connection, and one
/// progress store with one read of the topic for every shard's slot.
struct Shared<'a> {
    /// The server the SQL connection reached (the primary of a host list).
    pg: &'a ConnectConfig,
    /// Every shard (unsharded: the one table).
    all: &'a [Settings],
    replication: Option<Replication>,
    records: Option<Records>,
    flags: Flags,
}

struct Replication {
    conn: ReplicationConnection,
    /// Whether slots are created (or switched to) failover slots.
    failover: bool,
}

/// This cluster's identity and what the progress topic holds for each shard's slot.
struct Records {
    system: pgrepl::SystemInfo,
    read: TopicRead,
}

/// The store and each shard's records by slot name, or why Kafka could not tell.
type TopicRead = Result<(ProgressStore, BTreeMap<String, Result<SlotRecords, String>>), String>;

impl Shared<'_> {
    async fn replication(&mut self, s: &Settings) -> Result<&mut Replication, InitError> {
        let replication = match self.replication.take() {
            Some(r) => r,
            None => {
                let mut conn = ReplicationConnection::connect(self.pg).await?;
                let failover = s
                    .failover_slot
                    .wanted(conn.supports_failover_slots().await?)
                    .map_err(|e| InitError::Refused(e.to_string()))?;
                Replication { conn, failover }
            }
        };
        Ok(self.replication.insert(replication))
    }

    async fn records(&mut self, s: &Settings, topic: &str) -> Result<&mut Records, InitError> {
        let records = match self.records.take() {
            Some(r) => r,
            None => {
                let system = self.replication(s).await?.conn.identify_system().await?;
                let read = read_records(s, self.all, &system.system_id, topic).await;
                Records { system, read }
            }
        };
        Ok(self.records.insert(records))
    }

    /// What the progress topic says of this shard's slot (without taking it from the
    /// read, which `record_cluster` does).
    async fn history(&mut self, s: &Settings) -> Result<InitHistory, InitError> {
        let Some(topic) = &s.progress_topic else {
            return Ok(InitHistory::NotKept(
                "OUTBOXD_PROGRESS_TOPIC is empty: no progress record is kept".into(),
            ));
        };
        if s.producer.bootstrap_servers.trim().is_empty() {
            return Ok(InitHistory::NotKept(
                "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS is not set, so the progress record was not read"
                    .into(),
            ));
        }
        let Records { read, .. } = self.records(s, topic).await?;
        Ok(match read {
            Ok((_, found)) => match found.get(&s.slot) {
                Some(Ok(records)) => InitHistory::Read(Box::new(records.clone())),
                Some(Err(e)) => InitHistory::Unreadable(e.clone()),
                None => InitHistory::Unreadable("the slot was not in the read of the topic".into()),
            },
            Err(e) => InitHistory::Unreadable(e.clone()),
        })
    }
}

/// [`History`], owned.
enum InitHistory {
    Read(Box<SlotRecords>),
    Unreadable(String),
    NotKept(String),
}

impl InitHistory {
    fn judged(&self) -> History<'_> {
        match self {
            InitHistory::Read(r) => History::Read(r),
            InitHistory::Unreadable(why) => History::Unreadable(why),
            InitHistory::NotKept(why) => History::NotKept(why),
        }
    }
}

/// Every shard's records, in one read of the topic.
async fn read_records(s: &Settings, all: &[Settings], system_id: &str, topic: &str) -> TopicRead {
    let store = ProgressStore::new(&s.producer, topic).map_err(|e| e.to_string())?;
    let ids: Vec<SlotIdentity> = all
        .iter()
        .map(|v| super::slot_identity(v, system_id))
        .collect();
    // Bounded: init must not hang on an unreachable Kafka it does not strictly need.
    let found = match tokio::time::timeout(KAFKA_WAIT, store.read_slots(&ids)).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("Kafka did not answer within {KAFKA_WAIT:?}")),
    };
    let found = ids
        .into_iter()
        .zip(found)
        .map(|(id, r)| (id.slot, r.map_err(|e| e.to_string())))
        .collect();
    Ok((store, found))
}

/// The publication and slot of one shard (unsharded: of the table).
async fn init_shard(s: &Settings, sql: &Client, shared: &mut Shared<'_>) -> Result<(), InitError> {
    let user = quote_ident(&s.pg.user);
    let table = s.table();
    if preflight::publication_exists(sql, &s.publication).await? {
        verify_existing_publication(s, sql).await?;
    } else {
        create_publication(s, sql, &table, &user).await?;
        say!("ok  publication {} (created)", s.publication);
    }
    let failover = shared.replication(s).await?.failover;
    // An unfinished back-fill is resumed by the same `--backfill`, and refused otherwise.
    let resume = unfinished_backfill(s, shared).await?;
    let slot_state = preflight::slot_state(sql, &s.slot).await?;
    if let (Some(state), Some(existing)) = (resume.clone(), &slot_state) {
        // Created by the back-fill and never streamed from (`run` refuses): kept, so
        // that what was committed after it is streamed, whatever the condition says now.
        return resume_backfill(s, sql, shared, state, existing).await;
    }
    // The slot is new over a history (recreated, or over rows): its record starts afresh.
    let mut renew = false;
    let mut baseline = None;
    let position = match slot_state {
        Some(state) => {
            if let Some(condition) = shared.flags.backfill.clone() {
                backfill_over_existing_slot(s, shared, &condition).await?;
            }
            // The same rule `run` applies: a slot of this name that run would refuse
            // (another database, another plugin, lost) is not "done".
            judge_slot(&state, &s.slot, &s.pg.dbname)
                .map_err(|e| InitError::Refused(e.to_string()))?;
            let switch = failover
                && !preflight::slot_failover(sql, &s.slot)
                    .await?
                    .is_some_and(|f| f.failover);
            if switch {
                let conn = &mut shared.replication(s).await?.conn;
                conn.set_slot_failover(&s.slot, true).await?;
                say!("ok  slot {} (exists; switched to a failover slot)", s.slot);
            } else {
                say!("ok  slot {} (exists)", s.slot);
            }
            (state.confirmed_flush_lsn, None)
        }
        None => {
            // Read before creating: a slot that existed must not come back silently.
            let history = shared.history(s).await?;
            let relayed = s
                .relay_table
                .then_some((s.table_schema.as_str(), s.table_name.as_str()));
            let rows = outbox_rows(sql, relayed)
                .await
                .map_err(|e| InitError::Refused(e.to_string()))?;
            let topic = s.progress_topic.as_deref().unwrap_or("");
            let mut consent = shared.flags.consent;
            // Resuming: the first attempt was allowed, and its slot is the one missing.
            if let Some(state) = &resume {
                consent.recreate_lost_slot |= state.recreate_lost_slot;
            }
            let creation =
                judge_missing_slot(&s.slot, &table, topic, history.judged(), rows, consent)
                    .map_err(|e| InitError::Refused(e.to_string()))?;
            // Before the slot: once it exists, its position says nothing about these rows,
            // and prune must already know (a back-fill publishes its rows itself).
            // Told to recreate it, and no record names its time (deleted, unreadable, under
            // another name): every row may be owed.
            let rows = match &creation {
                Creation::Recreate(old) => Some(old.republish_text()),
                Creation::OverRows if consent.recreate_lost_slot => Some(republish_text(None)),
                _ => None,
            };
            if let (Some(rows), None) = (rows, &shared.flags.backfill) {
                let why = format!(
                    "replication slot {} was lost and created again by `outboxd init --recreate-lost-slot`",
                    s.slot
                );
                record_owed(s, shared, RepublishOwed::new(why, rows)).await?;
            }
            // What the record's look must still match once the slot is made (and
            // back-filled): the slot decodes with the publication of each row's time.
            let before = match records_kept(s) {
                true => settled_look(s, sql, shared.pg).await?,
                false => None,
            };
            baseline = before.clone();
            let created = match shared.flags.backfill.clone() {
                Some(condition) => {
                    let mut state = resume.unwrap_or_else(|| BackfillState {
                        condition,
                        recreate_lost_slot: consent.recreate_lost_slot,
                        ..BackfillState::default()
                    });
                    // A first attempt's slot is gone: this one is new, and so is its look.
                    state.publication = before;
                    create_and_backfill(s, sql, shared, failover, state).await?
                }
                None => {
                    let Replication { conn, .. } = shared.replication(s).await?;
                    // Told to create it over rows: no look at what it skips.
                    let check = (s.relay_table && creation == Creation::FirstStart)
                        .then_some((s.table_schema.as_str(), s.table_name.as_str()));
                    create_checked(conn, sql, &s.slot, failover, check)
                        .await
                        .map_err(|e| InitError::Refused(e.to_string()))?
                }
            };
            match &creation {
                Creation::FirstStart => {}
                Creation::Recreate(old) if shared.flags.backfill.is_some() => say!(
                    "warn slot {} existed (last confirmed {}): rows committed since then that the back-fill's condition did not select are not relayed (docs/operations.md, \"A lost slot: re-publishing\"). {EMITTED_LOST_TEXT}",
                    s.slot,
                    old.confirmed_lsn(),
                ),
                Creation::Recreate(old) => say!(
                    "warn slot {} existed (last confirmed {}): rows committed since then are not relayed; re-publish {} (docs/operations.md, \"A lost slot: re-publishing\"). {EMITTED_LOST_TEXT}",
                    s.slot,
                    old.confirmed_lsn(),
                    old.republish_text()
                ),
                Creation::OverRows if shared.flags.backfill.is_some() => say!(
                    "ok  slot {}: rows already in {table} that the back-fill's condition did not select are not relayed",
                    s.slot
                ),
                Creation::OverRows => say!(
                    "warn slot {}: rows already in {table} are not relayed ({})",
                    s.slot,
                    if consent.recreate_lost_slot {
                        "--recreate-lost-slot: re-publish those not in Kafka"
                    } else {
                        "--skip-existing-rows"
                    }
                ),
            }
            say!(
                "ok  slot {} (created at {}{}; events committed from here on are relayed)",
                s.slot,
                created.consistent_point,
                if failover { ", failover" } else { "" }
            );
            if creation != Creation::FirstStart {
                renew = true;
            }
            (Some(created.consistent_point), Some(created.since))
        }
    };
    record_cluster(s, sql, shared, position, renew, baseline).await?;
    Ok(())
}

/// Resumes the unfinished back-fill over the slot its first attempt created: the rows
/// still owed are read in a fresh snapshot, and the record is written as that attempt
/// would have (the slot is new over whatever history the topic had).
async fn resume_backfill(
    s: &Settings,
    sql: &Client,
    shared: &mut Shared<'_>,
    state: BackfillState,
    existing: &preflight::SlotState,
) -> Result<(), InitError> {
    let resume = resume_command(&state);
    let now = existing.confirmed_flush_lsn;
    if let (Some(at), Some(now)) = (state.consistent_point, now) {
        if at != now {
            return Err(InitError::Refused(format!(
                "replication slot {} moved from {at} to {now} while its back-fill was unfinished: something streamed from it. Rows the back-fill had not published yet may be skipped: re-publish them by hand, then drop the slot (SELECT pg_drop_replication_slot('{}')) and run `{resume}` again",
                s.slot, s.slot,
            )));
        }
    }
    // Lost or otherwise unusable: only `--recreate-lost-slot` makes a new one.
    judge_slot(existing, &s.slot, &s.pg.dbname).map_err(|e| {
        InitError::Refused(format!(
            "{e}. Its back-fill was unfinished: drop the slot (SELECT pg_drop_replication_slot('{}')) and run `outboxd init --recreate-lost-slot --backfill ...` with the same condition",
            s.slot
        ))
    })?;
    let Some(position) = now else {
        return Err(InitError::Refused(format!(
            "replication slot {} has no confirmed position: it is not a logical slot this back-fill created. Drop it (SELECT pg_drop_replication_slot('{}')) and run `{resume}` again",
            s.slot, s.slot
        )));
    };
    say!(
        "ok  slot {} (kept: resuming its back-fill, {} rows published before it stopped)",
        s.slot,
        state.published
    );
    let since = state.slot_created_at;
    let ready = prepare_backfill(s, sql, shared, &state).await?;
    let snapshot = SlotSnapshot {
        exported: None,
        consistent_point: position,
        // Back-filled records' commit time: any time after the slot's creation bounds
        // the rows the first attempt's snapshot saw.
        created_at: match since {
            Some(t) => t,
            None => preflight::server_clock(sql).await?,
        },
    };
    let baseline = state.publication.clone();
    publish_backfill(s, sql, &ready, &snapshot, state).await?;
    record_cluster(s, sql, shared, (Some(position), since), true, baseline).await
}

/// The slot's unfinished back-fill, if the progress topic holds one: `Ok(Some)` when this
/// `init` resumes it (the same `--backfill` condition), refused when it would not.
async fn unfinished_backfill(
    s: &Settings,
    shared: &mut Shared<'_>,
) -> Result<Option<BackfillState>, InitError> {
    let wanted = shared.flags.backfill.clone();
    let history = shared.history(s).await?;
    let records = match (&history, &wanted) {
        (InitHistory::Read(records), _) => records,
        (_, None) => return Ok(None),
        (InitHistory::Unreadable(why) | InitHistory::NotKept(why), Some(_)) => {
            return Err(InitError::Refused(format!(
                "--backfill keeps its progress in the progress topic, which cannot be used ({why}): set OUTBOXD_PROGRESS_TOPIC and OUTBOXD_KAFKA_BOOTSTRAP_SERVERS, make Kafka reachable, and run the same `outboxd init --backfill ...` again"
            )))
        }
    };
    let Some(state) = records.backfill.as_ref().filter(|b| !b.done) else {
        return Ok(None);
    };
    if wanted.as_deref() == Some(state.condition.as_str()) {
        return Ok(Some(state.clone()));
    }
    let topic = s.progress_topic.as_deref().unwrap_or("");
    let identity = match &shared.records {
        Some(Records { system, .. }) => super::slot_identity(s, &system.system_id),
        None => return Ok(None),
    };
    refuse_unfinished_backfill(records, topic, &identity)
        .map_err(|e| InitError::Refused(e.to_string()))?;
    Ok(None)
}

/// `--backfill` on a slot that exists: fine once its back-fill finished with this
/// condition (init is idempotent); otherwise the slot already streams what was committed
/// since it was created, and the rows before it were never in a snapshot of it.
async fn backfill_over_existing_slot(
    s: &Settings,
    shared: &mut Shared<'_>,
    condition: &str,
) -> Result<(), InitError> {
    if let InitHistory::Read(records) = shared.history(s).await? {
        if let Some(done) = records
            .backfill
            .as_ref()
            .filter(|b| b.done && b.condition == condition)
        {
            say!(
                "ok  backfill (finished: {} rows published, {} of them dead-lettered)",
                done.published,
                done.dead_lettered
            );
            return Ok(());
        }
    }
    Err(InitError::Refused(format!(
        "replication slot {} exists, so --backfill has no snapshot to read the rows in: it publishes rows only from the snapshot of a slot it creates. Rows committed since the slot was created are streamed from it; re-publish older ones by hand (docs/operations.md, \"A lost slot: re-publishing\"), or drop the slot before anything streamed from it (SELECT pg_drop_replication_slot('{}')) and run `outboxd init --recreate-lost-slot --backfill ...` with the same condition (the progress record says the slot existed, so plain `init` would refuse to create it again)",
        s.slot, s.slot
    )))
}

/// Creates the slot exporting its snapshot and publishes the back-fill's rows in it,
/// recording `state` before the slot exists (so `run` refuses a slot whose back-fill a
/// kill interrupted) and after every acknowledged batch.
async fn create_and_backfill(
    s: &Settings,
    sql: &Client,
    shared: &mut Shared<'_>,
    failover: bool,
    state: BackfillState,
) -> Result<outboxd_relay::pipeline::CreatedSlot, InitError> {
    let ready = prepare_backfill(s, sql, shared, &state).await?;
    let since = preflight::server_clock(sql).await?;
    let Replication { conn, .. } = shared.replication(s).await?;
    let created = conn.create_logical_slot_exported(&s.slot, failover).await?;
    let Some(exported) = created.snapshot_name.as_deref() else {
        return Err(InitError::Refused(format!(
            "the server exported no snapshot when creating slot {}; drop it (SELECT pg_drop_replication_slot('{}')) and run `{}` again",
            s.slot, s.slot, resume_command(&state)
        )));
    };
    let snapshot = SlotSnapshot {
        exported: Some(exported),
        consistent_point: created.consistent_point,
        created_at: since,
    };
    // The replication connection stays idle meanwhile: its next command ends the export.
    publish_backfill(s, sql, &ready, &snapshot, state).await?;
    Ok(outboxd_relay::pipeline::CreatedSlot {
        consistent_point: created.consistent_point,
        since,
    })
}

/// What a back-fill publishes with, once its condition parsed and its state is written.
struct ReadyBackfill {
    cfg: outboxd_relay::pipeline::RelayConfig,
    store: ProgressStore,
    identity: SlotIdentity,
}

async fn prepare_backfill(
    s: &Settings,
    sql: &Client,
    shared: &mut Shared<'_>,
    state: &BackfillState,
) -> Result<ReadyBackfill, InitError> {
    let cfg = wiring::relay_config(s).map_err(|e| InitError::Refused(e.to_string()))?;
    let table = cfg.rules.table.qualified_name();
    // A condition that does not parse fails here, before anything is created.
    sql.simple_query(&format!(
        "SELECT 1 FROM {table} t WHERE ({}) LIMIT 0",
        state.condition
    ))
    .await
    .map_err(|e| {
        InitError::Refused(format!(
            "the --backfill condition is not valid SQL for {table}: {}",
            pgrepl::error_chain(&e)
        ))
    })?;
    let (store, identity) = match &shared.records {
        Some(Records {
            system,
            read: Ok((store, _)),
        }) => (store.clone(), super::slot_identity(s, &system.system_id)),
        _ => {
            return Err(InitError::Refused(
                "--backfill keeps its progress in the progress topic, which could not be read: make Kafka reachable and run the same `outboxd init --backfill ...` again".into(),
            ))
        }
    };
    let resume = resume_command(state);
    let kafka = |e: &dyn std::fmt::Display| {
        InitError::Refused(format!(
            "writing the back-fill's state to the progress topic failed ({e}); nothing was created. Run `{resume}` again once Kafka answers"
        ))
    };
    match tokio::time::timeout(KAFKA_WAIT, store.write_backfill(&identity, state)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(kafka(&e)),
        Err(_) => return Err(kafka(&format!("no acknowledgement within {KAFKA_WAIT:?}"))),
    }
    Ok(ReadyBackfill {
        cfg,
        store,
        identity,
    })
}

/// Publishes the rows `state` still owes for `slot`, saying how far it got.
async fn publish_backfill(
    s: &Settings,
    sql: &Client,
    ready: &ReadyBackfill,
    slot: &SlotSnapshot<'_>,
    mut state: BackfillState,
) -> Result<(), InitError> {
    let table = ready.cfg.rules.table.qualified_name();
    let resume = resume_command(&state);
    say!(
        "ok  backfill: publishing the rows of {table} where {} ({} of slot {} at {}; {} published before)",
        state.condition,
        match slot.exported {
            Some(_) => "from the snapshot",
            None => "resumed over the slot, from a new snapshot",
        },
        s.slot,
        slot.consistent_point,
        state.published
    );
    let started = std::time::Instant::now();
    let backfill = Backfill {
        cfg: &ready.cfg,
        sql,
        store: &ready.store,
        identity: &ready.identity,
    };
    let mut progress = |b: &BackfillState| {
        say!(
            "ok  backfill: {} rows published ({} dead-lettered), up to {} {}",
            b.published,
            b.dead_lettered,
            outboxd_relay::pipeline::ORDER_COLUMN,
            b.after.as_ref().map_or("", |(at, _)| at.as_str())
        );
    };
    backfill
        .run(slot, &mut state, &mut progress)
        .await
        .map_err(|e| {
            InitError::Refused(format!(
                "{e}. Nothing is streamed from the slot until the back-fill finishes; it resumes where it stopped with `{resume}`"
            ))
        })?;
    say!(
        "ok  backfill done: {} rows published ({} dead-lettered) in {:.1} s; `outboxd run` streams what was committed after them",
        state.published,
        state.dead_lettered,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// How long `init` waits for Kafka, per step.
const KAFKA_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
