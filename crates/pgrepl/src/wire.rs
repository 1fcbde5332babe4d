//! Backend message framing (sans-IO): `Byte1 tag, Int32 length (self-inclusive), body`.
//!
//! Framed here rather than with `postgres_protocol::message::backend::Message::parse`
//! because that parser rejects CopyBothResponse (`W`), and because splitting the read
//! buffer ourselves hands CopyData payloads on as `Bytes` without a copy.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{ReplError, ServerError};

/// PostgreSQL refuses messages over 1 GiB; anything larger is a corrupt stream.
pub(crate) const MAX_MESSAGE_LEN: usize = 1 << 30;

/// One backend message, bodies kept as shared `Bytes`.
#[derive(Debug)]
pub(crate) enum Backend {
    Auth(AuthRequest),
    ParameterStatus { name: String, value: String },
    KeyData,
    ReadyForQuery,
    Error(ServerError),
    Notice(ServerError),
    RowDescription(Vec<String>),
    DataRow(Vec<Option<Bytes>>),
    CommandComplete,
    EmptyQueryResponse,
    CopyBothResponse,
    CopyOutResponse,
    CopyData,
    CopyDone,
    Other(u8),
}

#[derive(Debug)]
pub(crate) enum AuthRequest {
    Ok,
    Cleartext,
    Md5 { salt: [u8; 4] },
    Sasl { mechanisms: Vec<String> },
    SaslContinue(Bytes),
    SaslFinal(Bytes),
    Other(i32),
}

impl Backend {
    /// A short description for protocol-violation errors (bodies may hold row data).
    pub(crate) fn describe(&self) -> String {
        match self {
            Backend::Auth(_) => "Authentication".into(),
            Backend::ParameterStatus { name, .. } => format!("ParameterStatus {name}"),
            Backend::KeyData => "BackendKeyData".into(),
            Backend::ReadyForQuery => "ReadyForQuery".into(),
            Backend::Error(e) => format!("ErrorResponse {e}"),
            Backend::Notice(_) => "NoticeResponse".into(),
            Backend::RowDescription(_) => "RowDescription".into(),
            Backend::DataRow(_) => "DataRow".into(),
            Backend::CommandComplete => "CommandComplete".into(),
            Backend::EmptyQueryResponse => "EmptyQueryResponse".into(),
            Backend::CopyBothResponse => "CopyBothResponse".into(),
            Backend::CopyOutResponse => "CopyOutResponse".into(),
            Backend::CopyData => "CopyData".into(),
            Backend::CopyDone => "CopyDone".into(),
            Backend::Other(tag) => format!("message with tag {:?}", char::from(*tag)),
        }
    }
}

/// What [`split_stream_message`] split off.
#[derive(Debug)]
pub(crate) enum Split {
    /// A whole message: its tag and body.
    Whole(u8, Bytes),
    /// The first bytes of a CopyData body of `len` bytes, over the frame limit; the rest
    /// is still to be read (and discarded) after them.
    Head { head: Bytes, len: usize },
}

/// The tag and body length of the message at the front of `buf`, once its header is in.
fn header(buf: &BytesMut) -> Result<Option<(u8, usize)>, ReplError> {
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    let tag = header[0];
    let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (4..=MAX_MESSAGE_LEN).contains(l))
        .ok_or_else(|| {
            ReplError::Protocol(format!(
                "invalid length {len} for message {:?}",
                char::from(tag)
            ))
        })?;
    Ok(Some((tag, len - 4)))
}

/// Like [`split_message`], but a CopyData body longer than `frame_limit` is not waited
/// for whole: only its first `head_len` bytes are split off, as [`Split::Head`]. The
/// caller then reads through the rest without keeping it, so one huge message costs
/// `head_len` bytes of memory, not its size.
pub(crate) fn split_stream_message(
    buf: &mut BytesMut,
    frame_limit: usize,
    head_len: usize,
) -> Result<Option<Split>, ReplError> {
    let Some((tag, len)) = header(buf)? else {
        return Ok(None);
    };
    if tag != b'd' || len <= frame_limit || len <= head_len {
        return Ok(split_message(buf)?.map(|(tag, body)| Split::Whole(tag, body)));
    }
    let total = 5 + head_len;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut head = buf.split_to(total).freeze();
    head.advance(5);
    Ok(Some(Split::Head { head, len }))
}

/// Splits one complete message off the front of `buf`, or `Ok(None)` if more bytes are needed.
pub(crate) fn split_message(buf: &mut BytesMut) -> Result<Option<(u8, Bytes)>, ReplError> {
    let Some((tag, body_len)) = header(buf)? else {
        return Ok(None);
    };
    let total = body_len + 5;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(total).freeze();
    frame.advance(5);
    Ok(Some((tag, frame)))
}

/// Decodes a framed message body.
pub(crate) fn decode(tag: u8, body: Bytes) -> Result<Backend, ReplError> {
    let mut r = Reader { buf: body, tag };
    let msg = match tag {
        b'R' => Backend::Auth(r.auth()?),
        b'S' => Backend::ParameterStatus {
            name: r.cstr()?,
            value: r.cstr()?,
        },
        b'K' => Backend::KeyData,
        b'Z' => Backend::ReadyForQuery,
        b'E' => Backend::Error(r.error_fields()?),
        b'N' => Backend::Notice(r.error_fields()?),
        b'T' => Backend::RowDescription(r.row_description()?),
        b'D' => Backend::DataRow(r.data_row()?),
        b'C' => Backend::CommandComplete,
        b'I' => Backend::EmptyQueryResponse,
        b'W' => Backend::CopyBothResponse,
        b'H' => Backend::CopyOutResponse,
        b'd' => Backend::CopyData,
        b'c' => Backend::CopyDone,
        other => Backend::Other(other),
    };
    Ok(msg)
}

struct Reader {
    buf: Bytes,
    tag: u8,
}

impl Reader {
    fn err(&self, what: &str) -> ReplError {
        ReplError::Protocol(format!(
            "malformed {what} in message {:?}",
            char::from(self.tag)
        ))
    }

    fn i16(&mut self) -> Result<i16, ReplError> {
        if self.buf.len() < 2 {
            return Err(self.err("Int16"));
        }
        Ok(self.buf.get_i16())
    }

    fn i32(&mut self) -> Result<i32, ReplError> {
        if self.buf.len() < 4 {
            return Err(self.err("Int32"));
        }
        Ok(self.buf.get_i32())
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, ReplError> {
        if self.buf.len() < n {
            return Err(self.err("byte string"));
        }
        Ok(self.buf.split_to(n))
    }

    fn cstr(&mut self) -> Result<String, ReplError> {
        let nul = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.err("string"))?;
        let s = self.buf.split_to(nul);
        self.buf.advance(1);
        // Server text is UTF-8 for our connections (client_encoding); stay lossy, never fail on it.
        Ok(String::from_utf8_lossy(&s).into_owned())
    }

    fn auth(&mut self) -> Result<AuthRequest, ReplError> {
        Ok(match self.i32()? {
            0 => AuthRequest::Ok,
            3 => AuthRequest::Cleartext,
            5 => {
                let salt = self.bytes(4)?;
                AuthRequest::Md5 {
                    salt: [salt[0], salt[1], salt[2], salt[3]],
                }
            }
            10 => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = self.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m);
                }
                AuthRequest::Sasl { mechanisms }
            }
            11 => AuthRequest::SaslContinue(std::mem::take(&mut self.buf)),
            12 => AuthRequest::SaslFinal(std::mem::take(&mut self.buf)),
            other => AuthRequest::Other(other),
        })
    }

    fn error_fields(&mut self) -> Result<ServerError, ReplError> {
        let mut e = ServerError::default();
        let mut localized_severity = String::new();
        loop {
            let Some(&kind) = self.buf.first() else {
                return Err(self.err("error field list"));
            };
            self.buf.advance(1);
            if kind == 0 {
                break;
            }
            let value = self.cstr()?;
            match kind {
                b'S' => localized_severity = value,
                b'V' => e.severity = value,
                b'C' => e.code = value,
                b'M' => e.message = value,
                b'D' => e.detail = Some(value),
                b'H' => e.hint = Some(value),
                _ => {}
            }
        }
        if e.severity.is_empty() {
            e.severity = localized_severity;
        }
        Ok(e)
    }

    fn row_description(&mut self) -> Result<Vec<String>, ReplError> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| self.err("field count"))?;
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            names.push(self.cstr()?);
            // table oid, column attnum, type oid, type size, type modifier, format code
            self.bytes(4 + 2 + 4 + 2 + 4 + 2)?;
        }
        Ok(names)
    }

    fn data_row(&mut self) -> Result<Vec<Option<Bytes>>, ReplError> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| self.err("column count"))?;
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.i32()?;
            if len < 0 {
                values.push(None);
            } else {
                let len = usize::try_from(len).map_err(|_| self.err("column length"))?;
                values.push(Some(self.bytes(len)?));
            }
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn splits_partial_and_complete_frames() {
        let bytes = [frame(b'W', &[0, 0, 0]), frame(b'd', b"kpayload")].concat();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&bytes[..3]);
        assert!(split_message(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&bytes[3..10]);
        let (tag, body) = split_message(&mut buf).unwrap().unwrap();
        assert_eq!((tag, &body[..]), (b'W', &[0u8, 0, 0][..]));
        assert!(split_message(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&bytes[10..]);
        let (tag, body) = split_message(&mut buf).unwrap().unwrap();
        assert_eq!((tag, &body[..]), (b'd', &b"kpayload"[..]));
        assert!(buf.is_empty());
    }

    #[test]
    fn splits_only_the_head_of_a_copydata_over_the_limit() {
        let big = [b'w'; 100];
        let bytes = [
            frame(b'd', &big),
            frame(b'd', b"small"),
            frame(b'E', &[b'x'; 50]),
        ]
        .concat();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&bytes[..10]);
        assert!(split_stream_message(&mut buf, 40, 8).unwrap().is_none());
        buf.extend_from_slice(&bytes[10..20]);
        let Some(Split::Head { head, len }) = split_stream_message(&mut buf, 40, 8).unwrap() else {
            panic!("not a head");
        };
        assert_eq!((&head[..], len), (&big[..8], 100));
        // The rest of the body is left for the caller to discard.
        assert_eq!(buf.len(), 20 - 5 - 8);
        let mut buf = BytesMut::from(&bytes[105..]);
        let Some(Split::Whole(b'd', body)) = split_stream_message(&mut buf, 40, 8).unwrap() else {
            panic!("not whole");
        };
        assert_eq!(&body[..], b"small");
        // Only CopyData is cut: anything else over the limit is taken whole.
        let Some(Split::Whole(b'E', body)) = split_stream_message(&mut buf, 40, 8).unwrap() else {
            panic!("not whole");
        };
        assert_eq!(body.len(), 50);
    }

    #[test]
    fn rejects_bad_length() {
        let mut buf = BytesMut::from(&[b'd', 0, 0, 0, 2][..]);
        assert!(split_message(&mut buf).is_err());
    }

    #[test]
    fn decodes_error_response() {
        let body = b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"x\"\0\0";
        let Backend::Error(e) = decode(b'E', Bytes::from_static(body)).unwrap() else {
            panic!("not an error");
        };
        assert_eq!(e.code, "28P01");
        assert_eq!(e.severity, "FATAL");
        assert!(e.message.contains("\"x\""));
    }

    #[test]
    fn decodes_sasl_mechanisms_and_data_row() {
        let body = b"\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
        let Backend::Auth(AuthRequest::Sasl { mechanisms }) =
            decode(b'R', Bytes::from_static(body)).unwrap()
        else {
            panic!("not sasl");
        };
        assert_eq!(mechanisms, ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]);
        let row = b"\0\x02\0\0\0\x02ab\xff\xff\xff\xff";
        let Backend::DataRow(values) = decode(b'D', Bytes::from_static(row)).unwrap() else {
            panic!("not a row");
        };
        assert_eq!(values, vec![Some(Bytes::from_static(b"ab")), None]);
    }
}
