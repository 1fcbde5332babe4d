//! PostgreSQL logical replication client on tokio.
//!
//! - [`ReplicationConnection`]: a `replication=database` connection (TLS per libpq ssl
//!   modes, trust / cleartext / md5 / SCRAM-SHA-256(-PLUS) auth) accepting replication
//!   commands: IDENTIFY_SYSTEM, SHOW, CREATE_REPLICATION_SLOT.
//! - [`ReplicationStream`]: the CopyBoth stream after START_REPLICATION. Reading and
//!   writing are split: a background task sends standby status updates on a timer, on
//!   reply requests and on flush advances, and never waits for the consumer, so a consumer
//!   held up by back-pressure does not get the walsender to time out.
//! - [`FlushHandle`]: the caller's durable position, monotonic by construction.
//! - [`preflight`]: checks over an ordinary SQL connection ([`ConnectConfig::connect_sql`]).
//!
//! Upstream tokio-postgres has no replication mode, hence this hand-rolled connection over
//! `postgres-protocol`'s frontend builders and our own backend framing (`wire`).

mod auth;
mod config;
mod connection;
mod error;
mod options;
mod pg_tls;
mod pgpass;
pub mod preflight;
mod query;
mod socket;
mod sql_connect;
mod status_writer;
mod stream;
mod tls;
mod wire;

pub use config::{
    AuthMethod, ChannelBinding, ConnectConfig, ParseChannelBindingError, ParseRequireAuthError,
    ParseSslModeError, ParseTargetSessionAttrsError, Password, RequireAuth, ServerState, SslMode,
    TargetSessionAttrs,
};
pub use connection::ReplicationConnection;
pub use error::{
    chain as error_chain, class_of_sql, class_of_sqlstate, ErrorClass, ReplError, ServerError,
};
pub use options::StartOptions;
pub use preflight::SlotState;
pub use query::{quote_literal, SlotCreated, SystemInfo, FAILOVER_SLOTS_VERSION};
pub use status_writer::FlushHandle;
pub use stream::{ReplicationEvent, ReplicationStream, StreamFailure, HEAD_LEN};

pub use pgoutput::{LogicalMessage, Lsn};
