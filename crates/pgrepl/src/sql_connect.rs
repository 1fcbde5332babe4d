//! Opening connections with a [`ConnectConfig`]: each host in turn as libpq does, the
//! ordinary SQL connection over outboxd's own transport, and cancel requests. The types
//! themselves (config.rs) do not connect.

use std::sync::{Arc, Mutex};

use crate::config::{ConnectConfig, ServerState, TargetSessionAttrs};
use crate::error::{ReplError, ServerError};
use crate::pg_tls::{AuthGuard, Negotiated};

impl ConnectConfig {
    /// Tries each host in turn (libpq's order), keeping the first that accepts a
    /// connection and matches `target_session_attrs`: the chosen single-host config and
    /// what `connect_one` made of it. Failures name every host tried; with one host, its
    /// own error is returned as is.
    pub async fn connect_each<T, F, Fut>(
        &self,
        mut connect_one: F,
    ) -> Result<(ConnectConfig, T), ReplError>
    where
        F: FnMut(ConnectConfig) -> Fut,
        Fut: std::future::Future<Output = Result<(T, ServerState), ReplError>>,
    {
        let candidates = self.candidates();
        let wanted = self.target_session_attrs;
        let mut tried: Vec<ReplError> = Vec::new();
        // prefer-standby settles on the first server that answered when none is a standby.
        let mut fallback: Option<(ConnectConfig, T)> = None;
        for candidate in &candidates {
            match connect_one(candidate.clone()).await {
                Ok((value, state)) if wanted.accepts(state) => {
                    return Ok((candidate.clone(), value));
                }
                Ok((value, state)) => {
                    if wanted == TargetSessionAttrs::PreferStandby && fallback.is_none() {
                        fallback = Some((candidate.clone(), value));
                    }
                    tried.push(ReplError::WrongSession {
                        target: candidate.target(),
                        wanted,
                        found: state.describe(),
                    });
                }
                Err(e) => tried.push(e),
            }
        }
        if let Some(found) = fallback {
            return Ok(found);
        }
        if candidates.len() == 1 {
            if let Some(e) = tried.pop() {
                return Err(e);
            }
        }
        Err(ReplError::NoHost { wanted, tried })
    }

    /// An SQL connection to the first host that matches `target_session_attrs`.
    pub async fn connect_sql_target(
        &self,
    ) -> Result<(ConnectConfig, tokio_postgres::Client), ReplError> {
        let check = self.target_session_attrs != TargetSessionAttrs::Any;
        self.connect_each(|one| async move {
            let client = one.connect_sql().await?;
            let state = if check {
                sql_server_state(&client)
                    .await
                    .map_err(|e| one.connect_error(e))?
            } else {
                ServerState {
                    in_recovery: false,
                    read_only: false,
                }
            };
            Ok((client, state))
        })
        .await
    }

    /// Opens an ordinary SQL connection and spawns its connection task, within
    /// `connect_timeout`.
    pub async fn connect_sql(&self) -> Result<tokio_postgres::Client, ReplError> {
        tokio::time::timeout(self.connect_timeout, self.connect_sql_inner())
            .await
            .map_err(|_| ReplError::Timeout("connecting to the server"))
            .and_then(|r| r)
            .map_err(|e| self.connect_error(e))
    }

    async fn connect_sql_inner(&self) -> Result<tokio_postgres::Client, ReplError> {
        let transport = crate::socket::open(self).await?;
        let refused = Arc::new(Mutex::new(None));
        let guard = AuthGuard::new(
            transport.stream,
            self,
            transport.cert_hash.is_some(),
            Arc::clone(&refused),
        );
        let cfg = self.tokio_postgres_config(transport.encrypted);
        let tls = Negotiated {
            cert_hash: transport.cert_hash,
        };
        match cfg.connect_raw(guard, tls).await {
            Ok((client, conn)) => {
                spawn_connection(conn);
                Ok(client)
            }
            Err(e) => Err(refused
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
                .unwrap_or_else(|| self.sql_connect_error(e))),
        }
    }

    /// Asks the server to cancel what `token`'s connection runs now, over a connection of
    /// its own (libpq's `PQcancel`): what a connection busy waiting cannot send itself.
    pub async fn cancel(&self, token: &tokio_postgres::CancelToken) -> Result<(), ReplError> {
        let send = async {
            let transport = crate::socket::open(self).await?;
            let guard = AuthGuard::new(
                transport.stream,
                self,
                transport.cert_hash.is_some(),
                Arc::new(Mutex::new(None)),
            );
            let tls = Negotiated {
                cert_hash: transport.cert_hash,
            };
            token
                .cancel_query_raw(guard, tls)
                .await
                .map_err(ReplError::Sql)
        };
        tokio::time::timeout(self.connect_timeout, send)
            .await
            .map_err(|_| ReplError::Timeout("sending a cancel request"))?
    }

    /// tokio-postgres's startup errors in the replication connection's terms, so both
    /// connections classify a failure alike: a refused credential, a missing password and
    /// a broken authentication sequence are permanent. (TLS and network failures come
    /// from the shared transport, already in those terms.)
    fn sql_connect_error(&self, e: tokio_postgres::Error) -> ReplError {
        if let Some(db) = e.as_db_error() {
            let server = ServerError {
                severity: db.severity().to_owned(),
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
                detail: db.detail().map(str::to_owned),
                hint: db.hint().map(str::to_owned),
            };
            return crate::connection::startup_error(&self.user, "SQL connection", server);
        }
        // tokio-postgres reads the startup as a fixed sequence and has no error kind to
        // match; during connect this message means the server broke it, e.g. with
        // AuthenticationOk before SCRAM was complete.
        if e.to_string() == "unexpected message from server" {
            return ReplError::AuthRefused {
                user: self.user.clone(),
                method: "SQL connection",
                reason: "the server broke the startup sequence (for instance AuthenticationOk before completing SCRAM): it has not proven that it knows the password, so it may be an impostor; the connection is refused".into(),
            };
        }
        let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        while let Some(cause) = next {
            // tokio-postgres has no error kind to match; this is its only message for it.
            if cause.to_string() == "password missing" {
                return ReplError::AuthClient {
                    user: self.user.clone(),
                    method: "password",
                    reason: "the server requires a password but none is configured".into(),
                };
            }
            next = cause.source();
        }
        ReplError::Sql(e)
    }
}

/// Recovery state and `transaction_read_only`, as libpq asks for them.
async fn sql_server_state(client: &tokio_postgres::Client) -> Result<ServerState, ReplError> {
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_is_in_recovery(), \
                    pg_catalog.current_setting('transaction_read_only') = 'on'",
            &[],
        )
        .await?;
    Ok(ServerState {
        in_recovery: row.try_get(0)?,
        read_only: row.try_get(1)?,
    })
}

fn spawn_connection<S, T>(conn: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::warn!(error = %e, "SQL connection ended with an error");
        }
    });
}
