//! Capped exponential backoff with full jitter for reconnects.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The next delay: uniformly random in [base/2, min(cap, base * 2^attempt)], so many
    /// relays restarted by one outage do not reconnect in lockstep.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .base
            .saturating_mul(2u32.saturating_pow(self.attempt.min(20)));
        self.attempt = self.attempt.saturating_add(1);
        let ceiling = exp.min(self.cap);
        let floor = (self.base / 2).min(ceiling);
        rand::thread_rng().gen_range(floor..=ceiling)
    }

    /// Called once a session made progress, so the next outage starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(50)));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[0] <= Duration::from_millis(100));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
