//! Feeds arbitrary bytes to every decoder. Besides not panicking, whatever a decoder
//! accepts must re-encode to exactly the input: the encodings are canonical, so a
//! mismatch means the decoder skipped or invented something.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use pgoutput::{
    LogicalMessage, MessageDecoder, ReplicationFrame, StandbyStatusUpdate, StreamState,
};

fn message_in_both_states(data: &Bytes) {
    for state in [StreamState::Outside, StreamState::InsideStream] {
        if let Ok(msg) = LogicalMessage::decode(data.clone(), state) {
            assert_eq!(msg.to_bytes(), *data, "{msg:?}");
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let data = Bytes::copy_from_slice(input);

    if let Ok(frame) = ReplicationFrame::decode(data.clone()) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        assert_eq!(&buf[..], input);
        if let ReplicationFrame::XLogData(x) = frame {
            message_in_both_states(&x.data);
        }
    }
    message_in_both_states(&data);
    if let Ok(update) = StandbyStatusUpdate::decode(data.clone()) {
        assert_eq!(update.to_bytes(), data);
    }

    // Also read the input as one-byte-length-prefixed chunks, so one input can
    // drive the stream-state machine through several messages.
    let mut decoder = MessageDecoder::new();
    let mut rest = input;
    while let [len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let _ = decoder.decode(Bytes::copy_from_slice(&tail[..n]));
        rest = &tail[n..];
    }
});
