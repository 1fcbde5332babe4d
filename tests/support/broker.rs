//! The tests' face of `outboxd-test-broker`: a failure to start or reach a broker fails the
//! test where it happens, so test bodies stay free of error plumbing.

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub struct Broker(outboxd_test_broker::Broker);

impl Broker {
    /// The default broker of a test: OUTBOXD_TEST_BOOTSTRAP_SERVERS when set (e.g. Redpanda
    /// from docker/), else a fresh 3-broker mock cluster.
    pub fn default_for_tests() -> Broker {
        match outboxd_test_broker::Broker::from_env() {
            Some(b) => Broker(b),
            None => Broker::mock(),
        }
    }

    pub fn mock() -> Broker {
        Broker(outboxd_test_broker::Broker::mock(3).expect("librdkafka mock cluster"))
    }

    /// A tansu broker process on a free port, in-memory storage.
    pub fn tansu() -> Broker {
        let bin = outboxd_test_broker::find_tansu().unwrap_or_else(|| "tansu".into());
        Broker(outboxd_test_broker::Broker::tansu(&bin).unwrap_or_else(|e| {
            panic!("tansu ({e}): install it with `cargo install tansu --version 0.6.0 --features dynostore --locked` (or run .ci/run)")
        }))
    }

    pub fn bootstrap(&self) -> String {
        self.0.bootstrap()
    }

    pub fn mock_cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        self.0
            .mock_cluster()
            .expect("this test needs librdkafka's mock cluster for fault injection")
    }

    pub fn set_all_down(&self, down: bool) {
        self.0.set_all_down(down).expect("mock brokers down/up");
    }

    /// Creates topics (the Java-compatible brokers do not all auto-create on produce).
    pub async fn create_topics(&self, topics: &[&str], partitions: i32) {
        self.0
            .create_topics(topics, partitions)
            .await
            .expect("create_topics");
    }
}
