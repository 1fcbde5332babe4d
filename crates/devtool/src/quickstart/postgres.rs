//! The quickstart's throwaway PostgreSQL: a pgtest cluster with the outbox table and the
//! publication from sql/, deleted when the quickstart ends.

use anyhow::{Context, Result};
use pgtest::{ClusterOptions, PgCluster};
use tokio_postgres::{Client, NoTls};

const OUTBOX_SQL: &str = include_str!("../../../../sql/outbox.sql");
const PUBLICATION_SQL: &str = include_str!("../../../../sql/publication.sql");

/// Business tables the sample events change in the same transaction as their outbox row.
const DEMO_TABLES_SQL: &str = "
CREATE TABLE public.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL);
CREATE TABLE public.customers (id bigint PRIMARY KEY, email text NOT NULL);
";

pub const DATABASE: &str = "postgres";
pub const SLOT: &str = "outboxd";

pub struct Postgres {
    /// Dropped before the cluster (fields drop in order), so its connection ends cleanly.
    pub client: Client,
    /// Dropping it stops the server and deletes its directory.
    cluster: PgCluster,
    /// `server_version_num`, e.g. 160004.
    pub version: i32,
}

/// Where the slot stands against the server's WAL.
pub struct SlotStatus {
    pub confirmed_flush_lsn: Option<String>,
    pub current_wal_lsn: String,
    pub behind_bytes: Option<i64>,
}

impl Postgres {
    pub async fn start() -> Result<Postgres> {
        let cluster = tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default()))
            .await?
            .context(
                "starting a throwaway PostgreSQL (scripts/install-deps installs the server)",
            )?;
        println!(
            "quickstart: PostgreSQL ({}) on {}:{}, data in {} (deleted at exit)",
            cluster.bindir().display(),
            cluster.host(),
            cluster.port(),
            cluster.data_dir().display(),
        );
        let (client, conn) = tokio_postgres::connect(&cluster.conn_string(DATABASE), NoTls)
            .await
            .context("connecting to the throwaway PostgreSQL")?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                eprintln!("quickstart: PostgreSQL connection closed: {e}");
            }
        });
        client
            .batch_execute(OUTBOX_SQL)
            .await
            .context("running sql/outbox.sql")?;
        client
            .batch_execute(PUBLICATION_SQL)
            .await
            .context("running sql/publication.sql")?;
        client
            .batch_execute(DEMO_TABLES_SQL)
            .await
            .context("creating the demo tables orders and customers")?;
        let row = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await?;
        let version: i32 = row.try_get(0)?;
        println!(
            "quickstart: created table public.outbox (sql/outbox.sql) and publication outboxd (sql/publication.sql)"
        );
        Ok(Postgres {
            client,
            cluster,
            version,
        })
    }

    /// libpq variables for the relay.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PGHOST", self.cluster.host().to_owned()),
            ("PGPORT", self.cluster.port().to_string()),
            ("PGUSER", self.cluster.superuser().to_owned()),
            ("PGDATABASE", DATABASE.to_owned()),
            ("PGSSLMODE", "disable".to_owned()),
        ]
    }

    /// `Some(active)` once the relay has created the slot.
    pub async fn slot_active(&self) -> Result<Option<bool>> {
        let row = self
            .client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        Ok(match row {
            Some(r) => Some(r.try_get(0)?),
            None => None,
        })
    }

    pub async fn current_wal_lsn(&self) -> Result<String> {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Whether the slot's confirmed_flush_lsn has reached `lsn`.
    pub async fn slot_reached(&self, lsn: &str) -> Result<bool> {
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT, &lsn],
            )
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
            None => false,
        })
    }

    pub async fn slot_status(&self) -> Result<Option<SlotStatus>> {
        let row = self
            .client
            .query_opt(
                "SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text, \
                 pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(SlotStatus {
            confirmed_flush_lsn: row.try_get(0)?,
            current_wal_lsn: row.try_get(1)?,
            behind_bytes: row.try_get(2)?,
        }))
    }
}
