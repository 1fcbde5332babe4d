//! Kafka-protocol brokers for outboxd's end-to-end tests and its benchmark suite, so both
//! start, reach and fill brokers the same way:
//!
//! - librdkafka's mock cluster, in this process (fault injection: brokers up and down) or
//!   as an `outboxd-dev broker` child process (the benchmarks keep its CPU out of theirs);
//! - Apache Kafka (KRaft) JVM processes, one node or three ([`kafka`]): the default of
//!   every test that asserts a delivery guarantee;
//! - an external broker named by `OUTBOXD_TEST_BOOTSTRAP_SERVERS` (e.g. Redpanda from
//!   docker/).

pub mod kafka;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaErrorCode;

/// The variable naming an external broker for the tests.
pub const BOOTSTRAP_ENV: &str = "OUTBOXD_TEST_BOOTSTRAP_SERVERS";

/// outboxd's progress topic; made up front on the mock cluster, which has no CreateTopics.
pub const PROGRESS_TOPIC: &str = "outboxd.progress";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka client: {0}")]
    Kafka(#[from] KafkaError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("broker at {0} not reachable")]
    Unreachable(String),
    #[error("creating topic {topic}: {code:?}")]
    CreateTopic {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("{0} printed no bootstrap.servers line")]
    NoBootstrap(String),
    #[error("fault injection needs librdkafka's in-process mock cluster, not {0}")]
    NotMock(&'static str),
    #[error("this fault needs a broker of the test's own (Broker::kafka), not {0}")]
    NotOwned(&'static str),
    #[error("Apache Kafka's jars are not in {0}: run `scripts/install-deps --kafka` (or set OUTBOXD_KAFKA_LIBS)")]
    NoKafka(String),
    #[error("`java` does not run: install a Java 17+ runtime (`scripts/install-deps --kafka` does) or set JAVA_HOME")]
    NoJava,
    #[error("no Kafka node {0} in this cluster")]
    NoSuchNode(i32),
    #[error("{what}: {detail}")]
    KafkaCommand { what: String, detail: String },
    #[error("no free port below the ephemeral range")]
    NoFreePort,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

pub enum Broker {
    /// librdkafka's mock cluster in this process, with its number of brokers (ids 1..=n).
    Mock {
        cluster: MockCluster<'static, DefaultProducerContext>,
        brokers: i32,
    },
    /// A broker child process (`outboxd-dev broker`), killed on drop.
    Process {
        name: &'static str,
        child: Child,
        bootstrap: String,
    },
    /// Apache Kafka; `owned` when the test started it (faults allowed), not when it is
    /// the process's shared node.
    Kafka {
        cluster: Arc<kafka::KafkaCluster>,
        owned: bool,
    },
    External(String),
}

impl Broker {
    /// The broker's own process, when it is one child process: `outboxd-dev broker`, or
    /// the JVM of a one-node Kafka (a cluster has no single process).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Broker::Process { child, .. } => Some(child.id()),
            Broker::Kafka { cluster, .. } if cluster.node_ids() == [1] => cluster.pid(1),
            Broker::Mock { .. } | Broker::External(_) | Broker::Kafka { .. } => None,
        }
    }

    /// A fresh Apache Kafka cluster of `nodes` nodes (1 or 3) of the caller's own, for
    /// tests that kill, hang or restart brokers.
    pub fn kafka(nodes: usize) -> Result<Broker> {
        Self::own_kafka(nodes, "", kafka::Jit::QuickStart)
    }

    /// [`Broker::kafka`] of one node compiled for speed once warm ([`kafka::Jit::Throughput`]):
    /// a benchmark's broker.
    pub fn kafka_for_throughput() -> Result<Broker> {
        Self::own_kafka(1, "", kafka::Jit::Throughput)
    }

    /// [`Broker::kafka`] whose brokers create a topic when a client first asks for it
    /// (`auto.create.topics.enable=true`), as development brokers do.
    pub fn kafka_auto_creating(nodes: usize) -> Result<Broker> {
        Self::own_kafka(
            nodes,
            "auto.create.topics.enable=true",
            kafka::Jit::QuickStart,
        )
    }

    fn own_kafka(nodes: usize, extra: &str, jit: kafka::Jit) -> Result<Broker> {
        Ok(Broker::Kafka {
            cluster: Arc::new(kafka::KafkaCluster::start_with(nodes, extra, jit)?),
            owned: true,
        })
    }

    /// The process's shared single-node Apache Kafka (started on first use).
    pub fn shared_kafka() -> Result<Broker> {
        Ok(Broker::Kafka {
            cluster: kafka::KafkaCluster::shared()?,
            owned: false,
        })
    }

    /// The Kafka cluster behind this broker, if the test may inject faults into it.
    pub fn kafka_cluster(&self) -> Result<&kafka::KafkaCluster> {
        match self {
            Broker::Kafka {
                cluster,
                owned: true,
            } => Ok(cluster),
            other => Err(Error::NotOwned(other.name())),
        }
    }

    /// The external broker of `OUTBOXD_TEST_BOOTSTRAP_SERVERS`, if that is set and not empty.
    pub fn from_env() -> Option<Broker> {
        match std::env::var(BOOTSTRAP_ENV) {
            Ok(s) if !s.is_empty() => Some(Broker::External(s)),
            _ => None,
        }
    }

    /// A fresh in-process mock cluster of `brokers` brokers, with the progress topic made
    /// as an operator would on a cluster without topic auto-creation.
    pub fn mock(brokers: i32) -> Result<Broker> {
        let cluster = MockCluster::new(brokers)?;
        cluster.create_topic(PROGRESS_TOPIC, 1, 1)?;
        Ok(Broker::Mock { cluster, brokers })
    }

    /// The mock cluster as an `outboxd-dev broker` child process (`outboxd_dev` is that
    /// binary), with `topics` of `partitions` partitions; it makes the progress topic itself.
    pub fn mock_process(
        outboxd_dev: &Path,
        brokers: u32,
        topics: &[&str],
        partitions: i32,
    ) -> Result<Broker> {
        let mut cmd = Command::new(outboxd_dev);
        cmd.args(["broker", "--brokers", &brokers.to_string()]);
        for t in topics {
            cmd.args(["--topic", &format!("{t}:{partitions}")]);
        }
        let what = format!("starting {}", outboxd_dev.display());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(what.clone()))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            BufReader::new(stdout)
                .read_line(&mut line)
                .map_err(io(what))?;
        }
        let Some(bootstrap) = line.trim().strip_prefix("bootstrap.servers=") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::NoBootstrap(outboxd_dev.display().to_string()));
        };
        Ok(Broker::Process {
            name: "mock",
            bootstrap: bootstrap.to_owned(),
            child,
        })
    }

    pub fn bootstrap(&self) -> String {
        match self {
            Broker::Mock { cluster, .. } => cluster.bootstrap_servers(),
            Broker::Process { bootstrap, .. } => bootstrap.clone(),
            Broker::Kafka { cluster, .. } => cluster.bootstrap(),
            Broker::External(s) => s.clone(),
        }
    }

    /// "mock", "kafka" or "external", for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Broker::Mock { .. } => "mock",
            Broker::Kafka { .. } => "kafka",
            Broker::Process { name, .. } => name,
            Broker::External(_) => "external",
        }
    }

    pub fn mock_cluster(&self) -> Result<&MockCluster<'static, DefaultProducerContext>> {
        match self {
            Broker::Mock { cluster, .. } => Ok(cluster),
            other => Err(Error::NotMock(other.name())),
        }
    }

    /// Takes every broker down, or brings them all back: the in-process mock cluster's,
    /// or an own Kafka cluster's (kill -9, then a restart on the same ports and logs).
    pub fn set_all_down(&self, down: bool) -> Result<()> {
        if let Broker::Kafka { .. } = self {
            return self.kafka_cluster()?.set_all_down(down);
        }
        let Broker::Mock { cluster, brokers } = self else {
            return Err(Error::NotMock(self.name()));
        };
        for id in 1..=*brokers {
            if down {
                cluster.broker_down(id)?;
            } else {
                cluster.broker_up(id)?;
            }
        }
        Ok(())
    }

    /// Waits until the broker answers a metadata request, for at most `limit`.
    pub fn wait_reachable(&self, limit: Duration) -> Result<()> {
        let bootstrap = self.bootstrap();
        let deadline = Instant::now() + limit;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        loop {
            if consumer
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Unreachable(bootstrap));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Creates `topics` of `partitions` partitions on an own Kafka cluster with every
    /// partition's replicas on `nodes`, the first preferred as leader: with one node,
    /// killing it leaves them without a leader (a stuck partition) while the rest of the
    /// cluster answers; with two, killing the second leaves them led, with one in-sync
    /// replica. `configs` are set at creation.
    pub async fn create_topics_on(
        &self,
        topics: &[&str],
        partitions: i32,
        nodes: &[i32],
        configs: &[(&str, &str)],
    ) -> Result<()> {
        let cluster = self.kafka_cluster()?;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap())
            .create()?;
        let assignment: Vec<&[i32]> = (0..partitions).map(|_| nodes).collect();
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| {
                configs.iter().fold(
                    NewTopic::new(t, partitions, TopicReplication::Variable(&assignment)),
                    |topic, (k, v)| topic.set(k, v),
                )
            })
            .collect();
        create(&admin, &new).await
    }

    /// Creates `topics` of `partitions` partitions, replicated to every node of an own
    /// Kafka cluster (up to 3) and once elsewhere; one that exists already is fine. Needed because not every Kafka-protocol broker auto-creates on produce, and
    /// the mock cluster has no CreateTopics API at all (it is told directly).
    pub async fn create_topics(&self, topics: &[&str], partitions: i32) -> Result<()> {
        if let Broker::Mock { cluster, .. } = self {
            for t in topics {
                cluster.create_topic(t, partitions, 1)?;
            }
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()?;
        let replication = match self {
            Broker::Kafka { cluster, .. } => {
                i32::try_from(cluster.node_ids().len().min(3)).unwrap_or(1)
            }
            _ => 1,
        };
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
            .collect();
        create(&admin, &new).await
    }
}

/// CreateTopics; a topic that exists already is fine. A request that timed out (locally
/// or at the controller) is made again, for up to six minutes: a three-node cluster just
/// started, on a loaded machine, has let three in a row time out (CI runs 22 and 25, the
/// same test), and six (2026-12-06, `lost_slot_time`, while the 3-thread suite ran).
async fn create(admin: &AdminClient<DefaultClientContext>, new: &[NewTopic<'_>]) -> Result<()> {
    let options = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(20)))
        .request_timeout(Some(Duration::from_secs(30)));
    let again = |code: Option<RDKafkaErrorCode>| {
        matches!(
            code,
            Some(
                RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::RequestTimedOut
                    | RDKafkaErrorCode::NotController
            )
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(360);
    loop {
        let last = std::time::Instant::now() >= deadline;
        let results = match admin.create_topics(new, &options).await {
            Err(e) if !last && again(e.rdkafka_error_code()) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            other => other?,
        };
        // Each topic's own answer: created, there already, or (again) timed out.
        let mut timed_out = false;
        for r in results {
            if let Err((topic, code)) = r {
                if code == RDKafkaErrorCode::TopicAlreadyExists {
                } else if !last && again(Some(code)) {
                    timed_out = true;
                } else {
                    return Err(Error::CreateTopic { topic, code });
                }
            }
        }
        if !timed_out {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Broker::Process { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The low and high watermark of each of `topic`'s first `partitions` partitions, as a
/// consumer of `isolation` (`read_committed` or `read_uncommitted`) sees them. A leader
/// moving or not yet elected answers `NotLeaderForPartition` for a moment, so an error is
/// asked again for up to a minute: a test's count must not fail on the broker's weather.
pub fn watermarks(
    bootstrap: &str,
    isolation: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<(i64, i64)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("isolation.level", isolation)
        .create()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    (0..partitions)
        .map(|p| loop {
            match consumer.fetch_watermarks(topic, p, Duration::from_secs(10)) {
                Ok(w) => break Ok(w),
                Err(e) if Instant::now() >= deadline => break Err(Error::Kafka(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        })
        .collect()
}

/// A port on 127.0.0.1 that was free a moment ago and that no earlier call of this process
/// returned. Not one the OS picks (port 0): it hands the same ephemeral ports to everything
/// that binds port 0 (mock brokers, servers, clients' outgoing connections, other test
/// processes), so a port probed and released was once taken by someone else before the
/// relay or broker bound it ("Address already in use", a test lost). These come from below
/// the ephemeral range (32768+ on Linux), from a band of this process's own (by pid, so the
/// matrix's concurrent processes mostly keep apart), each checked free before it is handed
/// out, and reserved for the life of this process by a lock file: two test processes whose
/// bands met (pids equal modulo the band count) handed one port to two relays, and one lost
/// its address to the other ("Address already in use" on PG17). A Kafka node keeps its
/// port across a restart, so a port once handed out is never handed out again here.
pub fn free_port() -> Result<u16> {
    const FIRST: u32 = 20_000;
    const BANDS: u32 = 48;
    const BAND: u32 = 250;
    static NEXT: Mutex<u32> = Mutex::new(0);
    static RESERVED: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let band = FIRST + (std::process::id() % BANDS) * BAND;
    for _ in 0..BANDS * BAND {
        let candidate = FIRST + (band - FIRST + *next) % (BANDS * BAND);
        *next += 1;
        let Ok(port) = u16::try_from(candidate) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        let path = std::env::temp_dir().join(format!("outboxd-test-port-{port}.lock"));
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        // Released by the OS when this process ends, however it ends.
        if file.try_lock().is_ok() {
            RESERVED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(file);
            return Ok(port);
        }
    }
    Err(Error::NoFreePort)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    fn partitions(broker: &Broker, topic: &str) -> usize {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap())
            .create()
            .unwrap();
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        md.topics()[0].partitions().len()
    }

    #[tokio::test]
    async fn mock_cluster_has_the_progress_topic_and_creates_topics() {
        let broker = Broker::mock(3).unwrap();
        broker.wait_reachable(Duration::from_secs(10)).unwrap();
        broker.create_topics(&["t_mock"], 4).await.unwrap();
        assert_eq!(partitions(&broker, "t_mock"), 4);
        assert_eq!(partitions(&broker, PROGRESS_TOPIC), 1);
        broker.set_all_down(true).unwrap();
        broker.set_all_down(false).unwrap();
        assert_eq!(broker.name(), "mock");
    }

    /// One node: it starts, refuses to create topics on produce, takes a topic, survives a
    /// kill -9 and a restart on its ports with its log, and answers again after a hang.
    #[tokio::test(flavor = "multi_thread")]
    async fn kafka_node_starts_restarts_and_keeps_its_records() {
        if !kafka::available() {
            panic!(
                "{}",
                kafka::find_libs()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| Error::NoJava.to_string())
            );
        }
        let broker = Broker::kafka(1).unwrap();
        broker.create_topics(&["t_kafka"], 3).await.unwrap();
        broker.create_topics(&["t_kafka"], 3).await.unwrap();
        assert_eq!(partitions(&broker, "t_kafka"), 3);
        let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap())
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        let send = |key: &'static str| {
            producer.send(
                rdkafka::producer::FutureRecord::to("t_kafka")
                    .key(key)
                    .payload("v"),
                Duration::from_secs(30),
            )
        };
        send("a").await.unwrap();
        // No auto-creation: a produce to an unknown topic fails.
        let unknown = producer
            .send(
                rdkafka::producer::FutureRecord::<str, str>::to("t_missing").payload("v"),
                Duration::from_secs(3),
            )
            .await;
        assert!(unknown.is_err());
        let cluster = broker.kafka_cluster().unwrap();
        cluster.kill(1).unwrap();
        cluster.restart(&[1], 1).unwrap();
        send("b").await.unwrap();
        cluster.set_paused(1, true).unwrap();
        cluster.set_paused(1, false).unwrap();
        send("c").await.unwrap();
        assert_eq!(cluster.leader("t_kafka", 0).unwrap(), 1);
        let shared = Broker::shared_kafka().unwrap();
        assert!(matches!(
            shared.set_all_down(true),
            Err(Error::NotOwned("kafka"))
        ));
    }

    /// Three nodes, one quorum: a topic replicated three times keeps taking writes with
    /// its leader killed, and the killed node rejoins.
    #[tokio::test(flavor = "multi_thread")]
    async fn kafka_three_nodes_survive_a_leader_kill() {
        let broker = Broker::kafka(3).unwrap();
        broker.create_topics(&["t3"], 1).await.unwrap();
        let cluster = broker.kafka_cluster().unwrap();
        let leader = cluster.leader("t3", 0).unwrap();
        cluster.kill(leader).unwrap();
        let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap())
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        producer
            .send(
                rdkafka::producer::FutureRecord::to("t3")
                    .key("k")
                    .payload("v"),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert_ne!(cluster.leader("t3", 0).unwrap(), leader);
        cluster.restart(&[leader], 3).unwrap();
    }

    #[test]
    fn an_unreachable_broker_is_an_error() {
        let port = free_port().unwrap();
        let broker = Broker::External(format!("127.0.0.1:{port}"));
        assert!(matches!(
            broker.wait_reachable(Duration::from_secs(1)),
            Err(Error::Unreachable(_))
        ));
    }
}
