//! The world the relay runs in: PostgreSQL servers with their histories and slots, the
//! relay's settings, and the broker.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use outbox_core::slot_fate::SlotNow;
use outbox_core::{
    BadRowPolicy, ConfigError, CoreConfig, DeliveredPosition, EmitMapper, InFlightCaps, Look,
    OutboxRecord, TableSpec, TopicName, TopicTemplate,
};
use pgoutput::Lsn;

use crate::life::Seen;

/// One change of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// An outbox row (`partition`: written through a partition of a partitioned outbox;
    /// `bad`: its aggregate id is NULL, so it is dead-lettered or stops the relay).
    Outbox {
        id: u64,
        agg: u32,
        partition: bool,
        bad: bool,
    },
    /// A row of another table of the publication.
    Other,
    /// A logical message: with the relay's prefix (an event) or another (a heartbeat).
    Message { event: Option<(u64, u32)> },
}

impl Change {
    /// The event it carries, a row's or a message's.
    pub fn event_id(&self) -> Option<u64> {
        match *self {
            Change::Outbox { id, .. }
            | Change::Message {
                event: Some((id, _)),
            } => Some(id),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Txn {
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub xid: u32,
    pub commit_time: i64,
    pub changes: Vec<Change>,
    /// A non-transactional message whose record ends at `commit_lsn` (its position, as
    /// pgoutput gives it: where the next record starts): decoded at once, alone, with no
    /// Begin or Commit around it (`changes` is that one message).
    pub bare: bool,
    /// The outbox was out of the publication when this committed: its rows are never
    /// decoded (PostgreSQL decodes by the catalog as it was).
    pub hidden: bool,
    /// It changed the publication, and `sql/publication-guard.sql`'s event trigger wrote
    /// its message in it (`changes` is empty).
    pub guard: bool,
}

/// One PostgreSQL server: its history (commit order), its slot and its WAL end.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    pub history: Vec<Txn>,
    /// The slot's confirmed position, and what a crash falls back to (PostgreSQL 16 and
    /// older make it durable only at checkpoints).
    pub confirmed: Lsn,
    pub persisted: Lsn,
    pub wal_end: Lsn,
    pub next_xid: u32,
    pub falls_back: bool,
    pub timeline: u32,
    /// The topics its relay publishes to (0: production; 1: a staging copy's).
    pub tag: u8,
    /// Progress-record key: copies of one cluster share it unless named apart.
    pub key: u8,
    /// The publication's catalog identity (row versions: a change never goes back).
    pub publication: u64,
    /// The identity queries see: behind `publication` while the change's commit waits
    /// for a synchronous standby (in the WAL, and decoded by the new catalog, already).
    pub visible: u64,
    /// Whether the outbox is in the publication now.
    pub outbox_published: bool,
    /// The identity the operator last accepted (`init --accept-publication-change`).
    pub accepted: u64,
    /// Events the operator published again after a publication change hid them.
    pub republished: HashSet<u64>,
    /// The replication slot (`slot_loss`): usable, invalidated or gone.
    pub slot: SlotNow,
    /// The outbox's partition was dropped (retention): the catalog no longer knows it, and
    /// its rows are in the WAL alone.
    pub partition_dropped: bool,
}

impl Txn {
    /// Whether a slot at `start` decodes it: PostgreSQL skips a record that starts before
    /// the slot's position (a transaction's commit record starts at its commit LSN; a bare
    /// message's record ends at its position, so a slot there has passed it).
    pub fn decoded_from(&self, start: Lsn) -> bool {
        match self.bare {
            true => self.commit_lsn > start,
            false => self.commit_lsn >= start,
        }
    }
}

impl Cluster {
    /// A look at the publication: what queries see now, settled unless a commit is
    /// still waiting for its standby.
    pub fn look(&self) -> Look<Seen> {
        Look {
            seen: Some(Seen {
                identity: self.visible,
                wal_lsn: self.wal_end,
            }),
            settled: self.visible == self.publication,
            settle_end: None,
        }
    }

    /// A transaction (or a bare message) of `size` bytes of WAL commits at `commit_time`.
    /// A bare message's position is its record's end, where the next record starts; a
    /// transaction's commit record starts at its commit LSN (right at a message's end when
    /// `size` is 0: its changes were written before the message).
    pub fn commit(&mut self, changes: Vec<Change>, size: u64, commit_time: i64, bare: bool) {
        let commit_lsn = Lsn(self.wal_end.0 + size);
        let end_lsn = if bare {
            commit_lsn
        } else {
            Lsn(commit_lsn.0 + 24)
        };
        self.wal_end = end_lsn;
        self.next_xid += 1;
        self.history.push(Txn {
            commit_lsn,
            end_lsn,
            xid: self.next_xid,
            commit_time,
            changes,
            bare,
            hidden: !self.outbox_published,
            guard: false,
        });
    }

    /// The transaction that changed the publication, with the guard's message in it.
    pub fn commit_guard(&mut self, commit_time: i64) {
        self.commit(Vec::new(), 40, commit_time, false);
        if let Some(t) = self.history.last_mut() {
            t.guard = true;
        }
    }
}

/// A relay's settings, as far as they decide what is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config {
    pub tag: u8,
    /// false: an emit-only relay (`OUTBOXD_RELAY_TABLE=false`), relaying emitted
    /// messages alone; its outbox table stays empty.
    pub relay_table: bool,
    pub relay_messages: bool,
    pub heartbeat: bool,
    pub other_published: bool,
    pub dead_letter: bool,
    /// The operator raised `OUTBOXD_MAX_MESSAGE_BYTES`: the producer refuses nothing.
    pub limit_raised: bool,
    /// `OUTBOXD_FORMER_PARTITIONS` names the dropped partition, as its error says.
    pub former_partition: bool,
}

/// The relay's prefix for events sent as logical messages.
pub(crate) const EVENT_PREFIX: &str = "outbox";

impl Config {
    /// The rules' settings, as the relay builds them from its environment.
    pub fn rules(self, cap: usize) -> Result<CoreConfig, ConfigError> {
        let topic = Arc::new(TopicTemplate::parse(&format!(
            "t{}.{{aggregate_type}}",
            self.tag
        ))?);
        let emit = match self.relay_messages {
            true => Some(EmitMapper::new(EVENT_PREFIX, Arc::clone(&topic))?),
            false => None,
        };
        Ok(CoreConfig {
            table: TableSpec {
                topic,
                ..TableSpec::default()
            },
            relay_table: self.relay_table,
            emit,
            dead_letter_topic: TopicName::parse(&format!("dlq{}", self.tag))?,
            bad_row_policy: if self.dead_letter {
                BadRowPolicy::DeadLetter
            } else {
                BadRowPolicy::Stop
            },
            max_message_bytes: if self.limit_raised { 4 << 20 } else { 1 << 20 },
            caps: caps(cap),
            idle_flush: true,
            former_partitions: match self.former_partition {
                true => vec![format!("public.{}", crate::life::PARTITION_NAME)],
                false => Vec::new(),
            },
        })
    }

    /// The relay's own fingerprint of these settings.
    pub fn fingerprint(self) -> Result<u64, ConfigError> {
        let catalog = if self.other_published {
            "outbox,other"
        } else {
            "outbox"
        };
        Ok(self
            .rules(1)?
            .fingerprint(self.heartbeat, "outboxd_pub", catalog))
    }

    /// Whether pgoutput sends the change to this session.
    pub fn streams(self, c: Change) -> bool {
        match c {
            Change::Outbox { .. } => self.relay_table,
            Change::Other => self.other_published,
            Change::Message { .. } => self.relay_messages || self.heartbeat,
        }
    }
}

/// A record as written to Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Written {
    pub tag: u8,
    pub id: u64,
    pub agg: u32,
    /// To the dead-letter topic.
    pub dead: bool,
}

impl Written {
    /// What a record of the rules is, read back from its topic, key and event id.
    pub fn of(r: &OutboxRecord) -> Written {
        let (dead, tag) = match r.topic.strip_prefix("dlq") {
            Some(rest) => (true, rest),
            None => (false, r.topic.get(1..2).unwrap_or("")),
        };
        Written {
            tag: tag.parse().unwrap_or(u8::MAX),
            id: event_number(&r.event_id),
            agg: r
                .key
                .as_ref()
                .and_then(|k| std::str::from_utf8(k).ok())
                .and_then(|k| k.parse().ok())
                .unwrap_or(u32::MAX),
            dead,
        }
    }
}

/// The number in an event id (`…-000000000042` for a row's uuid, `42` for a message's).
pub(crate) fn event_number(id: &str) -> u64 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn event_uuid(id: u64) -> String {
    format!("00000000-0000-4000-8000-{id:012}")
}

pub(crate) const PARTITIONS: usize = 3;

pub(crate) fn partition(agg: u32) -> usize {
    usize::try_from(agg).unwrap_or(0) % PARTITIONS
}

/// A progress record as the topic keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub claim: DeliveredPosition,
    pub lineage: u64,
    /// The relay process that wrote it, and its claim: (cluster, process, epoch).
    pub writer: (usize, u64, u64),
    /// The writer's clock when it wrote it.
    pub written_at: i64,
}

/// The broker: what it holds (per partition, in append order) and the progress topic.
#[derive(Debug, Default)]
pub(crate) struct Kafka {
    pub log: Vec<Vec<Written>>,
    /// (tag, event) of every record, events and dead letters.
    pub written: HashSet<(u8, u64)>,
    pub records: HashMap<u8, Vec<Record>>,
}

impl Kafka {
    pub fn write(&mut self, w: Written) {
        if self.log.is_empty() {
            self.log = vec![Vec::new(); PARTITIONS];
        }
        if let Some(p) = self.log.get_mut(partition(w.agg)) {
            p.push(w);
        }
        self.written.insert((w.tag, w.id));
    }
}

/// The model's in-flight caps: `cap` messages, bytes unbounded.
pub fn caps(cap: usize) -> InFlightCaps {
    InFlightCaps {
        max_messages: cap,
        max_bytes: usize::MAX,
    }
}
