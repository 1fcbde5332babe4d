//! The telemetry of every relay in the process: one for an unsharded outbox, one per
//! shard otherwise. `/metrics` shows them all (a `shard` label tells them apart) and
//! `/readyz` is ready only when each of them is: a process whose one shard stalls must
//! not look healthy because the others do.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::health::Health;
use super::metrics::Metrics;
use super::process::ProcessSnapshot;
use super::render::render_all;

/// One relay's metrics and readiness.
#[derive(Debug, Clone)]
pub struct Monitored {
    /// The shard it relays; `None` for an unsharded outbox (no label).
    pub shard: Option<u32>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

#[derive(Debug, Clone)]
pub struct Telemetry {
    relays: Vec<Monitored>,
}

impl Telemetry {
    pub fn new(relays: Vec<Monitored>) -> Self {
        Telemetry { relays }
    }

    /// One unsharded relay.
    pub fn single(metrics: Arc<Metrics>, health: Arc<Health>) -> Self {
        Self::new(vec![Monitored {
            shard: None,
            metrics,
            health,
        }])
    }

    pub fn relays(&self) -> &[Monitored] {
        &self.relays
    }

    pub fn render_prometheus(&self) -> String {
        let now = SystemTime::now();
        let snapshots: Vec<_> = self
            .relays
            .iter()
            .map(|r| (r.shard, r.metrics.snapshot(now)))
            .collect();
        let refs: Vec<_> = snapshots.iter().map(|(shard, s)| (*shard, s)).collect();
        let mut text = render_all(&refs);
        text.push_str(&super::process::render(ProcessSnapshot::read().as_ref()));
        text
    }

    pub fn liveness(&self) -> Result<(), String> {
        self.relays.iter().try_for_each(|r| r.health.liveness())
    }

    /// Ready when every relay is; otherwise each one that is not, and why.
    pub fn readiness(&self, now: Instant, stall_after: Duration) -> Result<(), String> {
        let problems: Vec<String> = self
            .relays
            .iter()
            .filter_map(|r| {
                let problem = r.health.readiness(now, stall_after).err()?;
                Some(match r.shard {
                    Some(shard) => format!("shard {shard}: {problem}"),
                    None => problem,
                })
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(i: u32, t0: Instant) -> Monitored {
        let health = Arc::new(Health::new(t0));
        health.set_replication_connected(true);
        health.set_producer_healthy(true);
        Monitored {
            shard: Some(i),
            metrics: Arc::new(Metrics::new()),
            health,
        }
    }

    #[test]
    fn one_stalled_shard_makes_the_process_unready_and_is_named() {
        let t0 = Instant::now();
        let t = Telemetry::new(vec![shard(0, t0), shard(1, t0), shard(2, t0)]);
        let stall = Duration::from_secs(60);
        assert_eq!(t.readiness(t0, stall), Ok(()));
        t.relays()[1].health.set_unacked(true, t0);
        let later = t0 + Duration::from_secs(61);
        let err = t.readiness(later, stall).unwrap_err();
        assert!(
            err.starts_with("shard 1: no acknowledged progress"),
            "{err}"
        );
        assert!(
            !err.contains("shard 0") && !err.contains("shard 2"),
            "{err}"
        );
    }

    #[test]
    fn every_sample_of_a_shard_is_labelled_and_each_family_announced_once() {
        let t0 = Instant::now();
        let t = Telemetry::new(vec![shard(0, t0), shard(1, t0)]);
        t.relays()[0].metrics.add_events_published(3);
        t.relays()[1].metrics.add_events_published(5);
        let text = t.render_prometheus();
        assert!(
            text.contains("outboxd_events_published_total{shard=\"0\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("outboxd_events_published_total{shard=\"1\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("outboxd_slot_wal_status{shard=\"1\",status=\"unknown\"} 1\n"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE outboxd_events_published_total ")
                .count(),
            1
        );
        // The process's own metrics are the process's, not a shard's.
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("process_"))
            .filter(|l| !l.starts_with("outboxd_build_info"))
        {
            assert!(line.contains("{shard=\""), "unlabelled sample {line}");
        }
    }
}
