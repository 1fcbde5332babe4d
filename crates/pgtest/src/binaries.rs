//! Locating the PostgreSQL server binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::PgTestError;

/// A bin directory holding at least a server's `initdb`, `pg_ctl` and `postgres`.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub bindir: PathBuf,
}

impl PgBinaries {
    /// The program `name`: from the server's bin directory, or, for client tools that a
    /// server-only build lacks (psql, pg_recvlogical, pg_basebackup), the newest one the
    /// system has. Clients of one major talk to servers of other majors.
    pub fn tool(&self, name: &str) -> PathBuf {
        let own = self.bindir.join(name);
        if own.is_file() {
            return own;
        }
        debian_bindirs()
            .into_iter()
            .rev()
            .map(|(_, dir)| dir.join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(name))
    }
}

/// Where `scripts/install-deps --pg-versions` unpacks each major.
pub const DEFAULT_PG_ROOT: &str = "/opt/outboxd-pg";

fn has_initdb(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// `/usr/lib/postgresql/<major>/bin` directories with a server, oldest first.
fn debian_bindirs() -> Vec<(u32, PathBuf)> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.is_dir().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
}

/// The bin directory of one major: `$OUTBOXD_PG_ROOT/<major>/bin` (the version matrix's
/// binaries), else Debian's `/usr/lib/postgresql/<major>/bin`.
pub fn bindir_for_major(major: u32) -> Option<PathBuf> {
    let root = std::env::var_os("OUTBOXD_PG_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PG_ROOT));
    [
        root.join(major.to_string()).join("bin"),
        PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")),
    ]
    .into_iter()
    .find(|d| has_initdb(d))
}

/// Finds the server binaries. A test run may pick a version, and then gets exactly that
/// one or an error, never a silent fallback that would make a matrix run test the default
/// version twice:
/// - `OUTBOXD_TEST_PG_BIN=/dir/bin`: that directory;
/// - `OUTBOXD_TEST_PG_VERSION=17`: that major ([`bindir_for_major`]).
///
/// Otherwise `PG_BINDIR`, then `pg_config --bindir`, then the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps server binaries off the PATH).
pub fn find_bindir() -> Result<PgBinaries, PgTestError> {
    if let Some(dir) = std::env::var_os("OUTBOXD_TEST_PG_BIN").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if has_initdb(&dir) {
            Ok(PgBinaries { bindir: dir })
        } else {
            Err(PgTestError::Requested(format!(
                "OUTBOXD_TEST_PG_BIN={} has no initdb and pg_ctl",
                dir.display()
            )))
        };
    }
    if let Ok(v) = std::env::var("OUTBOXD_TEST_PG_VERSION") {
        if !v.is_empty() {
            let major: u32 = v.trim().parse().map_err(|_| {
                PgTestError::Requested(format!(
                    "OUTBOXD_TEST_PG_VERSION={v:?} is not a major version like 17"
                ))
            })?;
            return bindir_for_major(major)
                .map(|bindir| PgBinaries { bindir })
                .ok_or_else(|| {
                    PgTestError::Requested(format!(
                        "OUTBOXD_TEST_PG_VERSION={major}: no server binaries in \
                         $OUTBOXD_PG_ROOT/{major}/bin (default {DEFAULT_PG_ROOT}) or \
                         /usr/lib/postgresql/{major}/bin; run scripts/install-deps --pg-versions {major}"
                    ))
                });
        }
    }
    if let Ok(dir) = std::env::var("PG_BINDIR") {
        let dir = PathBuf::from(dir);
        if has_initdb(&dir) {
            return Ok(PgBinaries { bindir: dir });
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_initdb(&dir) {
            return Ok(PgBinaries { bindir: dir });
        }
    }
    debian_bindirs()
        .into_iter()
        .rev()
        .find(|(_, bin)| has_initdb(bin))
        .map(|(_, bindir)| PgBinaries { bindir })
        .ok_or(PgTestError::NoBinaries)
}
