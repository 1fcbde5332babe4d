//! Encoding helpers shared by frames and messages.
//!
//! Encoders cannot fail, so values the wire format cannot carry (a column count above
//! `i16::MAX`, a value longer than `i32::MAX` bytes) panic with a message naming the
//! field: PostgreSQL itself never produces such messages (at most 1664 columns, 1 GB
//! values), so reaching one means the caller built an impossible message.

use bytes::{BufMut, BytesMut};

pub(crate) fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}

pub(crate) fn put_count_i16(buf: &mut BytesMut, count: usize, what: &str) {
    match i16::try_from(count) {
        Ok(n) => buf.put_i16(n),
        Err(_) => panic!("{what}: {count} does not fit the wire format's Int16"),
    }
}

pub(crate) fn put_count_i32(buf: &mut BytesMut, count: usize, what: &str) {
    match i32::try_from(count) {
        Ok(n) => buf.put_i32(n),
        Err(_) => panic!("{what}: {count} does not fit the wire format's Int32"),
    }
}
