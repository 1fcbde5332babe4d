//! What one session of a process hands the next.

use outbox_core::{AbortedSpans, LifeCore, TextOnly};

use crate::kafka::PublicationSeen;

/// What one session hands the next within a process: the rules' memory
/// (`outbox_core::LifeCore`: the claim, the cluster, the last look) and the IO's own.
#[derive(Debug)]
pub(super) struct Carry {
    /// The claim, the cluster and server seen, the last matching look at the publication.
    pub(super) life: LifeCore<PublicationSeen>,
    /// This process has streamed from the slot: a missing slot was dropped under us.
    pub(super) seen_slot: bool,
    /// The last session made progress (resets the reconnect backoff).
    pub(super) progressed: bool,
    /// The server settings' warnings were logged.
    pub(super) settings_warned: bool,
    /// Standing by for a slot that another instance holds (logged on entry and takeover).
    pub(super) standing_by: bool,
    /// A Relation ruled binary values out in an earlier session: later ones stream text.
    pub(super) binary_ruled_out: Option<TextOnly>,
    /// Exactly-once mode: Kafka transactions this process aborted without asking to
    /// commit them, where Kafka may have left them open (`outbox_core::left_open`).
    pub(super) aborted_spans: AbortedSpans,
}

impl Carry {
    pub(super) fn new(exactly_once: bool) -> Self {
        Carry {
            life: LifeCore::new(exactly_once),
            seen_slot: false,
            progressed: false,
            settings_warned: false,
            standing_by: false,
            binary_ruled_out: None,
            aborted_spans: AbortedSpans::default(),
        }
    }
}
