//! The publication: the relay's looks at it (`outbox_core::PublicationWatch`), the guard
//! message of `sql/publication-guard.sql`, and the operator's procedure when it changed.

use outbox_core::{LifeCore, Look, Looked, WatchStop};
use pgoutput::Lsn;

use crate::life::{Life, Seen};
use crate::model::Change;
use crate::{Sim, Violation};

impl Sim {
    /// The relay looks at the publication: it begins (what is acked then, and the catalog
    /// read), and returns now or at a later look step, steps of the stream in between.
    /// The same as at its last matching look, or it stops.
    pub(crate) fn look_at_publication(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        if self.rng.chance(3) {
            // The synchronous standby confirms: the waiting commit becomes visible.
            let cl = &mut self.clusters[c];
            cl.visible = cl.publication;
        }
        let Some(mut life) = self.lives[c].take() else {
            return Ok(());
        };
        if life.look.is_none() {
            life.watch.begin(life.core.watermark());
            life.look = Some(self.clusters[c].look());
            if self.rng.chance(2) {
                self.lives[c] = Some(life);
                return Ok(());
            }
        }
        // A slow look (a settler waiting, a busy server): the stream goes on meanwhile.
        let Some(look) = life.look.take_if(|_| self.rng.chance(2)) else {
            self.lives[c] = Some(life);
            return Ok(());
        };
        let look = self.returned(&mut life, look);
        self.look_returned(c, life, look)
    }

    /// A guard message was decoded: as the relay's `on_publication_guard`, the watch
    /// takes the changing transaction's commit as where a change is named from, and the
    /// relay looks at once (in place of a look under way).
    pub(crate) fn on_guard(&mut self, c: usize) -> Result<(), Violation> {
        let Some(mut life) = self.lives[c].take() else {
            return Ok(());
        };
        if !life.guard_seen() {
            self.lives[c] = Some(life);
            return Ok(());
        }
        self.stats.guard_looks += 1;
        let look = self.look_at_once(c, &mut life);
        self.look_returned(c, life, look)
    }

    /// A look that begins and returns at once (in place of one under way): whether it
    /// counts (the cap raised), or what stops the relay.
    pub(crate) fn look_at_once(
        &mut self,
        c: usize,
        life: &mut Life,
    ) -> Result<bool, WatchStop<Seen>> {
        life.look = None;
        life.watch.begin(life.core.watermark());
        let look = self.clusters[c].look();
        self.returned(life, look)
    }

    /// A look returned: whether it counts (the cap raised), or what stops the relay.
    fn returned(&self, life: &mut Life, look: Look<Seen>) -> Result<bool, WatchStop<Seen>> {
        match life.watch.looked(look, life.core.watermark())? {
            Looked::Counts { raise_cap, .. } => {
                if let Some(acked) = raise_cap {
                    life.core.raise_cap(acked);
                }
                Ok(true)
            }
            Looked::Unsettled { .. } => Ok(false),
        }
    }

    /// What a look that returned leads to: it counts (the position handed on), is not
    /// settled, or stops the relay.
    fn look_returned(
        &mut self,
        c: usize,
        mut life: Life,
        look: Result<bool, WatchStop<Seen>>,
    ) -> Result<(), Violation> {
        match look {
            Ok(true) => {
                self.hand_on(&mut life)?;
                self.lives[c] = Some(life);
            }
            Ok(false) => self.lives[c] = Some(life),
            Err(stop) => self.stopped_by_publication(life, stop),
        }
        Ok(())
    }

    /// A look found the publication changed: the relay stops, and the operator follows
    /// the error.
    pub(crate) fn stopped_by_publication(&mut self, life: Life, stop: WatchStop<Seen>) {
        let since = match stop {
            WatchStop::Changed { since } => since.wal_lsn,
            WatchStop::Dropped | WatchStop::StandbysUnsettled => Lsn::ZERO,
        };
        let c = life.cluster;
        self.end_life(life, false);
        self.publication_stop(c, since);
    }

    /// The relay stopped on a changed publication: the operator puts the outbox back,
    /// publishes again the rows the change hid (the same event ids), and accepts the
    /// publication as it is now. `since`: where the error says re-publishing starts.
    pub(crate) fn publication_stop(&mut self, c: usize, since: Lsn) {
        self.stats.publication_stops += 1;
        self.carry[c] = LifeCore::new(false);
        self.processes[c] += 1;
        let cl = &mut self.clusters[c];
        if !cl.outbox_published {
            cl.outbox_published = true;
            cl.publication += 1;
            if self.guarded {
                self.clock += 1;
                cl.commit_guard(self.clock);
            }
        }
        let mut copies = Vec::new();
        cl.visible = cl.publication;
        for t in cl
            .history
            .iter()
            // A commit that starts right at the look's WAL end came after the look.
            .filter(|t| t.hidden && t.commit_lsn >= since)
        {
            for ch in &t.changes {
                if let Change::Outbox { id, .. } = *ch {
                    if cl.republished.insert(id) {
                        copies.push(*ch);
                    }
                }
            }
        }
        cl.accepted = cl.publication;
        if self.trace {
            eprintln!(
                "  publication changed on cluster {c}: {} rows published again",
                copies.len()
            );
        }
        self.publish_again(c, copies);
    }

    /// The operator's re-insert of `copies` into cluster `c`'s outbox with their own event
    /// ids, in one transaction, by either procedure (a publication change, a lost slot).
    pub(crate) fn publish_again(&mut self, c: usize, copies: Vec<Change>) {
        if copies.is_empty() {
            return;
        }
        self.clock += 1;
        let size = 40 * u64::try_from(copies.len()).unwrap_or(1);
        self.clusters[c].commit(copies, size, self.clock, false);
    }
}
