//! Subcommands and exit codes.

mod check;
mod init;
mod probe;
mod prune;
mod run;
mod status;

use crate::config;

/// Exit codes, as documented in the README and listed by [`EXIT_TABLE`].
pub const EXIT_OK: i32 = 0;
pub const EXIT_INTERNAL: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
pub const EXIT_POSTGRES: i32 = 3;
pub const EXIT_CHECK_FAILED: i32 = 6;
pub const EXIT_UNREACHABLE: i32 = 7;
pub const EXIT_NOT_READY: i32 = 8;

/// Writes to stdout. A reader that went away (`outboxd status | head -1`) is not an
/// error of ours: the rest of the output is dropped and the exit code stays the command's.
pub fn write_stdout(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // Nothing useful can be done about a failed write to stdout; stderr carries errors.
    let _ = out.write_fmt(text).and_then(|()| out.write_all(b"\n"));
}

/// `println!` without the panic on a closed pipe.
macro_rules! say {
    ($($arg:tt)*) => { $crate::cli::write_stdout(format_args!($($arg)*)) };
}
pub(crate) use say;

/// The progress record's identity of this configuration's slot on the cluster with
/// `system_id`.
fn slot_identity(s: &config::Settings, system_id: &str) -> outboxd_relay::kafka::SlotIdentity {
    outboxd_relay::kafka::SlotIdentity {
        cluster: s.cluster_name.clone(),
        system_id: system_id.to_owned(),
        database: s.pg.dbname.clone(),
        slot: s.slot.clone(),
    }
}

/// One exit code: what it means and which subcommands return it (each subcommand's
/// `--help` lists its own; `outboxd --help` and the README list them all).
struct ExitCode {
    code: i32,
    commands: &'static [&'static str],
    meaning: &'static str,
}

const ALL: &[&str] = &["run", "check", "init", "status", "probe", "prune"];

const EXIT_TABLE: &[ExitCode] = &[
    ExitCode {
        code: EXIT_OK,
        commands: ALL,
        meaning: "stopped cleanly (SIGTERM/SIGINT), or the subcommand succeeded",
    },
    ExitCode {
        code: EXIT_INTERNAL,
        commands: ALL,
        meaning: "internal error (a bug: please report it with the log)",
    },
    ExitCode {
        code: EXIT_CONFIG,
        commands: ALL,
        meaning: "configuration or command-line error: the message names the variable or \
                  argument and what it accepts (checked before connecting to anything, Kafka \
                  producer properties included)",
    },
    ExitCode {
        code: EXIT_POSTGRES,
        commands: &["run", "init", "status", "prune"],
        meaning: "permanent Postgres-side problem: slot missing/dropped/invalidated (status: \
                  missing or wal_status lost), publication missing, wrong table shape, \
                  authentication, TLS or permission failure, no host of the wanted kind; \
                  prune: also the slot not confirming past a batch's snapshot in time, a \
                  re-publish or back-fill still owed, or its progress record unread \
                  (nothing unrelayed is deleted)",
    },
    ExitCode {
        code: 4,
        commands: &["run"],
        meaning:
            "a bad outbox row under OUTBOXD_BAD_ROW_POLICY=stop (the message names the row id)",
    },
    ExitCode {
        code: 5,
        commands: &["run"],
        meaning: "permanent Kafka-side problem: authorization, record too large",
    },
    ExitCode {
        code: EXIT_CHECK_FAILED,
        commands: &["check"],
        meaning: "`outboxd check` found a problem (each failed check says how to fix it)",
    },
    ExitCode {
        code: EXIT_UNREACHABLE,
        commands: &["status", "probe"],
        meaning: "cannot connect: status could not reach PostgreSQL (refused, timed out, \
                  server starting up or shutting down: try again), probe could not reach \
                  the relay's HTTP endpoint",
    },
    ExitCode {
        code: EXIT_NOT_READY,
        commands: &["probe"],
        meaning: "the relay answered the probe with something other than 200 (not ready)",
    },
    ExitCode {
        code: 130,
        commands: &["run"],
        meaning: "a second SIGTERM/SIGINT while draining: exited at once (nothing is lost: \
                  events not yet confirmed are sent again from the slot)",
    },
];

/// The exit codes `command` returns (every one when `None`), for `--help`.
fn exit_codes(command: Option<&str>) -> String {
    let mut out = String::from("Exit codes:\n");
    for e in EXIT_TABLE
        .iter()
        .filter(|e| command.is_none_or(|c| e.commands.contains(&c)))
    {
        out.push_str(&format!("  {:<4}", e.code));
        let mut column = 6;
        for word in e.meaning.split(' ') {
            if column + 1 + word.len() > 92 {
                out.push_str("\n      ");
                column = 6;
            }
            out.push(' ');
            out.push_str(word);
            column += 1 + word.len();
        }
        out.push('\n');
    }
    out
}

fn subcommand_footer(command: &str) -> String {
    format!(
        "Configuration is by environment variables only: `outboxd --help` lists them.\n\n{}",
        exit_codes(Some(command))
    )
}

fn main_footer() -> String {
    format!(
        "Configuration is by environment variables only.\n\n{}\n{}",
        config::help_text(),
        exit_codes(None)
    )
}

/// outboxd: relays transactional-outbox inserts from PostgreSQL logical replication to
/// Kafka, confirming the replication slot only after the broker acknowledged every event.
#[derive(Debug, clap::Parser)]
#[command(
    name = "outboxd",
    version,
    after_help = main_footer(),
    subcommand_value_name = "COMMAND"
)]
struct Cli {
    /// Without one: run.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Relay until SIGTERM/SIGINT (the default)
    #[command(after_help = subcommand_footer("run"))]
    Run,
    /// Check Postgres and Kafka prerequisites, each with ok/fail and the fix
    #[command(after_help = subcommand_footer("check"))]
    Check,
    /// Create the outbox table, publication and slot if missing (idempotent)
    ///
    /// It reads the progress record before creating a slot, and refuses to create one
    /// that would skip rows unless told by the flags below.
    #[command(after_help = subcommand_footer("init"))]
    Init(InitArgs),
    /// Show the slot: confirmed position, lag, retained WAL, active pid
    #[command(after_help = subcommand_footer("status"))]
    Status(StatusArgs),
    /// Ask a running relay's HTTP endpoint whether it is ready: exit 0 if so
    ///
    /// For container health checks in images without curl: `outboxd probe` asks
    /// /readyz at OUTBOXD_HTTP_ADDR (an unspecified address such as 0.0.0.0 is asked on
    /// the loopback address).
    #[command(after_help = subcommand_footer("probe"))]
    Probe(probe::ProbeArgs),
    /// Delete relayed outbox rows older than a retention, in small batches
    ///
    /// A row is deleted only once the slot has confirmed the transaction that wrote it
    /// (Kafka has it); run it from cron next to a running relay.
    #[command(after_help = subcommand_footer("prune"))]
    Prune(prune::PruneArgs),
}

#[derive(Debug, clap::Args)]
struct InitArgs {
    /// The record says the slot existed: create it anyway (re-publish the rows
    /// committed since it went)
    #[arg(long)]
    recreate_lost_slot: bool,
    /// The table has rows a new slot starts after: they are published already, or not
    /// meant to be
    #[arg(long)]
    skip_existing_rows: bool,
    /// The publication changed since outboxd last relayed: rows in between are
    /// re-published; go on
    #[arg(long)]
    accept_publication_change: bool,
    /// Overwrite this cluster's progress record with the slot's position, proving
    /// nothing delivered (after restoring an older backup)
    #[arg(long)]
    replace_progress_record: bool,
    /// Publish the rows this SQL condition selects (e.g. "status = 'pending'") from the
    /// new slot's snapshot, in created_at order, before anything is streamed; run again
    /// to resume one that stopped (trusted SQL: docs/operations.md)
    #[arg(long, value_name = "SQL_CONDITION")]
    backfill: Option<String>,
    /// The rows `init` said are owed a re-publish (after --recreate-lost-slot or
    /// --accept-publication-change) are re-published: `outboxd prune` deletes again
    #[arg(long, conflicts_with_all = ["recreate_lost_slot", "accept_publication_change", "backfill"])]
    republish_done: bool,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// Print one JSON object for scripts (also OUTBOXD_STATUS_FORMAT=json)
    #[arg(long)]
    json: bool,
}

/// Parses the command line; help, version and usage errors are answered here (help and
/// version on stdout with 0, errors on stderr with 2, naming the argument).
fn parse(args: &[String]) -> Result<Command, i32> {
    use clap::Parser;
    let argv = std::iter::once("outboxd").chain(args.iter().map(String::as_str));
    match Cli::try_parse_from(argv) {
        Ok(cli) => Ok(cli.command.unwrap_or(Command::Run)),
        Err(e) => {
            let _ = e.print();
            Err(if e.use_stderr() { EXIT_CONFIG } else { EXIT_OK })
        }
    }
}

pub fn main(args: &[String]) -> i32 {
    let command = match parse(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (name, flags, json) = match &command {
        // Reads no configuration but its own flag's: it runs next to a relay.
        Command::Probe(args) => return probe::probe(args),
        Command::Run => ("run", init::Flags::default(), false),
        Command::Check => ("check", init::Flags::default(), false),
        Command::Init(a) => {
            let mut flags = init::Flags {
                replace_record: a.replace_progress_record,
                accept_publication: a.accept_publication_change,
                backfill: a.backfill.clone(),
                republish_done: a.republish_done,
                ..init::Flags::default()
            };
            flags.consent.recreate_lost_slot = a.recreate_lost_slot;
            flags.consent.skip_existing_rows = a.skip_existing_rows;
            flags.consent.backfill = a.backfill.is_some();
            ("init", flags, false)
        }
        Command::Status(a) => ("status", init::Flags::default(), a.json),
        Command::Prune(_) => ("prune", init::Flags::default(), false),
    };
    let settings = match config::from_process_env(matches!(name, "run" | "check")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("outboxd: configuration error: {e}");
            return EXIT_CONFIG;
        }
    };
    if name != "status" {
        if let Err(e) = crate::wiring::needs_primary(&settings) {
            eprintln!("outboxd: configuration error: {e}");
            return EXIT_CONFIG;
        }
    }
    // `run` never waits for stderr (see `logging`); the one-shot commands write in order
    // with what they print.
    let writes = if name == "run" {
        crate::logging::Writes::Queued
    } else {
        crate::logging::Writes::Direct
    };
    crate::logging::init(&settings, writes);
    // One thread: the relay is a single task, and with the IO driver on the same thread a
    // socket read wakes it without a cross-thread hand-off (measured as the top cost of
    // catching up a backlog of small transactions on a loaded machine). librdkafka has its
    // own threads. The status writer is a task on this thread: its timer fires while the
    // relay awaits, so nothing here may block (side queries are bounded, blocking Kafka
    // calls go to spawn_blocking, and `run`'s log lines to a thread of their own).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outboxd: cannot start the async runtime: {e}");
            return EXIT_INTERNAL;
        }
    };
    let code = runtime.block_on(async {
        match name {
            "check" => check::check(&settings).await,
            "init" => init::init(&settings, flags).await,
            "status" => {
                let json = json || settings.status_format == config::StatusFormat::Json;
                status::status(&settings, json).await
            }
            "prune" => match &command {
                Command::Prune(args) => prune::prune(&settings, args).await,
                _ => EXIT_INTERNAL,
            },
            _ => run::run(&settings).await,
        }
    });
    // A Kafka metadata request on a blocking thread may still be waiting for a broker
    // that is down; the work is done, so do not let it hold the exit (the shutdown
    // deadline an orchestrator's grace period is sized from).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    crate::logging::flush(crate::logging::EXIT_FLUSH);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_command_line_is_checked() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        assert!(matches!(parse(&args(&[])), Ok(Command::Run)));
        assert!(matches!(
            parse(&args(&["status", "--json"])),
            Ok(Command::Status(StatusArgs { json: true }))
        ));
        for bad in [
            &["check", "--bogus"][..],
            &["status", "extra"],
            &["init", "--recreate"],
            &["nonsense"],
        ] {
            assert_eq!(parse(&args(bad)).err(), Some(EXIT_CONFIG), "{bad:?}");
        }
    }

    #[test]
    fn every_exit_code_is_listed_once_and_for_a_known_subcommand() {
        let mut codes: Vec<i32> = EXIT_TABLE.iter().map(|e| e.code).collect();
        codes.dedup();
        assert_eq!(codes.len(), EXIT_TABLE.len());
        assert!(EXIT_TABLE
            .iter()
            .all(|e| e.commands.iter().all(|c| ALL.contains(c))));
        let probe = exit_codes(Some("probe"));
        assert!(
            probe.contains("\n  8    the relay") && !probe.contains("\n  6 "),
            "{probe}"
        );
    }
}
