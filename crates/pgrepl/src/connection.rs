//! The replication-mode connection: startup, and message I/O before streaming starts.

use std::collections::HashMap;
use std::io;

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::authenticate;
use crate::config::ConnectConfig;
use crate::error::{ReplError, ServerError};
use crate::socket::{open, BoxStream};
use crate::wire::{self, Backend};

/// Buffered message I/O over the transport.
pub(crate) struct Conn {
    pub stream: BoxStream,
    pub rbuf: BytesMut,
    wbuf: BytesMut,
}

impl Conn {
    /// Next raw message. Cancel-safe: partial input stays in `rbuf`.
    pub async fn recv_raw(&mut self, context: &'static str) -> Result<(u8, Bytes), ReplError> {
        loop {
            if let Some(msg) = wire::split_message(&mut self.rbuf)? {
                return Ok(msg);
            }
            self.rbuf.reserve(8 * 1024);
            let n = self
                .stream
                .read_buf(&mut self.rbuf)
                .await
                .map_err(ReplError::io(context))?;
            if n == 0 {
                return Err(ReplError::Closed(context));
            }
        }
    }

    pub async fn recv(&mut self, context: &'static str) -> Result<Backend, ReplError> {
        let (tag, body) = self.recv_raw(context).await?;
        wire::decode(tag, body)
    }

    /// Encodes with a `postgres_protocol` builder and writes it out.
    pub async fn send(
        &mut self,
        context: &'static str,
        build: impl FnOnce(&mut BytesMut) -> io::Result<()>,
    ) -> Result<(), ReplError> {
        self.wbuf.clear();
        build(&mut self.wbuf)
            .map_err(|e| ReplError::Protocol(format!("encoding a message while {context}: {e}")))?;
        self.stream
            .write_all(&self.wbuf)
            .await
            .map_err(ReplError::io(context))?;
        self.stream.flush().await.map_err(ReplError::io(context))
    }
}

/// A connection in logical walsender mode (`replication=database`), ready for
/// replication commands. Turn it into a stream with
/// [`ReplicationConnection::start_replication`].
pub struct ReplicationConnection {
    pub(crate) conn: Conn,
    pub(crate) user: String,
    pub(crate) parameters: HashMap<String, String>,
    pub(crate) version_num: Option<u32>,
    auth_method: &'static str,
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("user", &self.user)
            .field("server_version", &self.parameters.get("server_version"))
            .finish_non_exhaustive()
    }
}

impl ReplicationConnection {
    /// Connects, negotiates TLS, authenticates and waits for ReadyForQuery, all within
    /// `cfg.connect_timeout` per host; with several hosts, to the first that matches
    /// `cfg.target_session_attrs` (judged from the `in_hot_standby` and
    /// `default_transaction_read_only` the server reports at startup, PostgreSQL 14+).
    pub async fn connect(cfg: &ConnectConfig) -> Result<Self, ReplError> {
        Self::connect_target(cfg).await.map(|(_, conn)| conn)
    }

    /// [`ReplicationConnection::connect`], and the single-host config it settled on.
    pub async fn connect_target(cfg: &ConnectConfig) -> Result<(ConnectConfig, Self), ReplError> {
        cfg.connect_each(|one| async move {
            let conn = tokio::time::timeout(one.connect_timeout, Self::connect_inner(&one))
                .await
                .map_err(|_| ReplError::Timeout("connecting to the server"))
                .and_then(|r| r)
                .map_err(|e| one.connect_error(e))?;
            let in_recovery = conn.parameter("in_hot_standby") == Some("on");
            let state = crate::config::ServerState {
                in_recovery,
                read_only: in_recovery
                    || conn.parameter("default_transaction_read_only") == Some("on"),
            };
            Ok((conn, state))
        })
        .await
    }

    async fn connect_inner(cfg: &ConnectConfig) -> Result<Self, ReplError> {
        let transport = open(cfg).await?;
        let mut conn = Conn {
            stream: transport.stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(1024),
        };
        let params = [
            ("user", cfg.user.as_str()),
            ("database", cfg.dbname.as_str()),
            ("replication", "database"),
            ("application_name", cfg.application_name.as_str()),
            ("client_encoding", "UTF8"),
            ("options", crate::config::PINNED_SEARCH_PATH),
        ];
        conn.send("sending the startup message", |buf| {
            frontend::startup_message(params.iter().copied(), buf)
        })
        .await?;
        let method = authenticate(&mut conn, cfg, transport.cert_hash.as_deref()).await?;
        let mut parameters = HashMap::new();
        loop {
            match conn
                .recv("waiting for ReadyForQuery after authentication")
                .await?
            {
                Backend::ParameterStatus { name, value } => {
                    parameters.insert(name, value);
                }
                Backend::KeyData => {}
                Backend::Notice(n) => tracing::info!(notice = %n, "server notice during startup"),
                Backend::ReadyForQuery => break,
                Backend::Error(e) => return Err(startup_error(&cfg.user, method, e)),
                other => {
                    return Err(ReplError::Protocol(format!(
                        "unexpected message during startup: {}",
                        other.describe()
                    )))
                }
            }
        }
        let version_num = parameters
            .get("server_version")
            .and_then(|v| parse_server_version(v));
        tracing::debug!(user = %cfg.user, method, version = ?version_num, "replication connection ready");
        Ok(ReplicationConnection {
            conn,
            user: cfg.user.clone(),
            parameters,
            version_num,
            auth_method: method,
        })
    }

    /// A `ParameterStatus` value reported by the server at startup (e.g. `server_version`).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// How the server authenticated us: "trust", "password", "md5", "SCRAM-SHA-256" or
    /// "SCRAM-SHA-256-PLUS" (channel-bound to the TLS certificate).
    pub fn auth_method(&self) -> &'static str {
        self.auth_method
    }

    /// The user this connection authenticated as.
    pub fn user(&self) -> &str {
        &self.user
    }
}

/// Errors in SQLSTATE class 28 are authentication/authorization failures and carry the
/// user and method so the operator sees which credential was refused.
pub(crate) fn startup_error(user: &str, method: &'static str, e: ServerError) -> ReplError {
    if e.code.starts_with("28") {
        ReplError::Auth {
            user: user.to_owned(),
            method,
            server: Box::new(e),
        }
    } else {
        ReplError::Server(Box::new(e))
    }
}

/// `server_version` like "15.18 (Debian 15.18-0+deb12u1)" or "9.6.24" → 150018 / 90624.
pub(crate) fn parse_server_version(v: &str) -> Option<u32> {
    let numeric: String = v
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = numeric
        .split('.')
        .filter(|p| !p.is_empty())
        .map(str::parse::<u32>);
    let major = parts.next()?.ok()?;
    let second = parts.next().transpose().ok()?.unwrap_or(0);
    if major >= 10 {
        Some(major * 10_000 + second)
    } else {
        let third = parts.next().transpose().ok()?.unwrap_or(0);
        Some(major * 10_000 + second * 100 + third)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_server_version;

    #[test]
    fn server_versions() {
        assert_eq!(
            parse_server_version("15.18 (Debian 15.18-0+deb12u1)"),
            Some(150018)
        );
        assert_eq!(parse_server_version("17devel"), Some(170000));
        assert_eq!(parse_server_version("9.6.24"), Some(90624));
        assert_eq!(parse_server_version("x"), None);
    }
}
