//! The process's own metrics under the names Prometheus client libraries give them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...),
//! read from /proc at scrape time, and `outboxd_build_info`. Once per process, whatever
//! the number of shards. Where /proc is not there (not Linux), only the build info is.

use std::fmt::Write as _;

/// Clock ticks per second of /proc's CPU times: USER_HZ, which the kernel fixes at 100
/// in its ABI on every architecture outboxd builds for (it is not CONFIG_HZ).
const USER_HZ: u64 = 100;

/// What /proc says about this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub cpu_ticks: u64,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: u64,
    pub threads: u64,
    /// Seconds since the Unix epoch.
    pub start_time_secs: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcessSnapshot {
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let mut snapshot = parse_stat(&stat)?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        snapshot.resident_bytes = parse_vm_rss(&status);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_btime(&s));
        snapshot.start_time_secs = boot.map(|b| b + snapshot.start_time_secs.unwrap_or(0));
        snapshot.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| u64::try_from(d.count()).unwrap_or(u64::MAX));
        snapshot.max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| parse_max_fds(&l));
        Some(snapshot)
    }
}

/// `/proc/self/stat`: the fields after the command name, which is in parentheses and may
/// itself contain spaces and parentheses. `start_time_secs` is left relative to boot.
fn parse_stat(stat: &str) -> Option<ProcessSnapshot> {
    let (_, rest) = stat.rsplit_once(')')?;
    // Field 3 (state) is index 0 here: utime is field 14, stime 15, num_threads 20,
    // starttime 22, vsize 23 (proc(5)).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(ProcessSnapshot {
        cpu_ticks: number(11)?.saturating_add(number(12)?),
        threads: number(17)?,
        start_time_secs: Some(number(19)? / USER_HZ),
        virtual_bytes: number(20)?,
        ..ProcessSnapshot::default()
    })
}

/// `VmRSS:   12345 kB` of /proc/self/status (in bytes: no page size to know).
fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in /proc/self/limits (`unlimited`: none).
fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.strip_prefix("Max open files")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The exposition of the process metrics and the build info.
pub fn render(snapshot: Option<&ProcessSnapshot>) -> String {
    let mut out = String::with_capacity(1024);
    // Writing into a String cannot fail, hence the ignored fmt::Results.
    let _ = writeln!(
        out,
        "# HELP outboxd_build_info Always 1; the labels say which outboxd this is.\n\
         # TYPE outboxd_build_info gauge\n\
         outboxd_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        build_commit()
    );
    let mut family = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    };
    if let Some(p) = snapshot {
        family(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            format!("{}.{:02}", p.cpu_ticks / USER_HZ, p.cpu_ticks % USER_HZ),
        );
        if let Some(rss) = p.resident_bytes {
            family(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                rss.to_string(),
            );
        }
        family(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes.to_string(),
        );
        family(
            "process_threads",
            "gauge",
            "Number of OS threads (librdkafka runs several of its own).",
            p.threads.to_string(),
        );
        if let Some(start) = p.start_time_secs {
            family(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                start.to_string(),
            );
        }
        if let Some(open) = p.open_fds {
            family(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                open.to_string(),
            );
        }
        if let Some(max) = p.max_fds {
            family(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                max.to_string(),
            );
        }
    }
    out
}

/// The commit the binary was built from, when the build said (the image's build passes
/// `OUTBOXD_BUILD_COMMIT`); label values are restricted to a safe alphabet.
fn build_commit() -> String {
    option_env!("OUTBOXD_BUILD_COMMIT")
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (outboxd (x) y) S 1 4242 4242 0 -1 4194560 2500 0 3 0 \
                        150 27 0 0 20 0 7 0 123456 987654321 3000 18446744073709551615";

    #[test]
    fn parses_proc_files() {
        let p = parse_stat(STAT).unwrap_or_default();
        assert_eq!(p.cpu_ticks, 177);
        assert_eq!(p.threads, 7);
        assert_eq!(p.start_time_secs, Some(1234));
        assert_eq!(p.virtual_bytes, 987_654_321);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_vm_rss("Name:\toutboxd\nVmRSS:\t   11264 kB\nThreads: 7\n"),
            Some(11_264 * 1024)
        );
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[test]
    fn renders_the_usual_names() {
        let p = ProcessSnapshot {
            cpu_ticks: 177,
            resident_bytes: Some(11_534_336),
            virtual_bytes: 987_654_321,
            threads: 7,
            start_time_secs: Some(1_700_001_234),
            open_fds: Some(23),
            max_fds: Some(1024),
        };
        let text = render(Some(&p));
        for line in [
            "process_cpu_seconds_total 1.77",
            "process_resident_memory_bytes 11534336",
            "process_open_fds 23",
            "process_max_fds 1024",
            "process_start_time_seconds 1700001234",
            "# TYPE process_cpu_seconds_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        let build = format!(
            "outboxd_build_info{{version=\"{}\",",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build), "{text}");
        assert!(!render(None).contains("process_"));
        // The live process reads too.
        assert!(ProcessSnapshot::read().is_some_and(|p| p.open_fds > Some(0)));
    }
}
