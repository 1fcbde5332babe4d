//! The catalog facts the shard rules weigh, as `pgrepl::preflight` reads them from the
//! server (and the simulator from its model): no IO here.

/// A partitioned table's partitioning, as the catalog has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioning {
    /// `relkind` (`p` partitioned, `r` plain, ...).
    pub kind: String,
    /// `pg_get_partkeydef`, e.g. `HASH (aggregate_id)`; `None` unless partitioned.
    pub key: Option<String>,
    /// Direct partitions, by name.
    pub partitions: Vec<PartitionBound>,
    /// The columns an INSERT may name, in order (not dropped, not generated).
    pub columns: Vec<String>,
    /// A `GENERATED ALWAYS AS IDENTITY` column is among them: an INSERT naming it needs
    /// `OVERRIDING SYSTEM VALUE`.
    pub identity_always: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionBound {
    pub schema: String,
    pub name: String,
    /// `pg_get_expr(relpartbound)`, e.g. `FOR VALUES WITH (modulus 4, remainder 1)`.
    pub bound: String,
    /// The publications holding the partition itself (`pg_publication_rel`).
    pub publications: Vec<String>,
}

/// A table named like a shard's partition that is no partition (detached, or never
/// attached), and the publications holding it (`pg_publication_rel`: by the table, not
/// its name; a detached partition stays in its publications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LooseTable {
    pub name: String,
    pub publications: Vec<String>,
}

/// What exists under the shards' names, whatever the shard count: `<table>_shard_<n>`
/// tables in the table's schema that are no partition, publications
/// `<publication>_<n>`, and this database's slots `<slot>_<n>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardObjects {
    pub loose: Vec<LooseTable>,
    pub publications: Vec<String>,
    pub slots: Vec<String>,
    /// Tables of the table's schema that are no partition, whatever their names, held by
    /// a shard's publication `<publication>_<n>`, with those publications: detached
    /// partitions whose rows that shard's slot decoded.
    pub held: Vec<LooseTable>,
    /// Every relation in the table's schema whose name starts `<table>_shard_`: names a
    /// rename must not take.
    pub names: Vec<String>,
}
