//! The decoder against what this server version really sends: the fixture script
//! (crates/pgoutput/tests/fixtures/capture.sql) is run on a throwaway cluster of the
//! version under test, and every message of every slot is decoded and re-encoded to the
//! same bytes, with each protocol version the server accepts (4 with streaming =
//! parallel on 16+). A message type a new version adds fails here by name.
//! Set OUTBOXD_CAPTURE_FIXTURES=<dir> to also write the captures as fixture files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::process::Command;

use bytes::{Bytes, BytesMut};
use pgoutput::{LogicalMessage, MessageDecoder};
use pgtest::{ClusterOptions, PgCluster};

const CAPTURE_SQL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/crates/pgoutput/tests/fixtures/capture.sql"
);

fn unhex(s: &str) -> Bytes {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect::<Vec<u8>>()
        .into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One peek: `(name, slot, pre-statement, options)`.
fn peeks(major: u32) -> Vec<(String, &'static str, &'static str, String)> {
    let mut out = Vec::new();
    let mut protos = vec![1];
    protos.push(match major {
        14 => 2,
        15 => 3,
        _ => 4,
    });
    for p in protos {
        out.push((
            format!("proto{p}"),
            "fix",
            "",
            format!("'proto_version', '{p}', 'publication_names', 'pub', 'messages', 'true'"),
        ));
    }
    out.push((
        "binary".into(),
        "fixbin",
        "",
        "'proto_version', '1', 'publication_names', 'pub', 'binary', 'true'".into(),
    ));
    if major >= 15 {
        out.push((
            "two_phase".into(),
            "fix2pc",
            "",
            "'proto_version', '3', 'publication_names', 'pub', 'two_phase', 'true'".into(),
        ));
    }
    let small = "SET logical_decoding_work_mem = '64kB'; ";
    out.push((
        "streaming".into(),
        "fixstream",
        small,
        "'proto_version', '2', 'publication_names', 'pub', 'streaming', 'true'".into(),
    ));
    if major >= 16 {
        out.push((
            "streaming_parallel".into(),
            "fixstream",
            small,
            "'proto_version', '4', 'publication_names', 'pub', 'streaming', 'parallel'".into(),
        ));
    }
    out
}

#[test]
fn every_message_this_version_sends_decodes_and_reencodes() {
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec!["max_prepared_transactions = 10".into()],
        ..ClusterOptions::default()
    })
    .expect("cluster");
    let major = cluster.major_version();
    let out = Command::new(cluster.tool("psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", cluster.host()])
        .args(["-p", &cluster.port().to_string(), "-U", cluster.superuser()])
        .args(["-d", "postgres", "-f", CAPTURE_SQL])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "capture.sql on {major}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let capture_dir = std::env::var_os("OUTBOXD_CAPTURE_FIXTURES");
    let mut tags = BTreeSet::new();
    let mut stream_abort_with_lsn = false;
    for (name, slot, pre, options) in peeks(major) {
        let text = cluster
            .psql(
                "postgres",
                &format!(
                    "{pre}SELECT lsn, xid, encode(data, 'hex') FROM \
                     pg_logical_slot_peek_binary_changes('{slot}', NULL, NULL, {options})"
                ),
            )
            .unwrap_or_else(|e| panic!("peek {name} on {major}: {e}"));
        let mut decoder = MessageDecoder::new();
        let mut lines = Vec::new();
        for line in text.lines() {
            let mut f = line.split('|');
            let (lsn, xid, data) = (f.next(), f.next(), f.next());
            let (Some(lsn), Some(xid), Some(data)) = (lsn, xid, data) else {
                panic!("unexpected peek row {line:?}");
            };
            let bytes = unhex(data);
            let msg = decoder.decode(bytes.clone()).unwrap_or_else(|e| {
                panic!("PostgreSQL {major}, {name}: cannot decode {data} at {lsn}: {e}")
            });
            let mut again = BytesMut::new();
            msg.encode(&mut again);
            assert_eq!(
                hex(&again),
                data,
                "PostgreSQL {major}, {name} at {lsn}: {msg:?}"
            );
            tags.insert(char::from(msg.tag()));
            if let LogicalMessage::StreamAbort(a) = &msg {
                stream_abort_with_lsn |= a.abort.is_some();
            }
            lines.push(format!("{lsn} {xid} {data}"));
        }
        assert!(
            !lines.is_empty(),
            "PostgreSQL {major}, {name}: nothing decoded"
        );
        if let Some(dir) = &capture_dir {
            let path = std::path::Path::new(dir).join(format!("pg{major}_{name}.txt"));
            std::fs::write(&path, lines.join("\n") + "\n").expect("write fixture");
        }
    }
    // What capture.sql produces on every version: a new version that stops sending one
    // of these (or sends something else for them) shows up here.
    let mut expected: BTreeSet<char> = "BCRYIUDTMOSEc".chars().collect();
    if major >= 15 {
        expected.extend("bPKr".chars());
    }
    // PostgreSQL 18 checks whether a transaction over logical_decoding_work_mem has
    // already aborted and discards it instead of streaming it, so the rolled-back one is
    // never started and needs no Stream Abort.
    if (15..18).contains(&major) {
        expected.insert('A');
    }
    // PostgreSQL 14 streamed the aborted transaction in every run but one, under a loaded
    // machine's full matrix: whether it is streamed before its abort is decoded is not
    // certain there, so its Stream Abort may be missing (never anything else).
    let optional: BTreeSet<char> = if major == 14 {
        BTreeSet::from(['A'])
    } else {
        BTreeSet::new()
    };
    let unexpected: BTreeSet<char> = tags
        .difference(&expected)
        .filter(|t| !optional.contains(t))
        .copied()
        .collect();
    let missing: BTreeSet<char> = expected.difference(&tags).copied().collect();
    assert!(
        unexpected.is_empty() && missing.is_empty(),
        "message types seen on PostgreSQL {major}: {tags:?}; unexpected {unexpected:?}, missing {missing:?}"
    );
    assert_eq!(
        stream_abort_with_lsn,
        (16..18).contains(&major),
        "Stream Abort carries abort_lsn/abort_time exactly with protocol 4 (16+)"
    );
}
