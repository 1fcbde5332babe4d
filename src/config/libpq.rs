//! The PostgreSQL connection settings as libpq resolves them: a connection string
//! (`OUTBOXD_DATABASE_URL`) wins over a service file entry (`PGSERVICE`), which wins over
//! the `PG*` variables, which win over the defaults (the Unix-socket directory, the OS
//! user, a database named after the user, `~/.pgpass`, `~/.postgresql/…`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pgrepl::{ChannelBinding, ConnectConfig, Password, RequireAuth, TargetSessionAttrs};

use super::{database_url, parse_ssl_mode, ConfigError, SslMode};

/// libpq keyword ↔ environment variable.
const ENV_KEYWORDS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("passfile", "PGPASSFILE"),
    ("dbname", "PGDATABASE"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("application_name", "PGAPPNAME"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("require_auth", "PGREQUIREAUTH"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("service", "PGSERVICE"),
];

/// libpq settings outboxd does not honour: (keyword, variable, the values that mean what
/// outboxd does anyway). Set to anything else they are a configuration error, never
/// silently ignored: a CRL nobody checks or a `gssencmode=require` nobody enforces would
/// leave the operator believing in a protection that is not there.
const NOT_HONOURED: &[(&str, &str, &[&str])] = &[
    ("gssencmode", "PGGSSENCMODE", &["disable", "prefer"]),
    ("sslnegotiation", "PGSSLNEGOTIATION", &["postgres"]),
    ("sslcrl", "PGSSLCRL", &[]),
    ("sslcrldir", "PGSSLCRLDIR", &[]),
    ("sslsni", "PGSSLSNI", &["1"]),
    ("sslcertmode", "PGSSLCERTMODE", &["allow"]),
    (
        "ssl_min_protocol_version",
        "PGSSLMINPROTOCOLVERSION",
        &["TLSv1.2"],
    ),
    ("ssl_max_protocol_version", "PGSSLMAXPROTOCOLVERSION", &[]),
    ("sslcompression", "PGSSLCOMPRESSION", &["0"]),
    ("requirepeer", "PGREQUIREPEER", &[]),
    ("krbsrvname", "PGKRBSRVNAME", &[]),
    ("gsslib", "PGGSSLIB", &[]),
    ("gssdelegation", "PGGSSDELEGATION", &["0"]),
    ("hostaddr", "PGHOSTADDR", &[]),
    ("options", "PGOPTIONS", &[]),
    ("load_balance_hosts", "PGLOADBALANCEHOSTS", &["disable"]),
    ("client_encoding", "PGCLIENTENCODING", &["UTF8", "utf8"]),
    ("datestyle", "PGDATESTYLE", &[]),
    ("timezone", "PGTZ", &[]),
    ("geqo", "PGGEQO", &[]),
    ("min_protocol_version", "PGMINPROTOCOLVERSION", &["3.0"]),
    ("max_protocol_version", "PGMAXPROTOCOLVERSION", &["3.0"]),
];

/// Refuses a libpq setting outboxd does not honour (see [`NOT_HONOURED`]).
pub fn refuse_not_honoured(origin: &str, keyword: &str, value: &str) -> Result<(), ConfigError> {
    let Some((_, var, fine)) = NOT_HONOURED
        .iter()
        .find(|(kw, var, _)| *kw == keyword || *var == keyword)
    else {
        return Ok(());
    };
    if fine.contains(&value.trim()) {
        return Ok(());
    }
    let origin = if origin == *var {
        (*var).to_owned()
    } else {
        format!("{origin} ({keyword})")
    };
    let what = if fine.is_empty() {
        format!("not supported by outboxd, which would ignore it; unset {var}")
    } else {
        format!(
            "not supported by outboxd except as {} (what outboxd does anyway); unset {var} or set it to that",
            fine.join(" or ")
        )
    };
    Err(ConfigError::new(&origin, value, what))
}

/// `k` is a libpq keyword outboxd does not honour (see [`refuse_not_honoured`]).
pub fn is_not_honoured(k: &str) -> bool {
    NOT_HONOURED.iter().any(|(kw, _, _)| *kw == k)
}

/// `k` if outboxd reads it in a connection string or a service file.
pub fn accepts(k: &str) -> bool {
    ENV_KEYWORDS.iter().any(|(kw, _)| *kw == k)
}

/// The keywords outboxd reads, for errors.
pub fn keyword_list() -> String {
    let keywords: Vec<&str> = ENV_KEYWORDS.iter().map(|(kw, _)| *kw).collect();
    keywords.join(", ")
}

/// A keyword's value and where it came from (named in errors).
#[derive(Debug, Clone)]
struct Value {
    text: String,
    origin: String,
}

/// What the process knows about its user and files, so the rules stay testable.
#[derive(Debug, Clone, Default)]
pub struct Home {
    /// The OS user name (libpq: the effective uid's passwd entry).
    pub os_user: Option<String>,
    /// `$HOME`, else the passwd entry's home directory.
    pub dir: Option<PathBuf>,
}

impl Home {
    /// From the process: `$HOME`/`$USER` first, then `/etc/passwd` for the uid that owns
    /// `/proc/self` (no libc call needed).
    pub fn of_process(vars: &BTreeMap<String, String>) -> Home {
        let passwd = passwd_entry();
        Home {
            os_user: passwd
                .as_ref()
                .map(|(u, _)| u.clone())
                .or_else(|| vars.get("USER").cloned())
                .or_else(|| vars.get("LOGNAME").cloned()),
            dir: vars
                .get("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from)
                .or_else(|| passwd.map(|(_, home)| PathBuf::from(home))),
        }
    }

    fn file(&self, rel: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(rel))
    }
}

#[cfg(unix)]
fn passwd_entry() -> Option<(String, String)> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 6 && f[2] == uid).then(|| (f[0].to_owned(), f[5].to_owned()))
    })
}

#[cfg(not(unix))]
fn passwd_entry() -> Option<(String, String)> {
    None
}

/// libpq's compiled-in socket directory: Debian's and Ubuntu's where it exists, else
/// upstream's.
fn default_socket_dir() -> &'static str {
    if Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql"
    } else {
        "/tmp"
    }
}

/// Reads `[service]` from a pg_service.conf text: `key=value` lines, `#` comments.
fn service_entries(text: &str, service: &str) -> Option<Vec<(String, String)>> {
    let mut in_section = false;
    let mut found = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_section = name.trim() == service;
            found |= in_section;
            continue;
        }
        if in_section {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_owned(), v.trim().to_owned()));
            }
        }
    }
    found.then_some(out)
}

/// libpq's service file search: PGSERVICEFILE or ~/.pg_service.conf, then
/// PGSYSCONFDIR/pg_service.conf (default /etc/postgresql-common, Debian's).
fn service_lookup(
    vars: &BTreeMap<String, String>,
    home: &Home,
    service: &str,
    origin: &str,
) -> Result<Vec<(String, String, String)>, ConfigError> {
    let user_file = match vars.get("PGSERVICEFILE").filter(|v| !v.is_empty()) {
        Some(f) => Some(PathBuf::from(f)),
        None => home.file(".pg_service.conf"),
    };
    let sysconf = vars
        .get("PGSYSCONFDIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/etc/postgresql-common"), PathBuf::from)
        .join("pg_service.conf");
    let mut looked = Vec::new();
    for file in user_file.into_iter().chain(std::iter::once(sysconf)) {
        looked.push(file.display().to_string());
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        if let Some(entries) = service_entries(&text, service) {
            let from = format!("service {service:?} in {}", file.display());
            return Ok(entries
                .into_iter()
                .map(|(k, v)| (k, v, from.clone()))
                .collect());
        }
    }
    Err(ConfigError::new(
        origin,
        service,
        format!(
            "a service defined in a service file; looked in {}",
            looked.join(" and ")
        ),
    ))
}

/// Resolves the settings from a snapshot of the environment and the process's home.
pub fn resolve(vars: &BTreeMap<String, String>, home: &Home) -> Result<ConnectConfig, ConfigError> {
    let mut values: BTreeMap<String, Value> = BTreeMap::new();
    for (keyword, var) in ENV_KEYWORDS {
        if let Some(v) = vars.get(*var).filter(|v| !v.is_empty()) {
            values.insert(
                (*keyword).to_owned(),
                Value {
                    text: v.clone(),
                    origin: (*var).to_owned(),
                },
            );
        }
    }
    for (keyword, var, _) in NOT_HONOURED {
        if let Some(v) = vars.get(*var).filter(|v| !v.is_empty()) {
            refuse_not_honoured(var, keyword, v)?;
        }
    }
    let url = vars
        .get("OUTBOXD_DATABASE_URL")
        .filter(|u| !u.is_empty())
        .map(|u| database_url::parse(u))
        .transpose()?
        .unwrap_or_default();
    let url_service = url.iter().find(|(k, _)| k == "service").map(|(_, v)| v);
    let service = url_service
        .map(|s| (s.clone(), "OUTBOXD_DATABASE_URL".to_owned()))
        .or_else(|| {
            values
                .get("service")
                .map(|v| (v.text.clone(), v.origin.clone()))
        });
    if let Some((service, origin)) = service {
        for (k, v, from) in service_lookup(vars, home, &service, &origin)? {
            refuse_not_honoured(&from, &k, &v)?;
            if is_not_honoured(&k) {
                continue;
            }
            if !accepts(&k) {
                return Err(ConfigError::new(
                    &from,
                    &k,
                    format!("one of the keywords outboxd reads: {}", keyword_list()),
                ));
            }
            values.insert(
                k,
                Value {
                    text: v,
                    origin: from.clone(),
                },
            );
        }
    }
    // database_url::parse refused every keyword outboxd does not read.
    for (k, v) in url {
        values.insert(
            k,
            Value {
                text: v,
                origin: "OUTBOXD_DATABASE_URL".to_owned(),
            },
        );
    }
    build(&values, home)
}

fn bad(v: &Value, accepts: impl Into<String>) -> ConfigError {
    ConfigError::new(&v.origin, &v.text, accepts)
}

fn build(values: &BTreeMap<String, Value>, home: &Home) -> Result<ConnectConfig, ConfigError> {
    let get = |k: &str| values.get(k).filter(|v| !v.text.is_empty());
    let hosts: Vec<String> = match get("host") {
        Some(v) => v.text.split(',').map(|h| h.trim().to_owned()).collect(),
        None => vec![default_socket_dir().to_owned()],
    };
    let ports: Vec<u16> = match get("port") {
        Some(v) => {
            let ports: Vec<u16> = v
                .text
                .split(',')
                .map(|p| match p.trim() {
                    "" => Ok(5432),
                    p => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                        bad(v, "a port 1-65535, or one per host separated by commas")
                    }),
                })
                .collect::<Result<_, _>>()?;
            if ports.len() != 1 && ports.len() != hosts.len() {
                return Err(bad(
                    v,
                    format!(
                        "one port for every host, or a single port for all ({} hosts given)",
                        hosts.len()
                    ),
                ));
            }
            ports
        }
        None => vec![5432],
    };
    let mut pairs = hosts.iter().enumerate().map(|(i, h)| {
        let host = if h.is_empty() {
            default_socket_dir().to_owned()
        } else {
            h.clone()
        };
        (host, ports.get(i).copied().unwrap_or(ports[0]))
    });
    let Some((host, port)) = pairs.next() else {
        return Err(ConfigError::new("PGHOST", "", "a host"));
    };
    let other_hosts: Vec<(String, u16)> = pairs.collect();
    let user = match get("user") {
        Some(v) => v.text.clone(),
        None => home.os_user.clone().ok_or_else(|| {
            ConfigError::new(
                "PGUSER",
                "",
                "required: the OS user name could not be found",
            )
        })?,
    };
    let dbname = get("dbname").map_or_else(|| user.clone(), |v| v.text.clone());
    let system_roots = get("sslrootcert").filter(|v| v.text == "system");
    // libpq 16+: sslrootcert=system makes verify-full the default and refuses anything
    // weaker, since any public CA could otherwise vouch for any name.
    let ssl_mode = match (get("sslmode"), system_roots) {
        (Some(v), Some(root)) => match parse_ssl_mode(&v.origin, &v.text)? {
            SslMode::VerifyFull => SslMode::VerifyFull,
            weak => {
                return Err(bad(
                    v,
                    format!(
                        "verify-full with {}=system (sslmode={weak} would let any certificate from any public CA through); name the CA's file in {} for verify-ca",
                        root.origin, root.origin
                    ),
                ))
            }
        },
        (Some(v), None) => parse_ssl_mode(&v.origin, &v.text)?,
        (None, Some(_)) => SslMode::VerifyFull,
        (None, None) => SslMode::Prefer,
    };
    let verify = matches!(ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull);
    // libpq: PGSSLROOTCERT, else ~/.postgresql/root.crt. A root file makes prefer and
    // require check the chain too (libpq's rule); none at all is refused for verify-ca
    // (libpq's), and for verify-full means the system store (libpq: only with `system`).
    let ssl_root_cert = match get("sslrootcert") {
        Some(v) if v.text == "system" => None,
        Some(v) => {
            if !Path::new(&v.text).is_file() {
                if verify {
                    return Err(bad(
                        v,
                        "a readable PEM file with the CA that signed the server certificate, or `system` for the system's trust store (with sslmode=verify-full)",
                    ));
                }
                // libpq: a missing file under prefer/require means no verification.
                None
            } else {
                Some(PathBuf::from(&v.text))
            }
        }
        None => home.file(".postgresql/root.crt").filter(|p| p.is_file()),
    };
    if ssl_mode == SslMode::VerifyCa && ssl_root_cert.is_none() {
        let (origin, value) = get("sslmode").map_or(("PGSSLMODE", "verify-ca"), |v| {
            (v.origin.as_str(), v.text.as_str())
        });
        return Err(ConfigError::new(
            origin,
            value,
            "verify-ca only with a root certificate file: set PGSSLROOTCERT (or create ~/.postgresql/root.crt) with the CA that signed the server certificate; the system trust store is used only with verify-full, which also checks the host name",
        ));
    }
    let channel_binding = match get("channel_binding") {
        Some(v) => v
            .text
            .parse::<ChannelBinding>()
            .map_err(|_| bad(v, "disable, prefer or require"))?,
        None => ChannelBinding::Prefer,
    };
    let require_auth = match get("require_auth") {
        Some(v) => v.text.parse::<RequireAuth>().map_err(|e| {
            bad(
                v,
                format!(
                    "{}; expected a comma-separated list of password, md5, gss, sspi, scram-sha-256 and none, all negated with `!` or none of them",
                    e.reason
                ),
            )
        })?,
        None => RequireAuth::default(),
    };
    if channel_binding == ChannelBinding::Require && ssl_mode == SslMode::Disable {
        let v = get("channel_binding")
            .map_or_else(|| "PGCHANNELBINDING".to_owned(), |v| v.origin.clone());
        return Err(ConfigError::new(
            &v,
            "require",
            "channel binding needs TLS, and sslmode=disable turns it off: use sslmode=verify-full (or at least require)",
        ));
    }
    let ssl_cert = match get("sslcert") {
        Some(v) if !Path::new(&v.text).is_file() => {
            return Err(bad(v, "a readable PEM file with the client certificate"));
        }
        Some(v) => Some(PathBuf::from(&v.text)),
        None => home
            .file(".postgresql/postgresql.crt")
            .filter(|p| p.is_file()),
    };
    let ssl_client_cert = match ssl_cert {
        None => None,
        Some(cert) => {
            let key = match get("sslkey") {
                Some(v) => PathBuf::from(&v.text),
                None => home
                    .file(".postgresql/postgresql.key")
                    .unwrap_or_else(|| PathBuf::from("postgresql.key")),
            };
            if !key.is_file() {
                return Err(ConfigError::new(
                    get("sslkey").map_or("PGSSLKEY", |v| v.origin.as_str()),
                    &key.display().to_string(),
                    format!(
                        "the private key of the client certificate {} (a PEM file, mode 0600)",
                        cert.display()
                    ),
                ));
            }
            Some((cert, key))
        }
    };
    // Unset: the primary, which every subcommand wants; `run`, `init` and `check` narrow
    // the others (`wiring::connect_config`).
    let target_session_attrs = match get("target_session_attrs") {
        Some(v) => v.text.parse::<TargetSessionAttrs>().map_err(|_| {
            bad(
                v,
                "any, read-write, read-only, primary, standby or prefer-standby",
            )
        })?,
        None => TargetSessionAttrs::Primary,
    };
    let connect_timeout = match get("connect_timeout") {
        // libpq: 0 or negative waits forever, and less than 2 s is raised to 2 s.
        Some(v) => match v.text.trim().parse::<i64>() {
            Ok(n) if n <= 0 => Duration::from_secs(u64::from(u32::MAX)),
            Ok(n) => Duration::from_secs(n.max(2).unsigned_abs()),
            Err(_) => return Err(bad(v, "whole seconds")),
        },
        // outboxd's own default: libpq waits forever.
        None => Duration::from_secs(10),
    };
    Ok(ConnectConfig {
        host,
        port,
        other_hosts,
        user,
        password: get("password").map(|v| Password::new(v.text.as_str())),
        passfile: match get("passfile") {
            Some(v) => Some(PathBuf::from(&v.text)),
            None => home.file(".pgpass"),
        },
        dbname,
        ssl_mode,
        ssl_root_cert,
        channel_binding,
        require_auth,
        ssl_client_cert,
        target_session_attrs,
        connect_timeout,
        application_name: get("application_name")
            .map_or_else(|| "outboxd".to_owned(), |v| v.text.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home() -> Home {
        Home {
            os_user: Some("alice".into()),
            dir: Some(PathBuf::from("/nonexistent-home")),
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_libpqs() {
        let pg = resolve(&vars(&[]), &home()).unwrap();
        assert!(pg.host.starts_with('/'), "{}", pg.host);
        assert_eq!(pg.port, 5432);
        assert_eq!(pg.user, "alice");
        assert_eq!(pg.dbname, "alice");
        assert_eq!(
            pg.passfile.as_deref(),
            Some(Path::new("/nonexistent-home/.pgpass"))
        );
        assert_eq!(pg.ssl_mode, SslMode::Prefer);
        assert!(pg.ssl_root_cert.is_none() && pg.ssl_client_cert.is_none());
        assert_eq!(pg.target_session_attrs, TargetSessionAttrs::Primary);
    }

    #[test]
    fn host_and_port_lists() {
        let pg = resolve(&vars(&[("PGHOST", "a,b,c"), ("PGPORT", "1,,3")]), &home()).unwrap();
        assert_eq!((pg.host.as_str(), pg.port), ("a", 1));
        assert_eq!(pg.other_hosts, vec![("b".into(), 5432), ("c".into(), 3)]);
        let pg = resolve(&vars(&[("PGHOST", "a,b"), ("PGPORT", "7")]), &home()).unwrap();
        assert_eq!(pg.other_hosts, vec![("b".into(), 7)]);
        let e = resolve(&vars(&[("PGHOST", "a,b,c"), ("PGPORT", "1,2")]), &home()).unwrap_err();
        assert_eq!(e.var, "PGPORT");
        let pg = resolve(
            &vars(&[
                ("PGHOST", "ignored"),
                (
                    "OUTBOXD_DATABASE_URL",
                    "postgres://u@h1:11,h2:12/db?target_session_attrs=read-write",
                ),
            ]),
            &home(),
        )
        .unwrap();
        assert_eq!((pg.host.as_str(), pg.port), ("h1", 11));
        assert_eq!(pg.other_hosts, vec![("h2".into(), 12)]);
        assert_eq!(pg.target_session_attrs, TargetSessionAttrs::ReadWrite);
        let e = resolve(&vars(&[("PGTARGETSESSIONATTRS", "master")]), &home()).unwrap_err();
        assert_eq!(e.var, "PGTARGETSESSIONATTRS");
    }

    #[test]
    fn service_file_beats_variables_and_url_beats_service() {
        let dir = std::env::temp_dir().join(format!("outboxd-svc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("services.conf");
        std::fs::write(
            &file,
            "# test\n[other]\nhost=wrong\n[shop]\nhost=svc.example\nport=6000\ndbname=shop\n",
        )
        .unwrap();
        let f = file.display().to_string();
        let pg = resolve(
            &vars(&[
                ("PGSERVICE", "shop"),
                ("PGSERVICEFILE", &f),
                ("PGHOST", "env.example"),
                ("PGUSER", "bob"),
            ]),
            &home(),
        )
        .unwrap();
        assert_eq!(
            (
                pg.host.as_str(),
                pg.port,
                pg.dbname.as_str(),
                pg.user.as_str()
            ),
            ("svc.example", 6000, "shop", "bob")
        );
        let pg = resolve(
            &vars(&[
                ("PGSERVICEFILE", &f),
                (
                    "OUTBOXD_DATABASE_URL",
                    "postgresql://url.example/x?service=shop",
                ),
            ]),
            &home(),
        )
        .unwrap();
        assert_eq!((pg.host.as_str(), pg.dbname.as_str()), ("url.example", "x"));
        let e = resolve(
            &vars(&[("PGSERVICE", "nope"), ("PGSERVICEFILE", &f)]),
            &home(),
        )
        .unwrap_err();
        assert_eq!(e.var, "PGSERVICE");
        assert!(e.to_string().contains("services.conf"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn explicit_client_certificate_must_exist() {
        let e = resolve(&vars(&[("PGSSLCERT", "/no/such.crt")]), &home()).unwrap_err();
        assert_eq!(e.var, "PGSSLCERT");
        let pg = resolve(
            &vars(&[("PGSSLROOTCERT", "system"), ("PGSSLMODE", "verify-full")]),
            &home(),
        )
        .unwrap();
        assert!(pg.ssl_root_cert.is_none());
    }

    #[test]
    fn channel_binding_and_require_auth_from_variables_and_url() {
        let pg = resolve(&vars(&[]), &home()).unwrap();
        assert_eq!(pg.channel_binding, ChannelBinding::Prefer);
        assert!(!pg.require_auth.is_set());
        let pg = resolve(
            &vars(&[
                ("PGCHANNELBINDING", "require"),
                ("PGREQUIREAUTH", "!password,!md5"),
            ]),
            &home(),
        )
        .unwrap();
        assert_eq!(pg.channel_binding, ChannelBinding::Require);
        assert!(!pg.require_auth.allows(pgrepl::AuthMethod::Password));
        let pg = resolve(
            &vars(&[(
                "OUTBOXD_DATABASE_URL",
                "postgres://u@h/db?channel_binding=disable&require_auth=scram-sha-256",
            )]),
            &home(),
        )
        .unwrap();
        assert_eq!(pg.channel_binding, ChannelBinding::Disable);
        assert!(!pg.require_auth.allows(pgrepl::AuthMethod::None));
        for (k, v) in [
            ("PGCHANNELBINDING", "yes"),
            ("PGREQUIREAUTH", "scram"),
            ("PGREQUIREAUTH", "md5,!password"),
        ] {
            let e = resolve(&vars(&[(k, v)]), &home()).unwrap_err();
            assert_eq!(e.var, k, "{e}");
        }
        let e = resolve(
            &vars(&[("PGCHANNELBINDING", "require"), ("PGSSLMODE", "disable")]),
            &home(),
        )
        .unwrap_err();
        assert_eq!(e.var, "PGCHANNELBINDING", "{e}");
    }

    #[test]
    fn libpq_settings_outboxd_does_not_honour_are_refused() {
        for (k, v) in [
            ("PGGSSENCMODE", "require"),
            ("PGSSLNEGOTIATION", "direct"),
            ("PGSSLCRL", "/etc/crl.pem"),
            ("PGSSLMINPROTOCOLVERSION", "TLSv1.3"),
            ("PGOPTIONS", "-c search_path=x"),
            ("PGHOSTADDR", "10.0.0.1"),
            ("PGREQUIREPEER", "postgres"),
            ("PGLOADBALANCEHOSTS", "random"),
        ] {
            let e = resolve(&vars(&[(k, v)]), &home()).unwrap_err();
            assert_eq!(e.var, k, "{e}");
            assert!(e.accepts.contains(&format!("unset {k}")), "{e}");
        }
        // What outboxd does anyway is accepted.
        for (k, v) in [
            ("PGGSSENCMODE", "disable"),
            ("PGGSSENCMODE", "prefer"),
            ("PGSSLNEGOTIATION", "postgres"),
            ("PGLOADBALANCEHOSTS", "disable"),
        ] {
            resolve(&vars(&[(k, v)]), &home()).unwrap();
        }
        let e = resolve(
            &vars(&[(
                "OUTBOXD_DATABASE_URL",
                "postgres://h/db?sslnegotiation=direct",
            )]),
            &home(),
        )
        .unwrap_err();
        assert!(e.var.contains("sslnegotiation"), "{e}");
        resolve(
            &vars(&[("OUTBOXD_DATABASE_URL", "postgres://h/db?gssencmode=disable")]),
            &home(),
        )
        .unwrap();
    }

    #[test]
    fn tls_modes_as_libpq_16() {
        // sslrootcert=system: verify-full by default, anything weaker refused.
        let pg = resolve(&vars(&[("PGSSLROOTCERT", "system")]), &home()).unwrap();
        assert_eq!(pg.ssl_mode, SslMode::VerifyFull);
        for mode in ["require", "verify-ca", "prefer", "disable"] {
            let e = resolve(
                &vars(&[("PGSSLROOTCERT", "system"), ("PGSSLMODE", mode)]),
                &home(),
            )
            .unwrap_err();
            assert_eq!(e.var, "PGSSLMODE", "{mode}: {e}");
        }
        // verify-ca needs a root file; verify-full without one uses the system store.
        let e = resolve(&vars(&[("PGSSLMODE", "verify-ca")]), &home()).unwrap_err();
        assert_eq!(e.var, "PGSSLMODE");
        assert!(e.accepts.contains("PGSSLROOTCERT"), "{e}");
        let pg = resolve(&vars(&[("PGSSLMODE", "verify-full")]), &home()).unwrap();
        assert!(pg.ssl_root_cert.is_none());
        // require with a missing root file: no verification, as libpq.
        let pg = resolve(
            &vars(&[
                ("PGSSLMODE", "require"),
                ("PGSSLROOTCERT", "/no/such/root.crt"),
            ]),
            &home(),
        )
        .unwrap();
        assert!(pg.ssl_root_cert.is_none());
    }
}
