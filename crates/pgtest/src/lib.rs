//! A throwaway PostgreSQL cluster for integration tests.
//!
//! Tests never mock Postgres: each test binary starts a real cluster (`initdb` + `pg_ctl`)
//! in a temp dir with `wal_level=logical` on a free loopback port, and each test takes its
//! own database, slot and publication names from [`PgCluster::fresh_database`], so tests run
//! in parallel and leave nothing behind. A watchdog process stops the server when the test
//! process exits, even if it panicked or was killed, because statics are never dropped.

mod binaries;
mod cluster;
mod database;

pub use binaries::{bindir_for_major, find_bindir, PgBinaries, DEFAULT_PG_ROOT};
pub use cluster::{ClusterOptions, PgCluster, PgTestError, StopMode};
pub use database::TestDb;
