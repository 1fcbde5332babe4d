//! CPU time and memory of processes, from /proc.

use std::path::Path;

use anyhow::{Context, Result};

/// Clock ticks per second for `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux).
pub fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0)
}

/// The fields of `/proc/<pid>/stat` after the command name: index 0 is field 3 (state).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.rsplit_once(')')?.1;
    Some(
        after
            .split_whitespace()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// (ppid, utime + stime, cutime + cstime) in clock ticks.
fn times(pid: u32) -> Option<(u64, u64, u64)> {
    let f = stat_fields(pid)?;
    // field 4 = ppid, 14 = utime, 15 = stime, 16 = cutime, 17 = cstime
    Some((*f.get(1)?, f.get(11)? + f.get(12)?, f.get(13)? + f.get(14)?))
}

/// utime + stime of one process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    times(pid).map(|(_, own, _)| ticks_to_secs(own))
}

fn ticks_to_secs(t: u64) -> f64 {
    // ticks fit f64 exactly far beyond any run length
    t as f64 / clk_tck()
}

/// CPU seconds used so far by a PostgreSQL cluster: the postmaster itself, its exited
/// (reaped) children through cutime/cstime, and its live children.
pub fn cluster_cpu_seconds(data_dir: &Path) -> Result<f64> {
    let pid_text = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .context("reading postmaster.pid")?;
    let pm: u32 = pid_text
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .parse()
        .context("parsing postmaster.pid")?;
    let (_, own, reaped) = times(pm).context("reading the postmaster's /proc/pid/stat")?;
    let mut total = own + reaped;
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, t, _)) = times(pid) {
            if ppid == u64::from(pm) {
                total += t;
            }
        }
    }
    Ok(ticks_to_secs(total))
}

/// VmHWM (peak resident set) in MiB.
pub fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_kib(pid, "VmHWM:").map(|k| k / 1024.0)
}

/// VmRSS (current resident set) in MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    status_kib(pid, "VmRSS:").map(|k| k / 1024.0)
}

fn status_kib(pid: u32, key: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Per-thread (name, cpu seconds, voluntary, involuntary context switches) of a process.
pub fn threads(pid: u32) -> Vec<(String, f64, u64, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let cpu = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            .ok()
            .and_then(|t| {
                let f: Vec<u64> = t
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .map(|x| x.parse().unwrap_or(0))
                    .collect();
                Some(ticks_to_secs(f.get(11)? + f.get(12)?))
            })
            .unwrap_or(0.0);
        out.push((
            field("Name:"),
            cpu,
            field("voluntary_ctxt_switches:").parse().unwrap_or(0),
            field("nonvoluntary_ctxt_switches:").parse().unwrap_or(0),
        ));
    }
    out
}
