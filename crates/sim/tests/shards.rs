//! The sharded outbox's schedules: `OUTBOXD_SIM_SHARD_SCHEDULES` seeds (default 10000)
//! from `OUTBOXD_SIM_FIRST_SEED` (default 0), on every core; `OUTBOXD_SIM_SEED=n` replays
//! one. A failing schedule prints its seed and what broke.

use outboxd_sim::{env_u64, replay_from_env, run_shards, sweep};

#[test]
fn every_shard_schedule_keeps_every_invariant() {
    if replay_from_env("shards ", run_shards) {
        return;
    }
    let first = env_u64("OUTBOXD_SIM_FIRST_SEED", 0);
    let count = env_u64("OUTBOXD_SIM_SHARD_SCHEDULES", 10_000);
    let swept = sweep(first, count, run_shards);
    let (total, secs) = (&swept.total, swept.seconds);
    eprintln!(
        "simulation, shards: {count} schedules from seed {first} in {secs:.1} s ({:.0} a second; {} steps, {} rows committed, {} inserts refused for a missing remainder, {} migrations, {} count changes, {} layouts refused, {} fixes applied, {} rows copied by them, {} leftover slots dropped)",
        count as f64 / secs.max(1e-9),
        total.steps,
        total.rows,
        total.refused_inserts,
        total.migrations,
        total.count_changes,
        total.refusals,
        total.plans,
        total.copies,
        total.leftovers_dropped
    );
    swept.assert_passed();
}
