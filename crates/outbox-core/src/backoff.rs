//! Capped exponential backoff with "equal jitter" for reconnects.
//!
//! The random source is the caller's (the relay passes `rand::thread_rng()`), so the
//! delays are reproducible under a seeded generator and this crate draws nothing itself.

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

    /// The next delay: uniformly random in [ceiling/2, ceiling] with ceiling =
    /// min(cap, base * 2^attempt). The random half keeps many relays hit by one outage
    /// from reconnecting in lockstep; the fixed half makes the delays really grow (full
    /// jitter can draw tiny delays at any attempt).
    pub fn next_delay<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        rng.gen_range(ceiling / 2..=ceiling)
    }

    /// The delay before reconnecting after a session ended with a retryable error. Only a
    /// session that made real progress starts the backoff over: one that merely connected
    /// (or streamed briefly) before failing again must not turn an outage into a
    /// reconnect storm.
    pub fn after_session<R: Rng + ?Sized>(&mut self, made_progress: bool, rng: &mut R) -> Duration {
        if made_progress {
            self.reset();
        }
        self.next_delay(rng)
    }

    /// So the next outage starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    fn ceiling(&self) -> Duration {
        self.base
            .saturating_mul(2u32.saturating_pow(self.attempt.min(20)))
            .min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn delays_grow_to_the_cap() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut b = Backoff::new(ms(100), Duration::from_secs(30));
        let delays: Vec<Duration> = (0..15).map(|_| b.next_delay(&mut rng)).collect();
        for (i, d) in delays.iter().enumerate() {
            let ceiling = ms(100)
                .saturating_mul(1 << i.min(20))
                .min(Duration::from_secs(30));
            assert!(
                *d >= ceiling / 2 && *d <= ceiling,
                "attempt {i}: {d:?} not in [{:?}, {ceiling:?}]",
                ceiling / 2
            );
        }
        // The lower bound grows: each delay from the third on exceeds the first's maximum.
        assert!(delays[2..].iter().all(|d| *d >= ms(200)));
        assert!(delays[8..].iter().all(|d| *d >= Duration::from_secs(12)));
        assert!(delays[12..].iter().all(|d| *d >= Duration::from_secs(15)));
        // 30 s of outage take few attempts: the lower bounds alone sum past 30 s by the 10th.
        let mut total = Duration::ZERO;
        let attempts = delays
            .iter()
            .take_while(|d| {
                total += **d;
                total < Duration::from_secs(30)
            })
            .count();
        assert!(attempts <= 9, "{attempts} attempts within 30 s: {delays:?}");
    }

    #[test]
    fn each_delay_is_at_least_the_previous_one_until_the_cap() {
        // Equal jitter: attempt n draws from [c/2, c] and attempt n+1 from [c, 2c], so the
        // random halves never make a later delay shorter. Checked over many draws.
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..1000 {
            let mut b = Backoff::new(ms(100), Duration::from_secs(30));
            let delays: Vec<Duration> = (0..12).map(|_| b.next_delay(&mut rng)).collect();
            // Up to attempt 8 (ceiling 25.6 s); from attempt 9 the cap (30 s) bounds it.
            for pair in delays[..=8].windows(2) {
                assert!(pair[1] >= pair[0], "shrank: {delays:?}");
            }
            assert!(delays[11] >= Duration::from_secs(15), "{delays:?}");
        }
    }

    #[test]
    fn only_progress_resets() {
        let rng = &mut StdRng::seed_from_u64(3);
        let mut b = Backoff::new(ms(100), Duration::from_secs(30));
        // Sessions that fail without progress: the delays keep growing.
        let first = b.after_session(false, rng);
        assert!(first <= ms(100));
        for _ in 0..5 {
            b.after_session(false, rng);
        }
        assert!(b.after_session(false, rng) >= Duration::from_millis(3200));
        // A session that made progress: the next outage starts from the base again.
        assert!(b.after_session(true, rng) <= ms(100));
        assert!(b.after_session(false, rng) >= ms(100));
        assert!(b.after_session(false, rng) >= ms(200));
    }
}
