//! A sharded outbox's layout checks: the catalog read here, the rules in
//! `outbox_core::shard` (which the simulator runs too).

pub use outbox_core::shard::{judge_leftover_shards, judge_shard_layout, ShardSpec};
use pgrepl::preflight::{self, ShardObjects};
use tokio_postgres::Client;

use super::error::RelayError;

/// Reads the catalog and applies [`judge_leftover_shards`].
pub async fn leftover_shards(
    sql: &Client,
    shard: &ShardSpec,
) -> Result<Option<String>, RelayError> {
    let objects = shard_objects(sql, shard).await?;
    Ok(judge_leftover_shards(shard, &objects))
}

async fn shard_objects(sql: &Client, shard: &ShardSpec) -> Result<ShardObjects, RelayError> {
    Ok(preflight::shard_objects(
        sql,
        &shard.root_schema,
        &shard.root_table,
        &shard.publication_base,
        &shard.slot_base,
    )
    .await?)
}

/// Reads the catalog and applies [`judge_shard_layout`]. Every few ticks of every shard:
/// the verdict weighs the partitioning and the loose tables only, so the other objects
/// (publications, slots, names) are read only to print the fix of a layout it refuses.
pub async fn verify_shard_layout(sql: &Client, shard: &ShardSpec) -> Result<(), RelayError> {
    let layout = preflight::partitioning(sql, &shard.root_schema, &shard.root_table).await?;
    let loose = ShardObjects {
        loose: preflight::loose_shard_tables(sql, &shard.root_schema, &shard.root_table).await?,
        ..ShardObjects::default()
    };
    if judge_shard_layout(layout.as_ref(), shard, &loose).is_ok() {
        return Ok(());
    }
    let objects = shard_objects(sql, shard).await?;
    judge_shard_layout(layout.as_ref(), shard, &objects).map_err(|problem| {
        RelayError::ShardLayout {
            table: shard.root_name(),
            problem,
        }
    })
}
