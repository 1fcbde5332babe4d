//! `outboxd check`: every prerequisite, each reported as ok or FAIL with the fix.

use outbox_core::pgtype::quote_ident;
use outbox_core::BoundTable;
use outboxd_relay::pipeline::{
    judge_publication, judge_server, leftover_shards, missing_table, table_candidates,
    verify_shard_layout, MIN_SERVER_VERSION_NUM,
};
use pgoutput::{Column, Relation, ReplicaIdentity};
use pgrepl::{
    preflight, AuthMethod, ChannelBinding, ConnectConfig, ReplicationConnection, SslMode,
};
use tokio_postgres::Client;

use super::{say, EXIT_CHECK_FAILED, EXIT_OK};
use crate::config::Settings;
use crate::wiring;

mod kafka;
mod slot;

use kafka::{check_kafka, event_topics, fixed_topic};
use slot::{check_failover, check_slot};

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
                    user = quote_ident(&s.pg.user)
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
            match leftover_shards(sql, spec).await {
                Ok(Some(advice)) => r.warn("shards", advice),
                Ok(None) => {}
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
                user = quote_ident(&s.pg.user)
            ),
        ),
        Err(e) => r.warn("REPLICATION attribute", e),
    }
    if let Some(prefix) = &s.message_prefix {
        check_emit_privilege(r, prefix, sql).await;
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
    let table = s.table();
    let candidates = match table_candidates(sql, &coverage, &s.columns.aggregate_id).await {
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
            let candidates = preflight::tables_with_column(sql, &s.columns.aggregate_id).await;
            r.fail(
                what,
                missing_table(
                    &s.table(),
                    &candidates.unwrap_or_default(),
                ),
            )
        }
        Err(e) => r.fail(what, e),
    }
}
