//! Sans-IO codec for PostgreSQL logical replication with the `pgoutput` plugin.
//!
//! Two layers, both over [`bytes::Bytes`] so payloads are never copied:
//! - [`frame`]: the CopyData frames of the streaming-replication sub-protocol
//!   (XLogData `w`, primary keepalive `k`, standby status update `r`).
//! - [`message`]: the pgoutput messages carried inside XLogData, protocol versions 1–4;
//!   [`MessageDecoder`] tracks Stream Start/Stop so streamed messages get their xid prefix.
//!
//! Every type also encodes, byte-for-byte as PostgreSQL would, so test doubles of a server
//! can be written against the same types; encodings are canonical (anything the decoders
//! accept re-encodes to the same bytes).
//!
//! Every length read off the wire is checked against the bytes that remain, trailing
//! bytes are an error and unknown tags are an error: a decoder that guesses would let a
//! relay acknowledge WAL it never understood.

mod class;
pub mod error;
pub mod frame;
pub mod lsn;
pub mod message;
mod reader;
pub mod time;
mod writer;

pub use class::ErrorClass;
pub use error::DecodeError;
pub use frame::{Keepalive, ReplicationFrame, StandbyStatusUpdate, XLogData};
pub use lsn::Lsn;
pub use message::*;
pub use time::PgTimestamp;
