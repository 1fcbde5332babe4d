//! Prometheus text exposition format (version 0.0.4) for a [`MetricsSnapshot`].

use std::fmt::Write as _;
use std::time::Duration;

use super::histogram::HistogramSnapshot;
use super::metrics::{MetricsSnapshot, SlotWalStatus};

/// `Content-Type` of [`super::Telemetry::render_prometheus`]'s output.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn render(s: &MetricsSnapshot) -> String {
    render_all(&[(None, s)])
}

/// Several relays' metrics (the shards of one process) in one exposition: each family
/// once, with a `shard` label on every sample of a sharded relay.
pub fn render_all(relays: &[(Option<u32>, &MetricsSnapshot)]) -> String {
    let mut out = Text {
        text: String::with_capacity(4096 * relays.len().max(1)),
        shard: None,
    };
    out.single(
        relays,
        "events_published_total",
        "counter",
        "Events acknowledged by Kafka.",
        |s| s.events_published_total,
    );
    out.header(
        "events_dead_lettered_total",
        "counter",
        "Events sent to the dead-letter topic, by reason.",
    );
    out.each(relays, |out, s| {
        for (reason, n) in &s.events_dead_lettered_total {
            out.sample(
                "events_dead_lettered_total",
                Some(("reason", reason.as_str())),
                *n,
            );
        }
    });
    out.header(
        "ignored_rows_total",
        "counter",
        "Inserts into published relations that are not the outbox table (nor one of its partitions), by relation.",
    );
    out.each(relays, |out, s| {
        for (relation, n) in &s.ignored_rows_total {
            out.labelled(
                "ignored_rows_total",
                Some(("relation", &escape_label(relation))),
                &n.to_string(),
            );
        }
    });
    out.single(
        relays,
        "events_skipped_total",
        "counter",
        "Events PostgreSQL sent again (after a restart) that were not published again: Kafka already had them.",
        |s| s.events_skipped_total,
    );
    out.single(
        relays,
        "progress_record_unread_total",
        "counter",
        "Stream starts that could not read the progress record in time (3 s) or at all: what PostgreSQL sent again was published again.",
        |s| s.progress_record_unread_total,
    );
    out.single(
        relays,
        "progress_record_invalid_total",
        "counter",
        "Reads that found this slot's progress record unreadable (not a record outboxd writes): nothing is skipped on it, the slot is confirmed as usual, and the next write replaces it. Someone else writes the topic.",
        |s| s.progress_record_invalid_total,
    );
    out.single(
        relays,
        "publication_looks_unsettled_total",
        "counter",
        "Looks at the publication that could not count: a transaction was committed in the WAL but not yet visible to queries (a commit waiting for a synchronous standby). The slot is not confirmed past such a look until the commit is visible; rising for long means synchronous replication is stuck.",
        |s| s.publication_looks_unsettled_total,
    );
    out.single(
        relays,
        "catalog_checks_total",
        "counter",
        "Rounds of the periodic checks of the publication, the shard layout and the slot (every few seconds), those put off included.",
        |s| s.catalog_checks_total,
    );
    out.single(
        relays,
        "catalog_checks_deferred_total",
        "counter",
        "Periodic checks of the publication or the shard layout put off because a table they read was locked (the application's DDL: a partition created beside a DEFAULT one, VACUUM FULL); done again at the next check. Rising for long means those checks are not running.",
        |s| s.catalog_checks_deferred_total,
    );
    out.header(
        "replay_doubts_total",
        "counter",
        "Replays published again instead of skipped, by the doubt that stopped the proof that Kafka has them (duplicates, never a loss; see docs/replay-skip.md).",
    );
    out.each(relays, |out, s| {
        for (reason, n) in &s.replay_doubts_total {
            out.sample("replay_doubts_total", Some(("reason", reason.as_str())), *n);
        }
    });
    out.single(
        relays,
        "progress_foreign_writes_total",
        "counter",
        "Times this slot's progress record was found written by another lineage: two live copies of one cluster record under one key (set OUTBOXD_CLUSTER_NAME on each).",
        |s| s.progress_foreign_writes_total,
    );
    out.single(
        relays,
        "replay_held_messages",
        "gauge",
        "Replayed messages held unpublished until the progress record's transaction proves them delivered.",
        |s| s.replay_held_messages,
    );
    out.single(
        relays,
        "progress_recorded_lsn",
        "gauge",
        "The confirmed position the slot's progress record holds, as last acknowledged by the broker (0: this process has written none yet).",
        |s| s.progress_recorded_lsn,
    );
    out.single(
        relays,
        "progress_write_errors_total",
        "counter",
        "Progress record writes that failed (each leaves an older record: more replays after a restart, never a lost event).",
        |s| s.progress_write_errors_total,
    );
    out.single(
        relays,
        "kafka_brokers_up",
        "gauge",
        "Brokers listed in the last metadata answer (probed every 5 s); 0 when none answered.",
        |s| s.kafka_brokers_up,
    );
    out.single(
        relays,
        "delivery_errors_total",
        "counter",
        "Failed Kafka deliveries, and producers stopped by a fatal error (each restarts the pipeline).",
        |s| s.delivery_errors_total,
    );
    out.single(
        relays,
        "reconnects_total",
        "counter",
        "Restarts of the replication stream and producer.",
        |s| s.reconnects_total,
    );
    out.single(
        relays,
        "status_updates_sent_total",
        "counter",
        "Standby status updates sent to PostgreSQL.",
        |s| s.status_updates_sent_total,
    );
    out.single(
        relays,
        "in_flight_messages",
        "gauge",
        "Messages produced and not yet acknowledged.",
        |s| s.in_flight_messages,
    );
    out.single(
        relays,
        "in_flight_bytes",
        "gauge",
        "Bytes of messages produced and not yet acknowledged.",
        |s| s.in_flight_bytes,
    );
    out.single(
        relays,
        "received_lsn",
        "gauge",
        "Highest WAL position received from the server.",
        |s| s.received_lsn,
    );
    out.single(
        relays,
        "confirmed_lsn",
        "gauge",
        "WAL position confirmed to the server (everything before it is in Kafka).",
        |s| s.confirmed_lsn,
    );
    out.single(
        relays,
        "acked_lsn",
        "gauge",
        "WAL position before which every event is acknowledged by Kafka (the slot is confirmed up to it after the publication check).",
        |s| s.acked_lsn,
    );
    out.single(
        relays,
        "confirmed_bytes_total",
        "counter",
        "Bytes of WAL the confirmed position advanced in this process (its first position, where the slot stood, is not counted): rate() of it is the relay's throughput in WAL.",
        |s| s.confirmed_bytes_total,
    );
    out.header(
        "lag_breakdown_bytes",
        "gauge",
        "Where the lag is, by stage: receive = the server's WAL end minus what was received; ack = received, not yet acknowledged by Kafka; confirm = acknowledged, not yet confirmed to the slot.",
    );
    out.each(relays, |out, s| {
        for (stage, bytes) in lag_breakdown(s) {
            out.sample("lag_breakdown_bytes", Some(("stage", stage)), bytes);
        }
    });
    out.single(
        relays,
        "server_wal_end_lsn",
        "gauge",
        "Server WAL end reported by the last keepalive.",
        |s| s.server_wal_end_lsn,
    );
    out.single(
        relays,
        "lag_bytes",
        "gauge",
        "Bytes of WAL between the server's end and the confirmed position.",
        |s| s.lag_bytes,
    );
    out.single(
        relays,
        "slot_retained_wal_bytes",
        "gauge",
        "WAL the replication slot keeps on the server.",
        |s| s.slot_retained_wal_bytes,
    );
    // Absent, rather than a made-up number, while the server sets no cap.
    if relays.iter().any(|(_, s)| s.slot_safe_wal_size.is_some()) {
        out.header(
            "slot_safe_wal_size_bytes",
            "gauge",
            "WAL that may still be written before the slot is invalidated (pg_replication_slots.safe_wal_size; only with max_slot_wal_keep_size).",
        );
        out.each(relays, |out, s| {
            if let Some(safe) = s.slot_safe_wal_size {
                out.raw_sample("slot_safe_wal_size_bytes", &safe.to_string());
            }
        });
    }
    out.header(
        "slot_wal_status",
        "gauge",
        "Replication slot wal_status (1 for the current one).",
    );
    out.each(relays, |out, s| {
        for status in SlotWalStatus::ALL {
            let v = u64::from(status == s.slot_wal_status);
            out.sample("slot_wal_status", Some(("status", status.as_str())), v);
        }
    });
    out.single(
        relays,
        "slot_failover_ready",
        "gauge",
        "1 when the slot would survive a standby's promotion: a failover slot (PostgreSQL 17+), synchronized_standby_slots set on the primary and each listed standby slot connected.",
        |s| u64::from(s.slot_failover_ready),
    );
    out.single(
        relays,
        "pgoutput_binary",
        "gauge",
        "1 when the replication stream carries binary column values (OUTBOXD_PGOUTPUT_BINARY), 0 for text.",
        |s| u64::from(s.pgoutput_binary),
    );
    out.header(
        "oldest_unacked_age_seconds",
        "gauge",
        "Age of the oldest event not yet acknowledged by Kafka.",
    );
    out.each(relays, |out, s| {
        out.raw_sample("oldest_unacked_age_seconds", &seconds(s.oldest_unacked_age));
    });
    out.single(
        relays,
        "replication_connected",
        "gauge",
        "1 when the replication stream is connected.",
        |s| u64::from(s.replication_connected),
    );
    out.single(
        relays,
        "standby",
        "gauge",
        "1 while this instance stands by: another instance holds the slot, and this one takes over when it is released.",
        |s| u64::from(s.standby),
    );
    out.single(
        relays,
        "producer_healthy",
        "gauge",
        "1 when the Kafka producer is usable.",
        |s| u64::from(s.producer_healthy),
    );

    out.histogram(
        relays,
        "commit_to_ack_seconds",
        "Time from PostgreSQL commit to Kafka acknowledgement.",
        |s| &s.commit_to_ack,
    );
    // The exactly-once mode's Kafka transactions (all zero in at-least-once mode).
    out.single(
        relays,
        "kafka_transactions_committed_total",
        "counter",
        "Kafka transactions committed (OUTBOXD_DELIVERY=exactly-once), split ones included.",
        |s| s.kafka_txn_committed_total,
    );
    out.single(
        relays,
        "kafka_transactions_split_total",
        "counter",
        "Kafka transactions committed inside one PostgreSQL transaction, because it was open longer than half of transaction.timeout.ms (or outboxd was stopping): a read_committed consumer sees that PostgreSQL transaction in parts.",
        |s| s.kafka_txn_split_total,
    );
    out.single(
        relays,
        "kafka_partitions_committed_in_doubt_total",
        "counter",
        "Partitions a Kafka transaction was committed into while an older transaction was still open there that this process had not aborted (another producer's, or one of this relay's left open by Kafka or by a process that died; or the partition's last stable offset could not be read). Were it one of this relay's, its events are read twice (docs/transactional-mode.md, \"A transaction Kafka left open\").",
        |s| s.kafka_txn_in_doubt_total,
    );
    out.header(
        "kafka_transactions_aborted_total",
        "counter",
        "Kafka transactions that ended without a commit, by cause: abortable = librdkafka reported an abortable error, or acks were too slow for transaction.timeout.ms, restart = the session ended for another reason, expired = the broker aborted it, open longer than transaction.timeout.ms (outboxd stalled). Their events are published again from the slot.",
    );
    out.each(relays, |out, s| {
        for (cause, n) in &s.kafka_txn_aborted_total {
            out.sample(
                "kafka_transactions_aborted_total",
                Some(("cause", cause.as_str())),
                *n,
            );
        }
    });
    out.histogram(
        relays,
        "kafka_transaction_commit_seconds",
        "Time a Kafka transaction's commit took: the wait for its last acks, a look at the publication, the progress record and EndTxn.",
        |s| &s.kafka_txn_commit,
    );
    out.text
}

/// The lag split into stages, server end → received → acked → confirmed. The positions
/// are updated at different moments (confirmed with every ack, acked once a second,
/// received with data only: idle keepalives move the others), so each is taken as at
/// least the one after it: nothing is confirmed unacked, nor acked unreceived. All zero
/// until the relay has confirmed a position.
fn lag_breakdown(s: &MetricsSnapshot) -> [(&'static str, u64); 3] {
    if s.confirmed_lsn == 0 {
        return [("receive", 0), ("ack", 0), ("confirm", 0)];
    }
    let acked = s.acked_lsn.max(s.confirmed_lsn);
    let received = s.received_lsn.max(acked);
    let server_end = s.server_wal_end_lsn.max(received);
    [
        ("receive", server_end - received),
        ("ack", received - acked),
        ("confirm", acked - s.confirmed_lsn),
    ]
}

/// Seconds with microsecond precision, without going through floats.
fn micros_as_seconds(micros: u64) -> String {
    let frac = micros % 1_000_000;
    if frac == 0 {
        (micros / 1_000_000).to_string()
    } else {
        let text = format!("{}.{frac:06}", micros / 1_000_000);
        text.trim_end_matches('0').to_owned()
    }
}

fn seconds(d: Duration) -> String {
    micros_as_seconds(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A label value as the exposition format wants it: `\\`, `"` and newlines escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Text {
    text: String,
    /// The shard whose samples are being written: a label on each of them.
    shard: Option<u32>,
}

impl Text {
    // Writing into a String cannot fail, hence the ignored fmt::Results.
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP outboxd_{name} {help}");
        let _ = writeln!(self.text, "# TYPE outboxd_{name} {kind}");
    }

    /// Writes one family's samples for every relay, labelled with its shard.
    fn each(
        &mut self,
        relays: &[(Option<u32>, &MetricsSnapshot)],
        mut samples: impl FnMut(&mut Self, &MetricsSnapshot),
    ) {
        for (shard, snapshot) in relays {
            self.shard = *shard;
            samples(self, snapshot);
        }
        self.shard = None;
    }

    fn sample(&mut self, name: &str, label: Option<(&str, &str)>, value: u64) {
        self.labelled(name, label, &value.to_string());
    }

    fn raw_sample(&mut self, name: &str, value: &str) {
        self.labelled(name, None, value);
    }

    // Label values are fixed identifiers, except relation names, which go through
    // `escape_label` first.
    fn labelled(&mut self, name: &str, label: Option<(&str, &str)>, value: &str) {
        let _ = match (self.shard, label) {
            (Some(shard), Some((k, v))) => writeln!(
                self.text,
                "outboxd_{name}{{shard=\"{shard}\",{k}=\"{v}\"}} {value}"
            ),
            (Some(shard), None) => {
                writeln!(self.text, "outboxd_{name}{{shard=\"{shard}\"}} {value}")
            }
            (None, Some((k, v))) => writeln!(self.text, "outboxd_{name}{{{k}=\"{v}\"}} {value}"),
            (None, None) => writeln!(self.text, "outboxd_{name} {value}"),
        };
    }

    fn histogram(
        &mut self,
        relays: &[(Option<u32>, &MetricsSnapshot)],
        name: &str,
        help: &str,
        histogram: impl Fn(&MetricsSnapshot) -> &HistogramSnapshot,
    ) {
        self.header(name, "histogram", help);
        let (bucket, sum, count) = (
            format!("{name}_bucket"),
            format!("{name}_sum"),
            format!("{name}_count"),
        );
        self.each(relays, |out, s| {
            let h = histogram(s);
            for (le, n) in &h.cumulative {
                out.sample(&bucket, Some(("le", le)), *n);
            }
            out.raw_sample(&sum, &micros_as_seconds(h.sum_micros));
            out.sample(&count, None, h.count);
        });
    }

    fn single(
        &mut self,
        relays: &[(Option<u32>, &MetricsSnapshot)],
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&MetricsSnapshot) -> u64,
    ) {
        self.header(name, kind, help);
        self.each(relays, |out, s| out.sample(name, None, value(s)));
    }
}

#[cfg(test)]
mod tests {
    use super::super::metrics::Metrics;
    use super::*;
    use outbox_core::RowErrorKind;
    use std::time::UNIX_EPOCH;

    #[test]
    fn lag_breakdown_adds_up_and_never_goes_negative() {
        let m = Metrics::new();
        assert_eq!(
            lag_breakdown(&m.snapshot(UNIX_EPOCH)),
            [("receive", 0), ("ack", 0), ("confirm", 0)]
        );
        m.set_server_wal_end_lsn(1_000);
        m.set_received_lsn(900);
        m.set_acked_lsn(700);
        m.set_confirmed_lsn(600);
        assert_eq!(
            lag_breakdown(&m.snapshot(UNIX_EPOCH)),
            [("receive", 100), ("ack", 200), ("confirm", 100)]
        );
        // Idle: keepalives moved acked and confirmed past the last data received, and
        // the acked gauge (once a second) trails the confirmed one.
        m.set_confirmed_lsn(1_000);
        m.set_acked_lsn(950);
        assert_eq!(
            lag_breakdown(&m.snapshot(UNIX_EPOCH)),
            [("receive", 0), ("ack", 0), ("confirm", 0)]
        );
    }

    #[test]
    fn seconds_formatting() {
        assert_eq!(micros_as_seconds(0), "0");
        assert_eq!(micros_as_seconds(2_000_000), "2");
        assert_eq!(micros_as_seconds(1_500_000), "1.5");
        assert_eq!(micros_as_seconds(1_000), "0.001");
        assert_eq!(micros_as_seconds(123_456_789), "123.456789");
    }

    #[test]
    fn renders_every_metric_with_help_and_type() {
        let m = Metrics::new();
        m.add_events_published(42);
        m.inc_dead_lettered(RowErrorKind::NullAggregateId);
        m.set_confirmed_lsn(0x1_6B37_4D48);
        m.set_slot_wal_status(SlotWalStatus::Reserved);
        m.set_replication_connected(true);
        m.observe_commit_to_ack(Duration::from_millis(3));
        m.observe_commit_to_ack(Duration::from_millis(1500));
        m.observe_kafka_txn_commit(Duration::from_millis(40), true);
        m.inc_kafka_txn_aborted(super::super::TxnAbortCause::Abortable);
        let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
        m.set_oldest_unacked(Some(t0));
        let text = render(&m.snapshot(t0 + Duration::from_millis(2250)));

        for line in [
            "# HELP outboxd_events_published_total Events acknowledged by Kafka.",
            "# TYPE outboxd_events_published_total counter",
            "outboxd_events_published_total 42",
            "# TYPE outboxd_events_dead_lettered_total counter",
            "outboxd_events_dead_lettered_total{reason=\"null_aggregate_id\"} 1",
            "outboxd_events_dead_lettered_total{reason=\"invalid_topic\"} 0",
            "outboxd_confirmed_lsn 6093753672",
            "# TYPE outboxd_slot_wal_status gauge",
            "outboxd_slot_wal_status{status=\"reserved\"} 1",
            "outboxd_slot_wal_status{status=\"lost\"} 0",
            "outboxd_oldest_unacked_age_seconds 2.25",
            "outboxd_replication_connected 1",
            "outboxd_producer_healthy 0",
            "# TYPE outboxd_commit_to_ack_seconds histogram",
            "outboxd_commit_to_ack_seconds_bucket{le=\"0.0025\"} 0",
            "outboxd_commit_to_ack_seconds_bucket{le=\"0.005\"} 1",
            "outboxd_commit_to_ack_seconds_bucket{le=\"2.5\"} 2",
            "outboxd_commit_to_ack_seconds_bucket{le=\"+Inf\"} 2",
            "outboxd_commit_to_ack_seconds_sum 1.503",
            "outboxd_commit_to_ack_seconds_count 2",
            "# TYPE outboxd_kafka_transactions_committed_total counter",
            "outboxd_kafka_transactions_committed_total 1",
            "outboxd_kafka_transactions_split_total 1",
            "outboxd_kafka_transactions_aborted_total{cause=\"abortable\"} 1",
            "outboxd_kafka_transactions_aborted_total{cause=\"restart\"} 0",
            "# TYPE outboxd_kafka_transaction_commit_seconds histogram",
            "outboxd_kafka_transaction_commit_seconds_bucket{le=\"0.025\"} 0",
            "outboxd_kafka_transaction_commit_seconds_bucket{le=\"0.05\"} 1",
            "outboxd_kafka_transaction_commit_seconds_sum 0.04",
            "outboxd_kafka_transaction_commit_seconds_count 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Every sample belongs to a family that was announced with HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| text.contains(&format!("# TYPE {f} histogram")))
                })
                .unwrap_or(name);
            assert!(text.contains(&format!("# TYPE {family} ")), "{line}");
            assert!(text.contains(&format!("# HELP {family} ")), "{line}");
        }
        assert!(text.ends_with('\n'));
    }
}
