//! A bad row under `OUTBOXD_BAD_ROW_POLICY=stop`: the relay settles what was sent before
//! it (`Shutdown::before_bad_row`, the steps of a clean shutdown), judges whether skipping
//! the bad transaction by hand skips nothing else (`SessionCore::before_bad_row`) and
//! stops; the operator follows the error: the slot advance when it is offered, or a run
//! with dead-letter.

use std::time::Duration;

use outbox_core::{BeforeBadRow, LifeCore, Shutdown};
use pgoutput::Lsn;

use crate::faults::SHUTDOWN;
use crate::life::Life;
use crate::model::Change;
use crate::{Sim, Violation};

impl Sim {
    /// `life`'s session met a bad row, event `event` (every bad row here names its event);
    /// the error's advance goes to `skip_to`.
    pub(crate) fn bad_row_stop(
        &mut self,
        life: Life,
        event: Option<u64>,
        skip_to: Lsn,
    ) -> Result<(), Violation> {
        let c = life.cluster;
        self.stats.bad_row_stops += 1;
        let stop = Shutdown::before_bad_row(SHUTDOWN, Duration::ZERO);
        let Some(life) = self.drive_stop(life, stop)? else {
            return Ok(());
        };
        let before = life.core.before_bad_row();
        self.stats.bad_row_offers += u64::from(before == BeforeBadRow::Delivered);
        // The relay purges its producer: what was not acked may or may not be written.
        self.end_life(life, false);
        self.carry[c] = LifeCore::new(false);
        self.processes[c] += 1;
        if before == BeforeBadRow::Delivered && self.rng.chance(500) {
            if self.trace {
                eprintln!("  bad row under stop: the operator advances the slot to {skip_to:?}");
            }
            self.stats.bad_row_advances += 1;
            // pg_replication_slot_advance('<slot>', '<skip_to>'): durable at the next
            // checkpoint, like any confirmation.
            let family = self.configs[c].tag & 1;
            let cl = &mut self.clusters[c];
            cl.confirmed = cl.confirmed.max(skip_to);
            // What the operator accepts to lose: the bad event's own transaction (or bare
            // message), found by the event the error names (the last one holding it before
            // the advance: a re-published copy keeps its id), not by the position printed.
            let skipped = cl.history.iter().rfind(|t| {
                t.commit_lsn <= skip_to
                    && event.is_some()
                    && t.changes.iter().any(|ch| ch.event_id() == event)
            });
            let ids = skipped
                .into_iter()
                .flat_map(|t| &t.changes)
                .filter_map(Change::event_id)
                .map(|id| (family, id));
            self.skipped_by_hand.extend(ids);
        } else {
            if self.trace {
                eprintln!("  bad row under stop: the operator switches to dead-letter");
            }
            self.configs[c].dead_letter = true;
        }
        Ok(())
    }
}
