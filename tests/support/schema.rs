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
    /// The names a test database's relay uses for the default `public.outbox`.
    pub fn for_db(db: &TestDb<'_>) -> Outbox {
        Outbox {
            table: "public.outbox".into(),
            publication: db.publication.clone(),
            slot: db.slot.clone(),
            topic_prefix: db.name.replace('_', "-"),
        }
    }

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
    setup_custom(db, OUTBOX_DDL, Some("publish = 'insert'")).await
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

/// Like [`setup`], but with the caller's table DDL (it must create `public.outbox`) and
/// publication options: `Some("publish = 'insert'")`, or `None` for PostgreSQL's default
/// (insert, update, delete, truncate), which leaves the filtering to the relay.
pub async fn setup_custom(db: &TestDb<'_>, table_ddl: &str, with: Option<&str>) -> Outbox {
    let client = db.client().await;
    client.batch_execute(table_ddl).await.expect("outbox table");
    let with = with.map_or(String::new(), |w| format!(" WITH ({w})"));
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{}\" FOR TABLE public.outbox{with}",
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
    Outbox::for_db(db)
}

/// The default table and its publication (inserts only), no slot: the relay's first start
/// (or `outboxd init`) creates it.
pub async fn setup_without_slot(db: &TestDb<'_>) -> Outbox {
    db.client()
        .await
        .batch_execute(&format!(
            "{OUTBOX_DDL}; CREATE PUBLICATION \"{}\" FOR TABLE public.outbox WITH (publish = 'insert')",
            db.publication
        ))
        .await
        .expect("schema");
    Outbox::for_db(db)
}

/// The runbook's re-publish (docs/operations.md): the outbox rows created since `since`
/// (a timestamptz as text) are deleted and inserted again in one statement, which writes
/// new inserts to the WAL. Returns how many.
pub async fn republish_since(client: &tokio_postgres::Client, since: &str) -> u64 {
    client
        .execute(
            "WITH moved AS (DELETE FROM public.outbox WHERE created_at >= $1::text::timestamptz RETURNING *) \
             INSERT INTO public.outbox SELECT * FROM moved",
            &[&since],
        )
        .await
        .expect("re-publish")
}

/// Rows in `public.outbox` now (what `outboxd prune` left).
pub async fn outbox_rows(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM public.outbox", &[])
        .await
        .expect("count")
        .get(0)
}

/// The default table with publication defaults (inserts, updates, deletes, truncates).
pub async fn setup_publish_all(db: &TestDb<'_>) -> Outbox {
    setup_custom(db, OUTBOX_DDL, None).await
}

/// Parses an `X/Y` LSN as PostgreSQL prints it.
pub fn parse_lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("LSN of the form X/Y");
    let hi = u64::from_str_radix(hi, 16).expect("LSN high part");
    let lo = u64::from_str_radix(lo, 16).expect("LSN low part");
    (hi << 32) | lo
}

/// Waits until the slot's confirmed_flush_lsn reaches `lsn`; panics after `limit`.
pub async fn wait_confirmed_at_least(db: &TestDb<'_>, lsn: u64, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let c = confirmed_flush_lsn(db).await;
        if c >= lsn {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "confirmed_flush_lsn stayed at {c:#x}, below {lsn:#x}, for {limit:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
