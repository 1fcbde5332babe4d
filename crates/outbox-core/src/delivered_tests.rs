use super::*;

/// The digest of rows with these identities, in order.
fn digest(ids: std::ops::Range<u64>) -> Option<u64> {
    Some(ids.fold(RowDigest::default(), RowDigest::push).value())
}

fn id(lsn: u64, xid: u32) -> TxnId {
    TxnId {
        commit_lsn: Lsn(lsn),
        xid,
        commit_time: i64::from(xid) * 1000,
    }
}

/// A claim whose marks are the transactions at `lsns` (each ends 10 bytes later).
fn claim(lsns: &[u64]) -> DeliveredPosition {
    let mut d = DeliveredPosition::at(1, Lsn(50), 7);
    for (i, &l) in lsns.iter().enumerate() {
        let xid = u32::try_from(i).unwrap() + 100;
        d.push_mark(id(l, xid), Lsn(l + 10));
        d.lsn = Lsn(l + 10);
    }
    d
}

#[test]
fn held_transactions_are_proven_by_the_recorded_one_and_only_by_it() {
    let known = claim(&[500, 900]);
    let (mut p, doubt) = ReplayProof::new(&known, 7, Lsn(100));
    assert_eq!(doubt, None);
    assert!(p.holding());
    assert_eq!(p.on_begin(id(200, 1)), Begin::Hold);
    assert_eq!(p.on_commit(Lsn(210)), None);
    assert_eq!(p.on_begin(id(500, 100)), Begin::Hold);
    assert_eq!(p.on_commit(Lsn(510)), Some(Settle::Proven));
    assert!(p.holding(), "the next mark");
    assert_eq!(p.on_begin(id(900, 101)), Begin::Hold);
    assert_eq!(p.on_commit(Lsn(910)), Some(Settle::Proven));
    assert!(!p.holding());
    assert_eq!(p.on_begin(id(1000, 102)), Begin::Publish);
}

#[test]
fn nothing_before_the_claims_base_is_held() {
    let mut known = claim(&[500]);
    known.base = Lsn(300);
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(100));
    assert_eq!(
        p.on_begin(id(200, 1)),
        Begin::Publish,
        "relayed under other settings"
    );
    assert_eq!(p.on_begin(id(300, 2)), Begin::Hold);
    assert_eq!(p.on_begin(id(500, 100)), Begin::Hold);
    assert_eq!(p.on_commit(Lsn(510)), Some(Settle::Proven));
}

#[test]
fn any_difference_at_the_recorded_position_publishes_what_is_held() {
    let known = claim(&[500]);
    for other in [
        TxnId {
            xid: 1,
            ..id(500, 100)
        },
        TxnId {
            commit_time: 1,
            ..id(500, 100)
        },
        id(600, 100),
    ] {
        let (mut p, _) = ReplayProof::new(&known, 7, Lsn(100));
        assert_eq!(p.on_begin(id(200, 1)), Begin::Hold);
        assert_eq!(p.on_begin(other), Begin::Release(Doubt::Mismatch));
        assert!(!p.holding());
    }
    // Same Begin, another end.
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(100));
    assert_eq!(p.on_begin(id(500, 100)), Begin::Hold);
    assert_eq!(
        p.on_commit(Lsn(511)),
        Some(Settle::Release(Doubt::Mismatch))
    );
    // A keepalive past the mark: the stream never showed it.
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(100));
    assert_eq!(p.on_keepalive(Lsn(509)), None);
    assert_eq!(
        p.on_keepalive(Lsn(510)),
        Some(Settle::Release(Doubt::Passed))
    );
}

#[test]
fn a_claim_is_refused_whole_for_other_settings_or_past_the_server_end() {
    let known = claim(&[500]);
    let (p, d) = ReplayProof::new(&known, 8, Lsn(100));
    assert_eq!((p.holding(), d), (false, Some(Doubt::Fingerprint)));
    // Nothing past the start to prove: no doubt, nothing held.
    let (p, d) = ReplayProof::new(&known, 8, Lsn(510));
    assert_eq!((p.holding(), d), (false, None));
    // Past the server's end: only the marks it can show are kept.
    let mut two = claim(&[500, 900]);
    two.partial = Some(PartialTxn {
        txn: id(950, 1),
        rows: 2,
        digest: Some(5),
    });
    assert_eq!(two.within(Lsn(10_000)), None);
    let cut = two.within(Lsn(600)).unwrap();
    assert_eq!(cut.marks.len(), 1);
    assert_eq!(cut.base, Lsn(50));
    assert_eq!((cut.lsn, cut.partial), (Lsn(510), None));
    assert_eq!(claim(&[900]).within(Lsn(600)).unwrap().marks, vec![]);
}

#[test]
fn the_partial_transaction_needs_its_exact_identity() {
    let mut known = claim(&[500]);
    known.partial = Some(PartialTxn {
        txn: id(800, 9),
        rows: 3,
        digest: Some(5),
    });
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(510));
    assert!(!p.holding());
    assert_eq!(p.on_begin(id(700, 8)), Begin::Publish);
    assert_eq!(
        p.on_begin(id(800, 9)),
        Begin::SkipRows { rows: 3, digest: 5 }
    );
    assert_eq!(p.on_begin(id(800, 9)), Begin::Publish, "once");
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(510));
    assert_eq!(
        p.on_begin(TxnId {
            xid: 10,
            ..id(800, 9)
        }),
        Begin::Publish
    );
    assert_eq!(p.partial(), None);
    // A count without a digest (a record from before digests) proves nothing.
    let mut undigested = known.clone();
    undigested.partial = undigested.partial.map(|p| PartialTxn { digest: None, ..p });
    let (mut p, _) = ReplayProof::new(&undigested, 7, Lsn(510));
    assert_eq!(p.on_begin(id(800, 9)), Begin::Release(Doubt::PartialDigest));
    assert_eq!(p.partial(), None);
    // Behind an unproven mark: the mark decides first.
    let (mut p, _) = ReplayProof::new(&known, 7, Lsn(100));
    assert_eq!(p.on_begin(id(800, 9)), Begin::Release(Doubt::Mismatch));
    assert_eq!(p.partial(), None);
}

#[test]
fn marks_thin_out_with_age_and_stay_few() {
    let mut d = DeliveredPosition::at(1, Lsn::ZERO, 0);
    for i in 1..=100_000u64 {
        d.push_mark(id(i * 100, 1), Lsn(i * 100 + 10));
    }
    assert!(d.marks.len() <= 180, "{}", d.marks.len());
    let seqs: Vec<u64> = d.marks.iter().map(|m| m.seq).collect();
    assert_eq!(seqs.last(), Some(&100_000));
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    // The newest 40 writes are all there; none of the last 300 more than 8 apart; the
    // oldest kept is ~2500 writes back.
    assert!(seqs.ends_with(&(99_961..=100_000).collect::<Vec<_>>()));
    let recent: Vec<u64> = seqs.iter().copied().filter(|s| *s > 99_700).collect();
    assert!(recent.windows(2).all(|w| w[1] - w[0] <= 8), "{recent:?}");
    assert!(100_000 - seqs[0] >= 2400, "{seqs:?}");
    // No repeat of an older position.
    let before = d.marks.len();
    d.push_mark(id(5, 1), Lsn(15));
    assert_eq!(d.marks.len(), before);
}

#[test]
fn fingerprints_depend_on_names_and_values() {
    let a = Fingerprint::default()
        .add("table", "public.outbox")
        .finish();
    let b = Fingerprint::default()
        .add("table", "public.outbox2")
        .finish();
    let c = Fingerprint::default()
        .add("tabl", "epublic.outbox")
        .finish();
    assert_ne!(a, b);
    assert_ne!(a, c);
    assert_eq!(
        a,
        Fingerprint::default()
            .add("table", "public.outbox")
            .finish()
    );
}

#[test]
fn the_ledger_counts_only_the_leading_done_rows() {
    let mut l = RowLedger::default();
    l.begin(id(100, 1));
    let rows: Vec<RowId> = (0..5).map(|i| l.next_row(i).unwrap()).collect();
    assert_eq!(l.open_rows(), 5);
    assert_eq!(l.partial(Lsn(0)), None);
    l.done(rows[1]);
    l.done(rows[2]);
    assert_eq!(l.partial(Lsn(0)), None, "row 0 is not acked yet");
    l.done(rows[0]);
    assert_eq!(
        l.partial(Lsn(0)),
        Some(PartialTxn {
            txn: id(100, 1),
            rows: 3,
            digest: digest(0..3),
        }),
        "acked out of order, digested in order"
    );
    assert_eq!(l.partial(Lsn(101)), None, "covered by the watermark");
    l.commit();
    l.done(rows[4]);
    assert_eq!(l.partial(Lsn(0)).map(|p| p.rows), Some(3));
    l.done(rows[3]);
    assert!(l.is_empty(), "a finished transaction leaves the ledger");
    assert_eq!(l.next_row(9), None, "outside a transaction");
    // Until the confirmed position passes it, it is still named, whole.
    let whole = Some(PartialTxn {
        txn: id(100, 1),
        rows: 5,
        digest: digest(0..5),
    });
    assert_eq!(l.partial(Lsn(0)), whole);
    l.confirmed(Lsn(50));
    assert_eq!(l.partial(Lsn(50)), whole);
    l.confirmed(Lsn(110));
    assert_eq!(l.partial(Lsn(0)), None, "confirmed: forgotten");
}

#[test]
fn a_digest_depends_on_every_identity_and_their_order() {
    let d = |ids: &[u64]| {
        ids.iter()
            .copied()
            .fold(RowDigest::default(), RowDigest::push)
    };
    assert_ne!(d(&[1, 2, 3]), d(&[1, 2]));
    assert_ne!(d(&[1, 2, 3]), d(&[1, 3, 2]));
    assert_ne!(d(&[1, 2, 3]), d(&[1, 2, 3, 4]));
    assert_eq!(d(&[1, 2, 3]), d(&[1, 2, 3]));
    assert_ne!(row_identity(b't', b"1"), row_identity(b'b', b"1"));
}

/// A row stuck unacked while the rest of a bulk insert is acked: the ledger has no room
/// once its limit of rows is kept, and room again once the row is acked.
#[test]
fn a_stuck_row_fills_the_ledger_to_its_limit() {
    let mut l = RowLedger::new(4);
    l.begin(id(100, 1));
    let mut rows = Vec::new();
    while l.has_room() && rows.len() < 100 {
        rows.push(l.next_row(u64::try_from(rows.len()).unwrap()).unwrap());
        if let Some(row) = rows.get(1..).and_then(<[RowId]>::last) {
            l.done(*row);
        }
    }
    assert_eq!(rows.len(), 4, "row 0 unacked: reading waits at the limit");
    l.done(rows[0]);
    assert!(l.has_room());
    assert_eq!(
        l.partial(Lsn(0)),
        Some(PartialTxn {
            txn: id(100, 1),
            rows: 4,
            digest: digest(0..4),
        })
    );
}

proptest::proptest! {
    /// Whatever the acks' order, a claim names only leading rows all done, with their
    /// digest, and room is judged on the rows really kept.
    #[test]
    fn a_claim_names_only_leading_done_rows(
        limit in 0usize..12,
        order in proptest::collection::vec(0usize..1000, 0..60),
    ) {
        let mut l = RowLedger::new(limit);
        let mut done = Vec::new();
        let mut ids = Vec::new();
        for t in 0..3u64 {
            l.begin(id(100 + 10 * t, 1 + u32::try_from(t).unwrap()));
            for r in 0..20u64 {
                ids.push(l.next_row(t * 100 + r).unwrap());
            }
            l.commit();
        }
        for pick in order {
            let row = ids[pick % ids.len()];
            l.done(row);
            done.push(row);
            let pending: usize = l.txns.values().map(|t| t.pending.len()).sum();
            proptest::prop_assert_eq!(l.kept, pending);
            proptest::prop_assert_eq!(l.has_room(), pending < limit);
            for t in 0..3u64 {
                let lsn = Lsn(100 + 10 * t);
                let claimed = l.partial(lsn).filter(|p| p.txn.commit_lsn == lsn);
                if let Some(p) = claimed {
                    for i in 0..p.rows {
                        let row = RowId { commit_lsn: lsn, index: i };
                        proptest::prop_assert!(done.contains(&row), "{:?} claimed, not done", row);
                    }
                    let expect = (t * 100..t * 100 + p.rows)
                        .fold(RowDigest::default(), RowDigest::push)
                        .value();
                    proptest::prop_assert_eq!(p.digest, Some(expect));
                }
            }
        }
    }
}
