//! What a relay does about its replication slot when it is missing or invalidated: stream,
//! create it, or stop, and with which time to re-publish from. Creating a slot starts it at
//! the current WAL position, so every row committed before is never decoded for it: a slot
//! that existed must never come back silently. The relay (`pipeline/slot.rs`,
//! `slot_history.rs`, `outboxd init`) reads the server and the progress record and maps a
//! stop to its error; the simulator feeds the same inputs.

use pgoutput::Lsn;

use crate::DeliveredPosition;

/// The slot as the server shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotNow {
    Absent,
    Usable,
    /// `wal_status = lost`: the WAL it needs is removed, it can never stream again.
    Invalidated,
}

/// Why the relay stops over its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotStop {
    /// Gone after this process streamed from it. `since`: as for `Invalidated`.
    Dropped { since: Option<i64> },
    /// Its WAL is gone. `since`: the time to re-publish from (PostgreSQL microseconds
    /// since 2000-01-01), when the relay knows it (a session's claim); at a start it does
    /// not, and `outboxd init` names the record's.
    Invalidated { since: Option<i64> },
    /// Absent, and the relay may not create slots (`OUTBOXD_CREATE_SLOT` off).
    Missing,
}

/// What a start does with the slot it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtStart {
    Stream,
    /// Absent: create it if [`judge_missing_slot`] allows.
    CreateIfNew,
}

/// The slot at a session's start. `seen_slot`: this process streamed from it before; the
/// progress record may be gone or unread, and this process's memory is then the only
/// witness that the slot existed.
pub fn at_start(now: SlotNow, seen_slot: bool, create_slot: bool) -> Result<AtStart, SlotStop> {
    match now {
        SlotNow::Usable => Ok(AtStart::Stream),
        SlotNow::Invalidated => Err(SlotStop::Invalidated { since: None }),
        SlotNow::Absent if seen_slot => Err(SlotStop::Dropped { since: None }),
        SlotNow::Absent if create_slot => Ok(AtStart::CreateIfNew),
        SlotNow::Absent => Err(SlotStop::Missing),
    }
}

/// The slot as a running session polls it. `claim`: the session's claim, whose time
/// bounds every transaction it has not confirmed.
pub fn streaming(now: SlotNow, claim: &DeliveredPosition) -> Result<(), SlotStop> {
    match now {
        SlotNow::Usable => Ok(()),
        SlotNow::Invalidated => Err(SlotStop::Invalidated { since: claim.since }),
        SlotNow::Absent => Err(SlotStop::Dropped { since: claim.since }),
    }
}

/// The progress record of a slot that existed, as far as the rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRecordSeen {
    /// The position its writers confirmed.
    pub confirmed: Lsn,
    /// Its claim's time (`DeliveredPosition::since`): read from a commit or the server.
    pub since: Option<i64>,
    /// When the record was written, by its writer's clock (PostgreSQL microseconds since
    /// 2000-01-01): for messages only, never a time to re-publish from.
    pub written_at: i64,
}

/// The time to re-publish from when the slot of `record` is lost: its claim's, never its
/// write's. A record is written (again) long after what it confirms, with rows committed
/// in between that no slot will ever decode.
pub fn republish_since(record: &SlotRecordSeen) -> Option<i64> {
    record.since
}

/// What the progress topic says of the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistorySeen {
    /// One read of the topic: the record saying the slot existed (an intent alone, a
    /// creation never finished, is none), and whether the topic ever held any record.
    Read {
        existed: Option<SlotRecordSeen>,
        topic_had_records: bool,
    },
    /// The topic could not be read: a record may say the slot existed.
    Unreadable,
    /// No progress record is kept: only the table can tell.
    NotKept,
}

/// What the outbox table holds, as the relay could see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSeen {
    Empty,
    Some,
    /// Empty now, but the server's statistics count inserts into it.
    Were,
    Missing,
    /// The relay's role cannot read it, or the look took too long.
    Unknown,
}

/// What the operator allowed `outboxd init` to do (`run` allows nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consent {
    /// `--recreate-lost-slot`: create a slot a record says existed, knowing that rows
    /// committed since its last position must be re-published.
    pub recreate_lost_slot: bool,
    /// `--skip-existing-rows`: the table's rows are published already, or not meant to be.
    pub skip_existing_rows: bool,
    /// `--backfill`: the rows its condition selects are published from the new slot's
    /// snapshot; the others are known to be published.
    pub backfill: bool,
}

/// Why creating the missing slot is right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Creation {
    /// Nothing was committed that a new slot would skip.
    FirstStart,
    /// A record says the slot existed, and the operator knows: re-publish from `since`
    /// (`None`: every row that may be missing).
    Recreate { since: Option<i64> },
    /// The table has rows a new slot starts after, and the operator knows.
    OverRows,
}

/// Why the missing slot is not created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingRefusal {
    /// A record says it existed: lost. Re-publish from `since` (`None`: every row that may
    /// be missing), then recreate it knowingly.
    Lost { confirmed: Lsn, since: Option<i64> },
    /// The topic could not be read, so whether it existed is unknown.
    HistoryUnknown,
    /// The table has (or may have had) rows a new slot would skip.
    RowsBeforeSlot {
        rows: TableSeen,
        history: HistoryNote,
    },
}

/// What a refusal over rows says of the slot's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryNote {
    /// The topic was read and never held a record.
    Nothing,
    /// The topic holds records, none of this slot: one deleted looks the same.
    CannotTell,
    /// Unreadable or not kept.
    Unknown,
}

/// The rule for a missing slot, for `run` and `outboxd init`.
pub fn judge_missing_slot(
    history: HistorySeen,
    rows: TableSeen,
    consent: Consent,
) -> Result<Creation, MissingRefusal> {
    if let HistorySeen::Read {
        existed: Some(record),
        ..
    } = history
    {
        let since = republish_since(&record);
        if consent.recreate_lost_slot {
            return Ok(Creation::Recreate { since });
        }
        return Err(MissingRefusal::Lost {
            confirmed: record.confirmed,
            since,
        });
    }
    // Recreating a lost slot knowingly skips rows too, whether or not a record is left.
    let knowingly = consent.skip_existing_rows || consent.recreate_lost_slot || consent.backfill;
    if history == HistorySeen::Unreadable && !knowingly {
        return Err(MissingRefusal::HistoryUnknown);
    }
    if rows == TableSeen::Empty {
        return Ok(Creation::FirstStart);
    }
    if knowingly {
        return Ok(Creation::OverRows);
    }
    let history = match history {
        HistorySeen::Read {
            topic_had_records: true,
            ..
        } => HistoryNote::CannotTell,
        HistorySeen::Read { .. } => HistoryNote::Nothing,
        HistorySeen::Unreadable | HistorySeen::NotKept => HistoryNote::Unknown,
    };
    Err(MissingRefusal::RowsBeforeSlot { rows, history })
}

/// The time a record written by `outboxd init` names: a new slot's creation, or, when a
/// record is replaced over the same slot with the operator's acceptance, the replaced
/// record's time if its position is at or before `position` (a later one would name a
/// time past rows this position has not relayed). A record replaced as wrong names none.
pub fn init_record_since(
    created_since: Option<i64>,
    replaced: Option<&DeliveredPosition>,
    accepted: bool,
    position: Lsn,
) -> Option<i64> {
    created_since.or_else(|| {
        replaced
            .filter(|old| accepted && old.lsn <= position)
            .and_then(|old| old.since)
    })
}

#[cfg(test)]
#[path = "slot_fate_tests.rs"]
mod tests;
