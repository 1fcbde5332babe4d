//! A fresh database per test, with unique slot and publication names.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::PgCluster;

/// One test's private database. Slots are cluster-wide, so their names carry the
/// database's unique name too.
#[derive(Debug)]
pub struct TestDb<'c> {
    cluster: &'c PgCluster,
    pub name: String,
    pub slot: String,
    pub publication: String,
}

impl PgCluster {
    /// Creates a database with a name unique to this process and call, e.g. `relay_e2e_4211_3`.
    pub async fn fresh_database(&self, prefix: &str) -> TestDb<'_> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let clean: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(30)
            .collect();
        let name = format!("{clean}_{}_{n}", std::process::id());
        let admin = self.admin_client("postgres").await;
        if let Err(e) = admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
        {
            panic!("cannot create test database {name}: {e}");
        }
        TestDb {
            cluster: self,
            slot: format!("{name}_slot"),
            publication: format!("{name}_pub"),
            name,
        }
    }
}

impl<'c> TestDb<'c> {
    pub fn cluster(&self) -> &'c PgCluster {
        self.cluster
    }

    /// A superuser connection to this database.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.cluster.admin_client(&self.name).await
    }

    pub fn conn_string(&self) -> String {
        self.cluster.conn_string(&self.name)
    }

    /// libpq environment variables pointing at this database, for spawning programs.
    pub fn pg_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PGHOST", self.cluster.host().to_owned()),
            ("PGPORT", self.cluster.port().to_string()),
            ("PGUSER", self.cluster.superuser().to_owned()),
            ("PGDATABASE", self.name.clone()),
        ]
    }
}

/// Best effort: the database and its slots go when the test ends. A test binary shares one
/// cluster among all its tests, and a slot left behind would count against
/// `max_replication_slots`, pin WAL and hold back catalog vacuum for the rest of the run.
impl Drop for TestDb<'_> {
    fn drop(&mut self) {
        let name = self.name.replace('\'', "''");
        // A walsender still stopping (a relay just killed) holds its slot: end it first.
        let _ = self.cluster.psql(
            "postgres",
            &format!(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity \
                 WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            ),
        );
        let _ = self.cluster.psql(
            "postgres",
            &format!(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE database = '{name}' AND NOT active"
            ),
        );
        let _ = self.cluster.psql(
            "postgres",
            &format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name.replace('"', "\"\"")
            ),
        );
    }
}
