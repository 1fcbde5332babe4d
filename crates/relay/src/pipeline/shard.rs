//! A sharded outbox: the table partitioned by hash of the aggregate id into N partitions,
//! each relayed through its own slot and publication. An aggregate's rows all land in one
//! partition, so one shard's order is the aggregate's order.
//!
//! What must hold, because nothing else would notice: every partition is one of the N
//! shards. A partition outside them (a modulus changed, a partition added under another
//! name) is published by no shard's publication, and its rows would never be relayed.

use outbox_core::pgtype::{qualified, quote_ident};
use pgrepl::preflight::{self, Partitioning};
use tokio_postgres::Client;

use super::error::RelayError;

/// Shard `index` of `count`: its table is the partition `<root_table>_shard_<index>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
    pub root_schema: String,
    pub root_table: String,
    /// The aggregate-id column: the table must be hash-partitioned by it alone.
    pub key_column: String,
    /// OUTBOXD_PUBLICATION: shard `i`'s publication is `<publication_base>_<i>`.
    pub publication_base: String,
}

impl ShardSpec {
    /// The root table as SQL names it (quoted as needed).
    pub fn root_name(&self) -> String {
        qualified(&self.root_schema, &self.root_table)
    }

    /// The partition holding remainder `index`.
    pub fn partition_name(root_table: &str, index: u32) -> String {
        format!("{root_table}_shard_{index}")
    }
}

/// The one rule for "is this table sharded the way the settings say", shared by `run`
/// (at start-up and on every slot-stats tick) and `check`. `Err` is the problem and its
/// fix.
///
/// `loose`: the names of the shards' partitions that exist in the root's schema as tables
/// outside it (detached): the fix attaches them again rather than creating them.
pub fn judge_shard_layout(
    layout: Option<&Partitioning>,
    shard: &ShardSpec,
    loose: &[String],
) -> Result<(), String> {
    let root = shard.root_name();
    let count = shard.count;
    let create = "create it with `outboxd init` (or sql/shards.sql)";
    let Some(layout) = layout else {
        return Err(format!(
            "the table {root} does not exist; with OUTBOXD_SHARD_COUNT={count} it is partitioned by hash of {col} into {count} partitions: {create}",
            col = shard.key_column
        ));
    };
    let wanted_key = format!("HASH ({})", shard.key_column);
    let quoted_key = format!("HASH (\"{}\")", shard.key_column);
    match layout.key.as_deref() {
        Some(key) if key == wanted_key || key == quoted_key => {}
        Some(key) => {
            return Err(format!(
                "{root} is partitioned by {key}, not {wanted_key}: per-aggregate order across shards needs every row of an aggregate in one partition. Partition it BY HASH ({col}) ({create})",
                col = shard.key_column
            ))
        }
        None => {
            return Err(format!(
                "{root} is not partitioned (relkind {}), but OUTBOXD_SHARD_COUNT={count}: partition it BY HASH ({}) into {count} partitions named {}_shard_<n> ({create}), or unset OUTBOXD_SHARD_COUNT",
                layout.kind, shard.key_column, shard.root_table
            ))
        }
    }
    let mut seen = vec![false; usize::try_from(count).unwrap_or(0)];
    // (schema, name, modulus) of each partition of another modulus.
    let mut foreign: Vec<(String, String, u32)> = Vec::new();
    for p in &layout.partitions {
        let Some((modulus, remainder)) = hash_bound(&p.bound) else {
            return Err(format!(
                "partition {}.{} of {root} has bound {:?}, not FOR VALUES WITH (MODULUS {count}, REMAINDER n)",
                p.schema, p.name, p.bound
            ));
        };
        if modulus != count {
            foreign.push((p.schema.clone(), p.name.clone(), modulus));
            continue;
        }
        let expected = ShardSpec::partition_name(&shard.root_table, remainder);
        if p.name != expected || p.schema != shard.root_schema {
            let mut fix = Vec::new();
            if p.schema != shard.root_schema {
                // RENAME cannot move a table to another schema.
                fix.push(format!(
                    "ALTER TABLE {} SET SCHEMA {}",
                    qualified(&p.schema, &p.name),
                    quote_ident(&shard.root_schema)
                ));
            }
            if p.name != expected {
                fix.push(format!(
                    "ALTER TABLE {} RENAME TO {}",
                    qualified(&shard.root_schema, &p.name),
                    quote_ident(&expected)
                ));
            }
            return Err(format!(
                "partition {} of {root} holds remainder {remainder}, which shard {remainder} reads from {}: {};",
                qualified(&p.schema, &p.name),
                qualified(&shard.root_schema, &expected),
                fix.join("; ")
            ));
        }
        if let Some(slot) = usize::try_from(remainder)
            .ok()
            .and_then(|r| seen.get_mut(r))
        {
            *slot = true;
        }
    }
    let missing: Vec<u32> = (0..count)
        .filter(|r| {
            usize::try_from(*r)
                .ok()
                .and_then(|i| seen.get(i))
                .is_some_and(|s| !*s)
        })
        .collect();
    if let Some((schema, name, modulus)) = foreign.first() {
        return Err(format!(
            "partition {schema}.{name} of {root} has modulus {modulus}, but OUTBOXD_SHARD_COUNT={count}: \
             no shard's publication has it, so its rows are relayed by no shard. To go back to \
             {count} shards, run: BEGIN; {}; COMMIT; then start outboxd (and follow \
             `outboxd check` if it names a publication; an ALTER PUBLICATION above whose \
             publication does not exist yet is left out: `outboxd init` creates it). To change the shard count instead: \
             docs/operations.md, \"Sharding: adding shards or changing their count\"",
            back_to_shards(shard, layout, &foreign, &missing, loose)
        ));
    }
    // Hash partitioning has no default partition: with a remainder missing, inserts of
    // its aggregates fail, so nothing is lost, but say it before the application does.
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(u32::to_string).collect();
        return Err(format!(
            "{root} has no partition for remainder {} of {count} (inserts of those aggregates fail): {} (an ALTER PUBLICATION whose publication does not exist yet is left out: `outboxd init` creates it)",
            list.join(", "),
            back_to_shards(shard, layout, &[], &missing, loose)
        ));
    }
    Ok(())
}

/// The statements that make the table `shard.count` shards again: the `foreign`
/// partitions (of another modulus) detached, each `missing` remainder's partition attached
/// (when `loose`, detached earlier) or created, and the detached partitions' rows inserted
/// again through the table, so that the shards' slots decode them: when they were written,
/// no shard's publication had their partition.
fn back_to_shards(
    shard: &ShardSpec,
    layout: &Partitioning,
    foreign: &[(String, String, u32)],
    missing: &[u32],
    loose: &[String],
) -> String {
    // Quoted where the catalog's names need it (OUTBOXD_TABLE may be mixed-case).
    let root = qualified(&shard.root_schema, &shard.root_table);
    let count = shard.count;
    let mut sql = Vec::new();
    // Where each detached partition's rows are read from: one holding a shard's name is
    // renamed out of its way.
    let mut sources = Vec::new();
    for (schema, name, modulus) in foreign {
        sql.push(format!(
            "ALTER TABLE {root} DETACH PARTITION {}",
            qualified(schema, name)
        ));
        let taken = (0..count).any(|r| ShardSpec::partition_name(&shard.root_table, r) == *name);
        if taken {
            let moved = format!("{name}_of_{modulus}");
            sql.push(format!(
                "ALTER TABLE {} RENAME TO {}",
                qualified(schema, name),
                quote_ident(&moved)
            ));
            sources.push(qualified(schema, &moved));
        } else {
            sources.push(qualified(schema, name));
        }
    }
    for r in missing {
        let name = ShardSpec::partition_name(&shard.root_table, *r);
        let bound = format!("FOR VALUES WITH (MODULUS {count}, REMAINDER {r})");
        let partition = qualified(&shard.root_schema, &name);
        if loose.contains(&name) {
            sql.push(format!(
                "ALTER TABLE {root} ATTACH PARTITION {partition} {bound}"
            ));
        } else {
            // A new table is in no publication (they hold tables, not names): the rows
            // inserted below would be decoded by no slot.
            sql.push(format!(
                "CREATE TABLE {partition} PARTITION OF {root} {bound}"
            ));
            sql.push(format!(
                "ALTER PUBLICATION {} ADD TABLE {partition}",
                quote_ident(&format!("{}_{r}", shard.publication_base))
            ));
        }
    }
    // By column name: an attached table's columns may be in another order than the
    // root's. Values are copied as stored (a json payload keeps its bytes).
    let columns: Vec<String> = layout.columns.iter().map(|c| quote_ident(c)).collect();
    let columns = columns.join(", ");
    let overriding = match layout.identity_always {
        true => " OVERRIDING SYSTEM VALUE",
        false => "",
    };
    sql.extend(sources.iter().map(|from| {
        format!("INSERT INTO {root} ({columns}){overriding} SELECT {columns} FROM {from}")
    }));
    sql.join("; ")
}

/// `FOR VALUES WITH (modulus 4, remainder 1)` → (4, 1).
fn hash_bound(bound: &str) -> Option<(u32, u32)> {
    let inner = bound
        .trim()
        .strip_prefix("FOR VALUES WITH (")?
        .strip_suffix(')')?;
    let mut modulus = None;
    let mut remainder = None;
    for part in inner.split(',') {
        let (name, value) = part.trim().split_once(' ')?;
        let value = value.trim().parse::<u32>().ok()?;
        match name.to_ascii_lowercase().as_str() {
            "modulus" => modulus = Some(value),
            "remainder" => remainder = Some(value),
            _ => return None,
        }
    }
    Some((modulus?, remainder?))
}

/// Reads the catalog and applies [`judge_shard_layout`].
pub async fn verify_shard_layout(sql: &Client, shard: &ShardSpec) -> Result<(), RelayError> {
    let layout = preflight::partitioning(sql, &shard.root_schema, &shard.root_table).await?;
    let names: Vec<String> = (0..shard.count)
        .map(|i| ShardSpec::partition_name(&shard.root_table, i))
        .collect();
    let loose = preflight::loose_tables(sql, &shard.root_schema, &names).await?;
    judge_shard_layout(layout.as_ref(), shard, &loose).map_err(|problem| RelayError::ShardLayout {
        table: shard.root_name(),
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgrepl::preflight::PartitionBound;

    fn spec(count: u32) -> ShardSpec {
        ShardSpec {
            index: 0,
            count,
            root_schema: "public".into(),
            root_table: "outbox".into(),
            key_column: "aggregate_id".into(),
            publication_base: "outboxd".into(),
        }
    }

    fn layout(parts: &[(&str, u32, u32)]) -> Partitioning {
        Partitioning {
            kind: "p".into(),
            key: Some("HASH (aggregate_id)".into()),
            partitions: parts
                .iter()
                .map(|(name, m, r)| PartitionBound {
                    schema: "public".into(),
                    name: (*name).into(),
                    bound: format!("FOR VALUES WITH (modulus {m}, remainder {r})"),
                })
                .collect(),
            columns: vec!["id".into(), "aggregate_id".into(), "Payload".into()],
            identity_always: false,
        }
    }

    #[test]
    fn the_layout_init_creates_is_accepted() {
        let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
        assert_eq!(judge_shard_layout(Some(&l), &spec(2), &[]), Ok(()));
    }

    #[test]
    fn a_partition_no_shard_reads_is_refused() {
        // Four partitions, two shards: the rows of remainders 2 and 3 would go nowhere.
        let l = layout(&[
            ("outbox_shard_0", 4, 0),
            ("outbox_shard_1", 4, 1),
            ("outbox_shard_2", 4, 2),
            ("outbox_shard_3", 4, 3),
        ]);
        let e = judge_shard_layout(Some(&l), &spec(2), &[]).unwrap_err();
        assert!(
            e.contains("has modulus 4") && e.contains("relayed by no shard"),
            "{e}"
        );
        // Back to two shards: the statements, in an order that runs. The partitions
        // holding shard names move out of the way; their rows come back through the root.
        let back = "ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_0; \
            ALTER TABLE public.outbox_shard_0 RENAME TO outbox_shard_0_of_4; \
            ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1; \
            ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_of_4; \
            ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_2; \
            ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_3; \
            CREATE TABLE public.outbox_shard_0 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0); \
            ALTER PUBLICATION outboxd_0 ADD TABLE public.outbox_shard_0; \
            CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
            ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1; \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_shard_0_of_4; \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_shard_1_of_4; \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_shard_2; \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_shard_3;";
        assert!(e.contains(back), "{e}");
        // Remainder 1 split in two, its old partition detached and kept: attached again.
        let split = layout(&[
            ("outbox_shard_0", 2, 0),
            ("outbox_m4_1", 4, 1),
            ("outbox_m4_3", 4, 3),
        ]);
        let loose = vec!["outbox_shard_1".to_owned()];
        let e = judge_shard_layout(Some(&split), &spec(2), &loose).unwrap_err();
        let back = "ALTER TABLE public.outbox DETACH PARTITION public.outbox_m4_1; \
            ALTER TABLE public.outbox DETACH PARTITION public.outbox_m4_3; \
            ALTER TABLE public.outbox ATTACH PARTITION public.outbox_shard_1 FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_m4_1; \
            INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM public.outbox_m4_3;";
        assert!(e.contains(back), "{e}");
        let renamed = layout(&[("outbox_p0", 2, 0), ("outbox_shard_1", 2, 1)]);
        let e = judge_shard_layout(Some(&renamed), &spec(2), &[]).unwrap_err();
        assert!(e.contains("RENAME TO outbox_shard_0"), "{e}");
    }

    #[test]
    fn the_printed_fix_quotes_mixed_case_names() {
        let spec = ShardSpec {
            root_table: "Outbox".into(),
            publication_base: "Pub".into(),
            ..spec(2)
        };
        let e =
            judge_shard_layout(Some(&layout(&[("Outbox_shard_0", 2, 0)])), &spec, &[]).unwrap_err();
        assert!(
            e.contains("CREATE TABLE public.\"Outbox_shard_1\" PARTITION OF public.\"Outbox\" FOR VALUES WITH (MODULUS 2, REMAINDER 1); ALTER PUBLICATION \"Pub_1\" ADD TABLE public.\"Outbox_shard_1\""),
            "{e}"
        );
    }

    #[test]
    fn wrong_keys_kinds_and_gaps_are_refused() {
        let mut l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
        l.key = Some("HASH (id)".into());
        assert!(judge_shard_layout(Some(&l), &spec(2), &[])
            .unwrap_err()
            .contains("not HASH (aggregate_id)"));
        l.key = Some("RANGE (aggregate_id)".into());
        assert!(judge_shard_layout(Some(&l), &spec(2), &[]).is_err());
        l.key = None;
        l.kind = "r".into();
        assert!(judge_shard_layout(Some(&l), &spec(2), &[])
            .unwrap_err()
            .contains("not partitioned"));
        assert!(judge_shard_layout(None, &spec(2), &[])
            .unwrap_err()
            .contains("does not exist"));
        let gap = layout(&[("outbox_shard_0", 3, 0), ("outbox_shard_2", 3, 2)]);
        let e = judge_shard_layout(Some(&gap), &spec(3), &[]).unwrap_err();
        assert!(e.contains("remainder 1 of 3"), "{e}");
        assert!(
            e.contains("(inserts of those aggregates fail): CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 3, REMAINDER 1); ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1 ("),
            "{e}"
        );
        let mut list = layout(&[("outbox_shard_0", 2, 0)]);
        list.partitions[0].bound = "FOR VALUES IN ('a')".into();
        assert!(judge_shard_layout(Some(&list), &spec(2), &[])
            .unwrap_err()
            .contains("not FOR VALUES WITH"));
    }

    #[test]
    fn hash_bounds_parse() {
        assert_eq!(
            hash_bound("FOR VALUES WITH (modulus 4, remainder 1)"),
            Some((4, 1))
        );
        assert_eq!(
            hash_bound("FOR VALUES WITH (remainder 0, modulus 2)"),
            Some((2, 0))
        );
        assert_eq!(hash_bound("DEFAULT"), None);
        assert_eq!(hash_bound("FOR VALUES WITH (modulus x, remainder 1)"), None);
    }
}
