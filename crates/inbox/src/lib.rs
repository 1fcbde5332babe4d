//! The consumer side of outboxd's exactly-once *effect*: Kafka delivers at least once
//! (outboxd re-sends after a crash, consumers re-read after a rebalance), and this kit
//! makes each event change the consumer's database once, in order per aggregate.
//!
//! For each record, in **one PostgreSQL transaction** of the consumer's database
//! ([`Inbox::process`]):
//!
//! 1. **Insert the idempotency key first** into `inbox_processed` (sql/inbox.sql): the
//!    `idempotency_key` header if the producer sends one (outboxd's
//!    `OUTBOXD_HEADER_COLUMNS=idempotency_key,version`), else the event id (`id`
//!    header). A conflict means the event was already applied: [`Outcome::Duplicate`],
//!    nothing else runs. Inserting, not reading, decides it, so two consumers racing on
//!    one event cannot both apply it (the second insert waits for the first's commit).
//! 2. **Check the aggregate's version** (the `version` header, if any) against
//!    `inbox_versions`, with that aggregate's row locked: a version at or below the last
//!    applied one is [`Outcome::Stale`] (recorded as processed, skipped); a version more
//!    than one above it is a [`Outcome::Gap`], see [`GapPolicy`].
//! 3. **Run the caller's change** ([`Apply`]) in the same transaction.
//! 4. **Commit**, then **commit the Kafka offset** ([`Inbox::handle`] does both). A crash
//!    between the two re-delivers the event, which step 1 then skips.
//!
//! A gap (version 7 after 5) means an event of the aggregate never arrived: outboxd
//! dead-lettered it (a bad row: see its dead-letter topic), the producer skipped a
//! version, or the topic's retention removed it before this consumer read it. The default
//! [`GapPolicy::Hold`] applies nothing and records nothing, and [`Outcome::commit_offset`]
//! is false: pause the partition (or seek back to the event) and alert; repair from the
//! dead-letter topic or by reading the aggregate's state from its service, then resume.
//! [`GapPolicy::Apply`] applies it anyway: right when each event carries the aggregate's
//! full state, wrong for deltas. The first version seen of an aggregate is always applied
//! (a consumer may start after the aggregate's first events left the topic).
//!
//! The kit has no runtime of its own: the caller owns the rdkafka consumer and the
//! tokio-postgres client, so it fits in any consumer loop:
//!
//! ```ignore
//! struct Credit;
//! impl outboxd_inbox::Apply for Credit {
//!     type Output = ();
//!     async fn apply(&mut self, tx: &Transaction<'_>, e: &InboxEvent) -> Result<(), BoxError> {
//!         tx.execute("UPDATE balances SET balance = balance + $2 WHERE account = $1",
//!                    &[&e.aggregate_id, &amount_of(e)?]).await?;
//!         Ok(())
//!     }
//! }
//! let inbox = Inbox::new("balances");
//! loop {
//!     let m = consumer.poll(Duration::from_secs(1)); // enable.auto.commit=false
//!     if let Some(m) = m { inbox.handle(&mut client, &consumer, &m?, &mut Credit).await?; }
//! }
//! ```

use std::future::Future;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::{Client, Transaction};

/// sql/inbox.sql: the two tables with the default names, and the retention guidance.
pub const SCHEMA_SQL: &str = include_str!("../../../sql/inbox.sql");

/// What the caller's change may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error("inbox database work failed (the transaction is rolled back): {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error(
        "committing the Kafka offset failed after the database commit: the event is \
         applied, and its redelivery will be skipped as a duplicate: {0}"
    )]
    Kafka(#[from] KafkaError),
    #[error("the consumer's change failed (rolled back, the key is not recorded): {0}")]
    Apply(BoxError),
    #[error("the record at {topic}/{partition}@{offset} is not an outboxd event: {problem}")]
    NotAnEvent {
        topic: String,
        partition: i32,
        offset: i64,
        problem: String,
    },
}

/// What [`Inbox::process`] needs of a record, read by [`Inbox::event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEvent {
    /// The deduplication key: the idempotency key header, else the event id.
    pub key: String,
    /// The `id` header.
    pub event_id: String,
    /// The `aggregate_type` header.
    pub aggregate_type: Option<String>,
    /// The record key.
    pub aggregate_id: Option<String>,
    /// The version header, when the producer sends one.
    pub version: Option<i64>,
    pub event_type: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub payload: Option<Vec<u8>>,
}

/// What became of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The caller's change ran and is committed with the key (and version).
    Applied(T),
    /// The key was already recorded: applied before, skipped now.
    Duplicate,
    /// The version is at or below the last applied one: recorded as processed, skipped.
    Stale { known: i64, got: i64 },
    /// Versions between `known` and `got` are missing; with [`GapPolicy::Hold`] nothing
    /// was recorded or applied.
    Gap { known: i64, got: i64 },
}

impl<T> Outcome<T> {
    /// Whether the Kafka offset may be committed past this event: always, except for a
    /// held gap, which must be seen again once repaired.
    pub fn commit_offset(&self) -> bool {
        !matches!(self, Outcome::Gap { .. })
    }
}

/// What to do when a version skips ahead (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// Apply nothing, record nothing, do not commit the offset.
    #[default]
    Hold,
    /// Apply it (events that carry the full state).
    Apply,
}

/// The caller's change, run inside the inbox's transaction. It must do all of its work
/// through `tx` (so that it commits or rolls back with the key) and nothing outside the
/// database that cannot be repeated.
pub trait Apply {
    type Output: Send;

    fn apply<'a>(
        &'a mut self,
        tx: &'a Transaction<'_>,
        event: &'a InboxEvent,
    ) -> impl Future<Output = Result<Self::Output, BoxError>> + Send + 'a;
}

/// One consumer's inbox: its name (a consumer group, or a handler) and table names.
#[derive(Debug, Clone)]
pub struct Inbox {
    consumer: String,
    processed_table: String,
    versions_table: String,
    key_header: String,
    version_header: String,
    gap: GapPolicy,
}

impl Inbox {
    /// Default tables `public.inbox_processed` and `public.inbox_versions`, headers
    /// `idempotency_key` and `version`, [`GapPolicy::Hold`].
    pub fn new(consumer: impl Into<String>) -> Self {
        Inbox {
            consumer: consumer.into(),
            processed_table: "public.inbox_processed".into(),
            versions_table: "public.inbox_versions".into(),
            key_header: "idempotency_key".into(),
            version_header: "version".into(),
            gap: GapPolicy::default(),
        }
    }

    /// Other tables of the same shape; names as SQL text (quote them if needed). They
    /// come from the caller's code, never from a record.
    pub fn with_tables(mut self, processed: &str, versions: &str) -> Self {
        self.processed_table = processed.to_owned();
        self.versions_table = versions.to_owned();
        self
    }

    /// Other header names for the idempotency key and the version.
    pub fn with_headers(mut self, idempotency_key: &str, version: &str) -> Self {
        self.key_header = idempotency_key.to_owned();
        self.version_header = version.to_owned();
        self
    }

    pub fn on_gap(mut self, policy: GapPolicy) -> Self {
        self.gap = policy;
        self
    }

    /// Creates the default tables if missing (sql/inbox.sql).
    pub async fn install(client: &Client) -> Result<(), InboxError> {
        client.batch_execute(SCHEMA_SQL).await?;
        Ok(())
    }

    /// Reads an outboxd record: `id` header required; key, version and aggregate from
    /// the configured headers and the record key.
    pub fn event<M: Message>(&self, m: &M) -> Result<InboxEvent, InboxError> {
        let not_event = |problem: String| InboxError::NotAnEvent {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            problem,
        };
        let header = |name: &str| -> Result<Option<String>, InboxError> {
            let Some(headers) = m.headers() else {
                return Ok(None);
            };
            // The last header of a name wins, as outboxd documents.
            let found = headers
                .iter()
                .filter(|h| h.key == name)
                .last()
                .and_then(|h| h.value);
            match found {
                None => Ok(None),
                Some(v) => String::from_utf8(v.to_vec())
                    .map(Some)
                    .map_err(|_| not_event(format!("header {name} is not UTF-8"))),
            }
        };
        let event_id = header("id")?.ok_or_else(|| not_event("no id header".into()))?;
        let key = header(&self.key_header)?.unwrap_or_else(|| event_id.clone());
        let version = match header(&self.version_header)? {
            None => None,
            Some(v) => Some(v.trim().parse::<i64>().map_err(|_| {
                not_event(format!(
                    "header {} is {v:?}, not a whole number",
                    self.version_header
                ))
            })?),
        };
        let aggregate_id = match m.key() {
            None => None,
            Some(k) => Some(
                String::from_utf8(k.to_vec())
                    .map_err(|_| not_event("the record key is not UTF-8".into()))?,
            ),
        };
        Ok(InboxEvent {
            key,
            event_id,
            aggregate_type: header("aggregate_type")?,
            aggregate_id,
            version,
            event_type: header("event_type")?,
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            payload: m.payload().map(<[u8]>::to_vec),
        })
    }

    /// Steps 1-4 of the crate docs but the offset commit: the key, the version check,
    /// the caller's change, the database commit.
    pub async fn process<A: Apply>(
        &self,
        client: &mut Client,
        event: &InboxEvent,
        apply: &mut A,
    ) -> Result<Outcome<A::Output>, InboxError> {
        let tx = client.transaction().await?;
        let inserted = tx
            .execute(
                &format!(
                    "INSERT INTO {} (consumer, key, event_id, topic, kafka_partition, kafka_offset) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                    self.processed_table
                ),
                &[
                    &self.consumer,
                    &event.key,
                    &event.event_id,
                    &event.topic,
                    &event.partition,
                    &event.offset,
                ],
            )
            .await?;
        if inserted == 0 {
            tx.rollback().await?;
            return Ok(Outcome::Duplicate);
        }
        // Without an aggregate type the record key alone names the aggregate.
        let versioned = match (&event.aggregate_id, event.version) {
            (Some(id), Some(v)) => Some((
                event.aggregate_type.as_deref().unwrap_or(""),
                id.as_str(),
                v,
            )),
            _ => None,
        };
        if let Some((aggregate_type, aggregate_id, version)) = versioned {
            // Create the row if it is new, so that FOR UPDATE has a row to lock: two
            // events of a new aggregate in two consumers are serialised too.
            tx.execute(
                &format!(
                    "INSERT INTO {} (consumer, aggregate_type, aggregate_id, version) \
                     VALUES ($1, $2, $3, NULL) ON CONFLICT DO NOTHING",
                    self.versions_table
                ),
                &[&self.consumer, &aggregate_type, &aggregate_id],
            )
            .await?;
            let known: Option<i64> = tx
                .query_one(
                    &format!(
                        "SELECT version FROM {} WHERE consumer = $1 AND aggregate_type = $2 \
                         AND aggregate_id = $3 FOR UPDATE",
                        self.versions_table
                    ),
                    &[&self.consumer, &aggregate_type, &aggregate_id],
                )
                .await?
                .get(0);
            match known {
                Some(known) if version <= known => {
                    // Recorded, so a replay of it is a plain duplicate.
                    tx.commit().await?;
                    return Ok(Outcome::Stale {
                        known,
                        got: version,
                    });
                }
                Some(known) if version > known.saturating_add(1) && self.gap == GapPolicy::Hold => {
                    tx.rollback().await?;
                    return Ok(Outcome::Gap {
                        known,
                        got: version,
                    });
                }
                _ => {}
            }
        }
        let output = match apply.apply(&tx, event).await {
            Ok(o) => o,
            Err(e) => {
                tx.rollback().await?;
                return Err(InboxError::Apply(e));
            }
        };
        if let Some((aggregate_type, aggregate_id, version)) = versioned {
            tx.execute(
                &format!(
                    "UPDATE {} SET version = $4, updated_at = now() WHERE consumer = $1 \
                     AND aggregate_type = $2 AND aggregate_id = $3",
                    self.versions_table
                ),
                &[&self.consumer, &aggregate_type, &aggregate_id, &version],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(Outcome::Applied(output))
    }

    /// One record end to end: [`Inbox::event`], [`Inbox::process`], then the Kafka offset
    /// commit past it (unless the outcome is a held gap). The commit is asynchronous: it
    /// does not block the runtime thread, and one lost in a crash only re-delivers events
    /// that step 1 skips.
    pub async fn handle<C, X, M, A>(
        &self,
        client: &mut Client,
        consumer: &C,
        message: &M,
        apply: &mut A,
    ) -> Result<Outcome<A::Output>, InboxError>
    where
        X: ConsumerContext,
        C: Consumer<X>,
        M: Message,
        A: Apply,
    {
        let event = self.event(message)?;
        let outcome = self.process(client, &event, apply).await?;
        if outcome.commit_offset() {
            commit_offset(consumer, &event)?;
        }
        Ok(outcome)
    }
}

/// Commits `event`'s partition past it (Kafka's committed offset is the next to read).
pub fn commit_offset<C, X>(consumer: &C, event: &InboxEvent) -> Result<(), InboxError>
where
    X: ConsumerContext,
    C: Consumer<X>,
{
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(
        &event.topic,
        event.partition,
        Offset::Offset(event.offset.saturating_add(1)),
    )?;
    consumer.commit(&tpl, CommitMode::Async)?;
    Ok(())
}
