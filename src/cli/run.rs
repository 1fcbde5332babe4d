//! `outboxd run`: the relay, the HTTP endpoint, and signal-driven graceful shutdown.

use std::sync::Arc;
use std::time::Instant;

use outboxd_relay::pipeline::{self, Observer};
use outboxd_relay::telemetry::{serve_http, Health, Metrics, Monitored, Telemetry};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use super::{EXIT_CONFIG, EXIT_INTERNAL, EXIT_OK};
use crate::config::Settings;
use crate::wiring;

pub async fn run(settings: &Settings) -> i32 {
    // One relay per shard (one in all for an unsharded outbox), each observed apart.
    let mut relays = Vec::new();
    let mut monitored = Vec::new();
    for shard in settings.per_shard() {
        let cfg = match wiring::relay_config(&shard) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("configuration error: {e:#}");
                return EXIT_CONFIG;
            }
        };
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(Instant::now()));
        health.set_standby_is_ready(settings.ready_standby);
        monitored.push(Monitored {
            shard: cfg.shard.as_ref().map(|s| s.index),
            metrics: Arc::clone(&metrics),
            health: Arc::clone(&health),
        });
        relays.push((cfg, Observer::new(metrics, health)));
    }
    if let Some(shards) = &settings.shards {
        tracing::info!(
            shard_count = shards.count,
            relayed = ?shards.relayed,
            "sharded outbox: one slot per shard"
        );
    }
    let telemetry = Arc::new(Telemetry::new(monitored));
    let (stop_tx, stop_rx) = watch::channel(false);
    if let Err(e) = spawn_signal_handler(stop_tx) {
        tracing::error!("cannot install signal handlers: {e}");
        return EXIT_INTERNAL;
    }
    if let Some(addr) = &settings.http_addr {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                let mut rx = stop_rx.clone();
                let shutdown = async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                };
                tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
                tokio::spawn(serve_http(
                    listener,
                    Arc::clone(&telemetry),
                    settings.ready_stall,
                    shutdown,
                ));
            }
            Err(e) => {
                tracing::error!(
                    "OUTBOXD_HTTP_ADDR={addr:?} cannot be bound ({e}); set a free host:port, or empty to disable"
                );
                return EXIT_CONFIG;
            }
        }
    }
    match pipeline::run_all(relays, stop_rx).await {
        Ok(()) => {
            tracing::info!("stopped");
            EXIT_OK
        }
        Err(e) => {
            let (class, exit_code) = (e.class().as_str(), e.exit_code());
            // The code is a field of the line, so that it can be looked up (and matched
            // by log alerts) without parsing the message; a `None` field is left out.
            tracing::error!(
                class,
                exit_code,
                decided_by = e.deciding_code().map(tracing::field::display),
                "outboxd stopped: {e}"
            );
            exit_code
        }
    }
}

/// The first SIGTERM/SIGINT starts a graceful shutdown; a second one exits at once
/// (nothing is lost: unconfirmed events are re-sent from the slot).
fn spawn_signal_handler(stop: watch::Sender<bool>) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut received = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            received += 1;
            if received == 1 {
                tracing::info!("signal received: draining (send again to exit at once)");
                let _ = stop.send(true);
            } else {
                tracing::warn!("second signal: exiting without draining");
                crate::logging::flush(std::time::Duration::from_secs(1));
                std::process::exit(130);
            }
        }
    });
    Ok(())
}
