//! `outboxd-dev broker`: librdkafka's mock cluster as a stand-alone process.
//!
//! For demos and development only, not a production broker: it speaks enough of the Kafka
//! protocol for producers and consumers, keeps everything in memory, and forgets it at exit.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use rdkafka::mocking::MockCluster;

use crate::args;

/// outboxd's default OUTBOXD_PROGRESS_TOPIC.
pub const PROGRESS_TOPIC: &str = "outboxd.progress";

/// Partition count of `--topic NAME` without `:PARTITIONS`.
const DEFAULT_PARTITIONS: i32 = 3;

pub fn main(argv: &[String]) -> Result<ExitCode> {
    if argv
        .iter()
        .any(|a| matches!(a.as_str(), "--help" | "-h" | "help"))
    {
        print!("{}", crate::USAGE);
        return Ok(ExitCode::SUCCESS);
    }
    let mut brokers: i32 = 3;
    let mut topics: Vec<(String, i32)> = Vec::new();
    for (flag, value) in args::pairs(argv, &["--brokers", "--topic"])? {
        match flag.as_str() {
            "--brokers" => brokers = args::number(&flag, &value)?,
            _ => topics.push(parse_topic(&value)?),
        }
    }
    if brokers < 1 {
        bail!("--brokers must be at least 1");
    }
    let cluster = MockCluster::new(brokers).context("starting librdkafka's mock cluster")?;
    // The mock cluster has no CreateTopics API; outboxd's progress topic is made here.
    cluster
        .create_topic(PROGRESS_TOPIC, 1, 1)
        .context("creating the progress topic")?;
    for (name, partitions) in &topics {
        cluster
            .create_topic(name, *partitions, 1)
            .with_context(|| format!("creating topic {name}"))?;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "bootstrap.servers={}", cluster.bootstrap_servers())?;
    stdout.flush()?;
    drop(stdout);
    eprintln!(
        "outboxd-dev broker: WARNING: librdkafka's in-memory mock cluster ({brokers} brokers), \
         for demos and development only, not a production broker; all data is lost at exit"
    );
    for (name, partitions) in &topics {
        eprintln!("outboxd-dev broker: created topic {name} ({partitions} partitions)");
    }
    eprintln!(
        "outboxd-dev broker: other topics are created on first produce with 4 partitions; \
         stop with Ctrl-C or SIGTERM"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signal = runtime.block_on(wait_for_signal())?;
    eprintln!("outboxd-dev broker: {signal}, stopping");
    drop(cluster);
    Ok(ExitCode::SUCCESS)
}

/// `NAME` or `NAME:PARTITIONS`.
fn parse_topic(value: &str) -> Result<(String, i32)> {
    let (name, partitions) = match value.rsplit_once(':') {
        Some((name, n)) => (name, args::number("--topic partitions", n)?),
        None => (value, DEFAULT_PARTITIONS),
    };
    if name.is_empty() || partitions < 1 {
        bail!("--topic {value:?}: expected NAME or NAME:PARTITIONS with PARTITIONS >= 1");
    }
    Ok((name.to_owned(), partitions))
}

/// Waits for SIGINT or SIGTERM and names the one that arrived.
pub async fn wait_for_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

#[cfg(test)]
mod help_tests {
    #[test]
    fn broker_help_prints_usage_and_succeeds() {
        for flag in ["--help", "-h"] {
            let result = super::main(&[flag.to_owned()]);
            assert_eq!(
                format!("{:?}", result.as_ref().map_err(|e| e.to_string())),
                format!("{:?}", Ok::<_, String>(std::process::ExitCode::SUCCESS)),
                "{flag}"
            );
        }
    }
}
