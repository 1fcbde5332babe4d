//! Starting, restarting and stopping one throwaway cluster.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use tempfile::TempDir;

use crate::binaries::{find_bindir, PgBinaries};

#[derive(Debug, thiserror::Error)]
pub enum PgTestError {
    #[error("PostgreSQL server binaries not found (PG_BINDIR, pg_config --bindir, /usr/lib/postgresql/*/bin): {}", self.remedy().unwrap_or_default())]
    NoBinaries,
    /// The version the run asked for is not installed.
    #[error("{0}")]
    Requested(String),
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("io error during {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl PgTestError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            PgTestError::NoBinaries => {
                String::from("install them with `apt-get install -y postgresql` or set PG_BINDIR")
            }
            _ => return None,
        };
        Some(text)
    }
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> PgTestError {
    move |source| PgTestError::Io { what, source }
}

/// Extra settings for a dedicated cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Extra postgresql.conf lines (appended, so they win over the defaults).
    pub conf: Vec<String>,
    /// pg_hba.conf lines placed before the default trust lines.
    pub hba: Vec<String>,
    /// Files written into the data directory before start (e.g. server.crt/server.key),
    /// owned by the server user with mode 0600.
    pub files: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    Fast,
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A running cluster. Dropping it stops the server and removes its directory.
#[derive(Debug)]
pub struct PgCluster {
    bins: PgBinaries,
    dir: TempDir,
    data_dir: PathBuf,
    port: u16,
    /// The server's major version (14, 15, …), from `postgres --version`.
    major: u32,
    /// `Some(user)` when we are root and the server runs as that user (initdb refuses root).
    run_as: Option<String>,
    /// Extra environment of the server process, see [`PgCluster::start_with_server_env`].
    env: Vec<(String, String)>,
}

const SUPERUSER: &str = "postgres";

impl PgCluster {
    /// One cluster per test binary, started on first use with default options.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| match PgCluster::start(ClusterOptions::default()) {
            Ok(c) => c,
            Err(e) => panic!("cannot start the test PostgreSQL cluster: {e}"),
        })
    }

    /// A dedicated cluster, e.g. for custom pg_hba.conf, TLS or restart tests.
    pub fn start(opts: ClusterOptions) -> Result<PgCluster, PgTestError> {
        PgCluster::start_with_server_env(opts, Vec::new())
    }

    /// [`start`](PgCluster::start) with extra environment for the server process: set on
    /// every `pg_ctl` this cluster (and any copy of it) runs, which the postmaster and its
    /// backends inherit; the tests' own processes and the relay do not see it. E.g.
    /// `LD_PRELOAD` of libfaketime with `FAKETIME_TIMESTAMP_FILE`, to move the server's
    /// clock and nothing else's. (A separate constructor rather than a `ClusterOptions`
    /// field, so the struct literals that spell out every field keep compiling.)
    pub fn start_with_server_env(
        opts: ClusterOptions,
        env: Vec<(String, String)>,
    ) -> Result<PgCluster, PgTestError> {
        let bins = find_bindir()?;
        let major = server_major(&bins)?;
        let dir = tempfile::Builder::new()
            .prefix("outboxd-pg-")
            .tempdir()
            .map_err(io("creating the cluster directory"))?;
        let run_as = server_user()?;
        if let Some(user) = &run_as {
            chown_to(dir.path(), user)?;
        }
        let data_dir = dir.path().join("data");
        let cluster = PgCluster {
            bins,
            dir,
            data_dir,
            port: 0,
            major,
            run_as,
            env,
        };
        cluster.run(
            "initdb",
            &[
                "-D",
                path_str(&cluster.data_dir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        cluster.write_config(&opts)?;
        cluster.start_on_free_port()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn superuser(&self) -> &str {
        SUPERUSER
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn bindir(&self) -> &Path {
        &self.bins.bindir
    }

    /// A PostgreSQL program (`pg_recvlogical`, `psql`, …): the server's own, or the
    /// system's client tool when the server's bin directory has none.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bins.tool(name)
    }

    /// The server's major version, e.g. 17: tests of version-specific features gate on it.
    pub fn major_version(&self) -> u32 {
        self.major
    }

    /// `host=… port=… user=postgres dbname=…` for tokio-postgres / libpq.
    pub fn conn_string(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user={} dbname={}",
            self.host(),
            self.port,
            SUPERUSER,
            dbname
        )
    }

    /// A superuser SQL connection over TCP (trust). Panics with the cause if it cannot connect.
    pub async fn admin_client(&self, dbname: &str) -> tokio_postgres::Client {
        match tokio_postgres::connect(&self.conn_string(dbname), tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                client
            }
            Err(e) => panic!(
                "cannot connect to the test cluster on port {}: {e}",
                self.port
            ),
        }
    }

    pub fn restart(&self, mode: StopMode) -> Result<(), PgTestError> {
        self.pg_ctl(&["restart", "-w", "-t", "60", "-m", mode.as_arg()])
    }

    pub fn stop(&self, mode: StopMode) -> Result<(), PgTestError> {
        self.pg_ctl(&["stop", "-w", "-t", "60", "-m", mode.as_arg()])
    }

    pub fn start_again(&self) -> Result<(), PgTestError> {
        self.pg_ctl(&["start", "-w", "-t", "60"])
    }

    /// Promotes a standby to primary and waits until it accepts writes.
    pub fn promote(&self) -> Result<(), PgTestError> {
        self.pg_ctl(&["promote", "-w", "-t", "60"])
    }

    /// A streaming standby of this cluster, made as a cold copy of its data directory
    /// (the server binaries we may run have no pg_basebackup): the primary is stopped
    /// (fast), copied and started again. The standby streams over `primary_slot_name`
    /// (a physical slot the caller created on the primary before), with `dbname` in
    /// `primary_conninfo` and `hot_standby_feedback` on, which PG17 slot sync needs;
    /// `opts.conf` adds settings (e.g. `sync_replication_slots = on`).
    pub fn start_standby(
        &self,
        primary_slot_name: &str,
        opts: ClusterOptions,
    ) -> Result<PgCluster, PgTestError> {
        let standby = self.cold_copy("outboxd-pg-standby-", false)?;
        let sock = path_str(standby.dir.path()).to_owned();
        let mut conf = format!(
            "\n# outboxd test standby\nunix_socket_directories = '{sock}'\nhot_standby = on\n\
             hot_standby_feedback = on\nprimary_slot_name = '{primary_slot_name}'\n\
             primary_conninfo = 'host={} port={} user={SUPERUSER} dbname=postgres application_name=standby'\n",
            self.host(),
            self.port
        );
        for line in &opts.conf {
            conf.push_str(line);
            conf.push('\n');
        }
        append(&standby.data_dir.join("postgresql.conf"), &conf)?;
        let signal = standby.data_dir.join("standby.signal");
        std::fs::write(&signal, "").map_err(io("writing standby.signal"))?;
        if let Some(user) = &standby.run_as {
            chown_to(&signal, user)?;
        }
        standby.start_on_free_port()
    }

    /// A copy of this cluster's data directory, not started: the primary is stopped
    /// (fast), copied and started again. `keep_slots` false removes the copied slots.
    fn cold_copy(&self, prefix: &str, keep_slots: bool) -> Result<PgCluster, PgTestError> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(io("creating the copy's directory"))?;
        if let Some(user) = &self.run_as {
            chown_to(dir.path(), user)?;
        }
        let data_dir = dir.path().join("data");
        // The default lines say `all`, which does not cover physical replication.
        append(
            &self.data_dir.join("pg_hba.conf"),
            "host replication all 127.0.0.1/32 trust\n",
        )?;
        self.stop(StopMode::Fast)?;
        let copied = self.run("cp", &["-a", path_str(&self.data_dir), path_str(&data_dir)]);
        self.start_again()?;
        copied?;
        if !keep_slots {
            // The primary's slots are not the standby's: a copied logical slot of the same
            // name would block slot sync ("already exists"), and a copied physical slot
            // would hold WAL on the standby for nobody.
            for entry in std::fs::read_dir(data_dir.join("pg_replslot"))
                .map_err(io("listing the copied slots"))?
                .flatten()
            {
                std::fs::remove_dir_all(entry.path()).map_err(io("removing a copied slot"))?;
            }
        }
        let _ = std::fs::remove_file(data_dir.join("postmaster.pid"));
        Ok(PgCluster {
            bins: self.bins.clone(),
            dir,
            data_dir,
            port: 0,
            major: self.major,
            run_as: self.run_as.clone(),
            env: self.env.clone(),
        })
    }

    /// A point-in-time restore of this cluster as it is now, slots included, running as
    /// a primary of its own: a cold copy started with `recovery.signal` and no archive,
    /// so recovery ends at the end of the copied WAL and the copy continues on a new
    /// timeline that forks there (same system identifier). This cluster keeps running
    /// on its old timeline; what it writes from now on is not in the copy's history.
    pub fn restore_copy(&self) -> Result<PgCluster, PgTestError> {
        let copy = self.cold_copy("outboxd-pg-restore-", true)?;
        let sock = path_str(copy.dir.path()).to_owned();
        let conf = format!(
            "\n# outboxd test restore\nunix_socket_directories = '{sock}'\nrestore_command = 'false'\n"
        );
        append(&copy.data_dir.join("postgresql.conf"), &conf)?;
        let signal = copy.data_dir.join("recovery.signal");
        std::fs::write(&signal, "").map_err(io("writing recovery.signal"))?;
        if let Some(user) = &copy.run_as {
            chown_to(&signal, user)?;
        }
        copy.start_on_free_port()
    }

    /// A second live primary with this cluster's history: a cold copy of the data
    /// directory, slots included, started as a primary of its own on the same timeline
    /// (no `recovery.signal`: it simply starts up from the copied WAL). Both clusters then
    /// share the system identifier and timeline and write different WAL at the same
    /// positions (a disk snapshot or backup brought up next to, or instead of, the
    /// original). This cluster is stopped (fast) for the copy and started again.
    pub fn live_copy(&self) -> Result<PgCluster, PgTestError> {
        let copy = self.cold_copy("outboxd-pg-copy-", true)?;
        let sock = path_str(copy.dir.path()).to_owned();
        let conf = format!("\n# outboxd test live copy\nunix_socket_directories = '{sock}'\n");
        append(&copy.data_dir.join("postgresql.conf"), &conf)?;
        copy.start_on_free_port()
    }

    /// Runs one SQL string with psql as the superuser; returns unaligned tuples-only output.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, PgTestError> {
        let out = Command::new(self.bins.tool("psql"))
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", self.host(), "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", db, "-c", sql])
            .output()
            .map_err(io("running psql"))?;
        if !out.status.success() {
            return Err(PgTestError::Command {
                what: format!("psql {sql:?}"),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    }

    /// The server log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn write_config(&self, opts: &ClusterOptions) -> Result<(), PgTestError> {
        let sock = path_str(self.dir.path());
        let mut conf = format!(
            "\n# outboxd test cluster\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{sock}'\n\
             wal_level = logical\nmax_replication_slots = 256\nmax_wal_senders = 64\nmax_connections = 300\n\
             fsync = off\nfull_page_writes = off\nshared_buffers = 128MB\n\
             log_min_messages = warning\nlog_connections = off\n"
        );
        for line in &opts.conf {
            conf.push_str(line);
            conf.push('\n');
        }
        append(&self.data_dir.join("postgresql.conf"), &conf)?;
        let mut hba = String::new();
        for line in &opts.hba {
            hba.push_str(line);
            hba.push('\n');
        }
        hba.push_str(
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n",
        );
        std::fs::write(self.data_dir.join("pg_hba.conf"), hba)
            .map_err(io("writing pg_hba.conf"))?;
        for (name, bytes) in &opts.files {
            let path = self.data_dir.join(name);
            std::fs::write(&path, bytes).map_err(io("writing a data-dir file"))?;
            set_mode_0600(&path)?;
            if let Some(user) = &self.run_as {
                chown_to(&path, user)?;
            }
        }
        Ok(())
    }

    /// Starts the server on a free loopback port and watches it. The port is probed then
    /// released; a rare collision is retried with a new one.
    fn start_on_free_port(mut self) -> Result<PgCluster, PgTestError> {
        let mut last_err = None;
        for _ in 0..5 {
            self.port = free_port()?;
            self.write_port()?;
            match self.pg_ctl(&["start", "-w", "-t", "60"]) {
                Ok(()) => {
                    self.spawn_watchdog()?;
                    return Ok(self);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(PgTestError::NoBinaries))
    }

    fn write_port(&self) -> Result<(), PgTestError> {
        append(
            &self.data_dir.join("postgresql.conf"),
            &format!("port = {}\n", self.port),
        )
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), PgTestError> {
        let log = self.dir.path().join("server.log");
        let mut full = vec!["-D", path_str(&self.data_dir), "-l", path_str(&log)];
        full.extend_from_slice(args);
        let out = self
            .command("pg_ctl", &full)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .output()
            .map_err(io("running pg_ctl"));
        let result = out.and_then(|out| {
            if out.status.success() {
                Ok(())
            } else {
                Err(PgTestError::Command {
                    what: format!("pg_ctl {}", full.join(" ")),
                    detail: format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                })
            }
        });
        result.map_err(|e| match e {
            PgTestError::Command { what, detail } => PgTestError::Command {
                what,
                detail: format!("{detail}\nserver log:\n{}", self.log()),
            },
            other => other,
        })
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), PgTestError> {
        let out = self
            .command(tool, args)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running a PostgreSQL tool"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(PgTestError::Command {
                what: format!("{tool} {}", args.join(" ")),
                detail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            })
        }
    }

    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let program = self.bins.tool(tool);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program).args(args);
                c
            }
            None => {
                let mut c = Command::new(program);
                c.args(args);
                c
            }
        }
    }

    /// Statics are never dropped and a killed test process runs no destructors, so a small
    /// shell loop outlives us just long enough to stop the server and remove its files.
    fn spawn_watchdog(&self) -> Result<(), PgTestError> {
        let pg_ctl = self.bins.tool("pg_ctl");
        let stop = format!(
            "{} '{}' -D '{}' stop -m immediate",
            match &self.run_as {
                Some(u) => format!("runuser -u {u} --"),
                None => String::new(),
            },
            path_str(&pg_ctl),
            path_str(&self.data_dir),
        );
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = path_str(self.dir.path()),
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("spawning the cluster watchdog"))?;
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-w", "-t", "30", "-m", "immediate"]);
    }
}

/// `postgres (PostgreSQL) 17.10` → 17.
fn server_major(bins: &PgBinaries) -> Result<u32, PgTestError> {
    let out = Command::new(bins.tool("postgres"))
        .arg("--version")
        .output()
        .map_err(io("running postgres --version"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(2)
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| PgTestError::Command {
            what: format!("{} --version", bins.tool("postgres").display()),
            detail: format!("unexpected output {text:?}"),
        })
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or("/nonexistent-non-utf8-path")
}

fn append(path: &Path, text: &str) -> Result<(), PgTestError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(io("opening a config file"))?;
    f.write_all(text.as_bytes())
        .map_err(io("writing a config file"))
}

fn free_port() -> Result<u16, PgTestError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    Ok(l.local_addr().map_err(io("finding a free port"))?.port())
}

/// initdb and postgres refuse to run as root; as root we run them as `postgres`
/// (created by Debian's postgresql package) or a user we create.
fn server_user() -> Result<Option<String>, PgTestError> {
    let uid = std::fs::metadata("/proc/self")
        .map_err(io("reading the current uid"))?
        .uid();
    if uid != 0 {
        return Ok(None);
    }
    for user in ["postgres", "outboxd-pgtest"] {
        if uid_of(user).is_some() {
            return Ok(Some(user.to_owned()));
        }
    }
    let out = Command::new("useradd")
        .args(["--system", "--no-create-home", "outboxd-pgtest"])
        .output()
        .map_err(io("creating a user to run PostgreSQL"))?;
    if !out.status.success() && uid_of("outboxd-pgtest").is_none() {
        return Err(PgTestError::Command {
            what: "useradd outboxd-pgtest".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(Some("outboxd-pgtest".to_owned()))
}

fn uid_of(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        if f.next()? != user {
            return None;
        }
        let uid = f.nth(1)?.parse().ok()?;
        let gid = f.next()?.parse().ok()?;
        Some((uid, gid))
    })
}

fn chown_to(path: &Path, user: &str) -> Result<(), PgTestError> {
    let (uid, gid) = uid_of(user).ok_or_else(|| PgTestError::Command {
        what: format!("looking up user {user}"),
        detail: "not in /etc/passwd".into(),
    })?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io("chown"))
}

fn set_mode_0600(path: &Path) -> Result<(), PgTestError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io("chmod"))
}
