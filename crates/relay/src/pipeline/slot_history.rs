//! What a missing slot means: a first start, or a slot that existed and went (dropped,
//! invalidated, lost in a failover). Creating a slot starts it at the current WAL
//! position; every row committed before that is never decoded for it. So a slot is
//! created only when nothing can have been committed for it that would be skipped, or
//! when the operator says so. One rule, for `run` and `outboxd init`.

use pgrepl::preflight::TableRows;

use super::error::RelayError;
use crate::kafka::{ProgressRecord, SlotRecords};

/// What the operator allowed `outboxd init` to do (`run` allows nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consent {
    /// `--recreate-lost-slot`: a record says the slot existed; create it anyway, knowing
    /// that rows committed since its last position are not relayed (and must be
    /// re-published by hand).
    pub recreate_lost_slot: bool,
    /// `--skip-existing-rows`: the table has rows that are known to be published (by
    /// an earlier relay) or not meant to be.
    pub skip_existing_rows: bool,
    /// `--backfill`: the rows its condition selects are published from the new slot's
    /// snapshot before streaming; the others are known to be published.
    pub backfill: bool,
}

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

/// The rule. `rows` is what the table holds now (`TableRows::Empty` when outboxd relays
/// no table, only emitted messages).
pub fn judge_missing_slot(
    slot: &str,
    table: &str,
    progress_topic: &str,
    history: History<'_>,
    rows: TableRows,
    consent: Consent,
) -> Result<Creation, RelayError> {
    if let History::Read(records) = history {
        if let Some(record) = records.slot_existed() {
            if consent.recreate_lost_slot {
                return Ok(Creation::Recreate(Box::new(record.clone())));
            }
            return Err(RelayError::SlotLost {
                slot: slot.to_owned(),
                progress_topic: progress_topic.to_owned(),
                last_confirmed: record.confirmed_lsn(),
                republish: record.republish_text(),
            });
        }
    }
    // Recreating a lost slot knowingly skips rows too, whether or not a record is left.
    let knowingly = consent.skip_existing_rows || consent.recreate_lost_slot || consent.backfill;
    if let History::Unreadable(why) = history {
        if !knowingly {
            return Err(RelayError::SlotHistoryUnknown {
                slot: slot.to_owned(),
                progress_topic: progress_topic.to_owned(),
                reason: why.to_owned(),
            });
        }
    }
    if rows == TableRows::Empty {
        return Ok(Creation::FirstStart);
    }
    if knowingly {
        return Ok(Creation::OverRows);
    }
    let history = match history {
        History::Read(r) if r.topic_had_records => format!(
            "; the progress topic {progress_topic:?} holds records, but none of this slot (a record deleted by hand or by retention looks the same), so it cannot tell whether the slot existed"
        ),
        History::Read(_) => String::new(),
        History::Unreadable(why) | History::NotKept(why) => {
            format!("; whether the slot existed is unknown ({why})")
        }
    };
    Err(RelayError::RowsBeforeSlot {
        slot: slot.to_owned(),
        table: table.to_owned(),
        rows: match rows {
            TableRows::Some => "already has rows",
            TableRows::Were => {
                "had rows (the server's statistics count inserts into it, deleted since)"
            }
            TableRows::Missing => "does not exist",
            TableRows::Empty | TableRows::Unknown => {
                "may hold rows (outboxd's role cannot read it, and it is not empty on disk)"
            }
        },
        history,
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
