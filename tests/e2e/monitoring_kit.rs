//! The monitoring kit matches the relay: every metric that deploy/grafana/outboxd.json and
//! deploy/prometheus/alerts.yaml name is exported by a running relay's /metrics, the
//! dashboard and the rules are well-formed, and, when `promtool` is installed (Debian
//! package `prometheus`, or OUTBOXD_TEST_PROMTOOL=/path/to/promtool), the rules pass
//! `promtool check rules`, their unit tests pass `promtool test rules`, the scraped
//! exposition passes `promtool check metrics`, and every panel's query parses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::ops;

const DASHBOARD: &str = include_str!("../../deploy/grafana/outboxd.json");
const ALERTS: &str = include_str!("../../deploy/prometheus/alerts.yaml");
const RUNBOOK: &str = include_str!("../../docs/operations.md");
const ALERT_TESTS: &str = include_str!("../../deploy/prometheus/alerts_test.yaml");

/// Every `outboxd_[a-z0-9_]+` token: the metric names an expression uses.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outboxd_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // Part of a longer identifier (e.g. `x_outboxd_`) is not a metric name.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    names
}

/// Metric names in a Prometheus exposition: the families (`# TYPE`) and the series.
fn exported(body: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                names.insert(name.to_owned());
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split([' ', '{']).next().unwrap_or("");
            names.insert(series.to_owned());
        }
    }
    names
}

fn alert_rules() -> Vec<serde_yaml::Value> {
    let doc: serde_yaml::Value = serde_yaml::from_str(ALERTS).expect("alerts.yaml is YAML");
    let groups = doc["groups"].as_sequence().expect("groups");
    assert!(!groups.is_empty());
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").clone())
        .collect()
}

fn dashboard_exprs() -> Vec<String> {
    let doc: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    assert!(doc["title"].is_string() && doc["uid"].is_string());
    let mut exprs = Vec::new();
    for panel in doc["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["title"].is_string(), "{panel}");
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panels use the dashboard's datasource variable: {}",
            panel["title"]
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for t in targets {
            exprs.push(t["expr"].as_str().expect("expr").to_owned());
        }
    }
    exprs
}

/// What the seed asks an on-call engineer to watch, each covered by the dashboard and
/// by at least one alert.
const WATCHED: &[&str] = &[
    "outboxd_lag_bytes",
    "outboxd_slot_retained_wal_bytes",
    "outboxd_slot_wal_status",
    "outboxd_oldest_unacked_age_seconds",
    "outboxd_delivery_errors_total",
    "outboxd_reconnects_total",
    "outboxd_events_dead_lettered_total",
    "outboxd_replication_connected",
    "outboxd_producer_healthy",
];

#[test]
fn dashboard_and_rules_cover_what_on_call_watches() {
    let dashboard = metric_names(&dashboard_exprs().join("\n"));
    let rules = alert_rules();
    let mut in_rules = BTreeSet::new();
    for rule in &rules {
        let name = rule["alert"].as_str().expect("alert name");
        let expr = rule["expr"].as_str().expect("expr");
        assert!(
            matches!(rule["labels"]["severity"].as_str(), Some("page" | "ticket")),
            "{name}: severity page or ticket"
        );
        assert!(rule["annotations"]["summary"].is_string(), "{name}");
        assert!(rule["annotations"]["description"].is_string(), "{name}");
        in_rules.extend(metric_names(expr));
    }
    for m in WATCHED {
        assert!(dashboard.contains(*m), "the dashboard does not show {m}");
        assert!(in_rules.contains(*m), "no alert rule uses {m}");
    }
    // Seed 004: dead letters page a human.
    let dead = rules
        .iter()
        .find(|r| {
            r["expr"]
                .as_str()
                .is_some_and(|e| e.contains("outboxd_events_dead_lettered_total"))
        })
        .expect("a dead-letter rule");
    assert_eq!(dead["labels"]["severity"].as_str(), Some("page"));
}

/// Issue 32: the health row says "down" (red) when no relay reports, instead of "No data",
/// and shows a lost slot by name in red, not as a green 1.
#[test]
fn health_row_shows_down_and_a_lost_slot_in_red() {
    let doc: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    let panels = doc["panels"].as_array().expect("panels");
    let stat = |title: &str| {
        panels
            .iter()
            .find(|p| p["type"] == "stat" && p["title"] == title)
            .unwrap_or_else(|| panic!("no stat panel {title:?}"))
    };
    // The text and colour a stat shows for `value` through its value mappings.
    let shown = |panel: &serde_json::Value, value: &str| -> (String, String) {
        let mappings = panel["fieldConfig"]["defaults"]["mappings"]
            .as_array()
            .expect("mappings");
        let m = mappings
            .iter()
            .find_map(|m| m["options"].get(value))
            .unwrap_or_else(|| panic!("{}: no mapping for {value}", panel["title"]));
        (
            m["text"].as_str().unwrap_or("").to_owned(),
            m["color"].as_str().unwrap_or("").to_owned(),
        )
    };
    for title in [
        "Streaming (any instance)",
        "Kafka producer healthy",
        "Slot wal_status",
        "Kafka brokers up",
    ] {
        let panel = stat(title);
        let expr = panel["targets"][0]["expr"].as_str().expect("expr");
        assert!(expr.ends_with("or on () vector(-1)"), "{title}: {expr}");
        assert_eq!(shown(panel, "-1"), ("down".into(), "red".into()), "{title}");
    }
    let wal = stat("Slot wal_status");
    let expr = wal["targets"][0]["expr"].as_str().expect("expr");
    for (status, code, color) in [
        ("reserved", "0", "green"),
        ("extended", "1", "orange"),
        ("unreserved", "2", "red"),
        ("lost", "3", "red"),
    ] {
        assert!(
            expr.contains(&format!("status=\"{status}\"}} == 1) * {code}")),
            "{status}: {expr}"
        );
        assert_eq!(shown(wal, code), (status.into(), color.into()), "{status}");
    }
}

/// Issue 32: common pod scraping gives the relay another job than "outboxd"; the rules
/// must not require one (the promtool tests run them under job="kubernetes-pods").
#[test]
fn rules_require_no_job() {
    for rule in alert_rules() {
        let expr = rule["expr"].as_str().expect("expr");
        assert!(!expr.contains("job="), "{:?}: {expr}", rule["alert"]);
    }
}

/// A heading's anchor as GitHub and GitLab make it: lower case, punctuation dropped,
/// spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every rule links its own section of docs/operations.md, one that exists.
#[test]
fn every_rule_has_a_runbook_section() {
    let anchors: BTreeSet<String> = RUNBOOK
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(anchor)
        .collect();
    for rule in alert_rules() {
        let name = rule["alert"].as_str().expect("alert name");
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        let (page, section) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{name}: {url} names no section"));
        assert!(page.ends_with("/docs/operations.md"), "{name}: {url}");
        assert_eq!(section, name.to_lowercase(), "{name}: its own section");
        assert!(
            anchors.contains(section),
            "{name}: docs/operations.md has no section #{section}"
        );
    }
}

/// Every rule has a promtool unit test that shows it firing and one that shows it quiet
/// (`promtool test rules` runs them below when promtool is installed).
#[test]
fn every_rule_has_unit_tests() {
    let doc: serde_yaml::Value = serde_yaml::from_str(ALERT_TESTS).expect("alerts_test.yaml");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in doc["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test")
        {
            let name = case["alertname"].as_str().expect("alertname").to_owned();
            match case["exp_alerts"].as_sequence() {
                Some(alerts) if !alerts.is_empty() => fires.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    for rule in alert_rules() {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(
            fires.contains(name),
            "alerts_test.yaml never expects {name} to fire"
        );
        assert!(
            quiet.contains(name),
            "alerts_test.yaml never expects {name} to stay quiet"
        );
    }
}

/// The metric each `rate(`, `irate(` and `increase(` is applied to, in order.
fn rated_metrics(expr: &str) -> Vec<String> {
    let mut calls: Vec<(usize, usize)> = ["rate(", "increase("]
        .iter()
        .flat_map(|f| expr.match_indices(f).map(|(at, f)| (at, at + f.len())))
        .collect();
    calls.sort_unstable();
    calls
        .into_iter()
        .map(|(_, args)| {
            expr[args..]
                .trim_start_matches('(')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn extracts_rated_metrics() {
    assert_eq!(
        rated_metrics("sum(rate(outboxd_a_total{x=\"1\"}[5m])) / increase(b_bucket[1h])"),
        ["outboxd_a_total", "b_bucket"]
    );
}

#[test]
fn extracts_metric_names() {
    let names =
        metric_names("rate(outboxd_a_total[5m]) / x_outboxd_b + outboxd_c{job=\"outboxd\"}");
    let want: BTreeSet<String> = ["outboxd_a_total", "outboxd_c"].map(String::from).into();
    assert_eq!(names, want);
}

fn promtool() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OUTBOXD_TEST_PROMTOOL").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    })
}

fn run_promtool(promtool: &Path, args: &[&str], stdin: Option<&str>) {
    let mut child = Command::new(promtool)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("promtool stdin");
    drop(input);
    let out = child.wait_with_output().expect("promtool output");
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Exported only under a condition this test's relay does not meet, each checked where
/// it is: the safe WAL size only with max_slot_wal_keep_size set
/// (ops_http::safe_wal_size_is_exported_when_the_server_caps_slots).
const ONLY_WHEN: &[&str] = &["outboxd_slot_safe_wal_size_bytes"];

#[tokio::test(flavor = "multi_thread")]
async fn every_referenced_metric_is_exported_by_a_running_relay() {
    let s = ops::streaming_relay("monitoring_kit", &[]).await;
    // Some events, so counters and the histogram have samples, and a tick or more so the
    // slot statistics are read.
    s.relay_events(20).await;
    let relay = &s.relay;
    let body = ops::wait_for(
        "slot statistics in /metrics",
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(500),
        move || async move {
            let (code, body) = relay.http_get("/metrics")?;
            (code == 200 && body.contains("outboxd_slot_wal_status{status=\"reserved\"} 1"))
                .then_some(body)
        },
    )
    .await;
    // rate() and increase() only over counters (and histogram series): over a gauge such
    // as a position they turn a restart's jump from 0 into a spike of throughput.
    let types: std::collections::BTreeMap<&str, &str> = body
        .lines()
        .filter_map(|l| {
            let mut it = l.strip_prefix("# TYPE ")?.split_whitespace();
            Some((it.next()?, it.next()?))
        })
        .collect();
    let alert_exprs: Vec<String> = alert_rules()
        .iter()
        .map(|r| r["expr"].as_str().expect("expr").to_owned())
        .collect();
    for expr in dashboard_exprs().iter().chain(&alert_exprs) {
        for metric in rated_metrics(expr) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    metric
                        .strip_suffix(s)
                        .filter(|f| types.get(f) == Some(&"histogram"))
                })
                .unwrap_or(&metric);
            let kind = types.get(family).copied();
            assert!(
                matches!(kind, Some("counter" | "histogram")),
                "rate/increase over {metric} ({kind:?}, not a counter) in {expr}"
            );
        }
    }
    let exported = exported(&body);
    let mut referenced = metric_names(&dashboard_exprs().join("\n"));
    referenced.extend(metric_names(ALERTS));
    let missing: Vec<&String> = referenced
        .iter()
        .filter(|m| !exported.contains(*m) && !ONLY_WHEN.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the monitoring kit names metrics /metrics does not export: {missing:?}\n/metrics:\n{body}"
    );

    match promtool() {
        Some(p) => {
            run_promtool(
                &p,
                &["check", "rules", "deploy/prometheus/alerts.yaml"],
                None,
            );
            run_promtool(
                &p,
                &["test", "rules", "deploy/prometheus/alerts_test.yaml"],
                None,
            );
            run_promtool(&p, &["check", "metrics"], Some(&body));
            // Every panel's query parses: as recording rules, with the dashboard's
            // variables filled in.
            let rules: String = dashboard_exprs()
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let e = e.replace("$job", "outboxd").replace("$instance", ".*");
                    format!(
                        "      - record: dashboard:panel_{i}\n        expr: {}\n",
                        serde_json::Value::from(e)
                    )
                })
                .collect();
            let file =
                std::env::temp_dir().join(format!("outboxd-dashboard-{}.yaml", std::process::id()));
            std::fs::write(
                &file,
                format!("groups:\n  - name: dashboard\n    rules:\n{rules}"),
            )
            .expect("write the dashboard's queries");
            run_promtool(&p, &["check", "rules", &file.to_string_lossy()], None);
            let _ = std::fs::remove_file(&file);
        }
        None => eprintln!(
            "promtool is not installed: skipping `promtool check rules` / `test rules` / \
             `check metrics` (apt-get install prometheus, or set OUTBOXD_TEST_PROMTOOL)"
        ),
    }
}
