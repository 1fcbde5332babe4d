//! What each relation of the stream is to the relay: the outbox (or a partition of it),
//! or another published table whose inserts are counted and not published.

use std::sync::Arc;

use outbox_core::BoundTable;
use pgoutput::Relation;
use pgrepl::preflight;

use super::{bounded, Session};
use crate::pipeline::error::RelayError;

/// What the rows of a relation of the stream are to the relay.
pub(super) enum RelationRole {
    /// The outbox table, or a partition of it (pgoutput names partitions by their own
    /// name unless the publication sets publish_via_partition_root).
    Outbox(Arc<BoundTable>),
    /// Any other published relation: its inserts are counted, not published.
    Ignored {
        name: String,
        /// Inserts not yet added to the metrics.
        unreported: u64,
    },
}

impl Session<'_> {
    pub(super) async fn on_relation(&mut self, r: &Relation) -> Result<(), RelayError> {
        let table = &self.cfg.table;
        let role = if !self.cfg.relay_table {
            None
        } else if table.matches(r) {
            Some(BoundTable::bind(r, table)?)
        } else if bounded("looking up a relation's partition parent", async {
            Ok(
                preflight::is_partition_of(&self.sql, r.rel_id, &table.schema, &table.table)
                    .await?,
            )
        })
        .await?
        {
            // Any depth: bound by column names, since a partition's column order may
            // differ from its parent's.
            Some(BoundTable::bind_partition(r, table)?)
        } else if BoundTable::bind_partition(r, table).is_ok() {
            // Shaped like the outbox but, in today's catalog, neither the table nor a
            // partition of it: most likely a partition detached or dropped since its rows
            // were written (possible only for rows from before publish_via_partition_root
            // was set). Ignoring it could drop events: stop, and say how to get past it.
            return Err(RelayError::OutboxLikeRelation {
                relation: qualified_relation_name(r),
                table: table.qualified_name(),
            });
        } else {
            None
        };
        if role.is_some() {
            crate::pipeline::binary::verify_relation(self.cfg, &self.binary, r)?;
        }
        let role = match role {
            Some(bound) => RelationRole::Outbox(Arc::new(bound)),
            None => RelationRole::Ignored {
                name: qualified_relation_name(r),
                unreported: 0,
            },
        };
        // A re-sent Relation (after a schema change) keeps the count not yet reported.
        let unreported = match self.relations.get(&r.rel_id) {
            Some(RelationRole::Ignored { unreported, .. }) => *unreported,
            _ => 0,
        };
        let role = match role {
            RelationRole::Ignored { name, .. } => RelationRole::Ignored { name, unreported },
            outbox => outbox,
        };
        self.relations.insert(r.rel_id, role);
        Ok(())
    }

    /// Adds the ignored inserts counted since the last tick to the metrics, logging each
    /// relation the first time this process sees rows of it.
    pub(super) fn report_ignored_rows(&mut self) {
        for role in self.relations.values_mut() {
            if let RelationRole::Ignored { name, unreported } = role {
                if *unreported == 0 {
                    continue;
                }
                if self.obs.ignored_rows(name, *unreported) {
                    tracing::warn!(
                        relation = %name,
                        outbox = %self.cfg.table.qualified_name(),
                        "the publication sends inserts of {name}, which is neither the outbox table nor one of its partitions: they are counted in outboxd_ignored_rows_total and not published"
                    );
                }
                *unreported = 0;
            }
        }
    }
}

fn qualified_relation_name(r: &Relation) -> String {
    let namespace = if r.namespace.is_empty() {
        "pg_catalog"
    } else {
        r.namespace.as_str()
    };
    format!("{namespace}.{}", r.name)
}
