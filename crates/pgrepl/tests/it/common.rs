use std::time::Duration;

use pgoutput::{Commit, LogicalMessage, Lsn, TupleValue};
use pgrepl::{ConnectConfig, ReplicationEvent, ReplicationStream, SslMode};
use pgtest::{PgCluster, TestDb};

pub fn config(cluster: &PgCluster, dbname: &str) -> ConnectConfig {
    let mut cfg = ConnectConfig::new(cluster.host(), cluster.port(), cluster.superuser(), dbname);
    cfg.ssl_mode = SslMode::Disable;
    cfg.application_name = "pgrepl-test".into();
    cfg
}

/// Creates the outbox table and its publication (publication before slot: docs/replication-protocol.md §5).
pub async fn create_table_and_publication(db: &TestDb<'_>) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL);
             CREATE PUBLICATION \"{}\" FOR TABLE outbox WITH (publish = 'insert');",
            db.publication
        ))
        .await
        .expect("create table and publication");
    client
}

/// Inserts `rows` in one transaction.
pub async fn insert_txn(client: &tokio_postgres::Client, rows: &[(i64, &str)]) {
    let values: Vec<String> = rows
        .iter()
        .map(|(id, p)| format!("({id}, '{p}')"))
        .collect();
    client
        .batch_execute(&format!(
            "BEGIN; INSERT INTO outbox VALUES {}; COMMIT;",
            values.join(", ")
        ))
        .await
        .expect("insert");
}

/// Reads pgoutput messages (keepalives skipped) until `commits` Commit messages arrived.
pub async fn read_until_commits(
    stream: &mut ReplicationStream,
    commits: usize,
) -> Vec<LogicalMessage> {
    let mut out = Vec::new();
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen < commits {
        let event = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("timed out waiting for transactions")
            .expect("stream error")
            .expect("stream ended");
        if let ReplicationEvent::XLogData { message, .. } = event {
            if matches!(message, LogicalMessage::Commit(_)) {
                seen += 1;
            }
            out.push(message);
        }
    }
    out
}

/// Text values of an Insert's new tuple.
pub fn insert_values(message: &LogicalMessage) -> Vec<String> {
    let LogicalMessage::Insert(insert) = message else {
        panic!("expected Insert, got {message:?}");
    };
    insert
        .new_tuple
        .columns
        .iter()
        .map(|v| match v {
            TupleValue::Text(b) => String::from_utf8(b.to_vec()).expect("utf8"),
            other => panic!("expected a text value, got {other:?}"),
        })
        .collect()
}

/// Checks one transaction `Begin, [Relation], Insert×n, Commit` and returns its Commit.
pub fn check_txn(messages: &[LogicalMessage], with_relation: bool, rows: &[(i64, &str)]) -> Commit {
    let mut it = messages.iter();
    let Some(LogicalMessage::Begin(begin)) = it.next() else {
        panic!("expected Begin first: {messages:?}");
    };
    if with_relation {
        let Some(LogicalMessage::Relation(rel)) = it.next() else {
            panic!("expected Relation: {messages:?}");
        };
        assert_eq!(rel.name, "outbox");
        assert_eq!(rel.namespace, "public");
        let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "payload"]);
    }
    for (id, payload) in rows {
        let message = it.next().expect("missing Insert");
        assert_eq!(
            insert_values(message),
            [id.to_string(), (*payload).to_string()]
        );
    }
    let Some(LogicalMessage::Commit(commit)) = it.next() else {
        panic!("expected Commit: {messages:?}");
    };
    assert!(it.next().is_none(), "trailing messages: {messages:?}");
    assert_eq!(begin.final_lsn, commit.commit_lsn);
    assert!(commit.end_lsn > commit.commit_lsn);
    *commit
}

/// Splits a message list after each Commit.
pub fn split_txns(messages: Vec<LogicalMessage>) -> Vec<Vec<LogicalMessage>> {
    let mut txns = vec![Vec::new()];
    for m in messages {
        let is_commit = matches!(m, LogicalMessage::Commit(_));
        txns.last_mut().expect("non-empty").push(m);
        if is_commit {
            txns.push(Vec::new());
        }
    }
    txns.pop();
    txns
}

pub fn lsn_ok(l: Lsn) -> bool {
    l > Lsn::ZERO
}
