//! Model-based checks of the whole tracker: simulated sessions with acks, refusals,
//! failures and keepalives in any order, against the rules in the parent module's docs.

use proptest::prelude::*;

use super::*;

/// One step of a simulated session.
#[derive(Debug, Clone)]
enum Step {
    /// Feed the next stream event (Begin, message, Commit, or an idle keepalive).
    Stream,
    /// Deliver (ack) the outstanding message at this index modulo the count.
    Ack(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![Just(Step::Stream), any::<usize>().prop_map(Step::Ack)]
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Begin,
    Message,
    Commit,
    /// A keepalive read between transactions; wal_end never beyond the next commit.
    Keepalive(u64),
    /// A keepalive with an arbitrary (possibly huge) wal_end inside a transaction.
    KeepaliveInside(u64),
}

/// Transactions as (message count, commit_lsn, end_lsn), in WAL order; many without
/// messages (zero-row, or only ignored content), which the tracker merges.
fn transactions() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    let count = prop_oneof![2 => Just(0usize), 3 => 0usize..5];
    prop::collection::vec((count, 0u64..40, 1u64..40), 0..40).prop_map(|v| {
        let mut pos = 1000;
        v.into_iter()
            .map(|(n, gap, len)| {
                let commit = pos + gap;
                let end = commit + len;
                pos = end;
                (n, commit, end)
            })
            .collect()
    })
}

fn events(txns: &[(usize, u64, u64)], start: u64) -> Vec<Event> {
    let mut out = Vec::new();
    let mut prev_end = start;
    for &(n, commit, end) in txns {
        // Idle keepalive: anything in [prev_end, commit] is legal (sentPtr <= next commit).
        out.push(Event::Keepalive(prev_end + (commit - prev_end) / 2));
        out.push(Event::Begin);
        for i in 0..n {
            out.push(Event::Message);
            if i == 0 {
                out.push(Event::KeepaliveInside(u64::MAX - 1));
            }
        }
        out.push(Event::Commit);
        prev_end = end;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn watermark_is_safe_monotonic_and_complete(
        txns in transactions(),
        steps in prop::collection::vec(step(), 0..300),
        tail_order in prop::collection::vec(any::<usize>(), 60),
    ) {
        let start = 1000;
        let mut t = AckTracker::new(Lsn(start));
        let evs = events(&txns, start);
        let mut ev_i = 0;
        let mut txn_i = 0; // index of the next transaction to Begin
        // Outstanding messages' seqs with their transaction index.
        let mut outstanding: Vec<(TxnSeq, usize)> = Vec::new();
        // Unacked message count per transaction; committed flags.
        let mut unacked = vec![0usize; txns.len()];
        let mut committed = vec![false; txns.len()];
        let mut last_w = t.watermark();

        let check = |t: &AckTracker, last_w: &mut Lsn, unacked: &[usize], committed: &[bool]| {
            let w = t.watermark();
            prop_assert!(w >= *last_w, "watermark went back: {:?} -> {:?}", last_w, w);
            *last_w = w;
            // The first transaction not fully done bounds W by its commit_lsn (so it
            // is re-sent on restart): W <= commit_lsn < end_lsn.
            let first_undone = (0..txns.len()).find(|&i| !committed[i] || unacked[i] > 0);
            if let Some(i) = first_undone {
                prop_assert!(w.0 <= txns[i].1,
                    "W {} passed txn {} (commit {}, end {}) with unacked messages", w.0, i, txns[i].1, txns[i].2);
            }
            // And W is not late: it covers the whole completed prefix at once.
            let done = first_undone.unwrap_or(txns.len());
            if let Some(last_done) = done.checked_sub(1) {
                prop_assert!(w.0 >= txns[last_done].2,
                    "W {} lags the completed prefix ending at {}", w.0, txns[last_done].2);
            }
            // Bookkeeping is bounded by the messages in flight, not by transactions.
            let in_flight = usize::try_from(t.in_flight_messages()).unwrap();
            prop_assert!(t.open_transactions() <= 2 * (in_flight + 2),
                "{} queue entries with {} messages in flight", t.open_transactions(), in_flight);
            Ok(())
        };

        let feed = |t: &mut AckTracker, ev_i: &mut usize, txn_i: &mut usize,
                        outstanding: &mut Vec<(TxnSeq, usize)>, unacked: &mut [usize],
                        committed: &mut [bool]| {
            let Some(ev) = evs.get(*ev_i).copied() else { return false };
            *ev_i += 1;
            match ev {
                Event::Begin => t.begin().unwrap(),
                Event::Message => {
                    let tk = t.track_message().unwrap();
                    outstanding.push((tk, *txn_i));
                    unacked[*txn_i] += 1;
                }
                Event::Commit => {
                    t.commit(Lsn(txns[*txn_i].2)).unwrap();
                    committed[*txn_i] = true;
                    *txn_i += 1;
                }
                Event::Keepalive(w) | Event::KeepaliveInside(w) => {
                    let idle = t.is_idle();
                    let before = t.watermark();
                    let moved = t.on_keepalive(Lsn(w));
                    if !idle {
                        assert!(!moved);
                        assert_eq!(t.watermark(), before);
                    }
                }
            }
            true
        };

        for s in &steps {
            match s {
                Step::Stream => {
                    feed(&mut t, &mut ev_i, &mut txn_i, &mut outstanding, &mut unacked, &mut committed);
                }
                Step::Ack(k) => {
                    if !outstanding.is_empty() {
                        let (tk, ti) = outstanding.swap_remove(k % outstanding.len());
                        t.ack(tk).unwrap();
                        unacked[ti] -= 1;
                    }
                }
            }
            check(&t, &mut last_w, &unacked, &committed)?;
        }
        // Finish the stream, then deliver everything left in a random order.
        while feed(&mut t, &mut ev_i, &mut txn_i, &mut outstanding, &mut unacked, &mut committed) {
            check(&t, &mut last_w, &unacked, &committed)?;
        }
        let mut r = tail_order.iter().cycle();
        while !outstanding.is_empty() {
            let k = r.next().copied().unwrap_or(0);
            let (tk, ti) = outstanding.swap_remove(k % outstanding.len());
            t.ack(tk).unwrap();
            unacked[ti] -= 1;
            check(&t, &mut last_w, &unacked, &committed)?;
        }
        prop_assert!(t.is_idle());
        prop_assert_eq!(t.in_flight_messages(), 0);
        let expected = txns.last().map_or(start, |x| x.2);
        prop_assert_eq!(t.watermark(), Lsn(expected));
    }

    #[test]
    fn failure_freezes_forever(
        sizes in prop::collection::vec(1usize..4, 1..8),
        fail_at in any::<usize>(),
        order in prop::collection::vec(any::<usize>(), 40),
    ) {
        let mut t = AckTracker::new(Lsn(0));
        let mut seqs = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            t.begin().unwrap();
            for _ in 0..*n {
                seqs.push(t.track_message().unwrap());
            }
            t.commit(Lsn(10 * (u64::try_from(i).unwrap() + 1))).unwrap();
        }
        let failed = seqs.swap_remove(fail_at % seqs.len());
        // Deliver some first, then the failure, then the rest.
        let mut r = order.iter().cycle();
        let split = fail_at % (seqs.len() + 1);
        for _ in 0..split {
            let k = r.next().copied().unwrap_or(0) % seqs.len();
            t.ack(seqs.swap_remove(k)).unwrap();
        }
        t.fail(failed).unwrap();
        let frozen = t.watermark();
        while !seqs.is_empty() {
            let k = r.next().copied().unwrap_or(0) % seqs.len();
            t.ack(seqs.swap_remove(k)).unwrap();
            prop_assert_eq!(t.watermark(), frozen);
        }
        prop_assert!(!t.on_keepalive(Lsn(u64::MAX)));
        prop_assert_eq!(t.watermark(), frozen);
        // W stops below the failed message's transaction (seq = transaction index).
        prop_assert!(frozen.0 < 10 * (failed.to_u64() + 1));
        prop_assert_eq!(t.in_flight_messages(), 0);
    }

    /// Acks, refusals (untrack + a dead-letter replacement) and failures in any
    /// order against a plain model: W never passes the commit of a transaction with
    /// an unacked message, never moves after a failure, and the queue stays bounded.
    #[test]
    fn untrack_and_fail_against_a_model(
        ops in prop::collection::vec((0u8..6, any::<usize>()), 0..400),
    ) {
        let mut t = AckTracker::new(Lsn(100));
        // (commit_lsn, end_lsn, unacked) per transaction in stream order.
        let mut model: Vec<(u64, Option<u64>, usize)> = Vec::new();
        let mut outstanding: Vec<(TxnSeq, usize)> = Vec::new();
        let mut pos = 100u64;
        let mut open = false;
        let mut frozen: Option<Lsn> = None;
        let mut last_w = t.watermark();
        for (op, k) in ops {
            match op {
                0 if !open => {
                    t.begin().unwrap();
                    model.push((pos + 1, None, 0));
                    open = true;
                }
                1 if open => {
                    let i = model.len() - 1;
                    let tk = t.track_message().unwrap();
                    if k % 3 == 0 {
                        // Refused by the producer: a dead letter replaces it.
                        t.untrack(tk).unwrap();
                        let dl = t.track_message().unwrap();
                        outstanding.push((dl, i));
                    } else {
                        outstanding.push((tk, i));
                    }
                    model[i].2 += 1;
                }
                2 if open => {
                    let i = model.len() - 1;
                    pos += 2;
                    model[i].0 = pos;
                    pos += 1 + u64::try_from(k % 5).unwrap();
                    model[i].1 = Some(pos);
                    t.commit(Lsn(pos)).unwrap();
                    open = false;
                }
                3 | 4 if !outstanding.is_empty() => {
                    let (tk, i) = outstanding.swap_remove(k % outstanding.len());
                    if op == 4 && k % 7 == 0 {
                        t.fail(tk).unwrap();
                        frozen.get_or_insert(t.watermark());
                    } else {
                        t.ack(tk).unwrap();
                    }
                    model[i].2 -= 1;
                }
                5 if !open => {
                    t.on_keepalive(Lsn(pos));
                }
                _ => {}
            }
            let w = t.watermark();
            prop_assert!(w >= last_w);
            last_w = w;
            if let Some(f) = frozen {
                prop_assert_eq!(w, f, "W moved after a failure");
            }
            if let Some(&(commit, _, _)) = model.iter().find(|m| m.1.is_none() || m.2 > 0) {
                prop_assert!(w.0 < commit, "W {} passed an undone commit {}", w.0, commit);
            }
            let in_flight = usize::try_from(t.in_flight_messages()).unwrap();
            prop_assert_eq!(in_flight, outstanding.len());
            prop_assert!(t.open_transactions() <= 2 * (in_flight + 2));
        }
        if frozen.is_none() && !open && outstanding.is_empty() {
            prop_assert_eq!(t.watermark().0, model.last().and_then(|m| m.1).unwrap_or(100).max(last_w.0));
        }
    }
}
