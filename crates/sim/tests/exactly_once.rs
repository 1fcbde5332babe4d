//! The exactly-once mode's schedules: `OUTBOXD_SIM_EOS_SCHEDULES` seeds (default 20000)
//! from `OUTBOXD_SIM_FIRST_SEED` (default 0), on every core; `OUTBOXD_SIM_SEED=n` replays
//! one. A failing schedule prints its seed and what broke.

use outboxd_sim::{env_u64, replay_from_env, run_exactly_once, sweep};

#[test]
fn every_exactly_once_schedule_keeps_every_invariant() {
    if replay_from_env("exactly-once ", run_exactly_once) {
        return;
    }
    let first = env_u64("OUTBOXD_SIM_FIRST_SEED", 0);
    let count = env_u64("OUTBOXD_SIM_EOS_SCHEDULES", 20_000);
    let swept = sweep(first, count, run_exactly_once);
    let (total, secs) = (&swept.total, swept.seconds);
    eprintln!(
        "simulation, exactly-once: {count} schedules from seed {first} in {secs:.1} s ({:.0} a second; {} steps, {} commits, {} split inside a PostgreSQL transaction, {} aborts, {} commits made again, {} expired, {} fenced, {} kills, {} zombies, {} replay holds spilled, {} replays in doubt, {} slots lost, {} rows inserted again after them, {} event messages lost with them, {} duplicates after a doubt or a re-insert, {} SIGTERMs, {} clean shutdowns, {} transactions ended with markers skipped, {} commits aborted over a transaction left open, {} committed over an older one in doubt, {} committed transactions' records left open then hidden by an abort, {} brokers hung with records in flight, {} sessions without the record read, {} regions left open read back, {} found copies and aborted over)",
        count as f64 / secs.max(1e-9),
        total.steps,
        total.commits,
        total.splits,
        total.aborts,
        total.retried,
        total.expired,
        total.fenced,
        total.kills,
        total.zombies,
        total.spills,
        total.doubts,
        total.slot_losses,
        total.republished,
        total.messages_lost,
        total.duplicates,
        total.shutdowns,
        total.clean_stops,
        total.markers_skipped,
        total.left_open,
        total.left_open_doubts,
        total.buried,
        total.hangs,
        total.records_unread,
        total.regions_read,
        total.copies_found
    );
    swept.assert_passed();
}
