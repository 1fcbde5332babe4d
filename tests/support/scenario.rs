//! The set-up most end-to-end tests open with: a fresh database with the default outbox,
//! a broker, the outbox's topics on it, and a relay started against them.
//!
//! ```ignore
//! let s = Scenario::new("eos_zombie").partitions(3).await;
//! let (db, outbox, topics, bootstrap, _) = s.parts();
//! let client = db.client().await;
//! let mut relay = s.relay(&[EXACTLY_ONCE]);
//! s.wait_active(&client, Duration::from_secs(60)).await;
//! ```
//!
//! [`Scenario::new`] takes the shared PostgreSQL cluster; [`Scenario::on`] a test's own
//! (the database borrows it, so the cluster outlives the scenario). The broker is
//! [`Broker::default_for_tests`] unless [`ScenarioBuilder::broker`] gives another.

use std::time::Duration;

use pgtest::{PgCluster, TestDb};
use tokio_postgres::Client;

use super::broker::Broker;
use super::relay::Relay;
use super::schema::{self, Outbox};

/// One test's database, outbox, broker and topics.
pub struct Scenario<'c> {
    pub db: TestDb<'c>,
    pub outbox: Outbox,
    /// The broker's bootstrap servers.
    pub bootstrap: String,
    /// The aggregates' topics (by default `order` and `customer`), without the dead-letter
    /// topic.
    pub topics: Vec<String>,
    /// Last, as where tests made it first: the database goes before the broker.
    pub broker: Broker,
}

/// What [`Scenario`] to make: ended by the call that creates the topics.
pub struct ScenarioBuilder<'c> {
    cluster: &'c PgCluster,
    name: String,
    broker: Option<Broker>,
    aggregates: Vec<String>,
}

impl Scenario<'static> {
    /// A scenario on the shared cluster, its database named after `name`. A builder: it
    /// returns [`ScenarioBuilder`], whose topic-making call ends in the `Scenario`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(name: &str) -> ScenarioBuilder<'static> {
        Scenario::on(PgCluster::shared(), name)
    }
}

impl<'c> Scenario<'c> {
    /// A scenario on the test's own `cluster`.
    pub fn on(cluster: &'c PgCluster, name: &str) -> ScenarioBuilder<'c> {
        ScenarioBuilder {
            cluster,
            name: name.to_owned(),
            broker: None,
            aggregates: vec!["order".to_owned(), "customer".to_owned()],
        }
    }

    /// The scenario's pieces, to name them in a test: `let (db, outbox, topics, bootstrap,
    /// broker) = s.parts();` (`_` for those it does not use).
    pub fn parts(&self) -> (&TestDb<'c>, &Outbox, &[String], &str, &Broker) {
        (
            &self.db,
            &self.outbox,
            &self.topics,
            &self.bootstrap,
            &self.broker,
        )
    }

    /// The relay's environment for this scenario; `extra` entries override
    /// ([`Relay::env_for`]).
    pub fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        Relay::env_for(&self.db, &self.outbox, &self.bootstrap, extra)
    }

    /// `outboxd run` with [`Scenario::env`].
    pub fn relay(&self, extra: &[(&str, &str)]) -> Relay {
        Relay::start(self.env(extra), &["run"])
    }

    /// Waits until a relay holds the outbox's slot (and confirmed a position); its
    /// walsender's pid.
    pub async fn wait_active(&self, client: &Client, limit: Duration) -> i32 {
        super::ops::wait_active_pid(client, &self.outbox.slot, limit).await
    }
}

impl<'c> ScenarioBuilder<'c> {
    /// The broker to use instead of [`Broker::default_for_tests`].
    pub fn broker(mut self, broker: Broker) -> Self {
        self.broker = Some(broker);
        self
    }

    /// Three brokers ([`Broker::three_for_tests`]): [`Self::partitions`] then replicates
    /// every topic to all three and requires two in-sync replicas for an acks=all write.
    pub fn three_brokers(self) -> Self {
        self.broker(Broker::three_for_tests())
    }

    /// The aggregate types to make topics for, instead of `order` and `customer`.
    pub fn aggregates(mut self, aggregates: &[&str]) -> Self {
        self.aggregates = aggregates.iter().map(|&a| a.to_owned()).collect();
        self
    }

    /// The database with the default outbox ([`schema::setup`]), and on the broker each
    /// aggregate's topic and the dead-letter topic, `partitions` partitions each.
    pub async fn partitions(self, partitions: i32) -> Scenario<'c> {
        let s = self.setup().await;
        let dead_letter = s.outbox.dead_letter_topic();
        let names: Vec<&str> = s
            .topics
            .iter()
            .map(String::as_str)
            .chain([dead_letter.as_str()])
            .collect();
        s.broker.create_topics(&names, partitions).await;
        if let Some(cluster) = s.broker.own_kafka().filter(|c| c.node_ids().len() >= 3) {
            for t in names {
                cluster
                    .set_topic_config(t, "min.insync.replicas", "2")
                    .await
                    .expect("min.insync.replicas=2");
            }
        }
        s
    }

    /// The default topics, 4 partitions each, on a three-node cluster (the broker given
    /// must be one, e.g. `Broker::kafka(3)`), replicated to every node with two in-sync
    /// replicas required for an acks=all write ([`super::ops::replicated_topics`]).
    pub async fn replicated(self) -> Scenario<'c> {
        let mut s = self.setup().await;
        s.topics = super::ops::replicated_topics(&s.broker, &s.outbox).await;
        s
    }

    /// A partition without a leader, on a three-node Kafka of the scenario's own (any
    /// broker given is replaced): topics `order` (4 partitions), the dead-letter and the
    /// progress topic have their only replica on broker 1, `stuck` (1 partition) on broker
    /// 3, which is killed, so `stuck` events wait until the test restarts broker 3.
    /// `topics` is `[order, stuck]`.
    pub async fn stuck_on_broker_3(self) -> Scenario<'c> {
        let s = self
            .broker(Broker::kafka(3))
            .aggregates(&["order", "stuck"])
            .setup()
            .await;
        let [ok_topic, stuck_topic] = &s.topics[..] else {
            panic!("a stuck scenario has two aggregates: {:?}", s.topics);
        };
        let dead = s.outbox.dead_letter_topic();
        s.broker
            .create_topics_on(&[ok_topic, &dead], 4, 1, &[])
            .await;
        s.broker.create_progress_topic_on(1).await;
        s.broker.create_topics_on(&[stuck_topic], 1, 3, &[]).await;
        s.broker
            .kafka_cluster()
            .kill(3)
            .expect("the stuck topic's broker down");
        s
    }

    /// The database and outbox, and the broker, with no topics made: `topics` names them
    /// for the test to create as it needs.
    pub async fn no_topics(self) -> Scenario<'c> {
        self.setup().await
    }

    async fn setup(self) -> Scenario<'c> {
        let broker = self.broker.unwrap_or_else(Broker::default_for_tests);
        let db = self.cluster.fresh_database(&self.name).await;
        let outbox = schema::setup(&db).await;
        let bootstrap = broker.bootstrap();
        let topics = self.aggregates.iter().map(|a| outbox.topic(a)).collect();
        Scenario {
            broker,
            db,
            outbox,
            bootstrap,
            topics,
        }
    }
}
