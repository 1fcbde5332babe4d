//! Authentication exchange: trust, cleartext, MD5 and SCRAM-SHA-256(-PLUS).

use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::frontend;

use crate::config::ConnectConfig;
use crate::connection::{startup_error, Conn};
use crate::error::ReplError;
use crate::wire::{AuthRequest, Backend};

/// Runs the exchange until AuthenticationOk; returns the method used (for error reports).
pub(crate) async fn authenticate(
    conn: &mut Conn,
    cfg: &ConnectConfig,
    cert_hash: Option<&[u8]>,
) -> Result<&'static str, ReplError> {
    let mut method = "trust";
    let mut scram: Option<ScramSha256> = None;
    loop {
        let request = match conn.recv("authenticating").await? {
            Backend::Auth(request) => request,
            Backend::Error(e) => return Err(startup_error(&cfg.user, method, e)),
            Backend::Notice(n) => {
                tracing::info!(notice = %n, "server notice during authentication");
                continue;
            }
            other => {
                return Err(ReplError::Protocol(format!(
                    "unexpected message during authentication: {}",
                    other.describe()
                )))
            }
        };
        match request {
            AuthRequest::Ok => return Ok(method),
            AuthRequest::Cleartext => {
                method = "password";
                let pw = password(cfg, method)?;
                conn.send("sending the password", |buf| {
                    frontend::password_message(pw.as_bytes(), buf)
                })
                .await?;
            }
            AuthRequest::Md5 { salt } => {
                method = "md5";
                let pw = password(cfg, method)?;
                let hashed = md5_hash(cfg.user.as_bytes(), pw.as_bytes(), salt);
                conn.send("sending the md5 password", |buf| {
                    frontend::password_message(hashed.as_bytes(), buf)
                })
                .await?;
            }
            AuthRequest::Sasl { mechanisms } => {
                let has_plus = mechanisms.iter().any(|m| m == SCRAM_SHA_256_PLUS);
                let has_scram = mechanisms.iter().any(|m| m == SCRAM_SHA_256);
                // Same selection as tokio-postgres: bind to the certificate when both sides can;
                // with TLS but no -PLUS offered say "y" so a stripped -PLUS is detectable.
                let (binding, mechanism) = match (has_plus, has_scram, cert_hash) {
                    (true, _, Some(hash)) => (
                        ChannelBinding::tls_server_end_point(hash.to_vec()),
                        SCRAM_SHA_256_PLUS,
                    ),
                    (true, _, None) => (ChannelBinding::unsupported(), SCRAM_SHA_256),
                    (false, true, Some(_)) => (ChannelBinding::unrequested(), SCRAM_SHA_256),
                    (false, true, None) => (ChannelBinding::unsupported(), SCRAM_SHA_256),
                    (false, false, _) => {
                        return Err(ReplError::AuthClient {
                            user: cfg.user.clone(),
                            method: "SASL",
                            reason: format!("no supported SASL mechanism among {mechanisms:?}"),
                        })
                    }
                };
                method = if mechanism == SCRAM_SHA_256_PLUS {
                    "SCRAM-SHA-256-PLUS"
                } else {
                    "SCRAM-SHA-256"
                };
                let pw = password(cfg, method)?;
                let state = ScramSha256::new(pw.as_bytes(), binding);
                conn.send("sending the SASL initial response", |buf| {
                    frontend::sasl_initial_response(mechanism, state.message(), buf)
                })
                .await?;
                scram = Some(state);
            }
            AuthRequest::SaslContinue(data) => {
                let state = scram.as_mut().ok_or_else(|| out_of_order(cfg, method))?;
                state
                    .update(&data)
                    .map_err(|e| scram_failed(cfg, method, &e))?;
                conn.send("sending the SASL response", |buf| {
                    frontend::sasl_response(state.message(), buf)
                })
                .await?;
            }
            AuthRequest::SaslFinal(data) => {
                let state = scram.as_mut().ok_or_else(|| out_of_order(cfg, method))?;
                // Verifies the server signature: a server that does not know the password
                // (or a man in the middle) is refused here.
                state
                    .finish(&data)
                    .map_err(|e| scram_failed(cfg, method, &e))?;
            }
            AuthRequest::Other(code) => {
                return Err(ReplError::AuthClient {
                    user: cfg.user.clone(),
                    method: "unsupported",
                    reason: format!("server requested unsupported authentication method {code}"),
                })
            }
        }
    }
}

fn password(cfg: &ConnectConfig, method: &'static str) -> Result<String, ReplError> {
    cfg.effective_password()
        .map(|p| p.expose().to_owned())
        .ok_or_else(|| ReplError::AuthClient {
            user: cfg.user.clone(),
            method,
            reason: "the server requires a password but none is configured".into(),
        })
}

fn out_of_order(cfg: &ConnectConfig, method: &'static str) -> ReplError {
    ReplError::AuthClient {
        user: cfg.user.clone(),
        method,
        reason: "SASL message before the SASL exchange started".into(),
    }
}

fn scram_failed(cfg: &ConnectConfig, method: &'static str, e: &std::io::Error) -> ReplError {
    ReplError::AuthClient {
        user: cfg.user.clone(),
        method,
        reason: format!("SCRAM exchange failed: {e}"),
    }
}
