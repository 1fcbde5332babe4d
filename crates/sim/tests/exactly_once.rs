//! The exactly-once mode's schedules: `OUTBOXD_SIM_EOS_SCHEDULES` seeds (default 20000)
//! from `OUTBOXD_SIM_FIRST_SEED` (default 0), on every core; `OUTBOXD_SIM_SEED=n` replays
//! one. A failing schedule prints its seed and what broke.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use outboxd_sim::{run_exactly_once, EosStats};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_exactly_once_schedule_keeps_every_invariant() {
    if let Ok(seed) = std::env::var("OUTBOXD_SIM_SEED") {
        let seed: u64 = seed.parse().expect("OUTBOXD_SIM_SEED");
        match run_exactly_once(seed) {
            Ok(stats) => eprintln!("exactly-once seed {seed}: ok {stats:?}"),
            Err(v) => panic!("exactly-once seed {seed}: {}", v.0),
        }
        return;
    }
    let first = env_u64("OUTBOXD_SIM_FIRST_SEED", 0);
    let count = env_u64("OUTBOXD_SIM_EOS_SCHEDULES", 20_000);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicU64::new(first);
    let failed = AtomicU64::new(u64::MAX);
    let started = Instant::now();
    let results: Vec<(EosStats, Option<(u64, String)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut total = EosStats::default();
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= first + count || seed > failed.load(Ordering::Relaxed) {
                            return (total, None);
                        }
                        match run_exactly_once(seed) {
                            Ok(st) => total.add(&st),
                            Err(v) => {
                                failed.fetch_min(seed, Ordering::Relaxed);
                                return (total, Some((seed, v.0)));
                            }
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut total = EosStats::default();
    let mut first_failure: Option<(u64, String)> = None;
    for (st, f) in results {
        total.add(&st);
        if let Some((seed, why)) = f {
            if first_failure.as_ref().is_none_or(|(s, _)| seed < *s) {
                first_failure = Some((seed, why));
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation, exactly-once: {count} schedules from seed {first} in {secs:.1} s ({:.0} a second; {} steps, {} commits, {} split inside a PostgreSQL transaction, {} aborts, {} commits made again, {} expired, {} fenced, {} kills, {} zombies, {} replays in doubt, {} duplicates after a doubt)",
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
        total.doubts,
        total.duplicates
    );
    if let Some((seed, why)) = first_failure {
        panic!("seed {seed}: {why}\nreplay it with OUTBOXD_SIM_SEED={seed}");
    }
}
