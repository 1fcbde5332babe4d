//! Decoding of messages captured from a real PostgreSQL 15 (see fixtures/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::{Bytes, BytesMut};
use common::{rows, FixtureRow, ALL, BINARY, PROTO1, STREAMING, TWO_PHASE};
use pgoutput::*;

const OUTBOX: u32 = 16394;
const FULL_IDENT: u32 = 16401;
const BIG: u32 = 16408;
const MOOD: u32 = 16385;
const POSINT: u32 = 16392;
const INT8: u32 = 20;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const JSONB: u32 = 3802;

fn decode_all(text: &str) -> Vec<(FixtureRow, LogicalMessage)> {
    let mut decoder = MessageDecoder::new();
    rows(text)
        .into_iter()
        .map(|row| {
            let msg = decoder
                .decode(row.data.clone())
                .unwrap_or_else(|e| panic!("{} at {}: {e}", hex_of(&row.data), row.lsn));
            (row, msg)
        })
        .collect()
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn begin(m: &LogicalMessage) -> Begin {
    match m {
        LogicalMessage::Begin(b) => *b,
        other => panic!("expected Begin, got {other:?}"),
    }
}

fn commit(m: &LogicalMessage) -> Commit {
    match m {
        LogicalMessage::Commit(c) => *c,
        other => panic!("expected Commit, got {other:?}"),
    }
}

fn relation(m: &LogicalMessage) -> &Relation {
    match m {
        LogicalMessage::Relation(r) => r,
        other => panic!("expected Relation, got {other:?}"),
    }
}

#[test]
fn every_fixture_reencodes_to_identical_bytes() {
    let mut count = 0;
    for (name, text) in ALL {
        for (row, msg) in decode_all(text) {
            let mut buf = BytesMut::new();
            msg.encode(&mut buf);
            assert_eq!(
                hex_of(&buf),
                hex_of(&row.data),
                "{name} at {}: {msg:?}",
                row.lsn
            );
            assert_eq!(msg.tag(), row.data[0]);
            count += 1;
        }
    }
    assert_eq!(count, 44 + 7 + 14 + 8);
}

#[test]
fn every_transaction_brackets_begin_and_commit_lsns() {
    for text in [PROTO1, BINARY] {
        let msgs = decode_all(text);
        let mut open: Option<(u32, Begin)> = None;
        for (row, msg) in &msgs {
            match msg {
                LogicalMessage::Begin(b) => {
                    assert!(open.is_none(), "nested Begin");
                    assert_eq!(b.xid, row.xid);
                    open = Some((row.xid, *b));
                }
                LogicalMessage::Commit(c) => {
                    let (xid, b) = open.take().expect("Commit without Begin");
                    assert_eq!(xid, row.xid);
                    assert_eq!(b.final_lsn, c.commit_lsn);
                    assert_eq!(b.commit_time, c.commit_time);
                    assert!(c.end_lsn > c.commit_lsn);
                    assert_eq!(c.flags, 0);
                    // The SQL interface reports a transaction's rows at its commit's end.
                    assert_eq!(row.lsn, c.end_lsn);
                }
                _ => {}
            }
        }
        assert!(open.is_none());
    }
}

#[test]
fn insert_transaction_with_user_defined_types() {
    let m = decode_all(PROTO1);
    let b = begin(&m[0].1);
    assert_eq!(b.xid, 731);
    assert_eq!(b.final_lsn, "0/1537318".parse().unwrap());
    // 2024-ish: commit times are after 2020-01-01 in PG-epoch microseconds.
    assert!(b.commit_time.0 > 631_152_000_000_000);

    assert_eq!(
        m[1].1,
        LogicalMessage::Type(TypeInfo {
            xid: None,
            type_oid: MOOD,
            namespace: "public".into(),
            name: "mood".into(),
        })
    );
    // A domain is described by its base type; "" namespace means pg_catalog.
    assert_eq!(
        m[2].1,
        LogicalMessage::Type(TypeInfo {
            xid: None,
            type_oid: POSINT,
            namespace: String::new(),
            name: "int4".into(),
        })
    );

    let rel = relation(&m[3].1);
    assert_eq!(rel.xid, None);
    assert_eq!(rel.rel_id, OUTBOX);
    assert_eq!(rel.namespace, "public");
    assert_eq!(rel.name, "outbox");
    assert_eq!(rel.replica_identity, ReplicaIdentity::Default);
    let cols: Vec<(&str, u32, bool, i32)> = rel
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, c.is_key(), c.type_modifier))
        .collect();
    assert_eq!(
        cols,
        [
            ("id", INT8, true, -1),
            ("topic", TEXT, false, -1),
            ("payload", JSONB, false, -1),
            ("m", MOOD, false, -1),
            ("n", POSINT, false, -1),
        ]
    );

    assert_eq!(
        m[4].1,
        LogicalMessage::Insert(Insert {
            xid: None,
            rel_id: OUTBOX,
            new_tuple: TupleData {
                columns: vec![
                    text("1"),
                    text("orders"),
                    text("{\"a\": 1}"),
                    text("happy"),
                    text("7"),
                ]
            }
        })
    );
    assert_eq!(
        m[5].1,
        LogicalMessage::Insert(Insert {
            xid: None,
            rel_id: OUTBOX,
            new_tuple: TupleData {
                columns: vec![
                    text("3"),
                    text("nulls"),
                    TupleValue::Null,
                    TupleValue::Null,
                    TupleValue::Null,
                ]
            }
        })
    );
    let c = commit(&m[6].1);
    assert_eq!(c.commit_lsn, b.final_lsn);
    assert_eq!(c.end_lsn, "0/1537348".parse().unwrap());
}

#[test]
fn tuple_values_are_slices_of_the_input() {
    let row = &rows(PROTO1)[4];
    let LogicalMessage::Insert(ins) =
        LogicalMessage::decode(row.data.clone(), StreamState::Outside).unwrap()
    else {
        panic!("not an insert");
    };
    let TupleValue::Text(v) = &ins.new_tuple.columns[1] else {
        panic!("not text");
    };
    let input = row.data.as_ptr_range();
    assert!(input.contains(&v.as_ptr()), "value was copied");
}

#[test]
fn updates_with_and_without_old_tuple() {
    let m = decode_all(PROTO1);
    let after = TupleData {
        columns: vec![
            text("1"),
            text("orders.v2"),
            text("{\"a\": 1}"),
            text("happy"),
            text("7"),
        ],
    };
    // Key unchanged under default identity: no old tuple.
    assert_eq!(
        m[8].1,
        LogicalMessage::Update(Update {
            xid: None,
            rel_id: OUTBOX,
            old_tuple: None,
            new_tuple: after.clone(),
        })
    );
    // Key changed: 'K' with only the key column set.
    let mut moved = after;
    moved.columns[0] = text("2");
    assert_eq!(
        m[11].1,
        LogicalMessage::Update(Update {
            xid: None,
            rel_id: OUTBOX,
            old_tuple: Some(OldTuple::Key(TupleData {
                columns: vec![
                    text("1"),
                    TupleValue::Null,
                    TupleValue::Null,
                    TupleValue::Null,
                    TupleValue::Null,
                ]
            })),
            new_tuple: moved,
        })
    );

    // REPLICA IDENTITY FULL: 'O' with the whole old row.
    let rel = relation(&m[14].1);
    assert_eq!((rel.rel_id, rel.name.as_str()), (FULL_IDENT, "full_ident"));
    assert_eq!(rel.replica_identity, ReplicaIdentity::Full);
    assert_eq!(rel.columns[0].type_oid, INT4);
    assert!(
        rel.columns.iter().all(|c| c.is_key()),
        "FULL marks every column"
    );
    assert_eq!(
        m[16].1,
        LogicalMessage::Update(Update {
            xid: None,
            rel_id: FULL_IDENT,
            old_tuple: Some(OldTuple::Full(TupleData {
                columns: vec![text("1"), text("x")]
            })),
            new_tuple: TupleData {
                columns: vec![text("1"), text("y")]
            },
        })
    );
}

#[test]
fn deletes_carry_key_or_full_old_tuple() {
    let m = decode_all(PROTO1);
    assert_eq!(
        m[17].1,
        LogicalMessage::Delete(Delete {
            xid: None,
            rel_id: FULL_IDENT,
            old_tuple: OldTuple::Full(TupleData {
                columns: vec![text("1"), text("y")]
            }),
        })
    );
    assert_eq!(
        m[20].1,
        LogicalMessage::Delete(Delete {
            xid: None,
            rel_id: OUTBOX,
            old_tuple: OldTuple::Key(TupleData {
                columns: vec![
                    text("2"),
                    TupleValue::Null,
                    TupleValue::Null,
                    TupleValue::Null,
                    TupleValue::Null,
                ]
            }),
        })
    );
}

#[test]
fn truncate_lists_relations_and_options() {
    let m = decode_all(PROTO1);
    assert_eq!(relation(&m[25].1).rel_id, OUTBOX);
    assert_eq!(relation(&m[26].1).rel_id, FULL_IDENT);
    assert_eq!(
        m[27].1,
        LogicalMessage::Truncate(Truncate {
            xid: None,
            options: 1 | 2,
            rel_ids: vec![OUTBOX, FULL_IDENT],
        })
    );
}

#[test]
fn logical_messages_transactional_and_not() {
    let m = decode_all(PROTO1);
    let commit_end = commit(&m[35].1).end_lsn;
    let LogicalMessage::Message(tx) = &m[30].1 else {
        panic!("expected Message, got {:?}", m[30].1);
    };
    assert!(tx.is_transactional());
    assert_eq!(tx.prefix, "outboxd");
    assert_eq!(&tx.content[..], b"hello");
    assert!(tx.lsn < commit_end);

    let (row, msg) = &m[36];
    assert_eq!(row.xid, 0, "non-transactional messages have no transaction");
    let LogicalMessage::Message(nontx) = msg else {
        panic!("expected Message, got {msg:?}");
    };
    assert!(!nontx.is_transactional());
    assert_eq!(nontx.prefix, "outboxd.nontx");
    assert_eq!(&nontx.content[..], [0x00, 0xff, 0x01]);
    assert_eq!(nontx.lsn, row.lsn);
}

#[test]
fn origin_follows_begin() {
    let m = decode_all(PROTO1);
    let b = begin(&m[37].1);
    assert_eq!(b.xid, 739);
    assert_eq!(
        m[38].1,
        LogicalMessage::Origin(Origin {
            origin_lsn: "0/ABCDEF01".parse().unwrap(),
            name: "upstream".into(),
        })
    );
    // The origin's commit time (set by pg_replication_origin_xact_setup) is the Begin's.
    let expected = PgTimestamp::from_system_time(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_704_164_645),
    );
    assert_eq!(b.commit_time, expected);
    assert!(matches!(m[39].1, LogicalMessage::Insert(_)));
}

#[test]
fn binary_mode_sends_send_format() {
    let m = decode_all(BINARY);
    let LogicalMessage::Insert(ins) = &m[4].1 else {
        panic!("expected Insert, got {:?}", m[4].1);
    };
    let cols = &ins.new_tuple.columns;
    assert_eq!(
        cols[0],
        TupleValue::Binary(Bytes::copy_from_slice(&1i64.to_be_bytes()))
    );
    assert_eq!(cols[1], TupleValue::Binary(Bytes::from_static(b"orders")));
    // jsonb's binary format is a version byte followed by the text.
    assert_eq!(
        cols[2],
        TupleValue::Binary(Bytes::from_static(b"\x01{\"a\": 1}"))
    );
    assert_eq!(
        cols[4],
        TupleValue::Binary(Bytes::copy_from_slice(&7i32.to_be_bytes()))
    );
}

#[test]
fn streamed_transactions_carry_xids() {
    let mut decoder = MessageDecoder::new();
    let mut states = Vec::new();
    let mut msgs = Vec::new();
    for row in rows(STREAMING) {
        states.push(decoder.stream_state());
        msgs.push(decoder.decode(row.data).unwrap());
    }
    assert_eq!(decoder.stream_state(), StreamState::Outside);
    assert_eq!(
        msgs[0],
        LogicalMessage::StreamStart(StreamStart {
            xid: 742,
            first_segment: true
        })
    );
    let rel = relation(&msgs[1]);
    assert_eq!(
        (rel.xid, rel.rel_id, rel.name.as_str()),
        (Some(742), BIG, "big")
    );
    assert_eq!(
        rel.replica_identity,
        ReplicaIdentity::Default,
        "no primary key, still default"
    );
    let LogicalMessage::Insert(ins) = &msgs[2] else {
        panic!("expected Insert");
    };
    assert_eq!(ins.xid, Some(742));
    assert_eq!(ins.new_tuple.columns[0], text("1"));
    assert_eq!(ins.new_tuple.columns[1], text(&"x".repeat(100)));
    assert_eq!(msgs[4], LogicalMessage::StreamStop);
    assert_eq!(
        msgs[5],
        LogicalMessage::StreamStart(StreamStart {
            xid: 742,
            first_segment: false
        })
    );
    let LogicalMessage::StreamCommit(sc) = msgs[8] else {
        panic!("expected Stream Commit, got {:?}", msgs[8]);
    };
    assert_eq!(sc.xid, 742);
    assert!(sc.end_lsn > sc.commit_lsn);
    assert_eq!(
        msgs[13],
        LogicalMessage::StreamAbort(StreamAbort {
            xid: 743,
            subxid: 743,
            abort: None
        })
    );
    assert_eq!(states[1], StreamState::InsideStream);
    assert_eq!(states[8], StreamState::Outside);

    // The same bytes decoded outside a stream misread the xid as the relation id.
    let row = &rows(STREAMING)[2];
    assert_ne!(
        LogicalMessage::decode(row.data.clone(), StreamState::Outside),
        Ok(msgs[2].clone())
    );
}

#[test]
fn two_phase_prepare_commit_and_rollback() {
    let m = decode_all(TWO_PHASE);
    let LogicalMessage::BeginPrepare(bp) = &m[0].1 else {
        panic!("expected Begin Prepare, got {:?}", m[0].1);
    };
    assert_eq!((bp.xid, bp.gid.as_str()), (740, "gid-commit"));
    let LogicalMessage::Prepare(p) = &m[2].1 else {
        panic!("expected Prepare, got {:?}", m[2].1);
    };
    assert_eq!(
        (p.xid, p.gid.as_str(), p.prepare_lsn, p.end_lsn),
        (740, "gid-commit", bp.prepare_lsn, bp.end_lsn)
    );
    let LogicalMessage::CommitPrepared(cp) = &m[3].1 else {
        panic!("expected Commit Prepared, got {:?}", m[3].1);
    };
    assert_eq!((cp.xid, cp.gid.as_str()), (740, "gid-commit"));
    assert!(cp.end_lsn > cp.commit_lsn);
    // COMMIT PREPARED ran right after PREPARE, so its record starts where Prepare's ended.
    assert_eq!(cp.commit_lsn, p.end_lsn);

    let LogicalMessage::Prepare(p2) = &m[6].1 else {
        panic!("expected Prepare, got {:?}", m[6].1);
    };
    let LogicalMessage::RollbackPrepared(rp) = &m[7].1 else {
        panic!("expected Rollback Prepared, got {:?}", m[7].1);
    };
    assert_eq!((rp.xid, rp.gid.as_str()), (741, "gid-rollback"));
    assert_eq!(rp.prepare_end_lsn, p2.end_lsn);
    assert_eq!(rp.prepare_time, p2.prepare_time);
    assert!(rp.rollback_end_lsn > rp.prepare_end_lsn);
    assert!(rp.rollback_time >= rp.prepare_time);
}
