//! Outbox table rows to Kafka records.
//!
//! [`TableSpec`] is the configuration: which table, which column plays which role, and
//! the topic template. [`BoundTable::bind`] checks a Relation message against it, mapping
//! roles to column positions *by name* (Relation messages are re-sent after any relcache
//! invalidation and columns may have been reordered or added, so positions are never
//! assumed). [`BoundTable::map_insert`] turns one inserted row into an [`OutboxRecord`]:
//!
//! - key: the aggregate id's text (uuid and integer ids are printed in their usual form);
//! - value: the payload as stored, not re-encoded (json/jsonb/text text shared with the
//!   replication buffer, bytea decoded to raw bytes). A NULL payload gives a record with
//!   a null value: a tombstone for compacted topics;
//! - headers: the row's headers object (if the table has a headers column), then the
//!   configured header columns (each named after its column, its text form; NULL leaves
//!   it out), then `id`, `event_type`, `aggregate_type`, `outboxd.commit_lsn`,
//!   `outboxd.commit_time`, then the CloudEvents attributes if that format is on;
//! - timestamp: the commit time.
//!
//! NULL id, aggregate type or event type, a NULL or empty aggregate id, undecodable
//! values, a headers value that is not an object and a topic that is not a valid Kafka
//! name are [`RowError`]s.

use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{Relation, TupleData, TupleValue};

use crate::error::{ColumnRole, RowError, RowErrorKind, ShapeError};
use crate::json::{self, HeadersProblem};
use crate::pgtype::{self, qualified, quote_ident};
use crate::record::{assemble, CommitContext, EventParts, HeaderFormat, HeaderName, OutboxRecord};
use crate::topic::{EventFields, TopicTemplate};
use crate::value::{self, PayloadKind, ValueProblem};

/// Which column plays which role. Defaults: `id`, `aggregate_type`, `aggregate_id`,
/// `event_type`, `payload`, and an optional `headers` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxColumns {
    pub id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: String,
    /// The headers column (json/jsonb object), if any.
    pub headers: Option<String>,
    /// Whether a missing headers column is a [`ShapeError`]. Set it when the name was
    /// configured explicitly; with the default name, a table without the column simply
    /// has no row headers.
    pub headers_required: bool,
    /// Columns each sent as a header named after the column, in their text form (SQL
    /// NULL leaves the header out). Every one must exist in the table.
    pub header_columns: Vec<String>,
}

impl Default for OutboxColumns {
    fn default() -> Self {
        OutboxColumns {
            id: "id".to_owned(),
            aggregate_type: "aggregate_type".to_owned(),
            aggregate_id: "aggregate_id".to_owned(),
            event_type: "event_type".to_owned(),
            payload: "payload".to_owned(),
            headers: Some("headers".to_owned()),
            headers_required: false,
            header_columns: Vec::new(),
        }
    }
}

/// The outbox table and how its rows become records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Default `public`.
    pub schema: String,
    /// Default `outbox`.
    pub table: String,
    pub columns: OutboxColumns,
    /// Shared so re-binding keeps its render cache; default `outbox.{aggregate_type}`.
    pub topic: Arc<TopicTemplate>,
    /// Which headers outboxd adds; default outboxd's own only.
    pub header_format: HeaderFormat,
}

impl Default for TableSpec {
    fn default() -> Self {
        TableSpec {
            schema: "public".to_owned(),
            table: "outbox".to_owned(),
            columns: OutboxColumns::default(),
            topic: Arc::new(TopicTemplate::default()),
            header_format: HeaderFormat::default(),
        }
    }
}

impl TableSpec {
    /// Whether `relation` is this table (pgoutput sends `""` for `pg_catalog`).
    pub fn matches(&self, relation: &Relation) -> bool {
        let namespace = match relation.namespace.as_str() {
            "" => "pg_catalog",
            ns => ns,
        };
        namespace == self.schema && relation.name == self.table
    }

    /// `schema.table`, quoted as SQL needs it.
    pub fn qualified_name(&self) -> String {
        qualified(&self.schema, &self.table)
    }
}

/// A column's position and type in the current Relation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bound {
    index: usize,
    name: String,
    type_oid: u32,
}

/// A Relation checked against a [`TableSpec`]: ready to map rows. Re-bind whenever a
/// Relation message for the table arrives.
#[derive(Debug, Clone)]
pub struct BoundTable {
    rel_id: u32,
    table: String,
    column_names: Vec<String>,
    column_types: Vec<u32>,
    id: Bound,
    aggregate_type: Bound,
    aggregate_id: Bound,
    event_type: Bound,
    payload: Bound,
    payload_kind: PayloadKind,
    headers: Option<Bound>,
    /// `OUTBOXD_HEADER_COLUMNS`, in the configured order.
    header_columns: Vec<Bound>,
    /// The topic template's column placeholders.
    topic_columns: Vec<Bound>,
    topic: Arc<TopicTemplate>,
    header_format: HeaderFormat,
}

impl BoundTable {
    /// Check `relation` against `spec` and map each role to its column by name.
    pub fn bind(relation: &Relation, spec: &TableSpec) -> Result<BoundTable, ShapeError> {
        if !spec.matches(relation) {
            return Err(ShapeError::WrongTable {
                expected: spec.qualified_name(),
                found: qualified(&relation.namespace, &relation.name),
            });
        }
        Self::bind_columns(relation, spec, spec.qualified_name())
    }

    /// Binds a partition of the spec's table (the caller has checked that it is one, in
    /// the catalog): its rows are the table's rows. Shape errors and dead letters name
    /// the partition, where the row is.
    pub fn bind_partition(relation: &Relation, spec: &TableSpec) -> Result<BoundTable, ShapeError> {
        Self::bind_columns(
            relation,
            spec,
            qualified(&relation.namespace, &relation.name),
        )
    }

    fn bind_columns(
        relation: &Relation,
        spec: &TableSpec,
        table: String,
    ) -> Result<BoundTable, ShapeError> {
        let cols = &spec.columns;
        let find = |name: &str, role: ColumnRole| -> Result<Bound, ShapeError> {
            relation
                .columns
                .iter()
                .enumerate()
                .find(|(_, c)| c.name == name)
                .map(|(index, c)| Bound {
                    index,
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                })
                .ok_or_else(|| ShapeError::MissingColumn {
                    table: table.clone(),
                    column: name.to_owned(),
                    role,
                    available: relation
                        .columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        };
        let check = |b: Bound,
                     role: ColumnRole,
                     ok: fn(u32) -> bool,
                     target: &str|
         -> Result<Bound, ShapeError> {
            if ok(b.type_oid) {
                return Ok(b);
            }
            let col = quote_ident(&b.name);
            Err(ShapeError::WrongType {
                table: table.clone(),
                column: b.name.clone(),
                role,
                found: pgtype::type_name(b.type_oid),
                fix: format!(
                    "change the column type, for example: ALTER TABLE {table} ALTER COLUMN \
                     {col} TYPE {target} USING {col}::text::{target};"
                ),
            })
        };

        let id = find(&cols.id, ColumnRole::Id)?;
        let aggregate_type = check(
            find(&cols.aggregate_type, ColumnRole::AggregateType)?,
            ColumnRole::AggregateType,
            pgtype::is_textual,
            "text",
        )?;
        let aggregate_id = check(
            find(&cols.aggregate_id, ColumnRole::AggregateId)?,
            ColumnRole::AggregateId,
            is_key_type,
            "text",
        )?;
        let event_type = check(
            find(&cols.event_type, ColumnRole::EventType)?,
            ColumnRole::EventType,
            pgtype::is_textual,
            "text",
        )?;
        let payload = check(
            find(&cols.payload, ColumnRole::Payload)?,
            ColumnRole::Payload,
            |oid| PayloadKind::from_oid(oid).is_some(),
            "jsonb",
        )?;
        let payload_kind = PayloadKind::from_oid(payload.type_oid).unwrap_or(PayloadKind::Text);
        let headers = match &cols.headers {
            None => None,
            Some(name) => match find(name, ColumnRole::Headers) {
                Ok(b) => Some(check(
                    b,
                    ColumnRole::Headers,
                    |oid| matches!(oid, pgtype::JSONB | pgtype::JSON),
                    "jsonb",
                )?),
                Err(_) if !cols.headers_required => None,
                Err(e) => return Err(e),
            },
        };
        let header_columns = cols
            .header_columns
            .iter()
            .map(|name| find(name, ColumnRole::HeaderColumn))
            .collect::<Result<Vec<_>, _>>()?;
        let topic_columns = spec
            .topic
            .columns()
            .into_iter()
            .map(|name| find(name, ColumnRole::TopicPlaceholder))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BoundTable {
            rel_id: relation.rel_id,
            table,
            column_names: relation.columns.iter().map(|c| c.name.clone()).collect(),
            column_types: relation.columns.iter().map(|c| c.type_oid).collect(),
            id,
            aggregate_type,
            aggregate_id,
            event_type,
            payload,
            payload_kind,
            headers,
            header_columns,
            topic_columns,
            topic: Arc::clone(&spec.topic),
            header_format: spec.header_format.clone(),
        })
    }

    /// The relation OID the binding was made for (pgoutput's key for later rows).
    pub fn rel_id(&self) -> u32 {
        self.rel_id
    }

    /// `schema.table`, quoted as SQL needs it.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    pub fn payload_kind(&self) -> PayloadKind {
        self.payload_kind
    }

    /// Whether row headers are read from a headers column.
    pub fn has_headers_column(&self) -> bool {
        self.headers.is_some()
    }

    pub fn topic_template(&self) -> &Arc<TopicTemplate> {
        &self.topic
    }

    /// The row's [`crate::delivered::row_identity`]: its id column's raw value as the
    /// stream carries it (the outbox's primary key), whatever else the row holds.
    pub fn row_identity(&self, tuple: &TupleData) -> u64 {
        use crate::delivered::row_identity;
        match tuple.columns.get(self.id.index) {
            Some(TupleValue::Text(b)) => row_identity(b't', b),
            Some(TupleValue::Binary(b)) => row_identity(b'b', b),
            Some(TupleValue::Null) => row_identity(b'n', &[]),
            Some(TupleValue::UnchangedToast) => row_identity(b'u', &[]),
            None => row_identity(b'-', &[]),
        }
    }

    /// Turn an inserted row into a Kafka record. See the module docs for the mapping.
    pub fn map_insert(
        &self,
        tuple: &TupleData,
        ctx: &CommitContext,
    ) -> Result<OutboxRecord, RowError> {
        if tuple.columns.len() != self.column_names.len() {
            return Err(RowError::new(
                RowErrorKind::MalformedTuple,
                format!(
                    "a row of {} has {} columns but its Relation message announced {}; \
                     this is a replication protocol error, please report it",
                    self.table,
                    tuple.columns.len(),
                    self.column_names.len()
                ),
            ));
        }
        let id_bytes = self.required_text(tuple, &self.id, None)?;
        let id = self.utf8(&id_bytes, &self.id, None)?;
        let eid = Some(id);
        let aggregate_id = match self.text(tuple, &self.aggregate_id, eid)? {
            Some(b) if b.is_empty() => {
                return Err(self.row_error(
                    RowErrorKind::EmptyAggregateId,
                    &self.aggregate_id,
                    "is empty; the aggregate id is the Kafka key that keeps an aggregate's \
                     events in order: insert the aggregate's id",
                    eid,
                ))
            }
            Some(b) => b,
            None => {
                return Err(self.row_error(
                    RowErrorKind::NullAggregateId,
                    &self.aggregate_id,
                    "is NULL; the aggregate id is the Kafka key that keeps an aggregate's \
                     events in order: insert the aggregate's id (and make the column NOT NULL)",
                    eid,
                ))
            }
        };
        let aggregate_type_bytes = self.required_text(tuple, &self.aggregate_type, eid)?;
        let event_type_bytes = self.required_text(tuple, &self.event_type, eid)?;
        let value = value::payload_of(self.value_at(tuple, &self.payload), self.payload_kind)
            .map_err(|p| self.problem(p, &self.payload, eid))?;
        let mut headers = match &self.headers {
            Some(h) => self.row_headers(tuple, h, eid)?,
            None => Vec::new(),
        };
        for col in &self.header_columns {
            if let Some(text) = self.text(tuple, col, eid)? {
                headers.push((HeaderName::Owned(col.name.clone()), text));
            }
        }
        let mut column_bytes = Vec::with_capacity(self.topic_columns.len());
        for col in &self.topic_columns {
            column_bytes.push((col, self.text(tuple, col, eid)?));
        }
        let mut columns = Vec::with_capacity(column_bytes.len());
        for (col, bytes) in &column_bytes {
            let text = match bytes {
                Some(b) => Some(self.utf8(b, col, eid)?),
                None => None,
            };
            columns.push((col.name.as_str(), text));
        }
        let fields = EventFields {
            id,
            aggregate_type: self.utf8(&aggregate_type_bytes, &self.aggregate_type, eid)?,
            aggregate_id: self.utf8(&aggregate_id, &self.aggregate_id, eid)?,
            event_type: self.utf8(&event_type_bytes, &self.event_type, eid)?,
            columns: &columns,
        };
        let topic = self.topic.render(&fields)?;
        let event_id = id.to_owned();
        let parts = EventParts {
            id: id_bytes,
            aggregate_type: aggregate_type_bytes,
            aggregate_id,
            event_type: event_type_bytes,
            event_id,
            content_type: self.payload_kind.content_type(),
        };
        assemble(topic, parts, value, headers, ctx, &self.header_format)
    }

    /// Column names and type OIDs of the bound Relation, in order.
    pub(crate) fn columns(&self) -> impl Iterator<Item = (&str, u32)> {
        self.column_names
            .iter()
            .map(String::as_str)
            .zip(self.column_types.iter().copied())
    }

    /// Position of the aggregate id and id columns, for dead-letter records.
    pub(crate) fn aggregate_id_index(&self) -> usize {
        self.aggregate_id.index
    }

    /// The row's id as text, when `tuple` holds it readably (for a row read through for
    /// its size, which has only its leading columns).
    pub(crate) fn event_id_text(&self, tuple: &TupleData) -> Option<String> {
        let oid = self.column_types.get(self.id.index).copied()?;
        tuple
            .columns
            .get(self.id.index)
            .and_then(|v| crate::value::display_text(v, oid))
            .filter(|t| !t.is_empty())
    }

    pub(crate) fn id_index(&self) -> usize {
        self.id.index
    }

    pub(crate) fn payload_index(&self) -> usize {
        self.payload.index
    }

    fn value_at<'t>(&self, tuple: &'t TupleData, col: &Bound) -> &'t TupleValue {
        tuple.columns.get(col.index).unwrap_or(&TupleValue::Null)
    }

    fn text(
        &self,
        tuple: &TupleData,
        col: &Bound,
        eid: Option<&str>,
    ) -> Result<Option<Bytes>, RowError> {
        value::text_of(self.value_at(tuple, col), col.type_oid)
            .map_err(|p| self.problem(p, col, eid))
    }

    fn required_text(
        &self,
        tuple: &TupleData,
        col: &Bound,
        eid: Option<&str>,
    ) -> Result<Bytes, RowError> {
        self.text(tuple, col, eid)?.ok_or_else(|| {
            self.row_error(
                RowErrorKind::NullColumn,
                col,
                "is NULL; every outbox row needs an id, an aggregate type and an event type: \
                 insert a value (and make the column NOT NULL)",
                eid,
            )
        })
    }

    fn utf8<'b>(&self, b: &'b Bytes, col: &Bound, eid: Option<&str>) -> Result<&'b str, RowError> {
        std::str::from_utf8(b).map_err(|e| {
            self.row_error(
                RowErrorKind::UnreadableValue,
                col,
                &format!(
                    "is not valid UTF-8 ({e}); outboxd needs a UTF8 database encoding for \
                     text columns"
                ),
                eid,
            )
        })
    }

    fn row_headers(
        &self,
        tuple: &TupleData,
        col: &Bound,
        eid: Option<&str>,
    ) -> Result<Vec<(HeaderName, Bytes)>, RowError> {
        let Some(json) = value::json_of(self.value_at(tuple, col), col.type_oid)
            .map_err(|p| self.problem(p, col, eid))?
        else {
            return Ok(Vec::new());
        };
        json::headers_object(&json).map_err(|p| {
            let kind = match p {
                HeadersProblem::NotObject(_) => RowErrorKind::HeadersNotObject,
                HeadersProblem::Invalid(_) => RowErrorKind::UnreadableValue,
            };
            self.row_error(
                kind,
                col,
                &format!(
                    "cannot be used as Kafka headers: {p}. Store a JSON object of header \
                     names to values (strings are sent as is, other values as JSON), or NULL"
                ),
                eid,
            )
        })
    }

    fn problem(&self, p: ValueProblem, col: &Bound, eid: Option<&str>) -> RowError {
        match p {
            ValueProblem::UnchangedToast => self.row_error(
                RowErrorKind::UnchangedToast,
                col,
                "was not sent (unchanged TOAST value); outboxd relays INSERTs, which always \
                 carry full values: publish only inserts (WITH (publish = 'insert'))",
                eid,
            ),
            ValueProblem::Unreadable(why) => self.row_error(
                RowErrorKind::UnreadableValue,
                col,
                &format!("cannot be read: {why}"),
                eid,
            ),
        }
    }

    fn row_error(
        &self,
        kind: RowErrorKind,
        col: &Bound,
        what: &str,
        eid: Option<&str>,
    ) -> RowError {
        RowError::new(
            kind,
            format!("column {} of {} {what}", quote_ident(&col.name), self.table),
        )
        .with_event_id(eid)
    }
}

fn is_key_type(oid: u32) -> bool {
    pgtype::is_textual(oid)
        || matches!(
            oid,
            pgtype::UUID | pgtype::INT2 | pgtype::INT4 | pgtype::INT8
        )
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
