use super::*;

#[test]
fn backfill_state_round_trips_and_unreadable_is_unfinished() {
    let state = BackfillState {
        condition: "status = 'pending'".into(),
        recreate_lost_slot: true,
        snapshot: Some("750:760:752".into()),
        consistent_point: Some(Lsn(0x1_0000_00A0)),
        slot_created_at: Some(849_000_000_000_000),
        after: Some(("2026-12-03 16:00:00.1+00".into(), "a-b".into())),
        published: 1500,
        dead_lettered: 2,
        done: false,
        publication: Some(PublicationSeen {
            identity: "16384:2:0:t,f,f,f,f,t".into(),
            at_unix_ms: 1_796_000_000_000,
            wal_lsn: Lsn(0x1_0000_0090),
        }),
    };
    let read = BackfillState::from_json(state.to_json().as_bytes()).unwrap();
    assert_eq!(read, state);
    let id = SlotIdentity {
        cluster: String::new(),
        system_id: "7312".into(),
        database: "shop".into(),
        slot: "outboxd".into(),
    };
    let mut scan = SlotScan::new(&id);
    scan.see(id.backfill_key().as_bytes(), Some(b"garbage"));
    let records = scan.records(&id, true).unwrap();
    assert!(records.backfill.is_some_and(|b| !b.done));
}

#[test]
fn record_round_trips_and_dates_render() {
    let id = SlotIdentity {
        cluster: String::new(),
        system_id: "7312".into(),
        database: "shop".into(),
        slot: "outboxd".into(),
    };
    let r = ProgressRecord {
        claim: DeliveredPosition {
            timeline: 3,
            lsn: Lsn(0x1_0000_00A0),
            base: Lsn(0x1_0000_0010),
            marks: vec![TxnMark {
                seq: 4,
                commit_lsn: Lsn(0x1_0000_0050),
                end_lsn: Lsn(0x1_0000_00A0),
                xid: 771,
                commit_time: 817_000_000_123_456,
            }],
            partial: Some(outbox_core::PartialTxn {
                txn: outbox_core::TxnId {
                    commit_lsn: Lsn(0x1_0000_0100),
                    xid: 772,
                    commit_time: 817_000_000_223_456,
                },
                rows: 12,
                digest: Some(0x8000_0000_0000_0001),
            }),
            fingerprint: 0xfeed_beef_0000_0001,
            since: Some(817_000_000_123_456),
        },
        recorded_at_unix_ms: 1_764_590_400_000,
        slot_created: true,
        lineage: 0x0123_4567_89ab_cdef,
        writer: "host/1/2".into(),
        publication: Some(PublicationSeen {
            identity: "16390.724 truetruetrue r:16391.724".into(),
            at_unix_ms: 1_764_590_399_000,
            wal_lsn: Lsn(0x1_0000_0200),
        }),
    };
    let json = r.to_json(&id);
    assert_eq!(ProgressRecord::from_json(json.as_bytes()), Ok(r.clone()));
    // A partial from before row digests reads with none (and so proves nothing).
    let undigested = json.replace(r#","digest":"8000000000000001""#, "");
    assert_ne!(undigested, json);
    let read = ProgressRecord::from_json(undigested.as_bytes()).unwrap();
    assert_eq!(
        read.claim.partial.map(|p| (p.rows, p.digest)),
        Some((12, None))
    );
    let mut whole = r.clone();
    whole.claim.partial = None;
    assert_eq!(
        ProgressRecord::from_json(whole.to_json(&id).as_bytes()),
        Ok(whole)
    );
    assert_eq!(id.key(), "7312/shop/outboxd");
    let named = SlotIdentity {
        cluster: "staging".into(),
        ..id
    };
    assert_eq!(named.key(), "staging@7312/shop/outboxd");
    // A version 1 record proves nothing: no marks, no partial transaction.
    let v1 = br#"{"version":1,"system_id":"7312","database":"shop","slot":"outboxd","timeline":1,"confirmed_lsn":"0/10","recorded_at_unix_ms":1,"last_commit_unix_micros":5,"slot_created":true,"partial_commit_lsn":"0/20","partial_rows_acked":3}"#;
    let old = ProgressRecord::from_json(v1).unwrap();
    assert_eq!(
        (
            old.claim.marks.len(),
            old.claim.partial,
            old.claim.fingerprint
        ),
        (0, None, 0)
    );
    assert_eq!(r.recorded_at_text(), "2025-12-01T12:00:00Z");
    // The time to re-publish from is the commit's (2025-11-21), never the write's.
    assert_eq!(r.since_text().as_deref(), Some("2025-11-21T00:26:40Z"));
    assert!(r.republish_text().contains("since 2025-11-21T00:26:40Z"));
    // A record written before `since` existed: its newest mark at or before its
    // position; none, and it cannot say (not the write's time).
    let mut older: serde_json::Value = serde_json::from_str(&json).unwrap();
    older.as_object_mut().unwrap().remove("since");
    let older = ProgressRecord::from_json(older.to_string().as_bytes()).unwrap();
    assert_eq!(older.claim.since, Some(817_000_000_123_456));
    assert_eq!(old.since_text(), None);
    assert!(old.republish_text().starts_with("every outbox row"));
    assert!(ProgressRecord::from_json(b"{}").is_err());
}

#[test]
fn a_copy_named_apart_is_not_another_cluster() {
    let unnamed = SlotIdentity {
        cluster: String::new(),
        system_id: "7312".into(),
        database: "shop".into(),
        slot: "outboxd".into(),
    };
    let named = SlotIdentity {
        cluster: "staging".into(),
        ..unnamed.clone()
    };
    let other = SlotIdentity {
        system_id: "9999".into(),
        ..unnamed.clone()
    };
    let record = ProgressRecord::now(1, Lsn(0x10));
    let mut scan = SlotScan::new(&named);
    for id in [&unnamed, &other] {
        scan.see(id.key().as_bytes(), Some(record.to_json(id).as_bytes()));
    }
    let found = scan.records(&named, true).unwrap();
    assert_eq!(found.ours, None);
    let others: Vec<&str> = found
        .other_clusters
        .iter()
        .map(|(s, _)| s.as_str())
        .collect();
    assert_eq!(
        others,
        ["9999"],
        "the unnamed copy of 7312 is not another cluster"
    );
    // Its record is this cluster's under its old name: no look in it, none to
    // compare with; a look in it, and the new name starts from it.
    assert_eq!(found.renamed.len(), 1);
    assert_eq!(found.last_look(), None);
    let look = PublicationSeen {
        identity: "16384.750 truetruefalse r:".into(),
        at_unix_ms: 1_764_000_000_000,
        wal_lsn: Lsn(0x10),
    };
    let mut looked = record.clone();
    looked.publication = Some(look.clone());
    let mut scan = SlotScan::new(&named);
    scan.see(
        unnamed.key().as_bytes(),
        Some(looked.to_json(&unnamed).as_bytes()),
    );
    let found = scan.records(&named, true).unwrap();
    assert_eq!(found.last_look(), Some(&look));
    // Once the new name has a record of its own, only that one counts.
    let mut scan = SlotScan::new(&named);
    scan.see(
        unnamed.key().as_bytes(),
        Some(looked.to_json(&unnamed).as_bytes()),
    );
    scan.see(
        named.key().as_bytes(),
        Some(record.to_json(&named).as_bytes()),
    );
    assert_eq!(scan.records(&named, true).unwrap().last_look(), None);
}

#[test]
fn an_intent_written_late_does_not_hide_that_the_slot_existed() {
    let id = SlotIdentity {
        cluster: String::new(),
        system_id: "7312".into(),
        database: "shop".into(),
        slot: "outboxd".into(),
    };
    // The winner's record that the slot exists, then the loser's late intent.
    let created = ProgressRecord::now(1, Lsn(0x10));
    let intent = ProgressRecord::before_creation(1, Lsn(0x20));
    let mut scan = SlotScan::new(&id);
    scan.see(id.key().as_bytes(), Some(created.to_json(&id).as_bytes()));
    scan.see(
        id.creating_key().as_bytes(),
        Some(intent.to_json(&id).as_bytes()),
    );
    let found = scan.records(&id, true).unwrap();
    assert_eq!(
        found.slot_existed().map(|r| r.confirmed_lsn()),
        Some(Lsn(0x10))
    );
    assert!(found.creating.is_some());
}
