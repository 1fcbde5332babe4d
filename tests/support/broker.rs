//! The tests' face of `outboxd-test-broker`: a failure to start or reach a broker fails the
//! test where it happens, so test bodies stay free of error plumbing.
//!
//! Which broker a test gets says what it needs:
//! - [`Broker::default_for_tests`]: a real Apache Kafka node shared by the test process (or
//!   the user's own broker from `OUTBOXD_TEST_BOOTSTRAP_SERVERS`); each test makes its own
//!   topics. Every delivery guarantee is asserted here.
//! - [`Broker::kafka`]: a Kafka cluster of the test's own (one node or three) that the test
//!   kills, hangs and restarts.
//! - [`Broker::mock`]: librdkafka's mock cluster, only for what a real broker cannot be made
//!   to do on demand (injected Produce errors, a partition moved to a chosen broker).

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub use outboxd_test_broker::kafka::KafkaCluster;

/// The key of [`Broker::wait_acks_all_refused`]'s probe records.
pub const PROBE_KEY: &str = "outboxd-test-probe";

/// Whether `r` is a probe record of [`Broker::wait_acks_all_refused`], not an event.
pub fn is_probe(r: &super::consume::Received) -> bool {
    r.key_str() == PROBE_KEY
}

pub struct Broker(outboxd_test_broker::Broker);

impl Broker {
    /// The default broker of a test: OUTBOXD_TEST_BOOTSTRAP_SERVERS when set (e.g. Redpanda
    /// from docker/), else the process's shared Apache Kafka node.
    pub fn default_for_tests() -> Broker {
        match outboxd_test_broker::Broker::from_env() {
            Some(b) => Broker(b),
            None => Broker(
                outboxd_test_broker::Broker::shared_kafka()
                    .unwrap_or_else(|e| panic!("starting the tests' Kafka: {e}")),
            ),
        }
    }

    /// Where a delivery guarantee is asserted on three brokers: the user's broker from
    /// OUTBOXD_TEST_BOOTSTRAP_SERVERS when set, else a three-node Kafka of the test's own.
    pub fn three_for_tests() -> Broker {
        match outboxd_test_broker::Broker::from_env() {
            Some(b) => Broker(b),
            None => Broker::kafka(3),
        }
    }

    /// The test's own Kafka cluster, if it has one.
    pub fn own_kafka(&self) -> Option<&KafkaCluster> {
        self.0.kafka_cluster().ok()
    }

    /// A fresh Apache Kafka cluster of `nodes` nodes (1 or 3) of this test's own: for
    /// outages, hangs and leader changes. A user's external broker cannot be killed, so
    /// these tests always start their own.
    pub fn kafka(nodes: usize) -> Broker {
        Broker(
            outboxd_test_broker::Broker::kafka(nodes)
                .unwrap_or_else(|e| panic!("starting a {nodes}-node Kafka: {e}")),
        )
    }

    /// [`Broker::kafka`] with brokers that create a topic when a client first asks for it
    /// (`auto.create.topics.enable=true`): to show a command creates none.
    pub fn kafka_auto_creating(nodes: usize) -> Broker {
        Broker(
            outboxd_test_broker::Broker::kafka_auto_creating(nodes)
                .unwrap_or_else(|e| panic!("starting an auto-creating {nodes}-node Kafka: {e}")),
        )
    }

    pub fn mock() -> Broker {
        Broker(outboxd_test_broker::Broker::mock(3).expect("librdkafka mock cluster"))
    }

    pub fn bootstrap(&self) -> String {
        self.0.bootstrap()
    }

    pub fn mock_cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        self.0
            .mock_cluster()
            .expect("this test needs librdkafka's mock cluster for fault injection")
    }

    /// The test's own Kafka cluster, for kills, hangs and restarts.
    pub fn kafka_cluster(&self) -> &KafkaCluster {
        self.0
            .kafka_cluster()
            .expect("this test needs a Kafka cluster of its own (Broker::kafka)")
    }

    /// Every broker down (mock: marked down; Kafka: kill -9) or back up (Kafka: restarted
    /// on its ports with its logs, returning once every node is registered again).
    pub fn set_all_down(&self, down: bool) {
        self.0.set_all_down(down).expect("brokers down/up");
    }

    /// Sets one topic config, as `kafka-configs --alter --add-config key=value` would.
    pub async fn set_topic_config(&self, topic: &str, key: &str, value: &str) {
        outboxd_test_broker::kafka::set_topic_config(&self.bootstrap(), topic, key, value)
            .await
            .unwrap_or_else(|e| panic!("{key}={value} on {topic}: {e}"));
    }

    /// Creates `topics` on a three-node own Kafka (`Broker::kafka(3)`) so that their acks=all
    /// writes can be refused on demand ([`Broker::refuse_acks_all`]), and the progress topic
    /// on node 1 alone, writable throughout. Kafka caps a partition's min.insync.replicas at
    /// its replication factor, so one replica cannot be made too few: every partition gets
    /// two, on nodes 1 and 2, and node 2 goes down. Led by node 1 with it alone in sync, they
    /// take acks=all writes while min.insync.replicas is 1 and refuse them while it is 2; the
    /// switch is the config alone, with no leader moving.
    pub async fn create_refusable_topics(&self, topics: &[&str], partitions: i32) {
        self.create_topics_replicated_on(
            topics,
            partitions,
            &[1, 2],
            &[("min.insync.replicas", "1")],
        )
        .await;
        self.create_progress_topic_on(1).await;
        self.kafka_cluster().kill(2).expect("node 2 down");
    }

    /// Every acks=all write to `topics` (made by [`Broker::create_refusable_topics`]) refused
    /// with NOT_ENOUGH_REPLICAS, retriable, from when this returns.
    pub async fn refuse_acks_all(&self, topics: &[String], partitions: i32) {
        for t in topics {
            self.set_topic_config(t, "min.insync.replicas", "2").await;
        }
        self.wait_acks_all_refused(topics, partitions).await;
    }

    /// Undoes [`Broker::refuse_acks_all`]: `topics` take acks=all writes again.
    pub async fn take_acks_all(&self, topics: &[String]) {
        for t in topics {
            self.set_topic_config(t, "min.insync.replicas", "1").await;
        }
    }

    /// Waits until every partition of `topics` refuses an acks=all write with
    /// NOT_ENOUGH_REPLICAS, e.g. after raising their `min.insync.replicas` above their
    /// replicas: the brokers describe a new config a moment before their partitions use it,
    /// so a write sent in between would still be taken. Each probe is one record sent once,
    /// keyed [`PROBE_KEY`] and without an `id` header; one taken before the change stays in
    /// its topic, and a reader drops it ([`is_probe`]).
    pub async fn wait_acks_all_refused(&self, topics: &[String], partitions: i32) {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("enable.idempotence", "false")
            .set("acks", "all")
            .set("retries", "0")
            .set("message.timeout.ms", "10000")
            .create()
            .expect("probe producer");
        let mut open: Vec<(&str, i32)> = topics
            .iter()
            .flat_map(|t| (0..partitions).map(move |p| (t.as_str(), p)))
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !open.is_empty() {
            let mut still = Vec::new();
            for (topic, partition) in open {
                let record = FutureRecord::to(topic)
                    .partition(partition)
                    .key(PROBE_KEY)
                    .payload("");
                match producer.send(record, std::time::Duration::ZERO).await {
                    Err((
                        KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas),
                        _,
                    )) => {}
                    _ => still.push((topic, partition)),
                }
            }
            open = still;
            if open.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after 60 s, {open:?} still take acks=all writes"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Creates topics on an own Kafka cluster with every partition's only replica on `node`
    /// (killing `node` then leaves them without a leader: a stuck partition), with topic
    /// `configs` set at creation (no window in which a reader sees the defaults).
    pub async fn create_topics_on(
        &self,
        topics: &[&str],
        partitions: i32,
        node: i32,
        configs: &[(&str, &str)],
    ) {
        self.0
            .create_topics_on(topics, partitions, &[node], configs)
            .await
            .expect("create_topics_on");
    }

    /// [`Broker::create_topics_on`] with every partition replicated to `nodes`, the first
    /// preferred as leader (killing another then shrinks the partitions' in-sync replicas
    /// without moving their leader).
    pub async fn create_topics_replicated_on(
        &self,
        topics: &[&str],
        partitions: i32,
        nodes: &[i32],
        configs: &[(&str, &str)],
    ) {
        self.0
            .create_topics_on(topics, partitions, nodes, configs)
            .await
            .expect("create_topics_replicated_on");
    }

    /// outboxd's progress topic, compacted, with its only replica on `node` of an own
    /// Kafka cluster (it stays writable while other nodes are down).
    pub async fn create_progress_topic_on(&self, node: i32) {
        self.create_topics_on(
            &[outboxd_test_broker::PROGRESS_TOPIC],
            1,
            node,
            &[("cleanup.policy", "compact")],
        )
        .await;
    }

    /// Every topic the brokers list (one metadata request for all topics, which creates
    /// none), to see what a command left behind.
    pub fn topic_names(&self) -> std::collections::BTreeSet<String> {
        self.listed_topics().expect("topic metadata")
    }

    /// Creates topics (replicated to every node of an own three-node cluster). Topics that
    /// exist already are not asked for: a test may have placed them itself and killed a
    /// node since (`create_refusable_topics`), and a CreateTopics sent then timed out for
    /// minutes (CI, 2026-12-06, twice); a metadata request any live node answers.
    pub async fn create_topics(&self, topics: &[&str], partitions: i32) {
        let existing = self.listed_topics().unwrap_or_default();
        let missing: Vec<&str> = topics
            .iter()
            .copied()
            .filter(|t| !existing.contains(*t))
            .collect();
        if missing.is_empty() {
            return;
        }
        self.0
            .create_topics(&missing, partitions)
            .await
            .expect("create_topics");
    }

    /// The topics the brokers list, `None` if none answers within 10 s.
    fn listed_topics(&self) -> Option<std::collections::BTreeSet<String>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .set("allow.auto.create.topics", "false")
            .create()
            .ok()?;
        let md = consumer
            .fetch_metadata(None, std::time::Duration::from_secs(10))
            .ok()?;
        Some(
            md.topics()
                .iter()
                .filter(|t| t.error().is_none())
                .map(|t| t.name().to_owned())
                .collect(),
        )
    }
}
