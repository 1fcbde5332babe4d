//! Hand-built byte layouts: the messages PostgreSQL 15 cannot be made to emit, and every
//! way a frame or message is rejected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::hex;
use pgoutput::*;

fn decode_out(data: &[u8]) -> Result<LogicalMessage, DecodeError> {
    LogicalMessage::decode(Bytes::copy_from_slice(data), StreamState::Outside)
}

#[test]
fn xlog_data_is_a_zero_copy_slice() {
    let mut buf = BytesMut::new();
    buf.put_u8(b'w');
    buf.put_u64(0x10);
    buf.put_u64(0x20);
    buf.put_i64(-5);
    buf.put_slice(b"E");
    let input = buf.freeze();
    let ReplicationFrame::XLogData(x) = ReplicationFrame::decode(input.clone()).unwrap() else {
        panic!("not XLogData");
    };
    assert_eq!(
        (x.wal_start, x.wal_end, x.send_time),
        (Lsn(0x10), Lsn(0x20), PgTimestamp(-5))
    );
    assert_eq!(&x.data[..], b"E");
    assert_eq!(x.data.as_ptr(), input[25..].as_ptr());
}

#[test]
fn xlog_data_may_carry_an_empty_message() {
    let frame = ReplicationFrame::decode(hex(&format!("77{}", "00".repeat(24)))).unwrap();
    assert!(matches!(frame, ReplicationFrame::XLogData(x) if x.data.is_empty()));
}

#[test]
fn keepalive_decodes_and_rejects_bad_input() {
    let ok = hex("6b00000000016b374800000000000000ff01");
    assert_eq!(
        ReplicationFrame::decode(ok),
        Ok(ReplicationFrame::Keepalive(Keepalive {
            wal_end: Lsn(0x016b_3748),
            send_time: PgTimestamp(0xff),
            reply_requested: true,
        }))
    );
    assert_eq!(
        ReplicationFrame::decode(hex("6b00000000016b374800000000000000ff0100")),
        Err(DecodeError::TrailingBytes {
            what: "Keepalive",
            count: 1
        })
    );
    assert!(matches!(
        ReplicationFrame::decode(hex("6b00000000016b374800000000000000ff02")),
        Err(DecodeError::InvalidValue { value: 2, .. })
    ));
    assert!(matches!(
        ReplicationFrame::decode(hex("6b00000000016b374800000000000000ff")),
        Err(DecodeError::Truncated {
            needed: 1,
            available: 0,
            ..
        })
    ));
}

#[test]
fn frame_tags_and_truncation() {
    assert!(matches!(
        ReplicationFrame::decode(Bytes::new()),
        Err(DecodeError::Truncated { .. })
    ));
    assert_eq!(
        ReplicationFrame::decode(hex("7200")),
        Err(DecodeError::UnknownTag {
            what: "replication frame",
            tag: b'r'
        })
    );
    assert!(matches!(
        ReplicationFrame::decode(hex("77000000")),
        Err(DecodeError::Truncated {
            needed: 8,
            available: 3,
            ..
        })
    ));
    assert!(matches!(
        StandbyStatusUpdate::decode(hex("6b")),
        Err(DecodeError::UnknownTag { tag: b'k', .. })
    ));
}

#[test]
fn stream_prepare_hand_built() {
    // 'p', flags 0, prepare_lsn 0/1000, end_lsn 0/1028, ts 1, xid 750, gid "g"
    let bytes = hex(concat!(
        "70",
        "00",
        "0000000000001000",
        "0000000000001028",
        "0000000000000001",
        "000002ee",
        "6700"
    ));
    let msg = LogicalMessage::decode(bytes.clone(), StreamState::Outside).unwrap();
    assert_eq!(
        msg,
        LogicalMessage::StreamPrepare(Prepare {
            flags: 0,
            prepare_lsn: Lsn(0x1000),
            end_lsn: Lsn(0x1028),
            prepare_time: PgTimestamp(1),
            xid: 750,
            gid: "g".into(),
        })
    );
    assert_eq!(msg.to_bytes(), bytes);
}

#[test]
fn stream_abort_tail_is_all_or_nothing() {
    let base = "41000002e7000002e8";
    assert_eq!(
        decode_out(&hex(base)),
        Ok(LogicalMessage::StreamAbort(StreamAbort {
            xid: 743,
            subxid: 744,
            abort: None
        }))
    );
    // Protocol 4 with streaming = parallel appends abort_lsn and abort_time.
    let with_tail = format!("{base}00000000015d6500000000000000002a");
    assert_eq!(
        decode_out(&hex(&with_tail)),
        Ok(LogicalMessage::StreamAbort(StreamAbort {
            xid: 743,
            subxid: 744,
            abort: Some((Lsn(0x015d_6500), PgTimestamp(42)))
        }))
    );
    assert!(matches!(
        decode_out(&hex(&format!("{base}0000"))),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 2,
            ..
        })
    ));
    assert!(matches!(
        decode_out(&hex(&format!("{with_tail}00"))),
        Err(DecodeError::TrailingBytes { count: 1, .. })
    ));
}

#[test]
fn message_level_rejections() {
    assert_eq!(
        decode_out(b"Z"),
        Err(DecodeError::UnknownTag {
            what: "pgoutput message",
            tag: b'Z'
        })
    );
    assert!(matches!(
        decode_out(b""),
        Err(DecodeError::Truncated { .. })
    ));
    assert_eq!(
        decode_out(b"EE"),
        Err(DecodeError::TrailingBytes {
            what: "Stream Stop",
            count: 1
        })
    );
    // Begin one byte short.
    assert!(matches!(
        decode_out(&hex("42000000000153731800030472e192ee01000002")),
        Err(DecodeError::Truncated { .. })
    ));
    // Replica identity 'x'.
    assert_eq!(
        decode_out(&hex("520000400a7000740078000000")),
        Err(DecodeError::InvalidValue {
            what: "Relation replica identity",
            value: i64::from(b'x')
        })
    );
    // Relation name not terminated.
    assert!(matches!(
        decode_out(&hex("520000400a70007478")),
        Err(DecodeError::UnterminatedString { .. })
    ));
    // Invalid UTF-8 in an origin name.
    assert!(matches!(
        decode_out(&hex("4f0000000000000001ff00")),
        Err(DecodeError::InvalidUtf8 {
            what: "Origin name"
        })
    ));
    // Negative text length.
    assert_eq!(
        decode_out(&hex("490000400a4e000174ffffffff")),
        Err(DecodeError::InvalidLength {
            what: "TupleData text length",
            length: -1
        })
    );
    // Length beyond the buffer.
    assert!(matches!(
        decode_out(&hex("490000400a4e00017400000010616263")),
        Err(DecodeError::Truncated {
            needed: 16,
            available: 3,
            ..
        })
    ));
    // Negative column count.
    assert!(matches!(
        decode_out(&hex("490000400a4e8000")),
        Err(DecodeError::InvalidLength { length: -32768, .. })
    ));
    // Unknown column kind.
    assert!(matches!(
        decode_out(&hex("490000400a4e000178")),
        Err(DecodeError::UnknownTag { tag: b'x', .. })
    ));
    // Insert without 'N', Update with only an old tuple, Delete with 'N'.
    assert!(matches!(
        decode_out(&hex("490000400a4b0000")),
        Err(DecodeError::UnknownTag { tag: b'K', .. })
    ));
    assert!(matches!(
        decode_out(&hex("550000400a4b0000")),
        Err(DecodeError::Truncated { .. })
    ));
    assert!(matches!(
        decode_out(&hex("550000400a4b00004b0000")),
        Err(DecodeError::UnknownTag { tag: b'K', .. })
    ));
    assert!(matches!(
        decode_out(&hex("440000400a4e0000")),
        Err(DecodeError::UnknownTag { tag: b'N', .. })
    ));
    // Stream Start's first_segment must be a boolean.
    assert!(matches!(
        decode_out(&hex("53000002e602")),
        Err(DecodeError::InvalidValue { value: 2, .. })
    ));
}

#[test]
fn huge_counts_with_little_data_fail_cleanly() {
    // Relation claiming 30000 columns with 10 bytes left.
    let mut rel = hex("520000400a7000740064").to_vec();
    rel.extend_from_slice(&30000i16.to_be_bytes());
    rel.extend_from_slice(&[1, b'a', 0, 0, 0, 0, 23, 0xff, 0xff, 0xff]);
    assert!(matches!(
        decode_out(&rel),
        Err(DecodeError::Truncated { .. })
    ));
    // Truncate claiming i32::MAX relations.
    assert!(matches!(
        decode_out(&hex("547fffffff0000000001")),
        Err(DecodeError::Truncated { .. })
    ));
    // Message content claiming 2 GiB.
    assert!(matches!(
        decode_out(&hex("4d0100000000000000016f007fffffff")),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn stream_state_decides_the_xid_prefix() {
    let inside = hex("59000002e60000400170006d00");
    assert_eq!(
        LogicalMessage::decode(inside.clone(), StreamState::InsideStream),
        Ok(LogicalMessage::Type(TypeInfo {
            xid: Some(742),
            type_oid: 16385,
            namespace: "p".into(),
            name: "m".into(),
        }))
    );
    // Outside a stream the xid is read as the OID and the rest no longer parses.
    assert!(LogicalMessage::decode(inside, StreamState::Outside).is_err());
}

#[test]
fn decoder_state_survives_errors() {
    let mut d = MessageDecoder::new();
    assert_eq!(d.stream_state(), StreamState::Outside);
    d.decode(hex("53000002e601")).unwrap();
    assert_eq!(d.stream_state(), StreamState::InsideStream);
    assert!(d.decode(hex("53000002e6")).is_err());
    assert_eq!(d.stream_state(), StreamState::InsideStream);
    d.decode(hex("45")).unwrap();
    assert_eq!(d.stream_state(), StreamState::Outside);
    assert_eq!(
        MessageDecoder::default().stream_state(),
        StreamState::Outside
    );
}
