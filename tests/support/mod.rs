//! Shared pieces of the end-to-end tests: brokers, the outbox schema, the real `outboxd`
//! binary as a child process, a load generator and a consumer that checks what arrived.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod broker;
pub mod consume;
pub mod load;
pub mod ops;
pub mod proxy;
pub mod relay;
pub mod scenario;
pub mod schema;
