use super::*;

fn tp(t: &str, p: i32) -> TopicPartition {
    (t.to_owned(), p)
}

#[test]
fn a_stable_offset_where_ours_begin_is_checked_once_per_session() {
    let mut w = FirstWrites::default();
    w.acked("t", 0, 12);
    w.acked("t", 0, 10);
    w.acked("t", 1, 5);
    w.acked("t", 1, -1001);
    assert_eq!(w.to_check(), vec![tp("t", 0), tp("t", 1)]);
    assert_eq!(w.judge(&[Some(10), Some(5)]), Ok(vec![]));
    w.committed();
    w.acked("t", 0, 40);
    assert!(w.to_check().is_empty(), "checked for the session");
}

#[test]
fn a_span_this_process_aborted_without_a_commit_is_closed_by_an_abort() {
    let mut first = FirstWrites::default();
    first.acked("t", 0, 0);
    first.acked("u", 2, 7);
    first.aborted();
    let mut next = FirstWrites::new(first.spans().clone());
    next.acked("t", 0, 60);
    next.acked("u", 2, 9);
    let why = next.judge(&[Some(0), Some(9)]).unwrap_err();
    assert_eq!(
        why,
        LeftOpen::Aborted {
            at: tp("t", 0),
            open_from: 0,
            ours_from: 60
        }
    );
    next.aborted();
    // The abort's markers closed it: the next session's records are the oldest open.
    let mut after = FirstWrites::new(next.spans().clone());
    after.acked("t", 0, 75);
    assert_eq!(after.judge(&[Some(75)]), Ok(vec![]));
    after.committed();
    assert!(
        !after.spans().contains_key(&tp("t", 0)),
        "a commit there ends the span"
    );
    assert!(after.spans().contains_key(&tp("u", 2)), "not one elsewhere");
}

#[test]
fn an_older_open_transaction_not_proven_aborted_is_a_doubt_and_committed() {
    // Asked to commit, then failed: the outcome is unknown, so the span is not proven.
    let mut first = FirstWrites::default();
    first.acked("t", 0, 0);
    first.commit_asked();
    first.aborted();
    assert!(first.spans().is_empty());
    let mut next = FirstWrites::new(first.spans().clone());
    next.acked("t", 0, 30);
    next.acked("t", 1, 4);
    let doubts = next.judge(&[Some(0), None]).expect("committed in doubt");
    assert_eq!(
        doubts,
        vec![
            OpenBelow {
                at: tp("t", 0),
                open_from: Some(0),
                ours_from: 30
            },
            OpenBelow {
                at: tp("t", 1),
                open_from: None,
                ours_from: 4
            }
        ]
    );
}

#[test]
fn records_decided_by_another_client_are_not_committed() {
    let mut w = FirstWrites::default();
    w.acked("t", 0, 10);
    assert_eq!(
        w.judge(&[Some(11)]),
        Err(LeftOpen::Decided {
            at: tp("t", 0),
            stable: 11,
            ours_from: 10
        })
    );
}

#[test]
fn an_unread_stable_offset_where_a_proven_span_may_be_open_aborts() {
    let mut first = FirstWrites::default();
    first.acked("t", 0, 3);
    first.aborted();
    let mut next = FirstWrites::new(first.spans().clone());
    next.acked("t", 0, 8);
    assert_eq!(
        next.judge(&[None]),
        Err(LeftOpen::Unread { at: tp("t", 0) })
    );
    assert_eq!(
        next.to_check(),
        vec![tp("t", 0)],
        "nothing taken as checked"
    );
}

#[test]
fn only_a_stable_offset_within_the_proven_spans_aborts() {
    let mut first = FirstWrites::default();
    first.acked("t", 0, 5);
    first.aborted();
    let mut second = FirstWrites::new(first.spans().clone());
    second.acked("t", 0, 9);
    second.aborted();
    assert_eq!(second.spans().get(&tp("t", 0)), Some(&(5, 9)));
    for open_from in [5, 7, 9] {
        let mut next = FirstWrites::new(second.spans().clone());
        next.acked("t", 0, 14);
        assert_eq!(
            next.judge(&[Some(open_from)]),
            Err(LeftOpen::Aborted {
                at: tp("t", 0),
                open_from,
                ours_from: 14
            })
        );
    }
    // Open from below the oldest: records of unknown outcome begin the span (a commit
    // whose markers were skipped, say), and an abort would hide them: committed.
    let mut below = FirstWrites::new(second.spans().clone());
    below.acked("t", 0, 14);
    assert_eq!(
        below.judge(&[Some(2)]),
        Ok(vec![OpenBelow {
            at: tp("t", 0),
            open_from: Some(2),
            ours_from: 14
        }])
    );
    assert!(below.spans().is_empty(), "committed over: decided");
    // Open from above the newest only: the proven ones were closed.
    let mut above = FirstWrites::new(second.spans().clone());
    above.acked("t", 0, 14);
    assert!(above.judge(&[Some(11)]).is_ok());
    assert!(above.spans().is_empty());
    let mut clean = FirstWrites::new(second.spans().clone());
    clean.acked("t", 0, 20);
    assert_eq!(clean.judge(&[Some(20)]), Ok(vec![]));
    assert!(clean.spans().is_empty(), "nothing older open: forgotten");
}

#[test]
fn a_proven_span_is_committed_in_doubt_when_another_partition_is_unknown() {
    let mut first = FirstWrites::default();
    first.acked("t", 0, 5);
    first.aborted();
    let mut next = FirstWrites::new(first.spans().clone());
    next.acked("t", 0, 9);
    next.acked("t", 1, 30);
    // An abort would also decide partition 1, where something of unknown outcome is open.
    let doubts = next
        .judge(&[Some(5), Some(12)])
        .expect("committed in doubt");
    assert_eq!(doubts.len(), 2);
    assert!(next.spans().is_empty(), "both decided by the commit");
}

#[test]
fn a_partition_checked_earlier_in_the_session_can_hold_off_an_abort() {
    let mut first = FirstWrites::default();
    first.acked("t", 1, 0);
    first.aborted();
    let mut w = FirstWrites::new(first.spans().clone());
    w.acked("t", 0, 10);
    assert_eq!(w.judge(&[Some(10)]), Ok(vec![]));
    w.committed();
    // The next transaction writes to the checked partition and to one with a proven span.
    w.acked("t", 0, 20);
    w.acked("t", 1, 5);
    assert_eq!(w.to_check(), vec![tp("t", 0), tp("t", 1)], "all of them");
    // The commit before left its records open in partition 0 (its markers skipped): an
    // abort would hide them, so commit in doubt.
    let doubts = w.judge(&[Some(10), Some(0)]).expect("committed in doubt");
    assert_eq!(doubts.len(), 2);
    // With partition 0 clean, the proven span is aborted over.
    let mut v = FirstWrites::new(first.spans().clone());
    v.acked("t", 0, 10);
    assert_eq!(v.judge(&[Some(10)]), Ok(vec![]));
    v.committed();
    v.acked("t", 0, 20);
    v.acked("t", 1, 5);
    assert!(matches!(
        v.judge(&[Some(20), Some(0)]),
        Err(LeftOpen::Aborted { .. })
    ));
}
