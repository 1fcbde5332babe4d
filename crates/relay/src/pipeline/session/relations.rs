//! Inserts of published relations that are neither the outbox nor one of its partitions
//! (what each relation is, is `outbox_core::SessionCore`'s rule): counted in the metrics,
//! and logged the first time this process sees rows of one.

use super::Session;

impl Session<'_> {
    /// Adds the ignored inserts counted since the last tick to the metrics.
    pub(super) fn report_ignored_rows(&mut self) {
        let (obs, outbox) = (self.obs, self.cfg.rules.table.qualified_name());
        self.core.take_ignored_rows(|name, n| {
            if obs.ignored_rows(name, n) {
                tracing::warn!(
                    relation = %name,
                    outbox = %outbox,
                    "the publication sends inserts of {name}, which is neither the outbox table nor one of its partitions: they are counted in outboxd_ignored_rows_total and not published"
                );
            }
        });
    }
}
