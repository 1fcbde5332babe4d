//! Errors of the replication client and their one classification: [`ReplError::class`],
//! with [`class_of_sqlstate`] for server errors and [`class_of_sql`] for every
//! `tokio_postgres` error (the relay's side queries use the same function). The class
//! itself is [`pgoutput::ErrorClass`], shared by the whole workspace.

use std::fmt;
use std::io;

use pgoutput::DecodeError;
pub use pgoutput::ErrorClass;

/// The fields of a server ErrorResponse / NoticeResponse that matter to an operator.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerError {
    /// Non-localized severity (`V`), falling back to the localized one (`S`).
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " (detail: {detail})")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, " (hint: {hint})")?;
        }
        Ok(())
    }
}

/// Every failure of the replication client.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    #[error("I/O error while {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("timed out while {0}")]
    Timeout(&'static str),
    #[error("server closed the connection while {0}")]
    Closed(&'static str),
    #[error("server error: {0}")]
    Server(Box<ServerError>),
    #[error("authentication failed for user \"{user}\" ({method}): {server}")]
    Auth {
        user: String,
        method: &'static str,
        server: Box<ServerError>,
    },
    #[error("authentication as user \"{user}\" ({method}) failed on the client side: {reason}")]
    AuthClient {
        user: String,
        method: &'static str,
        reason: String,
    },
    /// The client refused how the server authenticates (or pretends to): `require_auth`,
    /// `channel_binding=require`, or a server that broke the exchange's sequence.
    #[error("refused to authenticate as user \"{user}\" ({method}): {reason}")]
    AuthRefused {
        user: String,
        method: &'static str,
        reason: String,
    },
    #[error("replication slot \"{slot}\" is active for PID {pid} (SQLSTATE 55006)")]
    SlotInUse { slot: String, pid: i32 },
    #[error("TLS error: {0}")]
    Tls(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("not supported by this server: {0}")]
    Unsupported(String),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("cannot decode replication data: {0}")]
    Decode(#[from] DecodeError),
    #[error("SQL error: {}", chain(.0))]
    Sql(#[from] tokio_postgres::Error),
    /// The server answered but is not what `target_session_attrs` asks for.
    #[error("{target} is {found}, not what target_session_attrs={wanted} asks for")]
    WrongSession {
        target: String,
        wanted: crate::config::TargetSessionAttrs,
        found: &'static str,
    },
    /// Several hosts were configured and none would do: each one's reason, in order.
    #[error("no host matched target_session_attrs={wanted}; tried {}", tried_list(.tried))]
    NoHost {
        wanted: crate::config::TargetSessionAttrs,
        tried: Vec<ReplError>,
    },
    /// Any failure to establish a connection, with where it was going: the cause alone
    /// ("connection refused", "password authentication failed") does not say which
    /// server, role or database was meant.
    #[error("cannot connect to {target}: {cause}{}", connect_hint(cause))]
    Connect {
        /// `user@host:port/database`
        target: String,
        /// Not `#[source]`: the message already includes it, and chain printers would
        /// repeat it.
        cause: Box<ReplError>,
    },
}

/// An error and its sources, `a: b: c`. tokio-postgres prints only its own layer ("db
/// error"), keeping the server's message in the source.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = cause.source();
    }
    text
}

fn tried_list(tried: &[ReplError]) -> String {
    tried
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({}) {e}", i + 1))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What to look at for each kind of connection failure.
fn connect_hint(cause: &ReplError) -> &'static str {
    match cause {
        ReplError::Tls(_) => {
            "; the server's certificate was not accepted: PGSSLROOTCERT (default \
             ~/.postgresql/root.crt; the system's trust store only for verify-full) must name \
             a PEM file with the CA that signed it (checked under require and prefer too when \
             a root file exists), and for verify-full PGHOST must be a name in the certificate"
        }
        ReplError::AuthRefused { .. } => {
            "; this server is not trusted: check that PGHOST and PGPORT name your PostgreSQL \
             server, and relax PGREQUIREAUTH or PGCHANNELBINDING only if its pg_hba.conf \
             really uses that method"
        }
        ReplError::AuthClient { .. } => {
            "; set PGPASSWORD (or the password in OUTBOXD_DATABASE_URL, or a line in the \
             password file, ~/.pgpass or PGPASSFILE, mode 0600), or allow the role another \
             method in pg_hba.conf"
        }
        ReplError::Auth { server, .. } if server.code == "28P01" => {
            "; check PGUSER and PGPASSWORD (or OUTBOXD_DATABASE_URL)"
        }
        ReplError::Auth { .. } => {
            "; pg_hba.conf must have a line for this role, database and address, and the role \
             must exist with LOGIN"
        }
        ReplError::Server(e) if e.code == "3D000" => "; check PGDATABASE (or OUTBOXD_DATABASE_URL)",
        ReplError::Io { .. } | ReplError::Timeout(_) | ReplError::Closed(_) => {
            "; check PGHOST and PGPORT, and that the server is running and reachable"
        }
        _ => "",
    }
}

impl ReplError {
    pub(crate) fn io(context: &'static str) -> impl FnOnce(io::Error) -> ReplError {
        move |source| ReplError::Io { context, source }
    }

    /// The error itself, without the connection target around it.
    pub fn root(&self) -> &ReplError {
        match self {
            ReplError::Connect { cause, .. } => cause.root(),
            other => other,
        }
    }

    /// The SQLSTATE that decided this error, when the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ReplError::Connect { cause, .. } => cause.sqlstate(),
            ReplError::Server(e) | ReplError::Auth { server: e, .. } => Some(&e.code),
            ReplError::SlotInUse { .. } => Some("55006"),
            ReplError::Sql(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// A lock not granted within `lock_timeout`: another transaction (the application's
    /// DDL) holds it, and the statement can simply be tried again later.
    pub fn is_lock_timeout(&self) -> bool {
        self.sqlstate() == Some(LOCK_NOT_AVAILABLE)
    }

    /// The single place where errors are split into permanent and retryable.
    pub fn class(&self) -> ErrorClass {
        match self {
            ReplError::Connect { cause, .. } => cause.class(),
            ReplError::Io { .. }
            | ReplError::Timeout(_)
            | ReplError::Closed(_)
            | ReplError::SlotInUse { .. }
            // A standby may be promoted, a primary come back.
            | ReplError::WrongSession { .. } => ErrorClass::Retryable,
            // Permanent only when every host failed for a reason that does not heal.
            ReplError::NoHost { tried, .. } => {
                if !tried.is_empty() && tried.iter().all(|e| e.class() == ErrorClass::Permanent) {
                    ErrorClass::Permanent
                } else {
                    ErrorClass::Retryable
                }
            }
            ReplError::Server(e) => class_of_sqlstate(&e.code),
            ReplError::Auth { .. }
            | ReplError::AuthClient { .. }
            | ReplError::AuthRefused { .. }
            | ReplError::Tls(_)
            | ReplError::Config(_)
            | ReplError::Unsupported(_)
            | ReplError::Protocol(_)
            | ReplError::Decode(_) => ErrorClass::Permanent,
            ReplError::Sql(e) => class_of_sql(e),
        }
    }
}

/// The one rule for a `tokio_postgres` error: by its SQLSTATE when the server sent one;
/// without one, retryable when the connection broke or closed under the client (an I/O
/// cause), permanent otherwise: an unexpected message, a missing column or a wrong row
/// count is a bug or a catalog surprise that a replay meets again.
pub fn class_of_sql(e: &tokio_postgres::Error) -> ErrorClass {
    match e.code() {
        Some(code) => class_of_sqlstate(code.code()),
        None if e.is_closed() || std::error::Error::source(e).is_some() => ErrorClass::Retryable,
        None => ErrorClass::Permanent,
    }
}

/// SQLSTATE lock_not_available: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// SQLSTATE → class. Unknown codes are permanent so a human sees them instead of a loop.
pub fn class_of_sqlstate(code: &str) -> ErrorClass {
    match code {
        // Slot held by another walsender: the holder may die or time out.
        "55006" => ErrorClass::Retryable,
        // Admin shutdown, crash shutdown, cannot connect now (startup/recovery).
        "57P01" | "57P02" | "57P03" => ErrorClass::Retryable,
        // Query canceled (e.g. statement_timeout on a busy server); a lock not granted
        // within lock_timeout (another transaction's DDL holds it: it ends).
        "57014" | LOCK_NOT_AVAILABLE => ErrorClass::Retryable,
        _ if code.starts_with("08") => ErrorClass::Retryable,
        // Insufficient resources: too many connections, out of memory, disk full.
        _ if code.starts_with("53") => ErrorClass::Retryable,
        // Serialization failure / deadlock.
        _ if code.starts_with("40") => ErrorClass::Retryable,
        _ => ErrorClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> ReplError {
        ReplError::Server(Box::new(ServerError {
            severity: "ERROR".into(),
            code: code.into(),
            message: "m".into(),
            ..ServerError::default()
        }))
    }

    #[test]
    fn classification_table() {
        let cases = [
            ("28P01", ErrorClass::Permanent),
            ("28000", ErrorClass::Permanent),
            ("42704", ErrorClass::Permanent),
            ("55000", ErrorClass::Permanent),
            ("55006", ErrorClass::Retryable),
            ("57P01", ErrorClass::Retryable),
            ("57P02", ErrorClass::Retryable),
            ("57P03", ErrorClass::Retryable),
            ("57014", ErrorClass::Retryable),
            ("55P03", ErrorClass::Retryable),
            ("08006", ErrorClass::Retryable),
            ("08P01", ErrorClass::Retryable),
            ("53300", ErrorClass::Retryable),
            ("42501", ErrorClass::Permanent),
            ("XX000", ErrorClass::Permanent),
        ];
        for (code, class) in cases {
            assert_eq!(server(code).class(), class, "{code}");
            assert_eq!(server(code).sqlstate(), Some(code));
        }
    }

    #[test]
    fn non_server_errors() {
        let io = ReplError::Io {
            context: "reading",
            source: io::Error::from(io::ErrorKind::ConnectionReset),
        };
        assert_eq!(io.class(), ErrorClass::Retryable);
        assert_eq!(ReplError::Timeout("x").class(), ErrorClass::Retryable);
        assert_eq!(ReplError::Closed("x").class(), ErrorClass::Retryable);
        let busy = ReplError::SlotInUse {
            slot: "s".into(),
            pid: 7,
        };
        assert_eq!(busy.class(), ErrorClass::Retryable);
        assert_eq!(busy.sqlstate(), Some("55006"));
        assert_eq!(ReplError::Tls("bad".into()).class(), ErrorClass::Permanent);
        let decode = ReplError::Decode(DecodeError::UnknownTag {
            what: "x",
            tag: b'?',
        });
        assert_eq!(decode.class(), ErrorClass::Permanent);
    }

    #[test]
    fn auth_display_names_user_method_and_sqlstate() {
        let e = ReplError::Auth {
            user: "x".into(),
            method: "md5",
            server: Box::new(ServerError {
                severity: "FATAL".into(),
                code: "28P01".into(),
                message: "password authentication failed for user \"x\"".into(),
                ..ServerError::default()
            }),
        };
        let text = e.to_string();
        assert!(text.contains("user \"x\""), "{text}");
        assert!(text.contains("(md5)"), "{text}");
        assert!(text.contains("28P01"), "{text}");
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert_eq!(e.sqlstate(), Some("28P01"));
    }
}
