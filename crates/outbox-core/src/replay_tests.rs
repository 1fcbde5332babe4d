//! The replay rules on hand-built transactions: what is held, dropped, released or
//! spilled, and what a claim marks.

use super::*;
use crate::delivered::{DeliveredPosition, Doubt, TxnId};

fn id(lsn: u64, xid: u32, t: i64) -> TxnId {
    TxnId {
        commit_lsn: Lsn(lsn),
        xid,
        commit_time: t,
    }
}

fn start(at: u64, new_lineage: u64, doubt_lineage: u64) -> ReplayCore<u32> {
    let mut claim = DeliveredPosition::at(1, Lsn(50), 7);
    claim.push_mark(id(500, 100, 1000), Lsn(510));
    claim.lsn = Lsn(510);
    ReplayCore::new(ReplayStart {
        timeline: 1,
        start: Lsn(at),
        server_end: Lsn(1_000_000),
        claim: Some((claim, 42)),
        fingerprint: 7,
        foreign_writer: false,
        mark_every: 0,
        tracked_rows: usize::MAX,
        new_lineage,
        doubt_lineage,
    })
}

#[test]
fn two_copies_doubting_one_claim_write_different_lineages() {
    let mut a = start(100, 0xa1, 0xa2);
    let mut b = start(100, 0xb1, 0xb2);
    assert_eq!(a.lineages().0, 42, "a pending proof continues the claim");
    for (core, t) in [(&mut a, 2000), (&mut b, 3000)] {
        // Same position, another commit time: another history.
        let step = core.begin(id(500, 100, t));
        assert!(matches!(step, Step::Release(Doubt::Mismatch, _)));
    }
    assert_eq!((a.lineages(), b.lineages()), ((0xa2, 42), (0xb2, 42)));
}

#[test]
fn a_message_between_held_transactions_is_held_and_dropped_with_them() {
    let mut c = start(100, 1, 2);
    assert!(matches!(c.begin(id(200, 1, 10)), Step::Nothing));
    assert!(c.holding());
    let Ok(NextRow::Publish(row)) = c.next_row(0) else {
        panic!("no partial skip here");
    };
    assert!(c.hold(Ticket::from_index(0), 1, row).is_none());
    assert!(matches!(c.commit(Lsn(210)), Ok(Step::Nothing)));
    // Outside a transaction, behind held ones: held too.
    assert!(c.holding());
    assert!(c.hold(Ticket::from_index(1), 2, None).is_none());
    assert!(matches!(c.begin(id(500, 100, 1000)), Step::Nothing));
    match c.commit(Lsn(510)) {
        Ok(Step::Drop(held)) => assert_eq!(held.len(), 2),
        other => panic!("{other:?}"),
    }
    assert!(!c.holding(), "every mark proven");
}

/// A session from 100 with `claim`, marking every `mark_every` rows.
fn from_100(claim: Option<DeliveredPosition>, mark_every: u64) -> ReplayCore<u32> {
    ReplayCore::new(ReplayStart {
        timeline: 1,
        start: Lsn(100),
        server_end: Lsn(1 << 40),
        claim: claim.map(|c| (c, 42)),
        fingerprint: 7,
        foreign_writer: false,
        mark_every,
        tracked_rows: usize::MAX,
        new_lineage: 1,
        doubt_lineage: 2,
    })
}

/// Reads `txns` transactions of `rows` rows each into `c`, handing each row to `row`
/// and checking each begin's and commit's step with `commit`.
fn read_history(
    c: &mut ReplayCore<u32>,
    (txns, rows): (u64, u64),
    mut row: impl FnMut(&mut ReplayCore<u32>, NextRow),
    mut commit: impl FnMut(Result<Step<u32>, PartialMismatch>) -> bool,
) {
    for t in 0..txns {
        let at = 1_000 + t * 10;
        let xid = u32::try_from(t).unwrap();
        let begun = c.begin(id(at, xid, i64::try_from(at).unwrap()));
        assert!(commit(Ok(begun)), "transaction {t}'s begin");
        for r in 0..rows {
            let next = c.next_row(t * rows + r).expect("no partial here");
            row(c, next);
        }
        assert!(commit(c.commit(Lsn(at + 5))), "transaction {t}");
    }
}

/// A claim written once after `txns` transactions of `rows` rows each, all acked.
fn claim_over(mark_every: u64, txns: u64, rows: u64) -> DeliveredPosition {
    let mut c = from_100(None, mark_every);
    read_history(
        &mut c,
        (txns, rows),
        |c, next| match next {
            NextRow::Publish(Some(row)) => c.acked(row),
            other => panic!("a row to publish: {other:?}"),
        },
        |step| matches!(step, Ok(Step::Nothing)),
    );
    c.claim_at(Lsn(1_000 + txns * 10)).0
}

/// The most rows a session holds replaying the history of [`claim_over`] from its
/// start, with `claim`.
fn most_held(claim: DeliveredPosition, txns: u64, rows: u64) -> usize {
    let mut c = from_100(Some(claim), 0);
    let mut most = 0;
    read_history(
        &mut c,
        (txns, rows),
        |c, next| {
            let NextRow::Publish(row) = next else {
                panic!("no partial here");
            };
            assert!(c.holding(), "every row before the last mark is held");
            assert!(c.hold(Ticket::from_index(0), 0, row).is_none());
            most = most.max(c.held_len());
        },
        |step| matches!(step, Ok(Step::Drop(_) | Step::Nothing)),
    );
    assert!(!c.holding(), "every mark proven");
    most
}

/// A replay holds what lies before its next mark. One claim write covering many
/// transactions (a Kafka transaction of the exactly-once mode) marked only its newest,
/// so a replay from before them held them all, past the in-flight caps, and published
/// them again: duplicates in `read_committed` (the e2e kill test, 1 run in 6).
#[test]
fn a_claim_marks_often_enough_that_a_replay_holds_at_most_mark_every_rows() {
    assert_eq!(
        most_held(claim_over(0, 40, 3), 40, 3),
        120,
        "one mark: all held"
    );
    assert_eq!(most_held(claim_over(10, 40, 3), 40, 3), 9);
    assert_eq!(claim_over(10, 40, 3).marks.len(), 14);
    // More single-row transactions in one write than the newest kept as candidates
    // (a review found the oldest dropped uncounted: 6,403 rows held, not 500).
    assert_eq!(most_held(claim_over(500, 10_000, 1), 10_000, 1), 500);
}

/// Replays 40 transactions of 3 rows under a claim marking only the last, spilling
/// once 10 records are held: returns the most held, the records dropped, and the last
/// step that was not `Nothing`.
fn spilled_replay(claim: DeliveredPosition) -> (usize, usize, Step<u32>) {
    let mut c = from_100(Some(claim), 0);
    let (mut most, mut dropped) = (0, 0);
    let mut last = None;
    let mut ticket = 0;
    read_history(
        &mut c,
        (40, 3),
        |c, next| {
            let NextRow::Publish(row) = next else {
                panic!("no partial here");
            };
            ticket += 1;
            dropped += usize::from(c.hold(Ticket::from_index(ticket), 0, row).is_some());
            most = most.max(c.held_len());
            if c.held_len() >= 10 {
                dropped += c.spill().len();
                assert!(c.spilled());
            }
        },
        |step| {
            let ok = matches!(step, Ok(Step::Nothing | Step::Drop(_) | Step::Unproven(_)));
            if !matches!(step, Ok(Step::Nothing)) {
                last = step.ok();
            }
            ok
        },
    );
    (most, dropped, last.unwrap_or(Step::Nothing))
}

/// A replay from a checkpoint minutes old (a PostgreSQL crash) reaches marks thinned
/// far apart; a hold that filled the caps was published: 25,180 duplicates in
/// `read_committed` (e2e `postgres_crashed_and_restarted`). A spilled hold keeps one
/// record, drops the rest unproven, and the mark proves them.
#[test]
fn a_hold_that_fills_the_caps_spills_and_the_mark_proves_what_it_dropped() {
    let (most, dropped, last) = spilled_replay(claim_over(0, 40, 3));
    assert_eq!((most, dropped), (10, 119));
    match last {
        Step::Drop(held) => assert_eq!(held.len(), 1, "only the first was kept"),
        other => panic!("the mark proves the replay: {other:?}"),
    }
    // Another history at the mark: what was dropped is not proven, and the session
    // must end before confirming any of it (no Release: the records are gone).
    let mut other = claim_over(0, 40, 3);
    let last_mark = other.marks.last_mut().unwrap();
    last_mark.commit_time += 1;
    let (_, _, last) = spilled_replay(other);
    assert!(matches!(last, Step::Unproven(Doubt::Mismatch)), "{last:?}");
}

/// A review found a bulk insert replayed after a spill keeping every row's identity:
/// the first held row, never done, kept the rest of its transaction in the row ledger.
#[test]
fn a_spilled_transaction_leaves_nothing_per_row_behind() {
    let mut c = from_100(Some(claim_over(0, 40, 3)), 0);
    let _ = c.begin(id(1_000, 0, 1_000));
    for i in 0..10_000u32 {
        let Ok(NextRow::Publish(row)) = c.next_row(u64::from(i)) else {
            panic!("no partial here");
        };
        let _ = c.hold(Ticket::from_index(i.try_into().unwrap()), 0, row);
        if i == 0 {
            assert!(c.spill().is_empty());
        }
    }
    let open = c.rows.open_done().unwrap();
    assert_eq!(open.rows, 10_000, "every row done, none pending");
}

#[test]
fn a_spilled_replay_claims_no_partial_transaction_until_proven() {
    let mut c = from_100(Some(claim_over(0, 40, 3)), 0);
    let _ = c.begin(id(1_000, 0, 1_000));
    let rows: Vec<Option<RowId>> = (0..3)
        .map(|i| match c.next_row(i) {
            Ok(NextRow::Publish(row)) => row,
            other => panic!("{other:?}"),
        })
        .collect();
    for (i, row) in (0..).zip(rows) {
        assert!(c.hold(Ticket::from_index(i), 0, row).is_none());
    }
    assert_eq!(c.spill().len(), 2);
    // Two rows count as done, unproven: a record written now must not name them.
    assert_eq!(c.claim_at(Lsn(100)).0.partial, None);
}

/// One session reads `rows` rows of the transaction at 700 (identities 0, 1, …),
/// acks the first `acked`, and returns the claim it writes.
fn partly_delivered(rows: u64, acked: u64) -> DeliveredPosition {
    let mut c = start(600, 9, 10);
    assert!(matches!(c.begin(id(700, 7, 70)), Step::Nothing));
    let ids: Vec<RowId> = (0..rows)
        .map(|i| match c.next_row(i) {
            Ok(NextRow::Publish(Some(row))) => row,
            other => panic!("{other:?}"),
        })
        .collect();
    for row in &ids[..usize::try_from(acked).unwrap()] {
        c.acked(*row);
    }
    c.claim_at(Lsn(600)).0
}

fn resume(claim: DeliveredPosition) -> ReplayCore<u32> {
    ReplayCore::new(ReplayStart {
        timeline: 1,
        start: Lsn(600),
        server_end: Lsn(1_000_000),
        claim: Some((claim, 42)),
        fingerprint: 7,
        foreign_writer: false,
        mark_every: 0,
        tracked_rows: usize::MAX,
        new_lineage: 1,
        doubt_lineage: 2,
    })
}

#[test]
fn the_leading_rows_of_a_partial_transaction_are_skipped_only_with_their_digest() {
    let claim = partly_delivered(5, 3);
    let p = claim.partial.unwrap();
    assert_eq!((p.rows, p.digest.is_some()), (3, true));
    // The genuine claim: the first three are in Kafka, the rest are published.
    let mut c = resume(claim.clone());
    assert!(matches!(c.begin(id(700, 7, 70)), Step::Resume { rows: 3 }));
    let verdicts: Vec<bool> = (0..5)
        .map(|i| matches!(c.next_row(i), Ok(NextRow::InKafka)))
        .collect();
    assert_eq!(verdicts, [true, true, true, false, false]);
    assert!(c.take_doubts().is_empty());
    // Its count raised by someone who may write the record: the digest of the first
    // five is not the recorded one, so the session ends before confirming any of it,
    // and the claim is given up (the next session publishes the transaction whole).
    let mut forged = claim.clone();
    forged.partial = Some(PartialTxn { rows: 5, ..p });
    let mut c = resume(forged);
    assert!(matches!(c.begin(id(700, 7, 70)), Step::Resume { rows: 5 }));
    for i in 0..4 {
        assert!(matches!(c.next_row(i), Ok(NextRow::InKafka)));
    }
    let mismatch = c.next_row(4).unwrap_err();
    assert_eq!(
        (mismatch.reason, mismatch.recorded, mismatch.read),
        (Doubt::PartialDigest, 5, 5)
    );
    assert_eq!(c.take_doubts(), [Doubt::PartialDigest]);
    let (next, _) = c.claim_at(Lsn(600));
    assert_eq!(next.partial, None, "the forged partial is not written back");
    let mut c = resume(next);
    assert!(matches!(c.begin(id(700, 7, 70)), Step::Nothing));
    assert!(matches!(c.next_row(0), Ok(NextRow::Publish(_))));
    // Other rows under the recorded count (another history's, or forged): the same.
    let mut c = resume(claim.clone());
    assert!(matches!(c.begin(id(700, 7, 70)), Step::Resume { rows: 3 }));
    assert!(matches!(c.next_row(0), Ok(NextRow::InKafka)));
    assert!(matches!(c.next_row(1), Ok(NextRow::InKafka)));
    assert!(c.next_row(99).is_err());
    // While the skipped rows are not checked yet, the record names what it read.
    let mut c = resume(claim);
    let _ = c.begin(id(700, 7, 70));
    assert!(matches!(c.next_row(0), Ok(NextRow::InKafka)));
    assert_eq!(c.claim_at(Lsn(600)).0.partial, Some(p));
}

#[test]
fn a_transaction_acked_whole_is_named_until_it_is_confirmed() {
    let mut c = start(600, 9, 10);
    let _ = c.begin(id(700, 7, 70));
    let rows: Vec<RowId> = (0..4)
        .map(|i| match c.next_row(i) {
            Ok(NextRow::Publish(Some(row))) => row,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(matches!(c.commit(Lsn(800)), Ok(Step::Nothing)));
    for row in rows {
        c.acked(row);
    }
    // Acked whole, not confirmed yet (the confirmed position waits for a look at the
    // publication): a restart now must not publish it again.
    let claim = c.claim_at(Lsn(600)).0;
    let p = claim.partial.unwrap();
    assert_eq!((p.txn, p.rows), (id(700, 7, 70), 4));
    let mut r = resume(claim);
    assert!(matches!(r.begin(id(700, 7, 70)), Step::Resume { rows: 4 }));
    assert!((0..4).all(|i| matches!(r.next_row(i), Ok(NextRow::InKafka))));
    assert!(matches!(r.commit(Lsn(800)), Ok(Step::Nothing)));
    // Confirmed: the mark names it, the partial is gone.
    let claim = c.claim_at(Lsn(800)).0;
    assert_eq!(claim.partial, None);
    assert_eq!(claim.newest_mark().map(|m| m.end_lsn), Some(Lsn(800)));
}

#[test]
fn a_session_with_nothing_to_prove_starts_a_claim_of_its_own() {
    let mut c = start(600, 9, 10);
    assert!(!c.holding());
    let (claim, lineage) = c.claim_at(Lsn(600));
    assert_eq!((claim.base, claim.marks.len(), lineage), (Lsn(600), 0, 9));
    // It names no transaction, but still the time of the last one before its
    // position: nothing it has not relayed committed before that.
    assert_eq!(claim.since, Some(1000));
}

#[test]
fn the_time_to_republish_from_is_the_newest_confirmed_commit_and_a_doubt_forgets_it() {
    let mut c = start(100, 1, 2);
    // Same position, another commit time: another history.
    let step = c.begin(id(500, 100, 3000));
    assert!(matches!(step, Step::Release(Doubt::Mismatch, _)));
    let (claim, _) = c.claim_at(Lsn(100));
    assert_eq!(
        claim.since, None,
        "a doubted claim's time is another history's"
    );
    assert!(c.commit(Lsn(510)).is_ok());
    let (claim, _) = c.claim_at(Lsn(510));
    assert_eq!(claim.since, Some(3000));
    // A later transaction with an earlier time (the server's clock stepped back).
    let _ = c.begin(id(800, 6, 2500));
    assert!(c.commit(Lsn(810)).is_ok());
    assert_eq!(c.claim_at(Lsn(810)).0.since, Some(2500));
}
