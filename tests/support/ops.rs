//! Helpers of the operations tests (tests/ops_*.rs): a load generator that survives
//! server restarts, slot inspection, waiting with a deadline, reading until every
//! committed event arrived, and Prometheus text parsing.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use super::broker::Broker;
use super::consume::{check_delivery, DeliveryReport, Received};
use super::load::Event;
use super::schema::Outbox;

/// Waits until the server's clock is 3 s past the newest `created_at` of
/// `public.outbox`: a time read from a later look or write is then told apart from the
/// rows', whatever second it is rounded to and the one taken off it.
pub async fn wait_clock_past_rows(client: &Client) {
    wait_for(
        "the server's clock to pass the rows by 3 s",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let row = client
                .query_one(
                    "SELECT clock_timestamp() > max(created_at) + interval '3 seconds' FROM public.outbox",
                    &[],
                )
                .await
                .ok()?;
            row.get::<_, bool>(0).then_some(())
        },
    )
    .await;
}

/// Polls `probe` every `every` until it yields a value; panics with `what` after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, every: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

/// A SQL connection that may fail (the server may be restarting).
pub async fn try_connect(conn: &str) -> Option<Client> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls).await.ok()?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Some(client)
}

pub async fn connect(conn: &str) -> Client {
    wait_for(
        "a SQL connection",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || try_connect(conn),
    )
    .await
}

/// The slot as `pg_replication_slots` shows it; LSNs as byte positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    pub active_pid: Option<i32>,
    pub confirmed_flush: Option<u64>,
    pub restart: Option<u64>,
    pub wal_status: Option<String>,
    /// pg_current_wal_lsn() read in the same statement.
    pub current_wal: u64,
}

impl SlotRow {
    /// WAL the slot keeps: current − restart_lsn.
    pub fn retained(&self) -> u64 {
        self.restart
            .map_or(0, |r| self.current_wal.saturating_sub(r))
    }

    /// current − confirmed_flush_lsn.
    pub fn lag(&self) -> u64 {
        self.confirmed_flush
            .map_or(0, |c| self.current_wal.saturating_sub(c))
    }
}

fn to_u64(v: Option<i64>) -> Option<u64> {
    v.map(|v| u64::try_from(v).expect("positive lsn"))
}

/// `None` when the slot does not exist.
/// Writes WAL past the slot, switching segments and checkpointing, until the server
/// invalidates it (`wal_status = 'lost'`; the cluster needs a small
/// `max_slot_wal_keep_size`).
pub async fn invalidate_slot(client: &Client, slot: &str) {
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS filler (pad text)")
        .await
        .expect("filler");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        client
            .batch_execute(
                "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); \
                 SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .await
            .expect("generate WAL");
        let row = slot_row(client, slot).await.expect("slot");
        if row.wal_status.as_deref() == Some("lost") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slot not invalidated: {row:?}"
        );
    }
}

pub async fn slot_row(client: &Client, slot: &str) -> Option<SlotRow> {
    let row = client
        .query_opt(
            "SELECT active_pid, (confirmed_flush_lsn - '0/0')::bigint, (restart_lsn - '0/0')::bigint, \
             wal_status, (pg_current_wal_lsn() - '0/0')::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("reading pg_replication_slots")?;
    Some(SlotRow {
        active_pid: row.get(0),
        confirmed_flush: to_u64(row.get(1)),
        restart: to_u64(row.get(2)),
        wal_status: row.get(3),
        current_wal: to_u64(Some(row.get(4))).unwrap_or(0),
    })
}

pub async fn current_wal(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await
        .expect("pg_current_wal_lsn");
    to_u64(Some(row.get(0))).unwrap_or(0)
}

/// The walsender pid streaming `slot`, once it is active and past its creation.
///
/// A slot the relay is still creating is active too (its walsender holds it), but until
/// the snapshot is consistent (every transaction running at creation has ended, in any
/// database of the cluster) its `confirmed_flush_lsn` is NULL and what commits meanwhile
/// is before the slot's start: events inserted then are never decoded. When the relay
/// creates the slot, that wait lasts as long as another test's transaction runs (the
/// 1M-row insert takes 10-30 s); a slot made beforehand (`schema::setup`) is consistent
/// already, and then the wait is the relay's start on a loaded machine. Callers give it
/// 120 s: only a failing test waits that long.
pub async fn wait_active_pid(client: &Client, slot: &str, limit: Duration) -> i32 {
    wait_for(
        &format!("slot {slot} to become active"),
        limit,
        Duration::from_millis(50),
        || async {
            slot_row(client, slot)
                .await
                .filter(|r| r.confirmed_flush.is_some())
                .and_then(|r| r.active_pid)
        },
    )
    .await
}

/// The two topics of the default load plus the dead-letter topic, created on `broker`.
pub async fn create_topics(broker: &Broker, outbox: &Outbox) -> Vec<String> {
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    broker
        .create_topics(&[&topics[0], &topics[1], &outbox.dead_letter_topic()], 4)
        .await;
    topics
}

/// [`create_topics`] on a three-node cluster: every topic replicated to every node, and
/// two in-sync replicas required for an acks=all write.
pub async fn replicated_topics(broker: &Broker, outbox: &Outbox) -> Vec<String> {
    let topics = create_topics(broker, outbox).await;
    let cluster = broker.kafka_cluster();
    for t in topics
        .iter()
        .chain(std::iter::once(&outbox.dead_letter_topic()))
    {
        cluster
            .set_topic_config(t, "min.insync.replicas", "2")
            .await
            .expect("min.insync.replicas=2");
    }
    topics
}

/// [`create_topics`] on a three-node own Kafka whose acks=all writes can be refused on
/// demand ([`Broker::create_refusable_topics`]), with the progress topic on node 1.
pub async fn refusable_topics(broker: &Broker, outbox: &Outbox) -> Vec<String> {
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    broker
        .create_refusable_topics(&[&topics[0], &topics[1], &outbox.dead_letter_topic()], 4)
        .await;
    topics
}

/// [`create_topics`] on an own Kafka cluster, every partition's only replica on `node`.
pub async fn create_topics_on(
    broker: &Broker,
    outbox: &Outbox,
    partitions: i32,
    node: i32,
) -> Vec<String> {
    let topics = vec![outbox.topic("order"), outbox.topic("customer")];
    broker
        .create_topics_on(
            &[&topics[0], &topics[1], &outbox.dead_letter_topic()],
            partitions,
            node,
            &[],
        )
        .await;
    topics
}

/// What the load generator inserts.
#[derive(Debug, Clone)]
pub struct LoadShape {
    /// Transactions have 1..=max_txn events.
    pub max_txn: usize,
    pub aggregates: usize,
    /// Pause after each transaction.
    pub pause: Duration,
    /// Every `big_every`-th transaction has `big_size` events (0 = never).
    pub big_every: usize,
    pub big_size: usize,
}

impl Default for LoadShape {
    fn default() -> Self {
        LoadShape {
            max_txn: 20,
            aggregates: 50,
            pause: Duration::from_millis(10),
            big_every: 0,
            big_size: 0,
        }
    }
}

/// Inserts outbox events in a background task until stopped, reconnecting when the server
/// goes away. A transaction whose COMMIT outcome is unknown (the connection broke) is
/// looked up after reconnecting and counted only if it is there, so the returned events
/// are exactly the committed ones, in commit order.
pub struct LoadGen {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
    handle: JoinHandle<Vec<Event>>,
}

impl LoadGen {
    pub fn spawn(conn: String, table: String, shape: LoadShape) -> LoadGen {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let handle = tokio::spawn(run_load(
            conn,
            table,
            shape,
            Arc::clone(&stop),
            Arc::clone(&committed),
        ));
        LoadGen {
            stop,
            committed,
            handle,
        }
    }

    /// Events committed so far.
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` events are committed.
    pub async fn wait_committed(&self, n: usize, limit: Duration) {
        wait_for(
            &format!("the load to commit {n} events"),
            limit,
            Duration::from_millis(20),
            || async { (self.committed() >= n).then_some(()) },
        )
        .await;
    }

    /// Stops after the transaction in progress; the committed events in commit order.
    pub async fn stop(self) -> Vec<Event> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.await.expect("load task")
    }
}

async fn run_load(
    conn: String,
    table: String,
    shape: LoadShape,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
) -> Vec<Event> {
    let mut rng = StdRng::from_entropy();
    let mut seq = vec![0u64; shape.aggregates];
    let mut events = Vec::new();
    let mut client = connect(&conn).await;
    let mut txn_no = 0usize;
    while !stop.load(Ordering::Relaxed) {
        txn_no += 1;
        let n = if shape.big_every > 0 && txn_no.is_multiple_of(shape.big_every) {
            shape.big_size
        } else {
            rng.gen_range(1..=shape.max_txn)
        };
        let batch: Vec<Event> = (0..n)
            .map(|_| {
                let a = rng.gen_range(0..shape.aggregates);
                seq[a] += 1;
                Event {
                    id: uuid::Uuid::new_v4().to_string(),
                    aggregate_type: if a.is_multiple_of(2) {
                        "order"
                    } else {
                        "customer"
                    }
                    .into(),
                    aggregate_id: format!("agg-{a}"),
                    event_type: "Changed".into(),
                    payload: format!("{{\"agg\": {a}, \"seq\": {}}}", seq[a]),
                }
            })
            .collect();
        match super::load::try_insert(&client, &table, &batch).await {
            Ok(()) => {}
            Err(_) => {
                client = connect(&conn).await;
                // Did the broken transaction commit after all?
                let ids: Vec<&str> = batch.iter().map(|e| e.id.as_str()).collect();
                let row = client
                    .query_one(
                        &format!("SELECT count(*) FROM {table} WHERE id = ANY($1::text[]::uuid[])"),
                        &[&ids],
                    )
                    .await
                    .expect("looking up an uncertain transaction");
                let found: i64 = row.get(0);
                let found = usize::try_from(found).expect("count");
                assert!(found == 0 || found == batch.len(), "a partial transaction?");
                if found == 0 {
                    continue;
                }
            }
        }
        committed.fetch_add(batch.len(), Ordering::Relaxed);
        events.extend(batch);
        if !shape.pause.is_zero() {
            tokio::time::sleep(shape.pause).await;
        }
    }
    events
}

/// Reads every partition of `topics` from the beginning until every id of `committed`
/// arrived, then `settle` more (to see trailing replays). Panics after `limit` with the
/// number missing. Blocking: call from `tokio::task::block_in_place` or a thread.
pub fn read_all(
    bootstrap: &str,
    topics: &[String],
    committed: &[Event],
    settle: Duration,
    limit: Duration,
) -> Vec<Received> {
    let consumer = super::consume::assigned_consumer(bootstrap, topics);
    let mut missing: HashSet<&str> = committed.iter().map(|e| e.id.as_str()).collect();
    let mut out = Vec::new();
    let start = Instant::now();
    let mut complete_at: Option<Instant> = None;
    loop {
        if missing.is_empty() && complete_at.is_none() {
            complete_at = Some(Instant::now());
        }
        if complete_at.is_some_and(|t| t.elapsed() >= settle) {
            return out;
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?}, {} of {} committed events have not arrived ({} records read)",
            missing.len(),
            committed.len(),
            out.len()
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let r = super::consume::received(&m);
                if let Some(id) = r.header("id") {
                    missing.remove(id);
                }
                out.push(r);
            }
            Some(Err(e)) if super::consume::transient(&e) => {}
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
}

/// [`read_all`] from async code.
pub fn read_all_blocking(
    bootstrap: &str,
    topics: &[String],
    committed: &[Event],
    limit: Duration,
) -> Vec<Received> {
    tokio::task::block_in_place(|| {
        read_all(bootstrap, topics, committed, Duration::from_secs(2), limit)
    })
}

/// Reads the topics until every committed event arrived (see [`read_all`]), and checks
/// them: each arrived, nothing else did, and per aggregate in commit order.
pub fn read_and_check(
    broker: &Broker,
    topics: &[String],
    committed: &[Event],
    limit: Duration,
) -> DeliveryReport {
    let received = read_all_blocking(&broker.bootstrap(), topics, committed, limit);
    check_delivery(committed, &received)
}

/// How many records carry each event id.
pub fn id_counts(received: &[Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for r in received {
        let id = r.header("id").expect("every record carries an id header");
        *counts.entry(id.to_owned()).or_insert(0) += 1;
    }
    counts
}

/// The value of one sample of the Prometheus text `body`: `name` is the series as
/// written before the value, e.g. `outboxd_events_published_total` or
/// `outboxd_slot_wal_status{status="reserved"}`.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// A metric summed over its labels (or its one unlabelled sample) in a /metrics text.
pub fn metric_sum(body: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if series.split('{').next().unwrap_or(series) == name {
            let v: f64 = value.parse().ok()?;
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// A sample that must exist.
pub fn must_metric(body: &str, series: &str) -> f64 {
    metric(body, series).unwrap_or_else(|| panic!("metric {series} missing from:\n{body}"))
}

/// A relay streaming from a fresh database of the shared cluster to the tests' Kafka.
/// Fields drop in order: the relay stops before its database goes (a destructuring `let`
/// must bind `db`, e.g. `db: _db`, or the database goes at once).
pub struct Streaming {
    pub relay: super::relay::Relay,
    pub client: Client,
    pub outbox: Outbox,
    pub broker: Broker,
    pub topics: Vec<String>,
    pub db: pgtest::TestDb<'static>,
}

/// Starts the relay with `extra` env and waits until its walsender holds the slot.
pub async fn streaming_relay(name: &str, extra: &[(&str, &str)]) -> Streaming {
    streaming_relay_on(Broker::default_for_tests(), name, extra).await
}

/// [`streaming_relay`] on a given broker (one the test takes down: `Broker::kafka(1)`).
pub async fn streaming_relay_on(broker: Broker, name: &str, extra: &[(&str, &str)]) -> Streaming {
    let db = pgtest::PgCluster::shared().fresh_database(name).await;
    let outbox = super::schema::setup(&db).await;
    let topics = create_topics(&broker, &outbox).await;
    let relay = super::relay::Relay::start(
        super::relay::Relay::env_for(&db, &outbox, &broker.bootstrap(), extra),
        &["run"],
    );
    let client = db.client().await;
    wait_active_pid(&client, &outbox.slot, Duration::from_secs(120)).await;
    Streaming {
        db,
        outbox,
        broker,
        topics,
        relay,
        client,
    }
}

impl Streaming {
    /// Inserts `n` events and waits until every one arrived, in order per aggregate.
    pub async fn relay_events(&self, n: usize) -> Vec<Event> {
        let events = super::load::insert_events(&self.client, &self.outbox.table, n, 5, 5).await;
        let received = read_all_blocking(
            &self.broker.bootstrap(),
            &self.topics,
            &events,
            Duration::from_secs(60),
        );
        super::consume::check_delivery(&events, &received);
        events
    }
}

/// The cluster's system identifier, as progress record keys carry it.
pub async fn system_identifier(client: &Client) -> String {
    client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0)
}

/// The progress record key of `slot` in `database` (no cluster name).
pub async fn progress_key(client: &Client, database: &str, slot: &str) -> String {
    format!("{}/{database}/{slot}", system_identifier(client).await)
}

/// Writes `value` under `key` to the default progress topic, as any principal allowed to
/// write it could.
pub fn write_progress_record(bootstrap: &str, key: &str, value: &str) {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("producer");
    producer
        .send(
            BaseRecord::to(outboxd_test_broker::PROGRESS_TOPIC)
                .partition(0)
                .key(key)
                .payload(value),
        )
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(10)).expect("flush");
}

/// The newest progress record under `key`: `None` when there is none, or the newest is
/// a tombstone.
pub fn latest_progress_record(bootstrap: &str, key: &str) -> Option<serde_json::Value> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "progress-record-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("outboxd.progress", 0, rdkafka::Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    let mut latest = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.key() == Some(key.as_bytes()) => {
                latest = m.payload().map(<[u8]>::to_vec);
            }
            Some(Ok(_)) => {}
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) if super::consume::transient(&e) => {}
            Some(Err(e)) => panic!("progress topic: {e}"),
            None => {}
        }
    }
    serde_json::from_slice(&latest?).ok()
}

/// Waits until the server has ended recovery (a promoted standby, a restored copy).
pub async fn wait_out_of_recovery(client: &Client) {
    wait_for(
        "the server to end recovery",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let row = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .ok()?;
            (!row.get::<_, bool>(0)).then_some(())
        },
    )
    .await;
}

/// The timeline of the WAL being written now.
pub async fn current_timeline(client: &Client) -> u32 {
    let tli: String = client
        .query_one(
            "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            &[],
        )
        .await
        .expect("timeline")
        .get(0);
    u32::from_str_radix(&tli, 16).expect("hex timeline")
}

/// A relay on `outbox` (slot made by its first start, or before) that relayed a first
/// batch of `n` events, checked from the topics, and is still running.
pub struct FirstBatch {
    pub relay: super::relay::Relay,
    pub env: Vec<(String, String)>,
    pub topics: Vec<String>,
    pub first: Vec<Event>,
}

pub async fn relay_first_batch(
    db: &pgtest::TestDb<'_>,
    client: &Client,
    outbox: &Outbox,
    broker: &Broker,
    extra: &[(&str, &str)],
    n: usize,
) -> FirstBatch {
    let topics = create_topics(broker, outbox).await;
    let env = super::relay::Relay::env_for(db, outbox, &broker.bootstrap(), extra);
    let relay = super::relay::Relay::start(env.clone(), &["run"]);
    wait_active_pid(client, &outbox.slot, Duration::from_secs(120)).await;
    let first = super::load::insert_events(client, &outbox.table, n, 3, 3).await;
    check_delivery(
        &first,
        &read_all_blocking(
            &broker.bootstrap(),
            &topics,
            &first,
            Duration::from_secs(60),
        ),
    );
    FirstBatch {
        relay,
        env,
        topics,
        first,
    }
}

impl FirstBatch {
    /// SIGTERM, and a clean exit.
    pub fn stop(&mut self) {
        self.relay.signal("TERM");
        assert_eq!(
            self.relay.wait_exit(Duration::from_secs(30)).code(),
            Some(0)
        );
    }
}
