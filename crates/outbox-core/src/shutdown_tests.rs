use super::*;
use ShutdownStep as S;

const RULES: ShutdownRules = ShutdownRules {
    exactly_once: false,
    watches_publication: true,
    keeps_record: true,
    timeout: Duration::from_secs(30),
    final_record_min: Duration::from_secs(1),
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn turn(now: u64, may_stop: bool) -> Happened {
    Happened::Turn {
        now: secs(now),
        may_stop,
    }
}

/// The steps a shutdown asked for, fed `look` at its last look.
fn steps(rules: ShutdownRules, look: LookEnd) -> Vec<ShutdownStep> {
    steps_of(Shutdown::new(rules, secs(0)), look)
}

fn steps_of(mut s: Shutdown, look: LookEnd) -> Vec<ShutdownStep> {
    let mut seen = vec![s.step()];
    // Bounded: a shutdown that never ends fails the comparison instead of hanging.
    while !matches!(s.step(), S::Done | S::Stop) && seen.len() < 10 {
        let happened = match s.step() {
            S::ReadOn => turn(1, true),
            S::FinishKafkaTxn => Happened::KafkaTxnCommitted,
            S::AwaitAcks => Happened::AcksAwaited,
            S::LastLook => Happened::Looked(look),
            S::Confirm => Happened::Confirmed,
            S::WriteRecord => Happened::RecordWritten,
            S::Stop | S::Done => break,
        };
        seen.push(s.on(happened));
    }
    seen
}

#[test]
fn the_stream_is_read_on_while_a_transaction_is_open_and_before_the_deadline() {
    let mut s = Shutdown::new(RULES, secs(10));
    assert_eq!(s.on(turn(11, false)), S::ReadOn);
    assert_eq!(s.on(turn(39, false)), S::ReadOn);
    assert_eq!(s.on(turn(40, false)), S::AwaitAcks);
}

#[test]
fn reading_stops_once_no_transaction_is_open() {
    let mut s = Shutdown::new(RULES, secs(10));
    assert_eq!(s.on(turn(11, true)), S::AwaitAcks);
}

#[test]
fn the_acks_are_awaited_then_the_publication_looked_at_then_the_position_confirmed_then_the_record_written(
) {
    assert_eq!(
        steps(RULES, LookEnd::Answered),
        [
            S::ReadOn,
            S::AwaitAcks,
            S::LastLook,
            S::Confirm,
            S::WriteRecord,
            S::Done
        ]
    );
}

#[test]
fn exactly_once_commits_the_kafka_transaction_and_writes_no_record_outside_it() {
    let rules = ShutdownRules {
        exactly_once: true,
        ..RULES
    };
    assert_eq!(
        steps(rules, LookEnd::Answered),
        [
            S::ReadOn,
            S::FinishKafkaTxn,
            S::LastLook,
            S::Confirm,
            S::Done
        ]
    );
}

#[test]
fn exactly_once_a_failed_kafka_commit_stops_without_confirming() {
    let rules = ShutdownRules {
        exactly_once: true,
        ..RULES
    };
    let mut s = Shutdown::new(rules, secs(0));
    assert_eq!(s.on(turn(1, true)), S::FinishKafkaTxn);
    assert_eq!(s.on(Happened::KafkaTxnFailed), S::Stop);
    assert_eq!(s.on(Happened::Confirmed), S::Stop);
}

#[test]
fn a_changed_or_dropped_publication_at_the_last_look_stops_before_confirming() {
    assert_eq!(
        steps(RULES, LookEnd::Stopped),
        [S::ReadOn, S::AwaitAcks, S::LastLook, S::Stop]
    );
}

#[test]
fn a_failed_or_timed_out_last_look_still_confirms_and_writes_the_record() {
    for look in [LookEnd::Failed, LookEnd::TimedOut] {
        assert_eq!(
            steps(RULES, look),
            [
                S::ReadOn,
                S::AwaitAcks,
                S::LastLook,
                S::Confirm,
                S::WriteRecord,
                S::Done
            ],
            "{look:?}"
        );
    }
}

#[test]
fn without_a_publication_or_a_record_those_steps_are_left_out() {
    let rules = ShutdownRules {
        watches_publication: false,
        keeps_record: false,
        ..RULES
    };
    assert_eq!(
        steps(rules, LookEnd::Answered),
        [S::ReadOn, S::AwaitAcks, S::Confirm, S::Done]
    );
}

#[test]
fn the_final_record_gets_what_is_left_of_the_deadline_but_at_least_a_moment() {
    let s = Shutdown::new(RULES, secs(10));
    assert_eq!(s.deadline(), secs(40));
    assert_eq!(s.record_time(secs(15)), secs(25));
    assert_eq!(s.record_time(secs(45)), secs(1));
    assert_eq!(s.left(secs(45)), Duration::ZERO);
}

#[test]
fn what_happened_at_another_step_changes_nothing() {
    let mut s = Shutdown::new(RULES, secs(0));
    assert_eq!(s.on(Happened::Confirmed), S::ReadOn);
    assert_eq!(s.on(turn(1, true)), S::AwaitAcks);
    assert_eq!(s.on(Happened::RecordWritten), S::AwaitAcks);
    assert_eq!(s.on(turn(2, true)), S::AwaitAcks);
}

#[test]
fn a_bad_rows_stop_awaits_looks_and_confirms_but_neither_reads_on_nor_writes_a_record() {
    let s = Shutdown::before_bad_row(RULES, secs(5));
    assert_eq!(s.deadline(), secs(35), "the shutdown timeout");
    assert_eq!(
        s.look_time(secs(40)),
        secs(1),
        "a look even after slow acks"
    );
    assert_eq!(Shutdown::new(RULES, secs(5)).look_time(secs(40)), secs(0));
    assert_eq!(
        steps_of(s, LookEnd::Answered),
        [S::AwaitAcks, S::LastLook, S::Confirm, S::Done]
    );
    assert_eq!(
        steps_of(Shutdown::before_bad_row(RULES, secs(5)), LookEnd::Stopped),
        [S::AwaitAcks, S::LastLook, S::Stop],
        "a changed publication is the error then"
    );
    let unwatched = ShutdownRules {
        watches_publication: false,
        ..RULES
    };
    assert_eq!(
        steps_of(
            Shutdown::before_bad_row(unwatched, secs(5)),
            LookEnd::Answered
        ),
        [S::AwaitAcks, S::Confirm, S::Done]
    );
}
