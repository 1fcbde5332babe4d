//! A bounds-checked big-endian cursor over a [`Bytes`] buffer.
//!
//! Every read checks the remaining length first, so a short or hostile buffer yields
//! [`DecodeError::Truncated`] instead of a panic, and byte-string reads hand out
//! reference-counted slices of the input rather than copies.

use bytes::{Buf, Bytes};

use crate::{DecodeError, Lsn, PgTimestamp};

#[derive(Clone)]
pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn need(&self, needed: usize, what: &'static str) -> Result<(), DecodeError> {
        if self.buf.len() < needed {
            return Err(DecodeError::Truncated {
                what,
                needed,
                available: self.buf.len(),
            });
        }
        Ok(())
    }

    pub(crate) fn get_u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        self.need(1, what)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn get_i16(&mut self, what: &'static str) -> Result<i16, DecodeError> {
        self.need(2, what)?;
        Ok(self.buf.get_i16())
    }

    pub(crate) fn get_i32(&mut self, what: &'static str) -> Result<i32, DecodeError> {
        self.need(4, what)?;
        Ok(self.buf.get_i32())
    }

    pub(crate) fn get_u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.need(4, what)?;
        Ok(self.buf.get_u32())
    }

    pub(crate) fn get_i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.need(8, what)?;
        Ok(self.buf.get_i64())
    }

    pub(crate) fn get_u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.need(8, what)?;
        Ok(self.buf.get_u64())
    }

    pub(crate) fn get_lsn(&mut self, what: &'static str) -> Result<Lsn, DecodeError> {
        self.get_u64(what).map(Lsn)
    }

    pub(crate) fn get_timestamp(&mut self, what: &'static str) -> Result<PgTimestamp, DecodeError> {
        self.get_i64(what).map(PgTimestamp)
    }

    /// A byte that PostgreSQL only ever writes as 0 or 1.
    pub(crate) fn get_bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.get_u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidValue {
                what,
                value: i64::from(other),
            }),
        }
    }

    /// An Int16 element count; PostgreSQL never sends a negative one, so a negative
    /// value means the buffer is not what we think it is.
    pub(crate) fn get_count_i16(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let raw = self.get_i16(what)?;
        usize::try_from(raw).map_err(|_| DecodeError::InvalidLength {
            what,
            length: i64::from(raw),
        })
    }

    /// An Int32 count or byte length; negative values are rejected.
    pub(crate) fn get_count_i32(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let raw = self.get_i32(what)?;
        usize::try_from(raw).map_err(|_| DecodeError::InvalidLength {
            what,
            length: i64::from(raw),
        })
    }

    /// A NUL-terminated UTF-8 string (PostgreSQL's `pq_sendstring` in a UTF-8 database;
    /// the walsender always converts to the client encoding, which replication forces
    /// to the database encoding, so non-UTF-8 input is a misconfiguration worth failing on).
    pub(crate) fn get_cstr(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let nul = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::UnterminatedString { what })?;
        let text = self.buf.split_to(nul);
        self.buf.advance(1);
        match std::str::from_utf8(&text) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(DecodeError::InvalidUtf8 { what }),
        }
    }

    /// `len` bytes as a slice sharing the input's allocation.
    pub(crate) fn get_bytes(
        &mut self,
        len: usize,
        what: &'static str,
    ) -> Result<Bytes, DecodeError> {
        self.need(len, what)?;
        Ok(self.buf.split_to(len))
    }

    /// Everything that is left, as a shared slice.
    pub(crate) fn take_rest(&mut self) -> Bytes {
        self.buf.split_off(0)
    }

    /// Capacity to reserve for `count` elements that each take at least `min_encoded`
    /// bytes: a corrupt count cannot make us reserve more than the input could describe.
    pub(crate) fn capacity_for(&self, count: usize, min_encoded: usize) -> usize {
        count.min(self.buf.len() / min_encoded.max(1))
    }

    /// Fails if anything is left after a complete message.
    pub(crate) fn finish(self, what: &'static str) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                what,
                count: self.buf.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_big_endian_and_reports_truncation() {
        let mut r = Reader::new(Bytes::from_static(&[0, 1, 0, 0, 0, 2, 9]));
        assert_eq!(r.get_i16("a").unwrap(), 1);
        assert_eq!(r.get_u32("b").unwrap(), 2);
        assert_eq!(
            r.get_u64("c"),
            Err(DecodeError::Truncated {
                what: "c",
                needed: 8,
                available: 1
            })
        );
        assert_eq!(r.get_u8("d").unwrap(), 9);
        assert!(r.finish("e").is_ok());
    }

    #[test]
    fn cstr_requires_terminator_and_utf8() {
        let mut r = Reader::new(Bytes::from_static(b"ab\0cd"));
        assert_eq!(r.get_cstr("s").unwrap(), "ab");
        assert_eq!(
            r.get_cstr("s"),
            Err(DecodeError::UnterminatedString { what: "s" })
        );
        let mut r = Reader::new(Bytes::from_static(b"\xff\0"));
        assert_eq!(r.get_cstr("s"), Err(DecodeError::InvalidUtf8 { what: "s" }));
    }

    #[test]
    fn negative_counts_are_invalid_lengths() {
        let mut r = Reader::new(Bytes::from_static(&[0xff, 0xff, 0xff, 0xfe]));
        assert_eq!(
            r.get_count_i32("len"),
            Err(DecodeError::InvalidLength {
                what: "len",
                length: -2
            })
        );
    }

    #[test]
    fn capacity_is_bounded_by_remaining_bytes() {
        let r = Reader::new(Bytes::from_static(&[0; 10]));
        assert_eq!(r.capacity_for(30_000, 10), 1);
        assert_eq!(r.capacity_for(3, 1), 3);
        assert_eq!(r.capacity_for(3, 0), 3);
    }

    #[test]
    fn trailing_bytes_are_reported() {
        let r = Reader::new(Bytes::from_static(&[1, 2]));
        assert_eq!(
            r.finish("m"),
            Err(DecodeError::TrailingBytes {
                what: "m",
                count: 2
            })
        );
    }
}
