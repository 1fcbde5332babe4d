//! What a progress record says, as JSON in the topic, and what one read of the topic
//! found for a slot. The store (`super`) moves these to and from Kafka.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use outbox_core::slot_fate::{self, SlotRecordSeen};
use outbox_core::{DeliveredPosition, TxnMark};
use pgoutput::Lsn;

use super::owed::RepublishOwed;
use super::ProgressError;

/// Which slot a record is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotIdentity {
    /// `OUTBOXD_CLUSTER_NAME`: keeps apart copies of one cluster (same system identifier)
    /// that share one Kafka. Empty by default.
    pub cluster: String,
    /// `IDENTIFY_SYSTEM`'s system identifier: the same on a primary and its standbys, and
    /// on every clone, snapshot or restored backup of it.
    pub system_id: String,
    pub database: String,
    pub slot: String,
}

impl SlotIdentity {
    pub fn key(&self) -> String {
        if self.cluster.is_empty() {
            format!("{}/{}/{}", self.system_id, self.database, self.slot)
        } else {
            format!(
                "{}@{}/{}/{}",
                self.cluster, self.system_id, self.database, self.slot
            )
        }
    }

    /// The exactly-once mode's `transactional.id`: one per slot (so the instance that
    /// takes a slot over fences the one that held it), and the same for every instance
    /// that may hold it.
    pub fn transactional_id(&self) -> String {
        format!("outboxd/{}", self.key())
    }

    /// The key of the record written just before the slot is created. A key of its own:
    /// one written late (two replicas creating the slot at once, the loser's intent
    /// landing after the winner's record) never replaces the record that the slot exists.
    pub fn creating_key(&self) -> String {
        format!("{}#creating", self.key())
    }

    /// The key of the slot's back-fill state ([`BackfillState`]): its own key, so `run`
    /// and `init` find an unfinished back-fill whatever the slot's record says.
    pub fn backfill_key(&self) -> String {
        format!("{}#backfill", self.key())
    }

    /// The key of the slot's owed re-publish ([`RepublishOwed`]).
    pub fn republish_key(&self) -> String {
        format!("{}#republish", self.key())
    }
}

/// Where `outboxd init --backfill` is: written before the slot is created and after each
/// acknowledged batch, so a back-fill killed midway is resumed (by `init --backfill`
/// again), and `run` refuses to stream past one that has not finished.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackfillState {
    /// The operator's SQL condition, as given.
    pub condition: String,
    /// Whether the slot was created with `--recreate-lost-slot` (said again on resuming).
    pub recreate_lost_slot: bool,
    /// `pg_current_snapshot()` inside the snapshot the rows below `after` were read in,
    /// with the slot's consistent point then; `None` before a batch of it was acked.
    pub snapshot: Option<String>,
    pub consistent_point: Option<Lsn>,
    /// The server's clock just before the slot was created (PostgreSQL microseconds):
    /// kept so a resume over the same slot names the same time to re-publish from.
    pub slot_created_at: Option<i64>,
    /// The ordering key (`created_at`, id, as text) of the last row acked in `snapshot`.
    pub after: Option<(String, String)>,
    /// Rows published (dead letters included) and dead-lettered, over every attempt.
    pub published: u64,
    pub dead_lettered: u64,
    pub done: bool,
    /// The publication looked at just before the slot was created: what `init` compares
    /// it with once the back-fill is done (a change while it ran hid rows from the slot).
    /// `None` in states written before this was kept.
    pub publication: Option<PublicationSeen>,
}

impl BackfillState {
    /// The look from before the slot was created, if this finished back-fill's slot is
    /// still where it was created (`confirmed`: nothing streamed from it since): for a slot
    /// left with no record, the baseline its first record must carry, not a later look.
    pub fn look_before_slot(&self, confirmed: Lsn) -> Option<&PublicationSeen> {
        self.publication
            .as_ref()
            .filter(|_| self.done && self.consistent_point == Some(confirmed))
    }

    pub(super) fn to_json(&self) -> String {
        serde_json::json!({
            "condition": self.condition,
            "recreate_lost_slot": self.recreate_lost_slot,
            "snapshot": self.snapshot,
            "consistent_point": self.consistent_point.map(|l| l.to_string()),
            "slot_created_at": self.slot_created_at,
            "after": self.after.as_ref().map(|(c, i)| serde_json::json!([c, i])),
            "published": self.published,
            "dead_lettered": self.dead_lettered,
            "done": self.done,
            "publication": self.publication.as_ref().map(PublicationSeen::to_json),
            "recorded_at_unix_ms": unix_ms_now(),
        })
        .to_string()
    }

    pub(super) fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let text = |name: &str| v.get(name).and_then(serde_json::Value::as_str);
        let condition = text("condition")
            .ok_or("no field \"condition\"")?
            .to_owned();
        let after = match v.get("after") {
            Some(serde_json::Value::Array(pair)) => match pair.as_slice() {
                [c, i] => Some((
                    c.as_str().ok_or("after is not text")?.to_owned(),
                    i.as_str().ok_or("after is not text")?.to_owned(),
                )),
                _ => return Err("after is not a pair".into()),
            },
            _ => None,
        };
        let consistent_point = match text("consistent_point") {
            Some(t) => Some(
                t.parse::<Lsn>()
                    .map_err(|e| format!("consistent_point: {e}"))?,
            ),
            None => None,
        };
        let flag = |name: &str| v.get(name).and_then(serde_json::Value::as_bool);
        let count = |name: &str| v.get(name).and_then(serde_json::Value::as_u64);
        Ok(BackfillState {
            condition,
            recreate_lost_slot: flag("recreate_lost_slot").unwrap_or(false),
            snapshot: text("snapshot").map(str::to_owned),
            consistent_point,
            slot_created_at: v.get("slot_created_at").and_then(serde_json::Value::as_i64),
            after,
            published: count("published").unwrap_or(0),
            dead_lettered: count("dead_lettered").unwrap_or(0),
            // In doubt, unfinished: `run` refuses, and `init --backfill` resumes.
            done: flag("done").unwrap_or(false),
            publication: v.get("publication").and_then(PublicationSeen::from_json),
        })
    }
}

/// The publication as a session last verified it: its catalog identity
/// (`pgrepl::preflight::PublicationLook::identity`), and when and at which WAL position that
/// was. A later start that finds another identity stops: rows written after this point may
/// never have been decoded for the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationSeen {
    pub identity: String,
    pub at_unix_ms: u64,
    pub wal_lsn: Lsn,
}

impl PublicationSeen {
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "identity": self.identity,
            "at_unix_ms": self.at_unix_ms,
            "wal_lsn": self.wal_lsn.to_string(),
        })
    }

    /// `None` for anything else than what [`PublicationSeen::to_json`] writes.
    fn from_json(v: &serde_json::Value) -> Option<Self> {
        Some(PublicationSeen {
            identity: v.get("identity")?.as_str()?.to_owned(),
            at_unix_ms: v.get("at_unix_ms")?.as_u64()?,
            wal_lsn: v.get("wal_lsn")?.as_str()?.parse().ok()?,
        })
    }

    /// `at` as RFC 3339 UTC text.
    pub fn at_text(&self) -> String {
        rfc3339_of_ms(self.at_unix_ms)
    }
}

pub(super) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn rfc3339_of_ms(ms: u64) -> String {
    outbox_core::rfc3339_utc_seconds(i64::try_from(ms / 1000).unwrap_or(i64::MAX))
}

/// This process as a writer of progress records: host, process id and start time. Only
/// for operators reading the record; what ties records into one history is the lineage.
pub fn writer_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("{host}/{}/{started}", std::process::id())
    })
}

/// How far ahead of the record's writing its `since` may be: the server's clock (of the
/// commit) against the writer's (of the write).
const CLOCK_SKEW_MICROS: i64 = 10 * 60 * 1_000_000;

/// What a record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressRecord {
    /// What it claims Kafka has: a position the slot had confirmed (everything before it
    /// is in Kafka), the transactions its last writes ended at (what a replay must show
    /// before it skips anything), its base, the partly acked transaction and the writer's
    /// settings fingerprint (see `outbox_core::delivered`).
    pub claim: DeliveredPosition,
    /// When it was written, Unix milliseconds.
    pub recorded_at_unix_ms: u64,
    /// false: written just before creating the slot, which may never have happened (the
    /// process died while CREATE_REPLICATION_SLOT waited), so a missing slot is then no
    /// proof of a lost one. Set by every later write.
    pub slot_created: bool,
    /// Which chain of claims this record continues: kept by a writer that proved (or
    /// started past) the record it read, new for one that doubted it. Two lineages
    /// alternating on one key are two live copies of one cluster.
    pub lineage: u64,
    /// Host, process id and start time of the process that wrote it (`writer_id`).
    pub writer: String,
    /// The publication as last verified before this record; `None` in records written
    /// before outboxd recorded it.
    pub publication: Option<PublicationSeen>,
}

impl ProgressRecord {
    /// A record of a position alone (a slot's start): it proves nothing delivered.
    pub fn now(timeline: u32, confirmed_lsn: Lsn) -> Self {
        ProgressRecord::of(DeliveredPosition::at(timeline, confirmed_lsn, 0), 0)
    }

    /// The record of a claim, in lineage `lineage`.
    pub fn of(claim: DeliveredPosition, lineage: u64) -> Self {
        ProgressRecord {
            claim,
            recorded_at_unix_ms: unix_ms_now(),
            slot_created: true,
            lineage,
            writer: writer_id().to_owned(),
            publication: None,
        }
    }

    /// The position the slot had confirmed when it was written.
    pub fn confirmed_lsn(&self) -> Lsn {
        self.claim.lsn
    }

    /// The record of a slot just created at `position`: nothing committed after it
    /// committed before `server_time`, the server's clock read just before the creation.
    pub fn slot_created(timeline: u32, position: Lsn, server_time: Option<i64>) -> Self {
        let mut record = ProgressRecord::now(timeline, position);
        record.claim.since = server_time;
        record
    }

    /// The record written before the slot is created.
    pub fn before_creation(timeline: u32, position: Lsn) -> Self {
        ProgressRecord {
            slot_created: false,
            ..ProgressRecord::now(timeline, position)
        }
    }

    pub(super) fn to_json(&self, id: &SlotIdentity) -> String {
        // Marks as [seq, commit_lsn, end_lsn, xid, commit_time]: ~160 of them per record.
        let c = &self.claim;
        let marks: Vec<serde_json::Value> = c
            .marks
            .iter()
            .map(|m| {
                serde_json::json!([
                    m.seq,
                    m.commit_lsn.to_string(),
                    m.end_lsn.to_string(),
                    m.xid,
                    m.commit_time
                ])
            })
            .collect();
        serde_json::json!({
            "version": 2,
            "cluster": id.cluster,
            "system_id": id.system_id,
            "database": id.database,
            "slot": id.slot,
            "timeline": c.timeline,
            "confirmed_lsn": c.lsn.to_string(),
            "base_lsn": c.base.to_string(),
            "recorded_at_unix_ms": self.recorded_at_unix_ms,
            "slot_created": self.slot_created,
            "marks": marks,
            "partial": c.partial.map(|p| serde_json::json!({
                "commit_lsn": p.txn.commit_lsn.to_string(),
                "xid": p.txn.xid,
                "commit_time": p.txn.commit_time,
                "rows": p.rows,
                "digest": p.digest.map(|d| format!("{d:016x}")),
            })),
            "since": c.since,
            "fingerprint": format!("{:016x}", c.fingerprint),
            "lineage": format!("{:016x}", self.lineage),
            "writer": self.writer,
            "publication": self.publication.as_ref().map(PublicationSeen::to_json),
        })
        .to_string()
    }

    pub(super) fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let field = |name: &str| v.get(name).ok_or_else(|| format!("no field {name:?}"));
        let confirmed_lsn = field("confirmed_lsn")?
            .as_str()
            .ok_or("confirmed_lsn is not a string")?
            .parse::<Lsn>()
            .map_err(|e| format!("confirmed_lsn: {e}"))?;
        let timeline = field("timeline")?
            .as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or("timeline is not a 32-bit number")?;
        let recorded_at_unix_ms = field("recorded_at_unix_ms")?
            .as_u64()
            .ok_or("recorded_at_unix_ms is not a number")?;
        // Absent in records written before it existed: those were all written for slots.
        let slot_created = v
            .get("slot_created")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        // Version 1 records have no marks, no fingerprint and a partial transaction named
        // by its position alone: they prove nothing, so they skip nothing. A field that
        // does not read whole is left out the same way.
        let lsn_of = |v: &serde_json::Value| v.as_str().and_then(|t| t.parse::<Lsn>().ok());
        let marks = v
            .get("marks")
            .and_then(serde_json::Value::as_array)
            .map(|all| {
                all.iter()
                    .take(outbox_core::delivered::MAX_MARKS)
                    .filter_map(|m| {
                        Some(TxnMark {
                            seq: m.get(0)?.as_u64()?,
                            commit_lsn: lsn_of(m.get(1)?)?,
                            end_lsn: lsn_of(m.get(2)?)?,
                            xid: u32::try_from(m.get(3)?.as_u64()?).ok()?,
                            commit_time: m.get(4)?.as_i64()?,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let partial = v.get("partial").and_then(|p| {
            Some(outbox_core::PartialTxn {
                txn: outbox_core::TxnId {
                    commit_lsn: lsn_of(p.get("commit_lsn")?)?,
                    xid: u32::try_from(p.get("xid")?.as_u64()?).ok()?,
                    commit_time: p.get("commit_time")?.as_i64()?,
                },
                rows: p.get("rows")?.as_u64()?,
                // Absent before row digests: such a partial proves nothing.
                digest: p
                    .get("digest")
                    .and_then(serde_json::Value::as_str)
                    .and_then(|t| u64::from_str_radix(t, 16).ok()),
            })
        });
        let hex = |name: &str| {
            v.get(name)
                .and_then(serde_json::Value::as_str)
                .and_then(|t| u64::from_str_radix(t, 16).ok())
        };
        let fingerprint = hex("fingerprint");
        let base = v.get("base_lsn").and_then(lsn_of);
        // A record from before `since` was written: its newest transaction at or before
        // its position is the bound (a mark is read from a commit). Never `recorded_at`:
        // that is the writer's clock at a write, later than rows it did not relay.
        // Never later than the newest transaction it names, nor than its own writing
        // (give or take the writer's clock against the server's): a time past either was
        // not read from a commit before it.
        let newest = marks
            .iter()
            .filter(|m| m.end_lsn <= confirmed_lsn)
            .max_by_key(|m| m.end_lsn)
            .map(|m| m.commit_time);
        let written = i64::try_from(recorded_at_unix_ms.saturating_mul(1000))
            .ok()
            .map(|unix| unix.saturating_sub(pgoutput::time::PG_EPOCH_OFFSET_MICROS));
        let since = match (v.get("since").and_then(serde_json::Value::as_i64), newest) {
            (Some(s), Some(n)) => Some(s.min(n)),
            (s, n) => s.or(n),
        }
        .filter(|s| written.is_none_or(|w| *s <= w.saturating_add(CLOCK_SKEW_MICROS)));
        let (marks, partial, base) = match (fingerprint, base) {
            (Some(_), Some(base)) => (marks, partial, base),
            _ => (Vec::new(), None, confirmed_lsn),
        };
        Ok(ProgressRecord {
            claim: DeliveredPosition {
                timeline,
                lsn: confirmed_lsn,
                base,
                marks,
                partial,
                fingerprint: fingerprint.unwrap_or(0),
                since,
            },
            recorded_at_unix_ms,
            slot_created,
            lineage: hex("lineage").unwrap_or(0),
            writer: v
                .get("writer")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_owned(),
            publication: v.get("publication").and_then(PublicationSeen::from_json),
        })
    }

    /// Whose record this is (from the fields inside it), and what it says; `None` for a
    /// value that is not a readable record.
    fn owner_from_json(bytes: &[u8]) -> Option<(SlotIdentity, Self)> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let text = |name: &str| v.get(name)?.as_str().map(str::to_owned);
        let owner = SlotIdentity {
            cluster: text("cluster").unwrap_or_default(),
            system_id: text("system_id")?,
            database: text("database")?,
            slot: text("slot")?,
        };
        Some((owner, ProgressRecord::from_json(bytes).ok()?))
    }

    /// `recorded_at` as RFC 3339 UTC text for error messages.
    pub fn recorded_at_text(&self) -> String {
        rfc3339_of_ms(self.recorded_at_unix_ms)
    }

    /// From when rows may not have been relayed, as RFC 3339 UTC text (the server's
    /// clock): see `DeliveredPosition::since`. `None`: the record cannot say.
    pub fn since_text(&self) -> Option<String> {
        self.claim.since.map(pg_time_text)
    }

    /// What to re-publish should the slot be lost (`republish_text`).
    pub fn republish_text(&self) -> String {
        republish_text(slot_fate::republish_since(&self.seen()))
    }

    /// The record as the rule for a lost slot takes it (`outbox_core::slot_fate`).
    pub fn seen(&self) -> SlotRecordSeen {
        let written_ms = i64::try_from(self.recorded_at_unix_ms).unwrap_or(i64::MAX);
        SlotRecordSeen {
            confirmed: self.claim.lsn,
            since: self.claim.since,
            written_at: written_ms
                .saturating_mul(1000)
                .saturating_sub(pgoutput::time::PG_EPOCH_OFFSET_MICROS),
        }
    }
}

/// What to re-publish from `since` (PostgreSQL microseconds since 2000-01-01), as the
/// errors and `init` say it: minus the longest transaction (`created_at` is a
/// transaction's start), or everything when no time is known.
pub fn republish_text(since: Option<i64>) -> String {
    match since.map(pg_time_text) {
        Some(at) => format!("the outbox rows committed since {at}, minus your longest transaction (created_at is a transaction's start)"),
        None => "every outbox row that may not be in Kafka (the progress record names no time to start from: it was written by an older outboxd, or after a doubted claim; all rows still in the table, if unsure)".to_owned(),
    }
}

/// What no re-publishing brings back after a lost slot, as the errors and `init` say it:
/// an emitted message is in the WAL alone, never in a table (issue 33).
pub const EMITTED_LOST_TEXT: &str = "With OUTBOXD_MESSAGE_PREFIX set, the messages \
    emitted with pg_logical_emit_message after the lost slot's last confirmed position that \
    Kafka does not have are lost: they were in its WAL alone, and no table holds them to \
    re-publish; their writers must emit them again";

/// A PostgreSQL timestamp (microseconds since 2000-01-01) as RFC 3339 UTC text, to the
/// second, rounded down (an earlier bound is the safe one).
pub fn pg_time_text(pg_micros: i64) -> String {
    let unix = pgoutput::PgTimestamp(pg_micros).unix_micros();
    outbox_core::rfc3339_utc_seconds(unix.div_euclid(1_000_000))
}

/// What the progress topic holds for one database and slot name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotRecords {
    /// The record of this cluster's slot.
    pub ours: Option<ProgressRecord>,
    /// Records of a slot with the same database and name on other clusters (system
    /// identifier, record): the relay streamed from another cluster before, or another
    /// cluster's relay shares the topic.
    pub other_clusters: Vec<(String, ProgressRecord)>,
    /// Records of this slot on this cluster (same system identifier) under another
    /// `OUTBOXD_CLUSTER_NAME`: this cluster before its name was set or changed, or a copy
    /// named apart.
    pub renamed: Vec<ProgressRecord>,
    /// Lineages of this slot's most recent records still in the topic (the last few
    /// runs), oldest first, repeats in a row folded: `[a, b, a]` means two live writers
    /// take turns.
    pub lineages: Vec<u64>,
    /// The newest record written just before creating this slot (its own key: see
    /// [`SlotIdentity::creating_key`]).
    pub creating: Option<ProgressRecord>,
    /// The slot's back-fill (`init --backfill`), if one was started.
    pub backfill: Option<BackfillState>,
    /// Rows the slot cannot have relayed, if `init` recorded any (`--republish-done`
    /// marks them done).
    pub republish: Option<RepublishOwed>,
    /// Whether the topic ever held a record (its high watermark is past 0). One that did,
    /// but holds none of this slot, cannot say the slot never existed: its record may have
    /// been deleted (by retention, or by hand).
    pub topic_had_records: bool,
}

impl SlotRecords {
    /// Whether the retained records of this key show two lineages taking turns (A, B,
    /// A): two live copies of one cluster record under one key.
    pub fn writers_alternate(&self) -> bool {
        self.lineages
            .iter()
            .enumerate()
            .any(|(i, l)| self.lineages[i + 1..].iter().skip(1).any(|m| m == l))
    }
}

impl SlotRecords {
    /// The publication look to compare the publication with: ours, or with no record of
    /// ours, the newest one recorded under another name of this cluster. Without it a
    /// name set for the first time (as the docs advise for copies) would start with no
    /// look, and a change made while outboxd was stopped would go unseen. A copy named
    /// apart whose publication changed since it was copied stops the first start under
    /// the new name, naming its look: re-publishing from there costs duplicates only.
    pub fn last_look(&self) -> Option<&PublicationSeen> {
        match &self.ours {
            Some(ours) => ours.publication.as_ref(),
            None => self
                .renamed
                .iter()
                .filter(|r| r.publication.is_some())
                .max_by_key(|r| r.recorded_at_unix_ms)
                .and_then(|r| r.publication.as_ref()),
        }
    }

    /// The record saying that the slot existed, if one does.
    pub fn slot_existed(&self) -> Option<&ProgressRecord> {
        self.ours.as_ref().filter(|r| r.slot_created)
    }

    /// Another cluster's record of a slot that existed there, and none of ours: the relay
    /// is pointed at a new cluster (a wrong host, or a migration) until an operator says
    /// it is meant to be (`outboxd init` writes our record).
    pub fn only_other_cluster(&self) -> Option<&(String, ProgressRecord)> {
        if self.ours.is_some() {
            return None;
        }
        self.other_clusters
            .iter()
            .filter(|(_, r)| r.slot_created)
            .max_by_key(|(_, r)| r.recorded_at_unix_ms)
    }
}

/// Lineage runs of a key kept from one read of the topic: enough to see two live writers
/// take turns, few enough that an alternation long gone (a takeover and back, days ago,
/// still in the active segment of a tiny compacted topic) ages out.
const RECENT_LINEAGES: usize = 6;

/// What one read of the topic found for one slot.
pub(super) struct SlotScan {
    key: String,
    /// Keys end with the database and slot: a cheap filter before parsing the value.
    same_slot_suffix: String,
    latest: Option<Option<Vec<u8>>>,
    creating_key: String,
    creating: Option<Option<Vec<u8>>>,
    backfill_key: String,
    backfill: Option<Option<Vec<u8>>>,
    republish_key: String,
    republish: Option<Option<Vec<u8>>>,
    lineages: Vec<u64>,
    /// Newest value per key of another cluster's record of this slot (None: deleted).
    others: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl SlotScan {
    pub(super) fn new(id: &SlotIdentity) -> Self {
        SlotScan {
            key: id.key(),
            creating_key: id.creating_key(),
            creating: None,
            backfill_key: id.backfill_key(),
            backfill: None,
            republish_key: id.republish_key(),
            republish: None,
            same_slot_suffix: format!("/{}/{}", id.database, id.slot),
            latest: None,
            lineages: Vec::new(),
            others: BTreeMap::new(),
        }
    }

    pub(super) fn see(&mut self, key: &[u8], payload: Option<&[u8]>) {
        if key == self.key.as_bytes() {
            let lineage = payload
                .and_then(|p| ProgressRecord::from_json(p).ok())
                .map(|r| r.lineage);
            if let Some(l) = lineage.filter(|l| *l != 0) {
                if self.lineages.last() != Some(&l) {
                    self.lineages.push(l);
                    // Only recent history: every clean restart starts a lineage.
                    if self.lineages.len() > RECENT_LINEAGES {
                        self.lineages.remove(0);
                    }
                }
            }
            self.latest = Some(payload.map(<[u8]>::to_vec));
        } else if key == self.creating_key.as_bytes() {
            self.creating = Some(payload.map(<[u8]>::to_vec));
        } else if key == self.backfill_key.as_bytes() {
            self.backfill = Some(payload.map(<[u8]>::to_vec));
        } else if key == self.republish_key.as_bytes() {
            self.republish = Some(payload.map(<[u8]>::to_vec));
        } else if key.ends_with(self.same_slot_suffix.as_bytes()) {
            self.others
                .insert(key.to_vec(), payload.map(<[u8]>::to_vec));
        }
    }

    pub(super) fn records(
        self,
        id: &SlotIdentity,
        topic_had_records: bool,
    ) -> Result<SlotRecords, ProgressError> {
        let ours = match self.latest.flatten() {
            None => None,
            Some(bytes) => {
                Some(ProgressRecord::from_json(&bytes).map_err(ProgressError::Unreadable)?)
            }
        };
        // Another cluster's records only count when they say so themselves; an
        // unreadable one is not ours to judge.
        let (mut other_clusters, mut renamed) = (Vec::new(), Vec::new());
        for bytes in self.others.into_values().flatten() {
            let Some((owner, record)) = ProgressRecord::owner_from_json(&bytes) else {
                continue;
            };
            if owner.database != id.database || owner.slot != id.slot {
                continue;
            }
            // A record of this system identifier under another OUTBOXD_CLUSTER_NAME is
            // this cluster renamed, or another copy of it named apart on purpose: never
            // another cluster's.
            if owner.system_id == id.system_id {
                renamed.push(record);
            } else {
                other_clusters.push((owner.system_id, record));
            }
        }
        // An unreadable intent is only an intent: it never says the slot existed.
        let creating = self
            .creating
            .flatten()
            .and_then(|bytes| ProgressRecord::from_json(&bytes).ok());
        // An unreadable back-fill state is an unfinished one: `run` refuses rather than
        // stream past rows it may not have published.
        let backfill = self.backfill.flatten().map(|bytes| {
            BackfillState::from_json(&bytes).unwrap_or_else(|e| BackfillState {
                condition: format!("<unreadable back-fill state: {e}>"),
                ..BackfillState::default()
            })
        });
        Ok(SlotRecords {
            ours,
            other_clusters,
            renamed,
            lineages: self.lineages,
            creating,
            backfill,
            republish: self
                .republish
                .flatten()
                .map(|bytes| RepublishOwed::from_json(&bytes)),
            topic_had_records,
        })
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
