use super::*;
use outbox_core::{AckError, ShapeError};
use pgrepl::ServerError;

fn server(code: &str, message: &str) -> ReplError {
    ReplError::Server(Box::new(ServerError {
        severity: "ERROR".into(),
        code: code.into(),
        message: message.into(),
        ..ServerError::default()
    }))
}

#[test]
fn a_forged_partial_count_names_who_may_write_the_record_in_one_line() {
    let e = RelayError::from(SessionError::PartialReplay(outbox_core::PartialMismatch {
        commit_lsn: pgoutput::Lsn::ZERO,
        recorded: 5,
        read: 3,
        reason: outbox_core::Doubt::PartialDigest,
    }));
    let text = e.to_string();
    assert!(
        text.contains("outboxd's own Kafka principal to write OUTBOXD_PROGRESS_TOPIC (docs/"),
        "{text}"
    );
    assert!(
        !text.contains("  "),
        "a wrapped literal's indentation: {text}"
    );
}

#[test]
fn a_dropped_publication_on_the_stream_is_permanent_and_names_the_fix() {
    let e = RelayError::from_stream(
        server("42704", "publication \"outbox_pub\" does not exist"),
        "outbox_pub",
    );
    assert!(matches!(e, RelayError::PublicationDropped { .. }), "{e:?}");
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert_eq!(e.exit_code(), 3);
    let text = e.to_string();
    assert!(text.contains("\"outbox_pub\""), "{text}");
    assert!(text.contains("CREATE PUBLICATION outbox_pub"), "{text}");
    // Other stream errors keep their own classification.
    let other = RelayError::from_stream(server("57P01", "terminating connection"), "p");
    assert!(matches!(other, RelayError::Postgres(_)));
    assert_eq!(other.class(), ErrorClass::Retryable);
}

#[test]
fn the_code_that_decided_the_class_is_named() {
    let cases = [
        (
            RelayError::Postgres(server("57P01", "terminating connection")),
            ErrorClass::Retryable,
            Some("SQLSTATE 57P01"),
        ),
        (
            RelayError::Postgres(server("42501", "permission denied")),
            ErrorClass::Permanent,
            Some("SQLSTATE 42501"),
        ),
        (
            RelayError::from_stream(server("42704", "publication \"p\" does not exist"), "p"),
            ErrorClass::Permanent,
            Some("SQLSTATE 42704"),
        ),
        (
            RelayError::Delivery(DeliveryFailure {
                code: RDKafkaErrorCode::TopicAuthorizationFailed,
                message: "denied".into(),
                retriable: false,
            }),
            ErrorClass::Permanent,
            Some("librdkafka TopicAuthorizationFailed"),
        ),
        (
            RelayError::Send(SendError::Other {
                code: RDKafkaErrorCode::RequestTimedOut,
            }),
            ErrorClass::Retryable,
            Some("librdkafka RequestTimedOut"),
        ),
        (
            RelayError::from(SessionError::from(AckError::UnknownTxn { seq: 1 })),
            ErrorClass::Permanent,
            None,
        ),
        (RelayError::StreamClosed, ErrorClass::Retryable, None),
    ];
    for (e, class, code) in cases {
        assert_eq!(e.class(), class, "{e}");
        assert_eq!(
            e.deciding_code().map(|c| c.to_string()).as_deref(),
            code,
            "{e}"
        );
    }
}

#[test]
fn the_text_ends_with_the_remedy_and_its_commands() {
    let e = RelayError::SlotLost {
        slot: "outboxd".into(),
        progress_topic: "outboxd.progress".into(),
        last_confirmed: pgoutput::Lsn(0x16B_3748),
        republish: "the rows committed since 2026-12-04".into(),
    };
    let (text, remedy) = (e.to_string(), e.remedy().unwrap_or_default());
    assert!(
        text.ends_with(&remedy) && text.len() > remedy.len(),
        "{text}"
    );
    assert!(
        remedy.contains("`outboxd init --recreate-lost-slot --backfill \"<SQL condition>\"`"),
        "{remedy}"
    );
    // Re-inserting rows cannot bring back what was emitted: the operator is told.
    let invalidated = RelayError::SlotInvalidated {
        slot: "outboxd".into(),
        reason: "wal_removed".into(),
        since: String::new(),
    };
    let dropped = RelayError::SlotDropped {
        slot: "outboxd".into(),
        since: String::new(),
    };
    // Each way to a new slot over a lost one, and a publication gap a new slot skips.
    let publication = RelayError::PublicationDropped {
        publication: "outbox_pub".into(),
        server: "publication \"outbox_pub\" does not exist".into(),
    };
    let rows = RelayError::RowsBeforeSlot {
        slot: "outboxd".into(),
        table: "public.outbox".into(),
        rows: "has rows",
        history: String::new(),
    };
    let unknown = RelayError::SlotHistoryUnknown {
        slot: "outboxd".into(),
        progress_topic: "outboxd.progress".into(),
        reason: "timed out".into(),
    };
    for lost in [&e, &invalidated, &dropped, &publication, &rows, &unknown] {
        let remedy = lost.remedy().unwrap_or_default();
        assert!(
            remedy.contains("pg_logical_emit_message") && remedy.contains("are lost"),
            "{remedy}"
        );
    }
    assert_eq!(RelayError::StreamClosed.remedy(), None);
    assert_eq!(e.exit_code(), 3);
}

#[test]
fn pure_errors_keep_their_own_class() {
    // The relay and outbox-core agree: an ack-sequence violation stops the relay.
    let ack = AckError::NoOpenTransaction {
        operation: "Commit",
    };
    let relay = RelayError::from(SessionError::from(ack.clone()));
    assert_eq!(relay.class(), ack.class());
    assert_eq!(relay.exit_code(), 1);
}

#[test]
fn the_rules_errors_keep_their_class_exit_code_and_remedy() {
    use ErrorClass::{Permanent, Retryable};
    let row = || RowError::new(outbox_core::RowErrorKind::NullColumn, "id is NULL");
    let cases = [
        (
            SessionError::BadRow {
                error: row(),
                commit_lsn: pgoutput::Lsn(7),
                skip_to: pgoutput::Lsn(8),
            },
            Permanent,
            4,
        ),
        (
            SessionError::DeadLetterTooLarge {
                error: row(),
                size: 9,
            },
            Permanent,
            4,
        ),
        (SessionError::Protocol("x".into()), Permanent, 1),
        (
            SessionError::ReleasedTooLarge {
                topic: "t".into(),
                size: 9,
            },
            Permanent,
            1,
        ),
        (
            SessionError::Shape(ShapeError::WrongTable {
                expected: "public.outbox".into(),
                found: "public.other".into(),
            }),
            Permanent,
            3,
        ),
        (
            SessionError::OutboxLikeRelation {
                relation: "public.outbox_old".into(),
                table: "public.outbox".into(),
            },
            Permanent,
            3,
        ),
        (
            SessionError::PartialReplay(outbox_core::PartialMismatch {
                commit_lsn: pgoutput::Lsn(7),
                recorded: 5,
                read: 3,
                reason: outbox_core::Doubt::PartialRows,
            }),
            Retryable,
            3,
        ),
    ];
    for (e, class, code) in cases {
        let core_text = e.to_string();
        let e = RelayError::from(e);
        assert_eq!((e.class(), e.exit_code()), (class, code), "{e}");
        assert_eq!(e.to_string(), core_text, "the rules' text as it is");
        let remedy = e.remedy().unwrap_or_default();
        assert!(core_text.ends_with(&remedy), "{core_text}");
    }
    let e = RelayError::from(SessionError::DeadLetterTooLarge {
        error: row().with_event_id(Some("e-1")),
        size: 9,
    });
    assert!(
        e.to_string().starts_with(
            "bad outbox row id=e-1: outbox event \"e-1\": id is NULL; its dead-letter record \
             of 9 bytes does not fit OUTBOXD_MAX_MESSAGE_BYTES either"
        ),
        "{e}"
    );
}

#[test]
fn an_expired_transaction_is_retried_and_a_fence_stops_the_relay() {
    let expired = RelayError::Transaction(TxnError::Expired("_FENCED".into()));
    assert_eq!(expired.class(), ErrorClass::Retryable);
    assert!(expired
        .to_string()
        .contains("OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS"));
    let fenced = RelayError::Transaction(TxnError::Fenced("_FENCED".into()));
    assert_eq!(fenced.class(), ErrorClass::Permanent);
    assert_eq!(fenced.exit_code(), 5);
}

#[test]
fn a_bad_row_offers_the_slot_advance_only_when_nothing_before_it_is_unacked() {
    let bad = |before| RelayError::BadRow {
        error: RowError::new(
            outbox_core::RowErrorKind::NullColumn,
            "aggregate_id is NULL",
        ),
        slot: "outboxd".into(),
        commit_lsn: pgoutput::Lsn(0x1000),
        skip_to: pgoutput::Lsn(0x1001),
        before,
    };
    let delivered = bad(BeforeBadRow::Delivered).to_string();
    assert!(
        delivered.contains("SELECT pg_replication_slot_advance('outboxd', '0/1001')"),
        "{delivered}"
    );
    for before in [
        BeforeBadRow::Unacked {
            confirmed: pgoutput::Lsn(0x800),
        },
        BeforeBadRow::Aborted,
    ] {
        let text = bad(before).to_string();
        assert!(!text.contains("pg_replication_slot_advance"), "{text}");
        assert!(
            text.contains("OUTBOXD_BAD_ROW_POLICY=dead-letter"),
            "{text}"
        );
    }
    let unacked = bad(BeforeBadRow::Unacked {
        confirmed: pgoutput::Lsn(0x800),
    })
    .to_string();
    assert!(
        unacked.contains("confirmed at 0/800") && unacked.contains("Start outboxd again"),
        "{unacked}"
    );
}
