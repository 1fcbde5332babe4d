//! outboxd's end-to-end tests, one binary: the real `outboxd` against real PostgreSQL
//! (pgtest) and a Kafka-protocol broker (outboxd-test-broker). One binary links once per
//! edit instead of once per file, and its tests share one throwaway cluster,
//! `PgCluster::shared()`; a test that stops, restarts or reconfigures PostgreSQL starts its
//! own. Each module is a former `tests/<name>.rs`, so `crash::` or `--skip tansu` still pick
//! them out: `cargo test --release --locked --test e2e -- crash:: ops_`.

#[path = "../support/mod.rs"]
mod support;

mod ack_gating;
mod adopt_diagnostics;
mod backfill;
mod bad_row_advance;
mod bad_rows;
mod big_transaction;
mod binary_mode;
mod bounded_memory;
mod catalog_locks;
mod catch_up;
mod check_topics;
mod compose_env;
mod consumer_kits;
mod crash;
mod dead_connection;
mod exactly_once;
mod exactly_once_effect;
mod failover;
mod failover_slot;
mod filters;
mod header_formats;
mod huge_message;
mod invisible_commit;
mod kafka_cluster;
mod keyword_names;
mod libpq_parity;
mod logical_messages;
mod lost_slot_time;
mod monitoring_kit;
mod ops_check_parity;
mod ops_cli;
mod ops_conn_errors;
mod ops_errors;
mod ops_http;
mod ops_idle_wal;
mod ops_init;
mod ops_lifecycle;
mod ops_reconnect;
mod partial_transaction;
mod partitioned_outbox;
mod partitioner_handover;
mod pgoutput_versions;
mod progress_record_trust;
mod proven_skip;
mod prune;
mod publication_history;
mod record_size;
mod relay_e2e;
mod replay_skip;
mod republish;
mod shard_changes;
mod shard_lowering;
mod shards;
mod slot_history;
mod slot_lifecycle;
mod slot_rename;
mod sql_immunity;
mod standby_ready;
mod timeline_fork;
mod tls_parity;
