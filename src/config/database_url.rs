//! `OUTBOXD_DATABASE_URL`: a libpq-style URI, postgres://user:password@host:port/db?sslmode=...

use super::ConfigError;

const VAR: &str = "OUTBOXD_DATABASE_URL";
const ACCEPTS: &str = "postgres://user:password@host:port/dbname?sslmode=...&sslrootcert=...";

/// The URL's settings as libpq keywords (host and port as comma lists for several hosts).
pub fn parse(url: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let bad = || ConfigError::new(VAR, url, ACCEPTS);
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .ok_or_else(bad)?;
    let (authority, path_query) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes().get(i) == Some(&b'/') => (&rest[..i], &rest[i + 1..]),
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            out.push(("user".into(), percent_decode(user).ok_or_else(bad)?));
        }
        if let Some(p) = password {
            out.push(("password".into(), percent_decode(p).ok_or_else(bad)?));
        }
    }
    if !hostlist.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for hostport in hostlist.split(',') {
            let (host, port) = split_host_port(hostport).ok_or_else(bad)?;
            hosts.push(percent_decode(host).ok_or_else(bad)?);
            ports.push(port.unwrap_or("").to_owned());
        }
        if hosts.iter().any(|h| !h.is_empty()) {
            out.push(("host".into(), hosts.join(",")));
        }
        if ports.iter().any(|p| !p.is_empty()) {
            out.push(("port".into(), ports.join(",")));
        }
    }
    let (path, query) = match path_query.split_once('?') {
        Some((p, q)) => (p, q),
        None => (path_query, ""),
    };
    if !path.is_empty() {
        out.push(("dbname".into(), percent_decode(path).ok_or_else(bad)?));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let v = percent_decode(v).ok_or_else(bad)?;
        if super::libpq::is_not_honoured(k) {
            super::libpq::refuse_not_honoured(VAR, k, &v)?;
            continue;
        }
        if !super::libpq::accepts(k) {
            return Err(ConfigError::new(
                VAR,
                url,
                format!(
                    "{ACCEPTS} (unsupported parameter {k:?}; outboxd reads {})",
                    super::libpq::keyword_list()
                ),
            ));
        }
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(p))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    Some(match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
