//! A sharded outbox: the table partitioned by hash of the aggregate id into N partitions,
//! each relayed through its own slot and publication. An aggregate's rows all land in one
//! partition, so one shard's order is the aggregate's order.
//!
//! What must hold, because nothing else would notice: every partition is one of the N
//! shards. A partition outside them (a modulus changed, a partition added under another
//! name) is published by no shard's publication, and its rows would never be relayed.
//!
//! The rules here read catalog facts ([`Partitioning`], [`ShardObjects`]) that the relay
//! reads from the server (`pgrepl::preflight`), and print the fix as a [`Plan`] of
//! [`Action`]s: the relay prints their SQL, the simulator applies them to its model.

use crate::pgtype::qualified;

mod action;
mod catalog;

pub use action::{Action, Rel};
pub use catalog::{LooseTable, PartitionBound, Partitioning, ShardObjects};

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
    /// OUTBOXD_SLOT: shard `i`'s slot is `<slot_base>_<i>`.
    pub slot_base: String,
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
/// (at start-up and on every slot-stats tick), `check` and `init`. `Err` is the problem
/// and its fix.
///
/// `objects`: what exists under the shards' names. A loose table (detached) holding a
/// missing remainder's name is renamed aside and the partition made anew; its rows are
/// kept where they are only when the shard's publication holds it: rows written to a
/// table no publication holds are decoded by no slot, then or ever, so otherwise they are
/// inserted again through the table, as those of a detached partition of another
/// modulus are. The fix adds a new partition only to a
/// publication that exists; a missing one is created, with its slot, before any row can
/// reach the partition.
pub fn judge_shard_layout(
    layout: Option<&Partitioning>,
    shard: &ShardSpec,
    objects: &ShardObjects,
) -> Result<(), String> {
    judge_layout(layout, shard, objects).map_err(|r| r.message)
}

/// Why [`judge_layout`] refused, and its fix as actions where it prints statements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The problem and its fix, as printed.
    pub message: String,
    pub fix: Fix,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// The message says what to create or change (no table, another key or kind).
    Told,
    /// A partition of the right bound under another name: these statements, on their own.
    Rename(Vec<Action>),
    /// Back to the shards: [`Plan`].
    Plan(Box<Plan>),
}

/// [`judge_shard_layout`], with the fix as actions.
pub fn judge_layout(
    layout: Option<&Partitioning>,
    shard: &ShardSpec,
    objects: &ShardObjects,
) -> Result<(), Refusal> {
    let told = |message: String| Refusal {
        message,
        fix: Fix::Told,
    };
    let root = shard.root_name();
    let count = shard.count;
    let create = "create it with `outboxd init` (or sql/shards.sql)";
    let Some(layout) = layout else {
        return Err(told(format!(
            "the table {root} does not exist; with OUTBOXD_SHARD_COUNT={count} it is partitioned by hash of {col} into {count} partitions: {create}",
            col = shard.key_column
        )));
    };
    let wanted_key = format!("HASH ({})", shard.key_column);
    let quoted_key = format!("HASH (\"{}\")", shard.key_column);
    match layout.key.as_deref() {
        Some(key) if key == wanted_key || key == quoted_key => {}
        Some(key) => {
            return Err(told(format!(
                "{root} is partitioned by {key}, not {wanted_key}: per-aggregate order across shards needs every row of an aggregate in one partition. Partition it BY HASH ({col}) ({create})",
                col = shard.key_column
            )))
        }
        None => {
            return Err(told(format!(
                "{root} is not partitioned (relkind {}), but OUTBOXD_SHARD_COUNT={count}: partition it BY HASH ({}) into {count} partitions named {}_shard_<n> ({create}), or unset OUTBOXD_SHARD_COUNT",
                layout.kind, shard.key_column, shard.root_table
            )))
        }
    }
    let mut seen = vec![false; usize::try_from(count).unwrap_or(0)];
    // Each partition of another modulus, with its modulus.
    let mut foreign: Vec<(&PartitionBound, u32)> = Vec::new();
    for p in &layout.partitions {
        let Some((modulus, remainder)) = hash_bound(&p.bound) else {
            return Err(told(format!(
                "partition {}.{} of {root} has bound {:?}, not FOR VALUES WITH (MODULUS {count}, REMAINDER n)",
                p.schema, p.name, p.bound
            )));
        };
        if modulus != count {
            foreign.push((p, modulus));
            continue;
        }
        let expected = ShardSpec::partition_name(&shard.root_table, remainder);
        if p.name != expected || p.schema != shard.root_schema {
            let mut fix = Vec::new();
            if p.schema != shard.root_schema {
                // RENAME cannot move a table to another schema.
                fix.push(Action::SetSchema {
                    table: Rel::new(&p.schema, &p.name),
                    schema: shard.root_schema.clone(),
                });
            }
            if p.name != expected {
                fix.push(Action::Rename {
                    table: Rel::new(&shard.root_schema, &p.name),
                    to: expected.clone(),
                });
            }
            return Err(Refusal {
                message: format!(
                    "partition {} of {root} holds remainder {remainder}, which shard {remainder} reads from {}: {};",
                    qualified(&p.schema, &p.name),
                    qualified(&shard.root_schema, &expected),
                    action::joined(&fix)
                ),
                fix: Fix::Rename(fix),
            });
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
    // Detached tables named like a shard's partition that no missing remainder takes
    // back and no shard's publication holds: rows written to them while they were
    // partitions (of another modulus) were decoded by no slot.
    let stranded: Vec<&str> = objects
        .loose
        .iter()
        .filter(|t| {
            let retaken = partition_index(shard, &t.name).is_some_and(|r| missing.contains(&r));
            let published = t
                .publications
                .iter()
                .any(|p| shard_index(&shard.publication_base, p).is_some());
            !retaken && !published
        })
        .map(|t| t.name.as_str())
        .collect();
    let problem = if let Some((p, modulus)) = foreign.first() {
        format!(
            "partition {} of {root} has modulus {modulus}, but OUTBOXD_SHARD_COUNT={count}{}",
            qualified(&p.schema, &p.name),
            match read_by_a_shard(shard, p) {
                true => "",
                false => ": no shard's publication has it, so its rows are relayed by no shard",
            }
        )
    } else if !missing.is_empty() {
        // Hash partitioning has no default partition: with a remainder missing, inserts
        // of its aggregates fail, so nothing is lost, but say it before the application
        // does.
        let list: Vec<String> = missing.iter().map(u32::to_string).collect();
        format!(
            "{root} has no partition for remainder {} of {count} (inserts of those aggregates fail)",
            list.join(", ")
        )
    } else if let Some(name) = stranded.first() {
        format!(
            "{} is no partition of {root} and no shard's publication holds it, but it is named like a shard's partition: \
             rows written to it while it was a partition (of another modulus) were decoded by no slot",
            qualified(&shard.root_schema, name)
        )
    } else {
        return Ok(());
    };
    let plan = back_to_shards(shard, layout, objects, &foreign, &missing, &stranded);
    Err(Refusal {
        message: format!("{problem}. {}", plan.text(shard)),
        fix: Fix::Plan(Box::new(plan)),
    })
}

/// Whether a shard that remains (`< count`) has `p` in its publication: its rows were
/// decoded by that shard's slot, which outboxd goes on reading.
fn read_by_a_shard(shard: &ShardSpec, p: &PartitionBound) -> bool {
    p.publications
        .iter()
        .any(|name| shard_index(&shard.publication_base, name).is_some_and(|k| k < shard.count))
}

/// `<root_table>_shard_<n>` → n.
fn partition_index(shard: &ShardSpec, name: &str) -> Option<u32> {
    shard_index(&format!("{}_shard", shard.root_table), name)
}

/// `<base>_<n>` → n.
fn shard_index(base: &str, name: &str) -> Option<u32> {
    let digits = name.strip_prefix(base)?.strip_prefix('_')?;
    match digits.bytes().all(|b| b.is_ascii_digit()) {
        true => digits.parse().ok(),
        false => None,
    }
}

/// The fix's transaction, read committed whatever `default_transaction_isolation` says: under
/// repeatable read its snapshot would be taken as DETACH begins, before it waits for the
/// application's transactions in flight, and the copies would miss their rows.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// The remedy: statements run before the transaction (each on its own), the
/// transaction, and the slots and publications left over for shards beyond the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// A missing shard's publication (empty) and then its slot: a slot created after the
    /// transaction would not decode the rows it moves into that shard's partition, nor
    /// those the application writes before `outboxd init`.
    pub before: Vec<Action>,
    pub transaction: Vec<Action>,
    /// The tables whose rows the transaction inserts again.
    pub copied: Vec<String>,
    /// Detached partitions a remaining shard relayed: kept as they are, not copied.
    pub set_aside: Vec<String>,
    /// Detached tables named like a shard's partition that a shard's publication holds:
    /// named, not copied (whether a slot read them then is not in the catalog).
    pub kept: Vec<String>,
    /// Drops of the slots and publications of shards `>= count`, to run once the
    /// transaction committed and every shard's slot confirmed past it.
    pub leftovers: Vec<Action>,
}

impl Plan {
    fn text(&self, shard: &ShardSpec) -> String {
        let count = shard.count;
        // Writes stopped: an aggregate that moves to another shard keeps its order only
        // if its old shard relayed everything before its new one starts. A publication
        // changed otherwise than by the transaction must stop outboxd, not be accepted
        // with the transaction's change below.
        let mut text = "Stop the application's writes to the outbox, and resume them once `outboxd status` shows every shard confirmed past the COMMIT below; run `outboxd check`, and if it fails `publication unchanged`, follow that error first. ".to_owned();
        text.push_str(&match self.before.is_empty() {
            true => "Then, to".to_owned(),
            false => format!(
                "Then create the missing shards' publications and slots, each statement on its own (a slot cannot be created in a transaction that wrote): {}. Then, to",
                action::joined(&self.before)
            ),
        });
        text.push_str(&format!(
            " lay the table out as {count} shards, run: {BEGIN}; {GUARD_OFF}; {}; COMMIT; then run \
             `outboxd init --accept-publication-change` (the transaction changed the shards' \
             publications, as it must: `outboxd run` would stop on that; {}) and start outboxd \
             (and follow `outboxd check` if it names a publication). To change the shard count \
             instead: docs/operations.md, \"Sharding: adding shards or changing their count\"",
            action::joined(&self.transaction),
            match self.before.is_empty() {
                true => "init records them as they are now",
                false => "init records them as they are now, and finds the new slots",
            }
        ));
        if !self.copied.is_empty() {
            text.push_str(&format!(
                ". The transaction inserts again the rows of {}, which no remaining shard's slot decoded (a row an earlier slot relayed is published twice); drop those tables once outboxd has relayed past the COMMIT",
                self.copied.join(", ")
            ));
        }
        if !self.set_aside.is_empty() {
            text.push_str(&format!(
                ". The rows of {} were relayed by a shard that remains and are kept there; drop those tables once outboxd has relayed past the COMMIT",
                self.set_aside.join(", ")
            ));
        }
        // Found by name only: a table detached under any other name is not.
        text.push_str(&format!(
            ". A partition of {root} detached under another name earlier (by a migration) is not looked for here: if rows were written to it while no shard's publication held it, insert them again through {root} as above",
            root = shard.root_name()
        ));
        if !self.kept.is_empty() {
            text.push_str(&format!(
                ". Also detached and named like a shard's partition, held by a shard's publication: {}. If rows were written to one while no shard's slot read its publication, insert them again through {} as above",
                self.kept.join(", "),
                shard.root_name()
            ));
        }
        if let Some(drops) = drop_leftovers(&self.leftovers) {
            // Rows the application deleted as it wrote them are only in those slots.
            text.push_str(&format!(
                ". If the application deletes its outbox rows as it writes them, do not lower the count with this transaction: rows written to shards {count} and above since their relays stopped are then only in those shards' slots, which the copy cannot reach. Run outboxd with the old OUTBOXD_SHARD_COUNT instead (the table still has its layout), stop the writes, wait until every shard's slot is confirmed past SELECT pg_current_wal_lsn(), then follow docs/operations.md, \"Sharding: adding shards or changing their count\""
            ));
            text.push_str(&format!(
                ". The slots and publications of shards {count} and above are read by no shard and keep WAL without limit: once the transaction above committed and every shard's slot confirmed past it (read SELECT pg_current_wal_lsn() after COMMIT; wait until each of {}_0..{}_{}'s confirmed_flush_lsn in pg_replication_slots is at or past it), and no outboxd process still relays them, run: {drops}",
                shard.slot_base,
                shard.slot_base,
                count.saturating_sub(1),
            ));
        }
        text
    }
}

/// The statements of `drops`; `None` when there are none.
fn drop_leftovers(drops: &[Action]) -> Option<String> {
    (!drops.is_empty()).then(|| format!("{};", action::joined(drops)))
}

/// The drops of the slots and publications of shards `>= count`: slots first.
pub fn leftover_drops(shard: &ShardSpec, objects: &ShardObjects) -> Vec<Action> {
    let (slots, publications) = beyond_count(shard, objects);
    slots
        .into_iter()
        .map(|name| Action::DropSlot { name })
        .chain(
            publications
                .into_iter()
                .map(|name| Action::DropPublication { name }),
        )
        .collect()
}

/// Slots and publications named for shards `>= count`.
fn beyond_count(shard: &ShardSpec, objects: &ShardObjects) -> (Vec<String>, Vec<String>) {
    let beyond = |names: &[String], base: &str| -> Vec<String> {
        names
            .iter()
            .filter(|n| shard_index(base, n).is_some_and(|i| i >= shard.count))
            .cloned()
            .collect()
    };
    (
        beyond(&objects.slots, &shard.slot_base),
        beyond(&objects.publications, &shard.publication_base),
    )
}

/// With the layout right, what is left of shards beyond the count (a count lowered by
/// the fix [`judge_shard_layout`] prints keeps them): nothing reads those slots, and each
/// keeps WAL without limit. A warning, not a refusal: whether their rows were relayed or
/// copied back is not in the catalog.
pub fn judge_leftover_shards(shard: &ShardSpec, objects: &ShardObjects) -> Option<String> {
    let (slots, publications) = beyond_count(shard, objects);
    let drops = drop_leftovers(&leftover_drops(shard, objects))?;
    Some(format!(
        "{} of shards beyond OUTBOXD_SHARD_COUNT={count} exist: no shard reads them, and a slot keeps WAL without limit. Once their rows were relayed or inserted again through {} (the fix outboxd printed for a lowered count does it), every shard's slot confirmed past that, and no outboxd process relays them, run: {drops}",
        [("slots", &slots), ("publications", &publications)]
            .iter()
            .filter(|(_, names)| !names.is_empty())
            .map(|(what, names)| format!("{what} {}", names.join(", ")))
            .collect::<Vec<_>>()
            .join(" and "),
        shard.root_name(),
        count = shard.count,
    ))
}

/// What the fix's transaction sets for sql/shard-guard.sql, which refuses the partition
/// changes it makes otherwise (a setting of that name does nothing without the guard).
const GUARD_OFF: &str = "SET LOCAL outboxd.partition_change = 'on'";

/// The statements that make the table `shard.count` shards again: the `foreign`
/// partitions (of another modulus) detached, each `missing` remainder's partition created
/// (a table detached under its name renamed aside first), and the rows
/// of the detached partitions and of `stranded` tables inserted again through the table,
/// so that the shards' slots decode them: when they were written, no shard's publication
/// had their table.
fn back_to_shards(
    shard: &ShardSpec,
    layout: &Partitioning,
    objects: &ShardObjects,
    foreign: &[(&PartitionBound, u32)],
    missing: &[u32],
    stranded: &[&str],
) -> Plan {
    // Quoted where the catalog's names need it (OUTBOXD_TABLE may be mixed-case).
    let root = Rel::new(&shard.root_schema, &shard.root_table);
    let schema = &shard.root_schema;
    let count = shard.count;
    let publication = |r: u32| format!("{}_{r}", shard.publication_base);
    let mut before = Vec::new();
    let mut sql = Vec::new();
    // Where the rows to insert again are read from. A table left named like a shard's
    // partition is renamed: the next check would take it for a stranded one.
    let mut sources = Vec::new();
    // Detached partitions whose rows a remaining shard's slot decoded: kept, not copied.
    let mut set_aside = Vec::new();
    // Names a rename must not take (an earlier fix's tables keep theirs).
    let mut taken = objects.names.clone();
    let mut move_aside = |sql: &mut Vec<Action>, schema: &str, name: &str, to: String| {
        if partition_index(shard, name).is_none() {
            return Rel::new(schema, name);
        }
        let free = std::iter::once(to.clone())
            .chain((2u32..).map(|k| format!("{to}_{k}")))
            .find(|n| !taken.contains(n))
            .unwrap_or(to);
        taken.push(free.clone());
        sql.push(Action::Rename {
            table: Rel::new(schema, name),
            to: free.clone(),
        });
        Rel::new(schema, &free)
    };
    for (p, modulus) in foreign {
        sql.push(Action::Detach {
            root: root.clone(),
            partition: Rel::new(&p.schema, &p.name),
        });
        let table = move_aside(
            &mut sql,
            &p.schema,
            &p.name,
            format!("{}_of_{modulus}", p.name),
        );
        match read_by_a_shard(shard, p) {
            true => set_aside.push(table),
            false => sources.push(table),
        }
    }
    for name in stranded {
        sources.push(move_aside(
            &mut sql,
            schema,
            name,
            format!("{name}_detached"),
        ));
    }
    for r in missing {
        let name = ShardSpec::partition_name(&shard.root_table, *r);
        let partition = Rel::new(schema, &name);
        let pub_name = publication(*r);
        let slot = format!("{}_{r}", shard.slot_base);
        let has_publication = objects.publications.contains(&pub_name);
        let has_slot = objects.slots.contains(&slot);
        // Not attached again as it is: it may have been a partition of another modulus,
        // whose rows the ATTACH's check refuses (the simulator's shard seed 0: the fix
        // failed on every run). Its rows were decoded by this shard's slot, which
        // remains, only if its publication holds the table; else they are inserted again.
        if let Some(t) = objects.loose.iter().find(|t| t.name == name) {
            let table = move_aside(&mut sql, schema, &name, format!("{name}_detached"));
            match t.publications.contains(&pub_name) && has_slot {
                true => set_aside.push(table),
                false => sources.push(table),
            }
        }
        if !has_publication {
            if has_slot {
                // Made for a publication since dropped: it cannot decode past the gap,
                // and the rows it would have decoded are copied below (or were never
                // written: the remainder had no partition).
                before.push(Action::DropSlot { name: slot.clone() });
            }
            // As `outboxd init` makes it, then holding no table: the slot's first
            // decoded rows must find the publication in the catalog of their time.
            before.push(Action::CreatePublication {
                name: pub_name.clone(),
            });
        }
        // A new shard's: not by `init`, which checks the layout first; it then finds the
        // slot and records it. Whenever it is missing, also where an earlier attempt made
        // the publication but not the slot (max_replication_slots reached). One of this
        // name in another database makes this fail, before any row.
        if !has_publication || !has_slot {
            before.push(Action::CreateSlot { name: slot });
        }
        // A new table is in no publication (they hold tables, not names): the rows
        // inserted below would be decoded by no slot.
        sql.push(Action::CreatePartition {
            root: root.clone(),
            partition: partition.clone(),
            modulus: count,
            remainder: *r,
        });
        sql.push(Action::AddToPublication {
            publication: pub_name,
            table: partition,
        });
    }
    // Held only by shards beyond the count (a partition an earlier fix set aside for a
    // shard that remained then; the simulator's shard seed 1): what their slots decoded
    // and did not relay is in no remaining shard's slot, and nobody reads those. Out of
    // the shards' names: once those publications are dropped, it would be stranded.
    for name in orphaned(shard, objects, missing, stranded) {
        sources.push(move_aside(
            &mut sql,
            schema,
            name,
            format!("{name}_detached"),
        ));
    }
    // In the order the rows were written, where the table says it (sql/outbox.sql's
    // created_at): a heap scan's order is not, once deletes freed space, and the copies
    // are an aggregate's events published again. created_at is a transaction's start, so
    // a transaction's rows tie; their place in the table decides among them (a writer's
    // rows fill its page, then the next it gets: in the order written, unless deletes
    // left room on an earlier one). Without it the sort may swap them: it keeps the
    // scan's order only where the scan is in created_at order already, which concurrent
    // writers, committing out of start order, undo.
    let ordered = layout.columns.iter().any(|c| c == "created_at");
    sql.extend(sources.iter().map(|from| Action::CopyRows {
        root: root.clone(),
        from: from.clone(),
        columns: layout.columns.clone(),
        overriding: layout.identity_always,
        ordered,
    }));
    Plan {
        before,
        transaction: sql,
        copied: sources.iter().map(Rel::to_string).collect(),
        set_aside: set_aside.iter().map(Rel::to_string).collect(),
        kept: objects
            .loose
            .iter()
            .filter(|t| {
                !stranded.contains(&t.name.as_str())
                    && !partition_index(shard, &t.name).is_some_and(|r| missing.contains(&r))
                    && !orphaned(shard, objects, missing, stranded).any(|o| *o == t.name)
            })
            .map(|t| qualified(schema, &t.name))
            .collect(),
        leftovers: leftover_drops(shard, objects),
    }
}

/// Tables no partition that only publications of shards `>= count` hold, and that the
/// fix does not move otherwise (`stranded`, or taking a `missing` remainder's name).
fn orphaned<'a>(
    shard: &'a ShardSpec,
    objects: &'a ShardObjects,
    missing: &'a [u32],
    stranded: &'a [&str],
) -> impl Iterator<Item = &'a String> + 'a {
    objects
        .held
        .iter()
        .filter(move |t| {
            let remains = t
                .publications
                .iter()
                .any(|p| shard_index(&shard.publication_base, p).is_some_and(|k| k < shard.count));
            !remains
                && !stranded.contains(&t.name.as_str())
                && !partition_index(shard, &t.name).is_some_and(|r| missing.contains(&r))
        })
        .map(|t| &t.name)
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

#[cfg(test)]
#[path = "shard_tests.rs"]
mod tests;
