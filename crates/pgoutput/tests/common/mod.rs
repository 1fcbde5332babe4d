//! Shared by the integration test binaries: fixture loading and proptest strategies.
//! Each binary uses a different part, hence the dead_code allowance.
#![allow(dead_code)]

use bytes::Bytes;
use pgoutput::*;
use proptest::collection::vec;
use proptest::prelude::*;

/// One row of a fixture file: `<lsn> <xid> <hex>`.
#[derive(Debug, Clone)]
pub struct FixtureRow {
    pub lsn: Lsn,
    pub xid: u32,
    pub data: Bytes,
}

pub const PROTO1: &str = include_str!("../fixtures/pg15_proto1.txt");
pub const BINARY: &str = include_str!("../fixtures/pg15_binary.txt");
pub const STREAMING: &str = include_str!("../fixtures/pg15_streaming.txt");
pub const TWO_PHASE: &str = include_str!("../fixtures/pg15_two_phase.txt");
pub const ALL: [(&str, &str); 4] = [
    ("pg15_proto1", PROTO1),
    ("pg15_binary", BINARY),
    ("pg15_streaming", STREAMING),
    ("pg15_two_phase", TWO_PHASE),
];

pub fn hex(s: &str) -> Bytes {
    s.as_bytes()
        .chunks(2)
        .map(|pair| {
            assert_eq!(pair.len(), 2, "odd hex length in {s:?}");
            u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap()
        })
        .collect::<Vec<u8>>()
        .into()
}

pub fn rows(text: &str) -> Vec<FixtureRow> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut parts = line.split_whitespace();
            let lsn = parts.next().unwrap().parse().unwrap();
            let xid = parts.next().unwrap().parse().unwrap();
            let data = hex(parts.next().unwrap());
            assert!(parts.next().is_none(), "extra field in {line:?}");
            FixtureRow { lsn, xid, data }
        })
        .collect()
}

/// Every fixture message with the stream state it must be decoded in.
pub fn all_fixture_messages() -> Vec<(Bytes, StreamState)> {
    let mut out = Vec::new();
    for (_, text) in ALL {
        let mut decoder = MessageDecoder::new();
        for row in rows(text) {
            let state = decoder.stream_state();
            decoder.decode(row.data.clone()).unwrap();
            out.push((row.data, state));
        }
    }
    out
}

// ---- proptest strategies -------------------------------------------------------------

pub fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

pub fn ts() -> impl Strategy<Value = PgTimestamp> {
    any::<i64>().prop_map(PgTimestamp)
}

/// Strings as they can appear on the wire: any UTF-8 without NUL.
pub fn wire_string() -> impl Strategy<Value = String> {
    "[^\u{0}]{0,12}"
}

pub fn payload() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

pub fn tuple_value() -> impl Strategy<Value = TupleValue> {
    prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        payload().prop_map(TupleValue::Text),
        payload().prop_map(TupleValue::Binary),
    ]
}

pub fn tuple() -> impl Strategy<Value = TupleData> {
    vec(tuple_value(), 0..6).prop_map(|columns| TupleData { columns })
}

pub fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

pub fn column() -> impl Strategy<Value = Column> {
    (any::<u8>(), wire_string(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| Column {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

pub fn replica_identity() -> impl Strategy<Value = ReplicaIdentity> {
    prop_oneof![
        Just(ReplicaIdentity::Default),
        Just(ReplicaIdentity::Nothing),
        Just(ReplicaIdentity::Full),
        Just(ReplicaIdentity::Index),
    ]
}

fn prepare() -> impl Strategy<Value = Prepare> {
    (any::<u8>(), lsn(), lsn(), ts(), any::<u32>(), wire_string()).prop_map(
        |(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| Prepare {
            flags,
            prepare_lsn,
            end_lsn,
            prepare_time,
            xid,
            gid,
        },
    )
}

/// Messages that may carry a streamed xid, built with the given xid strategy.
fn xid_messages(
    xid: impl Strategy<Value = Option<u32>> + Clone + 'static,
) -> impl Strategy<Value = LogicalMessage> {
    prop_oneof![
        (
            xid.clone(),
            any::<u32>(),
            wire_string(),
            wire_string(),
            replica_identity(),
            vec(column(), 0..5)
        )
            .prop_map(
                |(xid, rel_id, namespace, name, replica_identity, columns)| {
                    LogicalMessage::Relation(Relation {
                        xid,
                        rel_id,
                        namespace,
                        name,
                        replica_identity,
                        columns,
                    })
                }
            ),
        (xid.clone(), any::<u32>(), wire_string(), wire_string()).prop_map(
            |(xid, type_oid, namespace, name)| LogicalMessage::Type(TypeInfo {
                xid,
                type_oid,
                namespace,
                name,
            })
        ),
        (xid.clone(), any::<u32>(), tuple()).prop_map(|(xid, rel_id, new_tuple)| {
            LogicalMessage::Insert(Insert {
                xid,
                rel_id,
                new_tuple,
            })
        }),
        (
            xid.clone(),
            any::<u32>(),
            proptest::option::of(old_tuple()),
            tuple()
        )
            .prop_map(|(xid, rel_id, old_tuple, new_tuple)| {
                LogicalMessage::Update(Update {
                    xid,
                    rel_id,
                    old_tuple,
                    new_tuple,
                })
            }),
        (xid.clone(), any::<u32>(), old_tuple()).prop_map(|(xid, rel_id, old_tuple)| {
            LogicalMessage::Delete(Delete {
                xid,
                rel_id,
                old_tuple,
            })
        }),
        (xid.clone(), any::<u8>(), vec(any::<u32>(), 0..6)).prop_map(|(xid, options, rel_ids)| {
            LogicalMessage::Truncate(Truncate {
                xid,
                options,
                rel_ids,
            })
        }),
        (xid, any::<u8>(), lsn(), wire_string(), payload()).prop_map(
            |(xid, flags, lsn, prefix, content)| LogicalMessage::Message(Message {
                xid,
                flags,
                lsn,
                prefix,
                content,
            })
        ),
    ]
}

/// Messages that never carry a streamed xid prefix.
fn plain_messages() -> impl Strategy<Value = LogicalMessage> {
    prop_oneof![
        (lsn(), ts(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| {
            LogicalMessage::Begin(Begin {
                final_lsn,
                commit_time,
                xid,
            })
        }),
        (any::<u8>(), lsn(), lsn(), ts()).prop_map(|(flags, commit_lsn, end_lsn, commit_time)| {
            LogicalMessage::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
            })
        }),
        (lsn(), wire_string())
            .prop_map(|(origin_lsn, name)| LogicalMessage::Origin(Origin { origin_lsn, name })),
        (any::<u32>(), any::<bool>()).prop_map(|(xid, first_segment)| {
            LogicalMessage::StreamStart(StreamStart { xid, first_segment })
        }),
        Just(LogicalMessage::StreamStop),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), ts()).prop_map(
            |(xid, flags, commit_lsn, end_lsn, commit_time)| {
                LogicalMessage::StreamCommit(StreamCommit {
                    xid,
                    flags,
                    commit_lsn,
                    end_lsn,
                    commit_time,
                })
            }
        ),
        (
            any::<u32>(),
            any::<u32>(),
            proptest::option::of((lsn(), ts()))
        )
            .prop_map(|(xid, subxid, abort)| {
                LogicalMessage::StreamAbort(StreamAbort { xid, subxid, abort })
            }),
        (lsn(), lsn(), ts(), any::<u32>(), wire_string()).prop_map(
            |(prepare_lsn, end_lsn, prepare_time, xid, gid)| {
                LogicalMessage::BeginPrepare(BeginPrepare {
                    prepare_lsn,
                    end_lsn,
                    prepare_time,
                    xid,
                    gid,
                })
            }
        ),
        prepare().prop_map(LogicalMessage::Prepare),
        prepare().prop_map(LogicalMessage::StreamPrepare),
        (any::<u8>(), lsn(), lsn(), ts(), any::<u32>(), wire_string()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_time, xid, gid)| {
                LogicalMessage::CommitPrepared(CommitPrepared {
                    flags,
                    commit_lsn,
                    end_lsn,
                    commit_time,
                    xid,
                    gid,
                })
            }
        ),
        (
            any::<u8>(),
            lsn(),
            lsn(),
            ts(),
            ts(),
            any::<u32>(),
            wire_string()
        )
            .prop_map(
                |(
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_time,
                    rollback_time,
                    xid,
                    gid,
                )| {
                    LogicalMessage::RollbackPrepared(RollbackPrepared {
                        flags,
                        prepare_end_lsn,
                        rollback_end_lsn,
                        prepare_time,
                        rollback_time,
                        xid,
                        gid,
                    })
                }
            ),
    ]
}

/// Any message paired with the stream state it decodes in: messages with an xid
/// prefix only inside a stream, the rest in either state.
pub fn message_with_state() -> impl Strategy<Value = (LogicalMessage, StreamState)> {
    let state = prop_oneof![Just(StreamState::Outside), Just(StreamState::InsideStream)];
    prop_oneof![
        xid_messages(Just(None)).prop_map(|m| (m, StreamState::Outside)),
        xid_messages(any::<u32>().prop_map(Some)).prop_map(|m| (m, StreamState::InsideStream)),
        (plain_messages(), state),
    ]
}

pub fn replication_frame() -> impl Strategy<Value = ReplicationFrame> {
    prop_oneof![
        (lsn(), lsn(), ts(), payload()).prop_map(|(wal_start, wal_end, send_time, data)| {
            ReplicationFrame::XLogData(XLogData {
                wal_start,
                wal_end,
                send_time,
                data,
            })
        }),
        (lsn(), ts(), any::<bool>()).prop_map(|(wal_end, send_time, reply_requested)| {
            ReplicationFrame::Keepalive(Keepalive {
                wal_end,
                send_time,
                reply_requested,
            })
        }),
    ]
}

pub fn status_update() -> impl Strategy<Value = StandbyStatusUpdate> {
    (lsn(), lsn(), lsn(), ts(), any::<bool>()).prop_map(
        |(write, flush, apply, client_time, reply_requested)| StandbyStatusUpdate {
            write,
            flush,
            apply,
            client_time,
            reply_requested,
        },
    )
}
