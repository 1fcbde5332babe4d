use pgoutput::Lsn;

use super::*;

type Life = LifeCore<&'static str>;
type Read = RecordRead<&'static str, &'static str>;

fn claim(timeline: u32, lsn: u64, lineage: u64) -> Claim {
    (DeliveredPosition::at(timeline, Lsn(lsn), 7), lineage)
}

fn server(host: &str) -> (String, u16) {
    (host.to_owned(), 5432)
}

fn view(ours: Option<Claim>) -> SlotView<&'static str, &'static str> {
    SlotView {
        ours,
        last_look: Some("recorded look"),
        other_cluster: None,
        backfill_unfinished: None,
        writers_alternate: false,
    }
}

/// A process that connected once and whose session ended with `claim` and `how`.
fn after_session(claim: Claim, how: Ended) -> Life {
    let mut life = Life::new(false);
    life.connected::<()>("7", 1, server("db1")).ok();
    life.session_ran(Some(claim), Some(("last look", true)));
    life.ended(how);
    life
}

#[test]
fn the_own_claim_comes_before_the_record() {
    let life = after_session(claim(1, 200, 2), Ended::Retry);
    assert!(!life.needs_record());
    let known = life.known(Read::Read(view(Some(claim(1, 100, 1))))).ok();
    let known = known.map(|k| (k.claim.map(|c| c.1), k.publication, k.read));
    assert_eq!(known, Some((Some(2), Some("last look"), true)));
}

#[test]
fn without_an_own_claim_the_record_is_read_and_taken() {
    let life = Life::new(false);
    assert!(life.needs_record());
    let known = life.known(Read::Read(view(Some(claim(1, 100, 1))))).ok();
    let known = known.map(|k| (k.claim.map(|c| c.1), k.publication, k.read, k.unrecorded));
    assert_eq!(known, Some((Some(1), Some("recorded look"), true, false)));
}

#[test]
fn an_unreadable_record_vouches_for_nothing_and_counts_as_read() {
    let known = Life::new(false).known(Read::Unreadable).ok();
    let known = known.map(|k| (k.claim.is_none(), k.read, k.unrecorded));
    assert_eq!(known, Some((true, true, true)));
}

#[test]
fn a_record_not_read_in_time_is_not_compared_yet() {
    let known = Life::new(false).known(Read::NotRead).ok();
    let known = known.map(|k| (k.claim.is_none(), k.read, k.unrecorded));
    assert_eq!(known, Some((true, false, false)));
}

#[test]
fn no_progress_record_kept_is_read_and_knows_nothing() {
    let known = Life::new(false).known(Read::NotKept).ok();
    assert_eq!(
        known.map(|k| (k.claim.is_none(), k.read)),
        Some((true, true))
    );
}

#[test]
fn alternating_writers_are_reported() {
    let mut v = view(Some(claim(1, 100, 1)));
    v.writers_alternate = true;
    let known = Life::new(false).known(Read::Read(v)).ok();
    assert_eq!(known.map(|k| k.foreign_writer), Some(true));
}

#[test]
fn another_clusters_record_and_an_unfinished_backfill_refuse_in_that_order() {
    let mut v = view(None);
    v.other_cluster = Some("other cluster");
    v.backfill_unfinished = Some("backfill");
    let life = Life::new(false);
    let refused = life.known(Read::Read(v.clone())).err();
    assert_eq!(refused, Some(Refusal::Record("other cluster")));
    v.other_cluster = None;
    let refused = life.known(Read::Read(v)).err();
    assert_eq!(refused, Some(Refusal::Record("backfill")));
}

#[test]
fn a_record_of_a_newer_timeline_refuses_the_server() {
    let mut life = Life::new(false);
    life.connected::<&str>("7", 2, server("db1")).ok();
    let refused = life.known(Read::Read(view(Some(claim(3, 100, 1))))).err();
    assert_eq!(
        refused,
        Some(Refusal::TimelineWentBack { seen: 3, found: 2 })
    );
    assert!(life.known(Read::Read(view(Some(claim(2, 100, 1))))).is_ok());
}

#[test]
fn another_cluster_and_an_older_timeline_are_refused_a_newer_reported_once() {
    let mut life = Life::new(false);
    let at = || server("db1");
    assert_eq!(life.connected::<()>("7", 1, at()), Ok(None));
    assert_eq!(life.connected::<()>("7", 2, at()), Ok(Some(1)));
    assert_eq!(life.connected::<()>("7", 2, at()), Ok(None));
    assert_eq!(
        life.connected::<()>("7", 1, at()),
        Err(Refusal::TimelineWentBack { seen: 2, found: 1 })
    );
    assert_eq!(
        life.connected::<()>("8", 2, at()),
        Err(Refusal::OtherSystem {
            expected: "7".into(),
            found: "8".into()
        })
    );
}

#[test]
fn a_new_timeline_or_another_server_drops_the_own_claim() {
    let mut life = after_session(claim(1, 200, 2), Ended::Retry);
    assert_eq!(life.connected::<()>("7", 1, server("db1")), Ok(None));
    assert!(life.carries_claim());
    assert_eq!(life.connected::<()>("7", 2, server("db1")), Ok(Some(1)));
    assert!(!life.carries_claim());

    let mut life = after_session(claim(1, 200, 2), Ended::Retry);
    life.connected::<()>("7", 1, server("db2")).ok();
    assert!(!life.carries_claim());
    assert!(life.needs_record());
}

#[test]
fn only_a_retry_carries_the_claim() {
    assert!(after_session(claim(1, 200, 2), Ended::Retry).carries_claim());
    for how in [Ended::SlotTaken, Ended::ProcessEnds] {
        let life = after_session(claim(1, 200, 2), how);
        assert!(!life.carries_claim(), "{how:?}");
        let known = life.known(Read::Read(view(Some(claim(1, 100, 1))))).ok();
        let known = known.map(|k| (k.claim.map(|c| c.1), k.publication));
        assert_eq!(known, Some((Some(1), Some("recorded look"))), "{how:?}");
    }
}

#[test]
fn exactly_once_never_carries_a_claim() {
    let mut life = Life::new(true);
    life.connected::<()>("7", 1, server("db1")).ok();
    life.session_ran(Some(claim(1, 200, 2)), None);
    life.ended(Ended::Retry);
    assert!(!life.carries_claim());
}

/// Exactly-once reads the record at every start: after a spilled replay was doubted, the
/// same record would make the next session drop the same rows and end the same way.
#[test]
fn after_an_unproven_replay_the_next_session_skips_nothing_and_the_one_after_trusts_again() {
    let mut life = Life::new(true);
    life.connected::<()>("7", 1, server("db1")).ok();
    life.session_ran(Some(claim(1, 200, 2)), None);
    life.replay_unproven();
    life.ended(Ended::Retry);
    let record = || Read::Read(view(Some(claim(1, 100, 1))));
    let known = life.known(record()).ok();
    let known = known.map(|k| (k.claim.is_none(), k.publication, k.read));
    assert_eq!(known, Some((true, Some("recorded look"), true)));
    life.session_ran(Some(claim(1, 300, 3)), None);
    life.ended(Ended::Retry);
    let known = life.known(record()).ok().and_then(|k| k.claim.map(|c| c.1));
    assert_eq!(known, Some(1), "the record is trusted again");
}
