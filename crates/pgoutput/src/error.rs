//! Decode errors. All are permanent: the same bytes will never decode differently.

/// Why a frame or message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated {what}: needed {needed} more bytes, {available} available")]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("unknown {what} tag {tag:#04x} ({})", char::from(*tag))]
    UnknownTag { what: &'static str, tag: u8 },
    #[error("{count} trailing bytes after {what}")]
    TrailingBytes { what: &'static str, count: usize },
    #[error("invalid length {length} in {what}")]
    InvalidLength { what: &'static str, length: i64 },
    #[error("string in {what} is not NUL-terminated")]
    UnterminatedString { what: &'static str },
    #[error("string in {what} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str },
    #[error("invalid value {value} for {what}")]
    InvalidValue { what: &'static str, value: i64 },
}
