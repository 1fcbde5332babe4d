//! `outboxd prune`: deletes relayed outbox rows older than a retention, in small batches.
//!
//! Safe by construction, not by a time margin. Each batch runs in a REPEATABLE READ
//! transaction whose first statement reads `pg_current_wal_insert_lsn()` (L): a transaction
//! becomes visible only after its commit record is in the WAL, so every row the snapshot
//! sees was committed by a transaction that ended before L. The batch then waits until the
//! slot's `confirmed_flush_lsn` reaches L, which outboxd sends only once Kafka has every
//! event of every transaction before it, and deletes only rows of its snapshot. A row
//! committed later, or still in flight, is invisible to the batch and stays. A slot that
//! does not reach L within the wait (the relay stopped, Kafka down, a backlog) deletes
//! nothing.

use std::time::{Duration, Instant};

use outboxd_relay::kafka::{ProgressStore, SlotIdentity, SlotRecords};
use outboxd_relay::pipeline::refuse_unfinished_backfill;
use pgrepl::preflight;

use super::{say, EXIT_CONFIG, EXIT_OK, EXIT_POSTGRES};
use crate::config::Settings;
use crate::wiring;

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete rows whose created_at is older than this (e.g. 7d, 12h, 30m)
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    older_than: Duration,
    /// Rows deleted per transaction
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// How long each batch waits for the slot to confirm past its snapshot (e.g. 60s)
    #[arg(long, value_name = "AGE", default_value = "60s", value_parser = parse_age)]
    wait: Duration,
}

/// `<n>s`, `<n>m`, `<n>h` or `<n>d`.
fn parse_age(text: &str) -> Result<Duration, String> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(0));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a whole number and a unit, e.g. 7d, 12h, 30m, 60s"))?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(|| format!("{text:?}: a whole number and a unit, e.g. 7d, 12h, 30m, 60s"))?;
    Ok(Duration::from_secs(secs))
}

#[derive(Debug, thiserror::Error)]
enum PruneError {
    #[error(transparent)]
    Repl(#[from] pgrepl::ReplError),
    #[error(transparent)]
    Sql(#[from] tokio_postgres::Error),
    #[error("replication slot {0:?} does not exist: nothing can prove which rows were relayed, so none is deleted")]
    NoSlot(String),
    #[error("{0}; prune deletes nothing until then")]
    BackfillUnfinished(outboxd_relay::pipeline::RelayError),
    #[error("{why} ({at}): {rows} may not be in Kafka. {}", self.remedy().unwrap_or_default())]
    RepublishOwed {
        why: String,
        at: String,
        rows: String,
    },
    #[error("cannot read the progress record in {topic} ({reason}): {}", self.remedy().unwrap_or_default())]
    RecordUnread { topic: String, reason: String },
    #[error("replication slot {slot:?} did not confirm past {lsn} within {wait:?} (it is at {at}): {}", self.remedy().unwrap_or_default())]
    NotConfirmed {
        slot: String,
        lsn: pgoutput::Lsn,
        at: String,
        wait: Duration,
    },
}

impl PruneError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            PruneError::NotConfirmed { .. } => String::from(
                "rows newer than its position may not be in Kafka yet, so none was deleted in \
                this batch. Is outboxd running and caught up (`outboxd status`)? Run prune \
                again then, or with a longer --wait",
            ),
            PruneError::RepublishOwed { .. } => String::from(
                "The slot's position proves nothing about them, so prune deletes no row. \
                Re-publish them (docs/operations.md, \"A lost slot: re-publishing\", step 3), \
                then run `outboxd init --republish-done`, and prune again",
            ),
            PruneError::RecordUnread { .. } => String::from(
                "it says whether rows are owed a re-publish or a back-fill, which the slot's \
                position does not prove relayed, so prune deletes nothing. Run prune again once \
                it can be read (with OUTBOXD_PROGRESS_TOPIC empty no record is kept, and prune \
                does not look: then pause it by hand while rows are owed)",
            ),
            _ => return None,
        };
        Some(text)
    }
}

pub async fn prune(s: &Settings, args: &PruneArgs) -> i32 {
    if !s.relay_table {
        eprintln!("outboxd prune: OUTBOXD_RELAY_TABLE=false: there is no outbox table to prune");
        return EXIT_CONFIG;
    }
    let views = s.all_shards();
    // Every shard's record in one read of the topic, each judged before its table.
    let owed = match read_records(s, &views).await {
        Ok(owed) => owed,
        Err(e) => {
            eprintln!("outboxd prune failed after deleting 0 rows: {e}");
            return EXIT_POSTGRES;
        }
    };
    let mut total = 0u64;
    for (i, view) in views.iter().enumerate() {
        let refused = match &owed {
            Some((topic, read)) => refuse_owed_rows(topic, &read[i].0, &read[i].1),
            None => Ok(()),
        };
        let pruned = match refused {
            Ok(()) => prune_table(view, args).await,
            Err(e) => Err(e),
        };
        match pruned {
            Ok(n) => total += n,
            Err(e) => {
                eprintln!("outboxd prune failed after deleting {total} rows: {e}");
                return EXIT_POSTGRES;
            }
        }
    }
    say!(
        "ok  {total} relayed rows older than {:?} deleted",
        args.older_than
    );
    EXIT_OK
}

async fn prune_table(s: &Settings, args: &PruneArgs) -> Result<u64, PruneError> {
    let config = wiring::connect_config(s);
    let (_, mut batch_conn) = config.connect_sql_target().await?;
    let (_, watch) = config.connect_sql_target().await?;
    let table = s.table();
    // Exact pg_catalog operators on every pair (docs/sql.md): timestamptz < timestamptz,
    // (oid, tid) = (oid, tid).
    let delete = format!(
        "DELETE FROM {table} WHERE (tableoid, ctid) IN (SELECT tableoid, ctid FROM {table} \
         WHERE created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1::pg_catalog.text::pg_catalog.interval) \
         LIMIT $2::pg_catalog.int8)"
    );
    let age = format!("{} seconds", args.older_than.as_secs());
    let limit = i64::from(args.batch);
    let mut deleted = 0u64;
    loop {
        let txn = batch_conn
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .start()
            .await?;
        // The snapshot is taken by this statement, before the function runs.
        let snapshot_end: String = txn
            .query_one(
                "SELECT pg_catalog.pg_current_wal_insert_lsn()::pg_catalog.text",
                &[],
            )
            .await?
            .try_get(0)?;
        let lsn = snapshot_end
            .parse::<pgoutput::Lsn>()
            .map_err(|_| pgrepl::ReplError::Protocol(format!("bad LSN {snapshot_end:?}")))?;
        wait_confirmed(&watch, &s.slot, lsn, args.wait).await?;
        let n = txn.execute(&delete, &[&age, &limit]).await?;
        txn.commit().await?;
        deleted += n;
        if n > 0 {
            say!("    {table}: {deleted} rows deleted (this batch {n}, relayed before {lsn})");
        }
        if n < u64::from(args.batch) {
            return Ok(deleted);
        }
    }
}

/// Each shard's slot identity and progress record, read once for all (`None`: no record
/// is kept, `OUTBOXD_PROGRESS_TOPIC` empty, and prune relies on the operator pausing it,
/// docs/operations.md). Prune's environment is the relay's: a cron job without Kafka
/// must not pass for one with nothing owed.
async fn read_records(s: &Settings, views: &[Settings]) -> Result<Option<OwedRead>, PruneError> {
    let Some(topic) = s.progress_topic.as_deref() else {
        return Ok(None);
    };
    let unread = |reason: String| PruneError::RecordUnread {
        topic: topic.to_owned(),
        reason,
    };
    if s.producer.bootstrap_servers.trim().is_empty() {
        return Err(unread(
            "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS is not set: give prune the same Kafka settings as `outboxd run`".into(),
        ));
    }
    let (pg, _) = wiring::connect_config(s).connect_sql_target().await?;
    let system = pgrepl::ReplicationConnection::connect(&pg)
        .await?
        .identify_system()
        .await?;
    let ids: Vec<SlotIdentity> = views
        .iter()
        .map(|v| super::slot_identity(v, &system.system_id))
        .collect();
    let store = ProgressStore::new(&s.producer, topic).map_err(|e| unread(e.to_string()))?;
    store.never_create_topic();
    let read = match tokio::time::timeout(RECORD_WAIT, store.read_slots(&ids)).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return Err(unread(e.to_string())),
        Err(_) => return Err(unread(format!("no answer within {RECORD_WAIT:?}"))),
    };
    let read = ids
        .into_iter()
        .zip(read)
        .map(|(id, r)| (id, r.map_err(|e| e.to_string())))
        .collect();
    Ok(Some((topic.to_owned(), read)))
}

/// The progress topic, and each shard's identity with its records (or why they could not
/// be read).
type OwedRead = (String, Vec<(SlotIdentity, Result<SlotRecords, String>)>);

/// The slot's position proves a row relayed only if the slot decoded its commit: not for
/// rows committed while a slot was lost, or hidden by an accepted publication change,
/// until the operator re-published them, nor for a back-fill's rows until it finished.
fn refuse_owed_rows(
    topic: &str,
    identity: &SlotIdentity,
    records: &Result<SlotRecords, String>,
) -> Result<(), PruneError> {
    let unread = |reason: String| PruneError::RecordUnread {
        topic: topic.to_owned(),
        reason,
    };
    let records = records.as_ref().map_err(|e| unread(e.clone()))?;
    refuse_unfinished_backfill(records, topic, identity).map_err(PruneError::BackfillUnfinished)?;
    // `init` and every `run` write it: none under this key is another topic, cluster name
    // or Kafka than the relay's, where an owed re-publish would not be seen either.
    if records.ours.is_none() {
        return Err(unread(format!(
            "none of slot {} under key {:?}: give prune the same OUTBOXD_PROGRESS_TOPIC, OUTBOXD_CLUSTER_NAME and Kafka settings as `outboxd run`, which writes it",
            identity.slot,
            identity.key()
        )));
    }
    match &records.republish {
        Some(owed) if !owed.done => Err(PruneError::RepublishOwed {
            at: owed.recorded_at_text(),
            why: owed.why.clone(),
            rows: owed.rows.clone(),
        }),
        _ => Ok(()),
    }
}

/// How long prune waits for Kafka to read the slot's progress record.
const RECORD_WAIT: Duration = Duration::from_secs(30);

/// Waits until the slot has confirmed `lsn`: every transaction that ended before it is
/// in Kafka.
async fn wait_confirmed(
    sql: &tokio_postgres::Client,
    slot: &str,
    lsn: pgoutput::Lsn,
    wait: Duration,
) -> Result<(), PruneError> {
    let deadline = Instant::now() + wait;
    loop {
        let state = preflight::slot_state(sql, slot)
            .await?
            .ok_or_else(|| PruneError::NoSlot(slot.to_owned()))?;
        let confirmed = state.confirmed_flush_lsn;
        if confirmed.is_some_and(|c| c >= lsn) && state.wal_status.as_deref() != Some("lost") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PruneError::NotConfirmed {
                slot: slot.to_owned(),
                lsn,
                at: confirmed.map_or_else(|| "no position".to_owned(), |c| c.to_string()),
                wait,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_their_unit() {
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_age("60s"), Ok(Duration::from_secs(60)));
        for bad in ["", "7", "d", "7w", "-1d", "1.5h"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
