//! CopyData frames of the streaming-replication sub-protocol.
//!
//! Decoding/encoding is implemented below the type definitions.

use bytes::Bytes;

use crate::{Lsn, PgTimestamp};

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
