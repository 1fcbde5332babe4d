//! The benchmark's PostgreSQL cluster, schema and backlog generation.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use pgtest::{ClusterOptions, PgCluster};
use tokio_postgres::{Client, NoTls};

pub const PUBLICATION: &str = "outboxd";
pub const AGGREGATE_TYPE: &str = "Order";
pub const TOPIC: &str = "outbox.Order";

/// A dedicated cluster: nothing but the benchmark runs in it, so the CPU time of all its
/// processes is the cost of what the benchmark does.
pub fn start_cluster() -> Result<PgCluster> {
    let opts = ClusterOptions {
        conf: vec![
            "shared_buffers = 512MB".into(),
            "max_wal_size = 16GB".into(),
            "min_wal_size = 1GB".into(),
            "checkpoint_timeout = 30min".into(),
            "wal_sender_timeout = 120s".into(),
            "autovacuum = on".into(),
        ],
        ..ClusterOptions::default()
    };
    PgCluster::start(opts).map_err(|e| anyhow::anyhow!("starting PostgreSQL: {e}"))
}

pub async fn connect(cluster: &PgCluster, db: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(&cluster.conn_string(db), NoTls)
        .await
        .with_context(|| format!("connecting to database {db}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Creates database `db` with the outbox table (like sql/outbox.sql) and the publication.
/// `polling` adds the polling relay's columns and index.
pub async fn create_database(cluster: &PgCluster, db: &str, polling: bool) -> Result<()> {
    let admin = connect(cluster, "postgres").await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let c = connect(cluster, db).await?;
    let extra = if polling {
        ",\n locked_at timestamptz NULL,\n sent_at timestamptz NULL"
    } else {
        ""
    };
    c.batch_execute(&format!(
        "CREATE TABLE public.outbox (
            id uuid PRIMARY KEY,
            aggregate_type text NOT NULL,
            aggregate_id text NOT NULL,
            event_type text NOT NULL,
            payload jsonb NOT NULL,
            headers jsonb NULL,
            created_at timestamptz NOT NULL DEFAULT now(){extra});
         CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert');"
    ))
    .await?;
    if polling {
        c.batch_execute(
            "CREATE INDEX outbox_unsent ON public.outbox (created_at) WHERE sent_at IS NULL",
        )
        .await?;
    }
    Ok(())
}

pub async fn drop_database(cluster: &PgCluster, db: &str) -> Result<()> {
    let admin = connect(cluster, "postgres").await?;
    admin
        .batch_execute(&format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{db}'"
        ))
        .await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .await?;
    admin.batch_execute("CHECKPOINT").await?;
    Ok(())
}

pub async fn create_slots(c: &Client, slots: &[String]) -> Result<()> {
    for s in slots {
        c.execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[s],
        )
        .await
        .with_context(|| format!("creating slot {s}"))?;
    }
    Ok(())
}

/// The column list and the value expressions of one row from integer `i`: ~1000
/// aggregates, a ~150-byte jsonb payload.
pub const COLUMNS: &str = "id, aggregate_type, aggregate_id, event_type, payload";

pub fn row_values(i: &str) -> String {
    format!(
        "gen_random_uuid(), '{AGGREGATE_TYPE}', 'order-' || ({i} % 1000), 'OrderCreated', \
         jsonb_build_object('orderId', {i}, 'customerId', 'customer-' || ({i} % 5000), \
         'amount', ({i} % 100000) / 100.0, 'currency', 'EUR', 'sku', md5({i}::text), \
         'note', 'outboxd benchmark event')"
    )
}

/// The shape of a backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `n` single-row transactions.
    SingleRow { n: u64 },
    /// `txns` transactions of `rows` rows.
    Batched { txns: u64, rows: u64 },
    /// One transaction of `n` rows.
    OneTxn { n: u64 },
}

impl Shape {
    pub fn events(self) -> u64 {
        match self {
            Shape::SingleRow { n } | Shape::OneTxn { n } => n,
            Shape::Batched { txns, rows } => txns * rows,
        }
    }
}

/// Generates the backlog, two connections in parallel where the shape allows it.
/// Returns the generation time.
pub async fn generate(cluster: &PgCluster, db: &str, shape: Shape) -> Result<Duration> {
    let started = Instant::now();
    match shape {
        Shape::OneTxn { n } => {
            let c = connect(cluster, db).await?;
            c.batch_execute(&format!(
                "INSERT INTO public.outbox ({COLUMNS}) SELECT {} FROM generate_series(1, {n}) AS g(i)",
                row_values("i")
            ))
            .await?;
        }
        Shape::SingleRow { n } => {
            let half = n / 2;
            let parts = [(1, half), (half + 1, n)];
            let mut tasks = Vec::new();
            for (lo, hi) in parts {
                if lo > hi {
                    continue;
                }
                let c = connect(cluster, db).await?;
                let sql = format!(
                    "DO $$ BEGIN FOR i IN {lo}..{hi} LOOP \
                     INSERT INTO public.outbox ({COLUMNS}) VALUES ({}); COMMIT; \
                     END LOOP; END $$",
                    row_values("i")
                );
                tasks.push(tokio::spawn(async move {
                    c.batch_execute("SET synchronous_commit = off").await?;
                    c.batch_execute(&sql).await
                }));
            }
            for t in tasks {
                t.await??;
            }
        }
        Shape::Batched { txns, rows } => {
            let half = txns / 2;
            let parts = [(0, half), (half, txns)];
            let mut tasks = Vec::new();
            for (lo, hi) in parts {
                if lo >= hi {
                    continue;
                }
                let c = connect(cluster, db).await?;
                let last = hi - 1;
                let sql = format!(
                    "DO $$ BEGIN FOR t IN {lo}..{last} LOOP \
                     INSERT INTO public.outbox ({COLUMNS}) SELECT {} \
                     FROM generate_series(t * {rows} + 1, t * {rows} + {rows}) AS g(i); COMMIT; \
                     END LOOP; END $$",
                    row_values("i")
                );
                tasks.push(tokio::spawn(async move {
                    c.batch_execute("SET synchronous_commit = off").await?;
                    c.batch_execute(&sql).await
                }));
            }
            for t in tasks {
                t.await??;
            }
        }
    }
    Ok(started.elapsed())
}

pub async fn current_lsn(c: &Client) -> Result<String> {
    let row = c
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?;
    Ok(row.get(0))
}

/// Whether `slot` has confirmed at least `lsn`.
pub async fn slot_reached(c: &Client, slot: &str, lsn: &str) -> Result<bool> {
    let row = c
        .query_opt(
            "SELECT coalesce(confirmed_flush_lsn >= $2::text::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot, &lsn],
        )
        .await?;
    Ok(row.map(|r| r.get::<_, bool>(0)).unwrap_or(false))
}
