//! The one error class of the workspace. It lives here, in the crate every other one
//! builds on, so that the replication client's errors ([`DecodeError`] included), the
//! pipeline's pure errors and the relay's session errors share one type and one
//! vocabulary ("permanent" / "retryable" in logs and metrics).
//!
//! Callers restart on [`ErrorClass::Retryable`] (with backoff, from the slot's confirmed
//! position) and stop with a report on [`ErrorClass::Permanent`]: a broken password, a
//! missing slot or an invalidated slot does not heal by reconnecting, and looping on it
//! hides the problem (Materialize#14823).

use std::fmt;

use crate::DecodeError;

/// Whether retrying the same operation can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Retrying cannot help: report and exit (or dead-letter, for a row).
    Permanent,
    /// Restart from the slot's confirmed position, with backoff.
    Retryable,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Permanent => "permanent",
            ErrorClass::Retryable => "retryable",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DecodeError {
    /// Always permanent: the same bytes never decode differently.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}
