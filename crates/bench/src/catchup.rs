//! One catch-up case: a backlog generated once, drained by pg_recvlogical (first and last),
//! outboxd (each broker, text values, other builds), each through its own slot. Debezium is
//! in its own section (compare.rs), on real Kafka through Kafka Connect.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::broker::{self, BrokerKind};
use crate::drain::{self, DrainResult, Target};
use crate::pg::{self, Shape};
use crate::{env_or, report, CaseResult, Settings};

pub(crate) fn case_shape(s: &Settings, case: &str) -> Result<(Shape, String)> {
    Ok(match case {
        "a" => {
            let n = s.scaled(1_000_000);
            (
                Shape::SingleRow { n },
                format!("(a) {n} single-row transactions"),
            )
        }
        "b" => {
            let txns = s.scaled(10_000);
            (
                Shape::Batched { txns, rows: 100 },
                format!("(b) {txns} transactions of 100 rows"),
            )
        }
        "c" => {
            let n = s.scaled(1_000_000);
            (
                Shape::OneTxn { n },
                format!("(c) one transaction of {n} rows"),
            )
        }
        other => anyhow::bail!("unknown case {other:?} (expected a, b or c)"),
    })
}

pub(crate) fn drain_timeout(events: u64, per_sec: u64) -> Duration {
    Duration::from_secs(120 + events / per_sec.max(1))
}

/// One catch-up case; `compare`: other outboxd builds draining after this one (mock broker).
pub(crate) async fn catchup_case(
    s: &Settings,
    cluster: &pgtest::PgCluster,
    case: &str,
    compare: &[(String, PathBuf)],
) -> Result<CaseResult> {
    let (shape, label) = case_shape(s, case)?;
    let db = format!("bench_{case}");
    eprintln!("outboxd-bench: case {label}");
    pg::create_database(cluster, &db, false).await?;
    let sql = pg::connect(cluster, &db).await?;
    let brokers = s.catchup_brokers.clone();
    let mut slots = vec!["s_recvlogical".to_owned(), "s_recvlogical_last".to_owned()];
    for b in &brokers {
        slots.push(format!("s_outboxd_{}", b.name()));
    }
    // BENCH_CATCHUP_TEXT=1: outboxd also drains with text pgoutput values
    // (OUTBOXD_PGOUTPUT_BINARY=off) to the mock broker, right after its default drain.
    let with_text = env_or("BENCH_CATCHUP_TEXT", "0") == "1";
    if with_text {
        slots.push("s_outboxd_mock_text".into());
    }
    for n in 0..compare.len() {
        slots.push(format!("s_outboxd_compare_{n}"));
    }
    let profile = s.section("profile") && case != "c";
    if profile {
        slots.push("s_profile".into());
    }
    pg::create_slots(&sql, &slots).await?;
    let lsn0 = pg::current_lsn(&sql).await?;
    let gen = pg::generate(cluster, &db, shape).await?;
    let end = pg::current_lsn(&sql).await?;
    let wal: i64 = sql
        .query_one(
            "SELECT ($1::text::pg_lsn - $2::text::pg_lsn)::bigint",
            &[&end, &lsn0],
        )
        .await?
        .get(0);
    sql.batch_execute("CHECKPOINT").await?;
    eprintln!(
        "outboxd-bench:   generated {} events in {:.1} s, {} MB of WAL, end {end}",
        shape.events(),
        gen.as_secs_f64(),
        wal / 1_000_000
    );
    let events = shape.events();
    let mut drains = Vec::new();
    let t = |slot: &'static str, per_sec: u64| Target {
        cluster,
        db: &db,
        slot,
        end_lsn: &end,
        events,
        timeout: drain_timeout(events, per_sec),
    };
    match drain::recvlogical(&t("s_recvlogical", 2000)).await {
        Ok(d) => drains.push(report_drain(d)),
        Err(e) => drains.push(failed("pg_recvlogical", "-", events, &e)),
    }
    for b in &brokers {
        let slot: &'static str = match b {
            BrokerKind::Kafka => "s_outboxd_kafka",
            BrokerKind::Mock => "s_outboxd_mock",
        };
        let log = s.workdir.join(format!("outboxd-{case}-{}.log", b.name()));
        let result = async {
            let broker = broker::start(*b, &s.bins, &[pg::TOPIC]).await?;
            drain::outboxd(&t(slot, 2000), &s.bins, &broker, &log, None).await
        }
        .await;
        match result {
            Ok(d) => drains.push(report_drain(d)),
            Err(e) => drains.push(failed("outboxd", b.name(), events, &e)),
        }
        if with_text && *b == BrokerKind::Mock {
            const TEXT: &str = "outboxd (text values)";
            let log = s.workdir.join(format!("outboxd-{case}-mock-text.log"));
            let result = async {
                let broker = broker::start(*b, &s.bins, &[pg::TOPIC]).await?;
                drain::outboxd_with(
                    &t("s_outboxd_mock_text", 2000),
                    &s.bins,
                    &broker,
                    &log,
                    None,
                    &drain::TEXT_VALUES,
                )
                .await
            }
            .await;
            match result {
                Ok(mut d) => {
                    d.tool = TEXT.into();
                    drains.push(report_drain(d));
                }
                Err(e) => drains.push(failed(TEXT, b.name(), events, &e)),
            }
        }
    }
    for (n, (label, dir)) in compare.iter().enumerate() {
        let slot = format!("s_outboxd_compare_{n}");
        let log = s.workdir.join(format!("outboxd-{case}-compare-{n}.log"));
        let result = async {
            let broker = broker::start(BrokerKind::Mock, &s.bins, &[pg::TOPIC]).await?;
            let target = Target {
                slot: &slot,
                ..t("", 2000)
            };
            drain::outboxd(&target, dir, &broker, &log, None).await
        }
        .await;
        match result {
            Ok(mut d) => {
                d.tool = label.clone();
                drains.push(report_drain(d));
            }
            Err(e) => drains.push(failed(label, "mock", events, &e)),
        }
    }
    // pg_recvlogical once more, after everything else: the baseline is the faster of the
    // two, so a first-drain (or last-drain) effect cannot favour outboxd.
    match drain::recvlogical(&t("s_recvlogical_last", 2000)).await {
        Ok(mut d) => {
            d.tool = "pg_recvlogical (repeat, last)".into();
            drains.push(report_drain(d));
        }
        Err(e) => drains.push(failed("pg_recvlogical (repeat, last)", "-", events, &e)),
    }
    let mut profile_text = None;
    if profile {
        let data = s.workdir.join(format!("perf-{case}.data"));
        let log = s.workdir.join(format!("outboxd-{case}-perf.log"));
        let result = async {
            let broker = broker::start(BrokerKind::Mock, &s.bins, &[pg::TOPIC]).await?;
            drain::outboxd(&t("s_profile", 1000), &s.bins, &broker, &log, Some(&data)).await
        }
        .await;
        match result {
            Ok(d) => {
                eprintln!(
                    "outboxd-bench:   profiled run {:.0} events/s",
                    d.events_per_sec()
                );
                profile_text = Some(report::perf_report(&data));
            }
            Err(e) => profile_text = Some(format!("profiling failed: {e:#}")),
        }
    }
    drop(sql);
    pg::drop_database(cluster, &db).await?;
    Ok(CaseResult {
        name: case.to_owned(),
        label,
        shape,
        generate_seconds: gen.as_secs_f64(),
        wal_bytes: u64::try_from(wal).unwrap_or(0),
        drains,
        profile: profile_text,
    })
}

pub(crate) fn report_drain(d: DrainResult) -> DrainResult {
    eprintln!(
        "outboxd-bench:   {:<15} {:<6} {:>9.0} events/s  {:.2} s  pg cpu {:.2} s  client cpu {}  broker cpu {}  {}",
        d.tool,
        d.broker,
        d.events_per_sec(),
        d.seconds,
        d.pg_cpu_seconds,
        report::opt(d.tool_cpu_seconds, 2),
        report::opt(d.broker_cpu_seconds, 2),
        d.note
    );
    d
}

pub(crate) fn failed(tool: &str, broker: &str, events: u64, e: &anyhow::Error) -> DrainResult {
    eprintln!("outboxd-bench:   {tool} ({broker}) FAILED: {e:#}");
    DrainResult {
        tool: tool.into(),
        broker: broker.into(),
        events,
        note: format!("FAILED: {e:#}"),
        ..DrainResult::default()
    }
}
