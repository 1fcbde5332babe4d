//! The `eos` section of the report: every run, the exactly-once / at-least-once ratios per
//! pair and their median, and issue 31's goal against them.

use std::fmt::Write as _;

use anyhow::{bail, Result};

use crate::eos::{Eos, Mode, DEFAULT_COMMIT_MS, MODES};
use crate::kafkarun::{self, Drained};
use crate::report::{opt, Versions};
use crate::{Results, Settings};

const BEGIN: &str = "<!-- eos-cost:begin -->";
const END: &str = "<!-- eos-cost:end -->";

/// Issue 31's goals: at most this much of at-least-once's throughput lost...
const MAX_LOSS: f64 = 0.10;
/// ...and p99 within the commit interval plus this.
const P99_MARGIN_MS: f64 = 20.0;

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => v.get(n / 2).copied(),
        _ => Some((v.get(n / 2 - 1)? + v.get(n / 2)?) / 2.0),
    }
}

/// Exactly-once's events/s from process start over at-least-once's, of each round with
/// both. Not first → last: exactly-once's first record is visible only at its first commit,
/// when many more are sent, which flatters that rate.
fn ratios(e: &Eos) -> Vec<(usize, f64)> {
    (1..=e.repeats)
        .filter_map(|round| {
            let get = |m: Mode| {
                e.catchup
                    .iter()
                    .find(|c| c.round == round && c.mode == m)
                    .map(|c| &c.drained)
            };
            let alo = get(Mode::AtLeastOnce)?.rate()?;
            let eos = get(Mode::ExactlyOnce)?.rate()?;
            Some((round, eos / alo.max(1e-9)))
        })
        .collect()
}

/// The worst exactly-once p99 of each rate over the rounds.
fn worst_p99(e: &Eos) -> Vec<(u64, Option<f64>)> {
    let mut rates: Vec<u64> = e.latency.iter().map(|l| l.paced.rate).collect();
    rates.sort_unstable();
    rates.dedup();
    rates
        .into_iter()
        .map(|rate| {
            let p99 = e
                .latency
                .iter()
                .filter(|l| l.mode == Mode::ExactlyOnce && l.paced.rate == rate)
                .filter_map(|l| l.paced.p99)
                .reduce(f64::max);
            (rate, p99)
        })
        .collect()
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "not met"
    }
}

/// The section between its markers; `run` (when and under what load) and `machine` for
/// a section run on its own, the full report having both elsewhere.
pub fn markdown(s: &Settings, e: &Eos, run: Option<&str>, machine: Option<&str>) -> String {
    let mut w = String::new();
    let _ = write_markdown(&mut w, s, e, run, machine);
    w
}

fn write_markdown(
    w: &mut String,
    s: &Settings,
    e: &Eos,
    run: Option<&str>,
    machine: Option<&str>,
) -> std::fmt::Result {
    writeln!(w, "{BEGIN}")?;
    writeln!(
        w,
        "## Exactly-once against at-least-once (issue 31, `BENCH_SECTIONS=eos`)\n"
    )?;
    if let Some(run) = run {
        writeln!(w, "*{run}*\n")?;
    }
    if let Some(machine) = machine {
        writeln!(w, "Machine: {machine}.\n")?;
    }
    writeln!(
        w,
        "One run, one machine (2 cores shared by PostgreSQL, the broker, the relay, the load and the consumer), \
         scale {} (`BENCH_SCALE`; 1 = a 1,000,000-event backlog). One Apache Kafka {} broker (one KRaft node) \
         for the whole section; every run is a fresh `outboxd run` process with a slot of its own and a topic of \
         its own (6 partitions, created before the run, set by `OUTBOXD_TOPIC`), at its defaults but \
         `OUTBOXD_DELIVERY` (exactly-once: `OUTBOXD_TXN_COMMIT_MS={DEFAULT_COMMIT_MS}`, \
         `OUTBOXD_TXN_MAX_EVENTS=10000` unless the curve sets the interval). One read_committed consumer per \
         run (`fetch.wait.max.ms=2`), assigned to every partition before the relay starts, sees what a consumer \
         of exactly-once output sees. The modes alternate, at-least-once first, in each round ({} here, \
         `BENCH_EOS_REPEATS`), for the catch-ups and for each rate, so that a change in the machine's load hits \
         both alike: read the ratios, not the absolute figures.\n",
        s.scale,
        outboxd_test_broker::kafka::KAFKA_VERSION,
        e.repeats,
    )?;
    writeln!(
        w,
        "Goal (issue 31): exactly-once loses at most {:.0} % of at-least-once's catch-up throughput, and its p99 \
         is at most the commit interval + {P99_MARGIN_MS:.0} ms ({} ms at the default).\n",
        MAX_LOSS * 100.0,
        DEFAULT_COMMIT_MS as f64 + P99_MARGIN_MS
    )?;
    catch_up(w, e)?;
    latency(w, e)?;
    verdict(w, e)?;
    curve(w, e)?;
    for n in &e.notes {
        writeln!(w, "- {}", n.replace('\n', " "))?;
    }
    if !e.notes.is_empty() {
        writeln!(w)?;
    }
    writeln!(
        w,
        "Reproduce: `BENCH_LATENCY_SECS=30 BENCH_SECTIONS=eos scripts/bench` (this section only: it replaces itself in \
         `docs/benchmarks.md`; `BENCH_SCALE`, `BENCH_EOS_REPEATS=2`, `BENCH_EOS_RATES=1000,5000`, \
         `BENCH_LATENCY_SECS`, `BENCH_EOS_COMMIT_MS=20,50,100,200,500`, `BENCH_EOS_CURVE_RATE=1000`). \
         Command of this run: `{}`.\n",
        s.command
    )?;
    writeln!(w, "{END}\n")?;
    Ok(())
}

fn catch_up(w: &mut String, e: &Eos) -> std::fmt::Result {
    if e.catchup.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "### Catch-up: process start to the last record at the consumer\n\n\
         The backlog, {} (generated once in {:.0} s, before any relay ran), read by each run through its own \
         slot made before it. *events/s first → last*: once records flow, without the relay's start-up (its \
         connections, the progress record's read, `InitProducerId`); a read_committed consumer sees \
         exactly-once's first record only at its first commit, with many more, so that rate flatters \
         exactly-once and the ratios below are of events/s from process start. *Relay CPU*: the relay process's \
         user+system time over its life, from /proc; the broker's is its own column, **not** in the relay's.\n",
        e.backlog, e.generate_seconds
    )?;
    writeln!(w, "{}", Drained::table_head("| round | mode ", "|---:|---"))?;
    for c in &e.catchup {
        writeln!(w, "| {} | {} {}", c.round, c.mode.name(), c.drained.cells())?;
    }
    writeln!(w)?;
    let pairs = ratios(e);
    if pairs.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "| round | exactly-once / at-least-once, events/s from process start |\n|---:|---:|"
    )?;
    for (round, ratio) in &pairs {
        writeln!(w, "| {round} | {ratio:.3} |")?;
    }
    writeln!(
        w,
        "| median | {} |\n",
        opt(median(pairs.iter().map(|p| p.1).collect()), 3)
    )?;
    Ok(())
}

fn latency(w: &mut String, e: &Eos) -> std::fmt::Result {
    if e.latency.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "### Latency: insert to consumer, paced single-row transactions\n\n\
         Each run: a fresh relay on a new slot, one record end to end and 2 s idle, then {} s of single-row \
         inserts at the rate over 4 pipelining connections. Each insert puts its wall clock \
         (`clock_timestamp()`, ms) into the payload as `t`; the consumer subtracts it from the arrival time \
         (commit follows the insert in the same autocommit statement, fsync off, so this is commit to \
         visible). *CPU µs / event*: over the rate's window divided by the events inserted.\n",
        e.latency_secs
    )?;
    writeln!(w, "| round | target events/s | mode | achieved | received | p50 ms | p99 ms | relay CPU µs / event | broker CPU µs / event | note |")?;
    writeln!(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")?;
    for l in &e.latency {
        let p = &l.paced;
        writeln!(
            w,
            "| {} | {} | {} | {:.0} | {} / {} | {} | {} | {} | {} | {} |",
            l.round,
            p.rate,
            l.mode.name(),
            p.achieved,
            p.received,
            p.inserted,
            opt(p.p50, 0),
            opt(p.p99, 0),
            opt(p.relay_cpu_us, 1),
            opt(p.broker_cpu_us, 1),
            p.note,
        )?;
    }
    writeln!(w)?;
    writeln!(w, "| target events/s | mode | median p50 ms | median p99 ms | worst p99 ms |\n|---:|---|---:|---:|---:|")?;
    for (rate, _) in worst_p99(e) {
        for mode in MODES {
            let runs: Vec<_> = e
                .latency
                .iter()
                .filter(|l| l.mode == mode && l.paced.rate == rate)
                .collect();
            let p99s: Vec<f64> = runs.iter().filter_map(|l| l.paced.p99).collect();
            writeln!(
                w,
                "| {rate} | {} | {} | {} | {} |",
                mode.name(),
                opt(median(runs.iter().filter_map(|l| l.paced.p50).collect()), 0),
                opt(median(p99s.clone()), 0),
                opt(p99s.into_iter().reduce(f64::max), 0),
            )?;
        }
    }
    writeln!(w)?;
    Ok(())
}

/// One sentence on the goal, from this run's figures.
fn verdict(w: &mut String, e: &Eos) -> std::fmt::Result {
    let mut parts = Vec::new();
    if let Some(r) = median(ratios(e).iter().map(|p| p.1).collect()) {
        parts.push(format!(
            "exactly-once caught up at a median {r:.3} of at-least-once's events/s from process start, \
             where the goal asks ≥ {:.2}: {}",
            1.0 - MAX_LOSS,
            met(r >= 1.0 - MAX_LOSS)
        ));
    }
    let bound = DEFAULT_COMMIT_MS as f64 + P99_MARGIN_MS;
    let p99s: Vec<String> = worst_p99(e)
        .into_iter()
        .filter_map(|(rate, p99)| {
            p99.map(|p| format!("{p:.0} ms at {rate}/s ({})", met(p <= bound)))
        })
        .collect();
    if !p99s.is_empty() {
        parts.push(format!(
            "exactly-once's worst p99 is {} against {bound:.0} ms",
            p99s.join(", ")
        ));
    }
    if !parts.is_empty() {
        writeln!(w, "**This run:** {}.\n", parts.join("; "))?;
    }
    Ok(())
}

fn curve(w: &mut String, e: &Eos) -> std::fmt::Result {
    if e.curve.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "### The commit interval against throughput and latency\n\n\
         Exactly-once at each `OUTBOXD_TXN_COMMIT_MS` (`BENCH_EOS_COMMIT_MS`), one run each after the rounds \
         above: the same backlog through a slot of its own, then {} events/s for {} s as above.\n",
        e.curve_rate, e.latency_secs
    )?;
    writeln!(w, "| `OUTBOXD_TXN_COMMIT_MS` | catch-up events/s | first → last | p50 ms | p99 ms | p99 − interval ms | note |")?;
    writeln!(w, "|---:|---:|---:|---:|---:|---:|---|")?;
    for c in &e.curve {
        let d = c.drained.as_ref();
        let p = c.paced.as_ref();
        let p99 = p.and_then(|p| p.p99);
        let note = [d.map(|d| d.note.as_str()), p.map(|p| p.note.as_str())]
            .into_iter()
            .flatten()
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.commit_ms,
            opt(d.and_then(Drained::rate), 0),
            opt(d.and_then(Drained::streaming), 0),
            opt(p.and_then(|p| p.p50), 0),
            opt(p99, 0),
            opt(p99.map(|x| x - c.commit_ms as f64), 0),
            note.replace('|', "/").replace('\n', " "),
        )?;
    }
    writeln!(w)?;
    Ok(())
}

/// Replaces the section in the report, leaving the rest as the last full run wrote it.
pub fn splice(s: &Settings, r: &Results, versions: &Versions) -> Result<()> {
    let Some(e) = &r.eos else {
        bail!(
            "no exactly-once measurement to write: {}",
            r.notes.join("; ")
        );
    };
    let run = format!(
        "Run {} → {}, on its own (`BENCH_SECTIONS=eos`); load before `{}`, after `{}`.",
        r.started, r.finished, r.load_before, r.load_after
    );
    let wanted = [
        "CPU",
        "nproc",
        "memory",
        "PostgreSQL",
        "Apache Kafka",
        "outboxd",
        "git commit",
    ];
    let machine = versions
        .lines
        .iter()
        .filter(|(k, _)| wanted.contains(&k.as_str()))
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join("; ");
    kafkarun::splice(
        &s.out,
        BEGIN,
        END,
        &markdown(s, e, Some(&run), Some(&machine)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eos::CatchUp;

    fn run(round: usize, mode: Mode, seconds: f64) -> CatchUp {
        CatchUp {
            round,
            mode,
            drained: Drained {
                events: 1000,
                seconds: Some(seconds),
                first: Some(1.0),
                ..Drained::default()
            },
        }
    }

    #[test]
    fn a_pair_is_one_round_and_the_median_is_over_pairs() {
        let e = Eos {
            repeats: 3,
            catchup: vec![
                run(1, Mode::AtLeastOnce, 10.0),
                run(1, Mode::ExactlyOnce, 11.0),
                run(2, Mode::AtLeastOnce, 20.0),
                run(2, Mode::ExactlyOnce, 16.0),
                // A round whose exactly-once run failed has no ratio.
                run(3, Mode::AtLeastOnce, 10.0),
            ],
            ..Eos::default()
        };
        let pairs = ratios(&e);
        assert_eq!(pairs.len(), 2);
        let total: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        assert!((total[0] - 10.0 / 11.0).abs() < 1e-9);
        assert!((total[1] - 20.0 / 16.0).abs() < 1e-9);
        let m = median(total).unwrap_or(0.0);
        assert!((m - (10.0 / 11.0 + 20.0 / 16.0) / 2.0).abs() < 1e-9);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(Vec::new()), None);
    }
}
