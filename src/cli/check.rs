//! `outboxd check`: every prerequisite, each reported as ok or FAIL with the fix.

use std::collections::BTreeSet;

use outbox_core::{BoundTable, EventFields, TableSpec, TopicField};
use outboxd_relay::kafka::{build_producer, ProgressStore, RelayProducer};
use outboxd_relay::pipeline::{
    compare_publication, judge_missing_slot, judge_publication, judge_server, judge_slot,
    judge_unrecorded_publication, look_at_publication, missing_table, outbox_rows,
    refuse_other_cluster, table_candidates, verify_shard_layout, BadRowPolicy, Consent, History,
    MIN_SERVER_VERSION_NUM,
};
use pgoutput::{Column, Relation, ReplicaIdentity};
use pgrepl::{
    preflight, AuthMethod, ChannelBinding, ConnectConfig, ReplicationConnection, SslMode,
    SystemInfo,
};
use tokio_postgres::Client;

use super::{say, EXIT_CHECK_FAILED, EXIT_OK};
use crate::config::{FailoverSlot, Settings};
use crate::wiring;

struct Report {
    failed: usize,
}

impl Report {
    fn ok(&mut self, what: &str, detail: impl std::fmt::Display) {
        say!("ok    {what}: {detail}");
    }

    /// Works, but deserves attention; does not fail the check.
    fn warn(&mut self, what: &str, advice: impl std::fmt::Display) {
        say!("warn  {what}: {advice}");
    }

    fn fail(&mut self, what: &str, fix: impl std::fmt::Display) {
        self.failed += 1;
        say!("FAIL  {what}: {fix}");
    }
}

pub async fn check(s: &Settings) -> i32 {
    let mut r = Report { failed: 0 };
    let all = wiring::connect_config(s);
    let (pg, sql) = match all.connect_sql_target().await {
        Ok((pg, sql)) => {
            r.ok("postgres connection", pg.target());
            (pg, Some(sql))
        }
        Err(e) => {
            r.fail("postgres connection", e);
            (all, None)
        }
    };
    check_connection_security(&mut r, &pg);
    // What decides whether the role may replicate is whether the server lets it: the
    // REPLICATION attribute is one way, a provider's role (RDS's rds_replication) another.
    let system = match ReplicationConnection::connect(&pg).await {
        Ok(mut conn) => match conn.identify_system().await {
            Ok(sys) => {
                r.ok(
                    "replication connection",
                    format!(
                        "system {} timeline {} at {}",
                        sys.system_id, sys.timeline, sys.xlog_pos
                    ),
                );
                Some(sys)
            }
            Err(e) => {
                r.fail("replication connection", e);
                None
            }
        },
        Err(e) if e.sqlstate() == Some("42501") => {
            r.fail(
                "replication connection",
                format!(
                    "{e}; role {user} may not replicate: ALTER ROLE {user} WITH REPLICATION \
                     (see sql/role.sql), or on a managed service grant its replication role \
                     (RDS: GRANT rds_replication TO {user})",
                    user = s.pg.user
                ),
            );
            None
        }
        Err(e) if sql.is_some() => {
            r.fail(
                "replication connection",
                format!("{e}; pg_hba.conf must allow this user to connect to the database (logical replication uses the database's own lines)"),
            );
            None
        }
        // The same failure as the SQL connection's, already counted.
        Err(_) => None,
    };
    if let Some(sql) = &sql {
        check_postgres(&mut r, s, sql, system.is_some()).await;
        let shards = s.all_shards();
        if let Some(spec) = shards.first().and_then(|view| view.shard.as_ref()) {
            check_table(&mut r, s, sql).await;
            match verify_shard_layout(sql, spec).await {
                Ok(()) => r.ok(
                    "shards",
                    format!(
                        "{} is partitioned by hash of {} into {} partitions, {}_shard_0..{}",
                        spec.root_name(),
                        spec.key_column,
                        spec.count,
                        spec.root_table,
                        spec.count.saturating_sub(1)
                    ),
                ),
                Err(e) => r.fail("shards", e),
            }
        }
        // Every shard, relayed here or not: a shard nobody relays is a partition whose
        // rows go nowhere, and the shard processes share these settings.
        for view in &shards {
            check_table(&mut r, view, sql).await;
            check_publication(&mut r, view, sql).await;
            check_slot(&mut r, view, (&pg, sql), system.as_ref()).await;
            check_failover(&mut r, view, sql).await;
        }
        if s.relay_table {
            check_retention(&mut r, s, sql).await;
        }
    }
    let event_topics = match &sql {
        Some(sql) => event_topics(&mut r, s, sql).await,
        None => fixed_topic(s),
    };
    check_kafka(&mut r, s, &event_topics).await;
    if r.failed == 0 {
        say!("all checks passed");
        EXIT_OK
    } else {
        say!("{} check(s) failed", r.failed);
        EXIT_CHECK_FAILED
    }
}

/// How far the relay can trust that it talks to the server the operator meant: a TLS mode
/// below verify-full, and a password the server could ask for in cleartext, are warnings.
fn check_connection_security(r: &mut Report, pg: &ConnectConfig) {
    let what = "postgres connection security";
    if pg.is_unix_socket() {
        r.ok(
            what,
            "Unix socket (no TLS; the kernel is the transport, as in libpq)",
        );
    } else {
        let root = pg.ssl_root_cert.is_some();
        let risk = match pg.ssl_mode {
            SslMode::VerifyFull => None,
            SslMode::Disable => Some("no TLS: every change, and any password the server asks for in cleartext, travel unencrypted, and whichever host answers is believed"),
            SslMode::Prefer if root => Some("a server (or a man in the middle) that declines TLS gets a plaintext connection without a word; with TLS the chain is checked against PGSSLROOTCERT but not the host name"),
            SslMode::Prefer => Some("a server (or a man in the middle) that declines TLS gets a plaintext connection without a word, and with TLS any certificate is accepted"),
            SslMode::Require if root => Some("the certificate's chain is checked against PGSSLROOTCERT (as verify-ca) but not its host name"),
            SslMode::Require => Some("encrypted, but any certificate is accepted: an impostor with a certificate of its own is believed"),
            SslMode::VerifyCa => Some("any certificate that CA signed is accepted, whatever host it names"),
        };
        match risk {
            Some(risk) => r.warn(
                what,
                format!(
                    "sslmode={}: {risk}; set PGSSLMODE=verify-full with PGSSLROOTCERT naming the CA that signed the server certificate (or PGSSLROOTCERT=system for a public CA)",
                    pg.ssl_mode
                ),
            ),
            None => r.ok(
                what,
                format!(
                    "sslmode=verify-full, channel_binding={}, require_auth={}",
                    pg.channel_binding,
                    pg.require_auth.as_str()
                ),
            ),
        }
    }
    let cleartext_possible = pg.require_auth.allows(AuthMethod::Password)
        && pg.channel_binding != ChannelBinding::Require
        && pg.effective_password().is_some();
    if cleartext_possible {
        let over = if pg.ssl_mode == SslMode::Disable || pg.ssl_mode == SslMode::Prefer {
            ", possibly over an unencrypted connection"
        } else {
            ""
        };
        r.warn(
            "postgres password",
            format!(
                "a server that asks for a cleartext password (pg_hba `password`) is given it{over}; set PGREQUIREAUTH=scram-sha-256 (or PGCHANNELBINDING=require) so only SCRAM is answered"
            ),
        );
    }
}

async fn check_postgres(r: &mut Report, s: &Settings, sql: &Client, replicates: bool) {
    // The same rules `run` applies before it opens the replication connection.
    match sql
        .query_one(
            "SELECT pg_catalog.current_setting('server_version_num')::int4",
            &[],
        )
        .await
        .and_then(|row| row.try_get::<_, i32>(0))
    {
        Ok(v) if u32::try_from(v).is_ok_and(|v| v >= MIN_SERVER_VERSION_NUM) => {
            r.ok("server version", v)
        }
        Ok(v) => r.fail(
            "server version",
            format!("server_version_num {v}: outboxd needs PostgreSQL 14 or newer"),
        ),
        Err(e) => r.fail("server version", e),
    }
    let slot_exists = matches!(preflight::slot_state(sql, &s.slot).await, Ok(Some(_)));
    match preflight::server_settings(sql).await {
        Ok(settings) => {
            for (setting, verdict) in judge_server(&settings, slot_exists) {
                let value = match setting {
                    "wal_level" => settings.wal_level.clone(),
                    "max_replication_slots" => format!(
                        "{} ({} in use)",
                        settings.max_replication_slots, settings.replication_slots_in_use
                    ),
                    "max_wal_senders" => format!(
                        "{} ({} in use)",
                        settings.max_wal_senders, settings.wal_senders_in_use
                    ),
                    "idle_replication_slot_timeout" => {
                        match settings.idle_replication_slot_timeout_s {
                            Some(0) => "0 (off: an idle slot is kept)".into(),
                            Some(t) => format!("{t}s"),
                            None => "not supported (PostgreSQL < 18)".into(),
                        }
                    }
                    _ => settings.max_slot_wal_keep_size_mb.map_or_else(
                        || "not supported (PostgreSQL < 13)".into(),
                        |mb| format!("{mb}MB"),
                    ),
                };
                match verdict {
                    Ok(None) => r.ok(setting, value),
                    Ok(Some(warning)) => r.warn(setting, warning),
                    Err(problem) => r.fail(setting, problem),
                }
            }
        }
        Err(e) => r.fail("server settings", e),
    }
    match preflight::role_can_replicate(sql, &s.pg.user).await {
        Ok(true) => r.ok("REPLICATION attribute", &s.pg.user),
        // Advisory: the replication connection above is the test that counts.
        Ok(false) if replicates => r.warn(
            "REPLICATION attribute",
            format!(
                "role {} does not have it in pg_roles, but the replication connection \
                 succeeded (replication granted another way, e.g. rds_replication)",
                s.pg.user
            ),
        ),
        Ok(false) => r.warn(
            "REPLICATION attribute",
            format!(
                "role {user} does not have it: ALTER ROLE {user} WITH REPLICATION",
                user = s.pg.user
            ),
        ),
        Err(e) => r.warn("REPLICATION attribute", e),
    }
    if let Some(prefix) = &s.message_prefix {
        check_emit_privilege(r, prefix, sql).await;
    }
}

/// The slot as `run` judges it at start-up, including whether it would create a missing
/// one: only with OUTBOXD_CREATE_SLOT=true, a progress topic, and no record of an earlier
/// slot of this name.
async fn check_slot(
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
    let identity = super::slot_identity(s, &system.system_id);
    let store = match ProgressStore::new(&wiring::producer_settings(s), topic) {
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
    let table = format!("{}.{}", s.table_schema, s.table_name);
    match judge_missing_slot(&s.slot, &table, topic, History::Read(&found), rows, Consent::default()) {
        Ok(_) => r.ok(what, format!("{} does not exist yet; `outboxd run` will create it (OUTBOXD_CREATE_SLOT=true, no earlier slot recorded in {topic}, and {table} has no rows)", s.slot)),
        Err(e) => r.fail(what, e),
    }
}

/// Whether the slot's progress record is this cluster's own: written on this history
/// (no position past this server's WAL end) by one lineage at a time. Either failing
/// only costs duplicates (replays are published when not proven), but it means another
/// copy of the cluster records under the same key, and the operator should know.
async fn check_record(
    r: &mut Report,
    s: &Settings,
    (pg, sql): (&ConnectConfig, &Client),
    system: &SystemInfo,
) {
    let what = "progress record";
    let Some(topic) = &s.progress_topic else {
        return;
    };
    if s.bootstrap_servers.trim().is_empty() {
        return;
    }
    let identity = super::slot_identity(s, &system.system_id);
    let store = match ProgressStore::new(&wiring::producer_settings(s), topic) {
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
async fn check_failover(r: &mut Report, s: &Settings, sql: &Client) {
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

/// The same rule `run` applies at start-up and while streaming.
async fn check_publication(r: &mut Report, s: &Settings, sql: &Client) {
    let what = "publication";
    let coverage =
        match preflight::publication_coverage(sql, &s.publication, &s.table_schema, &s.table_name)
            .await
        {
            Ok(Some(c)) => c,
            Ok(None) => {
                return r.fail(
                    what,
                    format!(
                        "{} does not exist: run `outboxd init` or sql/publication.sql",
                        s.publication
                    ),
                )
            }
            Err(e) => return r.fail(what, e),
        };
    if !s.relay_table {
        return r.ok(
            what,
            format!(
                "{} exists; OUTBOXD_RELAY_TABLE=false: only emitted messages are relayed",
                s.publication
            ),
        );
    }
    let table = format!("{}.{}", s.table_schema, s.table_name);
    let candidates = match table_candidates(sql, &coverage, &s.column_aggregate_id).await {
        Ok(c) => c,
        Err(e) => return r.fail(what, e),
    };
    match judge_publication(&coverage, &s.publication, &table, &candidates) {
        Ok(None) => r.ok(
            what,
            format!(
                "{} publishes the inserts of {table}{}",
                s.publication,
                if coverage.table_kind.as_deref() == Some("p") {
                    " (partitioned, named after the table: publish_via_partition_root)"
                } else {
                    ""
                }
            ),
        ),
        Ok(Some(warning)) => r.warn(what, warning),
        Err(problem) => r.fail(what, problem),
    }
}

/// With emitted messages on, whoever can call pg_logical_emit_message publishes events.
async fn check_emit_privilege(r: &mut Report, prefix: &str, sql: &Client) {
    let what = "emitted messages";
    match preflight::emit_message_functions_public_can_execute(sql).await {
        Ok(functions) if functions.is_empty() => r.ok(
            what,
            format!("prefix {prefix:?}; PUBLIC cannot execute pg_logical_emit_message"),
        ),
        Ok(functions) => {
            let revokes: Vec<String> = functions
                .iter()
                .map(|f| format!("REVOKE EXECUTE ON FUNCTION pg_catalog.{f} FROM PUBLIC;"))
                .collect();
            r.fail(
                what,
                format!(
                    "OUTBOXD_MESSAGE_PREFIX={prefix:?} relays pg_logical_emit_message(true, {prefix:?}, ...) \
                     as events, and PUBLIC can execute that function, so any role can publish events. \
                     Run: {} then GRANT EXECUTE on it to the roles that may publish (see sql/role.sql), \
                     or unset OUTBOXD_MESSAGE_PREFIX",
                    revokes.join(" ")
                ),
            )
        }
        Err(e) => r.fail(what, e),
    }
}

/// outboxd never marks or deletes a row: a table nothing deletes from grows forever.
async fn check_retention(r: &mut Report, s: &Settings, sql: &Client) {
    const WHAT: &str = "retention";
    match pgrepl::preflight::table_churn(sql, &s.table_schema, &s.table_name).await {
        Ok(Some((inserted, 0))) if inserted >= RETENTION_WARN_ROWS => r.warn(
            WHAT,
            format!(
                "{inserted} rows were inserted into {}.{} and none deleted: outboxd does not mark or delete relayed rows. Schedule `outboxd prune --older-than 7d` (docs/operations.md, \"The table after CDC\")",
                s.table_schema, s.table_name
            ),
        ),
        Ok(Some((inserted, deleted))) => r.ok(
            WHAT,
            format!("{inserted} rows inserted, {deleted} deleted (`outboxd prune` deletes relayed rows)"),
        ),
        Ok(None) => {}
        Err(e) => r.warn(WHAT, e),
    }
}

/// Rows inserted with none deleted past which `check` asks for a retention.
const RETENTION_WARN_ROWS: i64 = 1_000_000;

async fn check_table(r: &mut Report, s: &Settings, sql: &Client) {
    let what = "outbox table";
    let spec = match wiring::table_spec(s) {
        Ok(spec) => spec,
        Err(e) => return r.fail(what, format!("{e:#}")),
    };
    match preflight::table_columns(sql, &s.table_schema, &s.table_name).await {
        Ok(Some(cols)) => {
            // Bind exactly as the relay will when the Relation message arrives.
            let relation = Relation {
                xid: None,
                rel_id: 0,
                namespace: s.table_schema.clone(),
                name: s.table_name.clone(),
                replica_identity: ReplicaIdentity::Default,
                columns: cols
                    .into_iter()
                    .map(|(name, _, type_oid)| Column {
                        flags: 0,
                        name,
                        type_oid,
                        type_modifier: -1,
                    })
                    .collect(),
            };
            match BoundTable::bind(&relation, &spec) {
                Ok(b) => r.ok(
                    what,
                    format!(
                        "{}.{} (payload {})",
                        s.table_schema,
                        s.table_name,
                        b.payload_kind().as_str()
                    ),
                ),
                Err(e) => r.fail(what, e),
            }
        }
        Ok(None) if !s.relay_table => r.ok(
            what,
            format!(
                "{}.{} does not exist; OUTBOXD_RELAY_TABLE=false: only emitted messages (prefix {:?}) are relayed",
                s.table_schema,
                s.table_name,
                s.message_prefix.as_deref().unwrap_or("")
            ),
        ),
        Ok(None) => {
            let candidates = preflight::tables_with_column(sql, &s.column_aggregate_id).await;
            r.fail(
                what,
                missing_table(
                    &format!("{}.{}", s.table_schema, s.table_name),
                    &candidates.unwrap_or_default(),
                ),
            )
        }
        Err(e) => r.fail(what, e),
    }
}

/// How many distinct topics `check` renders from the rows at most: enough for any
/// template that routes by type, and a bounded query for one that routes by id.
const MAX_CHECKED_TOPICS: usize = 1000;

/// How long the scan for the template's values may take.
const DISTINCT_TIMEOUT_MS: u32 = 30_000;

/// The fixed OUTBOXD_TOPIC, or nothing when it is a template (its topics come from rows).
fn fixed_topic(s: &Settings) -> BTreeSet<String> {
    wiring::table_spec(s)
        .ok()
        .and_then(|spec| spec.topic.fixed_topic().map(|t| t.to_string()))
        .into_iter()
        .collect()
}

/// The event topics the relay would write for the rows now in the table: the template
/// rendered, as the relay renders it, over the distinct values of the columns its
/// placeholders name. Rows that render no valid topic are reported as the relay would
/// treat them.
async fn event_topics(r: &mut Report, s: &Settings, sql: &Client) -> BTreeSet<String> {
    let what = "event topics";
    let Ok(spec) = wiring::table_spec(s) else {
        // A template that does not parse is a configuration error, refused before this.
        return BTreeSet::new();
    };
    let template = spec.topic.as_str();
    if let Some(fixed) = spec.topic.fixed_topic() {
        return BTreeSet::from([fixed.to_string()]);
    }
    if !s.relay_table {
        r.warn(what, format!("OUTBOXD_RELAY_TABLE=false: the topics template {template:?} renders from emitted messages cannot be checked; make sure each exists"));
        return BTreeSet::new();
    }
    let placeholders = Placeholders::of(&spec);
    let table = format!("{}.{}", s.table_schema, s.table_name);
    let (rows, cut) = match preflight::distinct_values(
        sql,
        &s.table_schema,
        &s.table_name,
        &placeholders.columns(),
        MAX_CHECKED_TOPICS,
        DISTINCT_TIMEOUT_MS,
    )
    .await
    {
        Ok(found) => found,
        // No such table or column: the outbox table's own line already says so.
        Err(e) if matches!(e.sqlstate(), Some("42P01" | "42703")) => return BTreeSet::new(),
        Err(e) => {
            r.warn(what, format!("cannot read the values of {} in {table} ({e}), so the topics template {template:?} renders cannot be checked: grant SELECT on those columns to this role to check them, or make sure each topic exists", placeholders.columns().join(", ")));
            return BTreeSet::new();
        }
    };
    if rows.is_empty() {
        r.warn(what, format!("{table} has no rows, so the topics template {template:?} renders cannot be checked from rows: make sure each topic exists before a row that renders it is inserted (a missing topic stops the relay)"));
        return BTreeSet::new();
    }
    if cut {
        r.warn(what, format!("{table} has more than {MAX_CHECKED_TOPICS} distinct values of {}: only the topics of the first {MAX_CHECKED_TOPICS} are checked", placeholders.columns().join(", ")));
    }
    let mut topics = BTreeSet::new();
    let mut invalid = Vec::new();
    for row in &rows {
        match placeholders.render(&spec, row) {
            Some(Ok(topic)) => {
                topics.insert(topic);
            }
            Some(Err(e)) => invalid.push(e),
            // A NULL id, type or aggregate id: a bad row for another reason than its topic.
            None => {}
        }
    }
    if let Some(first) = invalid.first() {
        let problem = format!(
            "{} distinct value(s) of {} in {table} render no valid topic, e.g. {first}",
            invalid.len(),
            placeholders.columns().join(", ")
        );
        match s.bad_row_policy {
            BadRowPolicy::Stop => r.fail(
                what,
                format!("{problem}; with OUTBOXD_BAD_ROW_POLICY=stop the relay stops (exit 4) at the first such row"),
            ),
            BadRowPolicy::DeadLetter => r.warn(
                what,
                format!("{problem}; such rows go to the dead-letter topic {}", s.dead_letter_topic),
            ),
        }
    }
    topics
}

/// Which table column each placeholder of the topic template reads.
struct Placeholders {
    /// The logical fields the template uses, with their columns.
    fields: Vec<(TopicField, String)>,
    /// The template's own column placeholders.
    columns: Vec<String>,
}

impl Placeholders {
    fn of(spec: &TableSpec) -> Placeholders {
        let c = &spec.columns;
        let fields = TopicField::ALL
            .into_iter()
            .filter(|f| spec.topic.uses(*f))
            .map(|f| {
                let column = match f {
                    TopicField::Id => &c.id,
                    TopicField::AggregateType => &c.aggregate_type,
                    TopicField::AggregateId => &c.aggregate_id,
                    TopicField::EventType => &c.event_type,
                };
                (f, column.clone())
            })
            .collect();
        let columns = spec
            .topic
            .columns()
            .into_iter()
            .map(str::to_owned)
            .collect();
        Placeholders { fields, columns }
    }

    /// The columns to read, in the order [`Placeholders::render`] takes their values.
    fn columns(&self) -> Vec<&str> {
        self.fields
            .iter()
            .map(|(_, c)| c.as_str())
            .chain(self.columns.iter().map(String::as_str))
            .collect()
    }

    /// The topic the relay would render for a row with these values; `None` when a
    /// logical field is NULL (the row is refused before its topic is rendered).
    fn render(
        &self,
        spec: &TableSpec,
        values: &[Option<String>],
    ) -> Option<Result<String, outbox_core::RowError>> {
        let (field_values, column_values) = values.split_at(self.fields.len().min(values.len()));
        let field = |wanted: TopicField| -> Option<&str> {
            match self.fields.iter().position(|(f, _)| *f == wanted) {
                Some(i) => field_values.get(i).and_then(Option::as_deref),
                None => Some(""),
            }
        };
        let columns: Vec<(&str, Option<&str>)> = self
            .columns
            .iter()
            .zip(column_values)
            .map(|(name, v)| (name.as_str(), v.as_deref()))
            .collect();
        let fields = EventFields {
            id: field(TopicField::Id)?,
            aggregate_type: field(TopicField::AggregateType)?,
            aggregate_id: field(TopicField::AggregateId)?,
            event_type: field(TopicField::EventType)?,
            columns: &columns,
        };
        Some(spec.topic.render(&fields).map(|t| t.to_string()))
    }
}

async fn check_kafka(r: &mut Report, s: &Settings, event_topics: &BTreeSet<String>) {
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let producer = match build_producer(&wiring::producer_settings(s), tx) {
        Ok(p) => p,
        Err(e) => return r.fail("kafka producer settings", e),
    };
    let info = match producer.check_broker_reachable(wiring::BROKER_CHECK_TIMEOUT) {
        Ok(info) => info,
        Err(e) => return r.fail("kafka", format!("{e}; check OUTBOXD_KAFKA_BOOTSTRAP_SERVERS and OUTBOXD_KAFKA_SECURITY_PROTOCOL/SASL settings")),
    };
    r.ok(
        "kafka",
        format!(
            "{} broker(s), answered by {}",
            info.brokers.len(),
            info.answered_by
        ),
    );
    let mut creates = AutoCreate {
        producer: &producer,
        broker: info.brokers.first().map(|b| b.id),
        known: None,
    };
    let missing: Vec<&String> = event_topics
        .iter()
        .filter(|t| !info.topics.contains(*t))
        .collect();
    if !event_topics.is_empty() && missing.is_empty() {
        r.ok(
            "event topics",
            format!("{} exist", list(event_topics.iter(), 10)),
        );
    } else if !missing.is_empty() {
        let names = list(missing.iter(), 20);
        let absent = format!(
            "missing from the brokers' metadata (they do not exist, or this principal may not Describe them): {names}"
        );
        match creates.verdict().await {
            Ok(true) => r.warn("event topics", format!("{absent}; the brokers create topics on first use (auto.create.topics.enable=true), so the relay's first write creates each with the brokers' defaults (num.partitions, default.replication.factor): create them yourself to choose")),
            creates_or_not => r.fail(
                "event topics",
                format!(
                    "{absent}: the relay stops (exit 5) at the first event for a missing topic. Fix: create each with the partitions and replication you want (kafka-topics.sh --create --topic {} --partitions <n> --replication-factor <r>), and let outboxd's principal Write it{}",
                    missing[0],
                    unknown_auto_create(creates_or_not)
                ),
            ),
        }
    }
    if s.bad_row_policy == BadRowPolicy::DeadLetter {
        let dlq = &s.dead_letter_topic;
        if info.topics.contains(dlq) {
            r.ok("dead-letter topic", dlq);
        } else {
            let absent = format!("{dlq} (OUTBOXD_DEAD_LETTER_TOPIC) is not in the brokers' metadata (missing, or this principal may not Describe it)");
            match creates.verdict().await {
                Ok(true) => r.warn("dead-letter topic", format!("{absent}; the brokers create topics on first use (auto.create.topics.enable=true), so the first bad row creates it with their defaults: create it yourself to choose")),
                creates_or_not => r.fail(
                    "dead-letter topic",
                    format!(
                        "{absent}: the relay stops (exit 5) at the first bad row. Fix: create it (kafka-topics.sh --create --topic {dlq} ...) and let outboxd's principal Write it, or set OUTBOXD_BAD_ROW_POLICY=stop{}",
                        unknown_auto_create(creates_or_not)
                    ),
                ),
            }
        }
    }
    if let Some(topic) = &s.progress_topic {
        check_progress_topic(r, s, topic, info.topics.contains(topic)).await;
    }
    if s.transactions.is_some() {
        check_transactions(r, s, &producer, info.brokers.first().map(|b| b.id)).await;
    }
}

/// OUTBOXD_DELIVERY=exactly-once: the brokers run transactions and accept outboxd's
/// transaction.timeout.ms (a larger one fails `init_transactions` at start-up).
async fn check_transactions(
    r: &mut Report,
    s: &Settings,
    producer: &RelayProducer,
    broker: Option<i32>,
) {
    let what = "Kafka transactions (OUTBOXD_DELIVERY=exactly-once)";
    let Some(id) = broker else {
        return r.fail(what, "no broker listed");
    };
    let wanted = wiring::producer_settings(s).transaction_timeout();
    let max = producer
        .broker_config(
            id,
            "transaction.max.timeout.ms",
            wiring::BROKER_CHECK_TIMEOUT,
        )
        .await;
    match max {
        Ok(Some(max)) => match max.trim().parse::<u64>() {
            Ok(max) if u128::from(max) >= wanted.as_millis() => r.ok(
                what,
                format!("transaction.timeout.ms {} is within the brokers' transaction.max.timeout.ms {max}", wanted.as_millis()),
            ),
            Ok(max) => r.fail(
                what,
                format!("transaction.timeout.ms {} is above the brokers' transaction.max.timeout.ms {max}: init_transactions would fail. Set OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS={max} or lower", wanted.as_millis()),
            ),
            Err(_) => r.warn(what, format!("transaction.max.timeout.ms reads {max:?}")),
        },
        Ok(None) => r.fail(
            what,
            "the brokers have no transaction.max.timeout.ms: they may not support transactions; use OUTBOXD_DELIVERY=at-least-once with them",
        ),
        Err(e) => r.warn(
            what,
            format!("the brokers' transaction.max.timeout.ms could not be read ({e}); `run` finds out at init_transactions"),
        ),
    }
}

/// Whether the brokers create a missing topic on first use, asked once and only when a
/// topic is missing (DescribeConfigs may be denied to a principal that needs nothing
/// else of it).
struct AutoCreate<'a> {
    producer: &'a RelayProducer,
    broker: Option<i32>,
    known: Option<Result<bool, String>>,
}

impl AutoCreate<'_> {
    async fn verdict(&mut self) -> Result<bool, String> {
        if let Some(known) = &self.known {
            return known.clone();
        }
        let verdict = match self.broker {
            Some(id) => self
                .producer
                .broker_creates_topics(id, wiring::BROKER_CHECK_TIMEOUT)
                .await
                .map_err(|e| e.to_string()),
            None => Err("no broker listed".to_owned()),
        };
        self.known = Some(verdict.clone());
        verdict
    }
}

fn unknown_auto_create(verdict: Result<bool, String>) -> String {
    match verdict {
        Ok(_) => String::new(),
        Err(e) => {
            format!(" (whether the brokers create topics on first use could not be read: {e})")
        }
    }
}

/// Up to `max` names, comma-separated, and how many more.
fn list<'a>(
    names: impl ExactSizeIterator<Item = &'a (impl std::fmt::Display + 'a)>,
    max: usize,
) -> String {
    let total = names.len();
    let shown: Vec<String> = names.take(max).map(ToString::to_string).collect();
    if total > max {
        format!("{} and {} more", shown.join(", "), total - max)
    } else {
        shown.join(", ")
    }
}

/// The progress topic exists, or `run` may create it: a validate-only CreateTopics
/// proves the permission without creating it.
async fn check_progress_topic(r: &mut Report, s: &Settings, topic: &str, exists: bool) {
    let what = "progress topic";
    if exists {
        return r.ok(what, topic);
    }
    let store = match ProgressStore::new(&wiring::producer_settings(s), topic) {
        Ok(store) => store,
        Err(e) => return r.fail(what, e),
    };
    let fix = format!("create it yourself: kafka-topics.sh --create --topic {topic} --partitions 1 --config cleanup.policy=compact --config segment.ms=600000, and let outboxd's principal Read, Write, Describe and DescribeConfigs it");
    match store.may_create_topic().await {
        Ok(()) => r.ok(what, format!("{topic} does not exist yet; `outboxd run` creates it (the brokers accepted a validate-only CreateTopics)")),
        Err(e) if e.is_denied() => r.fail(
            what,
            format!("{topic} does not exist, and this principal may not create it ({e}): grant outboxd's principal Create on it, or {fix}"),
        ),
        Err(e) => r.warn(
            what,
            format!("{topic} does not exist, and whether `outboxd run` may create it (it needs the Create permission) could not be told ({e}); to be sure, {fix}"),
        ),
    }
}

/// One standby named in OUTBOXD_CHECK_STANDBYS: what slot sync needs there, each setting
/// reported on its own so a misconfiguration names exactly what to change.
async fn check_standby(r: &mut Report, s: &Settings, host: &str, port: u16) {
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
fn conninfo_has_dbname(info: &str) -> bool {
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
    use super::{conninfo_has_dbname, list, Placeholders};
    use outbox_core::{OutboxColumns, TableSpec, TopicTemplate};
    use std::sync::Arc;

    fn spec(template: &str) -> TableSpec {
        TableSpec {
            columns: OutboxColumns {
                aggregate_type: "kind".to_owned(),
                ..OutboxColumns::default()
            },
            topic: Arc::new(TopicTemplate::parse(template).unwrap()),
            ..TableSpec::default()
        }
    }

    #[test]
    fn placeholders_read_the_configured_columns_and_render_as_the_relay() {
        let spec = spec("outbox.{tenant}.{aggregate_type}");
        let p = Placeholders::of(&spec);
        // The logical field by its configured column, then the template's own columns.
        assert_eq!(p.columns(), vec!["kind", "tenant"]);
        let row = |kind: Option<&str>, tenant: Option<&str>| {
            vec![kind.map(str::to_owned), tenant.map(str::to_owned)]
        };
        let rendered = p.render(&spec, &row(Some("Order"), Some("acme")));
        assert_eq!(rendered.unwrap().unwrap(), "outbox.acme.Order");
        // A NULL column placeholder or an invalid name: the relay's row error.
        let e = p
            .render(&spec, &row(Some("Order"), None))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("\"tenant\""), "{e}");
        let e = p
            .render(&spec, &row(Some("Order Lines"), Some("acme")))
            .unwrap()
            .unwrap_err();
        assert!(e.to_string().contains("not a valid Kafka topic"), "{e}");
        // A NULL logical field: refused before the topic is rendered.
        assert!(p.render(&spec, &row(None, Some("acme"))).is_none());
    }

    #[test]
    fn long_lists_are_cut() {
        let names: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
        assert_eq!(list(names.iter(), 10), "t0, t1, t2, t3, t4");
        assert_eq!(list(names.iter(), 2), "t0, t1 and 3 more");
    }

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
