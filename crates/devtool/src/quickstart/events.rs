//! Sample events, each committed in its own transaction with the patterns of
//! sql/examples.sql: a business change plus its outbox row, an insert-then-delete, and a
//! pg_logical_emit_message envelope.

use anyhow::{Context, Result};
use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

/// How an event reaches the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// UPSERT the business row and INSERT the outbox row in one transaction.
    Row,
    /// INSERT then DELETE the outbox row in one transaction: the table stays empty.
    InsertThenDelete,
    /// `pg_logical_emit_message(true, 'outbox', <envelope>)`: no table at all (PG14+).
    EmitMessage,
}

/// One event the quickstart commits and then expects in Kafka.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: String,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub event_type: &'static str,
    pub pattern: Pattern,
    pub payload: serde_json::Value,
    /// Order events: the order's customer.
    customer_id: usize,
}

impl Event {
    pub fn label(&self) -> String {
        format!(
            "{}/{} {}",
            self.aggregate_type, self.aggregate_id, self.event_type
        )
    }
}

/// `n` events over a few orders and customers; event 3 is an insert-then-delete and
/// event 5 an emitted message (when the server has pg_logical_emit_message, PG14+).
pub fn plan(n: usize, emit_supported: bool) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let order_id = 1001 + (i / 4) % 4;
            let customer_id = 7 + (i / 4) % 3;
            let (aggregate_type, event_type, pattern) = match (i, i % 4) {
                (3, _) => ("order", "OrderShipped", Pattern::InsertThenDelete),
                (5, _) if emit_supported => ("order", "OrderCancelled", Pattern::EmitMessage),
                (_, 0) => ("order", "OrderPlaced", Pattern::Row),
                (_, 1) => ("customer", "CustomerRegistered", Pattern::Row),
                (_, 2) => ("order", "OrderPaid", Pattern::Row),
                _ => ("customer", "CustomerEmailChanged", Pattern::Row),
            };
            let (aggregate_id, payload) = if aggregate_type == "order" {
                let amount = format!("{}.90", 10 + i % 50);
                let p = json!({"order_id": order_id, "customer_id": customer_id, "amount": amount, "seq": i});
                (order_id.to_string(), p)
            } else {
                let email = format!("customer{customer_id}+{i}@example.com");
                let p = json!({"customer_id": customer_id, "email": email, "seq": i});
                (customer_id.to_string(), p)
            };
            Event {
                id: Uuid::new_v4().to_string(),
                aggregate_type,
                aggregate_id,
                event_type,
                pattern,
                payload,
                customer_id,
            }
        })
        .collect()
}

const INSERT_OUTBOX: &str = "INSERT INTO public.outbox \
    (id, aggregate_type, aggregate_id, event_type, payload, headers) \
    VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)";

/// The outbox row of `e`, inside the caller's transaction.
async fn insert_outbox_row(
    tx: &tokio_postgres::Transaction<'_>,
    e: &Event,
    payload: &str,
    headers: &str,
) -> Result<()> {
    tx.execute(
        INSERT_OUTBOX,
        &[
            &e.id,
            &e.aggregate_type,
            &e.aggregate_id,
            &e.event_type,
            &payload,
            &headers,
        ],
    )
    .await?;
    Ok(())
}

/// Commits one event in its own transaction.
pub async fn insert(client: &mut Client, e: &Event) -> Result<()> {
    let tx = client.transaction().await?;
    let payload = e.payload.to_string();
    let headers = json!({ "traceparent": traceparent() }).to_string();
    match e.pattern {
        Pattern::Row => {
            if e.aggregate_type == "order" {
                let status = e.event_type.trim_start_matches("Order").to_lowercase();
                tx.execute(
                    "INSERT INTO public.orders (id, customer_id, status) \
                     VALUES ($1::text::bigint, $2::text::bigint, $3) \
                     ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status",
                    &[&e.aggregate_id, &e.customer_id.to_string(), &status],
                )
                .await?;
            } else {
                let email = e.payload["email"].as_str().unwrap_or_default();
                tx.execute(
                    "INSERT INTO public.customers (id, email) VALUES ($1::text::bigint, $2) \
                     ON CONFLICT (id) DO UPDATE SET email = EXCLUDED.email",
                    &[&e.aggregate_id, &email],
                )
                .await?;
            }
            insert_outbox_row(&tx, e, &payload, &headers).await?;
        }
        Pattern::InsertThenDelete => {
            insert_outbox_row(&tx, e, &payload, &headers).await?;
            tx.execute(
                "DELETE FROM public.outbox WHERE id = $1::text::uuid",
                &[&e.id],
            )
            .await?;
        }
        Pattern::EmitMessage => {
            let envelope = json!({
                "id": e.id,
                "aggregate_type": e.aggregate_type,
                "aggregate_id": e.aggregate_id,
                "event_type": e.event_type,
                "payload": e.payload,
                "headers": {"reason": "customer"},
            })
            .to_string();
            tx.execute(
                "SELECT pg_logical_emit_message(true, 'outbox', $1::text)",
                &[&envelope],
            )
            .await?;
        }
    }
    tx.commit()
        .await
        .with_context(|| format!("committing {}", e.label()))
}

/// A W3C trace context header value, as a service's tracing would add.
fn traceparent() -> String {
    let trace = Uuid::new_v4().simple().to_string();
    let span: String = Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .take(16)
        .collect();
    format!("00-{trace}-{span}-01")
}
