//! Authentication exchange: trust, cleartext, MD5 and SCRAM-SHA-256(-PLUS), judged by
//! `require_auth` and `channel_binding` as libpq 16+ judges them.
//!
//! The exchange is a fixed sequence per method. Once a method has started, the server
//! may only continue it: AuthenticationOk before a SCRAM exchange is complete (the server
//! never proved it knows the password, nothing was bound to the channel) and a request
//! for another method (a cleartext password halfway through SCRAM) are refused.

use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{
    ChannelBinding as ScramBinding, ScramSha256, SCRAM_SHA_256, SCRAM_SHA_256_PLUS,
};
use postgres_protocol::message::frontend;

use crate::config::{AuthMethod, ChannelBinding, ConnectConfig};
use crate::connection::{startup_error, Conn};
use crate::error::ReplError;
use crate::wire::{AuthRequest, Backend};

/// Where the exchange stands; each state admits exactly one kind of next request.
enum Phase {
    /// Nothing asked yet.
    Start,
    /// A cleartext or md5 password went out: only AuthenticationOk may follow.
    PasswordSent(&'static str),
    /// SASLInitialResponse went out: SASLContinue must follow.
    SaslStarted(&'static str, ScramSha256),
    /// The client-final message went out: SASLFinal with the server's signature must follow.
    SaslContinued(&'static str, ScramSha256),
    /// The server's signature verified: only AuthenticationOk may follow.
    SaslVerified(&'static str),
}

impl Phase {
    fn method(&self) -> &'static str {
        match self {
            Phase::Start => "trust",
            Phase::PasswordSent(m)
            | Phase::SaslStarted(m, _)
            | Phase::SaslContinued(m, _)
            | Phase::SaslVerified(m) => m,
        }
    }

    fn expected(&self) -> &'static str {
        match self {
            Phase::Start => "an authentication request",
            Phase::PasswordSent(_) | Phase::SaslVerified(_) => "AuthenticationOk",
            Phase::SaslStarted(..) => "SASLContinue",
            Phase::SaslContinued(..) => "SASLFinal with the server's signature",
        }
    }
}

/// What a server's first authentication request is, for [`judge_first`].
pub(crate) enum FirstRequest<'a> {
    Ok,
    Cleartext,
    Md5,
    Sasl(&'a [String]),
    Other,
}

impl FirstRequest<'_> {
    fn method(&self) -> Option<AuthMethod> {
        match self {
            FirstRequest::Ok => Some(AuthMethod::None),
            FirstRequest::Cleartext => Some(AuthMethod::Password),
            FirstRequest::Md5 => Some(AuthMethod::Md5),
            FirstRequest::Sasl(_) => Some(AuthMethod::ScramSha256),
            FirstRequest::Other => None,
        }
    }
}

/// `require_auth` and `channel_binding=require` on the server's first request, before
/// anything (a password above all) is sent. Both connections call it: the replication one
/// from [`authenticate`], the SQL one from its stream guard.
pub(crate) fn judge_first(
    cfg: &ConnectConfig,
    request: &FirstRequest<'_>,
    bindable: bool,
) -> Result<(), ReplError> {
    let refuse = |method: &'static str, reason: String| ReplError::AuthRefused {
        user: cfg.user.clone(),
        method,
        reason,
    };
    let Some(method) = request.method() else {
        return Ok(());
    };
    if !cfg.require_auth.allows(method) {
        let asked = match method {
            AuthMethod::None => {
                "the server did not ask for any authentication (trust or a client certificate alone)".to_owned()
            }
            other => format!("the server asked for {} authentication", other.as_str()),
        };
        return Err(refuse(
            method.as_str_static(),
            format!(
                "{asked}, which require_auth={} (PGREQUIREAUTH) does not allow; allow it there or change the server's pg_hba.conf",
                cfg.require_auth.as_str()
            ),
        ));
    }
    if cfg.channel_binding != ChannelBinding::Require {
        return Ok(());
    }
    let why = match request {
        FirstRequest::Sasl(mechanisms) if !mechanisms.iter().any(|m| m == SCRAM_SHA_256_PLUS) => {
            format!("the server did not offer SCRAM-SHA-256-PLUS (it offered {mechanisms:?}); connect over TLS to a server with scram-sha-256 in pg_hba.conf")
        }
        FirstRequest::Sasl(_) if !bindable => {
            "there is no TLS channel to bind to, or its certificate's signature algorithm defines no channel-binding hash (PostgreSQL defines none for RSA-PSS and Ed25519); use sslmode=require or stronger with an RSA or ECDSA certificate".to_owned()
        }
        FirstRequest::Sasl(_) => return Ok(()),
        FirstRequest::Ok => {
            "the server authenticated without SCRAM (trust or a client certificate alone), so nothing binds the connection to this TLS channel".to_owned()
        }
        _ => format!(
            "the server asked for {} authentication, which cannot be channel-bound",
            method.as_str()
        ),
    };
    Err(refuse(
        method.as_str_static(),
        format!("channel_binding=require (PGCHANNELBINDING), but {why}"),
    ))
}

impl AuthMethod {
    fn as_str_static(self) -> &'static str {
        match self {
            AuthMethod::None => "trust",
            other => other.as_str(),
        }
    }
}

/// Runs the exchange until AuthenticationOk; returns the method used (for error reports).
/// `cert_hash` is the `tls-server-end-point` hash, `Some` only when the connection is TLS
/// and the certificate's signature algorithm defines one.
pub(crate) async fn authenticate(
    conn: &mut Conn,
    cfg: &ConnectConfig,
    cert_hash: Option<&[u8]>,
) -> Result<&'static str, ReplError> {
    let mut phase = Phase::Start;
    loop {
        let request = match conn.recv("authenticating").await? {
            Backend::Auth(request) => request,
            Backend::Error(e) => return Err(startup_error(&cfg.user, phase.method(), e)),
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
        phase = match (phase, request) {
            (Phase::Start, AuthRequest::Ok) => {
                judge_first(cfg, &FirstRequest::Ok, cert_hash.is_some())?;
                return Ok("trust");
            }
            (Phase::Start, AuthRequest::Cleartext) => {
                judge_first(cfg, &FirstRequest::Cleartext, cert_hash.is_some())?;
                let pw = password(cfg, "password")?;
                conn.send("sending the password", |buf| {
                    frontend::password_message(pw.as_bytes(), buf)
                })
                .await?;
                Phase::PasswordSent("password")
            }
            (Phase::Start, AuthRequest::Md5 { salt }) => {
                judge_first(cfg, &FirstRequest::Md5, cert_hash.is_some())?;
                let pw = password(cfg, "md5")?;
                let hashed = md5_hash(cfg.user.as_bytes(), pw.as_bytes(), salt);
                conn.send("sending the md5 password", |buf| {
                    frontend::password_message(hashed.as_bytes(), buf)
                })
                .await?;
                Phase::PasswordSent("md5")
            }
            (Phase::Start, AuthRequest::Sasl { mechanisms }) => {
                judge_first(cfg, &FirstRequest::Sasl(&mechanisms), cert_hash.is_some())?;
                let (binding, mechanism) = select_mechanism(cfg, &mechanisms, cert_hash)?;
                let method = if mechanism == SCRAM_SHA_256_PLUS {
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
                Phase::SaslStarted(method, state)
            }
            (Phase::SaslStarted(method, mut state), AuthRequest::SaslContinue(data)) => {
                state
                    .update(&data)
                    .map_err(|e| scram_failed(cfg, method, &e))?;
                conn.send("sending the SASL response", |buf| {
                    frontend::sasl_response(state.message(), buf)
                })
                .await?;
                Phase::SaslContinued(method, state)
            }
            (Phase::SaslContinued(method, mut state), AuthRequest::SaslFinal(data)) => {
                // Verifies the server signature: a server that does not know the password
                // (or a man in the middle) is refused here.
                state
                    .finish(&data)
                    .map_err(|e| scram_failed(cfg, method, &e))?;
                Phase::SaslVerified(method)
            }
            (Phase::PasswordSent(method) | Phase::SaslVerified(method), AuthRequest::Ok) => {
                return Ok(method)
            }
            (Phase::Start, AuthRequest::Other(code)) => {
                return Err(ReplError::AuthClient {
                    user: cfg.user.clone(),
                    method: "unsupported",
                    reason: format!("server requested unsupported authentication method {code}"),
                })
            }
            (phase, request) => return Err(out_of_sequence(cfg, &phase, &request)),
        };
    }
}

/// Binds to the certificate when both sides can and `channel_binding` allows; with TLS
/// but no -PLUS offered says "y", so a man in the middle who stripped -PLUS is detected.
fn select_mechanism(
    cfg: &ConnectConfig,
    mechanisms: &[String],
    cert_hash: Option<&[u8]>,
) -> Result<(ScramBinding, &'static str), ReplError> {
    let has_plus = mechanisms.iter().any(|m| m == SCRAM_SHA_256_PLUS);
    let has_scram = mechanisms.iter().any(|m| m == SCRAM_SHA_256);
    let hash = cert_hash.filter(|_| cfg.channel_binding != ChannelBinding::Disable);
    Ok(match (has_plus, has_scram, hash) {
        (true, _, Some(hash)) => (
            ScramBinding::tls_server_end_point(hash.to_vec()),
            SCRAM_SHA_256_PLUS,
        ),
        (true, true, None) => (ScramBinding::unsupported(), SCRAM_SHA_256),
        (false, true, Some(_)) => (ScramBinding::unrequested(), SCRAM_SHA_256),
        (false, true, None) => (ScramBinding::unsupported(), SCRAM_SHA_256),
        (_, false, _) => {
            return Err(ReplError::AuthClient {
                user: cfg.user.clone(),
                method: "SASL",
                reason: format!("no supported SASL mechanism among {mechanisms:?}"),
            })
        }
    })
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

fn describe(request: &AuthRequest) -> String {
    match request {
        AuthRequest::Ok => "AuthenticationOk".into(),
        AuthRequest::Cleartext => "a cleartext password".into(),
        AuthRequest::Md5 { .. } => "an md5 password".into(),
        AuthRequest::Sasl { mechanisms } => format!("SASL ({mechanisms:?})"),
        AuthRequest::SaslContinue(_) => "SASLContinue".into(),
        AuthRequest::SaslFinal(_) => "SASLFinal".into(),
        AuthRequest::Other(code) => format!("authentication method {code}"),
    }
}

fn out_of_sequence(cfg: &ConnectConfig, phase: &Phase, request: &AuthRequest) -> ReplError {
    let method = phase.method();
    let why = match (phase, request) {
        (Phase::SaslStarted(..) | Phase::SaslContinued(..), AuthRequest::Ok) => {
            " before completing SCRAM: it has not proven that it knows the password, so it may be an impostor"
        }
        (Phase::Start, _) => "",
        _ => " partway through another method",
    };
    ReplError::AuthRefused {
        user: cfg.user.clone(),
        method,
        reason: format!(
            "the server sent {}{why} (expected {}); the connection is refused",
            describe(request),
            phase.expected()
        ),
    }
}

fn scram_failed(cfg: &ConnectConfig, method: &'static str, e: &std::io::Error) -> ReplError {
    ReplError::AuthRefused {
        user: cfg.user.clone(),
        method,
        reason: format!("SCRAM exchange failed: {e}"),
    }
}
