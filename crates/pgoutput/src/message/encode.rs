//! Encoding of pgoutput messages, byte-for-byte as `proto.c` writes them, so test
//! doubles of the server can produce what PostgreSQL would.

use bytes::{BufMut, Bytes, BytesMut};

use super::tags;
use crate::writer::{put_count_i16, put_count_i32, put_cstr};
use crate::*;

impl LogicalMessage {
    /// The message's tag byte (`B`, `C`, `R`, …).
    pub fn tag(&self) -> u8 {
        match self {
            LogicalMessage::Begin(_) => tags::BEGIN,
            LogicalMessage::Commit(_) => tags::COMMIT,
            LogicalMessage::Origin(_) => tags::ORIGIN,
            LogicalMessage::Relation(_) => tags::RELATION,
            LogicalMessage::Type(_) => tags::TYPE,
            LogicalMessage::Insert(_) => tags::INSERT,
            LogicalMessage::Update(_) => tags::UPDATE,
            LogicalMessage::Delete(_) => tags::DELETE,
            LogicalMessage::Truncate(_) => tags::TRUNCATE,
            LogicalMessage::Message(_) => tags::MESSAGE,
            LogicalMessage::StreamStart(_) => tags::STREAM_START,
            LogicalMessage::StreamStop => tags::STREAM_STOP,
            LogicalMessage::StreamCommit(_) => tags::STREAM_COMMIT,
            LogicalMessage::StreamAbort(_) => tags::STREAM_ABORT,
            LogicalMessage::BeginPrepare(_) => tags::BEGIN_PREPARE,
            LogicalMessage::Prepare(_) => tags::PREPARE,
            LogicalMessage::CommitPrepared(_) => tags::COMMIT_PREPARED,
            LogicalMessage::RollbackPrepared(_) => tags::ROLLBACK_PREPARED,
            LogicalMessage::StreamPrepare(_) => tags::STREAM_PREPARE,
        }
    }

    /// The encoded message as its own buffer; see [`LogicalMessage::encode`].
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.freeze()
    }

    /// Appends the message, tag byte first, to `buf`.
    ///
    /// `xid` fields are written iff they are `Some`, so a message with an xid must be
    /// decoded with [`StreamState::InsideStream`]. Strings are written up to the NUL
    /// terminator, so a string containing NUL does not survive a round trip.
    ///
    /// # Panics
    ///
    /// If a count or length cannot be represented on the wire: more than `i16::MAX`
    /// columns, or more than `i32::MAX` relations or value bytes.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u8(self.tag());
        match self {
            LogicalMessage::Begin(m) => {
                buf.put_u64(m.final_lsn.0);
                buf.put_i64(m.commit_time.0);
                buf.put_u32(m.xid);
            }
            LogicalMessage::Commit(m) => {
                buf.put_u8(m.flags);
                buf.put_u64(m.commit_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.commit_time.0);
            }
            LogicalMessage::Origin(m) => {
                buf.put_u64(m.origin_lsn.0);
                put_cstr(buf, &m.name);
            }
            LogicalMessage::Relation(m) => relation(buf, m),
            LogicalMessage::Type(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.type_oid);
                put_cstr(buf, &m.namespace);
                put_cstr(buf, &m.name);
            }
            LogicalMessage::Insert(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.rel_id);
                buf.put_u8(b'N');
                tuple_data(buf, &m.new_tuple);
            }
            LogicalMessage::Update(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.rel_id);
                if let Some(old) = &m.old_tuple {
                    old_tuple(buf, old);
                }
                buf.put_u8(b'N');
                tuple_data(buf, &m.new_tuple);
            }
            LogicalMessage::Delete(m) => {
                put_xid(buf, m.xid);
                buf.put_u32(m.rel_id);
                old_tuple(buf, &m.old_tuple);
            }
            LogicalMessage::Truncate(m) => {
                put_xid(buf, m.xid);
                put_count_i32(buf, m.rel_ids.len(), "Truncate relation count");
                buf.put_u8(m.options);
                for rel_id in &m.rel_ids {
                    buf.put_u32(*rel_id);
                }
            }
            LogicalMessage::Message(m) => {
                put_xid(buf, m.xid);
                buf.put_u8(m.flags);
                buf.put_u64(m.lsn.0);
                put_cstr(buf, &m.prefix);
                put_count_i32(buf, m.content.len(), "Message content length");
                buf.put_slice(&m.content);
            }
            LogicalMessage::StreamStart(m) => {
                buf.put_u32(m.xid);
                buf.put_u8(u8::from(m.first_segment));
            }
            LogicalMessage::StreamStop => {}
            LogicalMessage::StreamCommit(m) => {
                buf.put_u32(m.xid);
                buf.put_u8(m.flags);
                buf.put_u64(m.commit_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.commit_time.0);
            }
            LogicalMessage::StreamAbort(m) => {
                buf.put_u32(m.xid);
                buf.put_u32(m.subxid);
                if let Some((lsn, time)) = m.abort {
                    buf.put_u64(lsn.0);
                    buf.put_i64(time.0);
                }
            }
            LogicalMessage::BeginPrepare(m) => {
                buf.put_u64(m.prepare_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.prepare_time.0);
                buf.put_u32(m.xid);
                put_cstr(buf, &m.gid);
            }
            LogicalMessage::Prepare(m) | LogicalMessage::StreamPrepare(m) => {
                buf.put_u8(m.flags);
                buf.put_u64(m.prepare_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.prepare_time.0);
                buf.put_u32(m.xid);
                put_cstr(buf, &m.gid);
            }
            LogicalMessage::CommitPrepared(m) => {
                buf.put_u8(m.flags);
                buf.put_u64(m.commit_lsn.0);
                buf.put_u64(m.end_lsn.0);
                buf.put_i64(m.commit_time.0);
                buf.put_u32(m.xid);
                put_cstr(buf, &m.gid);
            }
            LogicalMessage::RollbackPrepared(m) => {
                buf.put_u8(m.flags);
                buf.put_u64(m.prepare_end_lsn.0);
                buf.put_u64(m.rollback_end_lsn.0);
                buf.put_i64(m.prepare_time.0);
                buf.put_i64(m.rollback_time.0);
                buf.put_u32(m.xid);
                put_cstr(buf, &m.gid);
            }
        }
    }
}

fn put_xid(buf: &mut BytesMut, xid: Option<u32>) {
    if let Some(xid) = xid {
        buf.put_u32(xid);
    }
}

fn replica_identity_byte(identity: ReplicaIdentity) -> u8 {
    match identity {
        ReplicaIdentity::Default => b'd',
        ReplicaIdentity::Nothing => b'n',
        ReplicaIdentity::Full => b'f',
        ReplicaIdentity::Index => b'i',
    }
}

fn relation(buf: &mut BytesMut, m: &Relation) {
    put_xid(buf, m.xid);
    buf.put_u32(m.rel_id);
    put_cstr(buf, &m.namespace);
    put_cstr(buf, &m.name);
    buf.put_u8(replica_identity_byte(m.replica_identity));
    put_count_i16(buf, m.columns.len(), "Relation column count");
    for column in &m.columns {
        buf.put_u8(column.flags);
        put_cstr(buf, &column.name);
        buf.put_u32(column.type_oid);
        buf.put_i32(column.type_modifier);
    }
}

fn old_tuple(buf: &mut BytesMut, old: &OldTuple) {
    match old {
        OldTuple::Key(t) => {
            buf.put_u8(b'K');
            tuple_data(buf, t);
        }
        OldTuple::Full(t) => {
            buf.put_u8(b'O');
            tuple_data(buf, t);
        }
    }
}

fn tuple_data(buf: &mut BytesMut, tuple: &TupleData) {
    put_count_i16(buf, tuple.columns.len(), "TupleData column count");
    for value in &tuple.columns {
        match value {
            TupleValue::Null => buf.put_u8(b'n'),
            TupleValue::UnchangedToast => buf.put_u8(b'u'),
            TupleValue::Text(v) => {
                buf.put_u8(b't');
                put_count_i32(buf, v.len(), "TupleData text length");
                buf.put_slice(v);
            }
            TupleValue::Binary(v) => {
                buf.put_u8(b'b');
                put_count_i32(buf, v.len(), "TupleData binary length");
                buf.put_slice(v);
            }
        }
    }
}
