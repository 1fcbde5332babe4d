//! JSON helpers that slice the input instead of re-encoding it.
//!
//! Values are located with [`serde_json::value::RawValue`], which borrows the exact text
//! of a JSON value from the input, and turned into [`Bytes`] with [`Bytes::slice_ref`], so
//! a payload or header value shares the replication buffer. Only JSON strings containing
//! escapes are copied (their decoded text differs from their raw text).

use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::record::HeaderName;

/// What JSON value a raw value holds, by its first character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonType {
    Object,
    Array,
    String,
    Number,
    Bool,
    Null,
}

impl JsonType {
    pub(crate) fn of(raw: &RawValue) -> JsonType {
        match raw.get().as_bytes().first() {
            Some(b'{') => JsonType::Object,
            Some(b'[') => JsonType::Array,
            Some(b'"') => JsonType::String,
            Some(b't' | b'f') => JsonType::Bool,
            Some(b'n') => JsonType::Null,
            _ => JsonType::Number,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JsonType::Object => "an object",
            JsonType::Array => "an array",
            JsonType::String => "a string",
            JsonType::Number => "a number",
            JsonType::Bool => "a boolean",
            JsonType::Null => "null",
        }
    }
}

/// The bytes of a JSON value: a string's decoded text, any other value's JSON text.
/// `raw` must have been borrowed from `src`.
pub(crate) fn value_bytes(src: &Bytes, raw: &RawValue) -> Result<Bytes, serde_json::Error> {
    if JsonType::of(raw) != JsonType::String {
        return Ok(src.slice_ref(raw.get().as_bytes()));
    }
    // Without escapes the decoded text is a sub-slice of the input.
    match serde_json::from_str::<&str>(raw.get()) {
        Ok(s) => Ok(src.slice_ref(s.as_bytes())),
        Err(_) => serde_json::from_str::<String>(raw.get()).map(Bytes::from),
    }
}

/// Why a headers value could not be used.
#[derive(Debug)]
pub(crate) enum HeadersProblem {
    Invalid(serde_json::Error),
    NotObject(JsonType),
}

impl fmt::Display for HeadersProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadersProblem::Invalid(e) => write!(f, "it is not valid JSON ({e})"),
            HeadersProblem::NotObject(t) => write!(f, "it is {}, not a JSON object", t.as_str()),
        }
    }
}

/// Parse `src` as an object of headers, in document order. String values become their
/// text; other values their JSON text (`null` included).
pub(crate) fn headers_object(src: &Bytes) -> Result<Vec<(HeaderName, Bytes)>, HeadersProblem> {
    let raw: &RawValue = serde_json::from_slice(src).map_err(HeadersProblem::Invalid)?;
    match JsonType::of(raw) {
        JsonType::Object => {}
        other => return Err(HeadersProblem::NotObject(other)),
    }
    let entries: RawEntries<'_> =
        serde_json::from_str(raw.get()).map_err(HeadersProblem::Invalid)?;
    entries
        .0
        .into_iter()
        .map(|(name, value)| Ok((HeaderName::Owned(name), value_bytes(src, value)?)))
        .collect::<Result<_, serde_json::Error>>()
        .map_err(HeadersProblem::Invalid)
}

/// The entries of a JSON object, in order, values borrowed raw.
struct RawEntries<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for RawEntries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEntries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(RawEntries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Append `s` to `out` as a JSON string literal.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(s: &str) -> Result<Vec<(String, String)>, HeadersProblem> {
        let src = Bytes::copy_from_slice(s.as_bytes());
        headers_object(&src).map(|v| {
            v.into_iter()
                .map(|(k, v)| (k.into_owned(), String::from_utf8(v.to_vec()).unwrap()))
                .collect()
        })
    }

    #[test]
    fn headers_keep_order_and_raw_values() {
        let h = headers(
            r#"{"z":"last?","traceparent":"00-ab","n":1.50,"o":{"a": [1, 2]},"nul":null,"esc":"a\"b\u00e9"}"#,
        )
        .unwrap();
        assert_eq!(
            h,
            vec![
                ("z".into(), "last?".into()),
                ("traceparent".into(), "00-ab".into()),
                ("n".into(), "1.50".into()),
                ("o".into(), r#"{"a": [1, 2]}"#.into()),
                ("nul".into(), "null".into()),
                ("esc".into(), "a\"bé".into()),
            ]
        );
        assert_eq!(headers(" {} ").unwrap(), vec![]);
    }

    #[test]
    fn headers_errors() {
        assert!(matches!(
            headers("[1]"),
            Err(HeadersProblem::NotObject(JsonType::Array))
        ));
        assert!(matches!(
            headers("\"x\""),
            Err(HeadersProblem::NotObject(JsonType::String))
        ));
        assert!(matches!(headers("{"), Err(HeadersProblem::Invalid(_))));
        let e = headers("3").unwrap_err();
        assert_eq!(e.to_string(), "it is a number, not a JSON object");
    }

    #[test]
    fn value_bytes_are_zero_copy_without_escapes() {
        let src = Bytes::from_static(br#"{"a":"plain","b":{"x":1}}"#);
        let entries: RawEntries<'_> = serde_json::from_slice(&src).unwrap();
        let a = value_bytes(&src, entries.0[0].1).unwrap();
        assert_eq!(&a[..], b"plain");
        assert_eq!(a.as_ptr(), src[6..].as_ptr());
        let b = value_bytes(&src, entries.0[1].1).unwrap();
        assert_eq!(&b[..], br#"{"x":1}"#);
    }

    #[test]
    fn json_string_escaping() {
        let mut s = String::new();
        push_json_string(&mut s, "a\"b\\c\nd\u{1}é");
        assert_eq!(s, r#""a\"b\\c\nd\u0001é""#);
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }
}
