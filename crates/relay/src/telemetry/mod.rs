//! Observability: Prometheus metrics, liveness/readiness, and the HTTP endpoint that
//! serves both.
//!
//! - `metrics` + `histogram`: atomics updated from the hot path.
//! - `render`: the Prometheus text format.
//! - `health`: readiness that notices a stalled ack watermark.
//! - `http`: a minimal HTTP/1.1 server for `/metrics`, `/healthz`, `/readyz`.

mod health;
mod histogram;
mod http;
mod metrics;
mod render;

pub use health::Health;
pub use histogram::{Histogram, HistogramSnapshot};
pub use http::serve_http;
pub use metrics::{Metrics, MetricsSnapshot, SlotWalStatus};
pub use render::{render, PROMETHEUS_CONTENT_TYPE};
