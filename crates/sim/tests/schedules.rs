//! The simulation's schedules: `OUTBOXD_SIM_SCHEDULES` seeds (default 100000) from
//! `OUTBOXD_SIM_FIRST_SEED` (default 0), on every core; `OUTBOXD_SIM_SEED=n` replays
//! one. A failing schedule prints its seed and what broke.

use outboxd_sim::{env_u64, replay_from_env, run, sweep};

#[test]
fn every_schedule_keeps_every_invariant() {
    if replay_from_env("", run) {
        return;
    }
    let first = env_u64("OUTBOXD_SIM_FIRST_SEED", 0);
    let count = env_u64("OUTBOXD_SIM_SCHEDULES", 100_000);
    let swept = sweep(first, count, run);
    let total = &swept.total;
    eprintln!(
        "simulation: {count} schedules from seed {first} in {:.1} s ({} steps, {} records acked, {} dead letters, {} duplicates, {} kills, {} skipped as delivered, {} doubts, {} publication stops, {} forged records, {} slots lost, {} event messages lost with them, {} emit-only schedules, {} guard looks, {} progress records written, {} read back by another lineage, {} answered late, {} failed, {} landed after their process, {} clean shutdowns, {} with a delivery failed while draining, {} bad-row stops, {} offering the slot advance, {} taken, {} stops on a dropped partition's rows)",
        swept.seconds,
        total.steps,
        total.events,
        total.dead_letters,
        total.duplicates,
        total.kills,
        total.proofs,
        total.doubts,
        total.publication_stops,
        total.forged,
        total.slot_losses,
        total.messages_lost,
        total.emit_only,
        total.guard_looks,
        total.records_written,
        total.lineage_checks_found,
        total.records_slow,
        total.records_failed,
        total.records_orphaned,
        total.clean_stops,
        total.drain_failures,
        total.bad_row_stops,
        total.bad_row_offers,
        total.bad_row_advances,
        total.former_partition_stops
    );
    swept.assert_passed();
}
