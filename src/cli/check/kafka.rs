//! `outboxd check`: Kafka: the event topics the table's rows name, the brokers, the
//! progress topic and what exactly-once delivery needs.

use std::collections::BTreeSet;

use outbox_core::{EventFields, TableSpec, TopicField};
use outboxd_relay::kafka::{build_producer, ProgressStore, RelayProducer};
use outboxd_relay::pipeline::BadRowPolicy;
use pgrepl::preflight;
use tokio_postgres::Client;

use crate::config::Settings;
use crate::wiring;

use super::Report;

/// How many distinct topics `check` renders from the rows at most: enough for any
/// template that routes by type, and a bounded query for one that routes by id.
pub(super) const MAX_CHECKED_TOPICS: usize = 1000;

/// How long the scan for the template's values may take.
pub(super) const DISTINCT_TIMEOUT_MS: u32 = 30_000;

/// The fixed OUTBOXD_TOPIC, or nothing when it is a template (its topics come from rows).
pub(super) fn fixed_topic(s: &Settings) -> BTreeSet<String> {
    wiring::table_spec(s)
        .ok()
        .and_then(|spec| spec.topic.fixed_topic().map(|t| t.to_string()))
        .into_iter()
        .collect()
}

/// The event topics the relay would write for the rows now in the table: the template
/// rendered, as the relay renders it, over the distinct values of the columns its
/// placeholders name. Rows that render no valid topic are reported as the relay would
/// treat them.
pub(super) async fn event_topics(r: &mut Report, s: &Settings, sql: &Client) -> BTreeSet<String> {
    let what = "event topics";
    let Ok(spec) = wiring::table_spec(s) else {
        // A template that does not parse is a configuration error, refused before this.
        return BTreeSet::new();
    };
    let template = spec.topic.as_str();
    if let Some(fixed) = spec.topic.fixed_topic() {
        return BTreeSet::from([fixed.to_string()]);
    }
    if !s.relay_table {
        r.warn(what, format!("OUTBOXD_RELAY_TABLE=false: the topics template {template:?} renders from emitted messages cannot be checked; make sure each exists"));
        return BTreeSet::new();
    }
    let placeholders = Placeholders::of(&spec);
    let table = s.table();
    let (rows, cut) = match preflight::distinct_values(
        sql,
        &s.table_schema,
        &s.table_name,
        &placeholders.columns(),
        MAX_CHECKED_TOPICS,
        DISTINCT_TIMEOUT_MS,
    )
    .await
    {
        Ok(found) => found,
        // No such table or column: the outbox table's own line already says so.
        Err(e) if matches!(e.sqlstate(), Some("42P01" | "42703")) => return BTreeSet::new(),
        Err(e) => {
            r.warn(what, format!("cannot read the values of {} in {table} ({e}), so the topics template {template:?} renders cannot be checked: grant SELECT on those columns to this role to check them, or make sure each topic exists", placeholders.columns().join(", ")));
            return BTreeSet::new();
        }
    };
    if rows.is_empty() {
        r.warn(what, format!("{table} has no rows, so the topics template {template:?} renders cannot be checked from rows: make sure each topic exists before a row that renders it is inserted (a missing topic stops the relay)"));
        return BTreeSet::new();
    }
    if cut {
        r.warn(what, format!("{table} has more than {MAX_CHECKED_TOPICS} distinct values of {}: only the topics of the first {MAX_CHECKED_TOPICS} are checked", placeholders.columns().join(", ")));
    }
    let mut topics = BTreeSet::new();
    let mut invalid = Vec::new();
    for row in &rows {
        match placeholders.render(&spec, row) {
            Some(Ok(topic)) => {
                topics.insert(topic);
            }
            Some(Err(e)) => invalid.push(e),
            // A NULL id, type or aggregate id: a bad row for another reason than its topic.
            None => {}
        }
    }
    if let Some(first) = invalid.first() {
        let problem = format!(
            "{} distinct value(s) of {} in {table} render no valid topic, e.g. {first}",
            invalid.len(),
            placeholders.columns().join(", ")
        );
        match s.bad_row_policy {
            BadRowPolicy::Stop => r.fail(
                what,
                format!("{problem}; with OUTBOXD_BAD_ROW_POLICY=stop the relay stops (exit 4) at the first such row"),
            ),
            BadRowPolicy::DeadLetter => r.warn(
                what,
                format!("{problem}; such rows go to the dead-letter topic {}", s.dead_letter_topic),
            ),
        }
    }
    topics
}

/// Which table column each placeholder of the topic template reads.
pub(super) struct Placeholders {
    /// The logical fields the template uses, with their columns.
    fields: Vec<(TopicField, String)>,
    /// The template's own column placeholders.
    columns: Vec<String>,
}

impl Placeholders {
    fn of(spec: &TableSpec) -> Placeholders {
        let c = &spec.columns;
        let fields = TopicField::ALL
            .into_iter()
            .filter(|f| spec.topic.uses(*f))
            .map(|f| {
                let column = match f {
                    TopicField::Id => &c.id,
                    TopicField::AggregateType => &c.aggregate_type,
                    TopicField::AggregateId => &c.aggregate_id,
                    TopicField::EventType => &c.event_type,
                };
                (f, column.clone())
            })
            .collect();
        let columns = spec
            .topic
            .columns()
            .into_iter()
            .map(str::to_owned)
            .collect();
        Placeholders { fields, columns }
    }

    /// The columns to read, in the order [`Placeholders::render`] takes their values.
    fn columns(&self) -> Vec<&str> {
        self.fields
            .iter()
            .map(|(_, c)| c.as_str())
            .chain(self.columns.iter().map(String::as_str))
            .collect()
    }

    /// The topic the relay would render for a row with these values; `None` when a
    /// logical field is NULL (the row is refused before its topic is rendered).
    fn render(
        &self,
        spec: &TableSpec,
        values: &[Option<String>],
    ) -> Option<Result<String, outbox_core::RowError>> {
        let (field_values, column_values) = values.split_at(self.fields.len().min(values.len()));
        let field = |wanted: TopicField| -> Option<&str> {
            match self.fields.iter().position(|(f, _)| *f == wanted) {
                Some(i) => field_values.get(i).and_then(Option::as_deref),
                None => Some(""),
            }
        };
        let columns: Vec<(&str, Option<&str>)> = self
            .columns
            .iter()
            .zip(column_values)
            .map(|(name, v)| (name.as_str(), v.as_deref()))
            .collect();
        let fields = EventFields {
            id: field(TopicField::Id)?,
            aggregate_type: field(TopicField::AggregateType)?,
            aggregate_id: field(TopicField::AggregateId)?,
            event_type: field(TopicField::EventType)?,
            columns: &columns,
        };
        Some(spec.topic.render(&fields).map(|t| t.to_string()))
    }
}

pub(super) async fn check_kafka(r: &mut Report, s: &Settings, event_topics: &BTreeSet<String>) {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let producer = match build_producer(&s.producer, tx) {
        Ok(p) => p,
        Err(e) => return r.fail("kafka producer settings", e),
    };
    let info = match producer.check_broker_reachable(wiring::BROKER_CHECK_TIMEOUT) {
        Ok(info) => info,
        Err(e) => return r.fail("kafka", format!("{e}; check OUTBOXD_KAFKA_BOOTSTRAP_SERVERS and OUTBOXD_KAFKA_SECURITY_PROTOCOL/SASL settings")),
    };
    r.ok(
        "kafka",
        format!(
            "{} broker(s), answered by {}",
            info.brokers.len(),
            info.answered_by
        ),
    );
    let mut creates = AutoCreate {
        producer: &producer,
        broker: info.brokers.first().map(|b| b.id),
        known: None,
    };
    let missing: Vec<&String> = event_topics
        .iter()
        .filter(|t| !info.topics.contains(*t))
        .collect();
    if !event_topics.is_empty() && missing.is_empty() {
        r.ok(
            "event topics",
            format!("{} exist", list(event_topics.iter(), 10)),
        );
    } else if !missing.is_empty() {
        let names = list(missing.iter(), 20);
        let absent = format!(
            "missing from the brokers' metadata (they do not exist, or this principal may not Describe them): {names}"
        );
        match creates.verdict().await {
            Ok(true) => r.warn("event topics", format!("{absent}; the brokers create topics on first use (auto.create.topics.enable=true), so the relay's first write creates each with the brokers' defaults (num.partitions, default.replication.factor): create them yourself to choose")),
            creates_or_not => r.fail(
                "event topics",
                format!(
                    "{absent}: the relay stops (exit 5) at the first event for a missing topic. Fix: create each with the partitions and replication you want (kafka-topics.sh --bootstrap-server BROKER --create --topic {} --partitions <n> --replication-factor <r>), and let outboxd's principal Write it{}",
                    missing[0],
                    unknown_auto_create(creates_or_not)
                ),
            ),
        }
    }
    if s.bad_row_policy == BadRowPolicy::DeadLetter {
        let dlq = &s.dead_letter_topic;
        if info.topics.contains(dlq) {
            r.ok("dead-letter topic", dlq);
        } else {
            let absent = format!("{dlq} (OUTBOXD_DEAD_LETTER_TOPIC) is not in the brokers' metadata (missing, or this principal may not Describe it)");
            match creates.verdict().await {
                Ok(true) => r.warn("dead-letter topic", format!("{absent}; the brokers create topics on first use (auto.create.topics.enable=true), so the first bad row creates it with their defaults: create it yourself to choose")),
                creates_or_not => r.fail(
                    "dead-letter topic",
                    format!(
                        "{absent}: the relay stops (exit 5) at the first bad row. Fix: create it (kafka-topics.sh --bootstrap-server BROKER --create --topic {dlq} ...) and let outboxd's principal Write it, or set OUTBOXD_BAD_ROW_POLICY=stop{}",
                        unknown_auto_create(creates_or_not)
                    ),
                ),
            }
        }
    }
    if let Some(topic) = &s.progress_topic {
        check_progress_topic(r, s, topic, info.topics.contains(topic)).await;
    }
    if s.producer.transactions.is_some() {
        check_transactions(r, s, &producer, info.brokers.first().map(|b| b.id)).await;
    }
}

/// OUTBOXD_DELIVERY=exactly-once: the brokers run transactions and accept outboxd's
/// transaction.timeout.ms (a larger one fails `init_transactions` at start-up).
pub(super) async fn check_transactions(
    r: &mut Report,
    s: &Settings,
    producer: &RelayProducer,
    broker: Option<i32>,
) {
    let what = "Kafka transactions (OUTBOXD_DELIVERY=exactly-once)";
    let Some(id) = broker else {
        return r.fail(what, "no broker listed");
    };
    let wanted = s.producer.transaction_timeout();
    let max = producer
        .broker_config(
            id,
            "transaction.max.timeout.ms",
            wiring::BROKER_CHECK_TIMEOUT,
        )
        .await;
    match max {
        Ok(Some(max)) => match max.trim().parse::<u64>() {
            Ok(max) if u128::from(max) >= wanted.as_millis() => r.ok(
                what,
                format!("transaction.timeout.ms {} is within the brokers' transaction.max.timeout.ms {max}", wanted.as_millis()),
            ),
            Ok(max) => r.fail(
                what,
                format!("transaction.timeout.ms {} is above the brokers' transaction.max.timeout.ms {max}: init_transactions would fail. Set OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS={max} or lower", wanted.as_millis()),
            ),
            Err(_) => r.warn(what, format!("transaction.max.timeout.ms reads {max:?}")),
        },
        Ok(None) => r.fail(
            what,
            "the brokers have no transaction.max.timeout.ms: they may not support transactions; use OUTBOXD_DELIVERY=at-least-once with them",
        ),
        Err(e) => r.warn(
            what,
            format!("the brokers' transaction.max.timeout.ms could not be read ({e}); `run` finds out at init_transactions"),
        ),
    }
}

/// Whether the brokers create a missing topic on first use, asked once and only when a
/// topic is missing (DescribeConfigs may be denied to a principal that needs nothing
/// else of it).
pub(super) struct AutoCreate<'a> {
    producer: &'a RelayProducer,
    broker: Option<i32>,
    known: Option<Result<bool, String>>,
}

impl AutoCreate<'_> {
    async fn verdict(&mut self) -> Result<bool, String> {
        if let Some(known) = &self.known {
            return known.clone();
        }
        let verdict = match self.broker {
            Some(id) => self
                .producer
                .broker_creates_topics(id, wiring::BROKER_CHECK_TIMEOUT)
                .await
                .map_err(|e| e.to_string()),
            None => Err("no broker listed".to_owned()),
        };
        self.known = Some(verdict.clone());
        verdict
    }
}

pub(super) fn unknown_auto_create(verdict: Result<bool, String>) -> String {
    match verdict {
        Ok(_) => String::new(),
        Err(e) => {
            format!(" (whether the brokers create topics on first use could not be read: {e})")
        }
    }
}

/// Up to `max` names, comma-separated, and how many more.
pub(super) fn list<'a>(
    names: impl ExactSizeIterator<Item = &'a (impl std::fmt::Display + 'a)>,
    max: usize,
) -> String {
    let total = names.len();
    let shown: Vec<String> = names.take(max).map(ToString::to_string).collect();
    if total > max {
        format!("{} and {} more", shown.join(", "), total - max)
    } else {
        shown.join(", ")
    }
}

/// The progress topic exists, or `run` may create it: a validate-only CreateTopics
/// proves the permission without creating it.
pub(super) async fn check_progress_topic(r: &mut Report, s: &Settings, topic: &str, exists: bool) {
    let what = "progress topic";
    if exists {
        return r.ok(what, topic);
    }
    let store = match ProgressStore::new(&s.producer, topic) {
        Ok(store) => store,
        Err(e) => return r.fail(what, e),
    };
    let fix = format!("create it yourself: kafka-topics.sh --bootstrap-server BROKER --create --topic {topic} --partitions 1 --config cleanup.policy=compact --config segment.ms=600000, and let outboxd's principal Read, Write, Describe and DescribeConfigs it");
    match store.may_create_topic().await {
        Ok(()) => r.ok(what, format!("{topic} does not exist yet; `outboxd run` creates it (the brokers accepted a validate-only CreateTopics)")),
        Err(e) if e.is_denied() => r.fail(
            what,
            format!("{topic} does not exist, and this principal may not create it ({e}): grant outboxd's principal Create on it, or {fix}"),
        ),
        Err(e) => r.warn(
            what,
            format!("{topic} does not exist, and whether `outboxd run` may create it (it needs the Create permission) could not be told ({e}); to be sure, {fix}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{list, Placeholders};
    use outbox_core::{OutboxColumns, TableSpec, TopicTemplate};
    use std::sync::Arc;

    fn spec(template: &str) -> TableSpec {
        TableSpec {
            columns: OutboxColumns {
                aggregate_type: "kind".to_owned(),
                ..OutboxColumns::default()
            },
            topic: Arc::new(TopicTemplate::parse(template).unwrap()),
            ..TableSpec::default()
        }
    }

    #[test]
    fn placeholders_read_the_configured_columns_and_render_as_the_relay() {
        let spec = spec("outbox.{tenant}.{aggregate_type}");
        let p = Placeholders::of(&spec);
        // The logical field by its configured column, then the template's own columns.
        assert_eq!(p.columns(), vec!["kind", "tenant"]);
        let row = |kind: Option<&str>, tenant: Option<&str>| {
            vec![kind.map(str::to_owned), tenant.map(str::to_owned)]
        };
        let rendered = p.render(&spec, &row(Some("Order"), Some("acme")));
        assert_eq!(rendered.unwrap().unwrap(), "outbox.acme.Order");
        // A NULL column placeholder or an invalid name: the relay's row error.
        let e = p
            .render(&spec, &row(Some("Order"), None))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("\"tenant\""), "{e}");
        let e = p
            .render(&spec, &row(Some("Order Lines"), Some("acme")))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("not a valid Kafka topic"), "{e}");
        // A NULL logical field: refused before the topic is rendered.
        assert!(p.render(&spec, &row(None, Some("acme"))).is_none());
    }

    #[test]
    fn long_lists_are_cut() {
        let names: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
        assert_eq!(list(names.iter(), 10), "t0, t1, t2, t3, t4");
        assert_eq!(list(names.iter(), 2), "t0, t1 and 3 more");
    }
}
