//! Subcommands and exit codes.

mod check;
mod init;
mod run;
mod status;

use crate::config;

/// Exit codes, as documented in the README.
pub const EXIT_OK: i32 = 0;
pub const EXIT_INTERNAL: i32 = 1;
pub const EXIT_CONFIG: i32 = 2;
pub const EXIT_POSTGRES: i32 = 3;
pub const EXIT_CHECK_FAILED: i32 = 6;

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

pub const EXIT_CODES: &str = "Exit codes:
  0  stopped cleanly (SIGTERM/SIGINT), or the subcommand succeeded
  1  internal error (a bug: please report it with the log)
  2  configuration error: the message names the variable and what it accepts (checked
     before connecting to anything, Kafka producer properties included)
  3  permanent Postgres-side problem: slot missing/dropped/invalidated, publication missing,
     wrong table shape, authentication or permission failure
  4  a bad outbox row under OUTBOXD_BAD_ROW_POLICY=stop (the message names the row id)
  5  permanent Kafka-side problem: authorization, record too large
  6  `outboxd check` found a problem (each failed check says how to fix it)
  130  a second SIGTERM/SIGINT while draining: exited at once (nothing is lost: events not
     yet confirmed are sent again from the slot)
";

fn usage() -> String {
    format!(
        "outboxd {version}: relays transactional-outbox inserts from PostgreSQL logical replication to Kafka,
confirming the replication slot only after the broker acknowledged every event.

Usage: outboxd [run|check|init [FLAGS]|status [--json]|--help|--version]
  run     relay until SIGTERM/SIGINT (the default)
  check   check Postgres and Kafka prerequisites, each with ok/fail and the fix
  init    create the outbox table, publication and slot if missing (idempotent). It
          reads the progress record before creating a slot, and refuses to create one
          that would skip rows unless told:
          --recreate-lost-slot   the record says the slot existed: create it anyway
                                 (re-publish the rows committed since it went)
          --skip-existing-rows   the table has rows a new slot starts after: they are
                                 published already, or not meant to be
          --accept-publication-change  the publication changed since outboxd last
                                 relayed: rows in between are re-published; go on
          --replace-progress-record  overwrite this cluster's progress record with the
                                 slot's position, proving nothing delivered (after
                                 restoring an older backup)
  status  show the slot: confirmed position, lag, retained WAL, active pid;
          --json (or OUTBOXD_STATUS_FORMAT=json) prints one JSON object for scripts

Configuration is by environment variables only.

{vars}
{codes}",
        version = env!("CARGO_PKG_VERSION"),
        vars = config::help_text(),
        codes = EXIT_CODES
    )
}

pub fn main(args: &[String]) -> i32 {
    let command = args.first().map_or("run", String::as_str);
    match command {
        "--help" | "-h" | "help" => {
            say!("{}", usage().trim_end());
            return EXIT_OK;
        }
        "--version" | "-V" => {
            say!("outboxd {}", env!("CARGO_PKG_VERSION"));
            return EXIT_OK;
        }
        "run" | "check" | "init" | "status" => {
            if args
                .get(1)
                .is_some_and(|a| matches!(a.as_str(), "--help" | "-h" | "help"))
            {
                say!("{}", usage().trim_end());
                return EXIT_OK;
            }
        }
        other => {
            eprintln!("outboxd: unknown command {other:?}; try `outboxd --help`");
            return EXIT_CONFIG;
        }
    }
    let rest = args.get(1..).unwrap_or_default();
    let json = match (command, rest) {
        ("status", []) => false,
        ("status", [flag]) if flag == "--json" => true,
        ("status", extra) => {
            eprintln!("outboxd status: unexpected arguments {extra:?}; it takes --json");
            return EXIT_CONFIG;
        }
        _ => false,
    };
    let mut flags = init::Flags::default();
    if command == "init" {
        for flag in rest {
            match flag.as_str() {
                "--replace-progress-record" => flags.replace_record = true,
                "--recreate-lost-slot" => flags.consent.recreate_lost_slot = true,
                "--skip-existing-rows" => flags.consent.skip_existing_rows = true,
                "--accept-publication-change" => flags.accept_publication = true,
                other => {
                    eprintln!(
                        "outboxd init: unexpected argument {other:?}; it takes --replace-progress-record, --recreate-lost-slot, --skip-existing-rows and --accept-publication-change"
                    );
                    return EXIT_CONFIG;
                }
            }
        }
    }
    let settings = match config::from_process_env(matches!(command, "run" | "check")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("outboxd: configuration error: {e}");
            return EXIT_CONFIG;
        }
    };
    if command != "status" {
        if let Err(e) = crate::wiring::needs_primary(&settings) {
            eprintln!("outboxd: configuration error: {e}");
            return EXIT_CONFIG;
        }
    }
    crate::logging::init(&settings);
    // One thread: the relay is a single task, and with the IO driver on the same thread a
    // socket read wakes it without a cross-thread hand-off (measured as the top cost of
    // catching up a backlog of small transactions on a loaded machine). librdkafka has its
    // own threads. The status writer is a task on this thread: its timer fires while the
    // relay awaits, so nothing here may block (side queries are bounded, and blocking
    // Kafka calls go to spawn_blocking).
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
        match command {
            "check" => check::check(&settings).await,
            "init" => init::init(&settings, flags).await,
            "status" => {
                let json = json || settings.status_format == config::StatusFormat::Json;
                status::status(&settings, json).await
            }
            _ => run::run(&settings).await,
        }
    });
    // A Kafka metadata request on a blocking thread may still be waiting for a broker
    // that is down; the work is done, so do not let it hold the exit (the shutdown
    // deadline an orchestrator's grace period is sized from).
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    code
}
