//! Why a relay session ended, classified once as permanent or retryable
//! ([`RelayError::class`]), with the SQLSTATE or librdkafka code that decided it.

use std::fmt;

use outbox_core::pgtype::quote_ident;
pub use outbox_core::BeforeBadRow;
use outbox_core::{RowError, SessionError, TxnNext};
/// Permanent errors need an operator; retryable ones reconnect with backoff and resume
/// from the slot.
pub use pgoutput::ErrorClass;
use pgrepl::ReplError;

use crate::kafka::{
    DeliveryFailure, KafkaSetupError, RDKafkaErrorCode, SendError, TxnError, EMITTED_LOST_TEXT,
};

/// The code a class was decided by, named in the log line that reports the error, so an
/// operator can look it up (PostgreSQL's Appendix A, librdkafka's `rdkafka.h`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidingCode {
    Sqlstate(String),
    Librdkafka(RDKafkaErrorCode),
}

impl fmt::Display for DecidingCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecidingCode::Sqlstate(code) => write!(f, "SQLSTATE {code}"),
            DecidingCode::Librdkafka(code) => write!(f, "librdkafka {code:?}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Postgres(#[from] ReplError),
    #[error("SQL query failed: {0}")]
    Sql(#[from] tokio_postgres::Error),
    #[error("replication slot {slot:?} does not exist: run `outboxd init`, or set OUTBOXD_CREATE_SLOT=true to create it at start-up")]
    SlotMissing { slot: String },
    #[error("replication slot {slot:?} was dropped while outboxd was using it; {}", self.remedy().unwrap_or_default())]
    SlotDropped {
        slot: String,
        /// `" (committed since …)"` when the relay knows it, else empty.
        since: String,
    },
    #[error("replication slot {slot:?} was invalidated ({reason}); {}", self.remedy().unwrap_or_default())]
    SlotInvalidated {
        slot: String,
        reason: String,
        /// `" (committed since …)"` when the relay knows it, else empty.
        since: String,
    },
    #[error("replication slot {slot:?} is not usable by outboxd: {problem}")]
    SlotUnusable { slot: String, problem: String },
    #[error("publication {publication:?} does not exist in this database: {}", self.remedy().unwrap_or_default())]
    PublicationMissing { publication: String },
    #[error("publication {publication:?} was dropped while outboxd was streaming (server: {server}); {}", self.remedy().unwrap_or_default())]
    PublicationDropped { publication: String, server: String },
    #[error("publication {publication:?} does not deliver the inserts of {table}: {problem}")]
    TableNotPublished {
        publication: String,
        table: String,
        problem: String,
    },
    #[error("replication slot {slot:?} does not exist, but the progress record in Kafka topic {progress_topic:?} says it did {}", self.remedy().unwrap_or_default())]
    SlotLost {
        slot: String,
        progress_topic: String,
        last_confirmed: pgoutput::Lsn,
        /// What to re-publish (`ProgressRecord::republish_text`).
        republish: String,
    },
    #[error("replication slot {slot:?} does not exist and {table} {rows}{history}: {}", self.remedy().unwrap_or_default())]
    RowsBeforeSlot {
        slot: String,
        table: String,
        rows: &'static str,
        history: String,
    },
    #[error("replication slot {slot:?} has a back-fill that did not finish {}", self.remedy().unwrap_or_default())]
    BackfillUnfinished {
        slot: String,
        key: String,
        progress_topic: String,
        published: u64,
        /// The `outboxd init --backfill ...` command that resumes it, quoted for a shell.
        command: String,
    },
    #[error("the server at {host}:{port} is on timeline {found}, but outboxd streamed from timeline {seen} {}", self.remedy().unwrap_or_default())]
    TimelineWentBack {
        host: String,
        port: u16,
        seen: u32,
        found: u32,
    },
    #[error("{0}")]
    ProgressNotDurable(crate::kafka::ProgressError),
    #[error("the synchronous standbys (synchronous_standby_names) do not confirm commits, {}", self.remedy().unwrap_or_default())]
    StandbysUnsettled { publication: String },
    #[error("replication slot {slot:?} was created by another instance while this one was deciding whether to create it; {}", self.remedy().unwrap_or_default())]
    SlotCreatedMeanwhile { slot: String },
    #[error("publication {publication:?} changed since outboxd last looked at it ({since}, WAL position {since_lsn}). {}", self.remedy().unwrap_or_default())]
    PublicationChanged {
        publication: String,
        since: String,
        since_lsn: pgoutput::Lsn,
    },
    #[error("publication {publication:?} changed after replication slot {slot:?} last confirmed a position {}", self.remedy().unwrap_or_default())]
    PublicationUnverified {
        publication: String,
        slot: String,
        key: String,
        progress_topic: String,
    },
    #[error("cannot record publication {publication:?} as first seen in Kafka topic {progress_topic:?} ({reason}): {}", self.remedy().unwrap_or_default())]
    FirstLookUnrecorded {
        publication: String,
        progress_topic: String,
        reason: String,
    },
    #[error("cannot tell whether replication slot {slot:?} existed before: {}", self.remedy().unwrap_or_default())]
    SlotHistoryUnknown {
        slot: String,
        progress_topic: String,
        reason: String,
    },
    #[error("the server is PostgreSQL {}.{} (server_version_num {version_num}); outboxd needs PostgreSQL 14 or newer", version_num / 10_000, version_num % 10_000)]
    UnsupportedServer { version_num: u32 },
    #[error("PostgreSQL's {setting} prevents outboxd from streaming: {problem}")]
    ServerSetting {
        setting: &'static str,
        problem: String,
    },
    #[error("the sharded outbox {table} is not laid out as OUTBOXD_SHARD_COUNT says: {problem}")]
    ShardLayout { table: String, problem: String },
    #[error("the server at {host}:{port} is a standby (in recovery); {}", self.remedy().unwrap_or_default())]
    InRecovery { host: String, port: u16 },
    #[error("connected to another cluster: system identifier {found}, but this process streamed from {expected} until now {}", self.remedy().unwrap_or_default())]
    OtherCluster { expected: String, found: String },
    /// A record of this database and slot from another cluster, none from this one.
    #[error("{0}")]
    RecordOfOtherCluster(Box<OtherClusterRecord>),
    #[error("OUTBOXD_FAILOVER_SLOT=true, but this server has no failover slots (PostgreSQL 17 or later); {}", self.remedy().unwrap_or_default())]
    FailoverUnsupported,
    #[error("OUTBOXD_PGOUTPUT_BINARY=on, but {found}, {}", self.remedy().unwrap_or_default())]
    BinaryRuledOut { found: outbox_core::TextOnly },
    #[error("the stream's Relation message for {relation} rules binary values out: {found}; {}", self.remedy().unwrap_or_default())]
    BinaryRuledOutByRelation {
        relation: String,
        found: outbox_core::TextOnly,
    },
    #[error("the server's output settings changed while binary values were streamed {}", self.remedy().unwrap_or_default())]
    OutputSettingsChanged { was: String, now: String },
    #[error("bad outbox row{}: {error}; {}", .error.event_id().map(|id| format!(" id={}", outbox_core::short_id(id))).unwrap_or_default(), self.remedy().unwrap_or_default())]
    BadRow {
        error: RowError,
        slot: String,
        /// The transaction's commit LSN: a slot confirmed past it no longer decodes it.
        commit_lsn: pgoutput::Lsn,
        /// Where an advance past it alone takes the slot (`SessionError::BadRow`).
        skip_to: pgoutput::Lsn,
        /// Where the transactions before it stand: whether skipping it by hand is safe.
        before: BeforeBadRow,
    },
    #[error("Kafka producer setup failed: {0}")]
    KafkaSetup(#[from] KafkaSetupError),
    #[error("{0}")]
    Delivery(DeliveryFailure),
    #[error("producing to Kafka failed: {0}")]
    Send(#[from] SendError),
    /// Exactly-once mode: a Kafka transaction call failed.
    #[error("{0}")]
    Transaction(#[from] TxnError),
    #[error("replication protocol error: {0}")]
    Protocol(String),
    /// The session's rules stopped it. A bad row's becomes [`RelayError::BadRow`] where
    /// the slot is known (`Session::explain`).
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("the server closed the replication stream")]
    StreamClosed,
}

/// Said wherever outboxd asks for rows to be re-published: prune deletes a row once the
/// slot has confirmed past it, which a slot created (or accepted) after the row proves
/// nothing about, so `init` records the rows as owed and prune waits for the operator.
const PRUNE_PAUSE: &str = "once the rows are re-published, run `outboxd init \
    --republish-done`: until then `outboxd prune` deletes nothing, since a slot created \
    after them proves nothing about them (with no progress topic, pause prune by hand)";

impl RelayError {
    /// What follows the short account of what happened: why it matters and what the
    /// operator does about it, with every command to run. The error's text ends with it,
    /// so a log line or a CLI message that prints the error prints the remedy too; `None`
    /// where the account says it all.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            RelayError::SlotDropped { since, .. } => format!(
                "events committed since its last confirmed position{since} may not be relayed. \
                Recreating it silently would skip them, so outboxd will not. Run `outboxd \
                init`: from the progress record it names the time to re-publish the outbox \
                rows from; create the slot with `outboxd init --recreate-lost-slot`, only \
                then re-publish those rows (re-inserted before the slot exists, they would be \
                skipped too), and start outboxd; {PRUNE_PAUSE} (docs/operations.md, \"A lost \
                slot: re-publishing\"). {EMITTED_LOST_TEXT}"
            ),
            RelayError::SlotInvalidated { since, slot, .. } => format!(
                "the WAL it needed is gone, so rows committed since its last confirmed \
                position{since} are not relayed. Drop it (SELECT \
                pg_drop_replication_slot('{slot}')), then run `outboxd init`: from the \
                progress record it names the time to re-publish the outbox rows from, and \
                `outboxd init --recreate-lost-slot` creates the slot again \
                (docs/operations.md, \"A lost slot: re-publishing\"); `outboxd init \
                --recreate-lost-slot --backfill \"<SQL condition>\"` also publishes the rows \
                the condition selects before streaming. {EMITTED_LOST_TEXT}. Raise \
                max_slot_wal_keep_size or keep outboxd running to avoid this"
            ),
            RelayError::PublicationMissing { publication, .. } => format!(
                "create it with CREATE PUBLICATION {} FOR TABLE <outbox table> WITH \
                (publish = 'insert', publish_via_partition_root = true) (see \
                sql/publication.sql; a sharded outbox's shard n: its partition \
                <table>_shard_<n>), before the slot",
                quote_ident(publication)
            ),
            RelayError::PublicationDropped { publication, .. } => format!(
                "the server cannot decode changes committed while it did not exist. Recreate \
                it: CREATE PUBLICATION {} FOR TABLE <outbox table> WITH (publish = \
                'insert', publish_via_partition_root = true) (see sql/publication.sql; a \
                sharded outbox's shard n: its partition <table>_shard_<n>). If this error persists after recreating \
                it, the slot cannot get past the changes committed while the publication was \
                missing: drop the slot, run `outboxd init` (it names the time to re-publish \
                from) and `outboxd init --recreate-lost-slot`, only then re-publish the \
                outbox rows committed since that time, and start outboxd; {PRUNE_PAUSE} \
                (docs/operations.md, \"A lost slot: re-publishing\"). {EMITTED_LOST_TEXT}",
                quote_ident(publication)
            ),
            RelayError::SlotLost {
                last_confirmed,
                republish,
                ..
            } => format!(
                "(last confirmed position {last_confirmed}): it was dropped or lost (for \
                example in a failover without failover slots). Creating it again would \
                silently skip every event committed since then, so outboxd will not. Create \
                it explicitly with `outboxd init --recreate-lost-slot`, then re-publish \
                {republish} (docs/operations.md, \"A lost slot: re-publishing\"), and start \
                outboxd again ({PRUNE_PAUSE}); or have init publish the rows a condition selects from the new \
                slot's snapshot before streaming: `outboxd init --recreate-lost-slot \
                --backfill \"<SQL condition>\"` (docs/operations.md, \"Back-filling through \
                the slot's snapshot\"). {EMITTED_LOST_TEXT}"
            ),
            RelayError::RowsBeforeSlot { .. } => format!(
                "a slot created now starts after them, and any not relayed yet would be \
                skipped without a trace. If every row in it was published already (by an \
                earlier relay), or is not meant to be, create the slot with `outboxd init \
                --skip-existing-rows`; if a slot of this name existed and was lost, create it \
                with `outboxd init --recreate-lost-slot` and re-publish the rows committed \
                since its last confirmed position: not since it went, since what it had not \
                confirmed was never relayed either (the time of the sample before the last \
                move of outboxd_confirmed_lsn, minus the scrape interval, \
                OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS and your longest transaction: a \
                confirmation trails its commits; if unsure, every row; docs/operations.md, \
                \"A lost slot: re-publishing\"). If some \
                rows are not published yet (a polling relay's pending rows), have init \
                publish those a condition selects, from the new slot's snapshot, before \
                streaming: `outboxd init --backfill \"<SQL condition>\"`, e.g. `outboxd init \
                --backfill \"status = 'pending'\"` (docs/operations.md, \"Switching from a \
                polling relay\"). If a slot of this name was lost: {EMITTED_LOST_TEXT}",
            ),
            RelayError::BackfillUnfinished {
                command,
                key,
                progress_topic,
                published,
                ..
            } => format!(
                "({published} rows published so far, state under key {key:?} in Kafka topic \
                {progress_topic:?}): streaming now would leave the rest of its rows \
                unpublished, so outboxd will not. Resume it with `{command}`, then start \
                outboxd"
            ),
            RelayError::TimelineWentBack { seen, .. } => format!(
                "of the same cluster before (this process, or the progress record says so), so \
                outboxd stopped rather than relay it. Either it is an old primary left \
                running after a standby was promoted (split brain), whose history past the \
                promotion was abandoned, or the record is not this history's. Find out which \
                before acting: look for a server of this cluster on timeline {seen} or later \
                (your HA tool; SELECT timeline_id FROM pg_control_checkpoint() on each). If \
                one exists, fence this one (stop it, or take it out of PGHOST) and point \
                outboxd at that one. If none does, do not stop this server: it was restored \
                from a backup taken before timeline {seen}, or the record was written by a \
                copy of the cluster or by something other than outboxd (only outboxd's \
                principal may write the progress topic); run `outboxd init \
                --replace-progress-record` (a copy sharing this Kafka: give it its own \
                OUTBOXD_CLUSTER_NAME)"
            ),
            RelayError::StandbysUnsettled { publication, .. } => format!(
                "and no look at publication {publication:?} taken before they stopped is \
                recorded to start from: a transaction committed but still waiting for them \
                may have changed it unseen, so outboxd does not stream from this look. It \
                retries; bring the standbys back, or empty synchronous_standby_names and \
                reload"
            ),
            RelayError::SlotCreatedMeanwhile { .. } => {
                String::from("streaming from it (or standing by) on the next attempt")
            }
            RelayError::PublicationChanged { since, .. } => format!(
                "PostgreSQL decodes each row with the publication as it was when the row was \
                written, so outbox rows committed while it did not publish them were never \
                sent, and can never be decoded again; outboxd stopped before confirming \
                anything after that look. Make sure it publishes the outbox's inserts \
                (`outboxd check`), run `outboxd init --accept-publication-change` (if the \
                publication was dropped and created again, the slot cannot decode past the \
                gap: drop the slot and run `outboxd init --recreate-lost-slot` instead), \
                re-publish the outbox rows committed since {since}, minus your longest \
                transaction, and start outboxd; {PRUNE_PAUSE} (docs/operations.md, \"The \
                publication changed\")"
            ),
            RelayError::PublicationUnverified {
                key,
                progress_topic,
                ..
            } => format!(
                "(its catalog rows are newer than the slot's catalog_xmin), and the progress \
                record under key {key:?} in Kafka topic {progress_topic:?} holds no earlier \
                look to tell what it was (a new OUTBOXD_CLUSTER_NAME or \
                OUTBOXD_PROGRESS_TOPIC, or a record deleted). Outbox rows committed while it \
                did not publish them were never sent, and can never be decoded again, so \
                outboxd stopped before relaying anything. Make sure it publishes the outbox's \
                inserts (`outboxd check`), re-publish the outbox rows committed since the \
                change, minus your longest transaction (if you do not know when: since the \
                time the last progress record under the old key or topic names; \
                docs/operations.md, \"The publication changed\"), then run `outboxd init \
                --accept-publication-change`, then `outboxd init --republish-done` (the rows \
                are re-published already; `outboxd prune` deletes nothing between the two), \
                and start outboxd"
            ),
            RelayError::FirstLookUnrecorded { .. } => String::from(
                "with no look recorded, a later start could not tell whether it changed while \
                outboxd was stopped, so outboxd does not stream until it is recorded; \
                retrying. outboxd's Kafka principal needs Write on that topic \
                (docs/operations.md, \"Kafka ACLs for outboxd's principal\")",
            ),
            RelayError::SlotHistoryUnknown {
                progress_topic,
                reason,
                ..
            } => format!(
                "reading the progress record from Kafka topic {progress_topic:?} failed \
                ({reason}); outboxd creates a missing slot only when it knows no earlier slot \
                is being replaced. Retry once Kafka answers. A record outboxd did not write \
                stays unreadable: then `outboxd init --recreate-lost-slot` creates the slot \
                and replaces it, and, if a slot of this name existed, re-publish every outbox \
                row that may not be in Kafka (docs/operations.md, \"A lost slot: \
                re-publishing\"). If a slot of this name was lost: {EMITTED_LOST_TEXT}"
            ),
            RelayError::InRecovery { .. } => String::from(
                "outboxd streams only from a primary and waits for this one to be promoted, or \
                for the address to point at the primary",
            ),
            RelayError::OtherCluster { .. } => String::from(
                "(a wrong host behind the address, or a restored backup); its slot and LSNs \
                are not ours, so outboxd stopped. Point PGHOST at the right cluster and \
                restart",
            ),
            RelayError::FailoverUnsupported => {
                String::from("set OUTBOXD_FAILOVER_SLOT=auto or false")
            }
            RelayError::BinaryRuledOut { .. } => String::from(
                "so binary values would not give the bytes of the text form. Set \
                OUTBOXD_PGOUTPUT_BINARY=auto (binary where the records are the same, text \
                otherwise) or off",
            ),
            RelayError::BinaryRuledOutByRelation { .. } => String::from(
                "reconnecting with text values (the records are the same bytes in both modes)",
            ),
            RelayError::OutputSettingsChanged { now, was, .. } => format!(
                "(TimeZone, DateStyle, bytea_output: {was} before, {now} now; a configuration \
                reload): reconnecting, so that the values are chosen again for the new \
                settings (records between the reload and this check carry the old text form)"
            ),
            RelayError::BadRow {
                commit_lsn,
                skip_to,
                slot,
                before,
                ..
            } => {
                let dead_letter = format!(
                    "OUTBOXD_BAD_ROW_POLICY=stop, so outboxd stopped without \
                    acknowledging it. It is in the WAL and the slot will deliver it again \
                    on every start, whatever happens to the row in the table now. To get past \
                    it: run once with OUTBOXD_BAD_ROW_POLICY=dead-letter (the row goes to \
                    OUTBOXD_DEAD_LETTER_TOPIC, later events follow), then switch back once \
                    `outboxd status` shows the slot confirmed past {commit_lsn}"
                );
                match before {
                    BeforeBadRow::Delivered => format!(
                        "{dead_letter}; or, accepting that this transaction's events not \
                        published yet are skipped, stop every outboxd instance of this slot (a \
                        standby takes it over otherwise) and advance the slot past this \
                        transaction only (every \
                        transaction before it is in Kafka: outboxd waited for them and confirmed \
                        them before stopping) with SELECT pg_replication_slot_advance('{slot}', \
                        '{skip_to}'), then restart"
                    ),
                    BeforeBadRow::Unacked { confirmed } => format!(
                        "{dead_letter}. Do not advance the slot past it now: Kafka had not \
                        acknowledged every transaction before it when outboxd stopped, or no look \
                        at the publication vouched for them (the slot is confirmed at \
                        {confirmed}), and an advance would skip those too. Start \
                        outboxd again: it delivers them, stops at this row again, and then says \
                        whether skipping this transaction alone is safe (if this repeats, raise \
                        OUTBOXD_SHUTDOWN_TIMEOUT_MS: outboxd waits that long for the acks; a \
                        failed delivery is logged before this error, and its cause comes first)"
                    ),
                    BeforeBadRow::Aborted => format!(
                        "{dead_letter}. Do not advance the slot past it: with \
                        OUTBOXD_DELIVERY=exactly-once the Kafka transaction holding the \
                        transactions before it was aborted, and an advance would skip them too"
                    ),
                }
            }
            RelayError::Session(e) => return e.remedy(),
            _ => return None,
        };
        Some(text)
    }

    /// Whether retrying can help; decided in `RelayError::verdict`.
    pub fn class(&self) -> ErrorClass {
        self.verdict().0
    }

    /// The SQLSTATE or librdkafka code that decided [`RelayError::class`], when one did.
    pub fn deciding_code(&self) -> Option<DecidingCode> {
        self.verdict().1
    }

    /// The one place that decides whether retrying can help, and by which code.
    fn verdict(&self) -> (ErrorClass, Option<DecidingCode>) {
        use ErrorClass::{Permanent, Retryable};
        use RelayError as E;
        let sqlstate = |code: &str| Some(DecidingCode::Sqlstate(code.to_owned()));
        let kafka = |code: RDKafkaErrorCode| Some(DecidingCode::Librdkafka(code));
        match self {
            E::Postgres(e) => (e.class(), e.sqlstate().and_then(sqlstate)),
            E::Sql(e) => (
                pgrepl::class_of_sql(e),
                e.code().and_then(|c| sqlstate(c.code())),
            ),
            // Recognised by its SQLSTATE on the stream (see from_stream).
            E::PublicationDropped { .. } => (Permanent, sqlstate("42704")),
            E::Session(SessionError::Shape(e)) => (e.class(), None),
            E::BadRow { error, .. }
            | E::Session(
                SessionError::BadRow { error, .. } | SessionError::DeadLetterTooLarge { error, .. },
            ) => (error.class(), None),
            // A broken message sequence or ack bookkeeping is a bug, not an outage: replaying
            // the same WAL would hit it again, so exit (code 1) with the log instead of looping.
            E::Session(SessionError::Ack(e)) => (e.class(), None),
            E::SlotMissing { .. }
            | E::SlotDropped { .. }
            | E::SlotInvalidated { .. }
            | E::SlotUnusable { .. }
            | E::PublicationMissing { .. }
            | E::TableNotPublished { .. }
            | E::UnsupportedServer { .. }
            | E::Session(
                SessionError::OutboxLikeRelation { .. }
                | SessionError::Protocol(_)
                | SessionError::ReleasedTooLarge { .. },
            )
            | E::ShardLayout { .. }
            | E::SlotLost { .. }
            | E::RowsBeforeSlot { .. }
            | E::BackfillUnfinished { .. }
            | E::ProgressNotDurable(_)
            | E::TimelineWentBack { .. }
            | E::PublicationChanged { .. }
            | E::PublicationUnverified { .. }
            | E::ServerSetting { .. }
            | E::FailoverUnsupported
            | E::BinaryRuledOut { .. }
            | E::OtherCluster { .. }
            | E::RecordOfOtherCluster(_)
            | E::Protocol(_) => (Permanent, None),
            E::KafkaSetup(
                KafkaSetupError::RefusedOverride { .. }
                | KafkaSetupError::InvalidSettings(_)
                | KafkaSetupError::InvalidProperty { .. }
                | KafkaSetupError::Client(_),
            ) => (Permanent, None),
            E::KafkaSetup(KafkaSetupError::TopicCreation { code, .. }) => (Retryable, kafka(*code)),
            E::KafkaSetup(_) => (Retryable, None),
            E::Delivery(f) => {
                let class = if f.retriable { Retryable } else { Permanent };
                (class, kafka(f.code))
            }
            E::Send(SendError::QueueFull | SendError::Fatal(_)) => (Retryable, None),
            E::Send(SendError::Other { code }) => {
                let class = if crate::kafka::is_permanent(*code) {
                    Permanent
                } else {
                    Retryable
                };
                (class, kafka(*code))
            }
            E::Send(_) => (Permanent, None),
            // Fenced: another instance holds the slot and its transactions now.
            E::Transaction(t) => match t.next() {
                TxnNext::Stop => (Permanent, None),
                TxnNext::CallAgain | TxnNext::AbortAndResume => (Retryable, None),
            },
            // A failover in progress: the address already points at a standby that is
            // about to be promoted.
            E::StreamClosed
            | E::SlotHistoryUnknown { .. }
            | E::FirstLookUnrecorded { .. }
            | E::SlotCreatedMeanwhile { .. }
            | E::StandbysUnsettled { .. }
            | E::InRecovery { .. }
            | E::BinaryRuledOutByRelation { .. }
            | E::OutputSettingsChanged { .. }
            | E::Session(SessionError::PartialReplay(_) | SessionError::ReplayUnproven(_)) => {
                (Retryable, None)
            }
        }
    }

    /// An error read from the replication stream, with the ones an operator must act on
    /// named: pgoutput looks the publication up (with the historic snapshot) when it
    /// decodes a change, so a dropped publication arrives as `42704 publication "p" does
    /// not exist` in the middle of the stream.
    pub fn from_stream(e: ReplError, publication: &str) -> RelayError {
        if let ReplError::Server(s) = &e {
            let missing = s.message.starts_with("publication ")
                || s.message.starts_with("skipped loading publication")
                || s.severity == "WARNING";
            if s.code == "42704" && missing {
                return RelayError::PublicationDropped {
                    publication: publication.to_owned(),
                    server: s.message.clone(),
                };
            }
        }
        RelayError::Postgres(e)
    }

    /// Process exit code for a permanent error (listed in the README).
    pub fn exit_code(&self) -> i32 {
        use RelayError as E;
        match self {
            E::BadRow { .. }
            | E::Session(SessionError::BadRow { .. } | SessionError::DeadLetterTooLarge { .. }) => {
                4
            }
            E::KafkaSetup(_) | E::Delivery(_) | E::Send(_) | E::Transaction(_) => 5,
            E::Protocol(_)
            | E::Session(
                SessionError::Protocol(_)
                | SessionError::Ack(_)
                | SessionError::ReleasedTooLarge { .. },
            ) => 1,
            _ => 3,
        }
    }

    /// The PostgreSQL side ended the session (restart, network, terminated walsender):
    /// what is in flight to Kafka is still good and worth waiting for.
    pub fn is_server_gone(&self) -> bool {
        matches!(
            self,
            RelayError::Postgres(_) | RelayError::Sql(_) | RelayError::StreamClosed
        )
    }

    /// Whether another instance holds the slot.
    pub fn is_slot_in_use(&self) -> bool {
        matches!(self, RelayError::Postgres(ReplError::SlotInUse { .. }))
    }

    /// Whether the producer stopped for good (a fatal librdkafka error, such as a batch
    /// refused under the gap-less guarantee): a failed delivery, though no report of it
    /// was read before the session ended.
    pub fn is_producer_fatal(&self) -> bool {
        matches!(self, RelayError::Send(SendError::Fatal(_)))
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;

/// What [`RelayError::RecordOfOtherCluster`] reports.
#[derive(Debug)]
pub struct OtherClusterRecord {
    pub slot: String,
    pub database: String,
    pub progress_topic: String,
    /// This server's system identifier.
    pub found: String,
    /// The record's.
    pub recorded: String,
    pub last_confirmed: pgoutput::Lsn,
    pub recorded_at: String,
}

impl std::fmt::Display for OtherClusterRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let OtherClusterRecord {
            slot,
            database,
            progress_topic,
            found,
            recorded,
            last_confirmed,
            recorded_at,
        } = self;
        write!(f, "the progress record of slot {slot:?} of database {database:?} in Kafka topic {progress_topic:?} was written on another cluster (system identifier {recorded}, last confirmed position {last_confirmed}, recorded {recorded_at}), and there is none for this server's cluster (system identifier {found}): outboxd is pointed at a different cluster than before (a wrong PGHOST, or the database moved by dump/restore or pg_upgrade). Positions of one cluster mean nothing on another, and events the old cluster still holds would be left behind silently, so outboxd stopped. A wrong host: fix PGHOST. This cluster is the new home on purpose: relay what is left on the old one, then run `outboxd init` (it records this cluster, and creates the slot if missing; with a new slot and the table's rows moved along, relayed on the old cluster already, `outboxd init --skip-existing-rows`) and start again. Two clusters meant to share the topic with the same database and slot names: run `outboxd init` once here, or give each its own OUTBOXD_PROGRESS_TOPIC")
    }
}
