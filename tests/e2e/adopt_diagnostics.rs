//! What a new user adopting outboxd over an existing outbox meets (issue 32): each
//! misconfiguration is named as what it is, and following the printed fix literally works.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use pgtest::PgCluster;
use support::broker::Broker;
use support::ops;
use support::relay::{run_to_end, Relay};
use support::scenario::Scenario;
use support::schema::{self, Outbox, OUTBOX_DDL};

fn fail_line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("FAIL  {what}")))
        .unwrap_or_else(|| panic!("no FAIL line for {what}:\n{out}"))
}

/// The text after `marker` up to the next whitespace, trailing `.`/`,` dropped.
fn word_after<'a>(text: &'a str, marker: &str) -> &'a str {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in:\n{text}"));
    text[at + marker.len()..]
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches(['.', ','])
}

fn set(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_owned(), value.to_owned()));
}

/// A typo in OUTBOXD_TABLE: the error says the table does not exist, names the outbox
/// table that does, and does not send the user to `init` (which would create a second,
/// empty table under the wrong name).
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_table_name_names_the_table_that_exists() {
    let s = Scenario::new("adopt_table").partitions(4).await;
    let mut env = s.env(&[("OUTBOXD_TABLE", "public.outboxes")]);

    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let table = fail_line(&out, "outbox table");
    assert!(table.contains("public.outboxes does not exist"), "{table}");
    assert!(!table.contains("run `outboxd init`"), "{table}");
    let (code, run_out) = run_to_end(&env, &["run"]);
    assert_ne!(code, 0, "{run_out}");
    assert!(
        run_out.contains("public.outboxes does not exist"),
        "{run_out}"
    );

    // Followed literally.
    let fix = word_after(table, "set OUTBOXD_TABLE=");
    assert_eq!(fix, "public.outbox", "{table}");
    set(&mut env, "OUTBOXD_TABLE", fix);
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
}

/// A publication made beforehand that lacks the outbox table: init says so and stops
/// with the fix, instead of "ok (exists)"; after the fix init completes.
#[tokio::test(flavor = "multi_thread")]
async fn init_names_a_publication_that_lacks_the_table() {
    let db = PgCluster::shared().fresh_database("adopt_pub").await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "{OUTBOX_DDL}; CREATE TABLE public.audit (id int); \
             CREATE PUBLICATION \"{}\" FOR TABLE public.audit WITH (publish = 'insert')",
            db.publication
        ))
        .await
        .expect("schema");
    let outbox = Outbox::for_db(&db);
    let broker = Broker::default_for_tests();
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("does not deliver the inserts of public.outbox"),
        "{out}"
    );
    assert!(
        ops::slot_row(&client, &outbox.slot).await.is_none(),
        "no slot before the publication is fixed"
    );
    let at = out.find("ALTER PUBLICATION").expect("the fix");
    let fix = &out[at..at + out[at..].find(';').expect("statement end")];
    client.batch_execute(fix).await.expect("the printed fix");

    let (code, out) = run_to_end(&env, &["init"]);
    assert_eq!(code, 0, "{out}");
    assert!(ops::slot_row(&client, &outbox.slot).await.is_some());
}

/// An inheritance child of the outbox: its rows are never relayed, so check and start
/// name it and the fix; after the fix check passes.
#[tokio::test(flavor = "multi_thread")]
async fn an_inheritance_child_is_named_by_check_and_run() {
    let db = PgCluster::shared().fresh_database("adopt_inherit").await;
    let outbox = schema::setup(&db).await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE public.outbox_archive () INHERITS (public.outbox)")
        .await
        .expect("child");
    let broker = Broker::default_for_tests();
    ops::create_topics(&broker, &outbox).await;
    let env = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);

    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 6, "{out}");
    let line = fail_line(&out, "publication");
    assert!(
        line.contains("public.outbox_archive inherits from public.outbox"),
        "{line}"
    );
    let (code, run_out) = run_to_end(&env, &["run"]);
    assert_ne!(code, 0, "{run_out}");
    assert!(
        run_out.contains("public.outbox_archive inherits from public.outbox"),
        "{run_out}"
    );

    let at = line.find("ALTER TABLE").expect("the fix");
    client
        .batch_execute(&line[at..])
        .await
        .expect("the printed fix");
    let (code, out) = run_to_end(&env, &["check"]);
    assert_eq!(code, 0, "{out}");
}
