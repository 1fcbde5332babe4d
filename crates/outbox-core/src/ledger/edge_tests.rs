//! The ledger's edge cases that could let the flush position pass an unacked row: a slab
//! slot reused by another transaction, a refused message replaced by its dead letter, a
//! send error before the Commit, a non-transactional message and a keepalive, reports
//! that are not in flight, and the slab's size under the caps.

use pgoutput::Lsn;

use super::{InFlightLedger, Outcome, Outgoing, Ticket};
use crate::budget::InFlightCaps;
use crate::delivered::RowId;
use crate::error::AckError;

const CAPS: InFlightCaps = InFlightCaps {
    max_messages: 64,
    max_bytes: 1 << 20,
};

fn msg(bytes: usize) -> Outgoing<'static> {
    Outgoing {
        topic: "orders",
        bytes,
        commit_unix_micros: 0,
        row: None,
    }
}

#[test]
fn a_reused_slot_settles_the_transaction_of_its_new_message() {
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    let a1 = l.produced(msg(1)).unwrap();
    let a2 = l.produced(msg(1)).unwrap();
    l.commit(Lsn(200)).unwrap();
    l.begin().unwrap();
    l.delivered(a1, Outcome::Acked).unwrap();
    // The freed slot goes to the next message, of another transaction.
    let b1 = l.produced(msg(1)).unwrap();
    assert_eq!(b1, a1);
    // Its report is B's: A still waits for a2, so W stays.
    l.delivered(b1, Outcome::Acked).unwrap();
    assert_eq!(l.watermark(), Lsn(100));
    assert_eq!(l.acks().in_flight_messages(), 1);
    l.delivered(a2, Outcome::Acked).unwrap();
    assert_eq!(l.watermark(), Lsn(200), "B is still open");
    l.commit(Lsn(300)).unwrap();
    assert_eq!(l.watermark(), Lsn(300));
    assert!(l.is_empty() && l.acks().is_idle());
}

#[test]
fn a_dead_letter_in_a_refused_slot_holds_its_transaction_behind_earlier_ones() {
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    let a1 = l.produced(msg(1)).unwrap();
    l.commit(Lsn(200)).unwrap();
    l.begin().unwrap();
    let row = Some(RowId {
        commit_lsn: Lsn(250),
        index: 0,
    });
    let too_big = l.produced(Outgoing { row, ..msg(900) }).unwrap();
    let refused = l.refused(too_big).unwrap();
    assert_eq!(refused.row, row);
    // A second refusal (or a report) for it is not in flight any more.
    assert_eq!(
        l.refused(too_big).unwrap_err(),
        AckError::UnknownDelivery {
            ticket: too_big.index()
        }
    );
    let dead_letter = l.produced(Outgoing { row, ..msg(50) }).unwrap();
    assert_eq!(dead_letter, too_big, "the dead letter takes the freed slot");
    l.commit(Lsn(300)).unwrap();
    assert_eq!((l.len(), l.bytes()), (2, 51));
    assert_eq!(l.delivered(dead_letter, Outcome::Acked).unwrap().row, row);
    assert_eq!(l.watermark(), Lsn(100), "A's message is not acked");
    l.delivered(a1, Outcome::Acked).unwrap();
    assert_eq!(l.watermark(), Lsn(300));
}

#[test]
fn a_refused_message_without_its_dead_letter_never_completes_an_open_transaction() {
    // BadRowPolicy::Stop: the refused row is not replaced and the session stops. Until
    // then nothing of the open transaction may be confirmed, keepalives included.
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    let t = l.produced(msg(900)).unwrap();
    l.refused(t).unwrap();
    assert!(l.is_empty());
    assert!(l.in_transaction());
    assert!(!l.on_keepalive(Lsn(500)));
    assert_eq!(l.watermark(), Lsn(100));
}

#[test]
fn a_send_error_before_the_commit_freezes_the_watermark() {
    // A send error other than too-large or queue-full is settled as a failed delivery
    // while its transaction is still open.
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    let a1 = l.produced(msg(1)).unwrap();
    let a2 = l.produced(msg(1)).unwrap();
    l.delivered(a2, Outcome::Failed).unwrap();
    assert!(l.is_failed());
    l.commit(Lsn(200)).unwrap();
    l.delivered(a1, Outcome::Acked).unwrap();
    assert!(l.is_empty());
    assert_eq!(l.watermark(), Lsn(100));
    for end in [300, 400] {
        l.begin().unwrap();
        l.commit(Lsn(end)).unwrap();
    }
    assert!(!l.on_keepalive(Lsn(500)));
    assert_eq!(l.watermark(), Lsn(100));
}

#[test]
fn a_non_transactional_message_holds_keepalives_until_acked() {
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    l.commit(Lsn(200)).unwrap();
    assert_eq!(l.watermark(), Lsn(200));
    // As the session does: a transaction of its own, committed at the last end_lsn.
    l.begin().unwrap();
    let m = l.produced(msg(1)).unwrap();
    l.commit(Lsn(200)).unwrap();
    assert!(!l.in_transaction());
    assert!(!l.on_keepalive(Lsn(500)));
    assert_eq!(l.watermark(), Lsn(200));
    l.delivered(m, Outcome::Acked).unwrap();
    assert_eq!(l.watermark(), Lsn(200), "never past the last commit read");
    assert!(l.on_keepalive(Lsn(500)));
    assert_eq!(l.watermark(), Lsn(500));
}

#[test]
fn reports_not_in_flight_change_nothing() {
    let mut l = InFlightLedger::new(Lsn(100), CAPS);
    l.begin().unwrap();
    let a1 = l.produced(msg(7)).unwrap();
    l.commit(Lsn(200)).unwrap();
    for outcome in [Outcome::Acked, Outcome::Failed] {
        for index in [a1.index() + 1, 1000, usize::MAX] {
            assert_eq!(
                l.delivered(Ticket::from_index(index), outcome).unwrap_err(),
                AckError::UnknownDelivery { ticket: index }
            );
        }
    }
    assert_eq!((l.len(), l.bytes()), (1, 7));
    assert_eq!(l.acks().in_flight_messages(), 1);
    assert_eq!(l.watermark(), Lsn(100));
    l.delivered(a1, Outcome::Acked).unwrap();
    assert_eq!(l.watermark(), Lsn(200));
}

#[test]
fn the_slab_stays_within_the_caps_however_many_messages_pass() {
    // The session's loop: read (and produce) only while there is room; some messages are
    // refused and replaced by a dead letter; reports come back in a scrambled order.
    let caps = InFlightCaps {
        max_messages: 32,
        max_bytes: 10_000,
    };
    let mut l = InFlightLedger::new(Lsn(0), caps);
    let mut flying: Vec<Ticket> = Vec::new();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut end = 0;
    let mut open = false;
    let mut produced = 0u64;
    while produced < 200_000 {
        let r = next();
        if l.has_room() && r % 3 != 0 {
            if !open {
                l.begin().unwrap();
                open = true;
            }
            let bytes = usize::try_from(r % 700).unwrap();
            let t = l.produced(msg(bytes)).unwrap();
            let t = if r % 11 == 0 {
                l.refused(t).unwrap();
                l.produced(msg(10)).unwrap()
            } else {
                t
            };
            flying.push(t);
            produced += 1;
            if r % 5 == 0 {
                end += 10;
                l.commit(Lsn(end)).unwrap();
                open = false;
            }
        } else if !flying.is_empty() {
            let i = usize::try_from(r % u64::try_from(flying.len()).unwrap()).unwrap();
            l.delivered(flying.swap_remove(i), Outcome::Acked).unwrap();
        }
        assert!(l.len() <= caps.max_messages);
        assert!(
            l.slab.slot_count() <= caps.max_messages,
            "{} slots",
            l.slab.slot_count()
        );
        assert!(l.acks().open_transactions() <= 2 * (l.len() + 2));
    }
    for t in flying.drain(..) {
        l.delivered(t, Outcome::Acked).unwrap();
    }
    if open {
        end += 10;
        l.commit(Lsn(end)).unwrap();
    }
    assert_eq!(l.watermark(), Lsn(end));
    assert!(l.is_empty() && l.acks().is_idle());
    assert!(l.slab.slot_count() <= caps.max_messages);
}
