//! The real `outboxd` relay as a child process, its output prefixed `[outboxd]`.

use std::io::IsTerminal;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

pub struct Relay {
    child: Child,
    pid: u32,
    pub http_addr: String,
    output: Vec<JoinHandle<()>>,
}

/// `outboxd` next to this executable (both come from `cargo build --release --bins`).
pub fn binary() -> Result<PathBuf> {
    let path = std::env::current_exe()
        .context("finding the current executable")?
        .with_file_name("outboxd");
    if !path.is_file() {
        bail!(
            "the relay binary {} is missing: build it with cargo build --release --bins \
             (scripts/quickstart does this)",
            path.display()
        );
    }
    Ok(path)
}

impl Relay {
    /// `outboxd run` with the given libpq variables and the broker; HTTP on a free port.
    pub fn spawn(bin: &PathBuf, pg_env: &[(&str, String)], bootstrap: &str) -> Result<Relay> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for the relay's HTTP endpoint")?
            .port();
        let http_addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(bin);
        cmd.arg("run");
        // The caller's own settings would point the relay elsewhere.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("OUTBOXD_") || name.starts_with("PG") {
                cmd.env_remove(name);
            }
        }
        cmd.envs(pg_env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", bootstrap)
            .env("OUTBOXD_HTTP_ADDR", &http_addr)
            // The demo shows emitted messages too; in production, turn them on only
            // after restricting who may call pg_logical_emit_message (sql/role.sql).
            .env("OUTBOXD_MESSAGE_PREFIX", "outbox")
            .env("OUTBOXD_LOG", "info,librdkafka=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: Ctrl-C reaches us, and we stop the relay with SIGTERM.
            .process_group(0)
            .kill_on_drop(true);
        if !std::io::stdout().is_terminal() {
            // Its log goes through a pipe to our terminal; no colour codes in a file.
            cmd.env("NO_COLOR", "1");
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("the relay exited at once")?;
        let mut output = Vec::new();
        if let Some(out) = child.stdout.take() {
            output.push(tokio::spawn(prefix_lines(out, false)));
        }
        if let Some(err) = child.stderr.take() {
            output.push(tokio::spawn(prefix_lines(err, true)));
        }
        println!(
            "quickstart: started {} run (pid {pid}), metrics on http://{http_addr}/metrics",
            bin.display()
        );
        Ok(Relay {
            child,
            pid,
            http_addr,
            output,
        })
    }

    /// `Some(status)` when the relay has exited.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// The `outboxd_*` sample lines of GET /metrics.
    pub async fn metrics(&self) -> Result<Vec<String>> {
        let fetch = async {
            let mut stream = tokio::net::TcpStream::connect(&self.http_addr).await?;
            let request = format!(
                "GET /metrics HTTP/1.0\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.http_addr
            );
            stream.write_all(request.as_bytes()).await?;
            let mut body = Vec::new();
            stream.read_to_end(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        let body = tokio::time::timeout(Duration::from_secs(5), fetch)
            .await
            .context("GET /metrics timed out")?
            .with_context(|| format!("GET http://{}/metrics", self.http_addr))?;
        Ok(String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| l.starts_with("outboxd_"))
            .map(str::to_owned)
            .collect())
    }

    /// SIGTERM, then waits up to `limit` for a clean exit (SIGKILL after that).
    pub async fn stop(mut self, limit: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            self.drain_output().await;
            return Ok(status);
        }
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .context("running kill -TERM")?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        let status = match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                eprintln!(
                    "quickstart: outboxd did not exit within {limit:?} of SIGTERM; killing it"
                );
                self.child.kill().await?;
                self.child.wait().await?
            }
        };
        self.drain_output().await;
        Ok(status)
    }

    async fn drain_output(&mut self) {
        for task in self.output.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
    }
}

async fn prefix_lines(stream: impl AsyncRead + Unpin, to_stderr: bool) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if to_stderr {
            eprintln!("[outboxd] {line}");
        } else {
            println!("[outboxd] {line}");
        }
    }
}
