//! Locating the PostgreSQL server binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::PgTestError;

/// Paths of the server programs a test cluster needs.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub bindir: PathBuf,
}

impl PgBinaries {
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }
}

/// Finds the directory holding `initdb`: `PG_BINDIR`, then `pg_config --bindir`, then the
/// newest `/usr/lib/postgresql/*/bin` (Debian keeps server binaries off the PATH).
pub fn find_bindir() -> Result<PgBinaries, PgTestError> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
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
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_initdb(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bindir)) => Ok(PgBinaries { bindir }),
        None => Err(PgTestError::NoBinaries),
    }
}
