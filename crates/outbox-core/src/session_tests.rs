//! The session's rules on hand-built pgoutput messages: what is sent, dead-lettered and
//! confirmed, and when. (The simulator runs the same rules over seeded histories.)

use super::*;
use crate::budget::InFlightCaps;
use crate::emit::EmitMapper;
use crate::error::RowErrorKind;
use crate::mapping::TableSpec;
use crate::pgtype;
use crate::shutdown::BeforeBadRow;
use crate::topic::TopicName;
use bytes::Bytes;
use pgoutput::{Begin, Column, Commit, ReplicaIdentity, TupleValue};

#[derive(Default)]
struct Seen {
    dead: Vec<RowErrorKind>,
    /// When each ack was reported.
    acked_at: Vec<i64>,
}

impl Observe for Seen {
    fn dead_lettered(&mut self, error: &RowError, _topic: &TopicName) {
        self.dead.push(error.kind());
    }
    fn acked(&mut self, _: i64, acked_at_unix_micros: i64) {
        self.acked_at.push(acked_at_unix_micros);
    }
}

fn rules(policy: BadRowPolicy) -> CoreConfig {
    let topic = Arc::new(crate::topic::TopicTemplate::default());
    CoreConfig {
        table: TableSpec::default(),
        relay_table: true,
        emit: Some(EmitMapper::new("outbox", topic).expect("mapper")),
        dead_letter_topic: TopicName::parse("dlq").expect("topic"),
        bad_row_policy: policy,
        max_message_bytes: 1 << 20,
        caps: InFlightCaps {
            max_messages: 100,
            max_bytes: usize::MAX,
        },
        idle_flush: true,
        former_partitions: Vec::new(),
    }
}

fn core(policy: BadRowPolicy, watch_publication: bool) -> SessionCore<Seen> {
    let start = ReplayStart {
        timeline: 1,
        start: Lsn(100),
        server_end: Lsn(100),
        claim: None,
        fingerprint: 1,
        foreign_writer: false,
        mark_every: 0,
        tracked_rows: usize::MAX,
        new_lineage: 7,
        doubt_lineage: 8,
    };
    SessionCore::new(rules(policy), start, watch_publication, Seen::default())
}

fn col(name: &str, type_oid: u32) -> Column {
    Column::new(name, type_oid)
}

fn relation(rel_id: u32, name: &str, columns: Vec<Column>) -> Relation {
    Relation {
        xid: None,
        rel_id,
        namespace: "public".to_owned(),
        name: name.to_owned(),
        replica_identity: ReplicaIdentity::Default,
        columns,
    }
}

fn outbox_columns() -> Vec<Column> {
    vec![
        col("id", pgtype::UUID),
        col("aggregate_type", pgtype::TEXT),
        col("aggregate_id", pgtype::TEXT),
        col("event_type", pgtype::TEXT),
        col("payload", pgtype::JSONB),
    ]
}

fn t(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn row(agg: Option<&str>) -> TupleData {
    TupleData {
        columns: vec![
            t("0b7e6a52-9d4f-4c1e-8f6a-1b2c3d4e5f60"),
            t("Order"),
            agg.map_or(TupleValue::Null, t),
            t("Created"),
            t("{}"),
        ],
    }
}

fn insert(rel_id: u32, tuple: TupleData) -> LogicalMessage {
    LogicalMessage::Insert(Insert {
        xid: None,
        rel_id,
        new_tuple: tuple,
    })
}

fn begin(commit: u64) -> LogicalMessage {
    LogicalMessage::Begin(Begin {
        final_lsn: Lsn(commit),
        commit_time: PgTimestamp(1_000),
        xid: u32::try_from(commit).unwrap_or(0),
    })
}

fn commit(commit: u64, end: u64) -> LogicalMessage {
    LogicalMessage::Commit(Commit {
        flags: 0,
        commit_lsn: Lsn(commit),
        end_lsn: Lsn(end),
        commit_time: PgTimestamp(1_000),
    })
}

fn emitted(transactional: bool, lsn: u64) -> LogicalMessage {
    LogicalMessage::Message(Message {
        xid: None,
        flags: u8::from(transactional),
        lsn: Lsn(lsn),
        prefix: "outbox".to_owned(),
        content: Bytes::from_static(
            br#"{"id":"e1","aggregate_type":"Order","aggregate_id":"7","event_type":"E","payload":{}}"#,
        ),
    })
}

const NOW: PgTimestamp = PgTimestamp(5_000);

fn feed(c: &mut SessionCore<Seen>, m: LogicalMessage) {
    assert_eq!(c.on_message(m, NOW).expect("message"), After::Nothing);
}

/// Takes every queued record as the producer would, queued.
fn send_all(c: &mut SessionCore<Seen>) -> Vec<(Ticket, OutboxRecord)> {
    let mut out = Vec::new();
    while let Some(s) = c.take_send() {
        let (ticket, record) = (s.ticket, s.record.clone());
        c.sent(s, Sent::Queued).expect("sent");
        out.push((ticket, record));
    }
    out
}

fn with_outbox(policy: BadRowPolicy) -> SessionCore<Seen> {
    let mut c = core(policy, false);
    c.on_relation(&relation(1, "outbox", outbox_columns()), None)
        .expect("relation");
    c
}

#[test]
fn confirmed_only_at_the_end_of_a_transaction_whose_rows_are_all_acked() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    feed(&mut c, insert(1, row(Some("b"))));
    assert!(
        !c.may_stop(),
        "a shutdown finishes the open transaction first"
    );
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].1.key.as_deref(), Some(&b"a"[..]));
    assert_eq!(c.advance(), None, "nothing acked");
    c.on_delivery(sent[1].0, true, 7).expect("ack");
    assert_eq!(c.advance(), None, "one row of the transaction unacked");
    c.on_delivery(sent[0].0, true, 8).expect("ack");
    assert_eq!(
        c.advance(),
        Some(Lsn(224)),
        "its end_lsn, never commit_lsn or +1"
    );
    assert!(c.may_stop());
    assert_eq!(c.observer().acked_at, [7, 8], "each report's own time");
}

#[test]
fn a_keepalive_moves_the_position_only_when_nothing_is_open_or_unacked() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    c.on_keepalive(Lsn(500)).expect("keepalive");
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    c.on_keepalive(Lsn(600)).expect("keepalive");
    assert_eq!(c.advance(), None, "unacked: the keepalive does not pass it");
    c.on_delivery(sent[0].0, true, 0).expect("ack");
    assert_eq!(c.advance(), Some(Lsn(224)));
    c.on_keepalive(Lsn(700)).expect("keepalive");
    assert_eq!(c.advance(), Some(Lsn(700)));
}

#[test]
fn a_failed_delivery_freezes_the_position() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    for (commit_lsn, agg) in [(200, "a"), (300, "b")] {
        feed(&mut c, begin(commit_lsn));
        feed(&mut c, insert(1, row(Some(agg))));
        feed(&mut c, commit(commit_lsn, commit_lsn + 24));
    }
    let sent = send_all(&mut c);
    c.on_delivery(sent[0].0, false, 0).expect("report");
    c.on_delivery(sent[1].0, true, 0).expect("report");
    c.on_keepalive(Lsn(900)).expect("keepalive");
    assert_eq!(c.advance(), None);
}

#[test]
fn a_bad_row_is_dead_lettered_in_its_transaction_or_stops_before_it() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(None)));
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    assert_eq!(&*sent[0].1.topic, "dlq");
    assert_eq!(c.observer().dead, vec![RowErrorKind::NullAggregateId]);
    assert_eq!(c.advance(), None, "the dead letter is unacked");
    c.on_delivery(sent[0].0, true, 0).expect("ack");
    assert_eq!(c.advance(), Some(Lsn(224)));

    let mut c = with_outbox(BadRowPolicy::Stop);
    feed(&mut c, begin(200));
    match c.on_message(insert(1, row(None)), NOW) {
        Err(SessionError::BadRow { commit_lsn, .. }) => assert_eq!(commit_lsn, Lsn(200)),
        other => panic!("{other:?}"),
    }
    assert!(c.observer().dead.is_empty(), "stop dead-letters nothing");
}

#[test]
fn skipping_a_bad_row_by_hand_is_safe_only_once_everything_before_it_is_acked_and_confirmed() {
    let mut c = core(BadRowPolicy::Stop, true);
    c.on_relation(&relation(1, "outbox", outbox_columns()), None)
        .expect("relation");
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    feed(&mut c, commit(200, 224));
    feed(&mut c, begin(300));
    feed(&mut c, insert(1, row(Some("b"))));
    assert!(matches!(
        c.on_message(insert(1, row(None)), NOW),
        Err(SessionError::BadRow { .. })
    ));
    let sent = send_all(&mut c);
    let unacked = BeforeBadRow::Unacked {
        confirmed: Lsn(100),
    };
    assert_eq!(c.before_bad_row(), unacked, "nothing acked");
    // The bad transaction's own row does not matter: the advance skips it anyway.
    c.on_delivery(sent[0].0, true, 0).expect("ack");
    c.advance();
    assert_eq!(
        c.before_bad_row(),
        unacked,
        "acked, but no look vouched for it"
    );
    let acked = c.watermark();
    c.raise_cap(acked);
    c.advance();
    assert_eq!(c.before_bad_row(), BeforeBadRow::Delivered);
}

#[test]
fn a_record_the_producer_refuses_as_too_large_becomes_a_dead_letter() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    let send = c.take_send().expect("queued");
    c.sent(send, Sent::TooLarge { size: 5 << 20 })
        .expect("sent");
    let dead = c.take_send().expect("its dead letter");
    assert_eq!(&*dead.record.topic, "dlq");
    c.sent(dead, Sent::TooLarge { size: 5 << 20 })
        .expect_err("a dead letter that does not fit stops the session");
    assert_eq!(c.observer().dead, Vec::<RowErrorKind>::new());
}

#[test]
fn a_non_transactional_message_holds_the_position_until_acked() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    feed(&mut c, commit(200, 224));
    feed(&mut c, emitted(false, 250));
    let sent = send_all(&mut c);
    assert_eq!(sent.len(), 2);
    c.on_delivery(sent[0].0, true, 0).expect("ack");
    c.on_keepalive(Lsn(400)).expect("keepalive");
    assert_eq!(c.advance(), Some(Lsn(224)), "not past the unacked message");
    c.on_delivery(sent[1].0, true, 0).expect("ack");
    c.on_keepalive(Lsn(400)).expect("keepalive");
    assert_eq!(c.advance(), Some(Lsn(400)));
}

#[test]
fn the_position_waits_for_a_matching_look_at_the_publication() {
    let mut c = core(BadRowPolicy::DeadLetter, true);
    c.on_relation(&relation(1, "outbox", outbox_columns()), None)
        .expect("relation");
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    c.on_delivery(sent[0].0, true, 0).expect("ack");
    assert_eq!(c.advance(), None, "acked, but no look since");
    let acked = c.watermark();
    c.raise_cap(acked);
    assert_eq!(c.advance(), Some(Lsn(224)));
    c.on_keepalive(Lsn(900)).expect("keepalive");
    assert_eq!(c.advance(), None, "past the look: wait for the next");
}

#[test]
fn partitions_are_bound_by_the_catalog_and_other_tables_counted() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    let mut reordered = outbox_columns();
    reordered.reverse();
    let part = relation(2, "outbox_p1", reordered.clone());
    assert!(c.asks_parent(&part));
    let role = c.on_relation(&part, Some(true)).expect("partition");
    assert_eq!(role, RelationRole::Outbox, "the relay checks its columns");
    let detached = relation(3, "outbox_old", reordered);
    match c.on_relation(&detached, Some(false)) {
        Err(SessionError::OutboxLikeRelation { relation, .. }) => {
            assert_eq!(relation, "public.outbox_old");
        }
        other => panic!("{other:?}"),
    }
    // Named by the operator as a partition detached or dropped since its rows were written.
    c.cfg.former_partitions = vec!["public.outbox_old".into()];
    let role = c
        .on_relation(&detached, Some(false))
        .expect("a former partition");
    assert_eq!(role, RelationRole::Outbox);
    let other = relation(4, "audit", vec![col("k", pgtype::INT4)]);
    let role = c.on_relation(&other, Some(false)).expect("other table");
    assert_eq!(role, RelationRole::Ignored);
    feed(&mut c, begin(200));
    let mut tuple = row(Some("a"));
    tuple.columns.reverse();
    feed(&mut c, insert(2, tuple));
    feed(
        &mut c,
        insert(
            4,
            TupleData {
                columns: vec![t("1")],
            },
        ),
    );
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    assert_eq!(
        sent.len(),
        1,
        "the partition's row; the other table's is counted"
    );
    assert_eq!(sent[0].1.key.as_deref(), Some(&b"a"[..]));
    let mut counted = Vec::new();
    c.take_ignored_rows(|name, n| counted.push((name.to_owned(), n)));
    assert_eq!(counted, vec![("public.audit".to_owned(), 1)]);
}

#[test]
fn a_guard_message_asks_for_a_look_naming_its_transaction() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    let guard = LogicalMessage::Message(Message {
        xid: None,
        flags: 1,
        lsn: Lsn(210),
        prefix: PUBLICATION_GUARD_PREFIX.to_owned(),
        content: Bytes::new(),
    });
    assert_eq!(
        c.on_message(guard, NOW).expect("guard"),
        After::LookAtPublication {
            commit: Some((Lsn(200), PgTimestamp(1_000)))
        }
    );
}

#[test]
fn a_dead_letter_refused_as_too_large_stops_before_its_row() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(None)));
    feed(&mut c, commit(200, 224));
    let dead = c.take_send().expect("the dead letter");
    c.sent(dead, Sent::TooLarge { size: 5 << 20 })
        .expect_err("nothing can replace it");
    c.on_keepalive(Lsn(900)).expect("keepalive");
    assert_eq!(c.advance(), None, "never past the row that went nowhere");
}

fn truncated(len: usize, kind: Truncated) -> TruncatedMessage {
    TruncatedMessage { len, kind }
}

fn truncated_insert(rel_id: u32, leading: usize) -> TruncatedMessage {
    let mut tuple = row(Some("a"));
    tuple.columns.truncate(leading);
    truncated(
        300 << 20,
        Truncated::Insert {
            xid: None,
            rel_id,
            column_count: 5,
            leading: tuple,
        },
    )
}

fn truncated_message(prefix: Option<&str>, transactional: bool) -> TruncatedMessage {
    truncated(
        300 << 20,
        Truncated::Message {
            xid: None,
            flags: u8::from(transactional),
            lsn: Lsn(210),
            prefix: prefix.map(str::to_owned),
            content_len: prefix.map(|_| 300 << 20),
        },
    )
}

fn feed_truncated(c: &mut SessionCore<Seen>, m: TruncatedMessage) {
    assert_eq!(c.on_truncated(m, NOW).expect("truncated"), After::Nothing);
}

#[test]
fn an_outbox_row_read_through_for_its_size_is_dead_lettered_with_its_leading_columns() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed(&mut c, insert(1, row(Some("a"))));
    feed_truncated(&mut c, truncated_insert(1, 4));
    feed(&mut c, insert(1, row(Some("b"))));
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    assert_eq!(
        sent.len(),
        3,
        "every row: published, dead-lettered, published"
    );
    let dead = &sent[1].1;
    assert_eq!(&*dead.topic, "dlq");
    assert_eq!(c.observer().dead, vec![RowErrorKind::Oversize]);
    assert_eq!(
        dead.key.as_deref(),
        Some(&b"a"[..]),
        "the aggregate id was kept"
    );
    assert_eq!(
        dead.header("id").map(|v| &v[..]),
        Some(&b"0b7e6a52-9d4f-4c1e-8f6a-1b2c3d4e5f60"[..])
    );
    assert_eq!(
        dead.header(crate::header::OMITTED_COLUMNS).map(|v| &v[..]),
        Some(&b"payload"[..]),
        "the column not read is listed, not shown as null"
    );
    let error = dead.header(crate::header::ERROR).expect("error header");
    let error = std::str::from_utf8(error).expect("utf-8");
    assert!(error.contains("314572800 bytes"), "{error}");
    assert!(error.contains("OUTBOXD_MAX_MESSAGE_BYTES"), "{error}");
    assert_eq!(&*sent[2].1.topic, &*sent[0].1.topic);
    for (ticket, _) in &sent {
        c.on_delivery(*ticket, true, 0).expect("ack");
    }
    assert_eq!(
        c.advance(),
        Some(Lsn(224)),
        "the slot moves past it once dealt with"
    );
}

#[test]
fn an_outbox_row_read_through_for_its_size_stops_under_stop_naming_it() {
    let mut c = with_outbox(BadRowPolicy::Stop);
    feed(&mut c, begin(200));
    match c.on_truncated(truncated_insert(1, 1), NOW) {
        Err(SessionError::BadRow {
            error,
            commit_lsn,
            skip_to,
        }) => {
            assert_eq!(commit_lsn, Lsn(200));
            assert_eq!(skip_to, Lsn(201), "its commit record starts at 200");
            assert_eq!(error.kind(), RowErrorKind::Oversize);
            assert_eq!(
                error.event_id(),
                Some("0b7e6a52-9d4f-4c1e-8f6a-1b2c3d4e5f60")
            );
        }
        other => panic!("{other:?}"),
    }
    // Without even its id: still refused, never passed over.
    let mut c = with_outbox(BadRowPolicy::Stop);
    feed(&mut c, begin(200));
    assert!(matches!(
        c.on_truncated(truncated_insert(1, 0), NOW),
        Err(SessionError::BadRow { .. })
    ));
}

#[test]
fn what_would_be_ignored_whole_is_ignored_read_through() {
    let mut c = with_outbox(BadRowPolicy::Stop);
    c.on_relation(
        &relation(2, "other", vec![col("x", pgtype::TEXT)]),
        Some(false),
    )
    .expect("relation");
    feed(&mut c, begin(200));
    feed_truncated(&mut c, truncated_insert(2, 0));
    feed_truncated(
        &mut c,
        truncated(
            1 << 30,
            Truncated::Update {
                xid: None,
                rel_id: 1,
            },
        ),
    );
    feed_truncated(
        &mut c,
        truncated(
            1 << 30,
            Truncated::Delete {
                xid: None,
                rel_id: 1,
            },
        ),
    );
    feed_truncated(&mut c, truncated_message(Some("other"), true));
    feed_truncated(&mut c, truncated_message(None, true));
    feed(&mut c, commit(200, 224));
    assert!(c.take_send().is_none());
    assert_eq!(c.advance(), Some(Lsn(224)));
    let mut ignored = Vec::new();
    c.take_ignored_rows(|name, n| ignored.push((name.to_owned(), n)));
    assert_eq!(ignored, vec![("public.other".to_owned(), 1)]);
}

#[test]
fn an_emitted_message_of_ours_read_through_is_a_bad_row() {
    let mut c = with_outbox(BadRowPolicy::DeadLetter);
    feed(&mut c, begin(200));
    feed_truncated(&mut c, truncated_message(Some("outbox"), true));
    feed(&mut c, commit(200, 224));
    let sent = send_all(&mut c);
    assert_eq!(sent.len(), 1);
    let dead = &sent[0].1;
    assert_eq!(&*dead.topic, "dlq");
    assert_eq!(dead.value, None);
    assert_eq!(
        dead.header(crate::header::OMITTED_COLUMNS).map(|v| &v[..]),
        Some(&b"content"[..])
    );
    assert_eq!(c.observer().dead, vec![RowErrorKind::Oversize]);

    // Non-transactional too (it would be published in a transaction of its own). Its
    // position is where its record ends and the next one may start: the slot advanced past
    // it alone goes there, not one further.
    let mut c = with_outbox(BadRowPolicy::Stop);
    match c.on_truncated(truncated_message(Some("outbox"), false), NOW) {
        Err(SessionError::BadRow { skip_to, .. }) => assert_eq!(skip_to, Lsn(210)),
        other => panic!("{other:?}"),
    }
    // The publication guard's, whole or not, is a look at the publication.
    let mut c = with_outbox(BadRowPolicy::Stop);
    feed(&mut c, begin(200));
    assert!(matches!(
        c.on_truncated(truncated_message(Some(PUBLICATION_GUARD_PREFIX), true), NOW),
        Ok(After::LookAtPublication { .. })
    ));
}

/// A replay from 100 under a claim marking the transaction at 500 (`xid` 500, ending at
/// 510), with room for `cap` messages in flight.
fn replaying(mark_time: i64, cap: usize) -> SessionCore<Seen> {
    let mut claim = DeliveredPosition::at(1, Lsn(50), 1);
    let mark = TxnId {
        commit_lsn: Lsn(500),
        xid: 500,
        commit_time: mark_time,
    };
    claim.push_mark(mark, Lsn(510));
    claim.lsn = Lsn(510);
    let start = ReplayStart {
        timeline: 1,
        start: Lsn(100),
        server_end: Lsn(1_000),
        claim: Some((claim, 42)),
        fingerprint: 1,
        foreign_writer: false,
        mark_every: 0,
        tracked_rows: usize::MAX,
        new_lineage: 7,
        doubt_lineage: 8,
    };
    let mut cfg = rules(BadRowPolicy::DeadLetter);
    cfg.caps.max_messages = cap;
    let mut c = SessionCore::new(cfg, start, false, Seen::default());
    c.on_relation(&relation(1, "outbox", outbox_columns()), None)
        .expect("relation");
    c
}

/// Two transactions of 2 rows before the mark, read as the relay reads: room first.
fn read_before_the_mark(c: &mut SessionCore<Seen>) {
    for (at, end) in [(200, 224), (300, 324)] {
        for m in [
            begin(at),
            insert(1, row(Some("a"))),
            insert(1, row(Some("b"))),
        ] {
            assert!(c.make_room().expect("room"));
            feed(c, m);
        }
        feed(c, commit(at, end));
    }
    assert!(c.spilled(), "4 held against a cap of 3");
    assert!(c.take_send().is_none(), "a spilled hold publishes nothing");
    assert_eq!(c.held_len(), 1, "the first held record stays");
    assert_eq!(
        c.advance(),
        None,
        "nothing confirmed past it before the proof"
    );
}

#[test]
fn a_spilled_hold_is_confirmed_only_once_its_mark_proves_it() {
    let mut c = replaying(1_000, 3);
    read_before_the_mark(&mut c);
    feed(&mut c, begin(500));
    feed(&mut c, commit(500, 510));
    assert!(!c.spilled());
    assert_eq!(c.advance(), Some(Lsn(510)));

    // Another history at the mark: what was dropped is not in Kafka, and the session
    // ends with the slot where it started.
    let mut c = replaying(999, 3);
    read_before_the_mark(&mut c);
    let e = c.on_message(begin(500), NOW).expect_err("unproven");
    assert!(
        matches!(e, SessionError::ReplayUnproven(Doubt::Mismatch)),
        "{e}"
    );
    assert_eq!(c.advance(), None);
    assert_eq!(c.confirmed(), Lsn(100));
}

/// A review found the relay stuck for good when the record a spill keeps back fills the
/// caps alone (a cap of 1): it gets no report before the proof, which was never read.
#[test]
fn a_spill_at_a_cap_of_one_still_reads_on_to_its_mark() {
    let mut c = replaying(1_000, 1);
    for m in [
        begin(200),
        insert(1, row(Some("a"))),
        insert(1, row(Some("b"))),
    ] {
        assert!(
            c.make_room().expect("room"),
            "the hold kept back blocks nothing"
        );
        feed(&mut c, m);
    }
    feed(&mut c, commit(200, 224));
    assert!(c.spilled());
    assert!(c.make_room().expect("room"));
    feed(&mut c, begin(500));
    feed(&mut c, commit(500, 510));
    assert_eq!(c.advance(), Some(Lsn(510)));
}

/// Either way a replay was not proven, the next session must skip nothing: a partial
/// transaction whose rows do not match its record would otherwise meet the same record
/// the same way in every session (exactly-once carries no claim of its own between them).
#[test]
fn a_partial_replay_that_did_not_match_is_doubted_like_a_spill() {
    let partial = |reason| {
        SessionError::PartialReplay(crate::replay::PartialMismatch {
            commit_lsn: Lsn(100),
            recorded: 3,
            read: 2,
            reason,
        })
    };
    assert!(partial(Doubt::PartialDigest).doubts_replay());
    assert!(partial(Doubt::PartialRows).doubts_replay());
    assert!(SessionError::ReplayUnproven(Doubt::Mismatch).doubts_replay());
    assert!(!SessionError::Protocol("x".into()).doubts_replay());
}
