//! CopyData frames of the streaming-replication sub-protocol.
//!
//! Decoding/encoding is implemented below the type definitions. All integers are
//! big-endian; see `docs/replication-protocol.md` §2 for how the server fills them.

use bytes::{BufMut, Bytes, BytesMut};

use crate::reader::Reader;
use crate::{DecodeError, Lsn, PgTimestamp};

/// A server→client CopyData payload during START_REPLICATION.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationFrame {
    XLogData(XLogData),
    Keepalive(Keepalive),
}

/// `w`: one pgoutput message plus the walsender's positions.
///
/// `wal_start`/`wal_end` are NOT safe to acknowledge: Relation/Type messages carry 0 and
/// change LSNs are not monotonic across transactions. Acknowledge Commit.end_lsn only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    pub wal_start: Lsn,
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    /// Exactly one pgoutput message; decode it with [`crate::LogicalMessage::decode`].
    pub data: Bytes,
}

/// `k`: primary keepalive. `wal_end` is the walsender's decode position (sentPtr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    pub reply_requested: bool,
}

/// `r`: standby status update, client→server. For a logical slot only `flush` matters:
/// it becomes `confirmed_flush_lsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
    pub client_time: PgTimestamp,
    pub reply_requested: bool,
}

const XLOG_DATA_TAG: u8 = b'w';
const KEEPALIVE_TAG: u8 = b'k';
const STATUS_UPDATE_TAG: u8 = b'r';
const XLOG_DATA_HEADER_LEN: usize = 1 + 8 + 8 + 8;
const KEEPALIVE_LEN: usize = 1 + 8 + 8 + 1;

impl ReplicationFrame {
    /// Decodes one CopyData payload, starting at its tag byte.
    ///
    /// XLogData's `data` shares `data`'s allocation; nothing is copied.
    pub fn decode(data: Bytes) -> Result<ReplicationFrame, DecodeError> {
        let mut r = Reader::new(data);
        match r.get_u8("replication frame tag")? {
            XLOG_DATA_TAG => {
                let wal_start = r.get_lsn("XLogData")?;
                let wal_end = r.get_lsn("XLogData")?;
                let send_time = r.get_timestamp("XLogData")?;
                Ok(ReplicationFrame::XLogData(XLogData {
                    wal_start,
                    wal_end,
                    send_time,
                    data: r.take_rest(),
                }))
            }
            KEEPALIVE_TAG => {
                let wal_end = r.get_lsn("Keepalive")?;
                let send_time = r.get_timestamp("Keepalive")?;
                let reply_requested = r.get_bool("Keepalive reply_requested")?;
                r.finish("Keepalive")?;
                Ok(ReplicationFrame::Keepalive(Keepalive {
                    wal_end,
                    send_time,
                    reply_requested,
                }))
            }
            tag => Err(DecodeError::UnknownTag {
                what: "replication frame",
                tag,
            }),
        }
    }

    /// Appends the CopyData payload (tag byte first) to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            ReplicationFrame::XLogData(x) => {
                buf.reserve(XLOG_DATA_HEADER_LEN + x.data.len());
                buf.put_u8(XLOG_DATA_TAG);
                buf.put_u64(x.wal_start.0);
                buf.put_u64(x.wal_end.0);
                buf.put_i64(x.send_time.0);
                buf.put_slice(&x.data);
            }
            ReplicationFrame::Keepalive(k) => {
                buf.reserve(KEEPALIVE_LEN);
                buf.put_u8(KEEPALIVE_TAG);
                buf.put_u64(k.wal_end.0);
                buf.put_i64(k.send_time.0);
                buf.put_u8(u8::from(k.reply_requested));
            }
        }
    }
}

impl StandbyStatusUpdate {
    /// Length of the encoded payload: tag, four Int64s and the reply flag.
    pub const ENCODED_LEN: usize = 1 + 4 * 8 + 1;

    /// Appends the CopyData payload (tag byte `r` first) to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.reserve(Self::ENCODED_LEN);
        buf.put_u8(STATUS_UPDATE_TAG);
        buf.put_u64(self.write.0);
        buf.put_u64(self.flush.0);
        buf.put_u64(self.apply.0);
        buf.put_i64(self.client_time.0);
        buf.put_u8(u8::from(self.reply_requested));
    }

    /// The CopyData payload as its own buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::with_capacity(Self::ENCODED_LEN);
        self.encode(&mut buf);
        buf.freeze()
    }

    /// Decodes a status update; the server never sends one, but test doubles of the
    /// server need to read what the client wrote.
    pub fn decode(data: Bytes) -> Result<Self, DecodeError> {
        let mut r = Reader::new(data);
        let tag = r.get_u8("standby status update tag")?;
        if tag != STATUS_UPDATE_TAG {
            return Err(DecodeError::UnknownTag {
                what: "standby status update",
                tag,
            });
        }
        let update = StandbyStatusUpdate {
            write: r.get_lsn("StandbyStatusUpdate")?,
            flush: r.get_lsn("StandbyStatusUpdate")?,
            apply: r.get_lsn("StandbyStatusUpdate")?,
            client_time: r.get_timestamp("StandbyStatusUpdate")?,
            reply_requested: r.get_bool("StandbyStatusUpdate reply_requested")?,
        };
        r.finish("StandbyStatusUpdate")?;
        Ok(update)
    }
}
