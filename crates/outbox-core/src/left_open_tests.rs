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

/// A transaction's records acked at `from..` in `t [p]`, with contents `contents`.
fn acked_contents(w: &mut FirstWrites, p: i32, from: i64, contents: &[u64]) {
    for (offset, &c) in (from..).zip(contents) {
        w.acked("t", p, offset);
        w.content("t", p, c);
    }
}

#[test]
fn records_open_below_that_copy_our_first_ones_are_aborted_over() {
    // The hung-broker case: the aborted transaction's records in partition 1 were still in
    // flight (no ack, so no span), and the broker wrote them anyway.
    let mut first = FirstWrites::default();
    acked_contents(&mut first, 0, 0, &[10, 11]);
    first.aborted();
    let mut next = FirstWrites::new(first.spans().clone());
    next.allow_copies(true);
    acked_contents(&mut next, 0, 2, &[10, 11, 12]);
    acked_contents(&mut next, 1, 3, &[20, 21, 22, 23]);
    let stable = [Some(0), Some(0)];
    assert_eq!(
        next.regions_to_read(&stable),
        vec![(tp("t", 1), 0, 3)],
        "not the proven span"
    );
    let copies = Regions::from([(tp("t", 1), vec![20, 21, 22])]);
    assert_eq!(
        next.clone().judge_with(&stable, &copies),
        Err(LeftOpen::Aborted {
            at: tp("t", 0),
            open_from: 0,
            ours_from: 2
        })
    );
    let only_copies = Regions::from([(tp("t", 1), vec![20, 21, 22])]);
    let mut alone = FirstWrites::default();
    alone.allow_copies(true);
    acked_contents(&mut alone, 1, 3, &[20, 21, 22, 23]);
    assert_eq!(
        alone.judge_with(&[Some(0)], &only_copies),
        Err(LeftOpen::Copies {
            at: tp("t", 1),
            open_from: 0,
            ours_from: 3
        })
    );
    // Anything else there, or read short: committed in doubt.
    for region in [vec![20, 21, 99], vec![20, 21], vec![21, 22, 23]] {
        let read = Regions::from([(tp("t", 1), region.clone())]);
        let doubts = next
            .clone()
            .judge_with(&stable, &read)
            .unwrap_or_else(|e| panic!("{region:?}: {e}"));
        assert_eq!(doubts.len(), 2, "{region:?}");
    }
    let doubts = next.judge_with(&stable, &Regions::new()).expect("not read");
    assert_eq!(doubts.len(), 2);
}

#[test]
fn a_region_longer_than_what_was_kept_is_not_read() {
    let mut w = FirstWrites::default();
    w.allow_copies(true);
    acked_contents(&mut w, 0, 5, &[1, 2]);
    assert!(
        w.regions_to_read(&[Some(2)]).is_empty(),
        "3 offsets, 2 kept"
    );
    assert_eq!(w.regions_to_read(&[Some(3)]), vec![(tp("t", 0), 3, 5)]);
    assert!(w.regions_to_read(&[Some(5)]).is_empty(), "nothing open");
    assert!(w.regions_to_read(&[None]).is_empty(), "not read");
}

#[test]
fn contents_are_kept_for_unchecked_partitions_up_to_the_cap() {
    let mut w = FirstWrites::default();
    w.allow_copies(true);
    acked_contents(&mut w, 0, 0, &[7]);
    assert_eq!(w.judge(&[Some(0)]), Ok(vec![]));
    w.committed();
    // Checked in this session: nothing to compare there any more.
    acked_contents(&mut w, 0, 2, &[8, 9]);
    acked_contents(&mut w, 1, 0, &[1]);
    assert!(w.regions_to_read(&[Some(1), Some(0)]).is_empty());
    w.committed();
    let mut big = FirstWrites::default();
    big.allow_copies(true);
    let many: Vec<u64> = (0..).take(COPIES_KEPT + 5).collect();
    acked_contents(&mut big, 0, 10, &many);
    let from = 10 - i64::try_from(COPIES_KEPT).unwrap();
    assert_eq!(big.regions_to_read(&[Some(from)]).len(), 1);
    assert!(
        big.regions_to_read(&[Some(from - 1)]).is_empty(),
        "past the cap"
    );
}

#[test]
fn copies_prove_nothing_unless_the_replay_rested_on_the_record() {
    // A session that did not read the record (or doubted it) publishes events a
    // committed transaction holds: their copies say nothing of how it ended.
    let mut w = FirstWrites::default();
    acked_contents(&mut w, 0, 2, &[5, 6]);
    assert!(w.regions_to_read(&[Some(0)]).is_empty(), "not allowed");
    let read = Regions::from([(tp("t", 0), vec![5, 6])]);
    assert_eq!(
        w.clone().judge_with(&[Some(0)], &read).map(|d| d.len()),
        Ok(1)
    );
    w.allow_copies(true);
    assert_eq!(w.regions_to_read(&[Some(0)]), vec![(tp("t", 0), 0, 2)]);
    w.allow_copies(false);
    assert!(w.regions_to_read(&[Some(0)]).is_empty(), "a doubt since");
}

#[test]
fn a_transaction_that_wrote_where_it_cannot_check_never_aborts_over_anything() {
    let mut first = FirstWrites::default();
    first.acked("t", 0, 0);
    first.aborted();
    // An ack without an offset: where its records begin there is not known.
    let mut next = FirstWrites::new(first.spans().clone());
    next.allow_copies(true);
    next.acked("t", 0, 4);
    next.acked("t", 1, -1);
    assert!(next.regions_to_read(&[Some(0)]).is_empty());
    let doubts = next.judge(&[Some(0)]).expect("committed in doubt");
    assert_eq!(doubts.len(), 1, "the proven span too");
    // A partition not tracked at all.
    let mut other = FirstWrites::new(first.spans().clone());
    other.acked("t", 0, 4);
    other.unplaced();
    assert!(other.judge(&[Some(0)]).is_ok());
    other.committed();
    other.acked("t", 0, 9);
    other.unplaced();
    other.aborted();
    let mut after = FirstWrites::new(other.spans().clone());
    after.acked("t", 0, 12);
    assert!(
        matches!(after.judge(&[Some(9)]), Err(LeftOpen::Aborted { .. })),
        "a transaction's own span is still proven"
    );
}
