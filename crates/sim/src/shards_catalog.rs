//! The catalog of a sharded outbox's model (`shards.rs`): tables with their rows (some
//! attached to the root by hash bound), publications as sets of tables, and slots with
//! what they decoded. Publications hold tables, not names: a detached partition stays in
//! its publications, a new table is in none, a rename changes nothing in them. A slot
//! decodes a row only if, when the row was committed, the slot existed and its
//! publication (the one of the same shard index) held the row's table.
//!
//! It applies the actions of the fix `outbox_core::shard` prints, literally: a statement
//! PostgreSQL would refuse is an error, and a transaction that fails changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use outbox_core::shard::{Action, LooseTable, PartitionBound, Partitioning, ShardObjects};

pub const SCHEMA: &str = "public";
pub const ROOT: &str = "outbox";
/// OUTBOXD_PUBLICATION and OUTBOXD_SLOT: shard `i`'s are `outboxd_i`.
pub const BASE: &str = "outboxd";

pub type TableId = u32;

/// An outbox row: its event id (copies keep it) and aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub event: u64,
    pub agg: u64,
}

#[derive(Debug, Clone)]
pub struct Table {
    pub name: String,
    /// `(modulus, remainder)` while attached to the root.
    pub bound: Option<(u32, u32)>,
    /// The bound it had when last attached (a detach can be undone).
    pub was: Option<(u32, u32)>,
    pub rows: Vec<Row>,
}

/// A slot: the events it decoded, in commit order, and how many of them its relay
/// published (its confirmed position).
#[derive(Debug, Clone, Default)]
pub struct Slot {
    pub decoded: Vec<u64>,
    pub confirmed: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub tables: BTreeMap<TableId, Table>,
    pub publications: BTreeMap<String, BTreeSet<TableId>>,
    next_table: TableId,
}

/// Rows committed into tables: what slots decode at the commit.
pub type Committed = Vec<(TableId, Row)>;

/// PostgreSQL's hash of the partition key, as far as routing goes: one value per
/// aggregate, and `hash % modulus` picks the partition.
pub fn hash(agg: u64) -> u64 {
    let mut z = agg.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fits(row: &Row, (m, r): (u32, u32)) -> bool {
    hash(row.agg) % u64::from(m.max(1)) == u64::from(r)
}

pub fn partition_name(index: u32) -> String {
    format!("{ROOT}_shard_{index}")
}

pub fn shard_name(index: u32) -> String {
    format!("{BASE}_{index}")
}

impl Catalog {
    /// The layout `outboxd init` creates for `count` shards: partitions, each in its
    /// shard's publication.
    pub fn initial(count: u32) -> Self {
        let mut c = Catalog::default();
        for r in 0..count {
            let id = c.add(partition_name(r), Some((count, r)));
            c.publications.insert(shard_name(r), BTreeSet::from([id]));
        }
        c
    }

    pub fn add(&mut self, name: String, bound: Option<(u32, u32)>) -> TableId {
        let id = self.next_table;
        self.next_table += 1;
        self.tables.insert(
            id,
            Table {
                name,
                bound,
                was: bound,
                rows: Vec::new(),
            },
        );
        id
    }

    pub fn by_name(&self, name: &str) -> Option<TableId> {
        self.tables
            .iter()
            .find(|(_, t)| t.name == name)
            .map(|(id, _)| *id)
    }

    /// The attached partition an insert of `row` through the root goes to.
    pub fn route(&self, row: &Row) -> Option<TableId> {
        self.tables
            .iter()
            .find(|(_, t)| t.bound.is_some_and(|b| fits(row, b)))
            .map(|(id, _)| *id)
    }

    /// Whether PostgreSQL takes a partition of `bound` beside the attached ones: every
    /// modulus a factor of the larger ones, no overlap.
    pub fn bound_fits(&self, (m, r): (u32, u32)) -> bool {
        self.tables
            .values()
            .filter_map(|t| t.bound)
            .all(|(m2, r2)| {
                let (lo, hi) = (m.min(m2), m.max(m2));
                lo > 0 && hi % lo == 0 && r % lo != r2 % lo
            })
    }

    /// The publications holding table `id`, by name.
    pub fn holders(&self, id: TableId) -> Vec<String> {
        self.publications
            .iter()
            .filter(|(_, tables)| tables.contains(&id))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The facts `pgrepl::preflight` reads: the root's partitioning and what exists
    /// under the shards' names (`slots`: this database's slots).
    pub fn facts(&self, slots: &BTreeMap<String, Slot>) -> (Partitioning, ShardObjects) {
        let partitions = self
            .tables
            .iter()
            .filter_map(|(id, t)| {
                t.bound.map(|(m, r)| PartitionBound {
                    schema: SCHEMA.into(),
                    name: t.name.clone(),
                    bound: format!("FOR VALUES WITH (modulus {m}, remainder {r})"),
                    publications: self.holders(*id),
                })
            })
            .collect();
        let layout = Partitioning {
            kind: "p".into(),
            key: Some("HASH (aggregate_id)".into()),
            partitions,
            columns: vec!["id".into(), "aggregate_id".into(), "payload".into()],
            identity_always: false,
        };
        let numbered = |name: &str, prefix: &str| {
            name.strip_prefix(prefix)
                .and_then(|d| d.strip_prefix('_'))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        };
        let shard_prefix = format!("{ROOT}_shard");
        let objects = ShardObjects {
            loose: self
                .tables
                .iter()
                .filter(|(_, t)| t.bound.is_none() && numbered(&t.name, &shard_prefix))
                .map(|(id, t)| LooseTable {
                    name: t.name.clone(),
                    publications: self.holders(*id),
                })
                .collect(),
            publications: self
                .publications
                .keys()
                .filter(|p| numbered(p, BASE))
                .cloned()
                .collect(),
            slots: slots
                .keys()
                .filter(|s| numbered(s, BASE))
                .cloned()
                .collect(),
            held: self
                .tables
                .iter()
                .filter(|(_, t)| t.bound.is_none())
                .map(|(id, t)| LooseTable {
                    name: t.name.clone(),
                    publications: self
                        .holders(*id)
                        .into_iter()
                        .filter(|p| numbered(p, BASE))
                        .collect(),
                })
                .filter(|t| !t.publications.is_empty())
                .collect(),
            names: self
                .tables
                .values()
                .map(|t| t.name.clone())
                .filter(|n| n.starts_with(&format!("{shard_prefix}_")))
                .collect(),
        };
        (layout, objects)
    }

    /// Applies one statement of a transaction (not a slot's: those are not
    /// transactional), adding the rows it inserts to `committed`.
    pub fn apply(&mut self, action: &Action, committed: &mut Committed) -> Result<(), String> {
        let named = |c: &Catalog, name: &str| {
            c.by_name(name)
                .ok_or_else(|| format!("relation {name} does not exist"))
        };
        match action {
            Action::CreatePublication { name } => {
                if self.publications.contains_key(name) {
                    return Err(format!("publication {name} already exists"));
                }
                self.publications.insert(name.clone(), BTreeSet::new());
            }
            Action::DropPublication { name } => {
                self.publications
                    .remove(name)
                    .ok_or_else(|| format!("publication {name} does not exist"))?;
            }
            Action::Detach { partition, .. } => {
                let id = named(self, &partition.name)?;
                let t = self.tables.get_mut(&id).ok_or("no table")?;
                if t.bound.is_none() {
                    return Err(format!("{} is not a partition", partition.name));
                }
                t.bound = None;
            }
            Action::Rename { table, to } => {
                let id = named(self, &table.name)?;
                if self.by_name(to).is_some() {
                    return Err(format!("relation {to} already exists"));
                }
                if let Some(t) = self.tables.get_mut(&id) {
                    t.name = to.clone();
                }
            }
            Action::SetSchema { table, .. } => {
                return Err(format!("{table}: the model has one schema"));
            }
            Action::CreatePartition {
                partition,
                modulus,
                remainder,
                ..
            } => {
                if self.by_name(&partition.name).is_some() {
                    return Err(format!("relation {partition} already exists"));
                }
                let bound = (*modulus, *remainder);
                if !self.bound_fits(bound) {
                    return Err(format!("{partition} would overlap another partition"));
                }
                self.add(partition.name.clone(), Some(bound));
            }
            Action::AddToPublication { publication, table } => {
                let id = named(self, &table.name)?;
                let tables = self
                    .publications
                    .get_mut(publication)
                    .ok_or_else(|| format!("publication {publication} does not exist"))?;
                if !tables.insert(id) {
                    return Err(format!("{table} is already member of {publication}"));
                }
            }
            Action::CopyRows { from, .. } => {
                let id = named(self, &from.name)?;
                let rows = self
                    .tables
                    .get(&id)
                    .map(|t| t.rows.clone())
                    .unwrap_or_default();
                for row in rows {
                    let to = self
                        .route(&row)
                        .ok_or_else(|| format!("no partition of {ROOT} found for row {row:?}"))?;
                    self.insert(to, row, committed);
                }
            }
            Action::CreateSlot { .. } | Action::DropSlot { .. } => {
                return Err(format!("{}: not in a transaction", action.sql()));
            }
        }
        Ok(())
    }

    pub fn insert(&mut self, to: TableId, row: Row, committed: &mut Committed) {
        if let Some(t) = self.tables.get_mut(&to) {
            t.rows.push(row);
            committed.push((to, row));
        }
    }

    /// Decodes committed rows into `slots`: by each slot's publication as it is now (at
    /// the commit).
    pub fn decode(&self, committed: &Committed, slots: &mut BTreeMap<String, Slot>) {
        for (name, slot) in slots.iter_mut() {
            let Some(tables) = self.publications.get(name) else {
                continue;
            };
            slot.decoded.extend(
                committed
                    .iter()
                    .filter(|(t, _)| tables.contains(t))
                    .map(|(_, row)| row.event),
            );
        }
    }
}
