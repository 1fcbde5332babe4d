//! Reading column values out of pgoutput tuples, in text or binary format.
//!
//! Text format (the default) is the type's output function: for json/jsonb/text it is the
//! stored document itself, for bytea it is `\x` hex (or the legacy escape format when
//! `bytea_output = escape`). Binary format (the `binary` option, PG14+) is the type's send
//! function: raw bytes for bytea, a version byte (1) then the text for jsonb, the
//! characters for text types, big-endian integers, 16 raw bytes for uuid.

use std::fmt::Write as _;

use bytes::Bytes;
use pgoutput::TupleValue;

use crate::pgtype;

/// How the payload column's values become the Kafka value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadKind {
    /// Sent as the JSON text PostgreSQL prints (jsonb normalises whitespace and key order).
    Jsonb,
    /// Sent exactly as inserted.
    Json,
    /// `text` or `varchar`, sent as is.
    Text,
    /// Sent as the raw bytes.
    Bytea,
}

impl PayloadKind {
    pub fn from_oid(oid: u32) -> Option<Self> {
        match oid {
            pgtype::JSONB => Some(PayloadKind::Jsonb),
            pgtype::JSON => Some(PayloadKind::Json),
            pgtype::TEXT | pgtype::VARCHAR => Some(PayloadKind::Text),
            pgtype::BYTEA => Some(PayloadKind::Bytea),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PayloadKind::Jsonb => "jsonb",
            PayloadKind::Json => "json",
            PayloadKind::Text => "text",
            PayloadKind::Bytea => "bytea",
        }
    }

    /// The media type of a payload of this kind (CloudEvents' `datacontenttype`); none
    /// for bytea, whose bytes outboxd knows nothing about.
    pub fn content_type(self) -> Option<&'static str> {
        match self {
            PayloadKind::Jsonb | PayloadKind::Json => Some("application/json"),
            PayloadKind::Text => Some("text/plain; charset=utf-8"),
            PayloadKind::Bytea => None,
        }
    }
}

/// Why a value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValueProblem {
    /// `u`: the value was not sent.
    UnchangedToast,
    /// Present but undecodable; the text says why and what to do.
    Unreadable(String),
}

/// The text form of a column for use as an id, key, type or topic part. `None` = NULL.
/// UTF-8 is checked by the caller.
pub(crate) fn text_of(value: &TupleValue, oid: u32) -> Result<Option<Bytes>, ValueProblem> {
    match value {
        TupleValue::Null => Ok(None),
        TupleValue::UnchangedToast => Err(ValueProblem::UnchangedToast),
        TupleValue::Text(b) => Ok(Some(b.clone())),
        TupleValue::Binary(b) => binary_as_text(b, oid).map(Some),
    }
}

/// Whether [`text_of`] (and [`display_text`]) decode the binary form of `oid` to the
/// bytes its text form has, given the output settings [`crate::binary`] checks.
pub(crate) fn binary_reads_as_text(oid: u32) -> bool {
    pgtype::is_textual(oid)
        || matches!(
            oid,
            pgtype::JSON
                | pgtype::JSONB
                | pgtype::BYTEA
                | pgtype::BOOL
                | pgtype::INT2
                | pgtype::INT4
                | pgtype::INT8
                | pgtype::UUID
                | pgtype::TIMESTAMPTZ
        )
}

fn binary_as_text(b: &Bytes, oid: u32) -> Result<Bytes, ValueProblem> {
    let wrong_len = || {
        ValueProblem::Unreadable(format!(
            "a binary {} value of {} bytes is malformed",
            pgtype::type_name(oid),
            b.len()
        ))
    };
    let text = match oid {
        o if pgtype::is_textual(o) || o == pgtype::JSON => return Ok(b.clone()),
        pgtype::JSONB => return strip_jsonb_version(b),
        // bytea_out in its default hex form; [`crate::binary`] keeps binary off when the
        // walsender prints bytea in the escape form.
        pgtype::BYTEA => bytea_hex(b),
        pgtype::BOOL => match &b[..] {
            [0] => "f".to_owned(),
            [1] => "t".to_owned(),
            _ => return Err(wrong_len()),
        },
        // timestamptz_out in the ISO style at UTC; [`crate::binary`] keeps binary off
        // under any other DateStyle or TimeZone.
        pgtype::TIMESTAMPTZ => <[u8; 8]>::try_from(&b[..])
            .map(|a| timestamptz_iso_utc(i64::from_be_bytes(a)))
            .map_err(|_| wrong_len())?,
        pgtype::INT2 => <[u8; 2]>::try_from(&b[..])
            .map(|a| i16::from_be_bytes(a).to_string())
            .map_err(|_| wrong_len())?,
        pgtype::INT4 => <[u8; 4]>::try_from(&b[..])
            .map(|a| i32::from_be_bytes(a).to_string())
            .map_err(|_| wrong_len())?,
        pgtype::INT8 => <[u8; 8]>::try_from(&b[..])
            .map(|a| i64::from_be_bytes(a).to_string())
            .map_err(|_| wrong_len())?,
        pgtype::UUID => <[u8; 16]>::try_from(&b[..])
            .map(|a| format_uuid(&a))
            .map_err(|_| wrong_len())?,
        other => {
            return Err(ValueProblem::Unreadable(format!(
                "binary format of type {} is not supported; set \
                 OUTBOXD_PGOUTPUT_BINARY=auto or off, or use a text, uuid or integer column",
                pgtype::type_name(other)
            )))
        }
    };
    Ok(Bytes::from(text))
}

/// Microseconds since 2000-01-01 00:00 UTC (timestamptz_send) as timestamptz_out prints
/// them with `DateStyle = ISO` and a UTC `TimeZone`: `2026-12-02 07:06:27.5+00`, the
/// fraction without trailing zeros, years before 1 as `... BC`, and the two infinities.
pub(crate) fn timestamptz_iso_utc(pg_micros: i64) -> String {
    // DT_NOBEGIN and DT_NOEND.
    match pg_micros {
        i64::MIN => return "-infinity".to_owned(),
        i64::MAX => return "infinity".to_owned(),
        _ => {}
    }
    const PG_EPOCH_DAYS: i64 = 10_957; // 2000-01-01 in days since 1970-01-01.
    let days = pg_micros.div_euclid(86_400_000_000);
    let of_day = pg_micros.rem_euclid(86_400_000_000);
    let (year, month, day) = crate::record::civil_from_days(days.saturating_add(PG_EPOCH_DAYS));
    let secs = of_day / 1_000_000;
    let fraction = of_day % 1_000_000;
    let mut s = String::with_capacity(32);
    // Astronomical year 0 is 1 BC.
    let shown_year = if year > 0 { year } else { 1 - year };
    let _ = write!(
        s,
        "{shown_year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    );
    if fraction != 0 {
        let digits = format!("{fraction:06}");
        s.push('.');
        s.push_str(digits.trim_end_matches('0'));
    }
    s.push_str("+00");
    if year <= 0 {
        s.push_str(" BC");
    }
    s
}

fn format_uuid(b: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        push_hex(&mut s, *byte);
    }
    s
}

/// Two lower-case hex digits, by table: in binary mode every row's uuid id is printed
/// here, and a formatting call per byte costs more than the lookup.
fn push_hex(s: &mut String, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    s.push(char::from(DIGITS[usize::from(byte >> 4)]));
    s.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
}

/// The payload bytes as stored. `None` = NULL.
pub(crate) fn payload_of(
    value: &TupleValue,
    kind: PayloadKind,
) -> Result<Option<Bytes>, ValueProblem> {
    match (value, kind) {
        (TupleValue::Null, _) => Ok(None),
        (TupleValue::UnchangedToast, _) => Err(ValueProblem::UnchangedToast),
        (TupleValue::Text(b), PayloadKind::Bytea) => decode_bytea_text(b)
            .map(|v| Some(Bytes::from(v)))
            .map_err(ValueProblem::Unreadable),
        (TupleValue::Binary(b), PayloadKind::Jsonb) => strip_jsonb_version(b).map(Some),
        (TupleValue::Text(b) | TupleValue::Binary(b), _) => Ok(Some(b.clone())),
    }
}

/// The JSON text of a json or jsonb column. `None` = NULL.
pub(crate) fn json_of(value: &TupleValue, oid: u32) -> Result<Option<Bytes>, ValueProblem> {
    let kind = if oid == pgtype::JSONB {
        PayloadKind::Jsonb
    } else {
        PayloadKind::Json
    };
    payload_of(value, kind)
}

fn strip_jsonb_version(b: &Bytes) -> Result<Bytes, ValueProblem> {
    match b.first() {
        Some(1) => Ok(b.slice(1..)),
        Some(v) => Err(ValueProblem::Unreadable(format!(
            "binary jsonb version {v} is not supported (expected 1)"
        ))),
        None => Err(ValueProblem::Unreadable(
            "binary jsonb value is empty (expected a version byte)".to_owned(),
        )),
    }
}

/// Decode bytea text output: `\x` hex, or the legacy escape format.
pub(crate) fn decode_bytea_text(text: &[u8]) -> Result<Vec<u8>, String> {
    match text.strip_prefix(b"\\x") {
        Some(hex) => decode_hex(hex),
        None => decode_bytea_escape(text),
    }
}

fn decode_hex(hex: &[u8]) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!(
            "bytea hex text has an odd number of digits ({})",
            hex.len()
        ));
    }
    hex.chunks_exact(2)
        .map(|pair| match (hex_digit(pair[0]), hex_digit(pair[1])) {
            (Some(hi), Some(lo)) => Ok((hi << 4) | lo),
            _ => Err(format!(
                "bytea hex text contains {:?}, which is not a hex digit pair",
                String::from_utf8_lossy(pair)
            )),
        })
        .collect()
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn decode_bytea_escape(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while let Some(&c) = text.get(i) {
        if c != b'\\' {
            out.push(c);
            i += 1;
            continue;
        }
        match text.get(i + 1..i + 4) {
            _ if text.get(i + 1) == Some(&b'\\') => {
                out.push(b'\\');
                i += 2;
            }
            Some(&[a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7']) => {
                out.push(((a - b'0') << 6) | ((b - b'0') << 3) | (c - b'0'));
                i += 4;
            }
            _ => {
                return Err(format!(
                    "bytea text has a backslash at byte {i} that is neither \\\\ nor an \
                     octal escape, and no \\x prefix"
                ))
            }
        }
    }
    Ok(out)
}

/// Hex text of raw bytes, PostgreSQL-style (`\x0102`).
pub(crate) fn bytea_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for byte in b {
        push_hex(&mut s, *byte);
    }
    s
}

/// A best-effort text rendering of any value for dead-letter records. `None` = NULL or
/// not sent. Binary values of types without a text rendering are shown as `\x` hex.
pub(crate) fn display_text(value: &TupleValue, oid: u32) -> Option<String> {
    let bytes = match value {
        TupleValue::Null | TupleValue::UnchangedToast => return None,
        TupleValue::Text(b) => b.clone(),
        TupleValue::Binary(b) if oid == pgtype::JSONB => {
            strip_jsonb_version(b).unwrap_or_else(|_| b.clone())
        }
        TupleValue::Binary(b) => match binary_as_text(b, oid) {
            Ok(t) => t,
            Err(_) => return Some(bytea_hex(b)),
        },
    };
    Some(match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => bytea_hex(&bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn b(s: &[u8]) -> TupleValue {
        TupleValue::Binary(Bytes::copy_from_slice(s))
    }

    #[test]
    fn bytea_hex_and_escape() {
        assert_eq!(decode_bytea_text(b"\\x").unwrap(), b"");
        assert_eq!(
            decode_bytea_text(b"\\x00fFa0").unwrap(),
            vec![0, 0xff, 0xa0]
        );
        assert!(decode_bytea_text(b"\\x0").unwrap_err().contains("odd"));
        assert!(decode_bytea_text(b"\\xzz").unwrap_err().contains("zz"));
        assert_eq!(
            decode_bytea_text(b"ab\\\\c\\000\\377").unwrap(),
            b"ab\\c\x00\xff".to_vec()
        );
        assert!(decode_bytea_text(b"a\\9").is_err());
        assert!(decode_bytea_text(b"a\\").is_err());
        assert_eq!(bytea_hex(&[0, 0xab]), "\\x00ab");
        for v in [vec![], vec![0u8, 1, 254, 255, b'\\']] {
            assert_eq!(decode_bytea_text(bytea_hex(&v).as_bytes()).unwrap(), v);
        }
    }

    #[test]
    fn payload_forms() {
        let j = Bytes::from_static(br#"{"b": 1, "a": 2}"#);
        let v = payload_of(&TupleValue::Text(j.clone()), PayloadKind::Jsonb)
            .unwrap()
            .unwrap();
        assert_eq!(v, j);
        assert_eq!(v.as_ptr(), j.as_ptr(), "text payloads are not copied");
        let mut bin = vec![1u8];
        bin.extend_from_slice(&j);
        assert_eq!(
            payload_of(&b(&bin), PayloadKind::Jsonb).unwrap(),
            Some(j.clone())
        );
        assert!(matches!(
            payload_of(&b(&[2, b'{', b'}']), PayloadKind::Jsonb),
            Err(ValueProblem::Unreadable(m)) if m.contains("version 2")
        ));
        assert!(payload_of(&b(&[]), PayloadKind::Jsonb).is_err());
        assert_eq!(
            payload_of(&t("\\x6869"), PayloadKind::Bytea).unwrap(),
            Some(Bytes::from_static(b"hi"))
        );
        assert_eq!(
            payload_of(&b(b"\\x6869"), PayloadKind::Bytea).unwrap(),
            Some(Bytes::from_static(b"\\x6869"))
        );
        assert_eq!(
            payload_of(&t("plain"), PayloadKind::Text).unwrap(),
            Some(Bytes::from_static(b"plain"))
        );
        assert_eq!(payload_of(&TupleValue::Null, PayloadKind::Json), Ok(None));
        assert_eq!(
            payload_of(&TupleValue::UnchangedToast, PayloadKind::Json),
            Err(ValueProblem::UnchangedToast)
        );
        assert_eq!(
            json_of(&b(b"\x01{}"), pgtype::JSONB).unwrap(),
            Some(Bytes::from_static(b"{}"))
        );
        assert_eq!(
            json_of(&b(b"{}"), pgtype::JSON).unwrap(),
            Some(Bytes::from_static(b"{}"))
        );
    }

    #[test]
    fn text_forms() {
        assert_eq!(
            text_of(&t("abc"), pgtype::TEXT).unwrap(),
            Some(Bytes::from_static(b"abc"))
        );
        assert_eq!(text_of(&TupleValue::Null, pgtype::TEXT), Ok(None));
        assert_eq!(
            text_of(&b(b"abc"), pgtype::VARCHAR).unwrap(),
            Some(Bytes::from_static(b"abc"))
        );
        assert_eq!(
            text_of(&b(&(-5i16).to_be_bytes()), pgtype::INT2).unwrap(),
            Some(Bytes::from_static(b"-5"))
        );
        assert_eq!(
            text_of(&b(&70000i32.to_be_bytes()), pgtype::INT4).unwrap(),
            Some(Bytes::from_static(b"70000"))
        );
        assert_eq!(
            text_of(&b(&(1i64 << 40).to_be_bytes()), pgtype::INT8).unwrap(),
            Some(Bytes::from_static(b"1099511627776"))
        );
        let uuid: [u8; 16] = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            text_of(&b(&uuid), pgtype::UUID).unwrap(),
            Some(Bytes::from_static(b"12345678-9abc-def0-0123-456789abcdef"))
        );
        assert!(matches!(
            text_of(&b(&[1, 2, 3]), pgtype::INT4),
            Err(ValueProblem::Unreadable(m)) if m.contains("malformed")
        ));
        assert!(matches!(
            text_of(&b(&[1]), pgtype::NUMERIC),
            Err(ValueProblem::Unreadable(m)) if m.contains("binary")
        ));
        assert_eq!(
            text_of(&TupleValue::UnchangedToast, pgtype::TEXT),
            Err(ValueProblem::UnchangedToast)
        );
    }

    /// timestamptz_send's bytes and timestamptz_out's text at TimeZone UTC, DateStyle
    /// ISO, as PostgreSQL 15 printed them (`SELECT encode(timestamptz_send(t), 'hex'),
    /// t::text`).
    const TIMESTAMPTZ_GOLDEN: &[(&str, &str)] = &[
        ("0000000000000000", "2000-01-01 00:00:00+00"),
        ("ffffffffffffffff", "1999-12-31 23:59:59.999999+00"),
        ("0003049b3b1054e0", "2026-12-02 01:21:27.5+00"),
        ("fffca2fec4c82001", "1970-01-01 00:00:00.000001+00"),
        ("ff1fe2ffc59c6000", "0001-01-01 00:00:00+00"),
        ("ff1fe2ffc59c38f0", "0001-12-31 23:59:59.99+00 BC"),
        ("fd0f7fbdaf17e000", "4713-01-01 00:00:00+00 BC"),
        ("fd0f7cc1411fa000", "4714-11-24 00:00:00+00 BC"),
        ("7fffff5bb3b29fff", "294276-12-31 23:59:59.999999+00"),
        ("0487db00297bea40", "12345-06-07 08:09:10.12+00"),
        ("fff4ce8ab9b61a64", "1900-02-28 16:04:56.0001+00"),
        ("0002b58b26404890", "2024-02-29 22:00:00.25+00"),
        ("7fffffffffffffff", "infinity"),
        ("8000000000000000", "-infinity"),
    ];

    #[test]
    fn timestamptz_as_postgresql_prints_it() {
        for (hex, text) in TIMESTAMPTZ_GOLDEN {
            let bytes = decode_hex(hex.as_bytes()).unwrap();
            assert_eq!(
                text_of(&b(&bytes), pgtype::TIMESTAMPTZ).unwrap(),
                Some(Bytes::copy_from_slice(text.as_bytes())),
                "{hex}"
            );
        }
        assert!(text_of(&b(&[0; 7]), pgtype::TIMESTAMPTZ).is_err());
    }

    #[test]
    fn other_binary_forms_read_as_text() {
        assert_eq!(
            text_of(&b(&[1]), pgtype::BOOL).unwrap(),
            Some(Bytes::from_static(b"t"))
        );
        assert_eq!(
            text_of(&b(&[0]), pgtype::BOOL).unwrap(),
            Some(Bytes::from_static(b"f"))
        );
        assert!(text_of(&b(&[2]), pgtype::BOOL).is_err());
        assert_eq!(
            text_of(&b(&[0, 0xab]), pgtype::BYTEA).unwrap(),
            Some(Bytes::from_static(b"\\x00ab"))
        );
        assert_eq!(
            text_of(&b(b"\x01{\"a\": 1}"), pgtype::JSONB).unwrap(),
            Some(Bytes::from_static(br#"{"a": 1}"#))
        );
        assert_eq!(
            text_of(&b(b"{ \"a\":1 }"), pgtype::JSON).unwrap(),
            Some(Bytes::from_static(br#"{ "a":1 }"#))
        );
        for oid in [pgtype::NUMERIC, pgtype::DATE, pgtype::TIMESTAMP, 1009] {
            assert!(!binary_reads_as_text(oid), "{oid}");
            assert!(text_of(&b(&[0; 8]), oid).is_err(), "{oid}");
        }
    }

    proptest::proptest! {
        /// Each decoder against the type's text form, written here independently.
        #[test]
        fn binary_decoders_match_the_text_forms(
            i2: i16, i4: i32, i8: i64, flag: bool,
            uuid: [u8; 16],
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            text in "\\PC{0,40}",
        ) {
            let as_text = |v: &[u8], oid| text_of(&b(v), oid).unwrap().unwrap();
            proptest::prop_assert_eq!(as_text(&i2.to_be_bytes(), pgtype::INT2), i2.to_string());
            proptest::prop_assert_eq!(as_text(&i4.to_be_bytes(), pgtype::INT4), i4.to_string());
            proptest::prop_assert_eq!(as_text(&i8.to_be_bytes(), pgtype::INT8), i8.to_string());
            proptest::prop_assert_eq!(as_text(&[u8::from(flag)], pgtype::BOOL), if flag { &b"t"[..] } else { &b"f"[..] });
            let hex: String = uuid.iter().map(|x| format!("{x:02x}")).collect();
            let dashed = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
            proptest::prop_assert_eq!(as_text(&uuid, pgtype::UUID), dashed.as_bytes());
            let mut bytea = String::from("\\x");
            bytea.extend(raw.iter().map(|x| format!("{x:02x}")));
            proptest::prop_assert_eq!(as_text(&raw, pgtype::BYTEA), bytea.as_bytes());
            proptest::prop_assert_eq!(decode_bytea_text(bytea.as_bytes()).unwrap(), raw.clone());
            for oid in [pgtype::TEXT, pgtype::VARCHAR, pgtype::JSON] {
                proptest::prop_assert_eq!(as_text(text.as_bytes(), oid), text.as_bytes());
            }
            let mut jsonb = vec![1u8];
            jsonb.extend_from_slice(text.as_bytes());
            proptest::prop_assert_eq!(as_text(&jsonb, pgtype::JSONB), text.as_bytes());
            proptest::prop_assert_eq!(display_text(&b(&jsonb), pgtype::JSONB), Some(text.clone()));
            proptest::prop_assert_eq!(display_text(&b(&raw), pgtype::BYTEA), Some(bytea.clone()));
        }

        /// timestamptz: the text parses back to the same instant, over PostgreSQL's range.
        #[test]
        fn timestamptz_text_reads_back(
            micros in -211_813_488_000_000_000i64..9_223_371_331_200_000_000i64,
        ) {
            let text = timestamptz_iso_utc(micros);
            proptest::prop_assert_eq!(parse_iso_utc(&text), Some(micros), "{}", text);
        }
    }

    /// Reads `timestamptz_iso_utc`'s output back (a test-only inverse, by a different
    /// route: days counted from the year, not the year from days).
    fn parse_iso_utc(text: &str) -> Option<i64> {
        let (body, bc) = match text.strip_suffix(" BC") {
            Some(b) => (b, true),
            None => (text, false),
        };
        let body = body.strip_suffix("+00")?;
        let (date, time) = body.split_once(' ')?;
        let mut d = date.rsplitn(3, '-');
        let (day, month, year): (i64, i64, i64) = (
            d.next()?.parse().ok()?,
            d.next()?.parse().ok()?,
            d.next()?.parse().ok()?,
        );
        let year = if bc { 1 - year } else { year };
        let (hms, fraction) = time.split_once('.').unwrap_or((time, ""));
        if fraction.ends_with('0') || fraction.len() > 6 {
            return None;
        }
        let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
        let (h, mi, s) = (t.next()??, t.next()??, t.next()??);
        let micros: i64 = format!("{fraction:0<6}").parse().ok()?;
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days_in = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        let mut days = 0i64; // since 2000-01-01
        if year >= 2000 {
            days += (2000..year).map(|y| 365 + i64::from(leap(y))).sum::<i64>();
        } else {
            days -= (year..2000).map(|y| 365 + i64::from(leap(y))).sum::<i64>();
        }
        for m in 1..month {
            let idx = usize::try_from(m - 1).ok()?;
            days += days_in[idx] + i64::from(m == 2 && leap(year));
        }
        days += day - 1;
        Some(((days * 24 + h) * 60 + mi) * 60_000_000 + s * 1_000_000 + micros)
    }

    #[test]
    fn display_forms() {
        assert_eq!(display_text(&t("x"), pgtype::TEXT).as_deref(), Some("x"));
        assert_eq!(display_text(&TupleValue::Null, pgtype::TEXT), None);
        assert_eq!(
            display_text(&TupleValue::UnchangedToast, pgtype::TEXT),
            None
        );
        assert_eq!(
            display_text(&b(&[0xff]), pgtype::BYTEA).as_deref(),
            Some("\\xff")
        );
        assert_eq!(
            display_text(&b(b"\x01{}"), pgtype::JSONB).as_deref(),
            Some("{}")
        );
        assert_eq!(
            display_text(&b(&7i32.to_be_bytes()), pgtype::INT4).as_deref(),
            Some("7")
        );
        assert_eq!(
            display_text(&b(&[9]), pgtype::NUMERIC).as_deref(),
            Some("\\x09")
        );
        assert_eq!(
            display_text(&TupleValue::Text(Bytes::from_static(&[0xc3])), pgtype::TEXT).as_deref(),
            Some("\\xc3")
        );
        assert_eq!(
            PayloadKind::from_oid(pgtype::VARCHAR),
            Some(PayloadKind::Text)
        );
        assert_eq!(PayloadKind::from_oid(pgtype::INT4), None);
        assert_eq!(PayloadKind::Bytea.as_str(), "bytea");
    }
}
