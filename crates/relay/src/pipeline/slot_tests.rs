//! The publication judge's refusals and the fixes they print.

use super::*;

/// A partitioned outbox its publication covers, with nothing to refuse.
fn covered() -> PublicationCoverage {
    PublicationCoverage {
        publishes_insert: true,
        via_partition_root: true,
        table_kind: Some("p".into()),
        table_listed: true,
        partitions_listed: 0,
        leaves_unlisted: 0,
        row_filtered: false,
        column_listed: false,
        unlogged: None,
        inheritance_children: None,
        foreign: Vec::new(),
    }
}

#[test]
fn a_foreign_partition_is_refused_with_the_statements_that_replace_it() {
    let c = PublicationCoverage {
        foreign: vec![preflight::ForeignPartition {
            name: "public.outbox_2001".into(),
            parent: "public.outbox".into(),
            bound: "FOR VALUES FROM ('2001-01-01') TO ('2002-01-01')".into(),
            local: "public.outbox_200_local_16384".into(),
            columns: "id, payload".into(),
        }],
        ..covered()
    };
    let problem = judge_publication(&c, "pub", "public.outbox", &[]).expect_err("refused");
    assert!(problem.starts_with("public.outbox_2001 "), "{problem}");
    assert!(
        problem.ends_with("BEGIN; ALTER TABLE public.outbox DETACH PARTITION public.outbox_2001; CREATE TABLE public.outbox_200_local_16384 PARTITION OF public.outbox FOR VALUES FROM ('2001-01-01') TO ('2002-01-01'); INSERT INTO public.outbox (id, payload) OVERRIDING SYSTEM VALUE SELECT id, payload FROM public.outbox_2001; COMMIT;"),
        "{problem}"
    );
    // The outbox itself foreign: published before its rows are inserted again.
    let foreign_outbox = PublicationCoverage {
        table_kind: Some("f".into()),
        table_listed: false,
        ..covered()
    };
    let problem =
        judge_publication(&foreign_outbox, "pub", "public.outbox", &[]).expect_err("refused");
    let publish = problem.find("ALTER PUBLICATION pub ADD TABLE public.outbox;");
    let insert = problem.find("insert the rows");
    assert!(publish.is_some() && publish < insert, "{problem}");
    let local = PublicationCoverage {
        foreign: Vec::new(),
        ..c
    };
    assert_eq!(
        judge_publication(&local, "pub", "public.outbox", &[]),
        Ok(None)
    );
}

#[test]
fn an_unlogged_partition_is_refused_once_the_publication_covers_the_table() {
    let c = PublicationCoverage {
        unlogged: Some("public.outbox_2025\n\"Odd, name\".\"p 1\"".into()),
        ..covered()
    };
    let problem = judge_publication(&c, "pub", "public.outbox", &[]).expect_err("refused");
    assert!(
        problem.starts_with("public.outbox_2025, \"Odd, name\".\"p 1\" "),
        "{problem}"
    );
    assert!(
        problem.contains("ALTER TABLE \"Odd, name\".\"p 1\" SET LOGGED; WITH moved AS (DELETE FROM \"Odd, name\".\"p 1\" RETURNING *) INSERT INTO \"Odd, name\".\"p 1\" OVERRIDING SYSTEM VALUE SELECT * FROM moved;"),
        "{problem}"
    );
    // Not covered by the publication: its fix first (the fix's re-inserts must be
    // published), the unlogged partition at the next start.
    let unlisted = PublicationCoverage {
        table_listed: false,
        via_partition_root: false,
        ..c.clone()
    };
    let problem = judge_publication(&unlisted, "pub", "public.outbox", &[]).expect_err("refused");
    assert!(
        problem.contains("ALTER PUBLICATION pub ADD TABLE"),
        "{problem}"
    );
    assert!(!problem.contains("UNLOGGED"), "{problem}");
    let logged = PublicationCoverage {
        unlogged: None,
        ..c
    };
    assert_eq!(
        judge_publication(&logged, "pub", "public.outbox", &[]),
        Ok(None)
    );
}
