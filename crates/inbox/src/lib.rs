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
//! 4. **Commit**, then **store the Kafka offset** ([`Inbox::handle`] does both);
//!    librdkafka commits stored offsets periodically and when partitions are revoked
//!    ([`consumer_config`]). A crash before the commit re-delivers events, which step 1
//!    skips.
//!
//! A gap (version 7 after 5) means an event of the aggregate has not arrived: outboxd
//! dead-lettered it (a bad row: see its dead-letter topic), the producer skipped a
//! version, or the topic's retention removed it before this consumer read it. With the
//! default [`GapPolicy::Hold`] nothing is applied or recorded, and [`Inbox::handle`]
//! **keeps the partition's stored offset at the held record** while it goes on with the
//! records after it (other aggregates are not blocked; later versions of the held
//! aggregate are held too). Kafka offsets are per partition, so committing any later
//! record would commit past the held one; instead, whoever owns the partition next
//! (after a crash or a rebalance) reads again from the held record. When the missing
//! version arrives (re-sent from the dead-letter topic, say), it is applied and the held
//! records after it are applied in order; then the offset moves on. [`GapPolicy::Apply`]
//! applies a gap anyway: right when each event carries the aggregate's full state, wrong
//! for deltas. The first version seen of an aggregate is always applied (a consumer may
//! start after the aggregate's first events left the topic).
//!
//! The kit has no runtime of its own: the caller owns the rdkafka consumer and the
//! tokio-postgres client, so it fits in any consumer loop. With a `StreamConsumer`
//! (the binary `inbox-example`, src/bin/inbox-example.rs, is a whole consumer to copy):
//!
//! ```no_run
//! use outboxd_inbox::{consumer_config, Apply, BoxError, Inbox, InboxEvent, Positions};
//! use rdkafka::consumer::{Consumer, StreamConsumer};
//! use tokio_postgres::Transaction;
//!
//! struct Credit;
//! impl Apply for Credit {
//!     type Output = ();
//!     async fn apply(&mut self, tx: &Transaction<'_>, e: &InboxEvent) -> Result<(), BoxError> {
//!         let amount: i64 = std::str::from_utf8(e.payload.as_deref().unwrap_or(b"0"))?.parse()?;
//!         tx.execute("UPDATE balances SET balance = balance + $2 WHERE account = $1",
//!                    &[&e.aggregate_id, &amount]).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(mut client: tokio_postgres::Client) -> Result<(), BoxError> {
//! let consumer: StreamConsumer = consumer_config("localhost:9092", "balances").create()?;
//! consumer.subscribe(&["outbox.account"])?;
//! let inbox = Inbox::new("balances");
//! let mut positions = Positions::default();
//! loop {
//!     let m = consumer.recv().await?;
//!     inbox.handle(&mut client, &consumer, &mut positions, &m, &mut Credit).await?;
//! }
//! # }
//! ```
//!
//! Retention: [`Inbox::prune`] deletes keys older than a window (sql/inbox.sql's
//! `inbox_prune`; see docs/inbox.md for choosing it).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_postgres::{Client, Transaction};

/// sql/inbox.sql: the two tables with the default names, and the retention guidance.
pub const SCHEMA_SQL: &str = include_str!("../sql/inbox.sql");

/// What the caller's change may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error("inbox database work failed (the transaction is rolled back): {}", postgres_detail(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("storing the Kafka offset failed after the database commit: {}", self.remedy().unwrap_or_default())]
    Kafka(#[from] KafkaError),
    #[error("{held} records of {topic}/{partition} are held behind version gaps {}", self.remedy().unwrap_or_default())]
    TooManyHeld {
        topic: String,
        partition: i32,
        held: usize,
        limit: usize,
        first_offset: i64,
        aggregate: String,
        version: i64,
    },
    #[error("the consumer stores offsets itself (enable.auto.offset.store=true), {}", self.remedy().unwrap_or_default())]
    AutoOffsetStore,
    #[error("the retention window is {0:?}; keep keys for a positive time (see docs/inbox.md)")]
    Retention(Duration),
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

impl InboxError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            InboxError::Kafka(detail) => format!(
                "the event is applied, and its redelivery will be skipped as a duplicate: \
                {detail}"
            ),
            InboxError::TooManyHeld {
                aggregate,
                first_offset,
                limit,
                version,
                ..
            } => format!(
                "(the first: offset {first_offset}, aggregate {aggregate:?}, version \
                {version}), over the limit of {limit}. Fix: repair the gap (re-send the \
                missing version, e.g. from outboxd's dead-letter topic), or raise \
                Inbox::with_max_held; the partition's committed offset stays at the first \
                held record, so a restart reads them again"
            ),
            InboxError::AutoOffsetStore => String::from(
                "which commits past records held behind a version gap. Fix: set \
                enable.auto.offset.store=false, as outboxd_inbox::consumer_config does",
            ),
            _ => return None,
        };
        Some(text)
    }
}

/// tokio-postgres shows a server error as "db error": add the server's message.
fn postgres_detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{e}: {}: {}", db.severity(), db.message()),
        None => e.to_string(),
    }
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

/// One event [`Inbox::handle`] dealt with: the record's own, or a held one it released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled<T> {
    pub event: InboxEvent,
    pub outcome: Outcome<T>,
}

/// A consumer's place in each partition it reads: the records held behind a version
/// gap, and so the offset that may be stored for commit. One per Kafka consumer, kept
/// across [`Inbox::handle`] calls.
#[derive(Debug, Default)]
pub struct Positions {
    partitions: HashMap<(String, i32), Partition>,
}

#[derive(Debug)]
struct Partition {
    /// The offset after the last record handled.
    next: i64,
    held: BTreeMap<i64, InboxEvent>,
}

impl Partition {
    /// What the group may commit: the first held record, else the next to read.
    fn committable(&self) -> i64 {
        self.held.keys().next().copied().unwrap_or(self.next)
    }
}

impl Positions {
    /// Records held in `topic`/`partition`, in offset order.
    pub fn held(&self, topic: &str, partition: i32) -> Vec<&InboxEvent> {
        self.partitions
            .get(&(topic.to_owned(), partition))
            .map(|p| p.held.values().collect())
            .unwrap_or_default()
    }

    /// The offset stored for `topic`/`partition` (the next one its group reads), if any
    /// record of it was handled.
    pub fn committable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .get(&(topic.to_owned(), partition))
            .map(Partition::committable)
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
    max_held: usize,
}

/// Default for [`Inbox::with_max_held`].
pub const DEFAULT_MAX_HELD: usize = 10_000;

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
            max_held: DEFAULT_MAX_HELD,
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

    /// How many records one partition may hold behind gaps (they are kept in memory)
    /// before [`Inbox::handle`] fails with [`InboxError::TooManyHeld`].
    pub fn with_max_held(mut self, max: usize) -> Self {
        self.max_held = max;
        self
    }

    /// Creates the default tables and `inbox_prune` if missing (sql/inbox.sql). Several
    /// consumers starting at once take turns: concurrent `CREATE ... IF NOT EXISTS` of
    /// one table can fail on the catalog's unique index.
    pub async fn install(client: &mut Client) -> Result<(), InboxError> {
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('outboxd_inbox.install'::text))",
            &[],
        )
        .await?;
        tx.batch_execute(SCHEMA_SQL).await?;
        tx.commit().await?;
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
                    "UPDATE {} SET version = $4, updated_at = pg_catalog.now() WHERE consumer = $1 \
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

    /// One record end to end: [`Inbox::event`], [`Inbox::process`], then the offset
    /// stored for the next (periodic) commit, never past a record held behind a gap.
    /// After a record applies, the held records of its aggregate are tried again in
    /// order; the result lists the record's own outcome first, then theirs.
    ///
    /// The consumer needs `enable.auto.offset.store=false` ([`consumer_config`]), or
    /// librdkafka stores every record's offset itself and commits past held ones. A
    /// partition read again from an earlier offset (reassigned after a rebalance, or a
    /// seek) starts over: its held records come again.
    pub async fn handle<C, X, M, A>(
        &self,
        client: &mut Client,
        consumer: &C,
        positions: &mut Positions,
        message: &M,
        apply: &mut A,
    ) -> Result<Vec<Handled<A::Output>>, InboxError>
    where
        X: ConsumerContext,
        C: Consumer<X>,
        M: Message,
        A: Apply,
    {
        let event = self.event(message)?;
        let slot = (event.topic.clone(), event.partition);
        let partition = positions
            .partitions
            .entry(slot.clone())
            .or_insert_with(|| Partition {
                next: event.offset,
                held: BTreeMap::new(),
            });
        if event.offset < partition.next {
            partition.held.clear();
        }
        partition.next = event.offset.saturating_add(1);
        let outcome = self.process(client, &event, apply).await?;
        let mut handled = Vec::new();
        if let Outcome::Gap { .. } = outcome {
            partition.held.insert(event.offset, event.clone());
            if partition.held.len() > self.max_held {
                let first = partition.held.values().next().unwrap_or(&event);
                return Err(InboxError::TooManyHeld {
                    topic: event.topic.clone(),
                    partition: event.partition,
                    held: partition.held.len(),
                    limit: self.max_held,
                    first_offset: first.offset,
                    aggregate: first.aggregate_id.clone().unwrap_or_default(),
                    version: first.version.unwrap_or_default(),
                });
            }
        } else {
            self.release(client, partition, &event, apply, &mut handled)
                .await?;
        }
        handled.insert(0, Handled { event, outcome });
        let committable = partition.committable();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&slot.0, slot.1, Offset::Offset(committable))?;
        match consumer.store_offsets(&tpl) {
            Ok(()) => {}
            // Revoked while this record was in hand: the next owner reads from the
            // group's committed offset, so what this consumer held is not its own now.
            Err(KafkaError::StoreOffset(
                RDKafkaErrorCode::State | RDKafkaErrorCode::UnknownPartition,
            )) => {
                positions.partitions.remove(&slot);
            }
            // librdkafka's answer when it stores offsets itself.
            Err(KafkaError::StoreOffset(RDKafkaErrorCode::InvalidArgument)) => {
                return Err(InboxError::AutoOffsetStore);
            }
            Err(e) => return Err(e.into()),
        }
        Ok(handled)
    }

    /// Tries again the held records of `applied`'s aggregate, in offset order, until one
    /// is still a gap.
    async fn release<A: Apply>(
        &self,
        client: &mut Client,
        partition: &mut Partition,
        applied: &InboxEvent,
        apply: &mut A,
        handled: &mut Vec<Handled<A::Output>>,
    ) -> Result<(), InboxError> {
        if applied.version.is_none() {
            return Ok(());
        }
        let same = |e: &InboxEvent| {
            e.aggregate_id == applied.aggregate_id && e.aggregate_type == applied.aggregate_type
        };
        loop {
            let Some((&offset, event)) = partition.held.iter().find(|(_, e)| same(e)) else {
                return Ok(());
            };
            let outcome = self.process(client, event, apply).await?;
            if !outcome.commit_offset() {
                return Ok(());
            }
            if let Some(event) = partition.held.remove(&offset) {
                handled.push(Handled { event, outcome });
            }
        }
    }

    /// Deletes this consumer's keys processed more than `keep` ago, at most `max_rows`
    /// of them (call it again while it returns `max_rows`); returns how many. The
    /// window must outlast every redelivery (docs/inbox.md): a key deleted too early
    /// lets its event apply again.
    pub async fn prune(
        &self,
        client: &Client,
        keep: Duration,
        max_rows: i32,
    ) -> Result<u64, InboxError> {
        if keep.is_zero() {
            return Err(InboxError::Retention(keep));
        }
        let row = client
            .query_one(
                "SELECT public.inbox_prune($1, pg_catalog.make_interval(secs => $2), $3, $4::text::regclass)",
                &[
                    &self.consumer,
                    &keep.as_secs_f64(),
                    &max_rows,
                    &self.processed_table,
                ],
            )
            .await?;
        let deleted: i64 = row.get(0);
        Ok(u64::try_from(deleted).unwrap_or(0))
    }
}

/// The consumer settings the kit relies on: `enable.auto.offset.store=false` (the kit
/// stores offsets, never past a held record), `enable.auto.commit=true` (librdkafka
/// commits the stored offsets every `auto.commit.interval.ms` and on revoke), and
/// `auto.offset.reset=earliest` (a new group starts at the topic's first event). Add
/// others (security, timeouts) to the result.
pub fn consumer_config(bootstrap_servers: &str, group_id: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", group_id)
        .set("enable.auto.commit", "true")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        // librdkafka's default, said here because it is a requirement: with
        // OUTBOXD_DELIVERY=exactly-once only read_committed hides the records of aborted
        // Kafka transactions (the Java consumer's default is read_uncommitted). Lag is then
        // measured against the last stable offset, not the high watermark.
        .set("isolation.level", "read_committed");
    config
}
