use super::*;

fn spec(count: u32) -> ShardSpec {
    ShardSpec {
        index: 0,
        count,
        root_schema: "public".into(),
        root_table: "outbox".into(),
        key_column: "aggregate_id".into(),
        publication_base: "outboxd".into(),
        slot_base: "outboxd".into(),
    }
}

fn layout(parts: &[(&str, u32, u32)]) -> Partitioning {
    Partitioning {
        kind: "p".into(),
        key: Some("HASH (aggregate_id)".into()),
        partitions: parts
            .iter()
            .map(|(name, m, r)| PartitionBound {
                schema: "public".into(),
                name: (*name).into(),
                bound: format!("FOR VALUES WITH (modulus {m}, remainder {r})"),
                // In its shard's publication, as `outboxd init` leaves it.
                publications: name
                    .strip_prefix("outbox_shard_")
                    .map(|i| vec![format!("outboxd_{i}")])
                    .unwrap_or_default(),
            })
            .collect(),
        columns: vec!["id".into(), "aggregate_id".into(), "Payload".into()],
        identity_always: false,
    }
}

/// The publications and slots of shards `0..n`, as `outboxd init` leaves them.
fn made(n: u32) -> ShardObjects {
    let names: Vec<String> = (0..n).map(|i| format!("outboxd_{i}")).collect();
    ShardObjects {
        loose: Vec::new(),
        publications: names.clone(),
        slots: names,
        held: Vec::new(),
        names: Vec::new(),
    }
}

fn loose(name: &str, publications: &[&str]) -> LooseTable {
    LooseTable {
        name: name.into(),
        publications: publications.iter().map(|p| (*p).to_owned()).collect(),
    }
}

fn copy_from(table: &str) -> String {
    format!("INSERT INTO public.outbox (id, aggregate_id, \"Payload\") SELECT id, aggregate_id, \"Payload\" FROM {table} ORDER BY ctid")
}

#[test]
fn the_layout_init_creates_is_accepted() {
    let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    assert_eq!(judge_shard_layout(Some(&l), &spec(2), &made(2)), Ok(()));
}

#[test]
fn a_partition_no_shard_reads_is_refused() {
    // Four partitions, two shards: the rows of remainders 2 and 3 would go nowhere.
    let l = layout(&[
        ("outbox_shard_0", 4, 0),
        ("outbox_shard_1", 4, 1),
        ("outbox_shard_2", 4, 2),
        ("outbox_shard_3", 4, 3),
    ]);
    let e = judge_shard_layout(Some(&l), &spec(2), &made(4)).unwrap_err();
    assert!(
        e.contains("outbox_shard_0 of public.outbox has modulus 4, but OUTBOXD_SHARD_COUNT=2"),
        "{e}"
    );
    // Back to two shards: the statements, in an order that runs. The detached
    // partitions move out of the shards' names (else the next check takes them for
    // stranded tables). The rows of shards 2 and 3, whose slots nothing reads any more,
    // come back through the root; those of shards 0 and 1 were decoded by slots that
    // go on.
    let back = format!(
        "Then, to lay the table out as 2 shards, run: BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL outboxd.partition_change = 'on'; \
        ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_0; \
        ALTER TABLE public.outbox_shard_0 RENAME TO outbox_shard_0_of_4; \
        ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_1; \
        ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_of_4; \
        ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_2; \
        ALTER TABLE public.outbox_shard_2 RENAME TO outbox_shard_2_of_4; \
        ALTER TABLE public.outbox DETACH PARTITION public.outbox_shard_3; \
        ALTER TABLE public.outbox_shard_3 RENAME TO outbox_shard_3_of_4; \
        CREATE TABLE public.outbox_shard_0 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0); \
        ALTER PUBLICATION outboxd_0 ADD TABLE public.outbox_shard_0; \
        CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
        ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1; \
        {}; {}; COMMIT; then run `outboxd init --accept-publication-change` (the transaction \
        changed the shards' publications, as it must: `outboxd run` would stop on that; init \
        records them as they are now) and start outboxd",
        copy_from("public.outbox_shard_2_of_4"),
        copy_from("public.outbox_shard_3_of_4"),
    );
    assert!(e.contains(&back), "{e}");
    // Shards 2 and 3 are gone from the table, not from the server: their slots would
    // keep WAL for ever.
    assert!(
        e.contains("SELECT pg_catalog.pg_drop_replication_slot('outboxd_2'); SELECT pg_catalog.pg_drop_replication_slot('outboxd_3'); DROP PUBLICATION outboxd_2; DROP PUBLICATION outboxd_3;"),
        "{e}"
    );
    assert!(!e.contains("'outboxd_1')"), "{e}");
    // A partition no shard's publication holds is copied back whatever its name.
    let mut unpublished = l.clone();
    unpublished.partitions[0].publications.clear();
    let e = judge_shard_layout(Some(&unpublished), &spec(2), &made(4)).unwrap_err();
    assert!(e.contains("relayed by no shard"), "{e}");
    assert!(e.contains(&copy_from("public.outbox_shard_0_of_4")), "{e}");
    // One held by a publication of a shard beyond the count is copied too: its slot is
    // to be dropped.
    let mut elsewhere = l.clone();
    elsewhere.partitions[0].publications = vec!["outboxd_3".into()];
    let e = judge_shard_layout(Some(&elsewhere), &spec(2), &made(4)).unwrap_err();
    assert!(e.contains(&copy_from("public.outbox_shard_0_of_4")), "{e}");
    // Lowered once before: the names its fix gave are taken, and a rename onto one
    // would fail the transaction.
    let mut again = made(4);
    again.names = vec!["outbox_shard_0_of_4".into(), "outbox_shard_0_of_4_2".into()];
    let e = judge_shard_layout(Some(&l), &spec(2), &again).unwrap_err();
    assert!(
        e.contains("ALTER TABLE public.outbox_shard_0 RENAME TO outbox_shard_0_of_4_3;"),
        "{e}"
    );
    let renamed = layout(&[("outbox_p0", 2, 0), ("outbox_shard_1", 2, 1)]);
    let e = judge_shard_layout(Some(&renamed), &spec(2), &made(2)).unwrap_err();
    assert!(e.contains("RENAME TO outbox_shard_0"), "{e}");
}

#[test]
fn slots_of_shards_beyond_the_count_are_named_with_their_drops() {
    assert_eq!(judge_leftover_shards(&spec(4), &made(4)), None);
    let w = judge_leftover_shards(&spec(2), &made(4)).unwrap();
    assert!(
        w.starts_with("slots outboxd_2, outboxd_3 and publications outboxd_2, outboxd_3 of shards beyond OUTBOXD_SHARD_COUNT=2"),
        "{w}"
    );
    assert!(
        w.ends_with("run: SELECT pg_catalog.pg_drop_replication_slot('outboxd_2'); SELECT pg_catalog.pg_drop_replication_slot('outboxd_3'); DROP PUBLICATION outboxd_2; DROP PUBLICATION outboxd_3;"),
        "{w}"
    );
    // Named like a shard's only when `<base>_<digits>`.
    let mut other = made(2);
    other.slots.push("outboxd_2_old".into());
    assert_eq!(judge_leftover_shards(&spec(2), &other), None);
}

#[test]
fn a_detached_partition_is_kept_only_where_its_shards_publication_holds_it() {
    // Remainder 1 split in two, its old partition detached and kept: a detached
    // partition stays in its publication, so its rows were decoded; it is set aside and
    // the partition made anew.
    let split = layout(&[
        ("outbox_shard_0", 2, 0),
        ("outbox_m4_1", 4, 1),
        ("outbox_m4_3", 4, 3),
    ]);
    let mut objects = made(2);
    objects.loose = vec![loose("outbox_shard_1", &["outboxd_1"])];
    let e = judge_shard_layout(Some(&split), &spec(2), &objects).unwrap_err();
    let back = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL outboxd.partition_change = 'on'; ALTER TABLE public.outbox DETACH PARTITION public.outbox_m4_1; \
        ALTER TABLE public.outbox DETACH PARTITION public.outbox_m4_3; \
        ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_detached; \
        CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
        ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1; \
        {}; {}; COMMIT;",
        copy_from("public.outbox_m4_1"),
        copy_from("public.outbox_m4_3")
    );
    assert!(e.contains(&back), "{e}");
    assert!(
        e.contains(
            "The rows of public.outbox_shard_1_detached were relayed by a shard that remains"
        ),
        "{e}"
    );
    assert!(
        !e.contains(&copy_from("public.outbox_shard_1_detached")),
        "{e}"
    );
    // The same name held by a table no shard's publication has (a partition of modulus
    // 4 made under it, then detached with its sibling `outbox_shard_3`): its rows were
    // decoded by no slot. Kept as it is, they never would be; both are copied back.
    let gap = layout(&[("outbox_shard_0", 2, 0)]);
    let mut objects = made(2);
    objects.loose = vec![loose("outbox_shard_1", &[]), loose("outbox_shard_3", &[])];
    let e = judge_shard_layout(Some(&gap), &spec(2), &objects).unwrap_err();
    let back = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL outboxd.partition_change = 'on'; ALTER TABLE public.outbox_shard_3 RENAME TO outbox_shard_3_detached; \
        ALTER TABLE public.outbox_shard_1 RENAME TO outbox_shard_1_detached; \
        CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1); \
        ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1; \
        {}; {}; COMMIT;",
        copy_from("public.outbox_shard_3_detached"),
        copy_from("public.outbox_shard_1_detached")
    );
    assert!(e.contains(&back), "{e}");
    // In another shard's publication is not in its own.
    objects.loose[0] = loose("outbox_shard_1", &["outboxd_0"]);
    let e = judge_shard_layout(Some(&gap), &spec(2), &objects).unwrap_err();
    assert!(
        e.contains(&copy_from("public.outbox_shard_1_detached")),
        "{e}"
    );
    // In its own shard's publication, but that shard's slot is gone: nothing decoded
    // them for a shard that remains.
    objects.loose[0] = loose("outbox_shard_1", &["outboxd_1"]);
    objects.slots.retain(|s| s != "outboxd_1");
    let e = judge_shard_layout(Some(&gap), &spec(2), &objects).unwrap_err();
    assert!(
        e.contains(&copy_from("public.outbox_shard_1_detached")),
        "{e}"
    );
}

#[test]
fn a_table_detached_from_another_modulus_is_not_attached_at_the_counts() {
    // `outbox_shard_0` was remainder 0 of 2, detached; the count is now 3. Its rows are
    // those of `hash % 2 = 0`, which an ATTACH at (3, 0) refuses: a fix that attached it
    // failed every time it was run (the simulator's shard seed 0). It is set aside (its
    // shard's slot decoded its rows) and remainder 0 made anew.
    let l = layout(&[("outbox_shard_1", 3, 1), ("outbox_shard_2", 3, 2)]);
    let mut objects = made(3);
    objects.loose = vec![loose("outbox_shard_0", &["outboxd_0"])];
    let e = judge_shard_layout(Some(&l), &spec(3), &objects).unwrap_err();
    assert!(!e.contains("ATTACH"), "{e}");
    assert!(
        e.contains("ALTER TABLE public.outbox_shard_0 RENAME TO outbox_shard_0_detached; \
            CREATE TABLE public.outbox_shard_0 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 3, REMAINDER 0); \
            ALTER PUBLICATION outboxd_0 ADD TABLE public.outbox_shard_0; COMMIT;"),
        "{e}"
    );
}

#[test]
fn a_stranded_table_named_like_a_shard_is_refused_on_its_own() {
    let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    let mut objects = made(2);
    objects.loose = vec![loose("outbox_shard_3", &[])];
    let e = judge_shard_layout(Some(&l), &spec(2), &objects).unwrap_err();
    assert!(
        e.contains("public.outbox_shard_3 is no partition of public.outbox and no shard's publication holds it"),
        "{e}"
    );
    let back = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL outboxd.partition_change = 'on'; ALTER TABLE public.outbox_shard_3 RENAME TO outbox_shard_3_detached; {}; COMMIT;",
        copy_from("public.outbox_shard_3_detached")
    );
    assert!(e.contains(&back), "{e}");
    // Held by a shard's publication (shard 1's): its rows were decoded by that shard's
    // slot; named when there is a fix to print, not refused.
    objects.loose = vec![loose("outbox_shard_3", &["outboxd_1"])];
    objects.held = objects.loose.clone();
    assert_eq!(judge_shard_layout(Some(&l), &spec(2), &objects), Ok(()));
    let gap = layout(&[("outbox_shard_0", 2, 0)]);
    let e = judge_shard_layout(Some(&gap), &spec(2), &objects).unwrap_err();
    assert!(
        e.contains("held by a shard's publication: public.outbox_shard_3")
            && !e.contains("_3_detached"),
        "{e}"
    );
}

#[test]
fn tables_only_shards_beyond_the_count_hold_are_copied() {
    // 4 shards lowered to 2, then (before shard 3 relayed everything its slot decoded)
    // to 1: `outbox_shard_1_of_4`, set aside by the first fix for shard 1, which
    // remained then, and `outbox_shard_3` (detached), are held by publications of shards
    // beyond the count alone. Nobody reads those slots, and the fix's drops remove them:
    // their rows are inserted again (the simulator's shard seed 1 lost an event so).
    let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    let mut objects = made(4);
    objects.loose = vec![loose("outbox_shard_3", &["outboxd_3"])];
    objects.held = vec![
        loose("outbox_shard_0_of_4", &["outboxd_0"]),
        loose("outbox_shard_1_of_4", &["outboxd_1"]),
        loose("outbox_shard_3", &["outboxd_3"]),
    ];
    let e = judge_shard_layout(Some(&l), &spec(1), &objects).unwrap_err();
    for copied in [
        "public.outbox_shard_1_of_2",
        "public.outbox_shard_1_of_4",
        "public.outbox_shard_3_detached",
    ] {
        assert!(e.contains(&copy_from(copied)), "{copied}: {e}");
    }
    // Out of the shards' names: once publication outboxd_3 is dropped as printed, no
    // shard's publication holds it, and it would be taken for a stranded table.
    assert!(
        e.contains("ALTER TABLE public.outbox_shard_3 RENAME TO outbox_shard_3_detached;"),
        "{e}"
    );
    // Shard 0 remains: what its slot decoded it relays.
    assert!(!e.contains(&copy_from("public.outbox_shard_0_of_4")), "{e}");
    assert!(!e.contains("held by a shard's publication"), "{e}");
}

#[test]
fn more_shards_get_their_publications_and_slots_before_any_row() {
    // Two shards, OUTBOXD_SHARD_COUNT=4: `init` checks the layout before it creates
    // anything, so outboxd_2 and outboxd_3 do not exist. The fix creates them (and the
    // slots) on their own first: rows moved or written into partitions 2 and 3 after
    // the COMMIT must find a slot.
    let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    let e = judge_shard_layout(Some(&l), &spec(4), &made(2)).unwrap_err();
    let before = "Then create the missing shards' publications and slots, each statement on its own (a slot cannot be created in a transaction that wrote): \
        CREATE PUBLICATION outboxd_2 WITH (publish = 'insert', publish_via_partition_root = true); \
        SELECT pg_catalog.pg_create_logical_replication_slot('outboxd_2', 'pgoutput'); \
        CREATE PUBLICATION outboxd_3 WITH (publish = 'insert', publish_via_partition_root = true); \
        SELECT pg_catalog.pg_create_logical_replication_slot('outboxd_3', 'pgoutput'). \
        Then, to lay the table out as 4 shards, run: BEGIN ISOLATION LEVEL READ COMMITTED;";
    assert!(e.contains(before), "{e}");
    assert!(
        e.contains("COMMIT; then run `outboxd init --accept-publication-change` (the transaction changed the shards' publications, as it must: `outboxd run` would stop on that; init records them as they are now, and finds the new slots) and start outboxd"),
        "{e}"
    );
    assert!(!e.contains("CREATE PUBLICATION outboxd_0"), "{e}");
    // The two shards' rows were relayed by slots 0 and 1, which go on: not copied.
    assert!(!e.contains("INSERT INTO"), "{e}");
    assert!(!e.contains("To go back"), "{e}");
    // Every statement of the transaction names a publication that exists by then.
    let transaction = e
        .split("BEGIN ISOLATION LEVEL READ COMMITTED; ")
        .nth(1)
        .unwrap();
    for r in 0..4 {
        assert!(
            transaction.contains(&format!(
                "ALTER PUBLICATION outboxd_{r} ADD TABLE public.outbox_shard_{r};"
            )),
            "{e}"
        );
    }
}

#[test]
fn the_printed_fix_quotes_mixed_case_names() {
    let spec = ShardSpec {
        root_table: "Outbox".into(),
        publication_base: "Pub".into(),
        ..spec(2)
    };
    let objects = ShardObjects {
        publications: vec!["Pub_0".into(), "Pub_1".into()],
        ..ShardObjects::default()
    };
    let e = judge_shard_layout(Some(&layout(&[("Outbox_shard_0", 2, 0)])), &spec, &objects)
        .unwrap_err();
    assert!(
        e.contains("CREATE TABLE public.\"Outbox_shard_1\" PARTITION OF public.\"Outbox\" FOR VALUES WITH (MODULUS 2, REMAINDER 1); ALTER PUBLICATION \"Pub_1\" ADD TABLE public.\"Outbox_shard_1\""),
        "{e}"
    );
}

#[test]
fn wrong_keys_kinds_and_gaps_are_refused() {
    let none = made(3);
    let mut l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    l.key = Some("HASH (id)".into());
    assert!(judge_shard_layout(Some(&l), &spec(2), &none)
        .unwrap_err()
        .contains("not HASH (aggregate_id)"));
    l.key = Some("RANGE (aggregate_id)".into());
    assert!(judge_shard_layout(Some(&l), &spec(2), &none).is_err());
    l.key = None;
    l.kind = "r".into();
    assert!(judge_shard_layout(Some(&l), &spec(2), &none)
        .unwrap_err()
        .contains("not partitioned"));
    assert!(judge_shard_layout(None, &spec(2), &none)
        .unwrap_err()
        .contains("does not exist"));
    let gap = layout(&[("outbox_shard_0", 3, 0), ("outbox_shard_2", 3, 2)]);
    let e = judge_shard_layout(Some(&gap), &spec(3), &none).unwrap_err();
    assert!(e.contains("remainder 1 of 3"), "{e}");
    assert!(
        e.contains("Then, to lay the table out as 3 shards, run: BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL outboxd.partition_change = 'on'; CREATE TABLE public.outbox_shard_1 PARTITION OF public.outbox FOR VALUES WITH (MODULUS 3, REMAINDER 1); ALTER PUBLICATION outboxd_1 ADD TABLE public.outbox_shard_1; COMMIT;"),
        "{e}"
    );
    let mut list = layout(&[("outbox_shard_0", 2, 0)]);
    list.partitions[0].bound = "FOR VALUES IN ('a')".into();
    assert!(judge_shard_layout(Some(&list), &spec(2), &none)
        .unwrap_err()
        .contains("not FOR VALUES WITH"));
}

#[test]
fn shard_indexes_parse_only_from_their_own_names() {
    assert_eq!(shard_index("outbox_shard", "outbox_shard_12"), Some(12));
    assert_eq!(shard_index("outbox_shard", "outbox_shard_1_of_4"), None);
    assert_eq!(shard_index("outbox_shard", "outbox_shard_"), None);
    assert_eq!(shard_index("outbox_shard", "outboxXshard_1"), None);
    assert_eq!(shard_index("outboxd", "outboxd_+1"), None);
}

#[test]
fn hash_bounds_parse() {
    assert_eq!(
        hash_bound("FOR VALUES WITH (modulus 4, remainder 1)"),
        Some((4, 1))
    );
    assert_eq!(
        hash_bound("FOR VALUES WITH (remainder 0, modulus 2)"),
        Some((2, 0))
    );
    assert_eq!(hash_bound("DEFAULT"), None);
    assert_eq!(hash_bound("FOR VALUES WITH (modulus x, remainder 1)"), None);
}

#[test]
fn a_missing_slot_is_made_even_where_its_publication_exists() {
    // An earlier attempt created outboxd_2 and outboxd_3, then the slots failed
    // (max_replication_slots): asked again, the fix must still make the slots first.
    let l = layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]);
    let mut objects = made(2);
    objects
        .publications
        .extend(["outboxd_2".into(), "outboxd_3".into()]);
    let e = judge_shard_layout(Some(&l), &spec(4), &objects).unwrap_err();
    for r in [2, 3] {
        assert!(
            e.contains(&format!(
                "SELECT pg_catalog.pg_create_logical_replication_slot('outboxd_{r}', 'pgoutput')"
            )),
            "{e}"
        );
        assert!(
            !e.contains(&format!("CREATE PUBLICATION outboxd_{r} ")),
            "{e}"
        );
    }
    // A slot left without its publication decodes nothing past the gap: dropped, then
    // made again after the publication.
    let mut objects = made(2);
    objects.slots.push("outboxd_2".into());
    let e = judge_shard_layout(Some(&l), &spec(4), &objects).unwrap_err();
    assert!(
        e.contains(
            "SELECT pg_catalog.pg_drop_replication_slot('outboxd_2'); \
             CREATE PUBLICATION outboxd_2 WITH (publish = 'insert', publish_via_partition_root = true); \
             SELECT pg_catalog.pg_create_logical_replication_slot('outboxd_2', 'pgoutput')"
        ),
        "{e}"
    );
}

#[test]
fn copies_go_in_the_order_the_rows_were_written() {
    let mut l = layout(&[
        ("outbox_shard_0", 4, 0),
        ("outbox_shard_1", 4, 1),
        ("outbox_shard_2", 4, 2),
        ("outbox_shard_3", 4, 3),
    ]);
    l.columns.push("created_at".into());
    let e = judge_shard_layout(Some(&l), &spec(2), &made(4)).unwrap_err();
    // One transaction's rows share created_at: where they lie in the table keeps their
    // order among them (a sort of equal keys need not).
    assert!(
        e.contains("FROM public.outbox_shard_2_of_4 ORDER BY created_at, ctid;"),
        "{e}"
    );
}

/// The relay reads only the partitioning and the loose tables to decide, and the other
/// objects only to print a refusal's fix (`verify_shard_layout`): the verdict must not
/// depend on them.
#[test]
fn the_verdict_weighs_only_the_layout_and_the_loose_tables() {
    let layouts = [
        layout(&[("outbox_shard_0", 2, 0), ("outbox_shard_1", 2, 1)]),
        layout(&[("outbox_shard_0", 2, 0)]),
        layout(&[
            ("outbox_shard_0", 4, 0),
            ("outbox_shard_1", 4, 1),
            ("outbox_shard_2", 4, 2),
            ("outbox_shard_3", 4, 3),
        ]),
    ];
    let looses = [
        Vec::new(),
        vec![loose("outbox_shard_1", &["outboxd_1"])],
        vec![loose("outbox_shard_3", &[])],
    ];
    for l in &layouts {
        for lo in &looses {
            for count in [2, 3, 4] {
                for made_n in [0, 2, 4] {
                    let mut full = made(made_n);
                    full.loose = lo.clone();
                    full.names = vec!["outbox_shard_0_of_4".into()];
                    full.held = vec![loose("outbox_shard_1_of_4", &["outboxd_3"])];
                    let only = ShardObjects {
                        loose: lo.clone(),
                        ..ShardObjects::default()
                    };
                    assert_eq!(
                        judge_shard_layout(Some(l), &spec(count), &full).is_ok(),
                        judge_shard_layout(Some(l), &spec(count), &only).is_ok(),
                        "{l:?} {lo:?} count {count} made {made_n}"
                    );
                }
            }
        }
    }
}
