//! A partitioned outbox as the catalog has it: its partitions, and the objects named like
//! its shards' (tables, publications, slots) that a sharded layout's check weighs. The
//! facts' types are outbox-core's, whose shard rules weigh them without IO.

pub use outbox_core::shard::{LooseTable, PartitionBound, Partitioning, ShardObjects};
use tokio_postgres::Client;

use crate::error::ReplError;

/// `None` when `schema.table` does not exist.
pub async fn partitioning(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Option<Partitioning>, ReplError> {
    let Some(row) = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, \
                    CASE WHEN c.relkind = 'p' THEN pg_catalog.pg_get_partkeydef(c.oid) END \
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await?
    else {
        return Ok(None);
    };
    let oid: u32 = row.try_get(0)?;
    // A bound names no column: `pg_get_expr` given 0, not the partition's OID, opens no
    // table, so it never waits on a lock the application's DDL holds (see
    // `partition_tree`).
    let partitions = client
        .query(
            "SELECT n.nspname::text, c.relname::text, \
                    coalesce(pg_catalog.pg_get_expr(c.relpartbound, 0), ''), \
                    ARRAY(SELECT p.pubname::text FROM pg_catalog.pg_publication_rel r \
                       JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid \
                      WHERE r.prrelid = c.oid ORDER BY 1) \
               FROM pg_catalog.pg_inherits i \
               JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE i.inhparent = $1 ORDER BY 1, 2",
            &[&oid],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(PartitionBound {
                schema: r.try_get(0)?,
                name: r.try_get(1)?,
                bound: r.try_get(2)?,
                publications: r.try_get(3)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
    let columns = client
        .query(
            "SELECT a.attname::text, a.attidentity = 'a' \
               FROM pg_catalog.pg_attribute a \
              WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                AND a.attgenerated = '' ORDER BY a.attnum",
            &[&oid],
        )
        .await?;
    let mut identity_always = false;
    let columns = columns
        .iter()
        .map(|r| {
            identity_always |= r.try_get::<_, bool>(1)?;
            r.try_get(0)
        })
        .collect::<Result<Vec<String>, tokio_postgres::Error>>()?;
    Ok(Some(Partitioning {
        kind: row.try_get(1)?,
        key: row.try_get(2)?,
        partitions,
        columns,
        identity_always,
    }))
}

/// Reads [`ShardObjects`]. Names are matched as `<prefix>_<digits>` exactly (a `LIKE`
/// pattern would take `_` in a name for any character).
pub async fn shard_objects(
    client: &Client,
    schema: &str,
    table: &str,
    publication: &str,
    slot: &str,
) -> Result<ShardObjects, ReplError> {
    let loose = loose_shard_tables(client, schema, table).await?;
    let held = client
        .query(
            &format!(
                "SELECT c.relname::text, pg_catalog.array_agg(p.pubname::text ORDER BY p.pubname) \
                   FROM pg_catalog.pg_publication_rel r \
                   JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid \
                   JOIN pg_catalog.pg_class c ON c.oid = r.prrelid \
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = $1 AND c.relname::text <> $2 \
                    AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND {} \
                  GROUP BY c.relname ORDER BY 1",
                numbered("p.pubname", 3)
            ),
            &[&schema, &table, &format!("{publication}_")],
        )
        .await?;
    let held = tables(&held)?;
    let first_column = |rows: Vec<tokio_postgres::Row>| {
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, tokio_postgres::Error>>()
    };
    let publications = first_column(
        client
            .query(
                &format!(
                    "SELECT pubname::text FROM pg_catalog.pg_publication WHERE {} ORDER BY 1",
                    numbered("pubname", 1)
                ),
                &[&format!("{publication}_")],
            )
            .await?,
    )?;
    let slots = first_column(
        client
            .query(
                &format!(
                    "SELECT slot_name::text FROM pg_catalog.pg_replication_slots \
                      WHERE database = pg_catalog.current_database() AND {} ORDER BY 1",
                    numbered("slot_name", 1)
                ),
                &[&format!("{slot}_")],
            )
            .await?,
    )?;
    let names = first_column(
        client
            .query(
                "SELECT c.relname::text FROM pg_catalog.pg_class c \
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = $1 \
                    AND pg_catalog.left(c.relname::text, pg_catalog.length($2)) = $2 ORDER BY 1",
                &[&schema, &format!("{table}_shard_")],
            )
            .await?,
    )?;
    Ok(ShardObjects {
        loose,
        publications,
        slots,
        held,
        names,
    })
}

/// Rows of (table name, publication names) as [`LooseTable`]s.
fn tables(rows: &[tokio_postgres::Row]) -> Result<Vec<LooseTable>, tokio_postgres::Error> {
    rows.iter()
        .map(|r| {
            Ok(LooseTable {
                name: r.try_get(0)?,
                publications: r.try_get(1)?,
            })
        })
        .collect()
}

/// Tables named `<table>_shard_<n>` in `schema` that are no partition, with the
/// publications holding each: all a layout's verdict weighs besides the partitioning (the
/// other [`ShardObjects`] only shape the printed fix).
pub async fn loose_shard_tables(
    client: &Client,
    schema: &str,
    table: &str,
) -> Result<Vec<LooseTable>, ReplError> {
    let loose = client
        .query(
            &format!(
                "SELECT c.relname::text, \
                        pg_catalog.array_remove(pg_catalog.array_agg(p.pubname::text ORDER BY p.pubname), NULL) \
                   FROM pg_catalog.pg_class c \
                   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                   LEFT JOIN pg_catalog.pg_publication_rel r ON r.prrelid = c.oid \
                   LEFT JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid \
                  WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
                    AND {} \
                  GROUP BY c.relname ORDER BY 1",
                numbered("c.relname", 2)
            ),
            &[&schema, &format!("{table}_shard_")],
        )
        .await?;
    Ok(tables(&loose)?)
}

/// SQL true when `column` is `$n` followed by digits only (a `LIKE` pattern would take `_`
/// in a name for any character).
fn numbered(column: &str, n: u32) -> String {
    format!(
        "pg_catalog.left({column}::text, pg_catalog.length(${n})) = ${n} \
         AND pg_catalog.substr({column}::text, pg_catalog.length(${n}) + 1) ~ '^[0-9]+$'"
    )
}
