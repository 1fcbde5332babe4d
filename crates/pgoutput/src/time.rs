//! PostgreSQL wire timestamps: microseconds since 2000-01-01 00:00:00 UTC.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds between the Unix epoch and the PostgreSQL epoch (2000-01-01).
pub const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// A timestamp as sent on the wire (Int64 microseconds since 2000-01-01 UTC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// Microseconds since the Unix epoch, saturating.
    pub fn unix_micros(self) -> i64 {
        self.0.saturating_add(PG_EPOCH_OFFSET_MICROS)
    }

    /// Milliseconds since the Unix epoch (Kafka's timestamp unit), saturating.
    pub fn unix_millis(self) -> i64 {
        self.unix_micros().div_euclid(1000)
    }

    /// The current time; a clock before 1970 or after year 292,277 reads as the epoch boundary.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    pub fn from_system_time(t: SystemTime) -> Self {
        let unix_micros = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, |m| -m),
        };
        PgTimestamp(unix_micros.saturating_sub(PG_EPOCH_OFFSET_MICROS))
    }

    pub fn to_system_time(self) -> SystemTime {
        let micros = self.unix_micros();
        match u64::try_from(micros) {
            Ok(m) => UNIX_EPOCH + Duration::from_micros(m),
            Err(_) => UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs()),
        }
    }
}
