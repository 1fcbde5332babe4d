//! Liveness and readiness. Ready means events are flowing or there is nothing to do:
//! connected to PostgreSQL, producer usable, and, while work is unacked, the confirmed
//! position moved recently. A relay that is connected but stuck is not ready.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared readiness state, written by the pipeline, read by `/readyz`.
#[derive(Debug)]
pub struct Health {
    /// Instants are stored as nanoseconds since `base` so they fit in atomics.
    base: Instant,
    replication_connected: AtomicBool,
    producer_healthy: AtomicBool,
    kafka_reachable: AtomicBool,
    unacked: AtomicBool,
    last_progress_nanos: AtomicU64,
    unacked_since_nanos: AtomicU64,
    /// Waiting because another instance holds the slot.
    standby: AtomicBool,
    /// Whether such a standby answers ready (`OUTBOXD_READY_STANDBY`): a Kubernetes
    /// rollout or a PodDisruptionBudget counts only ready pods, and a standby that can
    /// become ready only after the active one is gone would block both forever.
    standby_is_ready: AtomicBool,
}

impl Health {
    pub fn new(now: Instant) -> Self {
        Self {
            base: now,
            replication_connected: AtomicBool::new(false),
            producer_healthy: AtomicBool::new(false),
            // Until the first probe says otherwise: the producer's own health decides.
            kafka_reachable: AtomicBool::new(true),
            unacked: AtomicBool::new(false),
            last_progress_nanos: AtomicU64::new(0),
            unacked_since_nanos: AtomicU64::new(0),
            standby: AtomicBool::new(false),
            standby_is_ready: AtomicBool::new(false),
        }
    }

    /// Opt in to a waiting standby answering ready (see the field).
    pub fn set_standby_is_ready(&self, ready: bool) {
        self.standby_is_ready.store(ready, Ordering::Relaxed);
    }

    /// The relay waits because the slot is active in another instance.
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }

    pub fn set_replication_connected(&self, connected: bool) {
        self.replication_connected
            .store(connected, Ordering::Relaxed);
    }

    pub fn set_producer_healthy(&self, healthy: bool) {
        self.producer_healthy.store(healthy, Ordering::Relaxed);
    }

    pub fn set_kafka_reachable(&self, reachable: bool) {
        self.kafka_reachable.store(reachable, Ordering::Relaxed);
    }

    /// The confirmed LSN moved.
    pub fn record_progress(&self, now: Instant) {
        self.last_progress_nanos
            .fetch_max(self.nanos(now), Ordering::Relaxed);
    }

    /// Whether any received event is still waiting for its broker ack. The stall clock
    /// starts when work appears, so a long idle period is not mistaken for a stall.
    pub fn set_unacked(&self, unacked: bool, now: Instant) {
        if unacked && !self.unacked.swap(true, Ordering::Relaxed) {
            self.unacked_since_nanos
                .store(self.nanos(now), Ordering::Relaxed);
        } else if !unacked {
            self.unacked.store(false, Ordering::Relaxed);
        }
    }

    /// Always fine while the process can answer; restarts are for a wedged process.
    pub fn liveness(&self) -> Result<(), String> {
        Ok(())
    }

    pub fn readiness(&self, now: Instant, stall_after: Duration) -> Result<(), String> {
        if !self.replication_connected.load(Ordering::Relaxed) {
            if self.standby.load(Ordering::Relaxed) {
                if self.standby_is_ready.load(Ordering::Relaxed) {
                    return Ok(());
                }
                return Err(
                    "standing by: the slot is active in another instance (replication stream is not connected)"
                        .into(),
                );
            }
            return Err("replication stream is not connected".into());
        }
        if !self.producer_healthy.load(Ordering::Relaxed) {
            return Err("Kafka producer is not healthy".into());
        }
        if !self.kafka_reachable.load(Ordering::Relaxed) {
            return Err("no Kafka broker answers".into());
        }
        if self.unacked.load(Ordering::Relaxed) {
            let since = self
                .last_progress_nanos
                .load(Ordering::Relaxed)
                .max(self.unacked_since_nanos.load(Ordering::Relaxed));
            let stalled_for = Duration::from_nanos(self.nanos(now).saturating_sub(since));
            if stalled_for > stall_after {
                return Err(format!(
                    "no acknowledged progress for {}s while events are waiting for Kafka",
                    stalled_for.as_secs()
                ));
            }
        }
        Ok(())
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(60);

    fn ready_health(t0: Instant) -> Health {
        let h = Health::new(t0);
        h.set_replication_connected(true);
        h.set_producer_healthy(true);
        h
    }

    #[test]
    fn not_ready_until_connected_and_healthy() {
        let t0 = Instant::now();
        let h = Health::new(t0);
        assert!(h.readiness(t0, STALL).unwrap_err().contains("replication"));
        h.set_replication_connected(true);
        assert!(h.readiness(t0, STALL).unwrap_err().contains("producer"));
        h.set_producer_healthy(true);
        assert_eq!(h.readiness(t0, STALL), Ok(()));
        assert_eq!(h.liveness(), Ok(()));
    }

    #[test]
    fn standby_is_ready_only_when_opted_in() {
        let t0 = Instant::now();
        let h = Health::new(t0);
        h.set_standby(true);
        let err = h.readiness(t0, STALL).unwrap_err();
        assert!(err.contains("standing by"), "{err}");
        h.set_standby_is_ready(true);
        assert_eq!(h.readiness(t0, STALL), Ok(()));
        // Disconnected for any other reason: not ready, opted in or not.
        h.set_standby(false);
        assert!(h.readiness(t0, STALL).is_err());
    }

    #[test]
    fn idle_is_ready_however_long() {
        let t0 = Instant::now();
        let h = ready_health(t0);
        assert_eq!(h.readiness(t0 + Duration::from_secs(3600), STALL), Ok(()));
    }

    #[test]
    fn stall_clock_starts_when_work_appears() {
        let t0 = Instant::now();
        let h = ready_health(t0);
        let t1 = t0 + Duration::from_secs(600);
        h.set_unacked(true, t1);
        assert_eq!(h.readiness(t1 + Duration::from_secs(30), STALL), Ok(()));
        // Still unacked later: the start time is not reset.
        h.set_unacked(true, t1 + Duration::from_secs(50));
        let err = h
            .readiness(t1 + Duration::from_secs(61), STALL)
            .unwrap_err();
        assert!(err.contains("no acknowledged progress"), "{err}");
    }

    #[test]
    fn progress_keeps_it_ready_and_ack_clears_stall() {
        let t0 = Instant::now();
        let h = ready_health(t0);
        h.set_unacked(true, t0);
        h.record_progress(t0 + Duration::from_secs(50));
        assert_eq!(h.readiness(t0 + Duration::from_secs(100), STALL), Ok(()));
        assert!(h.readiness(t0 + Duration::from_secs(111), STALL).is_err());
        h.set_unacked(false, t0 + Duration::from_secs(112));
        assert_eq!(h.readiness(t0 + Duration::from_secs(113), STALL), Ok(()));
    }
}
