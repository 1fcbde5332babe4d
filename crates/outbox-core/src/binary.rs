//! Whether a session may ask pgoutput for binary values (`binary 'true'`, PG14+).
//!
//! The option is per connection: the walsender then sends every column that has a send
//! function in its binary form, whatever the column. outboxd decodes the binary forms
//! of the types it reads (outbox-core's `value` module) into exactly the bytes the text form
//! would have given, so a record is byte for byte the same in both modes, but only when
//! every column it reads has such a type, and when the walsender's output settings are
//! the ones the decoders reproduce (timestamptz in the ISO style at UTC, bytea as hex).
//! [`text_only_column`] finds the first column that rules binary out; the relay asks it
//! of the catalog before starting and of every Relation message while streaming.

use std::fmt;

use crate::error::ColumnRole;
use crate::mapping::TableSpec;
use crate::pgtype::{self, quote_ident};
use crate::value::{self, PayloadKind};

/// `OUTBOXD_PGOUTPUT_BINARY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BinaryMode {
    /// Binary when [`text_only_column`] finds nothing, text otherwise.
    #[default]
    Auto,
    /// Binary, and an error when a read column rules it out.
    On,
    /// Text.
    Off,
}

/// The walsender's settings that shape the text form of the types decoded from binary
/// (its `TimeZone`, `DateStyle` and `bytea_output`, as SHOW prints them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSettings {
    pub time_zone: String,
    pub date_style: String,
    pub bytea_output: String,
}

impl OutputSettings {
    /// The server defaults of a cluster made by initdb on a UTC machine.
    pub fn utc_iso_hex() -> Self {
        OutputSettings {
            time_zone: "UTC".to_owned(),
            date_style: "ISO, MDY".to_owned(),
            bytea_output: "hex".to_owned(),
        }
    }

    /// Why the binary form of `oid` does not give its text form under these settings.
    fn rules_out(&self, oid: u32) -> Option<String> {
        match oid {
            pgtype::TIMESTAMPTZ if !is_iso(&self.date_style) => Some(format!(
                "the server prints timestamptz in DateStyle {:?}, and outboxd renders binary \
                 timestamptz in the ISO style only",
                self.date_style
            )),
            pgtype::TIMESTAMPTZ if !is_utc(&self.time_zone) => Some(format!(
                "the server prints timestamptz in TimeZone {:?}, and outboxd renders binary \
                 timestamptz at UTC only",
                self.time_zone
            )),
            pgtype::BYTEA if !self.bytea_output.eq_ignore_ascii_case("hex") => Some(format!(
                "the server prints bytea with bytea_output = {:?}, and outboxd renders binary \
                 bytea as hex only",
                self.bytea_output
            )),
            _ => None,
        }
    }
}

fn is_iso(date_style: &str) -> bool {
    date_style
        .split(',')
        .next()
        .is_some_and(|s| s.trim().eq_ignore_ascii_case("ISO"))
}

/// The zone names PostgreSQL's tz database gives a constant offset of zero, which print
/// as `+00`.
fn is_utc(time_zone: &str) -> bool {
    // PostgreSQL prints zone names in the tz database's case; compare without it anyway.
    let name = match time_zone.get(..4) {
        Some(prefix) if prefix.eq_ignore_ascii_case("Etc/") => &time_zone[4..],
        _ => time_zone,
    };
    [
        "UTC",
        "UCT",
        "GMT",
        "GMT0",
        "GMT+0",
        "GMT-0",
        "Greenwich",
        "Universal",
        "Zulu",
    ]
    .iter()
    .any(|z| z.eq_ignore_ascii_case(name))
}

/// How a column is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAs {
    Role(ColumnRole),
    /// Printed into the value of a dead-letter record (`OUTBOXD_BAD_ROW_POLICY=dead-letter`).
    DeadLetter,
}

impl fmt::Display for ReadAs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadAs::Role(role) => write!(f, "the {} column", role.as_str()),
            ReadAs::DeadLetter => f.write_str("a column of dead-letter records (every column is)"),
        }
    }
}

/// A column outboxd reads whose binary form would not give its text form's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextOnly {
    pub column: String,
    pub type_oid: u32,
    pub read_as: ReadAs,
    /// `None`: outboxd has no decoder for the type.
    pub setting: Option<String>,
}

impl fmt::Display for TextOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {} ({}) is read as {}, and ",
            quote_ident(&self.column),
            pgtype::type_name(self.type_oid),
            self.read_as
        )?;
        match &self.setting {
            Some(why) => f.write_str(why),
            None => f.write_str("outboxd does not decode that type's binary form"),
        }
    }
}

/// The first column of `columns` (a table's or a Relation's, name and type OID) that
/// rules binary values out, or `None` when a session may use them. Columns the mapping
/// does not read do not count, unless `dead_letters`: a dead-letter record prints every
/// column.
pub fn text_only_column<'c>(
    spec: &TableSpec,
    columns: impl IntoIterator<Item = (&'c str, u32)>,
    dead_letters: bool,
    settings: &OutputSettings,
) -> Option<TextOnly> {
    let c = &spec.columns;
    let topic_columns = spec.topic.columns();
    columns.into_iter().find_map(|(name, oid)| {
        let text_role = [
            (c.id.as_str(), ColumnRole::Id),
            (&c.aggregate_type, ColumnRole::AggregateType),
            (&c.aggregate_id, ColumnRole::AggregateId),
            (&c.event_type, ColumnRole::EventType),
        ]
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, role)| role)
        .or_else(|| {
            c.header_columns
                .iter()
                .any(|h| h == name)
                .then_some(ColumnRole::HeaderColumn)
        })
        .or_else(|| {
            topic_columns
                .contains(&name)
                .then_some(ColumnRole::TopicPlaceholder)
        });
        let blocked = |read_as: ReadAs, setting: Option<String>| {
            Some(TextOnly {
                column: name.to_owned(),
                type_oid: oid,
                read_as,
                setting,
            })
        };
        if name == c.payload && PayloadKind::from_oid(oid).is_none() {
            return blocked(ReadAs::Role(ColumnRole::Payload), None);
        }
        if c.headers.as_deref() == Some(name) && !matches!(oid, pgtype::JSON | pgtype::JSONB) {
            return blocked(ReadAs::Role(ColumnRole::Headers), None);
        }
        let read_as = match (text_role, dead_letters) {
            (Some(role), _) => ReadAs::Role(role),
            (None, true) => ReadAs::DeadLetter,
            (None, false) => return None,
        };
        if !value::binary_reads_as_text(oid) {
            return blocked(read_as, None);
        }
        settings
            .rules_out(oid)
            .and_then(|why| blocked(read_as, Some(why)))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::topic::TopicTemplate;

    fn outbox() -> Vec<(&'static str, u32)> {
        vec![
            ("id", pgtype::UUID),
            ("aggregate_type", pgtype::TEXT),
            ("aggregate_id", pgtype::TEXT),
            ("event_type", pgtype::VARCHAR),
            ("payload", pgtype::JSONB),
            ("headers", pgtype::JSONB),
            ("created_at", pgtype::TIMESTAMPTZ),
            ("amount", pgtype::NUMERIC),
            ("tags", 1009), // text[]
        ]
    }

    #[test]
    fn only_read_columns_count_unless_dead_lettering() {
        let spec = TableSpec::default();
        let utc = OutputSettings::utc_iso_hex();
        assert_eq!(text_only_column(&spec, outbox(), false, &utc), None);
        let found = text_only_column(&spec, outbox(), true, &utc).unwrap();
        assert_eq!(
            (
                found.column.as_str(),
                found.read_as,
                found.setting.as_deref()
            ),
            ("amount", ReadAs::DeadLetter, None)
        );
        assert!(found.to_string().contains("numeric"), "{found}");
        let decodable: Vec<_> = outbox().into_iter().take(7).collect();
        assert_eq!(text_only_column(&spec, decodable, true, &utc), None);
    }

    #[test]
    fn header_and_topic_columns_are_read() {
        let mut spec = TableSpec::default();
        let utc = OutputSettings::utc_iso_hex();
        spec.columns.header_columns = vec!["created_at".into()];
        assert_eq!(text_only_column(&spec, outbox(), false, &utc), None);
        spec.columns.header_columns = vec!["amount".into()];
        let found = text_only_column(&spec, outbox(), false, &utc).unwrap();
        assert_eq!(found.read_as, ReadAs::Role(ColumnRole::HeaderColumn));
        spec.columns.header_columns.clear();
        spec.topic = Arc::new(TopicTemplate::parse("t.{tags}").unwrap());
        let found = text_only_column(&spec, outbox(), false, &utc).unwrap();
        assert_eq!(
            (found.column.as_str(), found.read_as),
            ("tags", ReadAs::Role(ColumnRole::TopicPlaceholder))
        );
        // A role's column of a type the mapping refuses: binding fails in either mode.
        let mut spec = TableSpec::default();
        spec.columns.payload = "amount".into();
        assert!(text_only_column(&spec, outbox(), false, &utc).is_some());
    }

    #[test]
    fn output_settings_the_decoders_do_not_reproduce() {
        let mut spec = TableSpec::default();
        spec.columns.header_columns = vec!["created_at".into()];
        for zone in ["UTC", "Etc/UTC", "GMT", "etc/gmt0", "Zulu"] {
            let s = OutputSettings {
                time_zone: zone.into(),
                ..OutputSettings::utc_iso_hex()
            };
            assert_eq!(text_only_column(&spec, outbox(), false, &s), None, "{zone}");
        }
        for zone in ["Asia/Kathmandu", "Europe/London", "Etc/GMT+1", "<+00>+0"] {
            let s = OutputSettings {
                time_zone: zone.into(),
                ..OutputSettings::utc_iso_hex()
            };
            let found = text_only_column(&spec, outbox(), false, &s).unwrap();
            assert!(found.to_string().contains(zone), "{found}");
        }
        let s = OutputSettings {
            date_style: "Postgres, DMY".into(),
            ..OutputSettings::utc_iso_hex()
        };
        assert!(text_only_column(&spec, outbox(), false, &s).is_some());
        // bytea as a payload is raw bytes in both modes; printed, it needs hex.
        let escape = OutputSettings {
            bytea_output: "escape".into(),
            ..OutputSettings::utc_iso_hex()
        };
        let spec = TableSpec::default();
        let bytea = vec![
            ("id", pgtype::INT8),
            ("aggregate_type", pgtype::TEXT),
            ("aggregate_id", pgtype::INT4),
            ("event_type", pgtype::TEXT),
            ("payload", pgtype::BYTEA),
        ];
        assert_eq!(text_only_column(&spec, bytea.clone(), false, &escape), None);
        let found = text_only_column(&spec, bytea, true, &escape).unwrap();
        assert!(found.to_string().contains("escape"), "{found}");
    }
}
