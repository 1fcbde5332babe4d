use super::*;
use crate::TxnId;

const RULES: CadenceRules = CadenceRules {
    interval: Duration::from_secs(1),
    rewrite_idle_every: Duration::from_secs(300),
    lineage_check_every: Duration::from_secs(30),
    exactly_once: false,
};

const ACKED: RecordAcks = RecordAcks {
    any_this_session: true,
    own_lineage: false,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn at(lsn: u64) -> RecordFacts {
    RecordFacts {
        position: Lsn(lsn),
        partial: None,
        lineage: 7,
    }
}

/// A cadence whose first record, `first`, was written and acked at second 0.
fn written(first: RecordFacts) -> RecordCadence {
    let mut c = RecordCadence::new(RULES, secs(0));
    assert!(c.looks(secs(0), true));
    assert!(c.turn(secs(0), first, ACKED).write);
    c.sent(secs(0), first);
    c
}

/// Whether the look at `now` writes `record`.
fn writes(c: &mut RecordCadence, now: Duration, record: RecordFacts, acks: RecordAcks) -> bool {
    c.looks(now, true) && c.turn(now, record, acks).write
}

#[test]
fn the_first_look_writes_the_record_even_without_progress() {
    let mut c = RecordCadence::new(RULES, secs(0));
    // At once, not an interval later: a slot from before records existed gets one.
    assert!(c.looks(secs(0), true));
    assert!(c.turn(secs(0), at(100), ACKED).write);
}

#[test]
fn an_unchanged_record_is_not_written_again_before_the_idle_rewrite() {
    let mut c = written(at(100));
    assert!(!writes(&mut c, secs(10), at(100), ACKED));
    assert!(!writes(&mut c, secs(299), at(100), ACKED));
}

#[test]
fn a_moved_position_is_written() {
    let mut c = written(at(100));
    assert!(writes(&mut c, secs(2), at(200), ACKED));
}

#[test]
fn a_changed_partial_transaction_is_written() {
    let mut c = written(at(100));
    let partial = RecordFacts {
        partial: Some(PartialTxn {
            txn: TxnId {
                commit_lsn: Lsn(150),
                xid: 9,
                commit_time: 1,
            },
            rows: 2,
            digest: Some(3),
        }),
        ..at(100)
    };
    assert!(writes(&mut c, secs(2), partial, ACKED));
}

#[test]
fn a_new_lineage_is_written_at_once_even_where_the_position_went_back() {
    let mut c = written(at(200));
    // A doubt: the claim starts over, behind what the record says, under a new lineage.
    let doubted = RecordFacts {
        lineage: 8,
        ..at(100)
    };
    assert!(writes(&mut c, secs(2), doubted, ACKED));
}

#[test]
fn until_a_write_of_this_session_is_acked_the_record_is_written_again() {
    let mut c = written(at(100));
    let unacked = RecordAcks {
        any_this_session: false,
        own_lineage: false,
    };
    // The record may not exist at all (Kafka down at the first write).
    assert!(writes(&mut c, secs(2), at(100), unacked));
}

#[test]
fn an_idle_record_is_rewritten_every_rewrite_interval() {
    let mut c = written(at(100));
    assert!(!writes(&mut c, secs(299), at(100), ACKED));
    // Looks that wrote nothing do not put the rewrite off: it counts from the last write.
    assert!(writes(&mut c, secs(300), at(100), ACKED));
    c.sent(secs(300), at(100));
    assert!(!writes(&mut c, secs(301), at(100), ACKED));
    assert!(writes(&mut c, secs(600), at(100), ACKED));
}

#[test]
fn a_write_the_store_did_not_take_is_due_again_at_the_next_look() {
    let mut c = written(at(100));
    // Due, but skipped while an earlier write is unanswered: `sent` is not called.
    assert!(writes(&mut c, secs(2), at(200), ACKED));
    assert!(writes(&mut c, secs(3), at(200), ACKED));
    c.sent(secs(3), at(200));
    assert!(!writes(&mut c, secs(4), at(200), ACKED));
}

#[test]
fn the_record_is_looked_at_at_most_every_interval() {
    let mut c = written(at(100));
    assert!(!c.looks(Duration::from_millis(999), true));
    assert!(c.looks(secs(1), true));
    // A look that wrote nothing counts as one.
    assert!(!c.turn(secs(1), at(100), ACKED).write);
    assert!(!c.looks(Duration::from_millis(1999), true));
}

#[test]
fn exactly_once_never_writes_the_record_outside_its_kafka_transactions() {
    let c = RecordCadence::new(
        CadenceRules {
            exactly_once: true,
            ..RULES
        },
        secs(0),
    );
    assert!(!c.looks(secs(0), true));
    assert!(!c.looks(secs(1000), true));
}

#[test]
fn no_record_is_written_before_the_publication_was_compared_with_the_records() {
    let c = RecordCadence::new(RULES, secs(0));
    assert!(!c.looks(secs(0), false));
    assert!(!c.looks(secs(1000), false));
    assert!(c.looks(secs(1000), true));
}

#[test]
fn the_record_is_read_back_only_once_this_sessions_lineage_was_acked_and_then_every_check_interval()
{
    let mut c = written(at(100));
    let own = RecordAcks {
        any_this_session: true,
        own_lineage: true,
    };
    // The newest record may still be the previous session's: no sign of another writer.
    assert!(!c.turn(secs(40), at(100), ACKED).check_lineage);
    assert!(c.turn(secs(41), at(100), own).check_lineage);
    assert!(!c.turn(secs(70), at(100), own).check_lineage);
    assert!(c.turn(secs(71), at(100), own).check_lineage);
}
