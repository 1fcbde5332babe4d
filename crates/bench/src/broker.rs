//! The brokers: librdkafka's mock cluster (`outboxd-dev broker`) and tansu, each a fresh
//! process per run with the benchmark topic created beforehand.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

pub const PARTITIONS: i32 = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Mock,
    Tansu,
}

impl BrokerKind {
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Mock => "mock",
            BrokerKind::Tansu => "tansu",
        }
    }
}

pub struct Broker {
    pub kind: BrokerKind,
    pub bootstrap: String,
    child: Child,
}

impl Broker {
    pub async fn start(
        kind: BrokerKind,
        bins: &Path,
        tansu: &Path,
        topics: &[&str],
    ) -> Result<Broker> {
        match kind {
            BrokerKind::Mock => {
                let mut cmd = Command::new(bins.join("outboxd-dev"));
                cmd.args(["broker", "--brokers", "1"]);
                for t in topics {
                    cmd.args(["--topic", &format!("{t}:{PARTITIONS}")]);
                }
                let mut child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting outboxd-dev broker")?;
                let stdout = child.stdout.take().context("broker stdout")?;
                let mut line = String::new();
                BufReader::new(stdout).read_line(&mut line)?;
                let bootstrap = line
                    .trim()
                    .strip_prefix("bootstrap.servers=")
                    .context("outboxd-dev broker printed no bootstrap.servers")?
                    .to_owned();
                Ok(Broker {
                    kind,
                    bootstrap,
                    child,
                })
            }
            BrokerKind::Tansu => {
                let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
                let url = format!("tcp://127.0.0.1:{port}");
                let child = Command::new(tansu)
                    .args(["broker", "--storage-engine", "memory://tansu/"])
                    .args(["--listener-url", &url, "--advertised-listener-url", &url])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("starting {}", tansu.display()))?;
                let broker = Broker {
                    kind,
                    bootstrap: format!("127.0.0.1:{port}"),
                    child,
                };
                broker.wait_reachable(Duration::from_secs(30))?;
                broker.create_topics(topics).await?;
                Ok(broker)
            }
        }
    }

    fn wait_reachable(&self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .create()?;
            if consumer
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("broker at {} not reachable", self.bootstrap);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    async fn create_topics(&self, topics: &[&str]) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
            .collect();
        let results = admin
            .create_topics(
                &new,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
            )
            .await?;
        for r in results {
            if let Err((topic, code)) = r {
                if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                    bail!("creating topic {topic}: {code:?}");
                }
            }
        }
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `~/.cargo/bin/tansu`, `TANSU_BIN`, or `tansu` on PATH, if it exists.
pub fn find_tansu() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cargo_bin = PathBuf::from(format!("{home}/.cargo/bin/tansu"));
    if cargo_bin.is_file() {
        return Some(cargo_bin);
    }
    let ok = Command::new("tansu")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then(|| PathBuf::from("tansu"))
}
