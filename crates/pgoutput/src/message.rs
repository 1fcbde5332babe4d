//! pgoutput logical replication messages, protocol versions 1–4.
//!
//! `xid: Option<u32>` fields are present on the wire only inside a streamed block
//! (between Stream Start and Stream Stop, protocol ≥ 2); the caller says which via
//! [`StreamState`], or [`MessageDecoder`] tracks it. Decoding lives in `message/decode.rs`,
//! encoding in `message/encode.rs`.

use bytes::Bytes;

use crate::{Lsn, PgTimestamp};

mod decode;
mod encode;

pub use decode::MessageDecoder;

/// Tag bytes of the pgoutput messages (`LogicalRepMsgType` in `logicalproto.h`).
pub mod tags {
    pub const BEGIN: u8 = b'B';
    pub const COMMIT: u8 = b'C';
    pub const ORIGIN: u8 = b'O';
    pub const RELATION: u8 = b'R';
    pub const TYPE: u8 = b'Y';
    pub const INSERT: u8 = b'I';
    pub const UPDATE: u8 = b'U';
    pub const DELETE: u8 = b'D';
    pub const TRUNCATE: u8 = b'T';
    pub const MESSAGE: u8 = b'M';
    pub const STREAM_START: u8 = b'S';
    pub const STREAM_STOP: u8 = b'E';
    pub const STREAM_COMMIT: u8 = b'c';
    pub const STREAM_ABORT: u8 = b'A';
    pub const BEGIN_PREPARE: u8 = b'b';
    pub const PREPARE: u8 = b'P';
    pub const COMMIT_PREPARED: u8 = b'K';
    pub const ROLLBACK_PREPARED: u8 = b'r';
    pub const STREAM_PREPARE: u8 = b'p';
}

/// Whether the message being decoded is inside a Stream Start … Stream Stop block,
/// which prefixes DML/Relation/Type/Message with the streamed transaction's xid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamState {
    #[default]
    Outside,
    InsideStream,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    Begin(Begin),
    Commit(Commit),
    Origin(Origin),
    Relation(Relation),
    Type(TypeInfo),
    Insert(Insert),
    Update(Update),
    Delete(Delete),
    Truncate(Truncate),
    Message(Message),
    StreamStart(StreamStart),
    StreamStop,
    StreamCommit(StreamCommit),
    StreamAbort(StreamAbort),
    BeginPrepare(BeginPrepare),
    Prepare(Prepare),
    CommitPrepared(CommitPrepared),
    RollbackPrepared(RollbackPrepared),
    StreamPrepare(Prepare),
}

/// `B`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the commit record (= Commit.commit_lsn).
    pub final_lsn: Lsn,
    pub commit_time: PgTimestamp,
    pub xid: u32,
}

/// `C`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub flags: u8,
    /// Start of the commit record. Never report this as flushed: it re-sends the transaction.
    pub commit_lsn: Lsn,
    /// End of the commit record: the position to report as flushed once the transaction is durable.
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// `O`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub origin_lsn: Lsn,
    pub name: String,
}

/// Replica identity setting of a relation (`d`efault, `n`othing, `f`ull, `i`ndex).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    Default,
    Nothing,
    Full,
    Index,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Flags byte; bit 1 = part of the replica identity key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

impl Column {
    /// A column outside the replica identity, with no type modifier.
    pub fn new(name: &str, type_oid: u32) -> Self {
        Column {
            flags: 0,
            name: name.to_owned(),
            type_oid,
            type_modifier: -1,
        }
    }

    pub fn is_key(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// `R`: schema of a relation; may be re-sent at any time (any relcache invalidation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub xid: Option<u32>,
    pub rel_id: u32,
    /// `""` means `pg_catalog`.
    pub namespace: String,
    pub name: String,
    pub replica_identity: ReplicaIdentity,
    pub columns: Vec<Column>,
}

/// `Y`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    pub xid: Option<u32>,
    pub type_oid: u32,
    pub namespace: String,
    pub name: String,
}

/// One column value of a [`TupleData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// `n`
    Null,
    /// `u`: unchanged TOASTed value, not sent (never in inserts).
    UnchangedToast,
    /// `t`: the type's text output.
    Text(Bytes),
    /// `b`: the type's binary send format (binary mode, PG14+).
    Binary(Bytes),
}

/// A row image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData {
    pub columns: Vec<TupleValue>,
}

/// `I`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    pub xid: Option<u32>,
    pub rel_id: u32,
    pub new_tuple: TupleData,
}

/// The optional old row image of an Update, or the required one of a Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: only the replica-identity key columns.
    Key(TupleData),
    /// `O`: the whole old row (REPLICA IDENTITY FULL).
    Full(TupleData),
}

/// `U`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub xid: Option<u32>,
    pub rel_id: u32,
    pub old_tuple: Option<OldTuple>,
    pub new_tuple: TupleData,
}

/// `D`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub xid: Option<u32>,
    pub rel_id: u32,
    pub old_tuple: OldTuple,
}

/// `T`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    pub xid: Option<u32>,
    /// 1 = CASCADE, 2 = RESTART IDENTITY.
    pub options: u8,
    pub rel_ids: Vec<u32>,
}

/// `M`: output of `pg_logical_emit_message` (needs the `messages` option, PG14+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub xid: Option<u32>,
    /// Flags byte; bit 1 = transactional.
    pub flags: u8,
    pub lsn: Lsn,
    pub prefix: String,
    pub content: Bytes,
}

impl Message {
    pub fn is_transactional(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// `S`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    pub first_segment: bool,
}

/// `c`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
}

/// `A`. `abort_lsn`/`abort_time` are present only with `streaming = parallel` (protocol 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamAbort {
    pub xid: u32,
    pub subxid: u32,
    pub abort: Option<(Lsn, PgTimestamp)>,
}

/// `b`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: PgTimestamp,
    pub xid: u32,
    pub gid: String,
}

/// `P` (Prepare) and `p` (Stream Prepare) share this layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: PgTimestamp,
    pub xid: u32,
    pub gid: String,
}

/// `K`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: PgTimestamp,
    pub xid: u32,
    pub gid: String,
}

/// `r`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    pub flags: u8,
    pub prepare_end_lsn: Lsn,
    pub rollback_end_lsn: Lsn,
    pub prepare_time: PgTimestamp,
    pub rollback_time: PgTimestamp,
    pub xid: u32,
    pub gid: String,
}

/// The start of a pgoutput message too long to be held whole: what could be read from
/// its first bytes (see [`TruncatedMessage::decode`]). Only row changes and logical
/// messages can be this long; every other message is small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedMessage {
    /// The whole message's length in bytes, its tag included.
    pub len: usize,
    pub kind: Truncated,
}

/// What a [`TruncatedMessage`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Truncated {
    /// `I`: the row's leading columns that lay wholly inside the bytes kept.
    Insert {
        xid: Option<u32>,
        rel_id: u32,
        /// How many columns the whole row has.
        column_count: usize,
        leading: TupleData,
    },
    /// `U`
    Update { xid: Option<u32>, rel_id: u32 },
    /// `D`
    Delete { xid: Option<u32>, rel_id: u32 },
    /// `M`. `prefix` is `None` when it does not end inside the bytes kept (so it is longer
    /// than they are); `content_len` likewise.
    Message {
        xid: Option<u32>,
        flags: u8,
        lsn: Lsn,
        prefix: Option<String>,
        content_len: Option<usize>,
    },
}

impl Truncated {
    /// The message with the whole one's fields and an empty content, for
    /// [`Truncated::Message`] with a known prefix.
    pub fn as_message(&self) -> Option<Message> {
        match self {
            Truncated::Message {
                xid,
                flags,
                lsn,
                prefix: Some(prefix),
                ..
            } => Some(Message {
                xid: *xid,
                flags: *flags,
                lsn: *lsn,
                prefix: prefix.clone(),
                content: Bytes::new(),
            }),
            _ => None,
        }
    }
}
