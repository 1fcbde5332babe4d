//! Caps on what is handed to the producer but not yet acknowledged.
//!
//! At a cap the relay stops *reading* replication data (it keeps sending status updates)
//! until delivery reports free room. Reading resumes while there is room for one more
//! message, whatever its size: the next message's size is only known once it was read,
//! and a message larger than the byte cap must still get through when nothing else is in
//! flight, or the pipeline would stop forever. Whether it fits the broker is
//! [`crate::check_size`]'s concern.

/// Limits on in-flight (produced, unacknowledged) messages and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightCaps {
    pub max_messages: usize,
    pub max_bytes: usize,
}

impl InFlightCaps {
    /// Whether the relay may read (and so produce) another message with `messages`
    /// messages of `bytes` bytes in flight. Always true when nothing is in flight.
    pub fn has_room(&self, messages: usize, bytes: usize) -> bool {
        messages == 0 || (messages < self.max_messages && bytes < self.max_bytes)
    }

    /// At most this many rows between two marks of a claim (see
    /// `crate::ReplayStart::mark_every`): a replay's hold until its next mark fits the
    /// message cap also where a claim keeps only every fourth of its older marks, with a
    /// fifth of the cap left for what else is in flight. The byte cap is not considered:
    /// rows larger on average than `max_bytes / max_messages` (9 KB by default) can fill it.
    pub fn mark_every(&self) -> u64 {
        u64::try_from(self.max_messages / 5)
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The rows the row ledger keeps past the leading done ones of their transactions:
    /// eight times the message cap (about 25 bytes each: 6 MB at the default cap), room
    /// for acks out of order across partitions; only a row stuck unacked while the rest
    /// of its transaction is acked goes past it.
    pub fn tracked_rows(&self) -> usize {
        self.max_messages.saturating_mul(8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: InFlightCaps = InFlightCaps {
        max_messages: 3,
        max_bytes: 100,
    };

    #[test]
    fn nothing_in_flight_always_has_room_even_past_the_byte_cap() {
        assert!(CAPS.has_room(0, 0));
        assert!(InFlightCaps {
            max_messages: 1,
            max_bytes: 1
        }
        .has_room(0, usize::MAX));
    }

    #[test]
    fn either_cap_stops_reading() {
        assert!(CAPS.has_room(2, 99));
        assert!(!CAPS.has_room(3, 0), "message cap");
        assert!(!CAPS.has_room(1, 100), "byte cap reached");
        assert!(!CAPS.has_room(1, usize::MAX));
    }
}
