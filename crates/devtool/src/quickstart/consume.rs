//! Reads the quickstart topics from the beginning and prints every record as it arrives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// Event id -> how many times it arrived.
pub type Seen = Arc<Mutex<HashMap<String, usize>>>;

/// Dropping it (e.g. on Ctrl-C) also stops the consumer thread, before the broker goes.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub seen: Seen,
}

impl Watcher {
    /// Assigns every partition of `topics` from the beginning and prints arrivals on a thread.
    pub fn start(bootstrap: &str, topics: &[&str]) -> Result<Watcher> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "outboxd-quickstart")
            .set("enable.auto.commit", "false")
            // librdkafka waits up to 500 ms for a fetch to fill; the lag shown is the relay's.
            .set("fetch.wait.max.ms", "10")
            .set("log_level", "4")
            .create()
            .context("creating the Kafka consumer")?;
        let mut tpl = TopicPartitionList::new();
        for topic in topics {
            let md = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .with_context(|| format!("reading metadata of {topic}"))?;
            for t in md.topics() {
                for p in t.partitions() {
                    tpl.add_partition_offset(t.name(), p.id(), Offset::Beginning)?;
                }
            }
        }
        consumer.assign(&tpl).context("assigning partitions")?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Seen::default();
        let thread = {
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => record(&m, &seen),
                        Some(Err(e)) => eprintln!("quickstart: consumer error: {e}"),
                        None => {}
                    }
                }
            })
        };
        Ok(Watcher {
            stop,
            thread: Some(thread),
            seen,
        })
    }

    pub fn count(&self, id: &str) -> usize {
        self.seen
            .lock()
            .map(|s| s.get(id).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Stops the thread (within one 100 ms poll) and waits for it.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn record(m: &BorrowedMessage<'_>, seen: &Seen) {
    let header = |name: &str| -> Option<String> {
        let headers = m.headers()?;
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let key = m
        .key()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default();
    let payload = m
        .payload()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_else(|| "(null)".to_owned());
    let lag = header("outboxd.commit_time")
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|t| Some(now_millis()? - t))
        .map_or_else(|| "?".to_owned(), |ms| ms.to_string());
    let dead_letter = m.topic().ends_with("dead-letter");
    let what = if dead_letter {
        let error = header("outboxd.error").unwrap_or_default();
        format!("DEAD-LETTER {key} ({error})")
    } else {
        let aggregate_type = header("aggregate_type")
            .unwrap_or_else(|| m.topic().trim_start_matches("outbox.").to_owned());
        let event_type = header("event_type").unwrap_or_default();
        format!("{aggregate_type}/{key} {event_type}")
    };
    println!(
        "{what:<34} lag {lag:>4} ms  partition {} offset {:<3} {}",
        m.partition(),
        m.offset(),
        shorten(&payload, 90),
    );
    if dead_letter {
        return;
    }
    if let (Some(id), Ok(mut seen)) = (header("id"), seen.lock()) {
        *seen.entry(id).or_insert(0) += 1;
    }
}

fn now_millis() -> Option<i64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let head: String = s.chars().take(max).collect();
        format!("{head}…")
    }
}
