//! The fuzz target's oracle, shared with the stable test that replays the committed corpus
//! (`tests/fuzz_corpus.rs`), so that a seed the fuzzer once found keeps being checked by
//! `scripts/test` without nightly.
//!
//! Besides not panicking, whatever a decoder accepts must re-encode to exactly the input:
//! the encodings are canonical, so a mismatch means the decoder skipped or invented
//! something.

use bytes::{Bytes, BytesMut};
use pgoutput::{
    LogicalMessage, MessageDecoder, ReplicationFrame, StandbyStatusUpdate, StreamState, Truncated,
    TruncatedMessage,
};

fn message_in_both_states(data: &Bytes) {
    for state in [StreamState::Outside, StreamState::InsideStream] {
        let whole = LogicalMessage::decode(data.clone(), state).ok();
        if let Some(msg) = &whole {
            assert_eq!(msg.to_bytes(), *data, "{msg:?}");
        }
        // Every head of the input decodes without a panic, and a head of a message that
        // decodes whole agrees with it: nothing read from a head is guessed.
        for at in 0..data.len() {
            let Ok(head) = TruncatedMessage::decode(data.slice(..at), data.len(), state) else {
                continue;
            };
            match (&whole, &head.kind) {
                (
                    Some(LogicalMessage::Insert(i)),
                    Truncated::Insert {
                        rel_id,
                        leading,
                        column_count,
                        ..
                    },
                ) => {
                    assert_eq!(
                        (*rel_id, *column_count),
                        (i.rel_id, i.new_tuple.columns.len())
                    );
                    assert!(
                        i.new_tuple.columns.starts_with(&leading.columns),
                        "{head:?}"
                    );
                }
                (Some(LogicalMessage::Message(m)), Truncated::Message { prefix, lsn, .. }) => {
                    assert_eq!(*lsn, m.lsn);
                    assert!(prefix.as_ref().is_none_or(|p| *p == m.prefix), "{head:?}");
                }
                _ => {}
            }
        }
    }
}

/// Feeds `input` to every decoder and checks the round trip of whatever is accepted.
pub fn check(input: &[u8]) {
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
}
