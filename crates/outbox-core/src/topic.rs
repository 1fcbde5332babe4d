//! Kafka topic names and the topic template that routes each event.
//!
//! A template is text with `{field}` placeholders naming a logical outbox field: `id`,
//! `aggregate_type`, `aggregate_id` or `event_type` (e.g. the default
//! `outbox.{aggregate_type}`), or any other column of the table by its name
//! (`outbox.{tenant}.{aggregate_type}`; for an emitted message, the envelope's top-level
//! field of that name); without placeholders it is one fixed topic. Literal text is
//! checked when the template is parsed, the rendered name for every event (a row error if
//! invalid: the value is the user's to fix, not the configuration).
//!
//! Rendering allocates only for a value not seen recently: a template that uses one field
//! (any number of times) keeps a small cache from that field's value to the rendered name,
//! and a fixed topic is a shared `Arc<str>`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{ConfigError, RowError, RowErrorKind, TopicNameProblem};

/// Kafka's limit on topic name length.
pub const MAX_TOPIC_LEN: usize = 249;

/// Rendered names kept per template before the cache is cleared.
const CACHE_CAPACITY: usize = 1024;

/// Check a topic name against Kafka's rules: `[a-zA-Z0-9._-]`, 1..=249 characters, not
/// `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameProblem> {
    if let Some(c) = name.chars().find(|c| !is_topic_char(*c)) {
        return Err(TopicNameProblem::InvalidChar(c));
    }
    match name.len() {
        0 => Err(TopicNameProblem::Empty),
        len if len > MAX_TOPIC_LEN => Err(TopicNameProblem::TooLong { len }),
        _ if name == "." || name == ".." => Err(TopicNameProblem::DotOrDotDot),
        _ => Ok(()),
    }
}

fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A validated Kafka topic name (e.g. the dead-letter topic), cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName(Arc<str>);

impl TopicName {
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        validate_topic_name(name).map_err(|problem| ConfigError::TopicName {
            name: name.to_owned(),
            problem,
        })?;
        Ok(TopicName(Arc::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A logical outbox field a template placeholder can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TopicField {
    Id,
    AggregateType,
    AggregateId,
    EventType,
}

impl TopicField {
    pub const ALL: [TopicField; 4] = [
        TopicField::Id,
        TopicField::AggregateType,
        TopicField::AggregateId,
        TopicField::EventType,
    ];

    /// The placeholder name, which is also the logical field's name.
    pub fn name(self) -> &'static str {
        match self {
            TopicField::Id => "id",
            TopicField::AggregateType => "aggregate_type",
            TopicField::AggregateId => "aggregate_id",
            TopicField::EventType => "event_type",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        TopicField::ALL.into_iter().find(|f| f.name() == name)
    }

    fn get<'a>(self, fields: &EventFields<'a>) -> &'a str {
        match self {
            TopicField::Id => fields.id,
            TopicField::AggregateType => fields.aggregate_type,
            TopicField::AggregateId => fields.aggregate_id,
            TopicField::EventType => fields.event_type,
        }
    }
}

/// The text of an event's logical fields, as read from a row or an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventFields<'a> {
    pub id: &'a str,
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub event_type: &'a str,
    /// The values of the template's column placeholders ([`TopicTemplate::columns`]), by
    /// name; `None` for SQL NULL. Empty when the template names no column.
    pub columns: &'a [(&'a str, Option<&'a str>)],
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(TopicField),
    Column(String),
}

/// What the render cache is keyed on: the one placeholder the template uses.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CacheKey {
    Field(TopicField),
    Column(String),
}

fn column_value<'a>(fields: &EventFields<'a>, name: &str) -> Option<&'a str> {
    fields
        .columns
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| *v)
}

/// A parsed topic template with its render cache. Cloning gives an empty cache.
pub struct TopicTemplate {
    source: String,
    segments: Vec<Segment>,
    /// Set when there is no placeholder.
    fixed: Option<Arc<str>>,
    /// Set when every placeholder names this one field or column: the cache key.
    single_field: Option<CacheKey>,
    cache: Mutex<HashMap<String, Arc<str>>>,
}

impl TopicTemplate {
    /// The default routing: one topic per aggregate type.
    pub const DEFAULT: &'static str = "outbox.{aggregate_type}";

    pub fn parse(template: &str) -> Result<Self, ConfigError> {
        let err = |reason: String| ConfigError::TopicTemplate {
            template: template.to_owned(),
            reason,
        };
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut literal_len = 0usize;
        let mut rest = template;
        while let Some(c) = rest.chars().next() {
            match c {
                '{' => {
                    let close = rest
                        .find('}')
                        .ok_or_else(|| err("a '{' has no matching '}'".to_owned()))?;
                    let name = &rest[1..close];
                    let segment = match TopicField::from_name(name) {
                        Some(field) => Segment::Field(field),
                        None if is_column_name(name) => Segment::Column(name.to_owned()),
                        None => {
                            return Err(err(format!(
                                "placeholder {{{name}}} is neither a field ({}) nor a column \
                                 name (1-63 bytes, no quotes, braces or spaces)",
                                placeholder_list()
                            )))
                        }
                    };
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(segment);
                    rest = &rest[close + 1..];
                }
                '}' => return Err(err("a '}' has no matching '{'".to_owned())),
                c if is_topic_char(c) => {
                    literal.push(c);
                    literal_len += 1;
                    rest = &rest[1..];
                }
                c => {
                    return Err(err(format!(
                        "{c:?} is not allowed in a Kafka topic name; use ASCII letters, \
                         digits, '.', '_' and '-' around the placeholders"
                    )))
                }
            }
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        if literal_len > MAX_TOPIC_LEN {
            return Err(err(format!(
                "its fixed text is {literal_len} characters long, the topic limit is {MAX_TOPIC_LEN}"
            )));
        }
        let fields: Vec<CacheKey> = segments
            .iter()
            .filter_map(|s| match s {
                Segment::Field(f) => Some(CacheKey::Field(*f)),
                Segment::Column(c) => Some(CacheKey::Column(c.clone())),
                Segment::Literal(_) => None,
            })
            .collect();
        let fixed = if fields.is_empty() {
            validate_topic_name(template).map_err(|problem| err(problem.to_string()))?;
            Some(Arc::from(template))
        } else {
            None
        };
        let single_field = fields
            .first()
            .filter(|first| fields.iter().all(|f| f == *first))
            .cloned();
        Ok(TopicTemplate {
            source: template.to_owned(),
            segments,
            fixed,
            single_field,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The template text as configured.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The fixed topic, if the template has no placeholder.
    pub fn fixed_topic(&self) -> Option<&Arc<str>> {
        self.fixed.as_ref()
    }

    /// Whether any placeholder names `field`.
    pub fn uses(&self, field: TopicField) -> bool {
        self.segments.contains(&Segment::Field(field))
    }

    /// The column names the template's placeholders name (other than the logical
    /// fields), each once, in order of first use. Binding checks they exist.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.segments {
            if let Segment::Column(c) = s {
                if !out.contains(&c.as_str()) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// The topic for an event. A rendered name that is not a valid Kafka topic is a
    /// [`RowErrorKind::InvalidTopic`] row error.
    pub fn render(&self, fields: &EventFields<'_>) -> Result<Arc<str>, RowError> {
        if let Some(fixed) = &self.fixed {
            return Ok(Arc::clone(fixed));
        }
        let key = match &self.single_field {
            None => return self.render_uncached(fields),
            Some(CacheKey::Field(f)) => f.get(fields),
            Some(CacheKey::Column(c)) => match column_value(fields, c) {
                Some(v) => v,
                // NULL: an error, which is never cached.
                None => return self.render_uncached(fields),
            },
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(topic) = cache.get(key) {
            return Ok(Arc::clone(topic));
        }
        let topic = self.render_uncached(fields)?;
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key.to_owned(), Arc::clone(&topic));
        Ok(topic)
    }

    fn render_uncached(&self, fields: &EventFields<'_>) -> Result<Arc<str>, RowError> {
        let mut out = String::with_capacity(64);
        for segment in &self.segments {
            match segment {
                Segment::Literal(s) => out.push_str(s),
                Segment::Field(f) => out.push_str(f.get(fields)),
                Segment::Column(c) => match column_value(fields, c) {
                    Some(v) => out.push_str(v),
                    None => {
                        return Err(RowError::new(
                            RowErrorKind::InvalidTopic,
                            format!(
                                "topic template {:?} uses column {c:?}, which is NULL (or \
                                 missing from the envelope) for this event: insert a value, \
                                 or change the topic template",
                                self.source
                            ),
                        )
                        .with_event_id(Some(fields.id)))
                    }
                },
            }
        }
        validate_topic_name(&out).map_err(|problem| {
            let used: Vec<String> = TopicField::ALL
                .into_iter()
                .filter(|f| self.uses(*f))
                .map(|f| f.name().to_owned())
                .chain(self.columns().into_iter().map(str::to_owned))
                .collect();
            RowError::new(
                RowErrorKind::InvalidTopic,
                format!(
                    "topic template {:?} rendered {out:?}, which is not a valid Kafka topic \
                     name: {problem}. Fix the row's {} value, or change the topic template",
                    self.source,
                    used.join("/"),
                ),
            )
            .with_event_id(Some(fields.id))
        })?;
        Ok(Arc::from(out))
    }

    #[cfg(test)]
    fn cached_len(&self) -> usize {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

fn placeholder_list() -> String {
    TopicField::ALL
        .into_iter()
        .map(|f| format!("{{{}}}", f.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a column placeholder may name: what the configuration accepts as an identifier.
fn is_column_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name
            .chars()
            .any(|c| c == '"' || c == '{' || c == '}' || c.is_whitespace() || c.is_control())
}

impl Clone for TopicTemplate {
    fn clone(&self) -> Self {
        TopicTemplate {
            source: self.source.clone(),
            segments: self.segments.clone(),
            fixed: self.fixed.clone(),
            single_field: self.single_field.clone(),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl fmt::Debug for TopicTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TopicTemplate").field(&self.source).finish()
    }
}

impl PartialEq for TopicTemplate {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for TopicTemplate {}

impl Default for TopicTemplate {
    fn default() -> Self {
        let segments = vec![
            Segment::Literal("outbox.".to_owned()),
            Segment::Field(TopicField::AggregateType),
        ];
        TopicTemplate {
            source: Self::DEFAULT.to_owned(),
            segments,
            fixed: None,
            single_field: Some(CacheKey::Field(TopicField::AggregateType)),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(aggregate_type: &'a str, event_type: &'a str) -> EventFields<'a> {
        EventFields {
            id: "e1",
            aggregate_type,
            aggregate_id: "42",
            event_type,
            columns: &[],
        }
    }

    #[test]
    fn topic_name_rules() {
        assert!(validate_topic_name("orders.v1-x_y").is_ok());
        assert_eq!(validate_topic_name(""), Err(TopicNameProblem::Empty));
        assert_eq!(
            validate_topic_name("a b"),
            Err(TopicNameProblem::InvalidChar(' '))
        );
        assert_eq!(
            validate_topic_name("é"),
            Err(TopicNameProblem::InvalidChar('é'))
        );
        assert_eq!(
            validate_topic_name(".."),
            Err(TopicNameProblem::DotOrDotDot)
        );
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
        assert_eq!(
            validate_topic_name(&"a".repeat(250)),
            Err(TopicNameProblem::TooLong { len: 250 })
        );
        assert!(TopicName::parse("dlq").is_ok());
        let e = TopicName::parse("bad topic").unwrap_err();
        assert!(e.to_string().contains("' '"), "{e}");
    }

    #[test]
    fn default_template() {
        let t = TopicTemplate::default();
        assert_eq!(t, TopicTemplate::parse(TopicTemplate::DEFAULT).unwrap());
        assert_eq!(&*t.render(&fields("Order", "x")).unwrap(), "outbox.Order");
        assert!(t.uses(TopicField::AggregateType));
        assert!(!t.uses(TopicField::EventType));
    }

    #[test]
    fn fixed_topic_shares_one_allocation() {
        let t = TopicTemplate::parse("events").unwrap();
        let a = t.render(&fields("A", "x")).unwrap();
        let b = t.render(&fields("B", "y")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(t.fixed_topic().map(|s| &**s), Some("events"));
    }

    #[test]
    fn single_field_template_is_cached() {
        let t = TopicTemplate::parse("{aggregate_type}.{aggregate_type}").unwrap();
        let a = t.render(&fields("Order", "x")).unwrap();
        let b = t.render(&fields("Order", "y")).unwrap();
        assert_eq!(&*a, "Order.Order");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(t.cached_len(), 1);
        // Errors are not cached.
        assert!(t.render(&fields("bad type", "x")).is_err());
        assert_eq!(t.cached_len(), 1);
        // A clone starts with an empty cache but renders the same.
        #[allow(clippy::redundant_clone)] // the clone is what is tested
        let c = t.clone();
        assert_eq!(c.cached_len(), 0);
        assert_eq!(&*c.render(&fields("Order", "x")).unwrap(), "Order.Order");
    }

    #[test]
    fn cache_is_bounded() {
        let t = TopicTemplate::parse("t.{event_type}").unwrap();
        for i in 0..(CACHE_CAPACITY + 10) {
            let et = format!("e{i}");
            assert_eq!(
                &*t.render(&fields("A", &et)).unwrap(),
                format!("t.e{i}").as_str()
            );
        }
        assert!(t.cached_len() <= CACHE_CAPACITY);
    }

    #[test]
    fn multi_field_template() {
        let t = TopicTemplate::parse("{aggregate_type}-{event_type}-{id}-{aggregate_id}").unwrap();
        assert_eq!(
            &*t.render(&fields("Order", "Created")).unwrap(),
            "Order-Created-e1-42"
        );
        assert_eq!(
            t.as_str(),
            "{aggregate_type}-{event_type}-{id}-{aggregate_id}"
        );
    }

    #[test]
    fn invalid_rendered_topic_is_a_row_error() {
        let t = TopicTemplate::default();
        let e = t.render(&fields("Order Lines", "x")).unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::InvalidTopic);
        assert_eq!(e.event_id(), Some("e1"));
        let msg = e.to_string();
        assert!(msg.contains("outbox.Order Lines"), "{msg}");
        assert!(msg.contains("aggregate_type"), "{msg}");
        let e = t.render(&fields(&"x".repeat(245), "x")).unwrap_err();
        assert!(e.to_string().contains("249"), "{e}");
        let t = TopicTemplate::parse("{event_type}").unwrap();
        assert!(t.render(&fields("A", "")).is_err());
        assert!(t.render(&fields("A", "..")).is_err());
    }

    #[test]
    fn column_placeholders() {
        let t = TopicTemplate::parse("outbox.{tenant}.{aggregate_type}").unwrap();
        assert_eq!(t.columns(), vec!["tenant"]);
        let cols = [("tenant", Some("acme"))];
        let f = EventFields {
            columns: &cols,
            ..fields("Order", "x")
        };
        assert_eq!(&*t.render(&f).unwrap(), "outbox.acme.Order");
        // NULL (or absent) is a row error naming the column.
        let null = [("tenant", None)];
        let e = t
            .render(&EventFields {
                columns: &null,
                ..fields("Order", "x")
            })
            .unwrap_err();
        assert_eq!(e.kind(), RowErrorKind::InvalidTopic);
        assert!(e.to_string().contains("\"tenant\""), "{e}");
        assert!(t.render(&fields("Order", "x")).is_err());
        // A single column placeholder is cached like a field.
        let t = TopicTemplate::parse("t.{tenant}").unwrap();
        let a = t.render(&f).unwrap();
        let b = t.render(&f).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let bad = [("tenant", Some("a b"))];
        let e = t
            .render(&EventFields {
                columns: &bad,
                ..fields("Order", "x")
            })
            .unwrap_err();
        assert!(e.to_string().contains("tenant"), "{e}");
    }

    #[test]
    fn parse_errors() {
        for (tpl, needle) in [
            ("outbox.{aggregate_type", "no matching '}'"),
            ("outbox.}", "no matching '{'"),
            ("outbox.{}", "placeholder {} is neither"),
            ("outbox.{a b}", "placeholder {a b} is neither"),
            ("out box", "' '"),
            ("", "empty"),
            ("..", "reserved"),
        ] {
            let e = TopicTemplate::parse(tpl).unwrap_err();
            assert!(e.to_string().contains(needle), "{tpl}: {e}");
            assert_eq!(e.class(), crate::ErrorClass::Permanent);
        }
        let long = format!("{}{{id}}", "a".repeat(250));
        assert!(TopicTemplate::parse(&long).is_err());
    }
}
