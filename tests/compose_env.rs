//! docker/compose.yaml and docker/Dockerfile only set OUTBOXD_* variables the relay knows
//! (every one of them appears in `outboxd --help`), and the image runs as a non-root user.

use std::collections::BTreeSet;
use std::process::Command;

const COMPOSE: &str = include_str!("../docker/compose.yaml");
const DOCKERFILE: &str = include_str!("../docker/Dockerfile");

/// Every `OUTBOXD_[A-Z0-9_]+` in `text`.
fn outboxd_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("OUTBOXD_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..len].to_owned());
        rest = &tail[len..];
    }
    names
}

fn relay_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run outboxd --help: {e}"));
    assert!(
        out.status.success(),
        "outboxd --help failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn extracts_names() {
    let names = outboxd_names("A: OUTBOXD_TOPIC\n B=OUTBOXD_KAFKA_LINGER_MS; x OUTBOXD_X1}");
    let want: BTreeSet<String> = ["OUTBOXD_KAFKA_LINGER_MS", "OUTBOXD_TOPIC", "OUTBOXD_X1"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
}

#[test]
fn compose_and_dockerfile_use_only_known_variables() {
    let compose = outboxd_names(COMPOSE);
    assert!(
        compose.contains("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS"),
        "compose.yaml must set OUTBOXD_KAFKA_BOOTSTRAP_SERVERS, found {compose:?}"
    );
    let dockerfile = outboxd_names(DOCKERFILE);
    let help = relay_help();
    let unknown: Vec<&String> = compose
        .iter()
        .chain(&dockerfile)
        .filter(|name| !help.contains(name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "docker/ sets variables that `outboxd --help` does not list: {unknown:?}\n--help:\n{help}"
    );
}

#[test]
fn dockerfile_runtime_stage_runs_as_non_root() {
    let runtime_stage = DOCKERFILE
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a multi-stage Dockerfile");
    let user = runtime_stage
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let user = user.trim();
    let name = user.split(':').next().unwrap_or(user);
    assert!(
        !name.is_empty() && name != "root" && name != "0",
        "the runtime stage must run as a non-root user, found USER {user}"
    );
}
