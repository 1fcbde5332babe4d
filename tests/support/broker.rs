//! Kafka-protocol brokers for tests: librdkafka's mock cluster (in-process, with fault
//! injection), a tansu broker process, or whatever OUTBOXD_TEST_BOOTSTRAP_SERVERS names.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub enum Broker {
    Mock(MockCluster<'static, DefaultProducerContext>),
    Tansu { child: Child, bootstrap: String },
    External(String),
}

impl Broker {
    /// The default broker of a test: OUTBOXD_TEST_BOOTSTRAP_SERVERS when set (e.g. Redpanda
    /// from docker/), else a fresh 3-broker mock cluster.
    pub fn default_for_tests() -> Broker {
        match std::env::var("OUTBOXD_TEST_BOOTSTRAP_SERVERS") {
            Ok(s) if !s.is_empty() => Broker::External(s),
            _ => Broker::mock(),
        }
    }

    pub fn mock() -> Broker {
        let cluster = MockCluster::new(3).expect("librdkafka mock cluster");
        // The mock cluster has no CreateTopics API: outboxd's progress topic is made here,
        // as an operator would on a cluster without topic auto-creation.
        cluster
            .create_topic("outboxd.progress", 1, 1)
            .expect("progress topic");
        Broker::Mock(cluster)
    }

    /// A tansu broker process on a free port, in-memory storage.
    pub fn tansu() -> Broker {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(tansu_binary())
            .args(["broker", "--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &url, "--advertised-listener-url", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start tansu ({e}): install it with `cargo install tansu --version 0.6.0 --features dynostore --locked` (or run .ci/run)")
            });
        let broker = Broker::Tansu {
            child,
            bootstrap: format!("127.0.0.1:{port}"),
        };
        broker.wait_reachable(Duration::from_secs(30));
        broker
    }

    pub fn bootstrap(&self) -> String {
        match self {
            Broker::Mock(m) => m.bootstrap_servers(),
            Broker::Tansu { bootstrap, .. } => bootstrap.clone(),
            Broker::External(s) => s.clone(),
        }
    }

    pub fn mock_cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        match self {
            Broker::Mock(m) => m,
            _ => panic!("this test needs librdkafka's mock cluster for fault injection"),
        }
    }

    pub fn set_all_down(&self, down: bool) {
        let m = self.mock_cluster();
        for id in 1..=3 {
            if down {
                m.broker_down(id).expect("broker_down");
            } else {
                m.broker_up(id).expect("broker_up");
            }
        }
    }

    fn wait_reachable(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", self.bootstrap())
                .create()
                .expect("metadata client");
            if consumer
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "broker at {} not reachable",
                self.bootstrap()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Creates topics (the Java-compatible brokers do not all auto-create on produce).
    pub async fn create_topics(&self, topics: &[&str], partitions: i32) {
        if let Broker::Mock(m) = self {
            for t in topics {
                m.create_topic(t, partitions, 1).expect("mock create_topic");
            }
            return;
        }
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("admin client");
        let new: Vec<NewTopic> = topics
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
            .collect();
        let results = admin
            .create_topics(
                &new,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
            )
            .await
            .expect("create_topics");
        for r in results {
            if let Err((topic, code)) = r {
                assert!(
                    code == rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                    "creating {topic}: {code:?}"
                );
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Broker::Tansu { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tansu_binary() -> String {
    if let Ok(p) = std::env::var("TANSU_BIN") {
        return p;
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cargo_bin = format!("{home}/.cargo/bin/tansu");
    if std::path::Path::new(&cargo_bin).is_file() {
        cargo_bin
    } else {
        "tansu".into()
    }
}
