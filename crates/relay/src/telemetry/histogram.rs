//! A fixed-bucket latency histogram on atomics: one `fetch_add` per bucket and sum, no
//! locks, so the delivery hot path can record every ack.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds in microseconds, with the `le` label they render as. Integers keep the
/// hot path and the rendering free of float conversions.
pub(crate) const BUCKETS: [(u64, &str); 15] = [
    (1_000, "0.001"),
    (2_500, "0.0025"),
    (5_000, "0.005"),
    (10_000, "0.01"),
    (25_000, "0.025"),
    (50_000, "0.05"),
    (100_000, "0.1"),
    (250_000, "0.25"),
    (500_000, "0.5"),
    (1_000_000, "1"),
    (2_500_000, "2.5"),
    (5_000_000, "5"),
    (10_000_000, "10"),
    (30_000_000, "30"),
    (60_000_000, "60"),
];

/// Counts per bucket (not cumulative; the last slot is above every bound) and the sum.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

/// A point-in-time reading, cumulative as Prometheus wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// `(le label, observations ≤ bound)`, ending with `"+Inf"`.
    pub cumulative: Vec<(&'static str, u64)>,
    pub count: u64,
    pub sum_micros: u64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let slot = BUCKETS
            .iter()
            .position(|&(bound, _)| micros <= bound)
            .unwrap_or(BUCKETS.len());
        if let Some(count) = self.counts.get(slot) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let labels = BUCKETS.iter().map(|&(_, label)| label).chain(["+Inf"]);
        let mut running = 0_u64;
        let cumulative: Vec<(&'static str, u64)> = labels
            .zip(&self.counts)
            .map(|(label, count)| {
                running = running.saturating_add(count.load(Ordering::Relaxed));
                (label, running)
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            count: running,
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_with_inf() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500)); // ≤ 0.001
        h.observe(Duration::from_millis(1)); // bound is inclusive
        h.observe(Duration::from_millis(20)); // ≤ 0.025
        h.observe(Duration::from_secs(120)); // above every bound
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.sum_micros, 500 + 1_000 + 20_000 + 120_000_000);
        assert_eq!(s.cumulative.len(), BUCKETS.len() + 1);
        assert_eq!(s.cumulative[0], ("0.001", 2));
        assert_eq!(s.cumulative[3], ("0.01", 2));
        assert_eq!(s.cumulative[4], ("0.025", 3));
        assert_eq!(s.cumulative[BUCKETS.len() - 1], ("60", 3));
        assert_eq!(s.cumulative[BUCKETS.len()], ("+Inf", 4));
    }

    #[test]
    fn bounds_are_increasing() {
        assert!(BUCKETS.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
