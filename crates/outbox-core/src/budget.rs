//! Caps on what is handed to the producer but not yet acknowledged.
//!
//! When the budget is exhausted the relay stops *reading* replication data (it keeps
//! sending status updates) until delivery reports free room. A message is always allowed
//! when nothing is in flight, so a single message larger than `max_bytes` cannot deadlock
//! the pipeline; whether it fits the broker is [`crate::check_size`]'s concern.

/// Limits on in-flight (produced, unacknowledged) messages and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightBudget {
    pub max_messages: usize,
    pub max_bytes: usize,
}

impl InFlightBudget {
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        InFlightBudget {
            max_messages,
            max_bytes,
        }
    }

    /// Whether producing one more message of `next_bytes` would go over a limit, given
    /// `cur_msgs` messages and `cur_bytes` bytes in flight. Never true when nothing is in
    /// flight.
    pub fn would_exceed(&self, cur_msgs: usize, cur_bytes: usize, next_bytes: usize) -> bool {
        if cur_msgs == 0 {
            return false;
        }
        let over_bytes = match cur_bytes.checked_add(next_bytes) {
            Some(total) => total > self.max_bytes,
            None => true,
        };
        cur_msgs >= self.max_messages || over_bytes
    }

    /// [`InFlightBudget::would_exceed`] for a running [`InFlightUsage`].
    pub fn would_exceed_usage(&self, usage: &InFlightUsage, next_bytes: usize) -> bool {
        self.would_exceed(usage.messages, usage.bytes, next_bytes)
    }
}

/// Running count of in-flight messages and bytes. Removals saturate at zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlightUsage {
    pub messages: usize,
    pub bytes: usize,
}

impl InFlightUsage {
    /// A message of `bytes` was handed to the producer.
    pub fn add(&mut self, bytes: usize) {
        self.messages = self.messages.saturating_add(1);
        self.bytes = self.bytes.saturating_add(bytes);
    }

    /// A delivery report (success or failure) for a message of `bytes` arrived.
    pub fn remove(&mut self, bytes: usize) {
        self.messages = self.messages.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_message_always_allowed() {
        let b = InFlightBudget::new(10, 100);
        assert!(!b.would_exceed(0, 0, 1_000_000));
        let zero = InFlightBudget::new(0, 0);
        assert!(!zero.would_exceed(0, 0, 5));
        assert!(zero.would_exceed(1, 0, 0));
    }

    #[test]
    fn message_cap() {
        let b = InFlightBudget::new(3, usize::MAX);
        assert!(!b.would_exceed(2, 0, 1));
        assert!(b.would_exceed(3, 0, 1));
    }

    #[test]
    fn byte_cap_is_inclusive() {
        let b = InFlightBudget::new(100, 100);
        assert!(!b.would_exceed(1, 60, 40));
        assert!(b.would_exceed(1, 60, 41));
        assert!(b.would_exceed(1, 200, 0));
    }

    #[test]
    fn no_overflow() {
        let b = InFlightBudget::new(usize::MAX, usize::MAX);
        assert!(!b.would_exceed(usize::MAX - 1, usize::MAX - 1, 1));
        assert!(b.would_exceed(usize::MAX, 0, 0));
        assert!(b.would_exceed(1, usize::MAX, 1));
    }

    #[test]
    fn usage_tracks_and_saturates() {
        let mut u = InFlightUsage::default();
        u.add(10);
        u.add(20);
        assert_eq!(
            u,
            InFlightUsage {
                messages: 2,
                bytes: 30
            }
        );
        let b = InFlightBudget::new(2, 1000);
        assert!(b.would_exceed_usage(&u, 1));
        u.remove(20);
        assert!(!b.would_exceed_usage(&u, 1));
        u.remove(10);
        u.remove(10);
        assert_eq!(u, InFlightUsage::default());
    }

    proptest! {
        #[test]
        fn admitted_load_stays_within_limits_except_a_lone_message(
            max_messages in 1usize..20,
            max_bytes in 1usize..1000,
            sizes in prop::collection::vec(0usize..2000, 1..50),
        ) {
            let b = InFlightBudget::new(max_messages, max_bytes);
            let mut u = InFlightUsage::default();
            for s in sizes {
                if b.would_exceed_usage(&u, s) {
                    // Must be possible to make room: something is in flight.
                    prop_assert!(u.messages > 0);
                    u = InFlightUsage::default();
                }
                u.add(s);
                prop_assert!(u.messages == 1 || (u.messages <= max_messages && u.bytes <= max_bytes));
            }
        }
    }
}
