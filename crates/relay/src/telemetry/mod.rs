//! Observability: Prometheus metrics, liveness/readiness, and the HTTP endpoint that
//! serves both.
//!
//! - `metrics` + `histogram`: atomics updated from the hot path.
//! - `render`: the Prometheus text format.
//! - `process`: the process's CPU, memory and file descriptors, and the build info.
//! - `health`: readiness that notices a stalled ack watermark.
//! - `relays`: every relay of the process (one per shard) behind one endpoint.
//! - `http`: a minimal HTTP/1.1 server for `/metrics`, `/healthz`, `/readyz`.

mod health;
mod histogram;
mod http;
mod metrics;
mod process;
mod relays;
mod render;

pub use health::Health;
pub use histogram::{Histogram, HistogramSnapshot};
pub use http::serve_http;
pub use metrics::{Metrics, MetricsSnapshot, SlotWalStatus, TxnAbortCause};
pub use process::ProcessSnapshot;
pub use relays::{Monitored, Telemetry};
pub use render::{render, render_all, PROMETHEUS_CONTENT_TYPE};
