//! encode → decode is the identity for every message, frame and status update.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::{Bytes, BytesMut};
use common::{message_with_state, replication_frame, status_update};
use pgoutput::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn logical_message_round_trips((msg, state) in message_with_state()) {
        let mut buf = BytesMut::new();
        msg.encode(&mut buf);
        prop_assert_eq!(buf[0], msg.tag());
        let decoded = LogicalMessage::decode(buf.freeze(), state);
        prop_assert_eq!(decoded, Ok(msg));
    }

    #[test]
    fn message_decoder_tracks_stream_blocks(
        xid in any::<u32>(),
        body in prop::collection::vec(message_with_state(), 0..8),
    ) {
        // Wrap the in-stream messages in Stream Start/Stop, as the server would.
        let mut decoder = MessageDecoder::new();
        let start = LogicalMessage::StreamStart(StreamStart { xid, first_segment: true });
        prop_assert_eq!(decoder.decode(start.to_bytes()), Ok(start));
        for (msg, state) in body.iter().filter(|(m, _)| {
            !matches!(m, LogicalMessage::StreamStart(_) | LogicalMessage::StreamStop)
        }) {
            if *state == StreamState::InsideStream {
                prop_assert_eq!(decoder.stream_state(), StreamState::InsideStream);
                prop_assert_eq!(decoder.decode(msg.to_bytes()), Ok(msg.clone()));
            }
        }
        prop_assert_eq!(decoder.decode(LogicalMessage::StreamStop.to_bytes()), Ok(LogicalMessage::StreamStop));
        prop_assert_eq!(decoder.stream_state(), StreamState::Outside);
    }

    #[test]
    fn replication_frame_round_trips(frame in replication_frame()) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        prop_assert_eq!(ReplicationFrame::decode(buf.freeze()), Ok(frame));
    }

    #[test]
    fn xlog_data_carries_a_message(
        (msg, state) in message_with_state(),
        wal_start in any::<u64>(),
    ) {
        let frame = ReplicationFrame::XLogData(XLogData {
            wal_start: Lsn(wal_start),
            wal_end: Lsn(wal_start),
            send_time: PgTimestamp(0),
            data: msg.to_bytes(),
        });
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        let ReplicationFrame::XLogData(x) = ReplicationFrame::decode(buf.freeze()).unwrap() else {
            panic!("not XLogData");
        };
        prop_assert_eq!(LogicalMessage::decode(x.data, state), Ok(msg));
    }

    #[test]
    fn status_update_round_trips(update in status_update()) {
        let bytes = update.to_bytes();
        prop_assert_eq!(bytes.len(), StandbyStatusUpdate::ENCODED_LEN);
        let mut buf = BytesMut::new();
        update.encode(&mut buf);
        prop_assert_eq!(&buf[..], &bytes[..]);
        prop_assert_eq!(StandbyStatusUpdate::decode(bytes), Ok(update));
    }
}

#[test]
fn status_update_layout_is_fixed() {
    let update = StandbyStatusUpdate {
        write: Lsn(0x0102_0304_0506_0708),
        flush: Lsn(2),
        apply: Lsn(3),
        client_time: PgTimestamp(-1),
        reply_requested: true,
    };
    let mut expected = vec![b'r'];
    expected.extend_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    expected.extend_from_slice(&2u64.to_be_bytes());
    expected.extend_from_slice(&3u64.to_be_bytes());
    expected.extend_from_slice(&(-1i64).to_be_bytes());
    expected.push(1);
    assert_eq!(expected.len(), 34);
    assert_eq!(update.to_bytes(), Bytes::from(expected));
}
