//! `outboxd-dev`: tools for demos and development only, not a production broker.
//!
//! - `outboxd-dev broker`: librdkafka's in-memory mock Kafka cluster on loopback ports.
//! - `outboxd-dev quickstart`: a throwaway PostgreSQL, a throwaway Apache Kafka node (or the
//!   mock cluster), the real `outboxd` relay, sample events, and a consumer that shows each
//!   one arriving.
//!
//! Nothing here is meant for production: the broker keeps everything in memory and loses it
//! at exit, and the quickstart database is deleted when the command ends.

mod args;
mod broker;
mod conformance;
mod quickstart;

use std::process::ExitCode;

pub(crate) const USAGE: &str = "\
outboxd-dev: for demos and development only, not a production broker

USAGE:
  outboxd-dev broker [--brokers N] [--topic NAME[:PARTITIONS]]...
      Runs librdkafka's in-memory mock Kafka cluster (default 3 brokers) until SIGINT/SIGTERM.
      Prints `bootstrap.servers=<list>` on stdout. Topics are auto-created on first produce
      with 4 partitions; --topic pre-creates one with the given partition count (default 3).

  outboxd-dev quickstart [--events N] [--seconds S] [--mock]
      Starts a throwaway PostgreSQL and a throwaway Apache Kafka node (its jars from
      `scripts/install-deps --kafka`; the mock cluster when Java or the jars are missing, or
      with --mock), runs the `outboxd` binary found next to this one, inserts N sample events (default 20) spread over S seconds (default N/4),
      prints each event as it arrives in Kafka, and exits 0 when every event arrived.

  outboxd-dev conformance --bootstrap-servers HOST:PORT --topic NAME --database URL
                          [--consumer NAME] [--group ID] [--effect-query SQL]
                          [--aggregate-type NAME] [--seconds S]
      Checks an inbox consumer (docs/inbox.md) that reads --topic: writes a scripted run of
      outboxd-shaped records with duplicates, a replayed batch, a re-inserted event, a stale
      version and an out-of-order version; waits (default 60 s) until group --group (default
      --consumer, default balances) committed past them; then checks --database's
      inbox_processed and inbox_versions rows of --consumer, and the effect: --effect-query
      takes the run's aggregate ids as $1 (text[]) and returns (id text, amount bigint) rows,
      the sum of the amounts applied (default: SELECT account, balance FROM balances WHERE
      account = ANY($1), the examples' table). Exits 0 when every check passed, 1 otherwise.

  outboxd-dev help
";

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    let command = argv.next();
    let rest: Vec<String> = argv.collect();
    let result = match command.as_deref() {
        Some("broker") => broker::main(&rest),
        Some("quickstart") => quickstart::main(&rest),
        Some("conformance") => conformance::main(&rest),
        Some("help" | "-h" | "--help") | None => {
            print!("{USAGE}");
            return if command.is_none() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("outboxd-dev: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
