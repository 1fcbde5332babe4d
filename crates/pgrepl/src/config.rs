//! Connection settings shared by the replication connection and the ordinary SQL client.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ReplError;

/// A password that never shows up in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(secret: impl Into<String>) -> Self {
        Password(secret.into())
    }

    /// The secret itself; call only where it goes on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<&str> for Password {
    fn from(s: &str) -> Self {
        Password::new(s)
    }
}

impl From<String> for Password {
    fn from(s: String) -> Self {
        Password::new(s)
    }
}

/// libpq's `sslmode` values, minus `allow` (which prefers plaintext).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    /// TLS if the server offers it (verified as `VerifyCa` when a root file is given);
    /// plaintext only when the server declines, never after a failed handshake.
    #[default]
    Prefer,
    /// TLS or fail; the certificate is verified as `VerifyCa` when a root file is given,
    /// not at all otherwise (libpq's rule).
    Require,
    /// TLS, certificate chain verified against the root file (required); host name not
    /// checked.
    VerifyCa,
    /// TLS, chain and host name verified, against the root file or else the system's
    /// trust store.
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown `sslmode` string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sslmode {0:?}: expected disable, prefer, require, verify-ca or verify-full")]
pub struct ParseSslModeError(pub String);

impl FromStr for SslMode {
    type Err = ParseSslModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            _ => Err(ParseSslModeError(s.to_owned())),
        }
    }
}

/// libpq's `channel_binding`: whether SCRAM binds the exchange to the TLS certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChannelBinding {
    /// Never bind, even when both sides could.
    Disable,
    /// Bind when the server offers SCRAM-SHA-256-PLUS over TLS.
    #[default]
    Prefer,
    /// Refuse any authentication that is not SCRAM-SHA-256-PLUS bound to this TLS channel.
    Require,
}

impl ChannelBinding {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        }
    }
}

impl fmt::Display for ChannelBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown `channel_binding` string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid channel_binding {0:?}: expected disable, prefer or require")]
pub struct ParseChannelBindingError(pub String);

impl FromStr for ChannelBinding {
    type Err = ParseChannelBindingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "disable" => Ok(ChannelBinding::Disable),
            "prefer" => Ok(ChannelBinding::Prefer),
            "require" => Ok(ChannelBinding::Require),
            _ => Err(ParseChannelBindingError(s.to_owned())),
        }
    }
}

/// An authentication request as `require_auth` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AuthMethod {
    /// The server sent AuthenticationOk without any challenge (trust, or a client
    /// certificate alone).
    None,
    /// A cleartext password.
    Password,
    Md5,
    /// SCRAM-SHA-256 or SCRAM-SHA-256-PLUS.
    ScramSha256,
    /// Accepted in the list for libpq compatibility; outboxd never speaks it.
    Gss,
    /// Accepted in the list for libpq compatibility; outboxd never speaks it.
    Sspi,
}

impl AuthMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMethod::None => "none",
            AuthMethod::Password => "password",
            AuthMethod::Md5 => "md5",
            AuthMethod::ScramSha256 => "scram-sha-256",
            AuthMethod::Gss => "gss",
            AuthMethod::Sspi => "sspi",
        }
    }

    const ALL: [AuthMethod; 6] = [
        AuthMethod::None,
        AuthMethod::Password,
        AuthMethod::Md5,
        AuthMethod::ScramSha256,
        AuthMethod::Gss,
        AuthMethod::Sspi,
    ];
}

/// libpq's `require_auth` (PostgreSQL 16+): the authentication requests the server may
/// make. The default allows every one, and no authentication at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequireAuth {
    allowed: Vec<AuthMethod>,
    /// As given, for messages; `None` when not set.
    text: Option<String>,
}

impl Default for RequireAuth {
    fn default() -> Self {
        RequireAuth {
            allowed: AuthMethod::ALL.to_vec(),
            text: None,
        }
    }
}

impl RequireAuth {
    /// Whether the server may authenticate us this way.
    pub fn allows(&self, method: AuthMethod) -> bool {
        self.allowed.contains(&method)
    }

    /// Whether the setting was given (anything but the default).
    pub fn is_set(&self) -> bool {
        self.text.is_some()
    }

    /// The setting as given, e.g. `scram-sha-256` or `!password,!md5`.
    pub fn as_str(&self) -> &str {
        self.text.as_deref().unwrap_or("(any)")
    }

    /// The allowed methods, for messages.
    pub fn allowed(&self) -> &[AuthMethod] {
        &self.allowed
    }
}

/// What [`ParseRequireAuthError`] tells the operator to write instead.
const REQUIRE_AUTH_FORMS: &str = "expected a comma-separated list of password, md5, gss, \
     sspi, scram-sha-256 and none, all of them negated with `!` or none of them";

/// Error for a `require_auth` string libpq would refuse too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid require_auth {text:?}: {reason}; {REQUIRE_AUTH_FORMS}")]
pub struct ParseRequireAuthError {
    pub text: String,
    pub reason: String,
}

impl FromStr for RequireAuth {
    type Err = ParseRequireAuthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| ParseRequireAuthError {
            text: s.to_owned(),
            reason,
        };
        let mut listed: Vec<AuthMethod> = Vec::new();
        let mut negated: Option<bool> = None;
        for item in s.split(',') {
            let (neg, name) = match item.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, item),
            };
            if *negated.get_or_insert(neg) != neg {
                return Err(err("negative and positive methods cannot be mixed".into()));
            }
            let method = AuthMethod::ALL
                .into_iter()
                .find(|m| m.as_str() == name)
                .ok_or_else(|| err(format!("unknown method {name:?}")))?;
            if listed.contains(&method) {
                return Err(err(format!("method {name:?} is listed more than once")));
            }
            listed.push(method);
        }
        let allowed = if negated == Some(true) {
            AuthMethod::ALL
                .into_iter()
                .filter(|m| !listed.contains(m))
                .collect()
        } else {
            listed
        };
        Ok(RequireAuth {
            allowed,
            text: Some(s.to_owned()),
        })
    }
}

/// libpq's `target_session_attrs`: which of several hosts a connection settles on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSessionAttrs {
    #[default]
    Any,
    /// `transaction_read_only` is off.
    ReadWrite,
    /// `transaction_read_only` is on.
    ReadOnly,
    /// Not in recovery.
    Primary,
    /// In recovery (a hot standby).
    Standby,
    /// A standby if any host is one, else any host.
    PreferStandby,
}

impl TargetSessionAttrs {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a server in this state is acceptable (prefer-standby: a standby; the
    /// fallback to any server is the caller's).
    pub fn accepts(self, state: ServerState) -> bool {
        match self {
            TargetSessionAttrs::Any => true,
            TargetSessionAttrs::ReadWrite => !state.read_only,
            TargetSessionAttrs::ReadOnly => state.read_only,
            TargetSessionAttrs::Primary => !state.in_recovery,
            TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => state.in_recovery,
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown `target_session_attrs` string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid target_session_attrs {0:?}: expected any, read-write, read-only, primary, standby or prefer-standby")]
pub struct ParseTargetSessionAttrsError(pub String);

impl FromStr for TargetSessionAttrs {
    type Err = ParseTargetSessionAttrsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "any" => Ok(TargetSessionAttrs::Any),
            "read-write" => Ok(TargetSessionAttrs::ReadWrite),
            "read-only" => Ok(TargetSessionAttrs::ReadOnly),
            "primary" => Ok(TargetSessionAttrs::Primary),
            "standby" => Ok(TargetSessionAttrs::Standby),
            "prefer-standby" => Ok(TargetSessionAttrs::PreferStandby),
            _ => Err(ParseTargetSessionAttrsError(s.to_owned())),
        }
    }
}

/// What a connected server said about itself, for [`TargetSessionAttrs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerState {
    pub in_recovery: bool,
    pub read_only: bool,
}

impl ServerState {
    pub(crate) fn describe(self) -> &'static str {
        match (self.in_recovery, self.read_only) {
            (true, _) => "a standby (in recovery)",
            (false, true) => "a primary with default_transaction_read_only on",
            (false, false) => "a read-write primary",
        }
    }
}

/// Where and how to connect. Not `Serialize`: it holds a password.
#[derive(Debug, Clone)]
pub struct ConnectConfig {
    /// Host name, IP address, or a Unix-socket directory (starts with `/`).
    pub host: String,
    pub port: u16,
    /// Further hosts tried in order after `host` (libpq's `host=a,b,c`).
    pub other_hosts: Vec<(String, u16)>,
    /// Which host a connection settles on when there are several.
    pub target_session_attrs: TargetSessionAttrs,
    pub user: String,
    pub password: Option<Password>,
    /// libpq's password file, read for each host when `password` is `None`.
    pub passfile: Option<PathBuf>,
    pub dbname: String,
    pub ssl_mode: SslMode,
    /// PEM bundle of trusted roots. With one, `prefer` and `require` verify the chain as
    /// `verify-ca` does (libpq's rule); without one, `verify-ca` is refused and
    /// `verify-full` uses the system's trust store (libpq's `sslrootcert=system`).
    pub ssl_root_cert: Option<PathBuf>,
    /// libpq's `channel_binding`.
    pub channel_binding: ChannelBinding,
    /// libpq's `require_auth`.
    pub require_auth: RequireAuth,
    /// Client certificate (PEM, may carry intermediates) and its private key.
    pub ssl_client_cert: Option<(PathBuf, PathBuf)>,
    pub application_name: String,
    pub connect_timeout: Duration,
}

/// Startup option of both connections: the session's search_path is pg_catalog only
/// (pg_temp named last so it is never searched first), so no object planted in `public`
/// or another schema, nor an `ALTER ROLE/DATABASE ... SET search_path`, can stand in for
/// an operator or function a statement of outboxd names (docs/sql.md). A startup option
/// outranks role and database settings; PGOPTIONS is refused, so nothing overrides it.
pub const PINNED_SEARCH_PATH: &str = "-c search_path=pg_catalog,pg_temp";

impl ConnectConfig {
    /// A config with libpq-like defaults for everything but host, user and database.
    pub fn new(
        host: impl Into<String>,
        port: u16,
        user: impl Into<String>,
        dbname: impl Into<String>,
    ) -> Self {
        ConnectConfig {
            host: host.into(),
            port,
            other_hosts: Vec::new(),
            target_session_attrs: TargetSessionAttrs::Any,
            user: user.into(),
            password: None,
            passfile: None,
            dbname: dbname.into(),
            ssl_mode: SslMode::Prefer,
            ssl_root_cert: None,
            channel_binding: ChannelBinding::Prefer,
            require_auth: RequireAuth::default(),
            ssl_client_cert: None,
            application_name: "outboxd".into(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// `user@host:port/database`, for messages: where a connection was going.
    pub fn target(&self) -> String {
        format!("{}@{}:{}/{}", self.user, self.host, self.port, self.dbname)
    }

    /// Wraps a failure to connect with [`ConnectConfig::target`].
    pub fn connect_error(&self, cause: ReplError) -> ReplError {
        ReplError::Connect {
            target: self.target(),
            cause: Box::new(cause),
        }
    }

    pub fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// One single-host config per host, in the order libpq tries them.
    pub fn candidates(&self) -> Vec<ConnectConfig> {
        std::iter::once((self.host.clone(), self.port))
            .chain(self.other_hosts.iter().cloned())
            .map(|(host, port)| ConnectConfig {
                host,
                port,
                other_hosts: Vec::new(),
                ..self.clone()
            })
            .collect()
    }

    /// `PGPASSWORD`, else the password file's entry for this host, port, database and user.
    pub fn effective_password(&self) -> Option<Password> {
        if let Some(pw) = &self.password {
            return Some(pw.clone());
        }
        let file = self.passfile.as_deref()?;
        crate::pgpass::lookup(file, &self.host, self.port, &self.dbname, &self.user)
            .map(Password::new)
    }

    /// The `tokio_postgres` config for the ordinary SQL connection, over a transport that
    /// [`ConnectConfig::connect_sql`] opened itself (`encrypted`: TLS is already up).
    pub fn tokio_postgres_config(&self, encrypted: bool) -> tokio_postgres::Config {
        use tokio_postgres::config::{ChannelBinding as T, SslMode as M, SslNegotiation};
        let mut cfg = tokio_postgres::Config::new();
        cfg.host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name(&self.application_name)
            .options(PINNED_SEARCH_PATH)
            .channel_binding(match self.channel_binding {
                ChannelBinding::Disable => T::Disable,
                ChannelBinding::Prefer => T::Prefer,
                ChannelBinding::Require => T::Require,
            });
        if encrypted {
            // "Direct": tokio-postgres hands the stream to our no-op connector instead of
            // sending a second SSLRequest.
            cfg.ssl_mode(M::Require)
                .ssl_negotiation(SslNegotiation::Direct);
        } else {
            cfg.ssl_mode(M::Disable);
        }
        if let Some(pw) = self.effective_password() {
            cfg.password(pw.expose());
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ssl_modes() {
        for (text, mode) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("VERIFY_FULL", SslMode::VerifyFull),
        ] {
            assert_eq!(text.parse::<SslMode>(), Ok(mode));
        }
        assert_eq!(
            SslMode::VerifyCa.to_string().parse::<SslMode>(),
            Ok(SslMode::VerifyCa)
        );
        assert!("allow".parse::<SslMode>().is_err());
        assert!("".parse::<SslMode>().is_err());
    }

    #[test]
    fn target_session_attrs_parse_and_judge() {
        let primary = ServerState {
            in_recovery: false,
            read_only: false,
        };
        let standby = ServerState {
            in_recovery: true,
            read_only: true,
        };
        for (text, on_primary, on_standby) in [
            ("any", true, true),
            ("read-write", true, false),
            ("read-only", false, true),
            ("primary", true, false),
            ("standby", false, true),
            ("PREFER-STANDBY", false, true),
        ] {
            let attrs: TargetSessionAttrs = text.parse().unwrap();
            assert_eq!(attrs.accepts(primary), on_primary, "{text}");
            assert_eq!(attrs.accepts(standby), on_standby, "{text}");
            assert_eq!(attrs.as_str().parse::<TargetSessionAttrs>(), Ok(attrs));
        }
        assert!("master".parse::<TargetSessionAttrs>().is_err());
    }

    /// Hosts a..c: a refuses connections, b is a standby, c a primary.
    async fn fake(one: ConnectConfig) -> Result<(String, ServerState), ReplError> {
        match one.host.as_str() {
            "a" => Err(one.connect_error(ReplError::Timeout("connecting to the server"))),
            h => Ok((
                h.to_owned(),
                ServerState {
                    in_recovery: h == "b",
                    read_only: h == "b",
                },
            )),
        }
    }

    #[tokio::test]
    async fn each_host_is_tried_and_every_failure_named() {
        let mut cfg = ConnectConfig::new("a", 1, "u", "db");
        cfg.other_hosts = vec![("b".into(), 2), ("c".into(), 3)];
        cfg.target_session_attrs = TargetSessionAttrs::Primary;
        let (chosen, value) = cfg.connect_each(fake).await.unwrap();
        assert_eq!(
            (chosen.host.as_str(), chosen.port, value.as_str()),
            ("c", 3, "c")
        );
        assert!(chosen.other_hosts.is_empty());
        cfg.target_session_attrs = TargetSessionAttrs::PreferStandby;
        assert_eq!(cfg.connect_each(fake).await.unwrap().1, "b");

        cfg.other_hosts.truncate(1);
        cfg.target_session_attrs = TargetSessionAttrs::Primary;
        let e = cfg.connect_each(fake).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("u@a:1/db") && text.contains("u@b:2/db"),
            "{text}"
        );
        assert!(text.contains("standby"), "{text}");
        assert_eq!(e.class(), crate::ErrorClass::Retryable);
        cfg.other_hosts.clear();
        cfg.host = "b".into();
        cfg.target_session_attrs = TargetSessionAttrs::PreferStandby;
        assert_eq!(cfg.connect_each(fake).await.unwrap().1, "b");
        cfg.host = "c".into();
        assert_eq!(
            cfg.connect_each(fake).await.unwrap().1,
            "c",
            "no standby: any host"
        );
    }

    #[test]
    fn password_is_redacted() {
        let mut cfg = ConnectConfig::new("localhost", 5432, "u", "db");
        cfg.password = Some(Password::new("hunter2"));
        let debug = format!("{cfg:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
        assert_eq!(format!("{:?}", Password::from("s3cret")), "***");
    }

    #[test]
    fn tokio_postgres_modes() {
        use tokio_postgres::config::{ChannelBinding as B, SslMode as T};
        let mut cfg = ConnectConfig::new("db.example", 5432, "u", "db");
        assert_eq!(cfg.tokio_postgres_config(true).get_ssl_mode(), T::Require);
        assert_eq!(cfg.tokio_postgres_config(false).get_ssl_mode(), T::Disable);
        for (mode, expected) in [
            (ChannelBinding::Disable, B::Disable),
            (ChannelBinding::Prefer, B::Prefer),
            (ChannelBinding::Require, B::Require),
        ] {
            cfg.channel_binding = mode;
            assert_eq!(
                cfg.tokio_postgres_config(true).get_channel_binding(),
                expected
            );
        }
    }

    #[test]
    fn require_auth_parses_as_libpq() {
        let ra: RequireAuth = "scram-sha-256".parse().unwrap();
        assert!(ra.allows(AuthMethod::ScramSha256) && !ra.allows(AuthMethod::None));
        assert!(!ra.allows(AuthMethod::Password) && !ra.allows(AuthMethod::Md5));
        let ra: RequireAuth = "!password,!md5".parse().unwrap();
        assert!(ra.allows(AuthMethod::ScramSha256) && ra.allows(AuthMethod::None));
        assert!(!ra.allows(AuthMethod::Password) && !ra.allows(AuthMethod::Md5));
        let ra: RequireAuth = "none,md5".parse().unwrap();
        assert!(ra.allows(AuthMethod::None) && ra.allows(AuthMethod::Md5));
        assert!(!ra.allows(AuthMethod::ScramSha256));
        assert!(RequireAuth::default().allows(AuthMethod::Password));
        for bad in [
            "",
            "scram",
            "!md5,password",
            "md5,md5",
            "SCRAM-SHA-256",
            "md5, none",
        ] {
            assert!(bad.parse::<RequireAuth>().is_err(), "{bad:?}");
        }
        assert_eq!("require".parse(), Ok(ChannelBinding::Require));
        assert!("required".parse::<ChannelBinding>().is_err());
    }
}
