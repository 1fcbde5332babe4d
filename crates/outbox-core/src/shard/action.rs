//! One statement of a printed fix, and its SQL: the relay prints [`Action::sql`], the
//! simulator applies the same action to its model of the catalog.

use std::fmt;

use crate::pgtype::{qualified, quote_ident};

/// A relation by schema and name, printed quoted where it needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rel {
    pub schema: String,
    pub name: String,
}

impl Rel {
    pub fn new(schema: &str, name: &str) -> Self {
        Rel {
            schema: schema.to_owned(),
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for Rel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&qualified(&self.schema, &self.name))
    }
}

/// A statement of a fix the shard rules print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// As `outboxd init` makes a shard's publication, holding no table yet.
    CreatePublication {
        name: String,
    },
    CreateSlot {
        name: String,
    },
    DropSlot {
        name: String,
    },
    DropPublication {
        name: String,
    },
    Detach {
        root: Rel,
        partition: Rel,
    },
    /// Renames `table` in its schema.
    Rename {
        table: Rel,
        to: String,
    },
    SetSchema {
        table: Rel,
        schema: String,
    },
    CreatePartition {
        root: Rel,
        partition: Rel,
        modulus: u32,
        remainder: u32,
    },
    AddToPublication {
        publication: String,
        table: Rel,
    },
    /// Every row of `from` inserted again through `root`, by column name.
    CopyRows {
        root: Rel,
        from: Rel,
        columns: Vec<String>,
        /// A `GENERATED ALWAYS AS IDENTITY` column is among `columns`.
        overriding: bool,
        /// `ORDER BY created_at, ctid` (the table has that column), else `ORDER BY ctid`:
        /// see `back_to_shards`.
        ordered: bool,
    },
}

impl Action {
    /// The statement as the fix prints it.
    pub fn sql(&self) -> String {
        match self {
            Action::CreatePublication { name } => format!(
                "CREATE PUBLICATION {} WITH (publish = 'insert', publish_via_partition_root = true)",
                quote_ident(name)
            ),
            Action::CreateSlot { name } => format!(
                "SELECT pg_catalog.pg_create_logical_replication_slot({}, 'pgoutput')",
                literal(name)
            ),
            Action::DropSlot { name } => format!(
                "SELECT pg_catalog.pg_drop_replication_slot({})",
                literal(name)
            ),
            Action::DropPublication { name } => format!("DROP PUBLICATION {}", quote_ident(name)),
            Action::Detach { root, partition } => {
                format!("ALTER TABLE {root} DETACH PARTITION {partition}")
            }
            Action::Rename { table, to } => {
                format!("ALTER TABLE {table} RENAME TO {}", quote_ident(to))
            }
            Action::SetSchema { table, schema } => {
                format!("ALTER TABLE {table} SET SCHEMA {}", quote_ident(schema))
            }
            Action::CreatePartition {
                root,
                partition,
                modulus,
                remainder,
            } => format!(
                "CREATE TABLE {partition} PARTITION OF {root} {}",
                bound(*modulus, *remainder)
            ),
            Action::AddToPublication { publication, table } => format!(
                "ALTER PUBLICATION {} ADD TABLE {table}",
                quote_ident(publication)
            ),
            Action::CopyRows {
                root,
                from,
                columns,
                overriding,
                ordered,
            } => {
                // By column name: an attached table's columns may be in another order
                // than the root's. Values are copied as stored (a json payload keeps its
                // bytes).
                let columns: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
                let columns = columns.join(", ");
                let overriding = match overriding {
                    true => " OVERRIDING SYSTEM VALUE",
                    false => "",
                };
                let order = match ordered {
                    true => " ORDER BY created_at, ctid",
                    false => " ORDER BY ctid",
                };
                format!("INSERT INTO {root} ({columns}){overriding} SELECT {columns} FROM {from}{order}")
            }
        }
    }
}

fn bound(modulus: u32, remainder: u32) -> String {
    format!("FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})")
}

/// A SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The actions' statements, joined as the fix prints them.
pub(super) fn joined(actions: &[Action]) -> String {
    actions
        .iter()
        .map(Action::sql)
        .collect::<Vec<_>>()
        .join("; ")
}
