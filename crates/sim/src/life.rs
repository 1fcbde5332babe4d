//! One relay session: the relay's own rules (`outbox_core::SessionCore`) fed a server's
//! stream as pgoutput sends it (Relation messages before a relation's first change,
//! Begin, changes, Commit, bare non-transactional messages, keepalives), with its records
//! handed to the model producer.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use outbox_core::{
    pgtype, After, CadenceRules, CatalogLook, Doubt, Look, Observe, PublicationWatch,
    RecordCadence, ReplayStart, Sent, SessionCore, SessionError, Skipped, Ticket,
};
use pgoutput::{
    Begin, Column, Commit, Insert, LogicalMessage, Lsn, Message, PgTimestamp, Relation,
    ReplicaIdentity, TupleData, TupleValue,
};

use crate::model::{
    event_number, event_uuid, partition, Change, Config, Txn, Written, EVENT_PREFIX, PARTITIONS,
};
use crate::Violation;

/// What the rules report that the simulation checks.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    tag: u8,
    /// Left unpublished as already in Kafka: each must be there.
    pub skipped: Vec<Written>,
    pub doubts: Vec<Doubt>,
}

impl Observe for Checks {
    fn skipped(&mut self, what: Skipped<'_>) {
        let w = match what {
            Skipped::Held(r) => Written::of(r),
            Skipped::Row(t) => Written {
                tag: self.tag,
                id: row_event(t),
                agg: 0,
                dead: false,
            },
            Skipped::Message(m) => Written {
                tag: self.tag,
                id: message_event(m),
                agg: 0,
                dead: false,
            },
        };
        self.skipped.push(w);
    }

    fn doubt(&mut self, d: Doubt, _held: usize) {
        self.doubts.push(d);
    }
}

/// Where a session is in its stream.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cursor {
    /// Before the Begin of `history[0]`.
    Before(usize),
    /// Inside `history[0]`, before change `1` (streamed changes only).
    Inside(usize, usize),
}

/// The relations of the stream.
pub(crate) const OUTBOX: u32 = 1;
pub(crate) const OUTBOX_PARTITION: u32 = 2;
pub(crate) const PARTITION_NAME: &str = "outbox_p1";
pub(crate) const OTHER: u32 = 3;

/// What a look at the publication read: the catalog's identity, and the WAL's end
/// before it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub identity: u64,
    pub wal_lsn: Lsn,
}

impl CatalogLook for Seen {
    fn same_catalog(&self, other: &Self) -> bool {
        self.identity == other.identity
    }
}

pub(crate) struct Life {
    pub cluster: usize,
    /// Which relay process of its cluster runs it (a kill starts a new one).
    pub process: u64,
    pub cfg: Config,
    pub core: SessionCore<Checks>,
    /// Produced and not acked, per partition, in produce order (an idempotent producer
    /// acks one partition in order).
    pub queues: Vec<VecDeque<(Ticket, Written)>>,
    pub cursor: Cursor,
    /// The relations this session was told about.
    described: [bool; 3],
    /// A delivery failed: the session ends at its next read (reports of other partitions
    /// and status updates may come first).
    pub failing: bool,
    /// Where it started: what the slot covered then is not this session's to prove (a
    /// copy's slot covers what the original delivered to its own topics).
    pub start: Lsn,
    /// The relay's publication watch (the relay's own rules).
    pub watch: PublicationWatch<Seen>,
    /// A look begun and not yet returned: what it read.
    pub look: Option<Look<Seen>>,
    /// The producer refuses the next record outright (a fatal error).
    pub fail_next_send: bool,
    /// The catalog no longer knows the outbox's partition (dropped).
    pub partition_gone: bool,
    /// A guard message was decoded: the relay looks at the publication now, the
    /// re-publish start the transaction's commit (`After::LookAtPublication`).
    pub guarded: Option<Option<(Lsn, PgTimestamp)>>,
    /// Leading rows of a partly delivered transaction skipped before their digest was
    /// checked: each must be in Kafka once the check passes; a mismatch gives them up
    /// (the session ends unconfirmed, and the next publishes them).
    pub unproven: Vec<Written>,
    /// When the session writes its progress record and reads it back (the relay's rules).
    pub cadence: RecordCadence,
    /// The lineage of the newest record of this session the broker acked.
    pub record_acked: Option<u64>,
    /// A write of this process's store was acked during this session.
    pub any_record_acked: bool,
    /// Which session this is (`records::RecordWrites`).
    pub session: u64,
}

/// The progress record's cadence on the simulation's clock (microseconds: a commit every
/// 2.5 ms on average, a schedule a fraction of a second): the relay's intervals scaled
/// down, so that looks come too early, records go unchanged past an idle rewrite and are
/// read back, all within a schedule.
pub(crate) const CADENCE: CadenceRules = CadenceRules {
    interval: Duration::from_millis(10),
    rewrite_idle_every: Duration::from_millis(60),
    lineage_check_every: Duration::from_millis(30),
    exactly_once: false,
};

impl Life {
    pub fn new(
        cluster: usize,
        process: u64,
        cfg: Config,
        cap: usize,
        replay: ReplayStart,
        cursor: Cursor,
        start_look: Seen,
    ) -> Result<Life, Violation> {
        let start = replay.start;
        let rules = cfg
            .rules(cap)
            .map_err(|e| Violation(format!("settings: {e}")))?;
        let checks = Checks {
            tag: cfg.tag,
            ..Checks::default()
        };
        Ok(Life {
            cluster,
            process,
            cfg,
            core: SessionCore::new(rules, replay, true, checks),
            queues: vec![VecDeque::new(); PARTITIONS],
            cursor,
            described: [false; 3],
            failing: false,
            partition_gone: false,
            start,
            watch: PublicationWatch::new(start_look, true, true),
            look: None,
            fail_next_send: false,
            guarded: None,
            unproven: Vec::new(),
            // Started again on the simulation's clock by who has one (`Sim::start_relays`).
            cadence: RecordCadence::new(CADENCE, Duration::ZERO),
            record_acked: None,
            any_record_acked: false,
            session: 0,
        })
    }

    /// Applies a guard message decoded since the last call (`PublicationWatch::guard`,
    /// the last look's identity at the commit's position); true if there was one.
    pub fn guard_seen(&mut self) -> bool {
        let Some(commit) = self.guarded.take() else {
            return false;
        };
        let at = Seen {
            identity: self.watch.last().identity,
            wal_lsn: commit.map_or(Lsn::ZERO, |(lsn, _)| lsn),
        };
        self.watch.guard(at);
        true
    }

    /// An insert into `rel`, after its Relation message if this session has not had it.
    pub fn insert(&mut self, rel: u32, tuple: TupleData) -> Result<(), SessionError> {
        let slot = usize::try_from(rel).unwrap_or(0).saturating_sub(1);
        if !self.described.get(slot).copied().unwrap_or(true) {
            self.described[slot] = true;
            let r = relation(rel);
            // The catalog's answer, as the relay's side connection gives it.
            let partition = rel == OUTBOX_PARTITION && !self.partition_gone;
            let parent = self.core.asks_parent(&r).then_some(partition);
            self.core.on_relation(&r, parent)?;
        }
        let ins = Insert {
            xid: None,
            rel_id: rel,
            new_tuple: tuple,
        };
        self.message(LogicalMessage::Insert(ins), 0)
    }

    /// A schema change, or a cache invalidation: relations are described again.
    pub fn forget_relations(&mut self) {
        self.described = [false; 3];
    }

    pub fn message(&mut self, m: LogicalMessage, now: i64) -> Result<(), SessionError> {
        if let After::LookAtPublication { commit } = self.core.on_message(m, PgTimestamp(now))? {
            self.guarded = Some(commit);
        }
        Ok(())
    }

    /// Hands what the rules queued to the producer, which refuses a few events as too
    /// large (as if its measure differed from the rules'): the same ones on every replay,
    /// until the operator raises the limit.
    pub fn pump(&mut self) -> Result<(), SessionError> {
        while let Some(send) = self.core.take_send() {
            if std::mem::take(&mut self.fail_next_send) {
                // No report will come, and the session ends with the error.
                self.core.send_failed(send)?;
                self.failing = true;
                return Ok(());
            }
            let w = Written::of(&send.record);
            if !w.dead && !self.cfg.limit_raised && w.id.is_multiple_of(61) {
                self.core.sent(send, Sent::TooLarge { size: 2 << 20 })?;
                continue;
            }
            self.queues[partition(w.agg)].push_back((send.ticket, w));
            self.core.sent(send, Sent::Queued)?;
        }
        Ok(())
    }
}

fn col(name: &str, type_oid: u32) -> Column {
    Column::new(name, type_oid)
}

/// The outbox's columns; its partition has them in another order (bound by name).
fn relation(rel: u32) -> Relation {
    let outbox = [
        col("id", pgtype::UUID),
        col("aggregate_type", pgtype::VARCHAR),
        col("aggregate_id", pgtype::TEXT),
        col("event_type", pgtype::TEXT),
        col("payload", pgtype::JSONB),
        col("headers", pgtype::JSONB),
    ];
    let (name, columns) = match rel {
        OUTBOX => ("outbox", outbox.to_vec()),
        OUTBOX_PARTITION => (PARTITION_NAME, outbox.iter().rev().cloned().collect()),
        _ => (
            "other",
            vec![col("k", pgtype::INT4), col("v", pgtype::TEXT)],
        ),
    };
    Relation {
        xid: None,
        rel_id: rel,
        namespace: "public".to_owned(),
        name: name.to_owned(),
        replica_identity: ReplicaIdentity::Default,
        columns,
    }
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

/// A row of `rel` for `change`, in that relation's column order.
pub(crate) fn tuple(rel: u32, change: Change) -> TupleData {
    let Change::Outbox { id, agg, bad, .. } = change else {
        return TupleData {
            columns: vec![text("1"), text("v")],
        };
    };
    let agg = if bad {
        TupleValue::Null
    } else {
        text(&agg.to_string())
    };
    let mut columns = vec![
        text(&event_uuid(id)),
        text("A"),
        agg,
        text("E"),
        text("{}"),
        TupleValue::Null,
    ];
    if rel == OUTBOX_PARTITION {
        columns.reverse();
    }
    TupleData { columns }
}

/// The event number of an outbox row (the partition's id column is its last).
fn row_event(t: &TupleData) -> u64 {
    let prefix = event_uuid(0);
    let prefix = prefix.trim_end_matches('0');
    t.columns
        .iter()
        .find_map(|c| match c {
            TupleValue::Text(b) => std::str::from_utf8(b)
                .ok()
                .filter(|s| s.starts_with(prefix))
                .map(event_number),
            _ => None,
        })
        .unwrap_or(0)
}

/// The event number of a message's envelope.
fn message_event(m: &Message) -> u64 {
    let content = std::str::from_utf8(&m.content).unwrap_or("");
    content
        .split("\"id\":")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A logical message of `txn` (`event`: with the relay's prefix).
pub(crate) fn logical_message(txn: &Txn, event: Option<(u64, u32)>) -> LogicalMessage {
    let (prefix, content) = match event {
        Some((id, agg)) => (
            EVENT_PREFIX,
            format!(
                r#"{{"id":{id},"aggregate_type":"A","aggregate_id":"{agg}","event_type":"E","payload":{{}}}}"#
            ),
        ),
        None => ("outboxd.heartbeat", String::new()),
    };
    LogicalMessage::Message(Message {
        xid: None,
        flags: u8::from(!txn.bare),
        lsn: txn.commit_lsn,
        prefix: prefix.to_owned(),
        content: Bytes::from(content),
    })
}

/// The guard's message in the transaction that changed the publication.
pub(crate) fn guard_message(txn: &Txn) -> LogicalMessage {
    LogicalMessage::Message(Message {
        xid: None,
        flags: 1,
        lsn: txn.commit_lsn,
        prefix: outbox_core::PUBLICATION_GUARD_PREFIX.to_owned(),
        content: Bytes::from_static(b"ALTER PUBLICATION"),
    })
}

pub(crate) fn begin(txn: &Txn) -> LogicalMessage {
    LogicalMessage::Begin(Begin {
        final_lsn: txn.commit_lsn,
        commit_time: PgTimestamp(txn.commit_time),
        xid: txn.xid,
    })
}

pub(crate) fn commit(txn: &Txn) -> LogicalMessage {
    LogicalMessage::Commit(Commit {
        flags: 0,
        commit_lsn: txn.commit_lsn,
        end_lsn: txn.end_lsn,
        commit_time: PgTimestamp(txn.commit_time),
    })
}
