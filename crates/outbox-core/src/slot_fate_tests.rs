use pgoutput::Lsn;

use super::*;

fn record(since: Option<i64>) -> SlotRecordSeen {
    SlotRecordSeen {
        confirmed: Lsn(0x10),
        since,
        written_at: 9_000,
    }
}

fn read(existed: Option<SlotRecordSeen>, topic_had_records: bool) -> HistorySeen {
    HistorySeen::Read {
        existed,
        topic_had_records,
    }
}

#[test]
fn a_slot_gone_after_this_process_streamed_is_dropped_whatever_the_settings() {
    assert_eq!(
        at_start(SlotNow::Absent, true, true),
        Err(SlotStop::Dropped { since: None })
    );
    assert_eq!(
        at_start(SlotNow::Absent, true, false),
        Err(SlotStop::Dropped { since: None })
    );
    assert_eq!(
        at_start(SlotNow::Absent, false, true),
        Ok(AtStart::CreateIfNew)
    );
    assert_eq!(
        at_start(SlotNow::Absent, false, false),
        Err(SlotStop::Missing)
    );
    assert_eq!(at_start(SlotNow::Usable, true, false), Ok(AtStart::Stream));
}

#[test]
fn an_invalidated_slot_stops_and_names_the_claims_time_only_while_streaming() {
    for seen in [false, true] {
        assert_eq!(
            at_start(SlotNow::Invalidated, seen, true),
            Err(SlotStop::Invalidated { since: None })
        );
    }
    let mut claim = DeliveredPosition::at(1, Lsn(0x10), 7);
    claim.since = Some(1_234);
    assert_eq!(
        streaming(SlotNow::Invalidated, &claim),
        Err(SlotStop::Invalidated { since: Some(1_234) })
    );
    assert_eq!(
        streaming(SlotNow::Absent, &claim),
        Err(SlotStop::Dropped { since: Some(1_234) })
    );
    assert_eq!(streaming(SlotNow::Usable, &claim), Ok(()));
}

#[test]
fn a_slot_that_existed_is_never_created_without_consent() {
    let existed = read(Some(record(Some(500))), true);
    for rows in [TableSeen::Empty, TableSeen::Some, TableSeen::Unknown] {
        for consent in [
            Consent::default(),
            Consent {
                skip_existing_rows: true,
                backfill: true,
                ..Consent::default()
            },
        ] {
            assert_eq!(
                judge_missing_slot(existed, rows, consent),
                Err(MissingRefusal::Lost {
                    confirmed: Lsn(0x10),
                    since: Some(500)
                })
            );
        }
    }
    let recreate = Consent {
        recreate_lost_slot: true,
        ..Consent::default()
    };
    assert_eq!(
        judge_missing_slot(existed, TableSeen::Some, recreate),
        Ok(Creation::Recreate { since: Some(500) })
    );
}

#[test]
fn the_time_to_republish_from_is_the_claims_never_the_records_write() {
    assert_eq!(republish_since(&record(Some(500))), Some(500));
    // No time recorded (an older writer, a doubted claim): everything, not the write.
    assert_eq!(republish_since(&record(None)), None);
    assert_eq!(
        judge_missing_slot(
            read(Some(record(None)), true),
            TableSeen::Some,
            Consent::default()
        ),
        Err(MissingRefusal::Lost {
            confirmed: Lsn(0x10),
            since: None
        })
    );
}

#[test]
fn without_a_record_the_table_decides() {
    let none = read(None, false);
    assert_eq!(
        judge_missing_slot(none, TableSeen::Empty, Consent::default()),
        Ok(Creation::FirstStart)
    );
    assert_eq!(
        judge_missing_slot(none, TableSeen::Some, Consent::default()),
        Err(MissingRefusal::RowsBeforeSlot {
            rows: TableSeen::Some,
            history: HistoryNote::Nothing
        })
    );
    assert_eq!(
        judge_missing_slot(read(None, true), TableSeen::Were, Consent::default()),
        Err(MissingRefusal::RowsBeforeSlot {
            rows: TableSeen::Were,
            history: HistoryNote::CannotTell
        })
    );
    let skip = Consent {
        skip_existing_rows: true,
        ..Consent::default()
    };
    assert_eq!(
        judge_missing_slot(none, TableSeen::Some, skip),
        Ok(Creation::OverRows)
    );
    // Unreadable: refused even over an empty table, unless the operator knows.
    assert_eq!(
        judge_missing_slot(
            HistorySeen::Unreadable,
            TableSeen::Empty,
            Consent::default()
        ),
        Err(MissingRefusal::HistoryUnknown)
    );
    assert_eq!(
        judge_missing_slot(HistorySeen::Unreadable, TableSeen::Empty, skip),
        Ok(Creation::FirstStart)
    );
    assert_eq!(
        judge_missing_slot(HistorySeen::NotKept, TableSeen::Unknown, Consent::default()),
        Err(MissingRefusal::RowsBeforeSlot {
            rows: TableSeen::Unknown,
            history: HistoryNote::Unknown
        })
    );
}

#[test]
fn inits_record_names_a_replaced_time_only_when_accepted_and_not_past_the_slot() {
    let mut old = DeliveredPosition::at(1, Lsn(0x20), 7);
    old.since = Some(700);
    assert_eq!(
        init_record_since(Some(900), Some(&old), true, Lsn(0x20)),
        Some(900)
    );
    assert_eq!(
        init_record_since(None, Some(&old), true, Lsn(0x20)),
        Some(700)
    );
    assert_eq!(init_record_since(None, Some(&old), false, Lsn(0x20)), None);
    assert_eq!(init_record_since(None, Some(&old), true, Lsn(0x1F)), None);
    assert_eq!(init_record_since(None, None, true, Lsn(0x20)), None);
}
