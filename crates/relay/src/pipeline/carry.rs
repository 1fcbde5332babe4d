//! What one session of a process hands the next.

use outbox_core::{DeliveredPosition, TextOnly};

use super::server::SeenSystem;
use crate::kafka::PublicationSeen;

/// What one session hands the next within a process.
#[derive(Debug, Default)]
pub(super) struct Carry {
    /// This process has streamed from the slot: a missing slot was dropped under us.
    pub(super) seen_slot: bool,
    /// The last session made progress (resets the reconnect backoff).
    pub(super) progressed: bool,
    /// What the last session claims Kafka has, and its lineage: replays of it are skipped
    /// once proven, like the progress record's.
    pub(super) delivered: Option<(DeliveredPosition, u64)>,
    /// The server settings' warnings were logged.
    pub(super) settings_warned: bool,
    /// The cluster (system identifier, timeline) the first connection found.
    pub(super) seen_system: Option<SeenSystem>,
    /// The server the last session streamed from (host, port).
    pub(super) seen_host: Option<(String, u16)>,
    /// Standing by for a slot that another instance holds (logged on entry and takeover).
    pub(super) standing_by: bool,
    /// The publication at the last session's last look that matched, and whether that
    /// look was compared with the record's: the next session compares with it, like with
    /// the progress record's.
    pub(super) publication: Option<(PublicationSeen, bool)>,
    /// A Relation ruled binary values out in an earlier session: later ones stream text.
    pub(super) binary_ruled_out: Option<TextOnly>,
}
