//! `BENCH_SECTIONS=ratios`: issue 21's four ratios of outboxd to pg_recvlogical, from
//! one run, with the machine's load beside each.
//!
//! 1. the primary's extra CPU at 2,000 events/s in 10-row transactions (text and binary
//!    values; also the walsender alone), 2. catch-up events/s per shape and peak RSS,
//! 3. the client's own CPU per event at 1,000 and 5,000 single-row events/s, 4. the
//!    commit→receive p99. Every build (this one, and BENCH_RATIOS_COMPARE's) runs in the
//!    same alternation, so one run gives the ratios before and after a change.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use pgtest::PgCluster;

use crate::drain::DrainResult;
use crate::steady::{self, Load, Plan, SteadyRun, Tool, LOAD_ONLY, RECVLOGICAL, RECVLOGICAL_PIPED};
use crate::{CaseResult, Settings};

/// What a ratio must be for the issue to count it as met.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// outboxd / pg_recvlogical ≤ x.
    AtMost(f64),
    /// outboxd / pg_recvlogical ≥ x.
    AtLeast(f64),
    /// outboxd ≤ pg_recvlogical + x (ms); the "ratio" is the difference.
    PlusMs(f64),
    /// outboxd's value itself ≤ x MiB.
    MiB(f64),
    /// Shown, not judged.
    Info,
}

impl Goal {
    fn combine(self, outboxd: f64, reference: f64) -> Option<f64> {
        match self {
            Goal::PlusMs(_) => Some(outboxd - reference),
            _ => (reference > 0.0).then(|| outboxd / reference),
        }
    }

    fn met(self, outboxd: Option<f64>, ratio: Option<f64>) -> Option<bool> {
        match self {
            Goal::AtMost(g) | Goal::PlusMs(g) => ratio.map(|r| r <= g),
            Goal::AtLeast(g) => ratio.map(|r| r >= g),
            Goal::MiB(g) => outboxd.map(|v| v <= g),
            Goal::Info => None,
        }
    }

    fn text(self) -> String {
        match self {
            Goal::AtMost(g) => format!("≤ {g:.1}"),
            Goal::AtLeast(g) => format!("≥ {g:.1}"),
            Goal::PlusMs(g) => format!("≤ ref + {g:.0} ms"),
            Goal::MiB(g) => format!("outboxd ≤ {g:.0} MiB"),
            Goal::Info => "–".into(),
        }
    }

    fn ratio_text(self, r: Option<f64>) -> String {
        match (self, r) {
            (_, None) => "–".into(),
            (Goal::PlusMs(_), Some(d)) => format!("{d:+.1} ms"),
            (_, Some(r)) => format!("{r:.2}"),
        }
    }
}

/// One build's numbers for one measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Means over the repeats.
    pub outboxd: Option<f64>,
    pub reference: Option<f64>,
    pub per_repeat: Vec<Option<f64>>,
    /// Mean of the per-repeat ratios.
    pub mean: Option<f64>,
    pub met: Option<bool>,
}

fn mean(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// A cell from each repeat's (outboxd, pg_recvlogical) values.
pub fn cell(goal: Goal, pairs: &[(Option<f64>, Option<f64>)]) -> Cell {
    let per_repeat: Vec<Option<f64>> = pairs
        .iter()
        .map(|(o, r)| o.zip(*r).and_then(|(o, r)| goal.combine(o, r)))
        .collect();
    let m = mean(per_repeat.iter().copied());
    let outboxd = mean(pairs.iter().map(|p| p.0));
    Cell {
        outboxd,
        reference: mean(pairs.iter().map(|p| p.1)),
        per_repeat,
        mean: m,
        met: goal.met(outboxd, m),
    }
}

/// One row of the table: a measure, the load of the part it came from, one cell per build.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub measure: String,
    /// The load during the parts it came from (first part's start → last part's end).
    pub part: String,
    /// Until `rows` fills in `part`: the names of those parts.
    span: (String, String),
    pub goal: Goal,
    /// Digits of the values.
    pub digits: usize,
    pub cells: Vec<Cell>,
}

/// A part of the run (one catch-up case or one steady load) and /proc/loadavg's first
/// three fields at its start and end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub before: String,
    pub after: String,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The 1-minute load at the start of part `from` → the end of part `to`.
fn load_cell(parts: &[Part], from: &str, to: &str) -> String {
    let first = |l: &str| l.split_whitespace().next().unwrap_or("?").to_owned();
    let find = |name: &str| parts.iter().find(|p| p.name == name);
    match (find(from), find(to)) {
        (Some(a), Some(b)) => format!("{} → {}", first(&a.before), first(&b.after)),
        _ => "–".into(),
    }
}

/// The section's bounds in the report, so a ratios run replaces only its own table.
const BEGIN: &str = "<!-- ratios:begin -->";
const END: &str = "<!-- ratios:end -->";

const PRIMARY: Load = Load {
    rate: 2000,
    rows: 10,
};
const STEADY_1K: Load = Load {
    rate: 1000,
    rows: 1,
};
const STEADY_5K: Load = Load {
    rate: 5000,
    rows: 1,
};

fn steady_part(load: Load) -> String {
    format!("steady {}x{}", load.rate, load.rows)
}

fn per_event(v: f64, events: u64) -> f64 {
    v / events.max(1) as f64
}

/// Each repeat's (outboxd, `reference`) values of `metric` at `load`; the metric sees
/// the run and the load-only run of the same repeat.
fn steady_pairs(
    runs: &[SteadyRun],
    load: Load,
    outboxd: &str,
    reference: &str,
    metric: impl Fn(&SteadyRun, Option<&SteadyRun>) -> Option<f64>,
) -> Vec<(Option<f64>, Option<f64>)> {
    let mut repeats: Vec<u32> = runs
        .iter()
        .filter(|r| r.load == load)
        .map(|r| r.repeat)
        .collect();
    repeats.sort_unstable();
    repeats.dedup();
    repeats
        .into_iter()
        .map(|rep| {
            let find = |tool: &str| {
                runs.iter()
                    .find(|r| r.load == load && r.repeat == rep && r.tool == tool)
            };
            let base = find(LOAD_ONLY);
            let value = |tool: &str| find(tool).and_then(|r| metric(r, base));
            (value(outboxd), value(reference))
        })
        .collect()
}

fn extra_pg_cpu(run: &SteadyRun, base: Option<&SteadyRun>) -> Option<f64> {
    base.map(|b| (per_event(run.pg_cpu, run.events) - per_event(b.pg_cpu, b.events)) * 1e5)
}

fn walsender_cpu(run: &SteadyRun, _: Option<&SteadyRun>) -> Option<f64> {
    run.walsender_cpu.map(|c| per_event(c, run.events) * 1e5)
}

fn client_cpu_us(run: &SteadyRun, _: Option<&SteadyRun>) -> Option<f64> {
    run.tool_cpu.map(|c| per_event(c, run.events) * 1e6)
}

fn p99(run: &SteadyRun, _: Option<&SteadyRun>) -> Option<f64> {
    run.p99
}

fn ok(d: &DrainResult) -> bool {
    !d.note.starts_with("FAILED") && d.seconds > 0.0
}

/// outboxd's drain (this build is labelled "outboxd", others by their label) and the
/// faster of the pg_recvlogical drains.
fn catchup_drains<'a>(
    case: &'a CaseResult,
    label: &str,
) -> (Option<&'a DrainResult>, Option<&'a DrainResult>) {
    let o = case
        .drains
        .iter()
        .find(|d| d.tool == label && d.broker != "-" && ok(d));
    let r = case
        .drains
        .iter()
        .filter(|d| d.tool.starts_with(RECVLOGICAL) && ok(d))
        .max_by(|a, b| a.events_per_sec().total_cmp(&b.events_per_sec()));
    (o, r)
}

/// Every row of the table, in the order.
pub fn rows(
    labels: &[String],
    cases: &[CaseResult],
    runs: &[SteadyRun],
    parts: &[Part],
) -> Vec<Row> {
    let mut out = Vec::new();
    let steady_row =
        |measure: &str,
         load: Load,
         text: bool,
         goal: Goal,
         digits: usize,
         metric: fn(&SteadyRun, Option<&SteadyRun>) -> Option<f64>| {
            // Latency from the pg_recvlogical whose output the bench reads, CPU from the
            // one writing to /dev/null (the pipe costs it CPU).
            let reference = if matches!(goal, Goal::PlusMs(_)) {
                RECVLOGICAL_PIPED
            } else {
                RECVLOGICAL
            };
            let cells = labels
                .iter()
                .map(|l| {
                    let tool = if text {
                        steady::text_label(l)
                    } else {
                        l.clone()
                    };
                    cell(goal, &steady_pairs(runs, load, &tool, reference, metric))
                })
                .collect();
            Row {
                measure: format!("{measure}, {}", load.label()),
                part: String::new(),
                span: (steady_part(load), steady_part(load)),
                goal,
                digits,
                cells,
            }
        };
    let cpu = "1. primary's extra CPU (s / 100k events)";
    out.push(steady_row(
        &format!("{cpu}, text values"),
        PRIMARY,
        true,
        Goal::AtMost(1.0),
        3,
        extra_pg_cpu,
    ));
    out.push(steady_row(
        &format!("{cpu}, binary values"),
        PRIMARY,
        false,
        Goal::Info,
        3,
        extra_pg_cpu,
    ));
    let ws = "1. walsender CPU (s / 100k events)";
    out.push(steady_row(
        &format!("{ws}, text values"),
        PRIMARY,
        true,
        Goal::Info,
        3,
        walsender_cpu,
    ));
    out.push(steady_row(
        &format!("{ws}, binary values"),
        PRIMARY,
        false,
        Goal::Info,
        3,
        walsender_cpu,
    ));
    for case in cases {
        let cells = labels
            .iter()
            .map(|l| {
                let (o, r) = catchup_drains(case, l);
                let rate = |d: Option<&DrainResult>| d.map(DrainResult::events_per_sec);
                cell(Goal::AtLeast(1.5), &[(rate(o), rate(r))])
            })
            .collect();
        out.push(Row {
            measure: format!("2. catch-up events/s, {}", case.label),
            part: String::new(),
            span: (catchup_part(&case.name), catchup_part(&case.name)),
            goal: Goal::AtLeast(1.5),
            digits: 0,
            cells,
        });
    }
    if let (Some(first), Some(last)) = (cases.first(), cases.last()) {
        let cells = labels
            .iter()
            .map(|l| {
                let max = |f: fn(&CaseResult, &str) -> Option<f64>| {
                    cases.iter().filter_map(|c| f(c, l)).reduce(f64::max)
                };
                let o = max(|c, l| catchup_drains(c, l).0.and_then(|d| d.peak_rss_mib));
                let r = max(|c, l| catchup_drains(c, l).1.and_then(|d| d.peak_rss_mib));
                cell(Goal::MiB(64.0), &[(o, r)])
            })
            .collect();
        out.push(Row {
            measure: "2. catch-up peak RSS (MiB), the largest of the shapes".into(),
            part: String::new(),
            span: (catchup_part(&first.name), catchup_part(&last.name)),
            goal: Goal::MiB(64.0),
            digits: 1,
            cells,
        });
    }
    let client = "3. client CPU (µs / event)";
    out.push(steady_row(
        client,
        STEADY_1K,
        false,
        Goal::AtMost(2.0),
        1,
        client_cpu_us,
    ));
    out.push(steady_row(
        client,
        STEADY_5K,
        false,
        Goal::AtMost(2.0),
        1,
        client_cpu_us,
    ));
    let lat = "4. commit → receive p99 (ms)";
    out.push(steady_row(lat, PRIMARY, false, Goal::PlusMs(10.0), 1, p99));
    out.push(steady_row(
        lat,
        STEADY_1K,
        false,
        Goal::PlusMs(10.0),
        1,
        p99,
    ));
    out.push(steady_row(
        lat,
        STEADY_5K,
        false,
        Goal::PlusMs(10.0),
        1,
        p99,
    ));
    for r in &mut out {
        r.part = load_cell(parts, &r.span.0, &r.span.1);
    }
    out
}

fn catchup_part(case: &str) -> String {
    format!("catch-up ({case})")
}

fn value(v: Option<f64>, digits: usize) -> String {
    crate::report::opt(v, digits)
}

/// The markdown table: measure, load, goal, then per build its value, pg_recvlogical's,
/// the ratio per repeat and its mean, and whether the goal is met.
pub fn table(labels: &[String], rows: &[Row]) -> String {
    let mut t = String::from("| measure | load (1 min, start → end) | goal |");
    let mut rule = String::from("|---|---|---|");
    for l in labels {
        let _ = write!(
            t,
            " {l} | pg_recvlogical | ratio per repeat | ratio (mean) | met |"
        );
        rule.push_str("---:|---:|---:|---:|---|");
    }
    t.push('\n');
    t.push_str(&rule);
    t.push('\n');
    for r in rows {
        let _ = write!(t, "| {} | {} | {} |", r.measure, r.part, r.goal.text());
        for c in &r.cells {
            let per: Vec<String> = c.per_repeat.iter().map(|v| r.goal.ratio_text(*v)).collect();
            let met = match c.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            };
            let _ = write!(
                t,
                " {} | {} | {} | {} | {met} |",
                value(c.outboxd, r.digits),
                value(c.reference, r.digits),
                if per.is_empty() {
                    "–".into()
                } else {
                    per.join(" / ")
                },
                r.goal.ratio_text(c.mean),
            );
        }
        t.push('\n');
    }
    t
}

/// Runs the section and replaces its part of BENCH_RATIOS_OUT (default docs/benchmarks.md).
pub async fn run(s: &Settings, cluster: &PgCluster) -> Result<()> {
    let started = crate::shell("date -u '+%Y-%m-%d %H:%M:%S UTC'");
    let out = PathBuf::from(crate::env_or("BENCH_RATIOS_OUT", "docs/benchmarks.md"));
    let compare = crate::compare_builds("BENCH_RATIOS_COMPARE");
    let mut builds = vec![("outboxd".to_owned(), s.bins.clone())];
    builds.extend(compare.iter().cloned());
    let labels: Vec<String> = builds.iter().map(|b| b.0.clone()).collect();
    let mut parts = Vec::new();
    let mut notes = Vec::new();
    // Catch-up against one broker (the steady runs'), without the profile drain.
    let catchup = Settings {
        catchup_brokers: vec![s.steady_broker],
        sections: vec!["ratios".into()],
        ..s.clone()
    };
    let mut cases = Vec::new();
    for case in &s.cases {
        let before = loadavg();
        let result = crate::catchup_case(&catchup, cluster, case, &compare).await;
        parts.push(Part {
            name: catchup_part(case),
            before,
            after: loadavg(),
        });
        match result {
            Ok(c) => cases.push(c),
            Err(e) => notes.push(format!("catch-up ({case}) failed: {e:#}")),
        }
    }
    let (secs, repeats) = steady::secs_and_repeats("30")?;
    let mut runs = Vec::new();
    for load in [PRIMARY, STEADY_1K, STEADY_5K] {
        let mut tools = vec![Tool::LoadOnly, Tool::RecvLogical, Tool::RecvLogicalPiped];
        for (label, dir) in &builds {
            tools.push(Tool::outboxd(label, dir));
            if load == PRIMARY {
                tools.push(Tool::outboxd_text(label, dir));
            }
        }
        let plan = Plan {
            loads: vec![(load, tools)],
            secs,
            repeats,
        };
        let before = loadavg();
        let result = steady::run_plan(s, cluster, &plan).await;
        parts.push(Part {
            name: steady_part(load),
            before,
            after: loadavg(),
        });
        match result {
            Ok(r) => runs.extend(r),
            Err(e) => notes.push(format!("steady {} failed: {e:#}", load.label())),
        }
    }
    let rows = rows(&labels, &cases, &runs, &parts);
    let table = table(&labels, &rows);
    let mut doc = String::new();
    writeln!(doc, "{BEGIN}")?;
    writeln!(
        doc,
        "## Issue 21's ratios: outboxd against pg_recvlogical\n"
    )?;
    writeln!(
        doc,
        "Generated by `{}`, {started} → {}. Scale {}; steady runs of {secs} s, {repeats} repeat(s), the clients alternating within each repeat; catch-up once per shape, {} broker, against the faster of two pg_recvlogical drains. Extra CPU: all PostgreSQL processes over the same repeat's load-only run. Latency: outboxd's commit → consumer, pg_recvlogical's commit → its output read by the bench.\n",
        s.command,
        crate::shell("date -u '+%Y-%m-%d %H:%M:%S UTC'"),
        s.scale,
        s.steady_broker.name(),
    )?;
    doc.push_str(&table);
    writeln!(
        doc,
        "\nLoad average (/proc/loadavg, 1/5/15 min) per part:\n"
    )?;
    for p in &parts {
        writeln!(doc, "- {}: {} → {}", p.name, p.before, p.after)?;
    }
    for n in &notes {
        writeln!(doc, "- note: {n}")?;
    }
    writeln!(doc, "{END}\n")?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    crate::kafkarun::splice(&out, BEGIN, END, &doc)
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("\n{doc}");
    eprintln!("outboxd-bench: wrote {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(load: Load, repeat: u32, tool: &str, events: u64, pg_cpu: f64) -> SteadyRun {
        SteadyRun {
            load,
            repeat,
            tool: tool.into(),
            events,
            seconds: 10.0,
            pg_cpu,
            walsender_cpu: Some(pg_cpu / 4.0),
            side_cpu: None,
            tool_cpu: Some(pg_cpu / 2.0),
            status_updates: None,
            p50: None,
            p99: Some(pg_cpu * 10.0),
            peak_rss: None,
        }
    }

    #[test]
    fn goals_judge_the_mean() {
        let c = cell(
            Goal::AtMost(1.0),
            &[(Some(2.0), Some(4.0)), (Some(3.0), Some(2.0))],
        );
        assert_eq!(c.per_repeat, vec![Some(0.5), Some(1.5)]);
        assert_eq!(c.mean, Some(1.0));
        assert_eq!(c.met, Some(true));
        assert_eq!((c.outboxd, c.reference), (Some(2.5), Some(3.0)));
        let c = cell(Goal::AtLeast(1.5), &[(Some(140.0), Some(100.0))]);
        assert_eq!(c.met, Some(false));
        let c = cell(Goal::PlusMs(10.0), &[(Some(14.0), Some(5.0))]);
        assert_eq!((c.mean, c.met), (Some(9.0), Some(true)));
        let c = cell(Goal::MiB(64.0), &[(Some(70.0), Some(8.0))]);
        assert_eq!(c.met, Some(false));
        assert_eq!(cell(Goal::Info, &[(Some(1.0), Some(2.0))]).met, None);
    }

    #[test]
    fn missing_or_zero_reference_gives_no_ratio() {
        let c = cell(
            Goal::AtMost(1.0),
            &[(Some(1.0), None), (Some(1.0), Some(0.0))],
        );
        assert_eq!(c.per_repeat, vec![None, None]);
        assert_eq!((c.mean, c.met), (None, None));
        let c = cell(
            Goal::AtMost(1.0),
            &[(Some(1.0), None), (Some(1.0), Some(2.0))],
        );
        assert_eq!((c.mean, c.met), (Some(0.5), Some(true)));
    }

    #[test]
    fn extra_cpu_is_over_the_same_repeats_load_only_run() {
        let runs = vec![
            run(PRIMARY, 0, LOAD_ONLY, 100_000, 10.0),
            run(PRIMARY, 0, RECVLOGICAL, 100_000, 14.0),
            run(PRIMARY, 0, "outboxd (text values)", 100_000, 12.0),
            run(PRIMARY, 1, LOAD_ONLY, 200_000, 30.0),
            run(PRIMARY, 1, RECVLOGICAL, 200_000, 38.0),
            run(PRIMARY, 1, "outboxd (text values)", 200_000, 36.0),
            run(STEADY_1K, 0, RECVLOGICAL, 1, 99.0),
        ];
        let pairs = steady_pairs(
            &runs,
            PRIMARY,
            "outboxd (text values)",
            RECVLOGICAL,
            extra_pg_cpu,
        );
        let approx = |v: Option<f64>| v.map(|v| (v * 1000.0).round() / 1000.0);
        let pairs: Vec<_> = pairs
            .iter()
            .map(|(o, r)| (approx(*o), approx(*r)))
            .collect();
        assert_eq!(pairs, vec![(Some(2.0), Some(4.0)), (Some(3.0), Some(4.0))]);
        let labels = vec!["outboxd".to_owned()];
        let rows = rows(&labels, &[], &runs, &[]);
        let text = &rows[0];
        assert!(text.measure.contains("text values"));
        assert_eq!(
            text.cells[0].mean.map(|m| (m * 1000.0).round()),
            Some(625.0)
        );
        assert_eq!(text.cells[0].met, Some(true));
        // No binary-mode outboxd run: no value, no ratio.
        assert_eq!(rows[1].cells[0].outboxd, None);
    }

    #[test]
    fn latency_is_against_the_piped_recvlogical_and_cpu_against_dev_null() {
        let runs = vec![
            run(STEADY_1K, 0, LOAD_ONLY, 1000, 1.0),
            run(STEADY_1K, 0, RECVLOGICAL, 1000, 2.0),
            run(STEADY_1K, 0, RECVLOGICAL_PIPED, 1000, 3.0),
            run(STEADY_1K, 0, "outboxd", 1000, 4.0),
        ];
        let rows = rows(&["outboxd".to_owned()], &[], &runs, &[]);
        let find = |prefix: &str| {
            rows.iter()
                .find(|r| r.measure.starts_with(prefix) && r.measure.contains("1000/s"))
                .map(|r| r.cells[0].clone())
        };
        let client = find("3. client CPU").unwrap();
        assert_eq!((client.reference, client.mean), (Some(1000.0), Some(2.0)));
        let lat = find("4. commit").unwrap();
        assert_eq!((lat.reference, lat.mean), (Some(30.0), Some(10.0)));
        assert_eq!(lat.met, Some(true));
    }

    fn drain(tool: &str, events: u64, seconds: f64, rss: f64) -> DrainResult {
        DrainResult {
            tool: tool.into(),
            broker: if tool.starts_with(RECVLOGICAL) {
                "-"
            } else {
                "mock"
            }
            .into(),
            events,
            seconds,
            peak_rss_mib: Some(rss),
            ..DrainResult::default()
        }
    }

    #[test]
    fn catch_up_is_against_the_faster_recvlogical_drain_per_build() {
        let mut failed = drain("before", 1000, 0.0, 1.0);
        failed.note = "FAILED: boom".into();
        let case = CaseResult {
            name: "a".into(),
            label: "(a) 1000 single-row transactions".into(),
            shape: crate::pg::Shape::SingleRow { n: 1000 },
            generate_seconds: 1.0,
            wal_bytes: 0,
            drains: vec![
                drain(RECVLOGICAL, 1000, 2.0, 5.0),
                drain("outboxd", 1000, 0.5, 30.0),
                failed,
                drain("pg_recvlogical (repeat, last)", 1000, 1.0, 6.0),
            ],
            profile: None,
        };
        let labels = vec!["outboxd".to_owned(), "before".to_owned()];
        let parts = vec![Part {
            name: "catch-up (a)".into(),
            before: "1.50 1.00 0.50".into(),
            after: "2.25 1.10 0.60".into(),
        }];
        let rows = rows(&labels, &[case], &[], &parts);
        let row = rows
            .iter()
            .find(|r| r.measure.starts_with("2. catch-up events/s"))
            .unwrap();
        assert_eq!(row.part, "1.50 → 2.25");
        assert_eq!(row.cells[0].reference, Some(1000.0));
        assert_eq!(row.cells[0].mean, Some(2.0));
        assert_eq!(row.cells[0].met, Some(true));
        assert_eq!(row.cells[1].outboxd, None);
        assert_eq!(row.cells[1].met, None);
        let rss = rows.iter().find(|r| r.measure.contains("RSS")).unwrap();
        assert_eq!(
            (rss.cells[0].outboxd, rss.cells[0].met),
            (Some(30.0), Some(true))
        );
        let t = table(&labels, &rows);
        assert!(t.starts_with(
            "| measure | load (1 min, start → end) | goal | outboxd | pg_recvlogical |"
        ));
        assert!(t.contains("| before | pg_recvlogical |"));
        assert!(t.contains("| 2.00 | 2.00 | yes |"), "{t}");
        let header_cols = t.lines().next().unwrap().matches('|').count();
        assert!(
            t.lines().all(|l| l.matches('|').count() == header_cols),
            "{t}"
        );
    }

    #[test]
    fn load_spans_from_the_first_parts_start_to_the_last_parts_end() {
        let part = |name: &str, before: &str, after: &str| Part {
            name: name.into(),
            before: before.into(),
            after: after.into(),
        };
        let parts = vec![
            part("catch-up (a)", "1.00 0.50 0.20", "2.00 0.60 0.30"),
            part("catch-up (c)", "3.00 0.70 0.40", "4.00 0.80 0.50"),
        ];
        assert_eq!(
            load_cell(&parts, "catch-up (a)", "catch-up (c)"),
            "1.00 → 4.00"
        );
        assert_eq!(load_cell(&parts, "catch-up (b)", "catch-up (c)"), "–");
    }
}
