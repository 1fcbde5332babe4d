//! Reads back what the relay produced and checks it against what was committed.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::load::Event;

#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_millis: Option<i64>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    pub fn key_str(&self) -> &str {
        self.key
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
            .unwrap_or("")
    }

    /// The record's size as librdkafka counts it against `message.max.bytes`.
    pub fn wire_size(&self) -> usize {
        let headers: Vec<(usize, usize)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.len(), v.len()))
            .collect();
        wire_size(
            self.key.as_ref().map_or(0, Vec::len),
            self.value.as_ref().map_or(0, Vec::len),
            &headers,
        )
    }
}

/// librdkafka's rule, written out here independently of outbox-core: 36 bytes of v2
/// record framing at its largest, key, value, and per header a zig-zag varint of the
/// name length, the name, a zig-zag varint of the value length, the value.
pub fn wire_size(key: usize, value: usize, headers: &[(usize, usize)]) -> usize {
    fn varint(n: usize) -> usize {
        let mut v = 2 * n;
        let mut bytes = 1;
        while v >= 0x80 {
            v >>= 7;
            bytes += 1;
        }
        bytes
    }
    36 + key
        + value
        + headers
            .iter()
            .map(|&(n, v)| varint(n) + n + varint(v) + v)
            .sum::<usize>()
}

/// Reads every partition of `topics` from the beginning until `want` records arrived, or
/// nothing new arrived for `idle`, or `limit` passed.
pub fn read_topics(
    bootstrap: &str,
    topics: &[String],
    want: usize,
    idle: Duration,
    limit: Duration,
) -> Vec<Received> {
    let mut out = Vec::new();
    if want == 0 {
        return out;
    }
    stream_topics(bootstrap, topics, idle, limit, |m| {
        out.push(received(m));
        out.len() < want
    });
    out
}

/// A broker of the cluster unreachable for now (a test killed it, or it restarts): the
/// consumer reads on from the others and retries, as it does on its own.
pub fn transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e,
        KafkaError::MessageConsumption(C::BrokerTransportFailure | C::AllBrokersDown)
    )
}

/// A consumer assigned to every partition of `topics`, from the beginning. A topic created
/// a moment before may not be in the brokers' metadata yet: it is asked again (bounded)
/// until it lists partitions, never assigned as empty.
pub fn assigned_consumer(bootstrap: &str, topics: &[String]) -> BaseConsumer {
    assigned_consumer_at(bootstrap, topics, "read_committed", Offset::Beginning)
}

/// [`assigned_consumer`] reading at `isolation` (`read_committed`, librdkafka's default, or
/// `read_uncommitted`), each partition from `from`.
pub fn assigned_consumer_at(
    bootstrap: &str,
    topics: &[String],
    isolation: &str,
    from: Offset,
) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "outboxd-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let deadline = Instant::now() + Duration::from_secs(60);
        let partitions: Vec<i32> = loop {
            let found = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .ok()
                .and_then(|md| {
                    md.topics()
                        .iter()
                        .find(|t| t.name() == topic && t.error().is_none())
                        .map(|t| t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>())
                })
                .filter(|p| !p.is_empty());
            if let Some(p) = found {
                break p;
            }
            assert!(
                Instant::now() < deadline,
                "topic {topic} has no partitions in the brokers' metadata"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        for p in partitions {
            tpl.add_partition_offset(topic, p, from).expect("tpl");
        }
    }
    consumer.assign(&tpl).expect("assign");
    consumer
}

/// Streams every record of `topics` from the beginning (each partition in offset order)
/// into `on_record` until it returns false, nothing new arrived for `idle`, or `limit`
/// passed. Keeps nothing itself; returns how many records were seen.
pub fn stream_topics(
    bootstrap: &str,
    topics: &[String],
    idle: Duration,
    limit: Duration,
    mut on_record: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> usize {
    let consumer = assigned_consumer(bootstrap, topics);
    let start = Instant::now();
    let mut last_new = Instant::now();
    let mut seen = 0;
    while last_new.elapsed() < idle && start.elapsed() < limit {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                seen += 1;
                last_new = Instant::now();
                if !on_record(&m) {
                    break;
                }
            }
            Some(Err(e)) if transient(&e) => {}
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
    seen
}

/// The owned form of one consumed record.
pub fn received(m: &BorrowedMessage<'_>) -> Received {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    Received {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
        timestamp_millis: m.timestamp().to_millis(),
    }
}

/// Reads `topics` until every id in `want` arrived (by the `id` header), then keeps
/// reading until nothing new arrives for `settle`, so trailing replays and unexpected
/// extra records are seen too. Panics after `limit` naming how many ids are missing.
pub fn read_until_ids(
    bootstrap: &str,
    topics: &[String],
    want: &HashSet<String>,
    settle: Duration,
    limit: Duration,
) -> Vec<Received> {
    let mut out = Vec::new();
    let mut missing: HashSet<String> = want.clone();
    let start = Instant::now();
    let mut done_at: Option<Instant> = None;
    let consumer = assigned_consumer(bootstrap, topics);
    let mut last_new = Instant::now();
    loop {
        if done_at.is_some() && last_new.elapsed() >= settle {
            break;
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?}, {} of {} expected events have not arrived ({} records read; first missing: {:?})",
            missing.len(),
            want.len(),
            out.len(),
            missing.iter().next()
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let r = received(&m);
                if let Some(id) = r.header("id") {
                    missing.remove(id);
                }
                out.push(r);
                last_new = Instant::now();
                if missing.is_empty() && done_at.is_none() {
                    done_at = Some(Instant::now());
                }
            }
            Some(Err(e)) if transient(&e) => {}
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {
                if missing.is_empty() && done_at.is_none() {
                    done_at = Some(Instant::now());
                }
            }
        }
    }
    out
}

/// Ids of `events`, for [`read_until_ids`].
pub fn ids(events: &[Event]) -> HashSet<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// What a consumer that dedups by event id sees.
pub struct DeliveryReport {
    pub unique: usize,
    pub duplicates: usize,
}

/// Asserts every committed event arrived, and per aggregate, the order of first arrivals
/// equals commit order. Returns the duplicate count (replays after a crash are allowed).
pub fn check_delivery(committed: &[Event], received: &[Received]) -> DeliveryReport {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut duplicates = 0;
    let mut arrived: HashMap<&str, Vec<&str>> = HashMap::new();
    // Kafka keeps order per partition; arrivals of one aggregate share a partition.
    let mut by_partition: HashMap<(&str, i32), Vec<&Received>> = HashMap::new();
    for r in received {
        by_partition
            .entry((&r.topic, r.partition))
            .or_default()
            .push(r);
    }
    for records in by_partition.values_mut() {
        records.sort_by_key(|r| r.offset);
        for r in records.iter() {
            let id = r.header("id").expect("every record carries an id header");
            if seen.insert(id) {
                arrived.entry(r.key_str()).or_default().push(id);
            } else {
                duplicates += 1;
            }
        }
    }
    let mut expected: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in committed {
        expected.entry(&e.aggregate_id).or_default().push(&e.id);
    }
    let missing: Vec<String> = committed
        .iter()
        .filter(|e| !seen.contains(e.id.as_str()))
        .map(|e| e.id.clone())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} committed events never arrived (first: {:?})",
        missing.len(),
        committed.len(),
        missing.first()
    );
    for (agg, want) in &expected {
        let got = arrived.get(agg).cloned().unwrap_or_default();
        assert_eq!(
            &got, want,
            "aggregate {agg}: arrival order differs from commit order"
        );
    }
    DeliveryReport {
        unique: seen.len(),
        duplicates,
    }
}
