//! outboxd: relays transactional-outbox inserts from Postgres logical replication to
//! Kafka, confirming the replication slot only after the broker acknowledged.
//!
//! The binary is thin: read the environment once, set up logging, and dispatch to a
//! subcommand. Exit codes are listed in `cli::EXIT_TABLE` and the README.

mod cli;
mod config;
mod logging;
mod wiring;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = cli::main(&args);
    std::process::exit(code);
}
