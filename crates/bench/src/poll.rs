//! The polling relay of the seed articles, as the baseline users are leaving:
//! lease a batch with `FOR UPDATE SKIP LOCKED`, commit, produce with an idempotent
//! producer, wait for the acks, mark the batch sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::future::try_join_all;
use pgtest::PgCluster;
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::pg;

pub const BATCH: i64 = 100;
const LEASE: &str = "30 seconds";

pub struct PollOutcome {
    pub events: u64,
    pub seconds: f64,
}

fn producer(bootstrap: &str) -> Result<FutureProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("partitioner", "murmur2_random")
        .create()?)
}

/// Runs `workers` pollers until the table has nothing left to send.
pub async fn run(
    cluster: &PgCluster,
    db: &str,
    bootstrap: &str,
    workers: usize,
) -> Result<PollOutcome> {
    let producer = producer(bootstrap)?;
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let client = pg::connect(cluster, db).await?;
        let producer = producer.clone();
        let sent = Arc::clone(&sent);
        tasks.push(tokio::spawn(
            async move { worker(client, producer, sent).await },
        ));
    }
    for t in tasks {
        t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(PollOutcome {
        events: sent.load(Ordering::Relaxed),
        seconds,
    })
}

async fn worker(
    mut client: tokio_postgres::Client,
    producer: FutureProducer,
    sent: Arc<AtomicU64>,
) -> Result<()> {
    let select = format!(
        "SELECT id::text, aggregate_type, aggregate_id, event_type, payload::text FROM public.outbox \
         WHERE sent_at IS NULL AND (locked_at IS NULL OR locked_at < now() - interval '{LEASE}') \
         ORDER BY created_at LIMIT {BATCH} FOR UPDATE SKIP LOCKED"
    );
    let select = client.prepare(&select).await?;
    let lock = client
        .prepare("UPDATE public.outbox SET locked_at = now() WHERE id = ANY($1::text[]::uuid[])")
        .await?;
    let mark = client
        .prepare("UPDATE public.outbox SET sent_at = now() WHERE id = ANY($1::text[]::uuid[])")
        .await?;
    loop {
        let tx = client.transaction().await?;
        let rows = tx.query(&select, &[]).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(());
        }
        let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        tx.execute(&lock, &[&ids]).await?;
        tx.commit().await?;
        let mut acks = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: &str = r.get(0);
            let aggregate_type: &str = r.get(1);
            let key: &str = r.get(2);
            let event_type: &str = r.get(3);
            let payload: &str = r.get(4);
            let topic = format!("outbox.{aggregate_type}");
            let headers = OwnedHeaders::new_with_capacity(2)
                .insert(Header {
                    key: "id",
                    value: Some(id),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some(event_type),
                });
            let record = FutureRecord::to(&topic)
                .key(key)
                .payload(payload)
                .headers(headers);
            let ack = producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("enqueueing a record: {e}"))?;
            acks.push(ack);
        }
        for delivery in try_join_all(acks)
            .await
            .context("delivery future canceled")?
        {
            delivery.map_err(|(e, _)| anyhow::anyhow!("delivery failed: {e}"))?;
        }
        client.execute(&mark, &[&ids]).await?;
        sent.fetch_add(rows.len() as u64, Ordering::Relaxed);
        // A quiet moment is how pollers idle; a backlog drain never waits here.
        tokio::time::sleep(Duration::ZERO).await;
    }
}

/// Makes every row unsent again and restores the table to a freshly loaded state.
pub async fn reset(cluster: &PgCluster, db: &str) -> Result<()> {
    let c = pg::connect(cluster, db).await?;
    c.batch_execute("UPDATE public.outbox SET sent_at = NULL, locked_at = NULL")
        .await?;
    c.batch_execute("VACUUM FULL ANALYZE public.outbox").await?;
    c.batch_execute("CHECKPOINT").await?;
    Ok(())
}
