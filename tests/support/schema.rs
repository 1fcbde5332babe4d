//! The outbox table, publication and slot of one test database.

use pgtest::TestDb;

pub const OUTBOX_DDL: &str = include_str!("../../sql/outbox.sql");

/// Names a test's relay uses; topics carry the database name so tests never share one.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub table: String,
    pub publication: String,
    pub slot: String,
    pub topic_prefix: String,
}

impl Outbox {
    pub fn topic(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.topic_prefix)
    }

    pub fn dead_letter_topic(&self) -> String {
        format!("{}.dead-letter", self.topic_prefix)
    }
}

/// Creates the default outbox table, its publication (inserts only), and the slot — in
/// that order, as a user would, so every insert after this returns is relayed.
pub async fn setup(db: &TestDb<'_>) -> Outbox {
    let client = db.client().await;
    client.batch_execute(OUTBOX_DDL).await.expect("outbox table");
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            db.publication
        ))
        .await
        .expect("publication");
    client
        .query_one(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&db.slot],
        )
        .await
        .expect("slot");
    Outbox {
        table: "public.outbox".into(),
        publication: db.publication.clone(),
        slot: db.slot.clone(),
        topic_prefix: db.name.replace('_', "-"),
    }
}

pub async fn confirmed_flush_lsn(db: &TestDb<'_>) -> u64 {
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
            &[&db.slot],
        )
        .await
        .expect("slot row");
    u64::try_from(row.get::<_, i64>(0)).expect("positive lsn")
}

pub async fn current_wal_lsn(db: &TestDb<'_>) -> u64 {
    let client = db.client().await;
    let row = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await
        .expect("wal lsn");
    u64::try_from(row.get::<_, i64>(0)).expect("positive lsn")
}
