//! The publication watch's rules, without the queries. PostgreSQL decodes each row by the
//! catalog as it was when the row was written, so a table taken out of the publication and
//! put back leaves today's catalog as it was and the rows in between never decoded. The
//! catalog's identity never goes back, so a look that differs from the last matching one
//! shows a change; the slot must not be confirmed past the rows it hid. Hence the cap
//! (`SessionCore::raise_cap`): only up to what was acked when the last matching look
//! began, since all of that was written to the WAL before the look read the catalog.
//!
//! A look taken while a commit is in the WAL (and decoded) but not yet visible to queries,
//! as while it waits for a synchronous standby, may match the old catalog while the
//! walsender already follows the new one. Such a look does not count: the cap stays, and
//! so does the last matching look, which a change seen later names as where re-publishing
//! starts. The relay's `session/publication.rs` runs the queries and the timers around
//! this; the simulator drives the same rules.

use pgoutput::Lsn;

/// What a look saw, as far as the rules care: whether two looks saw the same catalog.
/// The rest (its position and time) is carried to the caller's error.
pub trait CatalogLook: Clone {
    fn same_catalog(&self, other: &Self) -> bool;
}

/// One look's result.
#[derive(Debug, Clone)]
pub struct Look<S> {
    /// `None`: the publication does not exist.
    pub seen: Option<S>,
    /// No commit was in the WAL that the look's snapshot did not see.
    pub settled: bool,
    /// Where the WAL the look wrote to settle ended: acks up to it call for no early look.
    pub settle_end: Option<Lsn>,
}

/// What a look that did not stop the session leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// It matched and counts: the slot may be confirmed up to `raise_cap` (`None` while
    /// the start's look is not yet compared with the record). `settled_again`: looks had
    /// not counted before this one.
    Counts {
        raise_cap: Option<Lsn>,
        settled_again: bool,
    },
    /// It matched a catalog some commit may already have changed: nothing moves.
    /// `first`: the first of a run of such looks.
    Unsettled { first: bool },
}

/// Why the session stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchStop<S> {
    /// The publication is gone.
    Dropped,
    /// Another publication than at `since`, the last look that matched (or the record's):
    /// rows from there on may never have been decoded.
    Changed { since: S },
    /// The start's look did not settle and the record has no look to stand in for it.
    StandbysUnsettled,
}

/// The session's knowledge of the publication: the last matching look, whether the
/// start's look was compared with the progress record, and the look under way.
#[derive(Debug, Clone)]
pub struct PublicationWatch<S> {
    last: S,
    compared: bool,
    /// The start's look did not settle: it stands only until the record's look replaces
    /// it once read, or stops the session.
    start_unsettled: bool,
    unsettled: bool,
    /// A guard moved `last` to its commit and no look has counted since: the change it
    /// announced may not be seen yet.
    guard_pending: bool,
    own_wal_end: Lsn,
    /// What was acked when the look under way began.
    began: Option<Lsn>,
}

impl<S: CatalogLook> PublicationWatch<S> {
    /// From the start's look; `compared`: with the progress record's look already.
    pub fn new(start: S, compared: bool, start_settled: bool) -> Self {
        PublicationWatch {
            last: start,
            compared,
            start_unsettled: !start_settled,
            unsettled: false,
            guard_pending: false,
            own_wal_end: Lsn::ZERO,
            began: None,
        }
    }

    /// The last look that counted (or the record's, or a guard's commit).
    pub fn last(&self) -> &S {
        &self.last
    }

    /// Whether the start's look was compared with the record: until then the cap stays
    /// at the start and no record may be written (it would bury the record's look).
    pub fn compared(&self) -> bool {
        self.compared
    }

    /// Whether looks do not count now (a commit not yet visible).
    pub fn unsettled(&self) -> bool {
        self.unsettled
    }

    /// A look begins with `acked` acknowledged: all of it was received, so written to the
    /// WAL, before the look reads the catalog.
    pub fn begin(&mut self, acked: Lsn) {
        self.began = Some(acked);
    }

    /// The look begun last returned, with `acked_now` acknowledged. A look with no `begin`
    /// raises nothing; one that counts raises to what was acked when it began, never to
    /// `acked_now`: a row acked during the look may come after a change the look's
    /// snapshot missed.
    pub fn looked(&mut self, look: Look<S>, acked_now: Lsn) -> Result<Looked, WatchStop<S>> {
        let began = self.began.take();
        let Some(seen) = look.seen else {
            return Err(WatchStop::Dropped);
        };
        if !seen.same_catalog(&self.last) {
            return Err(WatchStop::Changed {
                since: self.last.clone(),
            });
        }
        self.own_wal_end = look.settle_end.unwrap_or(Lsn::ZERO);
        if !look.settled {
            // Not `last`: a change this look could not see is named from the look before.
            let first = !self.unsettled;
            self.unsettled = true;
            return Ok(Looked::Unsettled { first });
        }
        let settled_again = std::mem::take(&mut self.unsettled);
        self.guard_pending = false;
        self.last = seen;
        // The watermark never goes back, so `min` changes nothing but keeps the cap within
        // what is acked if a caller began a look under another ledger.
        let raise_cap = began.map(|began| began.min(acked_now));
        Ok(Looked::Counts {
            raise_cap: raise_cap.filter(|_| self.compared),
            settled_again,
        })
    }

    /// A guard message's transaction changed a publication: rows after it follow the new
    /// catalog, so a change seen next is named from this commit (`at`, the last look's
    /// identity with the commit's position and time). Kept even if the look fails: the
    /// next session of the process starts from it. Until a look counts, a later guard
    /// keeps the earlier commit: a look not settled (a commit waiting for a synchronous
    /// standby) may not have seen the first change, and rows after it were hidden.
    pub fn guard(&mut self, at: S) {
        if !std::mem::replace(&mut self.guard_pending, true) {
            self.last = at;
        }
    }

    /// The session's watch from the start's look (`None`: no publication of this name, so
    /// none to watch), compared with the look known before it: the progress record's, or
    /// the one this process's last session ended with. `read`: the record was read, so
    /// `known` is its word; else [`record_read`](Self::record_read) compares once it is.
    pub fn start(
        look: Option<S>,
        settled: bool,
        known: Option<&S>,
        read: bool,
    ) -> Result<Option<Self>, WatchStop<S>> {
        let Some(look) = look else {
            refuse_start(None, !settled, known, read)?;
            return Ok(None);
        };
        let mut watch = Self::new(look, false, settled);
        watch.compare(known, read)?;
        Ok(Some(watch))
    }

    /// The progress record was read (`recorded`: its last look): compares the start's look
    /// with it.
    pub fn record_read(&mut self, recorded: Option<&S>) -> Result<(), WatchStop<S>> {
        self.compare(recorded, true)
    }

    /// An unsettled start's look gives way to the known one, the same catalog seen before
    /// the standbys stopped: a change the start's look could not see is named from there.
    fn compare(&mut self, known: Option<&S>, read: bool) -> Result<(), WatchStop<S>> {
        refuse_start(Some(&self.last), self.start_unsettled, known, read)?;
        if let Some(known) = known {
            if std::mem::take(&mut self.start_unsettled) {
                self.last = known.clone();
            }
        }
        self.compared |= read;
        Ok(())
    }

    /// Whether to look before the regular interval: everything sent is acked and only
    /// the cap holds the slot back, so a drained backlog is confirmed at once. Not while
    /// looks do not settle (each waits for the standbys), nor for acks of the look's own
    /// WAL, or each look's commit would call for the next.
    pub fn early_look_wanted(&self, awaiting_reports: usize, acked: Lsn, confirmed: Lsn) -> bool {
        awaiting_reports == 0
            && acked > confirmed
            && self.compared
            && !self.unsettled
            && acked > self.own_wal_end
    }
}

/// Whether the start's look (`None`: the publication does not exist) stops the session:
/// another catalog than the known look's, or an unsettled look with nothing to stand in
/// for it in a record that was read.
fn refuse_start<S: CatalogLook>(
    start: Option<&S>,
    start_unsettled: bool,
    known: Option<&S>,
    read: bool,
) -> Result<(), WatchStop<S>> {
    match known {
        Some(known) if !start.is_some_and(|s| s.same_catalog(known)) => Err(WatchStop::Changed {
            since: known.clone(),
        }),
        None if start_unsettled && read => Err(WatchStop::StandbysUnsettled),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "publication_tests.rs"]
mod tests;
