//! The server's settings as outboxd needs them, judged once before each session's
//! replication connection and by `outboxd check`, one verdict per setting.

use pgrepl::preflight::{self, ServerSettings};
use tokio_postgres::Client;

use std::time::Duration;

use super::catchup::human_duration;
use super::error::RelayError;

/// A prerequisite as `run` and `check` both judge it: `Ok(None)` fine, `Ok(Some(warning))`
/// works but deserves the operator's attention, `Err(problem)` outboxd cannot work, with
/// the fix.
pub type Verdict = Result<Option<String>, String>;

/// Checks the server settings before the replication connection is opened: a refusal
/// there (no walsender allowed) would otherwise look like a transient overload (53300)
/// and be retried forever. `first` logs the warnings, once per process.
pub async fn check_server(sql: &Client, slot: &str, first: bool) -> Result<(), RelayError> {
    let settings = preflight::server_settings(sql).await?;
    let slot_exists = preflight::slot_state(sql, slot).await?.is_some();
    for (setting, verdict) in judge_server(&settings, slot_exists) {
        match verdict {
            Ok(None) => {}
            Ok(Some(warning)) if first => tracing::warn!(setting, "{warning}"),
            Ok(Some(_)) => {}
            Err(problem) => return Err(RelayError::ServerSetting { setting, problem }),
        }
    }
    Ok(())
}

/// Every server-setting rule, named by the setting; `check` prints one line each.
pub fn judge_server(s: &ServerSettings, slot_exists: bool) -> Vec<(&'static str, Verdict)> {
    let mut rules = vec![
        ("wal_level", judge_wal_level(s)),
        (
            "max_replication_slots",
            judge_replication_slots(s, slot_exists),
        ),
        ("max_wal_senders", judge_wal_senders(s)),
        ("max_slot_wal_keep_size", judge_wal_keep(s)),
    ];
    // PostgreSQL 18+ only: before, the setting does not exist and there is nothing to say.
    if let Some(timeout_s) = s.idle_replication_slot_timeout_s {
        rules.push((
            "idle_replication_slot_timeout",
            judge_idle_slot_timeout(timeout_s),
        ));
    }
    rules
}

fn judge_wal_level(s: &ServerSettings) -> Verdict {
    if s.wal_level == "logical" {
        Ok(None)
    } else {
        Err(format!(
            "is {}; set wal_level = logical in postgresql.conf and restart PostgreSQL",
            s.wal_level
        ))
    }
}

fn judge_replication_slots(s: &ServerSettings, slot_exists: bool) -> Verdict {
    if s.max_replication_slots < 1 {
        return Err(format!(
            "is {}; set it to at least 1 (plus one per other consumer) and restart PostgreSQL",
            s.max_replication_slots
        ));
    }
    let max = i64::from(s.max_replication_slots);
    if !slot_exists && s.replication_slots_in_use >= max {
        return Err(format!(
            "all {max} slots are in use and outboxd's slot does not exist yet: raise \
             max_replication_slots (restart PostgreSQL) or drop an unused slot \
             (SELECT pg_drop_replication_slot('<name>'))"
        ));
    }
    Ok(None)
}

fn judge_wal_senders(s: &ServerSettings) -> Verdict {
    if s.max_wal_senders < 1 {
        return Err(format!(
            "max_wal_senders is {}, so no replication connection is allowed; set it to at \
             least 1 (plus one per standby and other consumer) and restart PostgreSQL",
            s.max_wal_senders
        ));
    }
    if s.wal_senders_in_use >= i64::from(s.max_wal_senders) {
        // Transient: one may end. `run` waits for it; the operator should know.
        return Ok(Some(format!(
            "all {} walsenders are in use; outboxd waits until one is free: raise \
             max_wal_senders (restart PostgreSQL)",
            s.max_wal_senders
        )));
    }
    Ok(None)
}

fn judge_wal_keep(s: &ServerSettings) -> Verdict {
    match s.max_slot_wal_keep_size_mb {
        Some(-1) => Ok(Some(
            "-1 (no cap): while outboxd or Kafka is down the slot keeps all WAL until the \
             disk fills. Set max_slot_wal_keep_size to the WAL rate × the longest outage to \
             ride out, and alert on pg_replication_slots.safe_wal_size and wal_status"
                .into(),
        )),
        _ => Ok(None),
    }
}

/// A slot nobody streams from is invalidated once idle for this long: status updates keep
/// the slot of a streaming relay alive (a standby waiting for it does not), so what it
/// limits is how long every relay may be down before the slot and its events are lost.
fn judge_idle_slot_timeout(timeout_s: i64) -> Verdict {
    if timeout_s <= 0 {
        return Ok(None);
    }
    let after = human_duration(Duration::from_secs(timeout_s.unsigned_abs()));
    Ok(Some(format!(
        "is {after}: PostgreSQL invalidates a slot no relay has streamed from for {after} \
         (wal_status lost, outboxd exits 3, and the events since must be re-published; \
         messages emitted with pg_logical_emit_message since then that Kafka lacks are lost). \
         outboxd's status updates keep the slot alive while it streams, but a relay down \
         (or only standing by) for longer than {after} loses it. Set \
         idle_replication_slot_timeout = 0 for this cluster, or alert on the relay's \
         absence (OutboxdAbsent, OutboxdNotStreaming) well before {after}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(idle_replication_slot_timeout_s: Option<i64>) -> ServerSettings {
        ServerSettings {
            wal_level: "logical".into(),
            max_replication_slots: 10,
            replication_slots_in_use: 1,
            max_wal_senders: 10,
            wal_senders_in_use: 1,
            max_slot_wal_keep_size_mb: Some(1024),
            idle_replication_slot_timeout_s,
        }
    }

    fn idle_verdict(timeout_s: Option<i64>) -> Option<Verdict> {
        judge_server(&settings(timeout_s), true)
            .into_iter()
            .find(|(name, _)| *name == "idle_replication_slot_timeout")
            .map(|(_, verdict)| verdict)
    }

    #[test]
    fn idle_slot_timeout_is_judged_only_where_it_exists() {
        assert_eq!(idle_verdict(None), None, "before PostgreSQL 18");
        assert_eq!(idle_verdict(Some(0)), Some(Ok(None)), "0 is off");
    }

    #[test]
    fn a_set_idle_slot_timeout_warns_with_the_fix() {
        let Some(Ok(Some(warning))) = idle_verdict(Some(3600)) else {
            panic!("a warning: {:?}", idle_verdict(Some(3600)));
        };
        assert!(warning.contains("1h00m"), "{warning}");
        assert!(
            warning.contains("idle_replication_slot_timeout = 0"),
            "names the fix: {warning}"
        );
        assert!(warning.contains("OutboxdAbsent"), "{warning}");
    }
}
