//! Decoding the start of a message too long to hold whole (`TruncatedMessage`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use pgoutput::*;

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn insert(xid: Option<u32>) -> (Bytes, Vec<TupleValue>) {
    let columns = vec![text("id-1"), TupleValue::Null, text(&"p".repeat(1000))];
    let msg = LogicalMessage::Insert(Insert {
        xid,
        rel_id: 77,
        new_tuple: TupleData {
            columns: columns.clone(),
        },
    });
    (msg.to_bytes(), columns)
}

fn cut(whole: &Bytes, at: usize, stream: StreamState) -> Result<TruncatedMessage, DecodeError> {
    TruncatedMessage::decode(whole.slice(..at), whole.len(), stream)
}

#[test]
fn an_insert_keeps_the_columns_wholly_inside_the_head() {
    let (whole, columns) = insert(None);
    // Tag, rel id, 'N', count; then `t` + length + "id-1", then `n`.
    let after_second = 1 + 4 + 1 + 2 + (1 + 4 + 4) + 1;
    for (at, kept) in [
        (8, 0),
        (after_second - 1, 1),
        (after_second, 2),
        (after_second + 5, 2),
        (whole.len() - 1, 2),
    ] {
        let t = cut(&whole, at, StreamState::Outside).unwrap();
        assert_eq!(t.len, whole.len());
        assert_eq!(
            t.kind,
            Truncated::Insert {
                xid: None,
                rel_id: 77,
                column_count: 3,
                leading: TupleData {
                    columns: columns[..kept].to_vec()
                },
            },
            "cut at {at}"
        );
    }
}

#[test]
fn a_streamed_insert_has_its_xid() {
    let (whole, _) = insert(Some(9));
    let t = cut(&whole, 30, StreamState::InsideStream).unwrap();
    assert!(matches!(
        t.kind,
        Truncated::Insert {
            xid: Some(9),
            rel_id: 77,
            ..
        }
    ));
}

#[test]
fn a_logical_message_keeps_its_prefix_when_it_ends_inside_the_head() {
    let msg = Message {
        xid: None,
        flags: 1,
        lsn: Lsn(0x1234),
        prefix: "other".into(),
        content: Bytes::from(vec![b'm'; 500]),
    };
    let whole = LogicalMessage::Message(msg.clone()).to_bytes();
    let t = cut(&whole, 40, StreamState::Outside).unwrap();
    assert_eq!(
        t.kind,
        Truncated::Message {
            xid: None,
            flags: 1,
            lsn: Lsn(0x1234),
            prefix: Some("other".into()),
            content_len: Some(500),
        }
    );
    let head = t.kind.as_message().unwrap();
    assert_eq!(
        (head.prefix.as_str(), head.lsn, head.is_transactional()),
        ("other", msg.lsn, true)
    );
    assert!(head.content.is_empty());
    // Cut inside the prefix: unknown, never guessed.
    let t = cut(&whole, 1 + 1 + 8 + 3, StreamState::Outside).unwrap();
    assert!(matches!(
        t.kind,
        Truncated::Message {
            prefix: None,
            content_len: None,
            ..
        }
    ));
    assert_eq!(t.kind.as_message(), None);
}

#[test]
fn updates_and_deletes_keep_their_relation() {
    let tuple = TupleData {
        columns: vec![text(&"x".repeat(100))],
    };
    let update = LogicalMessage::Update(Update {
        xid: None,
        rel_id: 5,
        old_tuple: None,
        new_tuple: tuple.clone(),
    })
    .to_bytes();
    let delete = LogicalMessage::Delete(Delete {
        xid: None,
        rel_id: 6,
        old_tuple: OldTuple::Full(tuple),
    })
    .to_bytes();
    assert_eq!(
        cut(&update, 20, StreamState::Outside).unwrap().kind,
        Truncated::Update {
            xid: None,
            rel_id: 5
        }
    );
    assert_eq!(
        cut(&delete, 20, StreamState::Outside).unwrap().kind,
        Truncated::Delete {
            xid: None,
            rel_id: 6
        }
    );
}

#[test]
fn other_kinds_and_whole_messages_are_refused() {
    let begin = LogicalMessage::Begin(Begin {
        final_lsn: Lsn(1),
        commit_time: PgTimestamp(2),
        xid: 3,
    })
    .to_bytes();
    assert!(matches!(
        cut(&begin, 5, StreamState::Outside),
        Err(DecodeError::UnknownTag { tag: b'B', .. })
    ));
    let (whole, _) = insert(None);
    assert!(TruncatedMessage::decode(whole.clone(), whole.len(), StreamState::Outside).is_err());
    // A corrupt column kind inside the head is an error, not the end of the columns.
    let mut bad = whole.to_vec();
    bad[8] = b'z';
    assert!(matches!(
        TruncatedMessage::decode(
            Bytes::from(bad).slice(..30),
            whole.len(),
            StreamState::Outside
        ),
        Err(DecodeError::UnknownTag { tag: b'z', .. })
    ));
}
