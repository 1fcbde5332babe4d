//! The real `outboxd` binary as a child process.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgtest::TestDb;

use super::schema::Outbox;

pub struct Relay {
    child: Option<Child>,
    pub log: PathBuf,
    pub http_port: u16,
    pub env: Vec<(String, String)>,
}

/// A port that was free a moment ago and that no earlier call of this process returned
/// (see `outboxd_test_broker::free_port`: below the ephemeral range, reserved by a lock).
pub fn free_port() -> u16 {
    outboxd_test_broker::free_port().expect("a free port")
}

/// Numbers each relay's log file within this process.
static RELAY_LOGS: AtomicU64 = AtomicU64::new(0);

impl Relay {
    /// The environment a test relay runs with; `extra` entries override.
    pub fn env_for(
        db: &TestDb<'_>,
        outbox: &Outbox,
        bootstrap: &str,
        extra: &[(&str, &str)],
    ) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = db
            .pg_env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let http_port = free_port();
        let pairs = [
            ("PGSSLMODE", "disable".to_owned()),
            ("OUTBOXD_SLOT", outbox.slot.clone()),
            ("OUTBOXD_PUBLICATION", outbox.publication.clone()),
            ("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", bootstrap.to_owned()),
            (
                "OUTBOXD_TOPIC",
                format!("{}.{{aggregate_type}}", outbox.topic_prefix),
            ),
            ("OUTBOXD_DEAD_LETTER_TOPIC", outbox.dead_letter_topic()),
            ("OUTBOXD_HTTP_ADDR", format!("127.0.0.1:{http_port}")),
            ("OUTBOXD_LOG", "info,librdkafka=warn".to_owned()),
            ("OUTBOXD_RECONNECT_MAX_BACKOFF_MS", "2000".to_owned()),
        ];
        env.extend(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)));
        for (k, v) in extra {
            env.retain(|(ek, _)| ek != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        env
    }

    pub fn start(env: Vec<(String, String)>, args: &[&str]) -> Relay {
        let http_port = env
            .iter()
            .find(|(k, _)| k == "OUTBOXD_HTTP_ADDR")
            .and_then(|(_, v)| v.rsplit(':').next()?.parse().ok())
            .unwrap_or(0);
        // One file per relay: the name was a probed port before, and ports repeat, so two
        // relays of one run could share a file (appended, never truncated), and a test
        // reading its relay's log (for a line that must appear once, or must not appear)
        // read another's too. A file left by an earlier run with this pid goes first.
        let log = std::env::temp_dir().join(format!(
            "outboxd-test-{}-{}.log",
            std::process::id(),
            RELAY_LOGS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&log);
        let mut relay = Relay {
            child: None,
            log,
            http_port,
            env,
        };
        relay.spawn(args);
        relay
    }

    fn spawn(&mut self, args: &[&str]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("relay log file");
        let child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn outboxd");
        self.child = Some(child);
    }

    /// Starts the same relay again (after a kill).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(&["run"]);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL: no destructor, no final status update, nothing flushed.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("relay running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "outboxd did not exit within {limit:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET a path of the relay's HTTP endpoint; (status code, body).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|x| x.1.to_owned())?;
        Some((code, body))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- outboxd log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Runs `outboxd <args>` to completion with `env`; (exit code, stdout+stderr).
pub fn run_to_end(env: &[(String, String)], args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run outboxd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

impl Relay {
    /// Polls /metrics until `pick` finds what it waits for in the text (180 s at most:
    /// some waits span the relay's own timers, such as 30 s for a first look's record,
    /// and a loaded two-core machine stretches them).
    /// Counters move when the relay has processed an ack, which may be just after a
    /// consumer could read the record: tests wait for them, then check them exactly.
    pub async fn wait_metrics<T>(&self, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        super::ops::wait_for(
            what,
            Duration::from_secs(180),
            Duration::from_millis(100),
            || async {
                let (code, body) = self.http_get("/metrics")?;
                if code != 200 {
                    return None;
                }
                pick(&body)
            },
        )
        .await
    }

    /// Waits until `name` (summed over its labels) reaches `at_least`; its value then.
    pub async fn wait_metric_at_least(&self, name: &str, at_least: f64) -> f64 {
        self.wait_metrics(&format!("{name} to reach {at_least}"), |body| {
            super::ops::metric_sum(body, name).filter(|n| *n >= at_least)
        })
        .await
    }

    /// The value of an unlabelled metric (or the sum over its labels) from /metrics.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (code, body) = self.http_get("/metrics")?;
        if code != 200 {
            return None;
        }
        super::ops::metric_sum(&body, name)
    }

    /// One labelled series, e.g. `outboxd_events_dead_lettered_total{reason="oversize"}`.
    pub fn metric_series(&self, series: &str) -> Option<f64> {
        let (code, body) = self.http_get("/metrics")?;
        if code != 200 {
            return None;
        }
        super::ops::metric(&body, series)
    }

    /// Peak resident set size (VmHWM) of the running relay, in kB.
    pub fn peak_rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("relay's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// Replaces environment entries for the next (re)start.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }
}
