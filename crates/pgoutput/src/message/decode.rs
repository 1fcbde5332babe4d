//! Decoding of pgoutput messages (`proto.c` in PostgreSQL, protocol versions 1–4).

use bytes::Bytes;

use super::tags;
use crate::reader::Reader;
use crate::*;

/// Fewest bytes a Relation column can take: flags, empty name's NUL, type OID, typmod.
const MIN_COLUMN_LEN: usize = 1 + 1 + 4 + 4;
/// Fewest bytes a TupleData column can take: a lone `n` or `u` kind byte.
const MIN_TUPLE_VALUE_LEN: usize = 1;
const REL_ID_LEN: usize = 4;
/// Stream Abort's optional tail (protocol 4, `streaming = parallel`): abort LSN and time.
const STREAM_ABORT_TAIL_LEN: usize = 8 + 8;

impl LogicalMessage {
    /// Decodes exactly one pgoutput message (the `data` of one XLogData frame).
    ///
    /// `stream` says whether the message sits between Stream Start and Stream Stop,
    /// where Relation, Type, DML and Message carry the streamed transaction's xid.
    /// Use [`MessageDecoder`] to have that tracked for you.
    pub fn decode(data: Bytes, stream: StreamState) -> Result<LogicalMessage, DecodeError> {
        let mut r = Reader::new(data);
        let tag = r.get_u8("pgoutput message tag")?;
        let (msg, what) = match tag {
            tags::BEGIN => (LogicalMessage::Begin(begin(&mut r)?), "Begin"),
            tags::COMMIT => (LogicalMessage::Commit(commit(&mut r)?), "Commit"),
            tags::ORIGIN => (LogicalMessage::Origin(origin(&mut r)?), "Origin"),
            tags::RELATION => (
                LogicalMessage::Relation(relation(&mut r, stream)?),
                "Relation",
            ),
            tags::TYPE => (LogicalMessage::Type(type_info(&mut r, stream)?), "Type"),
            tags::INSERT => (LogicalMessage::Insert(insert(&mut r, stream)?), "Insert"),
            tags::UPDATE => (LogicalMessage::Update(update(&mut r, stream)?), "Update"),
            tags::DELETE => (LogicalMessage::Delete(delete(&mut r, stream)?), "Delete"),
            tags::TRUNCATE => (
                LogicalMessage::Truncate(truncate(&mut r, stream)?),
                "Truncate",
            ),
            tags::MESSAGE => (LogicalMessage::Message(message(&mut r, stream)?), "Message"),
            tags::STREAM_START => (
                LogicalMessage::StreamStart(stream_start(&mut r)?),
                "Stream Start",
            ),
            tags::STREAM_STOP => (LogicalMessage::StreamStop, "Stream Stop"),
            tags::STREAM_COMMIT => (
                LogicalMessage::StreamCommit(stream_commit(&mut r)?),
                "Stream Commit",
            ),
            tags::STREAM_ABORT => (
                LogicalMessage::StreamAbort(stream_abort(&mut r)?),
                "Stream Abort",
            ),
            tags::BEGIN_PREPARE => (
                LogicalMessage::BeginPrepare(begin_prepare(&mut r)?),
                "Begin Prepare",
            ),
            tags::PREPARE => (
                LogicalMessage::Prepare(prepare(&mut r, "Prepare")?),
                "Prepare",
            ),
            tags::COMMIT_PREPARED => (
                LogicalMessage::CommitPrepared(commit_prepared(&mut r)?),
                "Commit Prepared",
            ),
            tags::ROLLBACK_PREPARED => (
                LogicalMessage::RollbackPrepared(rollback_prepared(&mut r)?),
                "Rollback Prepared",
            ),
            tags::STREAM_PREPARE => (
                LogicalMessage::StreamPrepare(prepare(&mut r, "Stream Prepare")?),
                "Stream Prepare",
            ),
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "pgoutput message",
                    tag,
                })
            }
        };
        r.finish(what)?;
        Ok(msg)
    }
}

impl TruncatedMessage {
    /// Decodes what `head`, the first bytes of a pgoutput message `len` bytes long, says
    /// of it: its kind and relation, an Insert's leading columns that end inside `head`, a
    /// logical message's flags, LSN and prefix. Anything cut off is left out, never
    /// guessed; a message of another kind is an error, since PostgreSQL never sends one
    /// this long.
    pub fn decode(
        head: Bytes,
        len: usize,
        stream: StreamState,
    ) -> Result<TruncatedMessage, DecodeError> {
        if head.len() >= len {
            return Err(DecodeError::InvalidLength {
                what: "truncated pgoutput message (as long as the whole)",
                length: i64::try_from(len).unwrap_or(i64::MAX),
            });
        }
        let mut r = Reader::new(head);
        let kind = match r.get_u8("pgoutput message tag")? {
            tags::INSERT => {
                let xid = stream_xid(&mut r, stream, "Insert xid")?;
                let rel_id = r.get_u32("Insert rel_id")?;
                match r.get_u8("Insert tuple marker")? {
                    b'N' => {}
                    tag => {
                        return Err(DecodeError::UnknownTag {
                            what: "Insert tuple marker",
                            tag,
                        })
                    }
                }
                let column_count = r.get_count_i16("TupleData column count")?;
                let mut columns = Vec::new();
                while columns.len() < column_count {
                    // A value cut off by the end of `head` ends the leading columns.
                    let mut attempt = r.clone();
                    match tuple_value(&mut attempt) {
                        Ok(v) => {
                            columns.push(v);
                            r = attempt;
                        }
                        Err(DecodeError::Truncated { .. }) => break,
                        Err(e) => return Err(e),
                    }
                }
                Truncated::Insert {
                    xid,
                    rel_id,
                    column_count,
                    leading: TupleData { columns },
                }
            }
            tags::UPDATE => Truncated::Update {
                xid: stream_xid(&mut r, stream, "Update xid")?,
                rel_id: r.get_u32("Update rel_id")?,
            },
            tags::DELETE => Truncated::Delete {
                xid: stream_xid(&mut r, stream, "Delete xid")?,
                rel_id: r.get_u32("Delete rel_id")?,
            },
            tags::MESSAGE => {
                let xid = stream_xid(&mut r, stream, "Message xid")?;
                let flags = r.get_u8("Message flags")?;
                let lsn = r.get_lsn("Message lsn")?;
                let prefix = match r.get_cstr("Message prefix") {
                    Ok(p) => Some(p),
                    Err(DecodeError::UnterminatedString { .. }) => None,
                    Err(e) => return Err(e),
                };
                let content_len = match prefix {
                    Some(_) if r.remaining() >= 4 => {
                        Some(r.get_count_i32("Message content length")?)
                    }
                    _ => None,
                };
                Truncated::Message {
                    xid,
                    flags,
                    lsn,
                    prefix,
                    content_len,
                }
            }
            tag => {
                return Err(DecodeError::UnknownTag {
                    what: "pgoutput message too long to hold whole (only row changes and logical messages can be)",
                    tag,
                })
            }
        };
        Ok(TruncatedMessage { len, kind })
    }
}

/// Tracks Stream Start / Stream Stop so each message is decoded with the right
/// [`StreamState`]; feed it every pgoutput message of one replication connection, in order.
#[derive(Debug, Clone, Default)]
pub struct MessageDecoder {
    stream: StreamState,
}

impl MessageDecoder {
    /// A decoder outside any streamed block, as every replication connection starts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the next message is expected inside a Stream Start … Stream Stop block.
    pub fn stream_state(&self) -> StreamState {
        self.stream
    }

    /// Decodes one message and updates the stream state. A message that fails to decode
    /// leaves the state unchanged.
    pub fn decode(&mut self, data: Bytes) -> Result<LogicalMessage, DecodeError> {
        let msg = LogicalMessage::decode(data, self.stream)?;
        match msg {
            LogicalMessage::StreamStart(_) => self.stream = StreamState::InsideStream,
            LogicalMessage::StreamStop => self.stream = StreamState::Outside,
            _ => {}
        }
        Ok(msg)
    }

    /// Decodes the start of a message too long to hold whole (see
    /// [`TruncatedMessage::decode`]); such a message never changes the stream state.
    pub fn decode_truncated(
        &self,
        head: Bytes,
        len: usize,
    ) -> Result<TruncatedMessage, DecodeError> {
        TruncatedMessage::decode(head, len, self.stream)
    }
}

fn stream_xid(
    r: &mut Reader,
    stream: StreamState,
    what: &'static str,
) -> Result<Option<u32>, DecodeError> {
    match stream {
        StreamState::InsideStream => r.get_u32(what).map(Some),
        StreamState::Outside => Ok(None),
    }
}

fn begin(r: &mut Reader) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: r.get_lsn("Begin final_lsn")?,
        commit_time: r.get_timestamp("Begin commit_time")?,
        xid: r.get_u32("Begin xid")?,
    })
}

fn commit(r: &mut Reader) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: r.get_u8("Commit flags")?,
        commit_lsn: r.get_lsn("Commit commit_lsn")?,
        end_lsn: r.get_lsn("Commit end_lsn")?,
        commit_time: r.get_timestamp("Commit commit_time")?,
    })
}

fn origin(r: &mut Reader) -> Result<Origin, DecodeError> {
    Ok(Origin {
        origin_lsn: r.get_lsn("Origin origin_lsn")?,
        name: r.get_cstr("Origin name")?,
    })
}

fn replica_identity(r: &mut Reader) -> Result<ReplicaIdentity, DecodeError> {
    match r.get_u8("Relation replica identity")? {
        b'd' => Ok(ReplicaIdentity::Default),
        b'n' => Ok(ReplicaIdentity::Nothing),
        b'f' => Ok(ReplicaIdentity::Full),
        b'i' => Ok(ReplicaIdentity::Index),
        other => Err(DecodeError::InvalidValue {
            what: "Relation replica identity",
            value: i64::from(other),
        }),
    }
}

fn relation(r: &mut Reader, stream: StreamState) -> Result<Relation, DecodeError> {
    let xid = stream_xid(r, stream, "Relation xid")?;
    let rel_id = r.get_u32("Relation rel_id")?;
    let namespace = r.get_cstr("Relation namespace")?;
    let name = r.get_cstr("Relation name")?;
    let replica_identity = replica_identity(r)?;
    let count = r.get_count_i16("Relation column count")?;
    let mut columns = Vec::with_capacity(r.capacity_for(count, MIN_COLUMN_LEN));
    for _ in 0..count {
        columns.push(Column {
            flags: r.get_u8("Relation column flags")?,
            name: r.get_cstr("Relation column name")?,
            type_oid: r.get_u32("Relation column type OID")?,
            type_modifier: r.get_i32("Relation column type modifier")?,
        });
    }
    Ok(Relation {
        xid,
        rel_id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn type_info(r: &mut Reader, stream: StreamState) -> Result<TypeInfo, DecodeError> {
    Ok(TypeInfo {
        xid: stream_xid(r, stream, "Type xid")?,
        type_oid: r.get_u32("Type OID")?,
        namespace: r.get_cstr("Type namespace")?,
        name: r.get_cstr("Type name")?,
    })
}

fn tuple_data(r: &mut Reader) -> Result<TupleData, DecodeError> {
    let count = r.get_count_i16("TupleData column count")?;
    let mut columns = Vec::with_capacity(r.capacity_for(count, MIN_TUPLE_VALUE_LEN));
    for _ in 0..count {
        columns.push(tuple_value(r)?);
    }
    Ok(TupleData { columns })
}

fn tuple_value(r: &mut Reader) -> Result<TupleValue, DecodeError> {
    Ok(match r.get_u8("TupleData column kind")? {
        b'n' => TupleValue::Null,
        b'u' => TupleValue::UnchangedToast,
        b't' => {
            let len = r.get_count_i32("TupleData text length")?;
            TupleValue::Text(r.get_bytes(len, "TupleData text value")?)
        }
        b'b' => {
            let len = r.get_count_i32("TupleData binary length")?;
            TupleValue::Binary(r.get_bytes(len, "TupleData binary value")?)
        }
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "TupleData column kind",
                tag,
            })
        }
    })
}

fn insert(r: &mut Reader, stream: StreamState) -> Result<Insert, DecodeError> {
    let xid = stream_xid(r, stream, "Insert xid")?;
    let rel_id = r.get_u32("Insert rel_id")?;
    match r.get_u8("Insert tuple marker")? {
        b'N' => Ok(Insert {
            xid,
            rel_id,
            new_tuple: tuple_data(r)?,
        }),
        tag => Err(DecodeError::UnknownTag {
            what: "Insert tuple marker",
            tag,
        }),
    }
}

fn update(r: &mut Reader, stream: StreamState) -> Result<Update, DecodeError> {
    let xid = stream_xid(r, stream, "Update xid")?;
    let rel_id = r.get_u32("Update rel_id")?;
    let (old_tuple, marker) = match r.get_u8("Update tuple marker")? {
        b'K' => (
            Some(OldTuple::Key(tuple_data(r)?)),
            r.get_u8("Update tuple marker")?,
        ),
        b'O' => (
            Some(OldTuple::Full(tuple_data(r)?)),
            r.get_u8("Update tuple marker")?,
        ),
        other => (None, other),
    };
    if marker != b'N' {
        return Err(DecodeError::UnknownTag {
            what: "Update tuple marker",
            tag: marker,
        });
    }
    Ok(Update {
        xid,
        rel_id,
        old_tuple,
        new_tuple: tuple_data(r)?,
    })
}

fn delete(r: &mut Reader, stream: StreamState) -> Result<Delete, DecodeError> {
    let xid = stream_xid(r, stream, "Delete xid")?;
    let rel_id = r.get_u32("Delete rel_id")?;
    let old_tuple = match r.get_u8("Delete tuple marker")? {
        b'K' => OldTuple::Key(tuple_data(r)?),
        b'O' => OldTuple::Full(tuple_data(r)?),
        tag => {
            return Err(DecodeError::UnknownTag {
                what: "Delete tuple marker",
                tag,
            })
        }
    };
    Ok(Delete {
        xid,
        rel_id,
        old_tuple,
    })
}

fn truncate(r: &mut Reader, stream: StreamState) -> Result<Truncate, DecodeError> {
    let xid = stream_xid(r, stream, "Truncate xid")?;
    let count = r.get_count_i32("Truncate relation count")?;
    let options = r.get_u8("Truncate options")?;
    let mut rel_ids = Vec::with_capacity(r.capacity_for(count, REL_ID_LEN));
    for _ in 0..count {
        rel_ids.push(r.get_u32("Truncate rel_id")?);
    }
    Ok(Truncate {
        xid,
        options,
        rel_ids,
    })
}

fn message(r: &mut Reader, stream: StreamState) -> Result<Message, DecodeError> {
    let xid = stream_xid(r, stream, "Message xid")?;
    let flags = r.get_u8("Message flags")?;
    let lsn = r.get_lsn("Message lsn")?;
    let prefix = r.get_cstr("Message prefix")?;
    let len = r.get_count_i32("Message content length")?;
    Ok(Message {
        xid,
        flags,
        lsn,
        prefix,
        content: r.get_bytes(len, "Message content")?,
    })
}

fn stream_start(r: &mut Reader) -> Result<StreamStart, DecodeError> {
    Ok(StreamStart {
        xid: r.get_u32("Stream Start xid")?,
        first_segment: r.get_bool("Stream Start first_segment")?,
    })
}

fn stream_commit(r: &mut Reader) -> Result<StreamCommit, DecodeError> {
    Ok(StreamCommit {
        xid: r.get_u32("Stream Commit xid")?,
        flags: r.get_u8("Stream Commit flags")?,
        commit_lsn: r.get_lsn("Stream Commit commit_lsn")?,
        end_lsn: r.get_lsn("Stream Commit end_lsn")?,
        commit_time: r.get_timestamp("Stream Commit commit_time")?,
    })
}

fn stream_abort(r: &mut Reader) -> Result<StreamAbort, DecodeError> {
    let xid = r.get_u32("Stream Abort xid")?;
    let subxid = r.get_u32("Stream Abort subxid")?;
    // The tail exists only for protocol 4 with streaming = parallel, and nothing in the
    // message says which was negotiated, so its presence is judged by length alone.
    let abort = if r.remaining() == 0 {
        None
    } else {
        if r.remaining() < STREAM_ABORT_TAIL_LEN {
            return Err(DecodeError::Truncated {
                what: "Stream Abort abort_lsn/abort_time",
                needed: STREAM_ABORT_TAIL_LEN,
                available: r.remaining(),
            });
        }
        Some((
            r.get_lsn("Stream Abort abort_lsn")?,
            r.get_timestamp("Stream Abort abort_time")?,
        ))
    };
    Ok(StreamAbort { xid, subxid, abort })
}

fn begin_prepare(r: &mut Reader) -> Result<BeginPrepare, DecodeError> {
    Ok(BeginPrepare {
        prepare_lsn: r.get_lsn("Begin Prepare prepare_lsn")?,
        end_lsn: r.get_lsn("Begin Prepare end_lsn")?,
        prepare_time: r.get_timestamp("Begin Prepare prepare_time")?,
        xid: r.get_u32("Begin Prepare xid")?,
        gid: r.get_cstr("Begin Prepare gid")?,
    })
}

fn prepare(r: &mut Reader, what: &'static str) -> Result<Prepare, DecodeError> {
    Ok(Prepare {
        flags: r.get_u8(what)?,
        prepare_lsn: r.get_lsn(what)?,
        end_lsn: r.get_lsn(what)?,
        prepare_time: r.get_timestamp(what)?,
        xid: r.get_u32(what)?,
        gid: r.get_cstr(what)?,
    })
}

fn commit_prepared(r: &mut Reader) -> Result<CommitPrepared, DecodeError> {
    Ok(CommitPrepared {
        flags: r.get_u8("Commit Prepared flags")?,
        commit_lsn: r.get_lsn("Commit Prepared commit_lsn")?,
        end_lsn: r.get_lsn("Commit Prepared end_lsn")?,
        commit_time: r.get_timestamp("Commit Prepared commit_time")?,
        xid: r.get_u32("Commit Prepared xid")?,
        gid: r.get_cstr("Commit Prepared gid")?,
    })
}

fn rollback_prepared(r: &mut Reader) -> Result<RollbackPrepared, DecodeError> {
    Ok(RollbackPrepared {
        flags: r.get_u8("Rollback Prepared flags")?,
        prepare_end_lsn: r.get_lsn("Rollback Prepared prepare_end_lsn")?,
        rollback_end_lsn: r.get_lsn("Rollback Prepared rollback_end_lsn")?,
        prepare_time: r.get_timestamp("Rollback Prepared prepare_time")?,
        rollback_time: r.get_timestamp("Rollback Prepared rollback_time")?,
        xid: r.get_u32("Rollback Prepared xid")?,
        gid: r.get_cstr("Rollback Prepared gid")?,
    })
}
