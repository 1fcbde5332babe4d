//! Integration tests against throwaway PostgreSQL clusters (crate `pgtest`). Each test
//! has its own database, slot and publication, so they run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod auth;
mod common;
mod impostor;
mod stream;
mod timeout;
