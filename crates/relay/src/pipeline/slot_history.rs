//! What a missing slot means: a first start, or a slot that existed and went (dropped,
//! invalidated, lost in a failover). Creating a slot starts it at the current WAL
//! position; every row committed before that is never decoded for it. So a slot is
//! created only when nothing can have been committed for it that would be skipped, or
//! when the operator says so. One rule, for `run` and `outboxd init`.

use pgrepl::preflight::TableRows;

use super::error::RelayError;
use crate::kafka::{republish_text, ProgressRecord, SlotRecords};

pub use outbox_core::slot_fate::Consent;
use outbox_core::slot_fate::{self, HistoryNote, HistorySeen, MissingRefusal, TableSeen};

/// What the progress topic says of the slot.
#[derive(Debug, Clone, Copy)]
pub enum History<'a> {
    /// One read of the topic.
    Read(&'a SlotRecords),
    /// The topic could not be read (why): a record may say the slot existed.
    Unreadable(&'a str),
    /// No progress record is kept (why): only the table can tell.
    NotKept(&'a str),
}

/// Why creating the slot is right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Creation {
    /// Nothing was committed that a new slot would skip: the table has no rows, and no
    /// record says a slot existed.
    FirstStart,
    /// A record says the slot existed: the operator knows (`--recreate-lost-slot`).
    Recreate(Box<ProgressRecord>),
    /// The table has rows a new slot starts after: the operator knows
    /// (`--skip-existing-rows`).
    OverRows,
}

/// The rule (`outbox_core::slot_fate::judge_missing_slot`), with the relay's errors.
/// `rows` is what the table holds now (`TableRows::Empty` when outboxd relays no table,
/// only emitted messages).
pub fn judge_missing_slot(
    slot: &str,
    table: &str,
    progress_topic: &str,
    history: History<'_>,
    rows: TableRows,
    consent: Consent,
) -> Result<Creation, RelayError> {
    let existed = match history {
        History::Read(records) => records.slot_existed(),
        History::Unreadable(_) | History::NotKept(_) => None,
    };
    let seen = match history {
        History::Read(records) => HistorySeen::Read {
            existed: existed.map(ProgressRecord::seen),
            topic_had_records: records.topic_had_records,
        },
        History::Unreadable(_) => HistorySeen::Unreadable,
        History::NotKept(_) => HistorySeen::NotKept,
    };
    let table_seen = match rows {
        TableRows::Empty => TableSeen::Empty,
        TableRows::Some => TableSeen::Some,
        TableRows::Were => TableSeen::Were,
        TableRows::Missing => TableSeen::Missing,
        TableRows::Unknown => TableSeen::Unknown,
    };
    let refusal = match slot_fate::judge_missing_slot(seen, table_seen, consent) {
        Ok(slot_fate::Creation::FirstStart) => return Ok(Creation::FirstStart),
        Ok(slot_fate::Creation::OverRows) => return Ok(Creation::OverRows),
        Ok(slot_fate::Creation::Recreate { .. }) => {
            return match existed {
                Some(record) => Ok(Creation::Recreate(Box::new(record.clone()))),
                // The rule recreates only over a record it was given.
                None => Ok(Creation::OverRows),
            };
        }
        Err(refusal) => refusal,
    };
    Err(match refusal {
        MissingRefusal::Lost { confirmed, since } => RelayError::SlotLost {
            slot: slot.to_owned(),
            progress_topic: progress_topic.to_owned(),
            last_confirmed: confirmed,
            republish: republish_text(since),
        },
        MissingRefusal::HistoryUnknown => RelayError::SlotHistoryUnknown {
            slot: slot.to_owned(),
            progress_topic: progress_topic.to_owned(),
            reason: match history {
                History::Unreadable(why) | History::NotKept(why) => why.to_owned(),
                History::Read(_) => String::new(),
            },
        },
        MissingRefusal::RowsBeforeSlot { rows, history: note } => RelayError::RowsBeforeSlot {
            slot: slot.to_owned(),
            table: table.to_owned(),
            rows: match rows {
                TableSeen::Some => "already has rows",
                TableSeen::Were => {
                    "had rows (the server's statistics count inserts into it, deleted since)"
                }
                TableSeen::Missing => "does not exist",
                TableSeen::Empty | TableSeen::Unknown => {
                    "may hold rows (outboxd's role cannot read it, and it is not empty on disk)"
                }
            },
            history: match (note, history) {
                (HistoryNote::CannotTell, _) => format!(
                    "; the progress topic {progress_topic:?} holds records, but none of this slot (a record deleted by hand or by retention looks the same), so it cannot tell whether the slot existed"
                ),
                (HistoryNote::Unknown, History::Unreadable(why) | History::NotKept(why)) => {
                    format!("; whether the slot existed is unknown ({why})")
                }
                (HistoryNote::Nothing | HistoryNote::Unknown, _) => String::new(),
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::Lsn;

    fn judge(records: &SlotRecords, rows: TableRows, consent: Consent) -> Result<Creation, String> {
        judge_missing_slot(
            "s",
            "public.outbox",
            "outboxd.progress",
            History::Read(records),
            rows,
            consent,
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_slot_is_created_only_over_nothing_it_would_skip() {
        let none = SlotRecords::default();
        assert_eq!(
            judge(&none, TableRows::Empty, Consent::default()),
            Ok(Creation::FirstStart)
        );
        let rows = judge(&none, TableRows::Some, Consent::default()).unwrap_err();
        assert!(rows.contains("--skip-existing-rows"), "{rows}");
        assert!(judge(&none, TableRows::Unknown, Consent::default()).is_err());
        let skip = Consent {
            skip_existing_rows: true,
            ..Consent::default()
        };
        assert_eq!(judge(&none, TableRows::Some, skip), Ok(Creation::OverRows));

        // A back-fill publishes the rows its condition selects: rows are no refusal, a
        // record that the slot existed still is.
        let backfill = Consent {
            backfill: true,
            ..Consent::default()
        };
        assert_eq!(
            judge(&SlotRecords::default(), TableRows::Some, backfill),
            Ok(Creation::OverRows)
        );

        // A record of the slot: lost, whatever the table holds, unless recreated knowingly.
        let existed = SlotRecords {
            ours: Some(ProgressRecord::now(1, Lsn(0x10))),
            ..SlotRecords::default()
        };
        for rows in [TableRows::Empty, TableRows::Some] {
            let lost = judge(&existed, rows, skip).unwrap_err();
            assert!(lost.contains("--recreate-lost-slot"), "{lost}");
        }
        let recreate = Consent {
            recreate_lost_slot: true,
            ..Consent::default()
        };
        assert!(matches!(
            judge(&existed, TableRows::Some, recreate),
            Ok(Creation::Recreate(_))
        ));

        // An intent alone (a creation that never finished) is no slot that existed.
        let intent = SlotRecords {
            ours: Some(ProgressRecord::before_creation(1, Lsn(0x10))),
            ..SlotRecords::default()
        };
        assert_eq!(
            judge(&intent, TableRows::Empty, Consent::default()),
            Ok(Creation::FirstStart)
        );
        let deleted = SlotRecords {
            topic_had_records: true,
            ..SlotRecords::default()
        };
        let unknown = judge(&deleted, TableRows::Some, Consent::default()).unwrap_err();
        assert!(unknown.contains("cannot tell"), "{unknown}");
    }
}
