//! `outboxd check`: the slot, its progress record, and failover.

use outboxd_relay::kafka::ProgressStore;
use outboxd_relay::pipeline::{
    compare_publication, judge_missing_slot, judge_slot, judge_unrecorded_publication,
    look_at_publication, outbox_rows, refuse_other_cluster, Consent, History,
};
use pgrepl::{preflight, ConnectConfig, SystemInfo};
use tokio_postgres::Client;

use crate::config::{FailoverSlot, Settings};
use crate::wiring;

use super::Report;

/// The slot as `run` judges it at start-up, including whether it would create a missing
/// one: only with OUTBOXD_CREATE_SLOT=true, a progress topic, and no record of an earlier
/// slot of this name.
pub(super) async fn check_slot(
    r: &mut Report,
    s: &Settings,
    (pg, sql): (&ConnectConfig, &Client),
    system: Option<&SystemInfo>,
) {
    let what = "slot";
    let state = match preflight::slot_state(sql, &s.slot).await {
        Ok(state) => state,
        Err(e) => return r.fail(what, e),
    };
    if let Some(st) = state {
        if let Some(system) = system {
            check_record(r, s, (pg, sql), system).await;
        }
        return match judge_slot(&st, &s.slot, &s.pg.dbname) {
            Ok(warning) => {
                r.ok(
                    what,
                    format!(
                        "{} confirmed {} wal_status {} safe_wal_size {}{}",
                        s.slot,
                        st.confirmed_flush_lsn
                            .map(|l| l.to_string())
                            .unwrap_or_default(),
                        st.wal_status.as_deref().unwrap_or_default(),
                        st.safe_wal_size.map_or_else(
                            || "unlimited (no max_slot_wal_keep_size)".into(),
                            |b| format!("{b} bytes")
                        ),
                        st.active_pid
                            .map(|p| format!(
                                ", active in pid {p} (another outboxd? it will wait as standby)"
                            ))
                            .unwrap_or_default()
                    ),
                );
                if let Some(w) = warning {
                    r.warn(what, w);
                }
            }
            Err(e) => r.fail(what, e),
        };
    }
    if !s.create_slot {
        return r.fail(
            what,
            format!(
                "{} does not exist: run `outboxd init` (OUTBOXD_CREATE_SLOT=false)",
                s.slot
            ),
        );
    }
    let Some(topic) = &s.progress_topic else {
        return r.fail(
            what,
            format!("{} does not exist, and with OUTBOXD_PROGRESS_TOPIC empty `outboxd run` does not create it: run `outboxd init`", s.slot),
        );
    };
    let Some(system) = system else {
        return r.warn(what, format!("{} does not exist; whether `outboxd run` may create it depends on the progress record, which needs the replication connection", s.slot));
    };
    let identity = crate::cli::slot_identity(s, &system.system_id);
    let store = match ProgressStore::new(&s.producer, topic) {
        Ok(store) => store,
        Err(e) => return r.fail(what, format!("cannot read the progress record: {e}")),
    };
    store.never_create_topic();
    let records = store.read_slot(&identity).await;
    if let Ok(found) = &records {
        if let Err(e) = refuse_other_cluster(found, &store, &identity) {
            return r.fail(what, e);
        }
    }
    let found = match records {
        Ok(found) => found,
        Err(e) => return r.warn(what, format!("{} does not exist, and the progress record in {topic} cannot be read ({e}); `outboxd run` creates the slot only once it can", s.slot)),
    };
    let relayed = s
        .relay_table
        .then_some((s.table_schema.as_str(), s.table_name.as_str()));
    let rows = match outbox_rows(sql, relayed).await {
        Ok(rows) => rows,
        Err(e) => return r.fail(what, e),
    };
    // The rule `run` applies (and `init`, with the operator's flags).
    let table = s.table();
    match judge_missing_slot(&s.slot, &table, topic, History::Read(&found), rows, Consent::default()) {
        Ok(_) => r.ok(what, format!("{} does not exist yet; `outboxd run` will create it (OUTBOXD_CREATE_SLOT=true, no earlier slot recorded in {topic}, and {table} has no rows)", s.slot)),
        Err(e) => r.fail(what, e),
    }
}

/// Whether the slot's progress record is this cluster's own: written on this history
/// (no position past this server's WAL end) by one lineage at a time. Either failing
/// only costs duplicates (replays are published when not proven), but it means another
/// copy of the cluster records under the same key, and the operator should know.
pub(super) async fn check_record(
    r: &mut Report,
    s: &Settings,
    (pg, sql): (&ConnectConfig, &Client),
    system: &SystemInfo,
) {
    let what = "progress record";
    let Some(topic) = &s.progress_topic else {
        return;
    };
    if s.producer.bootstrap_servers.trim().is_empty() {
        return;
    }
    let identity = crate::cli::slot_identity(s, &system.system_id);
    let store = match ProgressStore::new(&s.producer, topic) {
        Ok(store) => store,
        Err(e) => return r.warn(what, format!("cannot read it: {e}")),
    };
    store.never_create_topic();
    let found = match tokio::time::timeout(
        std::time::Duration::from_secs(20),
        store.read_slot(&identity),
    )
    .await
    {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => return r.warn(what, format!("cannot read it from {topic}: {e}")),
        Err(_) => return r.warn(what, format!("{topic} did not answer within 20 s")),
    };
    if let Err(e) = store.check_durable().await {
        return r.fail(what, e);
    }
    if s.relay_table && found.last_look().is_none() {
        // Nothing to compare with: the slot's catalog horizon says whether the publication
        // may have changed since it decoded, as `run` judges it.
        if let Err(e) =
            judge_unrecorded_publication(sql, &s.publication, &s.slot, identity.key(), topic).await
        {
            return r.fail("publication unchanged", e);
        }
    }
    if let Some(last) = found.last_look() {
        let table = s
            .relay_table
            .then_some((s.table_schema.as_str(), s.table_name.as_str()));
        let compared = look_at_publication(sql, (pg, &mut None), &s.publication, table)
            .await
            .map(|now| compare_publication(&s.publication, last, now.seen.as_ref()));
        match compared {
            Ok(Err(changed)) if table.is_some() => return r.fail("publication unchanged", changed),
            Ok(_) => r.ok(
                "publication unchanged",
                format!(
                    "{} is as outboxd last saw it ({})",
                    s.publication,
                    last.at_text()
                ),
            ),
            Err(e) => r.warn("publication unchanged", e),
        }
    }
    if let Some(owed) = found.republish.as_ref().filter(|o| !o.done) {
        r.warn(
            "re-publish owed",
            format!("{} ({}): {} may not be in Kafka, and `outboxd prune` deletes nothing until you re-publish them and run `outboxd init --republish-done` (docs/operations.md, \"A lost slot: re-publishing\")", owed.why, owed.recorded_at_text(), owed.rows),
        );
    }
    let Some(record) = &found.ours else {
        return r.ok(
            what,
            format!("none yet in {topic} (`outboxd run` writes it)"),
        );
    };
    let fix = "set OUTBOXD_CLUSTER_NAME to a different value on each copy of the cluster (or give each its own OUTBOXD_PROGRESS_TOPIC); after restoring an older backup, run `outboxd init --replace-progress-record`";
    if found.writers_alternate() {
        return r.fail(
            what,
            format!("key {} in {topic} is written by two relays in turn, each on another history (two live copies of one cluster share this Kafka): replays are published again rather than skipped; {fix}", identity.key()),
        );
    }
    match preflight::current_wal_lsn(sql).await {
        Ok(end) if record.confirmed_lsn() > end => r.fail(
            what,
            format!("it says confirmed {} (recorded {} by {}), past this server's WAL end {end}: it was written on another copy of this cluster, or before this server was restored from an older backup; {fix}", record.confirmed_lsn(), record.recorded_at_text(), if record.writer.is_empty() { "an older outboxd" } else { &record.writer }),
        ),
        Ok(_) => r.ok(
            what,
            format!("confirmed {} recorded {}, {} transactions named to prove replays by", record.confirmed_lsn(), record.recorded_at_text(), record.claim.marks.len()),
        ),
        Err(e) => r.warn(what, e),
    }
}

/// PG17+: whether the slot would survive a promotion. Missing pieces that only matter
/// once someone runs a standby are warnings; a setting that makes logical decoding wait
/// for a slot that cannot confirm is a failure.
pub(super) async fn check_failover(r: &mut Report, s: &Settings, sql: &Client) {
    let what = "failover slot";
    let version = match preflight::server_version_num(sql).await {
        Ok(v) => v,
        Err(e) => return r.fail(what, e),
    };
    let mode = s.failover_slot;
    if version < pgrepl::FAILOVER_SLOTS_VERSION {
        if mode == FailoverSlot::On {
            r.fail(what, "OUTBOXD_FAILOVER_SLOT=true, but failover slots need PostgreSQL 17 or later; set OUTBOXD_FAILOVER_SLOT=auto or false");
        } else {
            r.ok(what, "not available before PostgreSQL 17: the slot does not survive a failover (see the README's failover runbook)");
        }
        return;
    }
    match preflight::slot_failover(sql, &s.slot).await {
        Ok(Some(f)) if f.failover => r.ok(what, format!("{} has failover = true", s.slot)),
        Ok(Some(_)) if mode == FailoverSlot::Off => r.warn(
            what,
            format!(
                "{} has failover = false (OUTBOXD_FAILOVER_SLOT=false): a standby's promotion loses it",
                s.slot
            ),
        ),
        Ok(Some(_)) => r.warn(
            what,
            format!(
                "{} has failover = false; `outboxd init` or the next `outboxd run` switches it on (ALTER_REPLICATION_SLOT {} (FAILOVER true))",
                s.slot, s.slot
            ),
        ),
        Ok(None) if mode == FailoverSlot::Off => r.ok(what, "OUTBOXD_FAILOVER_SLOT=false: the slot will be created without failover"),
        Ok(None) => r.ok(what, format!("{} will be created with failover = true", s.slot)),
        Err(e) => r.fail(what, e),
    }
    for (host, port) in &s.check_standbys {
        check_standby(r, s, host, port.unwrap_or(s.pg.port)).await;
    }
    let what = "synchronized_standby_slots";
    let names = match preflight::synchronized_standby_slots(sql).await {
        Ok(n) => n,
        Err(e) => return r.fail(what, e),
    };
    if names.is_empty() {
        return r.warn(
            what,
            "is empty: outboxd may publish changes a standby has not received, so after a promotion Kafka can hold events the new primary lacks. On the primary: ALTER SYSTEM SET synchronized_standby_slots = '<standby physical slot>'; SELECT pg_reload_conf()",
        );
    }
    match preflight::standby_slots(sql, &names).await {
        Ok(slots) => {
            let mut problems = Vec::new();
            for st in &slots {
                match (st.slot_type.as_deref(), &st.invalidation_reason) {
                    (None, _) => problems.push(format!("{} does not exist (logical decoding of failover slots waits for it): create it with pg_create_physical_replication_slot('{}') and set it as the standby's primary_slot_name, or remove it from the list", st.name, st.name)),
                    (Some("physical"), Some(reason)) => problems.push(format!("{} is invalidated ({reason})", st.name)),
                    (Some("physical"), None) if !st.active => problems.push(format!("{} is not in use by a standby (decoding waits until it connects)", st.name)),
                    (Some("physical"), None) => {}
                    (Some(other), _) => problems.push(format!("{} is a {other} slot; list the standbys' physical slots", st.name)),
                }
            }
            if problems.is_empty() {
                r.ok(what, names.join(", "));
            } else {
                r.fail(what, problems.join("; "));
            }
        }
        Err(e) => r.fail(what, e),
    }
}

/// One standby named in OUTBOXD_CHECK_STANDBYS: what slot sync needs there, each setting
/// reported on its own so a misconfiguration names exactly what to change.
pub(super) async fn check_standby(r: &mut Report, s: &Settings, host: &str, port: u16) {
    let name = format!("standby {host}:{port}");
    let mut pg = wiring::connect_config(s);
    pg.host = host.to_owned();
    pg.port = port;
    let sql = match pg.connect_sql().await {
        Ok(sql) => sql,
        Err(e) => return r.fail(&name, format!("{e}; OUTBOXD_CHECK_STANDBYS names it")),
    };
    let settings = match preflight::standby_settings(&sql, &s.slot).await {
        Ok(v) => v,
        Err(e) => return r.fail(&name, e),
    };
    if !settings.in_recovery {
        return r.fail(
            &name,
            "is not in recovery (a primary, or promoted): list only standbys of this primary",
        );
    }
    let on = |v: &Option<String>| v.as_deref() == Some("on");
    let what = format!("{name} sync_replication_slots");
    if on(&settings.sync_replication_slots) {
        r.ok(&what, "on");
    } else {
        r.fail(&what, "is off: ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf() (on the standby), or its copy of the slot is not kept");
    }
    let what = format!("{name} hot_standby_feedback");
    if on(&settings.hot_standby_feedback) {
        r.ok(&what, "on");
    } else {
        r.fail(&what, "is off: slot sync needs it (ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf() on the standby)");
    }
    let what = format!("{name} primary_slot_name");
    match settings.primary_slot_name.as_deref().filter(|v| !v.is_empty()) {
        Some(slot) => r.ok(&what, slot),
        None => r.fail(&what, "is empty: slot sync needs the standby to stream from a physical slot on the primary (pg_create_physical_replication_slot on the primary, then primary_slot_name on the standby; list it in the primary's synchronized_standby_slots)"),
    }
    let what = format!("{name} primary_conninfo");
    match &settings.primary_conninfo {
        Some(info) if conninfo_has_dbname(info) => r.ok(&what, "has a dbname"),
        Some(_) => r.fail(&what, "has no dbname: slot sync connects to a database (add dbname=postgres to primary_conninfo on the standby)"),
        None => r.fail(&what, "cannot be read: grant pg_read_all_settings to the role outboxd connects as"),
    }
    let what = format!("{name} slot");
    match &settings.slot {
        Some(f) if f.synced && !f.temporary && f.invalidation_reason.is_none() => {
            r.ok(&what, format!("{} is synced and persistent", s.slot))
        }
        Some(f) if f.invalidation_reason.is_some() => r.fail(&what, format!("{}'s copy is invalidated ({}); it is not usable after a promotion", s.slot, f.invalidation_reason.as_deref().unwrap_or(""))),
        Some(f) if !f.synced => r.fail(&what, format!("a slot named {} exists there but is not a synced copy (left from an earlier role?): drop it on the standby so slot sync can create its copy", s.slot)),
        Some(_) => r.fail(&what, format!("{}'s copy is still temporary: the standby has not caught up with the slot, so a promotion now would lose it; wait, or advance the slot on the primary", s.slot)),
        None => r.fail(&what, format!("{} has no copy there yet: it needs failover = true on the primary and the settings above", s.slot)),
    }
}

/// `dbname=` in a keyword/value conninfo, or a database path in a URI.
pub(super) fn conninfo_has_dbname(info: &str) -> bool {
    if let Some(rest) = info
        .strip_prefix("postgresql://")
        .or_else(|| info.strip_prefix("postgres://"))
    {
        let path = rest.split('?').next().unwrap_or("");
        let has_path = path.split_once('/').is_some_and(|(_, db)| !db.is_empty());
        return has_path || rest.contains("dbname=");
    }
    info.split_whitespace().any(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, v)| k.trim() == "dbname" && !v.trim().is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbname_in_conninfo() {
        assert!(conninfo_has_dbname(
            "host=a port=5432 user=r dbname=postgres"
        ));
        assert!(!conninfo_has_dbname("host=a port=5432 user=r"));
        assert!(!conninfo_has_dbname("host=a dbname="));
        assert!(conninfo_has_dbname("postgresql://r@a:5432/postgres"));
        assert!(conninfo_has_dbname("postgres://a?dbname=x"));
        assert!(!conninfo_has_dbname("postgresql://r@a:5432"));
    }
}
