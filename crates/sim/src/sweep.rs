//! Runs seeded schedules on every core, for the simulation's tests: one runner for the
//! at-least-once and the exactly-once schedules.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::Violation;

/// Counts a schedule reports, summed over a sweep.
pub trait Tally: Debug + Default + Send {
    fn add(&mut self, other: &Self);
}

/// What a sweep found: the summed counts, how long it took, and the lowest failing seed
/// with what broke (seeds past it are not run).
#[derive(Debug)]
pub struct Swept<T> {
    pub total: T,
    pub seconds: f64,
    pub failure: Option<(u64, String)>,
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `OUTBOXD_SIM_SEED=n`: runs that one schedule, printing its counts (`label seed n: ok`)
/// or panicking with what broke; true if it was set.
pub fn replay_from_env<T: Tally>(label: &str, run: fn(u64) -> Result<T, Violation>) -> bool {
    let Some(seed) = std::env::var("OUTBOXD_SIM_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return false;
    };
    match run(seed) {
        Ok(stats) => eprintln!("{label}seed {seed}: ok {stats:?}"),
        Err(v) => panic!("{label}seed {seed}: {}", v.0),
    }
    true
}

/// The schedules `first..first + count`, on every core.
pub fn sweep<T: Tally>(first: u64, count: u64, run: fn(u64) -> Result<T, Violation>) -> Swept<T> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicU64::new(first);
    let failed = AtomicU64::new(u64::MAX);
    let started = Instant::now();
    let results: Vec<(T, Option<(u64, String)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut total = T::default();
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= first + count || seed > failed.load(Ordering::Relaxed) {
                            return (total, None);
                        }
                        match run(seed) {
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
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut swept = Swept {
        total: T::default(),
        seconds: started.elapsed().as_secs_f64(),
        failure: None,
    };
    for (st, f) in results {
        swept.total.add(&st);
        if let Some((seed, why)) = f {
            if swept.failure.as_ref().is_none_or(|(s, _)| seed < *s) {
                swept.failure = Some((seed, why));
            }
        }
    }
    swept
}

impl<T> Swept<T> {
    /// Panics with the lowest failing seed and how to replay it.
    pub fn assert_passed(self) {
        if let Some((seed, why)) = self.failure {
            panic!("seed {seed}: {why}\nreplay it with OUTBOXD_SIM_SEED={seed}");
        }
    }
}
