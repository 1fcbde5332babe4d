//! The counts of the at-least-once schedules, for the summary.

use crate::Tally;

/// Counts of one schedule, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub events: u64,
    pub duplicates: u64,
    pub kills: u64,
    pub proofs: u64,
    pub doubts: u64,
    pub dead_letters: u64,
    pub publication_stops: u64,
    /// Records forged with a partly delivered transaction they cannot prove.
    pub forged: u64,
    /// Slots invalidated or dropped.
    pub slot_losses: u64,
    /// Event messages lost with a slot, as the operator was told.
    pub messages_lost: u64,
    /// Schedules of emit-only relays.
    pub emit_only: u64,
    /// Guard messages a session decoded (and looked at the publication at once).
    pub guard_looks: u64,
    /// Progress records written while streaming, at the cadence's word.
    pub records_written: u64,
    /// Lineage checks that found another writer's record.
    pub lineage_checks_found: u64,
    /// Clean shutdowns that ran to their final record.
    pub clean_stops: u64,
    /// Deliveries that failed while a shutdown awaited the acks.
    pub drain_failures: u64,
    /// Record writes answered turns after they were sent.
    pub records_slow: u64,
    /// Record writes that failed or timed out.
    pub records_failed: u64,
    /// Record writes that landed after their process was gone.
    pub records_orphaned: u64,
    /// Bad rows that stopped the relay (under `stop`), and how many of those stops
    /// offered the slot advance.
    pub bad_row_stops: u64,
    pub bad_row_offers: u64,
    /// Bad transactions skipped by hand, as a bad row's error offered.
    pub bad_row_advances: u64,
    /// Stops on rows of a dropped partition (then named in `OUTBOXD_FORMER_PARTITIONS`).
    pub former_partition_stops: u64,
}

impl Tally for Stats {
    fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.events += o.events;
        self.duplicates += o.duplicates;
        self.kills += o.kills;
        self.proofs += o.proofs;
        self.doubts += o.doubts;
        self.dead_letters += o.dead_letters;
        self.publication_stops += o.publication_stops;
        self.forged += o.forged;
        self.slot_losses += o.slot_losses;
        self.messages_lost += o.messages_lost;
        self.emit_only += o.emit_only;
        self.guard_looks += o.guard_looks;
        self.records_written += o.records_written;
        self.lineage_checks_found += o.lineage_checks_found;
        self.clean_stops += o.clean_stops;
        self.drain_failures += o.drain_failures;
        self.records_slow += o.records_slow;
        self.records_failed += o.records_failed;
        self.records_orphaned += o.records_orphaned;
        self.bad_row_stops += o.bad_row_stops;
        self.bad_row_offers += o.bad_row_offers;
        self.bad_row_advances += o.bad_row_advances;
        self.former_partition_stops += o.former_partition_stops;
    }
}
