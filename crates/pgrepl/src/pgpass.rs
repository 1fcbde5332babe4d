//! The password file (`~/.pgpass`, `PGPASSFILE`) with libpq's rules: lines
//! `host:port:database:user:password`, `*` matching anything in the first four fields,
//! `\:` and `\\` as escapes, `#` comments, the first matching line wins, and a file that
//! the group or others may access is ignored with a warning.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// A Unix-socket directory is matched as `localhost`, as libpq does.
fn match_host(host: &str) -> &str {
    if host.is_empty() || host.starts_with('/') {
        "localhost"
    } else {
        host
    }
}

/// The password for this target from the file's text.
pub(crate) fn lookup_in(
    text: &str,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    let port = port.to_string();
    let wanted = [match_host(host), port.as_str(), dbname, user];
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find_map(|line| {
            let fields = split_fields(line)?;
            let matches = fields
                .iter()
                .take(4)
                .zip(wanted)
                .all(|(field, want)| field == "*" || field == want);
            matches.then(|| fields.get(4).cloned()).flatten()
        })
}

/// Splits a line into its five fields, unescaping `\:` and `\\`. libpq keeps an unknown
/// escape's character and drops the backslash; so does this. An unescaped colon ends the
/// password too (libpq ignores what follows).
fn split_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::with_capacity(5);
    let mut current = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            ':' if fields.len() < 4 => fields.push(std::mem::take(&mut current)),
            ':' => break,
            c => current.push(c),
        }
    }
    fields.push(current);
    (fields.len() == 5).then_some(fields)
}

/// Warned once per process: a standby connects every few seconds.
static WARNED: AtomicBool = AtomicBool::new(false);

fn warn_once(message: String) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("{message}");
    }
}

/// The password for this target from `path`, or `None` when the file is absent,
/// unreadable, not a plain file, open to group or others (warned), or has no match.
pub(crate) fn lookup(
    path: &Path,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        warn_once(format!(
            "password file {} is not a plain file; ignored",
            path.display()
        ));
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            warn_once(format!(
                "password file {} has group or world access; permissions should be u=rw (0600) or less; ignored",
                path.display()
            ));
            return None;
        }
    }
    let text = std::fs::read_to_string(path).ok()?;
    lookup_in(&text, host, port, dbname, user)
}

#[cfg(test)]
mod tests {
    use super::lookup_in;

    #[test]
    fn first_matching_line_wins_with_wildcards() {
        let file = "# comment\n\
                    db1.example:5432:shop:alice:first\n\
                    *:5432:shop:alice:second\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            lookup_in(file, "db1.example", 5432, "shop", "alice").as_deref(),
            Some("first")
        );
        assert_eq!(
            lookup_in(file, "db2.example", 5432, "shop", "alice").as_deref(),
            Some("second")
        );
        assert_eq!(
            lookup_in(file, "db2.example", 6432, "shop", "alice").as_deref(),
            Some("fallback")
        );
        assert_eq!(lookup_in("a:1:b:c:d\n", "a", 2, "b", "c"), None);
    }

    #[test]
    fn escapes_and_sockets() {
        let file = "localhost:5432:d\\:b:u:pa\\:ss\\\\word:tail\r\n";
        assert_eq!(
            lookup_in(file, "/var/run/postgresql", 5432, "d:b", "u").as_deref(),
            Some("pa:ss\\word")
        );
        assert_eq!(lookup_in(file, "127.0.0.1", 5432, "d:b", "u"), None);
        // Fewer than five fields: not a line libpq would use.
        assert_eq!(lookup_in("a:b:c:d\n", "a", 1, "c", "d"), None);
    }
}
