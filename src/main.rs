//! outboxd: relays transactional-outbox inserts from Postgres logical replication to
//! Kafka, confirming the replication slot only after the broker acknowledged.
//!
//! The binary is thin: read the environment once, set up logging, and dispatch to a
//! subcommand. Exit codes are listed in `cli::EXIT_TABLE` and the README.

mod cli;
mod config;
mod logging;
mod wiring;

/// jemalloc for Rust and, as the process's `malloc` (`unprefixed_malloc_on_supported_platforms`),
/// for librdkafka's C code too: the producer's messages and headers are allocated on the
/// relay's thread and freed on librdkafka's polling thread, and glibc's malloc serialises
/// that on one arena lock (a fifth of the relay thread's time in a catch-up profile, half
/// of it futex wake-ups). Its settings: `.cargo/config.toml`; `MALLOC_CONF` overrides them.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = cli::main(&args);
    std::process::exit(code);
}
