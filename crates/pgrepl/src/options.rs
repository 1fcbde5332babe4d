//! START_REPLICATION options, gated on the server version (pgoutput rejects unknown
//! options with an ERROR), and the status-update interval.

use std::time::Duration;

use pgoutput::Lsn;

use crate::error::ReplError;
use crate::query::{quote_ident, quote_literal};

/// The status interval when the server does not force a shorter one.
const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// What to stream and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartOptions {
    pub slot: String,
    /// `0/0` starts at the slot's `confirmed_flush_lsn`; lower values are forwarded to it.
    pub start_lsn: Lsn,
    pub publication_names: Vec<String>,
    /// Deliver `pg_logical_emit_message` output (PG14+).
    pub messages: bool,
    /// pgoutput protocol version; `None` means 1.
    pub proto_version: Option<u32>,
    /// Binary column values where the type supports it (PG14+).
    pub binary: bool,
    /// Flush position the status updates report until [`crate::FlushHandle::advance`]
    /// raises it; the writer sends one right after the start. `0/0` reports nothing (the
    /// server ignores it), the safe choice when the slot's position is not known *now*:
    /// PostgreSQL <= 16 moves `confirmed_flush_lsn` back to a lower reported value, and a
    /// position read before START_REPLICATION may be stale (another client may have held
    /// the slot and confirmed more). Read it once streaming, then advance.
    pub initial_flush: Lsn,
    /// `None`: min(10 s, wal_sender_timeout / 2), read from the server.
    pub status_interval: Option<Duration>,
    /// The longest CopyData payload held whole. A longer one is read through keeping
    /// only its first [`crate::HEAD_LEN`] bytes, and comes out as
    /// [`crate::ReplicationEvent::Oversized`]: one message costs at most this much
    /// memory, whatever its size. PostgreSQL's own cap (1 GiB) by default.
    pub frame_limit: usize,
}

impl StartOptions {
    pub fn new(slot: impl Into<String>, publication: impl Into<String>) -> Self {
        StartOptions {
            slot: slot.into(),
            start_lsn: Lsn::ZERO,
            publication_names: vec![publication.into()],
            messages: false,
            proto_version: None,
            binary: false,
            initial_flush: Lsn::ZERO,
            status_interval: None,
            frame_limit: crate::wire::MAX_MESSAGE_LEN,
        }
    }
}

/// Builds the command, refusing combinations the server would reject mid-handshake.
pub(crate) fn start_replication_sql(
    opts: &StartOptions,
    server_version: u32,
) -> Result<String, ReplError> {
    let proto = opts.proto_version.unwrap_or(1);
    let min_server = match proto {
        1 => 100_000,
        2 => 140_000,
        3 => 150_000,
        4 => 160_000,
        other => {
            return Err(ReplError::Unsupported(format!(
                "pgoutput proto_version {other} (known: 1-4)"
            )))
        }
    };
    let require = |what: String, min: u32| {
        if server_version < min {
            Err(ReplError::Unsupported(format!(
                "{what} needs server version {min} or later, server is {server_version}"
            )))
        } else {
            Ok(())
        }
    };
    require(format!("pgoutput proto_version {proto}"), min_server)?;
    if opts.publication_names.is_empty() {
        return Err(ReplError::Config(
            "at least one publication name is required".into(),
        ));
    }
    let publications = opts
        .publication_names
        .iter()
        .map(|p| quote_ident(p))
        .collect::<Vec<_>>()
        .join(",");
    let mut options = vec![
        format!("proto_version '{proto}'"),
        format!("publication_names {}", quote_literal(&publications)),
    ];
    if opts.messages {
        require("the messages option".into(), 140_000)?;
        options.push("messages 'true'".into());
    }
    if opts.binary {
        require("the binary option".into(), 140_000)?;
        options.push("binary 'true'".into());
    }
    Ok(format!(
        "START_REPLICATION SLOT {} LOGICAL {} ({})",
        quote_ident(&opts.slot),
        opts.start_lsn,
        options.join(", ")
    ))
}

/// min(10 s, wal_sender_timeout / 2); a timeout of 0 (disabled) gives 10 s.
pub(crate) fn status_interval(wal_sender_timeout: &str) -> Result<Duration, ReplError> {
    let timeout = parse_guc_duration_ms(wal_sender_timeout)?;
    if timeout.is_zero() {
        return Ok(DEFAULT_STATUS_INTERVAL);
    }
    Ok((timeout / 2).min(DEFAULT_STATUS_INTERVAL))
}

/// Parses a time GUC as SHOW prints it ("60s", "1min", "500ms", "0"); bare numbers are ms.
pub(crate) fn parse_guc_duration_ms(text: &str) -> Result<Duration, ReplError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| ReplError::Protocol(format!("invalid duration {text:?}")))?;
    let ms_per_unit = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(ReplError::Protocol(format!(
                "invalid duration unit in {text:?}"
            )))
        }
    };
    Ok(Duration::from_millis(n.saturating_mul(ms_per_unit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_version_gated_commands() {
        let mut opts = StartOptions::new("slot_a", "Pub");
        opts.start_lsn = Lsn(0x1_0000_00A0);
        assert_eq!(
            start_replication_sql(&opts, 150_000).unwrap(),
            "START_REPLICATION SLOT \"slot_a\" LOGICAL 1/A0 (proto_version '1', publication_names '\"Pub\"')"
        );
        opts.messages = true;
        opts.publication_names.push("o'b".into());
        assert_eq!(
            start_replication_sql(&opts, 140_000).unwrap(),
            "START_REPLICATION SLOT \"slot_a\" LOGICAL 1/A0 (proto_version '1', publication_names '\"Pub\",\"o''b\"', messages 'true')"
        );
        assert!(matches!(
            start_replication_sql(&opts, 130_000),
            Err(ReplError::Unsupported(_))
        ));
        opts.messages = false;
        opts.binary = true;
        assert!(matches!(
            start_replication_sql(&opts, 130_000),
            Err(ReplError::Unsupported(_))
        ));
        opts.binary = false;
        opts.proto_version = Some(4);
        assert!(start_replication_sql(&opts, 150_000).is_err());
        assert!(start_replication_sql(&opts, 160_000).is_ok());
        opts.proto_version = Some(9);
        assert!(start_replication_sql(&opts, 180_000).is_err());
    }

    #[test]
    fn status_intervals() {
        assert_eq!(status_interval("1min").unwrap(), Duration::from_secs(10));
        assert_eq!(status_interval("2s").unwrap(), Duration::from_secs(1));
        assert_eq!(status_interval("0").unwrap(), Duration::from_secs(10));
        assert_eq!(
            status_interval("5000").unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            status_interval("500ms").unwrap(),
            Duration::from_millis(250)
        );
        assert!(status_interval("soon").is_err());
    }
}
