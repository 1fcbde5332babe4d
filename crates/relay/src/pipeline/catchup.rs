//! Progress while catching up a backlog: after downtime the relay may start minutes or
//! gigabytes behind, and an operator wants to know that it moves and when it will be
//! done, without reading metrics. Pure logic over samples; the session logs the lines.
//!
//! Behind means: at least [`ENTER_BYTES`] of WAL between the server's end and the
//! confirmed position, or at least [`ENTER_MIN_BYTES`] while the newest transaction read
//! committed [`ENTER_AGE`] or more ago (a backlog of old commits, not a burst of new
//! ones). Caught up means under [`LEAVE_BYTES`], or reading transactions committed less
//! than [`LEAVE_AGE`] ago: the two thresholds are apart so that a steady write load does
//! not flap between the two states.

use std::time::Duration;

use pgoutput::Lsn;

pub const ENTER_BYTES: u64 = 64 << 20;
pub const ENTER_MIN_BYTES: u64 = 1 << 20;
pub const ENTER_AGE: Duration = Duration::from_secs(5);
pub const LEAVE_BYTES: u64 = 256 << 10;
pub const LEAVE_AGE: Duration = Duration::from_secs(2);
/// How often a progress line is logged while behind.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);
/// Samples come on a 1 s tick that drifts a little; without slack a sample at 4.99 s
/// would skip a line and double the interval.
const SLACK: Duration = Duration::from_millis(500);

/// One look at where the relay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Since the session started (a monotonic clock).
    pub at: Duration,
    pub server_wal: Lsn,
    pub confirmed: Lsn,
    /// Events acknowledged by Kafka in this session.
    pub events: u64,
    /// How long ago the newest transaction read committed; `None` before the first.
    pub commit_age: Option<Duration>,
}

impl Sample {
    fn lag(&self) -> u64 {
        self.server_wal.0.saturating_sub(self.confirmed.0)
    }
}

/// A line to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Entered the behind state.
    Behind {
        lag_bytes: u64,
        commit_age: Option<Duration>,
    },
    Progress {
        lag_bytes: u64,
        commit_age: Option<Duration>,
        /// Events acknowledged per second since the previous line.
        events_per_sec: u64,
        /// WAL bytes confirmed per second since the previous line.
        bytes_per_sec: u64,
        /// At that rate; `None` while nothing is confirmed.
        eta: Option<Duration>,
    },
    CaughtUp {
        took: Duration,
        events: u64,
    },
}

#[derive(Debug, Default)]
pub struct CatchUp {
    behind: Option<Since>,
}

#[derive(Debug, Clone, Copy)]
struct Since {
    entered: Sample,
    last_report: Sample,
}

impl CatchUp {
    #[cfg(test)]
    pub fn is_behind(&self) -> bool {
        self.behind.is_some()
    }

    /// Feed a sample; returns the line to log, if any.
    pub fn observe(&mut self, s: Sample) -> Option<Report> {
        let lag = s.lag();
        match self.behind {
            None => {
                let old = s.commit_age.is_some_and(|a| a >= ENTER_AGE);
                if lag >= ENTER_BYTES || (lag >= ENTER_MIN_BYTES && old) {
                    self.behind = Some(Since {
                        entered: s,
                        last_report: s,
                    });
                    return Some(Report::Behind {
                        lag_bytes: lag,
                        commit_age: s.commit_age,
                    });
                }
                None
            }
            Some(since) => {
                let recent = s.commit_age.is_some_and(|a| a < LEAVE_AGE);
                if lag < LEAVE_BYTES || (recent && lag < ENTER_BYTES) {
                    self.behind = None;
                    return Some(Report::CaughtUp {
                        took: s.at.saturating_sub(since.entered.at),
                        events: s.events.saturating_sub(since.entered.events),
                    });
                }
                let elapsed = s.at.saturating_sub(since.last_report.at);
                if elapsed + SLACK < REPORT_EVERY {
                    return None;
                }
                let prev = since.last_report;
                let bytes_per_sec =
                    per_second(s.confirmed.0.saturating_sub(prev.confirmed.0), elapsed);
                let events_per_sec = per_second(s.events.saturating_sub(prev.events), elapsed);
                let eta = (bytes_per_sec > 0).then(|| Duration::from_secs(lag / bytes_per_sec));
                self.behind = Some(Since {
                    last_report: s,
                    ..since
                });
                Some(Report::Progress {
                    lag_bytes: lag,
                    commit_age: s.commit_age,
                    events_per_sec,
                    bytes_per_sec,
                    eta,
                })
            }
        }
    }
}

fn per_second(n: u64, over: Duration) -> u64 {
    let millis = over.as_millis().max(1);
    u64::try_from(u128::from(n).saturating_mul(1000) / millis).unwrap_or(u64::MAX)
}

/// `12.3 MiB`, with integer arithmetic.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scaled = u128::from(n) * 10;
    while scaled >= 10 * 1024 && unit + 1 < UNITS.len() {
        scaled /= 1024;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{}.{} {}", scaled / 10, scaled % 10, UNITS[unit])
    }
}

/// `1h02m`, `3m05s`, `42s`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: u64, server: u64, confirmed: u64, events: u64, age_s: u64) -> Sample {
        Sample {
            at: Duration::from_secs(at_s),
            server_wal: Lsn(server),
            confirmed: Lsn(confirmed),
            events,
            commit_age: Some(Duration::from_secs(age_s)),
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_backlog_is_reported_until_caught_up() {
        let mut c = CatchUp::default();
        // 10 MiB behind, reading transactions committed 10 minutes ago.
        assert_eq!(
            c.observe(sample(1, 10 * MIB, 0, 0, 600)),
            Some(Report::Behind {
                lag_bytes: 10 * MIB,
                commit_age: Some(Duration::from_secs(600))
            })
        );
        // No line until REPORT_EVERY has passed.
        assert_eq!(c.observe(sample(3, 10 * MIB, MIB, 1000, 500)), None);
        // 4 MiB confirmed in 5 s, 5000 events: 6 MiB left at 0.8 MiB/s = 7 s.
        match c.observe(sample(6, 10 * MIB, 4 * MIB, 5000, 300)) {
            Some(Report::Progress {
                lag_bytes,
                events_per_sec,
                bytes_per_sec,
                eta,
                ..
            }) => {
                assert_eq!(lag_bytes, 6 * MIB);
                assert_eq!(events_per_sec, 1000);
                assert_eq!(bytes_per_sec, 4 * MIB / 5);
                assert_eq!(eta, Some(Duration::from_secs(7)));
            }
            other => panic!("{other:?}"),
        }
        assert!(c.is_behind());
        assert_eq!(
            c.observe(sample(12, 10 * MIB, 10 * MIB - 1000, 9000, 0)),
            Some(Report::CaughtUp {
                took: Duration::from_secs(11),
                events: 9000
            })
        );
        assert!(!c.is_behind());
        assert_eq!(c.observe(sample(13, 10 * MIB, 10 * MIB, 9000, 100)), None);
    }

    #[test]
    fn a_burst_of_new_commits_is_not_a_backlog() {
        let mut c = CatchUp::default();
        // 8 MiB behind but reading what was committed a second ago: steady load.
        assert_eq!(c.observe(sample(1, 8 * MIB, 0, 0, 1)), None);
        // Idle for long (old last commit) but nothing to read.
        assert_eq!(c.observe(sample(2, 8 * MIB, 8 * MIB - 100, 0, 900)), None);
        // Far behind whatever the commit times.
        assert!(matches!(
            c.observe(sample(3, 100 * MIB, 0, 0, 1)),
            Some(Report::Behind { .. })
        ));
        // Nothing confirmed: no estimate.
        match c.observe(sample(9, 100 * MIB, 0, 0, 1)) {
            Some(Report::Progress { eta, .. }) => assert_eq!(eta, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10 * MIB + MIB / 2), "10.5 MiB");
        assert_eq!(human_bytes(u64::MAX), "16777215.9 TiB");
        assert_eq!(human_duration(Duration::from_secs(42)), "42s");
        assert_eq!(human_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(human_duration(Duration::from_secs(3720)), "1h02m");
    }
}
