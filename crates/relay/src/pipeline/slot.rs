//! The slot and publication as outboxd finds them at the start of each session, and a
//! missing slot created, when `slot_history`'s rule allows it.

use pgrepl::preflight::{self, PublicationCoverage, SlotState};
use pgrepl::{ConnectConfig, Lsn, ReplicationConnection};
use tokio_postgres::Client;

use outbox_core::slot_fate::{self, AtStart, SlotNow, SlotStop};
use outbox_core::TableSpec;

use super::config::RelayConfig;
use super::error::RelayError;
use super::slot_history::{judge_missing_slot, Consent, History};
use crate::kafka::{ProgressError, ProgressRecord, ProgressStore, SlotIdentity};

/// The slot as checked before START_REPLICATION.
#[derive(Debug, Clone, Copy)]
pub struct SlotStart {
    /// The slot's confirmed_flush_lsn when checked: only a fallback for the session's
    /// start, which is read again once the slot is ours (`confirmed_flush`), because
    /// another instance may advance it until then.
    pub confirmed_flush: Lsn,
    /// For a slot this process created: the server's clock just before (see
    /// `CreatedSlot::since`).
    pub since: Option<i64>,
    /// Another instance streamed from it when checked: this one stands by at the
    /// stream's start.
    pub held: bool,
}

/// A slot just created.
#[derive(Debug, Clone, Copy)]
pub struct CreatedSlot {
    /// Its initial `confirmed_flush_lsn`.
    pub consistent_point: Lsn,
    /// The server's clock read just before it was created (PostgreSQL's microseconds
    /// since 2000-01-01): nothing the slot decodes committed before it, so its first
    /// record names it as the time to re-publish from should the slot be lost before a
    /// transaction is confirmed.
    pub since: i64,
}

/// Checks the publication and the slot. `Ok(None)`: the slot does not exist and may be
/// created, if nothing says an earlier one was lost (the caller's job).
///
/// `seen_slot` is true once this process has streamed from the slot: a slot missing
/// after that was dropped under us, and recreating it would silently skip every event
/// committed in between, so it is a permanent error rather than a fresh start.
pub async fn prepare(
    sql: &Client,
    pg: &ConnectConfig,
    slot: &str,
    publication: &str,
    create_slot: bool,
    seen_slot: bool,
    table: Option<&TableSpec>,
) -> Result<Option<SlotStart>, RelayError> {
    // Checked first: a slot created before its publication cannot see it.
    if !preflight::publication_exists(sql, publication).await? {
        return Err(RelayError::PublicationMissing {
            publication: publication.to_owned(),
        });
    }
    if let Some(table) = table {
        if let Some(warning) = verify_publication(sql, publication, table).await? {
            tracing::warn!(publication, "{warning}");
        }
    }
    let state = preflight::slot_state(sql, slot).await?;
    // Present: `judge_slot` looks at its type, plugin and database before its WAL.
    let now = match &state {
        None => SlotNow::Absent,
        Some(_) => SlotNow::Usable,
    };
    let state = match (slot_fate::at_start(now, seen_slot, create_slot), state) {
        (Err(stop), _) => return Err(stop_error(stop, slot)),
        (Ok(AtStart::Stream), Some(state)) => state,
        (Ok(_), _) => return Ok(None),
    };
    if let Some(warning) = judge_slot(&state, slot, &pg.dbname)? {
        tracing::warn!(slot, "{warning}");
    }
    Ok(Some(SlotStart {
        since: None,
        confirmed_flush: state.confirmed_flush_lsn.unwrap_or(Lsn::ZERO),
        held: state.active,
    }))
}

/// The one rule for "can outboxd stream from this existing slot", shared by `run` and
/// `outboxd check`.
pub fn judge_slot(
    state: &SlotState,
    slot: &str,
    dbname: &str,
) -> Result<Option<String>, RelayError> {
    let unusable = |problem: String| RelayError::SlotUnusable {
        slot: slot.to_owned(),
        problem,
    };
    if state.slot_type != "logical" {
        return Err(unusable(format!(
            "it is a {} slot; outboxd needs a logical slot with the pgoutput plugin",
            state.slot_type
        )));
    }
    if state.plugin.as_deref() != Some("pgoutput") {
        return Err(unusable(format!(
            "it uses the output plugin {:?}; drop it and let outboxd create one with pgoutput",
            state.plugin.as_deref().unwrap_or("")
        )));
    }
    if let Some(db) = state.database.as_deref() {
        if db != dbname {
            return Err(unusable(format!(
                "it belongs to database {db:?}, not {dbname:?}; set PGDATABASE or OUTBOXD_SLOT"
            )));
        }
    }
    match state.wal_status.as_deref() {
        Some("lost") => match slot_fate::at_start(SlotNow::Invalidated, false, false) {
            Err(stop) => Err(stop_error(stop, slot)),
            Ok(_) => Ok(None),
        },
        Some("unreserved") => Ok(Some(format!(
            "slot {slot} has wal_status = unreserved: WAL it needs is past \
             max_slot_wal_keep_size and will be removed at the next checkpoint unless \
             outboxd catches up (safe_wal_size {})",
            state
                .safe_wal_size
                .map_or_else(|| "unknown".to_owned(), |b| format!("{b} bytes"))
        ))),
        _ => Ok(None),
    }
}

/// `" (committed since …)"`: the session's claim's time, when the rules know it.
fn since_text(since: Option<i64>) -> String {
    since.map_or_else(String::new, |t| {
        format!(" (committed since {})", crate::kafka::pg_time_text(t))
    })
}

/// The relay's error for a stop the slot's rules (`outbox_core::slot_fate`) decided.
pub fn stop_error(stop: SlotStop, slot: &str) -> RelayError {
    let slot = slot.to_owned();
    match stop {
        SlotStop::Dropped { since } => RelayError::SlotDropped {
            slot,
            since: since_text(since),
        },
        SlotStop::Missing => RelayError::SlotMissing { slot },
        SlotStop::Invalidated { since } => RelayError::SlotInvalidated {
            slot,
            reason: "wal_status = lost".into(),
            since: since_text(since),
        },
    }
}

/// Whether the slot is a failover slot (PG17+), which standbys with
/// `sync_replication_slots` copy so that it survives a promotion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverSlot {
    /// On when the server has failover slots (PostgreSQL 17+).
    Auto,
    /// Always; a server without failover slots is a configuration error.
    On,
    /// Never set by outboxd (an existing slot's flag is left as it is).
    Off,
}

impl FailoverSlot {
    /// Whether outboxd wants the slot to be a failover slot on a server that does or does
    /// not support them.
    pub fn wanted(self, supported: bool) -> Result<bool, RelayError> {
        match (self, supported) {
            (FailoverSlot::Auto, s) => Ok(s),
            (FailoverSlot::On, true) => Ok(true),
            (FailoverSlot::On, false) => Err(RelayError::FailoverUnsupported),
            (FailoverSlot::Off, _) => Ok(false),
        }
    }
}

/// Creates the slot; the caller has made sure no earlier slot of this name was lost, and
/// that `table` had no rows (see [`create_checked`]).
pub async fn create(
    pg: &ConnectConfig,
    sql: &Client,
    slot: &str,
    failover: FailoverSlot,
    table: Option<&TableSpec>,
) -> Result<SlotStart, RelayError> {
    let mut conn = ReplicationConnection::connect(pg).await?;
    let failover = failover.wanted(conn.supports_failover_slots().await?)?;
    let table = table.map(|t| (t.schema.as_str(), t.table.as_str()));
    let created = create_checked(&mut conn, sql, slot, failover, table).await?;
    tracing::warn!(
        slot,
        consistent_point = %created.consistent_point,
        failover,
        "created replication slot; events committed before this point are not relayed"
    );
    Ok(SlotStart {
        confirmed_flush: created.consistent_point,
        since: Some(created.since),
        held: false,
    })
}

/// What the outbox table `(schema, name)` holds, for the rule on creating a slot
/// (`slot_history`); `None`, no table relayed: emitted messages leave nothing behind to
/// count, and the record alone decides. Bounded: an empty but bloated table makes EXISTS
/// read every page, and a look that takes too long cannot tell.
pub async fn outbox_rows(
    sql: &Client,
    table: Option<(&str, &str)>,
) -> Result<preflight::TableRows, RelayError> {
    let Some((schema, name)) = table else {
        return Ok(preflight::TableRows::Empty);
    };
    let rows = preflight::table_rows(sql, schema, name);
    match tokio::time::timeout(std::time::Duration::from_secs(30), rows).await {
        Ok(rows) => Ok(rows?),
        Err(_) => Ok(preflight::TableRows::Unknown),
    }
}

/// Creates the slot, and with `table` (found without rows just before) makes sure no row
/// was committed in it before the slot's consistent point: creating a slot waits for the
/// transactions running at its start, and rows committed meanwhile are never decoded.
/// The snapshot of that point is exported and read; rows in it drop the slot again and
/// refuse. A role that may not read the table cannot look (the check before stands).
pub async fn create_checked(
    conn: &mut ReplicationConnection,
    sql: &Client,
    slot: &str,
    failover: bool,
    table: Option<(&str, &str)>,
) -> Result<CreatedSlot, RelayError> {
    let since = preflight::server_clock(sql).await?;
    let made = |c: pgrepl::SlotCreated| CreatedSlot {
        consistent_point: c.consistent_point,
        since,
    };
    let Some((schema, name)) = table else {
        return Ok(made(
            conn.create_logical_slot_with(slot, false, failover).await?,
        ));
    };
    let created = conn.create_logical_slot_exported(slot, failover).await?;
    let Some(snapshot) = &created.snapshot_name else {
        return Ok(made(created));
    };
    let rows = match preflight::rows_in_snapshot(sql, snapshot, schema, name).await {
        Ok(rows) => rows,
        Err(e) => {
            // Unchecked, the slot would be taken as it is by the next session, and rows
            // committed while it was made never decoded: it goes, the next one looks.
            if let Err(dropping) = conn.drop_slot(slot, false).await {
                tracing::error!(
                    slot,
                    "dropping a slot whose snapshot could not be read: {dropping}"
                );
            }
            return Err(e.into());
        }
    };
    if rows == Some(true) {
        conn.drop_slot(slot, false).await?;
        return Err(RelayError::RowsBeforeSlot {
            slot: slot.to_owned(),
            table: format!("{schema}.{name}"),
            rows: "had rows committed while the slot was being created (it waits for the transactions running when it starts)",
            history: "; the slot was dropped again".to_owned(),
        });
    }
    Ok(made(created))
}

/// Makes an existing slot a failover slot when wanted and it is not one yet, before the
/// session acquires it for streaming (ALTER needs the slot free).
pub async fn ensure_failover(
    sql: &Client,
    conn: &mut ReplicationConnection,
    slot: &str,
    mode: FailoverSlot,
) -> Result<(), RelayError> {
    if !mode.wanted(conn.supports_failover_slots().await?)? {
        return Ok(());
    }
    match preflight::slot_failover(sql, slot).await? {
        Some(state) if !state.failover => {
            conn.set_slot_failover(slot, true).await?;
            tracing::warn!(
                slot,
                "replication slot switched to a failover slot (ALTER_REPLICATION_SLOT … (FAILOVER true)); standbys with sync_replication_slots = on now keep a copy"
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Whether the slot would survive a promotion: a failover slot (PG17+) on a primary whose
/// `synchronized_standby_slots` names at least one physical slot, each connected and
/// valid, so no consumer gets changes a promoted standby lacks.
pub async fn failover_ready(sql: &Client, slot: &str) -> Result<bool, RelayError> {
    if preflight::server_version_num(sql).await? < pgrepl::FAILOVER_SLOTS_VERSION {
        return Ok(false);
    }
    let ours = match preflight::slot_failover(sql, slot).await? {
        Some(s) => s.failover && !s.temporary && s.invalidation_reason.is_none(),
        None => false,
    };
    if !ours {
        return Ok(false);
    }
    let names = preflight::synchronized_standby_slots(sql).await?;
    if names.is_empty() {
        return Ok(false);
    }
    Ok(preflight::standby_slots(sql, &names)
        .await?
        .iter()
        .all(|s| {
            s.slot_type.as_deref() == Some("physical")
                && s.active
                && s.invalidation_reason.is_none()
        }))
}

/// The slot's `confirmed_flush_lsn` now. Read once START_REPLICATION succeeded, when the
/// slot is held by our walsender and only our status updates can move it; `None` if the
/// slot has none (or is gone).
pub async fn confirmed_flush(sql: &Client, slot: &str) -> Result<Option<Lsn>, RelayError> {
    Ok(preflight::slot_state(sql, slot)
        .await?
        .and_then(|s| s.confirmed_flush_lsn))
}

/// The pid of the walsender holding `slot` now; `None` when none does (or no slot).
pub async fn holder(sql: &Client, slot: &str) -> Result<Option<i32>, RelayError> {
    Ok(preflight::slot_state(sql, slot)
        .await?
        .and_then(|s| s.active_pid))
}

/// Slot health as the metrics report it, polled over SQL.
#[derive(Debug, Clone)]
pub struct SlotStats {
    pub current_wal: Lsn,
    pub retained_bytes: u64,
    pub lag_bytes: u64,
    pub wal_status: Option<String>,
    pub failover_ready: bool,
    /// Bytes of WAL that may still be written before the slot is lost (negative: past the
    /// cap already); `None` without max_slot_wal_keep_size.
    pub safe_wal_size: Option<i64>,
}

/// `None` when the slot no longer exists.
pub async fn stats(sql: &Client, slot: &str) -> Result<Option<SlotStats>, RelayError> {
    let current_wal = preflight::current_wal_lsn(sql).await?;
    let Some(state) = preflight::slot_state(sql, slot).await? else {
        return Ok(None);
    };
    let behind = |lsn: Option<Lsn>| lsn.map_or(0, |l| current_wal.0.saturating_sub(l.0));
    Ok(Some(SlotStats {
        current_wal,
        retained_bytes: behind(state.restart_lsn),
        lag_bytes: behind(state.confirmed_flush_lsn),
        wal_status: state.wal_status,
        safe_wal_size: state.safe_wal_size,
        failover_ready: failover_ready(sql, slot).await?,
    }))
}

/// Checks that `publication` delivers the inserts of `table` to this relay, and how.
/// `Ok(Some(warning))`: published, but in a way that deserves the operator's attention.
pub async fn verify_publication(
    sql: &Client,
    publication: &str,
    table: &TableSpec,
) -> Result<Option<String>, RelayError> {
    let coverage = preflight::publication_coverage(sql, publication, &table.schema, &table.table)
        .await?
        .ok_or_else(|| RelayError::PublicationMissing {
            publication: publication.to_owned(),
        })?;
    let candidates = table_candidates(sql, &coverage, &table.columns.aggregate_id).await?;
    judge_publication(&coverage, publication, &table.qualified_name(), &candidates).map_err(
        |problem| RelayError::TableNotPublished {
            publication: publication.to_owned(),
            table: table.qualified_name(),
            problem,
        },
    )
}

/// The tables that may be the outbox when `table` is missing (`c.table_kind` is `None`):
/// those with its aggregate id column. Empty when the table exists.
pub async fn table_candidates(
    sql: &Client,
    c: &PublicationCoverage,
    aggregate_id_column: &str,
) -> Result<Vec<String>, RelayError> {
    if c.table_kind.is_some() {
        return Ok(Vec::new());
    }
    Ok(preflight::tables_with_column(sql, aggregate_id_column).await?)
}

/// The configured table does not exist. A wrong name is the likelier cause once there
/// are outbox rows somewhere, and `outboxd init` would then create a second, empty
/// table under the wrong name: so the fix for a wrong name comes first, and `init` only
/// for a setup that has no outbox table yet.
pub fn missing_table(table: &str, candidates: &[String]) -> String {
    let found = match candidates {
        [] => String::new(),
        [one] => format!(" A table here has the outbox's aggregate id column: {one}."),
        many => format!(
            " Tables here with the outbox's aggregate id column: {}.",
            many.join(", ")
        ),
    };
    let example = candidates.first().map_or("schema.table", String::as_str);
    format!(
        "the table {table} does not exist in this database (OUTBOXD_TABLE; a name without a \
         schema is in public).{found} If the outbox table exists under another name or \
         schema, set OUTBOXD_TABLE={example} (and OUTBOXD_COLUMN_* if its columns are named \
         differently). Only for a new setup that has no outbox table yet: `outboxd init` \
         creates an empty {table}. Or set OUTBOXD_RELAY_TABLE=false to relay only emitted \
         logical messages"
    )
}

/// The refusal of foreign-table partitions, with the statements that replace each by a
/// plain one and insert its rows into the outbox again (published then).
fn foreign_partitions(foreign: &[preflight::ForeignPartition], table: &str) -> String {
    let names: Vec<&str> = foreign.iter().map(|f| f.name.as_str()).collect();
    let fix: Vec<String> = foreign
        .iter()
        .map(|f| {
            format!(
                "BEGIN; ALTER TABLE {parent} DETACH PARTITION {name}; \
                 CREATE TABLE {local} PARTITION OF {parent} {bound}; \
                 INSERT INTO {table} ({columns}) OVERRIDING SYSTEM VALUE \
                 SELECT {columns} FROM {name}; COMMIT;",
                parent = f.parent,
                name = f.name,
                local = f.local,
                bound = f.bound,
                columns = f.columns,
            )
        })
        .collect();
    format!(
        "{} (a partition of the outbox table) is a foreign table: rows routed to it are \
         stored by another server and never written to this server's WAL, so outboxd cannot \
         see them, and those inserted since it was attached were never relayed. Replace it \
         with a plain partition and insert what it holds into {table} again, which publishes \
         it (consumers dedup by id; docs/operations.md, \"A foreign-table outbox \
         partition\"): {}",
        names.join(", "),
        fix.join(" ")
    )
}

/// The one rule for "does this publication send the outbox's inserts", shared by
/// `outboxd check` and `run`. `Err` is the problem with its fix.
/// `candidates`: [`table_candidates`], for a table that does not exist.
pub fn judge_publication(
    c: &PublicationCoverage,
    publication: &str,
    table: &str,
    candidates: &[String],
) -> Result<Option<String>, String> {
    // The fixes below are SQL to run as printed.
    let publication = &outbox_core::pgtype::quote_ident(publication);
    let Some(kind) = c.table_kind.as_deref() else {
        return Err(missing_table(table, candidates));
    };
    if kind == "f" {
        // In this order: rows inserted before the table is published are never sent.
        return Err(format!(
            "{table} is a foreign table: rows inserted into it are stored by another server \
             and never written to this server's WAL, so outboxd cannot see them. The outbox \
             (or a shard of it) must be a plain or partitioned table here: rename the foreign \
             table aside, create a plain one under its name, publish it \
             (ALTER PUBLICATION {publication} ADD TABLE {table};), and only then insert the \
             rows the foreign table holds into it"
        ));
    }
    if !c.publishes_insert {
        return Err(format!(
            "publication {publication} does not publish inserts: \
             ALTER PUBLICATION {publication} SET (publish = 'insert')"
        ));
    }
    if c.row_filtered {
        return Err(format!(
            "publication {publication} has a row filter (WHERE) on {table}: the rows it \
             rejects would never be relayed. Publish every row: \
             ALTER PUBLICATION {publication} DROP TABLE {table}; \
             ALTER PUBLICATION {publication} ADD TABLE {table};"
        ));
    }
    if c.column_listed {
        return Err(format!(
            "publication {publication} has a column list on {table}: the other columns \
             (headers, for one) would be dropped from every event. Publish every column: \
             ALTER PUBLICATION {publication} DROP TABLE {table}; \
             ALTER PUBLICATION {publication} ADD TABLE {table};"
        ));
    }
    if let Some(children) = &c.inheritance_children {
        let children: Vec<&str> = children.lines().collect();
        return Err(format!(
            "{} inherit{} from {table} (CREATE TABLE ... INHERITS): a row inserted into an \
             inheritance child belongs to the child, which a publication of {table} does not \
             publish unless the child is published separately, and which outboxd would not \
             relay even then (its rows come named after the child). Insert outbox rows into \
             {table} itself, move any rows already in a child there in one statement, which \
             publishes them (WITH moved AS (DELETE FROM ONLY <child> RETURNING *) INSERT INTO \
             {table} SELECT * FROM moved;), then detach it: {}",
            children.join(", "),
            if children.len() == 1 { "s" } else { "" },
            children
                .iter()
                .map(|c| format!("ALTER TABLE {c} NO INHERIT {table};"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    let partitioned = kind == "p";
    if c.table_listed {
        if !c.foreign.is_empty() {
            // Judged once the publication covers the table, as the unlogged ones below:
            // the fix's re-inserts must be published.
            return Err(foreign_partitions(&c.foreign, table));
        }
        if let Some(unlogged) = &c.unlogged {
            // Judged once the publication covers the table: the re-inserts of the printed fix
            // must be published, so a publication fix (printed first) comes before it.
            let fix: Vec<String> = unlogged
                .lines()
                .map(|t| {
                    format!(
                        "ALTER TABLE {t} SET LOGGED; \
                         WITH moved AS (DELETE FROM {t} RETURNING *) \
                         INSERT INTO {t} OVERRIDING SYSTEM VALUE SELECT * FROM moved;"
                    )
                })
                .collect();
            return Err(format!(
                "{} (the outbox table or a partition of it) is UNLOGGED: its rows are \
                 never written to the WAL, so outboxd cannot see them, and rows inserted there \
                 since it became unlogged were never relayed. Make it logged and re-publish what \
                 it holds, before any PostgreSQL restart or failover (crash recovery empties an \
                 unlogged table and a standby has none of its rows; rows already deleted cannot \
                 be recovered), deleted and inserted again in one statement with their own ids \
                 (consumers dedup what they had; docs/operations.md, \"An UNLOGGED outbox \
                 partition\"): {}",
                unlogged.lines().collect::<Vec<_>>().join(", "),
                fix.join(" ")
            ));
        }
        return Ok(None);
    }
    if partitioned && c.partitions_listed > 0 && c.leaves_unlisted > 0 {
        // Some partitions listed one by one, not all: the others' rows are never sent.
        return Err(format!(
            "publication {publication} lists some partitions of {table} but not {} of them, \
             so their rows would never be relayed: publish the partitioned table itself, \
             ALTER PUBLICATION {publication} ADD TABLE {table}; with \
             ALTER PUBLICATION {publication} SET (publish_via_partition_root = true)",
            c.leaves_unlisted
        ));
    }
    if partitioned && c.partitions_listed > 0 {
        // pubviaroot is off: the server names each row after its partition, with the
        // catalog as it was when the row was written. The relay can only ask the catalog
        // as it is now, where a partition detached or dropped in between is a stranger:
        // its rows would be ignored and the slot confirmed past them.
        return Err(format!(
            "{table} is partitioned and publication {publication} has \
             publish_via_partition_root = false, so the server names each partition's rows \
             after the partition, and rows of a partition detached or dropped before outboxd \
             relays them could not be told apart from another table's: \
             ALTER PUBLICATION {publication} SET (publish_via_partition_root = true). Rows \
             committed before that still arrive under their partitions' names; outboxd relays \
             them while those partitions are attached"
        ));
    }
    let hint = if partitioned && !c.via_partition_root {
        format!(" WITH publish_via_partition_root: ALTER PUBLICATION {publication} SET (publish_via_partition_root = true);")
    } else {
        String::new()
    };
    Err(format!(
        "publication {publication} does not include {table}, so none of its rows would be \
         relayed: ALTER PUBLICATION {publication} ADD TABLE {table};{hint} \
         (or set OUTBOXD_RELAY_TABLE=false to relay only emitted logical messages)"
    ))
}

/// Creates the missing slot, but only once the progress record and the table show that no
/// earlier slot of this name existed (`slot_history`), and only after recording that this
/// one will: a slot must never exist without a record, or its loss could go unnoticed.
pub(super) async fn create_if_new(
    cfg: &RelayConfig,
    pg: &ConnectConfig,
    sql: &tokio_postgres::Client,
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
    match progress.check_durable().await {
        Err(e @ ProgressError::NotDurable { .. }) => return Err(RelayError::ProgressNotDurable(e)),
        other => other.map_err(unknown)?,
    }
    let records = progress.read_slot(identity).await.map_err(unknown)?;
    super::claim::refuse_other_cluster(&records, progress, identity)?;
    super::backfill::refuse_unfinished_backfill(&records, progress.topic(), identity)?;
    let relayed = cfg.rules.relay_table.then_some((
        cfg.rules.table.schema.as_str(),
        cfg.rules.table.table.as_str(),
    ));
    let rows = outbox_rows(sql, relayed).await?;
    let judged = judge_missing_slot(
        &cfg.slot,
        &cfg.rules.table.qualified_name(),
        progress.topic(),
        History::Read(&records),
        rows,
        Consent::default(),
    );
    if let Err(refused) = judged {
        // Another replica may have created it since this one looked (two starting at
        // once): that one streams, this one stands by.
        if preflight::slot_state(sql, &cfg.slot).await?.is_some() {
            return Err(RelayError::SlotCreatedMeanwhile {
                slot: cfg.slot.clone(),
            });
        }
        return Err(refused);
    }
    if let Some(record) = records.creating.as_ref().or(records.ours.as_ref()) {
        tracing::info!(
            slot = %cfg.slot,
            recorded_at = %record.recorded_at_text(),
            "an earlier attempt to create the slot did not finish (no record of the slot after it); creating it now"
        );
    }
    progress
        .write_intent(
            identity,
            &ProgressRecord::before_creation(timeline, position),
        )
        .await
        .map_err(unknown)?;
    let start = create(
        pg,
        sql,
        &cfg.slot,
        cfg.failover_slot,
        cfg.rules.relay_table.then_some(&cfg.rules.table),
    )
    .await?;
    // At once, not at the first tick: from here on a missing slot is a lost one.
    // With the publication as it is now: the first look a later start compares with, so
    // a process that stops before its first record leaves one to compare with.
    let mut record = ProgressRecord::slot_created(timeline, start.confirmed_flush, start.since);
    if let Some(t) = cfg.rules.relay_table.then_some(&cfg.rules.table) {
        record.publication = super::session::publication::look(
            sql,
            (pg, &mut None),
            &cfg.publication,
            Some((t.schema.as_str(), t.table.as_str())),
        )
        .await
        // A look the synchronous standbys did not settle is no baseline: none is
        // recorded, and the start's look decides (`RelayError::StandbysUnsettled`).
        .map(|l| l.seen.filter(|_| l.settled))?;
    }
    progress
        .write_and_wait(identity, &record)
        .await
        .map_err(unknown)?;
    Ok(start)
}

#[cfg(test)]
#[path = "slot_tests.rs"]
mod tests;
