use pgoutput::Lsn;

use super::{CatalogLook, Look, Looked, PublicationWatch, WatchStop};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    identity: u32,
    wal_lsn: u64,
}

impl CatalogLook for Seen {
    fn same_catalog(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

fn seen(identity: u32, wal_lsn: u64) -> Seen {
    Seen { identity, wal_lsn }
}

fn look(identity: u32, wal_lsn: u64, settled: bool) -> Look<Seen> {
    Look {
        seen: Some(seen(identity, wal_lsn)),
        settled,
        settle_end: None,
    }
}

#[test]
fn a_matching_look_raises_the_cap_to_what_was_acked_when_it_began() {
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.begin(Lsn(100));
    assert_eq!(
        w.looked(look(1, 120, true), Lsn(10_000)),
        Ok(Looked::Counts {
            raise_cap: Some(Lsn(100)),
            settled_again: false
        })
    );
    assert_eq!(w.last(), &seen(1, 120));
}

#[test]
fn a_look_not_settled_counts_for_nothing_and_keeps_the_last_matching_look() {
    // A commit changing the publication is decoded but waits for a synchronous standby:
    // the look sees the old catalog.
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.begin(Lsn(100));
    assert_eq!(
        w.looked(look(1, 120, false), Lsn(10_000)),
        Ok(Looked::Unsettled { first: true })
    );
    assert_eq!(w.last(), &seen(1, 10));
    w.begin(Lsn(150));
    assert_eq!(
        w.looked(look(1, 160, false), Lsn(10_000)),
        Ok(Looked::Unsettled { first: false })
    );
    assert!(!w.early_look_wanted(0, Lsn(150), Lsn(10)));
    // Visible now: the change is named from the last look that counted, not the unsettled.
    w.begin(Lsn(170));
    assert_eq!(
        w.looked(look(2, 180, true), Lsn(10_000)),
        Err(WatchStop::Changed { since: seen(1, 10) })
    );
}

#[test]
fn looks_count_again_once_settled() {
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.begin(Lsn(100));
    assert!(w.looked(look(1, 120, false), Lsn(10_000)).is_ok());
    w.begin(Lsn(130));
    assert_eq!(
        w.looked(look(1, 140, true), Lsn(10_000)),
        Ok(Looked::Counts {
            raise_cap: Some(Lsn(130)),
            settled_again: true
        })
    );
}

#[test]
fn a_dropped_publication_stops() {
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    let gone = Look {
        seen: None,
        settled: true,
        settle_end: None,
    };
    assert_eq!(w.looked(gone, Lsn(10_000)), Err(WatchStop::Dropped));
}

#[test]
fn nothing_is_raised_until_the_start_is_compared_with_the_record() {
    let mut w = PublicationWatch::new(seen(1, 10), false, true);
    w.begin(Lsn(100));
    assert_eq!(
        w.looked(look(1, 120, true), Lsn(10_000)),
        Ok(Looked::Counts {
            raise_cap: None,
            settled_again: false
        })
    );
    assert!(!w.early_look_wanted(0, Lsn(100), Lsn(10)));
    assert_eq!(w.record_read(Some(&seen(1, 5))), Ok(()));
    assert!(w.compared());
    // A settled start keeps its own look as the baseline.
    assert_eq!(w.last(), &seen(1, 120));
}

#[test]
fn an_unsettled_start_gives_way_to_the_records_look() {
    let mut w = PublicationWatch::new(seen(1, 50), false, false);
    assert_eq!(w.record_read(Some(&seen(1, 5))), Ok(()));
    assert_eq!(w.last(), &seen(1, 5));
    let mut w = PublicationWatch::new(seen(1, 50), false, false);
    assert_eq!(w.record_read(None), Err(WatchStop::StandbysUnsettled));
    let mut w = PublicationWatch::new(seen(2, 50), false, true);
    assert_eq!(
        w.record_read(Some(&seen(1, 5))),
        Err(WatchStop::Changed { since: seen(1, 5) })
    );
}

#[test]
fn a_guard_names_its_commit_and_a_look_without_begin_raises_nothing() {
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.guard(seen(1, 300));
    assert_eq!(
        w.looked(look(2, 320, true), Lsn(10_000)),
        Err(WatchStop::Changed {
            since: seen(1, 300)
        })
    );
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    assert_eq!(
        w.looked(look(1, 20, true), Lsn(10_000)),
        Ok(Looked::Counts {
            raise_cap: None,
            settled_again: false
        })
    );
}

#[test]
fn a_second_guard_before_a_look_counts_keeps_the_first_commit() {
    // The first change's look waits for its standby; a second change (the table put
    // back) follows: rows between the two commits were hidden, so a change seen later
    // is named from the first.
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.guard(seen(1, 300));
    w.begin(Lsn(290));
    assert_eq!(
        w.looked(look(1, 320, false), Lsn(10_000)),
        Ok(Looked::Unsettled { first: true })
    );
    w.guard(seen(1, 900));
    assert_eq!(
        w.looked(look(3, 920, true), Lsn(10_000)),
        Err(WatchStop::Changed {
            since: seen(1, 300)
        })
    );
    // Once a look counts, the next guard names its own commit.
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.guard(seen(1, 300));
    assert!(w.looked(look(1, 320, true), Lsn(10_000)).is_ok());
    w.guard(seen(1, 900));
    assert_eq!(w.last(), &seen(1, 900));
}

#[test]
fn early_looks_skip_the_looks_own_wal() {
    let mut w = PublicationWatch::new(seen(1, 10), true, true);
    w.begin(Lsn(100));
    let own = Look {
        settle_end: Some(Lsn(200)),
        ..look(1, 120, true)
    };
    assert!(w.looked(own, Lsn(10_000)).is_ok());
    assert!(!w.early_look_wanted(0, Lsn(200), Lsn(100)));
    assert!(w.early_look_wanted(0, Lsn(201), Lsn(100)));
    assert!(!w.early_look_wanted(1, Lsn(201), Lsn(100)));
    assert!(!w.early_look_wanted(0, Lsn(100), Lsn(100)));
}

#[test]
fn the_start_is_compared_with_the_known_look_as_the_record_is() {
    // Another catalog than the known look's, or no publication at all, names the known look.
    let changed = Err(WatchStop::Changed { since: seen(1, 5) });
    let w = PublicationWatch::start(Some(seen(2, 50)), true, Some(&seen(1, 5)), true);
    assert_eq!(w.map(|w| w.is_some()), changed);
    let w = PublicationWatch::start(None, true, Some(&seen(1, 5)), false);
    assert_eq!(w.map(|w| w.is_some()), changed);
    // An unsettled start stands in for nothing once the record was read without a look.
    let w = PublicationWatch::start(Some(seen(1, 50)), false, None, true);
    assert_eq!(w.map(|w| w.is_some()), Err(WatchStop::StandbysUnsettled));
    let w = PublicationWatch::start(None::<Seen>, false, None, true);
    assert_eq!(w.map(|w| w.is_some()), Err(WatchStop::StandbysUnsettled));
    assert_eq!(
        PublicationWatch::start(None::<Seen>, false, None, false).map(|w| w.is_some()),
        Ok(false)
    );
}

#[test]
fn an_unsettled_start_gives_way_to_the_known_look_and_waits_for_the_record() {
    // This process's last session's look, the record not read: compared, but not yet with
    // the record, which is then compared with the known look.
    let mut w = PublicationWatch::start(Some(seen(1, 50)), false, Some(&seen(1, 5)), false)
        .unwrap()
        .unwrap();
    assert_eq!(w.last(), &seen(1, 5));
    assert!(!w.compared());
    assert_eq!(w.record_read(Some(&seen(1, 3))), Ok(()));
    assert!(w.compared());
    assert_eq!(w.last(), &seen(1, 5));
    // Settled, with nothing known: its own look, and compared if the record was read.
    let w = PublicationWatch::start(Some(seen(1, 50)), true, None, true)
        .unwrap()
        .unwrap();
    assert_eq!(w.last(), &seen(1, 50));
    assert!(w.compared());
    // Unsettled, the record not read: it waits for the record's look.
    let mut w = PublicationWatch::start(Some(seen(1, 50)), false, None, false)
        .unwrap()
        .unwrap();
    assert_eq!(w.record_read(None), Err(WatchStop::StandbysUnsettled));
}
