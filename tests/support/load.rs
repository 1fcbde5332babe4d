//! Inserts outbox events the way a service would, remembering commit order.

use rand::{Rng, SeedableRng};
use tokio_postgres::Client;

#[derive(Debug, Clone)]
pub struct Event {
    pub id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// The payload text as inserted (jsonb normalises it; we insert normalised JSON).
    pub payload: String,
}

/// The columns [`Event::from_row`] reads, in its order.
pub const EVENT_COLUMNS: &str = "id::text, aggregate_type, aggregate_id, event_type, payload::text";

impl Event {
    /// An outbox row read (or returned) as [`EVENT_COLUMNS`].
    pub fn from_row(r: &tokio_postgres::Row) -> Event {
        Event {
            id: r.get(0),
            aggregate_type: r.get(1),
            aggregate_id: r.get(2),
            event_type: r.get(3),
            payload: r.get(4),
        }
    }
}

/// Inserts `total` events in transactions of random size 1..=max_txn over `aggregates`
/// aggregates, one transaction after another, so the returned order is commit order.
pub async fn insert_events(
    client: &Client,
    table: &str,
    total: usize,
    max_txn: usize,
    aggregates: usize,
) -> Vec<Event> {
    // StdRng (not thread_rng) keeps the future Send, so a load can run in a spawned task.
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut events = Vec::with_capacity(total);
    let mut seq = vec![0u64; aggregates];
    while events.len() < total {
        let n = rng.gen_range(1..=max_txn).min(total - events.len());
        let batch = new_events(&mut rng, &mut seq, n);
        insert_batch(client, table, &batch).await;
        events.extend(batch);
    }
    events
}

/// Inserts `n` events over `aggregates` aggregates in one transaction.
pub async fn insert_one_transaction(
    client: &Client,
    table: &str,
    n: usize,
    aggregates: usize,
) -> Vec<Event> {
    let mut rng = rand::rngs::StdRng::from_entropy();
    let batch = new_events(&mut rng, &mut vec![0u64; aggregates], n);
    insert_batch(client, table, &batch).await;
    batch
}

/// `n` events of random aggregates; `seq` counts each aggregate's events so far.
fn new_events(rng: &mut impl Rng, seq: &mut [u64], n: usize) -> Vec<Event> {
    (0..n)
        .map(|_| {
            let a = rng.gen_range(0..seq.len());
            seq[a] += 1;
            Event {
                id: uuid::Uuid::new_v4().to_string(),
                aggregate_type: if a % 2 == 0 { "order" } else { "customer" }.into(),
                aggregate_id: format!("agg-{a}"),
                event_type: "Changed".into(),
                payload: format!("{{\"agg\": {a}, \"seq\": {}}}", seq[a]),
            }
        })
        .collect()
}

/// One transaction with all of `batch`, in order.
pub async fn insert_batch(client: &Client, table: &str, batch: &[Event]) {
    try_insert(client, table, batch)
        .await
        .expect("insert batch");
}

/// [`insert_batch`] returning the error, for loads that outlive a server restart.
pub async fn try_insert(
    client: &Client,
    table: &str,
    batch: &[Event],
) -> Result<(), tokio_postgres::Error> {
    try_insert_as(
        client,
        table,
        "id, aggregate_type, aggregate_id, event_type, payload",
        batch,
    )
    .await
}

/// `n` events over `aggregates` aggregates, not inserted: for a table of other column
/// names ([`try_insert_as`]).
pub fn make_events(n: usize, aggregates: usize) -> Vec<Event> {
    let mut rng = rand::rngs::StdRng::from_entropy();
    new_events(&mut rng, &mut vec![0u64; aggregates], n)
}

/// [`try_insert`] into a table whose columns for the id, aggregate type, aggregate id,
/// event type and payload are `columns` (SQL, in that order).
pub async fn try_insert_as(
    client: &Client,
    table: &str,
    columns: &str,
    batch: &[Event],
) -> Result<(), tokio_postgres::Error> {
    let ids: Vec<&str> = batch.iter().map(|e| e.id.as_str()).collect();
    let types: Vec<&str> = batch.iter().map(|e| e.aggregate_type.as_str()).collect();
    let aggs: Vec<&str> = batch.iter().map(|e| e.aggregate_id.as_str()).collect();
    let evts: Vec<&str> = batch.iter().map(|e| e.event_type.as_str()).collect();
    let payloads: Vec<&str> = batch.iter().map(|e| e.payload.as_str()).collect();
    let sql = format!(
        "INSERT INTO {table} ({columns}) \
         SELECT i::uuid, t, a, e, p::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) \
         WITH ORDINALITY AS u(i, t, a, e, p, n) ORDER BY n"
    );
    client
        .execute(&sql, &[&ids, &types, &aggs, &evts, &payloads])
        .await
        .map(|_| ())
}
