//! The rules between one session of a relay process and the next: which claim a session
//! starts with (this process's own from its last session, or the progress record's),
//! when a start is refused, and what a session hands the next by how it ended. The relay
//! reads the server and the record and calls these; the simulator calls the same code.
//!
//! `P` is a look at the publication (the relay's `PublicationSeen`); `E` the error a
//! refusal read from the record stops with (built by the caller, which knows the details
//! to name). Neither is looked into here.

use crate::DeliveredPosition;

/// A claim of what Kafka has, and the lineage it continues.
pub type Claim = (DeliveredPosition, u64);

/// How a session ended, for what the process carries into its next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A retryable error: the process starts another session with what it carries.
    Retry,
    /// Another instance streams from the slot now, and writes the record: what this one
    /// knew is older than what the record will say when it takes over.
    SlotTaken,
    /// A shutdown or a permanent error: the process exits, and its next one knows only
    /// the record.
    ProcessEnds,
}

/// Why a session must not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal<E> {
    /// The server is another cluster (another system identifier) than the first this
    /// process connected to: its LSNs mean nothing for our slot.
    OtherSystem { expected: String, found: String },
    /// The server is on an older timeline than one this process or the record saw: a
    /// primary left running after a standby was promoted, whose history was abandoned.
    TimelineWentBack { seen: u32, found: u32 },
    /// The record stops the relay (another cluster's record only, an unfinished
    /// back-fill): the caller's error, which names what to do.
    Record(E),
}

/// What one read of the slot's progress record found.
#[derive(Debug, Clone)]
pub struct SlotView<P, E> {
    /// This cluster's record of the slot: its claim and lineage.
    pub ours: Option<Claim>,
    /// The look at the publication to compare with (ours, or under another name).
    pub last_look: Option<P>,
    /// Set when only another cluster's record says the slot existed.
    pub other_cluster: Option<E>,
    /// Set when the slot's back-fill has not finished.
    pub backfill_unfinished: Option<E>,
    /// The retained records show two lineages taking turns: two live writers.
    pub writers_alternate: bool,
}

/// The result of trying to read the slot's progress record.
#[derive(Debug, Clone)]
pub enum RecordRead<P, E> {
    /// No progress record is kept.
    NotKept,
    /// Read.
    Read(SlotView<P, E>),
    /// Not a record outboxd writes: read, and vouching for nothing. Waiting for a
    /// readable one would hold the slot, and the primary's WAL, forever.
    Unreadable,
    /// Kafka did not answer (in time): nothing known, nothing compared yet.
    NotRead,
}

/// What a session starts knowing: the claim its replay may skip once proven, and the
/// look at the publication to compare with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known<P> {
    pub claim: Option<Claim>,
    pub publication: Option<P>,
    /// Whether the record (or the last session) was read: if not, the publication is
    /// compared once it is.
    pub read: bool,
    /// The record was read and holds no look at the publication for this slot.
    pub unrecorded: bool,
    /// The record shows another live writer: claims prove nothing from now on.
    pub foreign_writer: bool,
    /// The last session's replay was doubted ([`LifeCore::replay_unproven`]): the claim
    /// is not used.
    pub unproven: bool,
}

impl<P> Known<P> {
    /// Whether the coming replay skips just what the newest record claims, read and
    /// trusted whole: what `outbox_core::left_open`'s copies need
    /// ([`crate::FirstWrites::allow_copies`]).
    pub fn record_trusted(&self) -> bool {
        self.read && !self.unproven && !self.foreign_writer
    }
}

impl<P> Default for Known<P> {
    fn default() -> Self {
        Known {
            claim: None,
            publication: None,
            read: false,
            unrecorded: false,
            foreign_writer: false,
            unproven: false,
        }
    }
}

/// One relay process's memory between its sessions, and the rules over it.
#[derive(Debug, Clone)]
pub struct LifeCore<P> {
    /// Exactly-once: the record, written only inside committed transactions, is the
    /// whole truth; this process's memory never is.
    exactly_once: bool,
    /// The cluster (system identifier, timeline) the first connection found.
    system: Option<(String, u32)>,
    /// The server the last session streamed from.
    server: Option<(String, u16)>,
    claim: Option<Claim>,
    /// The publication at the last session's last matching look, and whether that look
    /// was compared with the record's.
    publication: Option<(P, bool)>,
    /// The last session's replay spilled and was then doubted ([`Self::replay_unproven`]):
    /// the next one skips nothing, or it would drop the same rows and end the same way.
    unproven: bool,
}

impl<P: Clone> LifeCore<P> {
    pub fn new(exactly_once: bool) -> Self {
        LifeCore {
            exactly_once,
            system: None,
            server: None,
            claim: None,
            publication: None,
            unproven: false,
        }
    }

    /// A session connected to `server`, which runs cluster `system_id` on `timeline`.
    /// Refuses another cluster and an older timeline; returns the earlier timeline when
    /// it changed (a promotion). Another server's history, or a new timeline, drops the
    /// carried claim: what this process proved is proven again from the record.
    pub fn connected<E>(
        &mut self,
        system_id: &str,
        timeline: u32,
        server: (String, u16),
    ) -> Result<Option<u32>, Refusal<E>> {
        let previous = match &mut self.system {
            None => {
                self.system = Some((system_id.to_owned(), timeline));
                None
            }
            Some((id, _)) if id != system_id => {
                return Err(Refusal::OtherSystem {
                    expected: id.clone(),
                    found: system_id.to_owned(),
                })
            }
            Some((_, seen)) if timeline < *seen => {
                return Err(Refusal::TimelineWentBack {
                    seen: *seen,
                    found: timeline,
                })
            }
            Some((_, seen)) if *seen != timeline => Some(std::mem::replace(seen, timeline)),
            Some(_) => None,
        };
        if previous.is_some() || self.server.as_ref().is_some_and(|s| *s != server) {
            self.claim = None;
        }
        self.server = Some(server);
        if self.exactly_once {
            self.claim = None;
        }
        Ok(previous)
    }

    /// Whether the session's start needs the record read: this process's own claim,
    /// newer than any record it wrote, comes first.
    pub fn needs_record(&self) -> bool {
        self.claim.is_none()
    }

    /// What the coming session knows: the claim carried from this process's last
    /// session, or else the record's (`read`, ignored when a claim is carried). Refuses
    /// what the record forbids, in order: another cluster's record, an unfinished
    /// back-fill, a record of a newer timeline than the server's.
    pub fn known<E>(&self, read: RecordRead<P, E>) -> Result<Known<P>, Refusal<E>> {
        let mut known = self.known_claim(read)?;
        if self.unproven {
            known.claim = None;
            known.unproven = true;
        }
        Ok(known)
    }

    fn known_claim<E>(&self, read: RecordRead<P, E>) -> Result<Known<P>, Refusal<E>> {
        if let Some(claim) = &self.claim {
            let (publication, read) = match &self.publication {
                Some((look, compared)) => (Some(look.clone()), *compared),
                None => (None, true),
            };
            return Ok(Known {
                claim: Some(claim.clone()),
                publication,
                read,
                ..Known::default()
            });
        }
        let view = match read {
            RecordRead::NotKept => {
                return Ok(Known {
                    read: true,
                    ..Known::default()
                })
            }
            RecordRead::Unreadable => {
                return Ok(Known {
                    read: true,
                    unrecorded: true,
                    ..Known::default()
                })
            }
            RecordRead::NotRead => return Ok(Known::default()),
            RecordRead::Read(view) => view,
        };
        if let Some(e) = view.other_cluster {
            return Err(Refusal::Record(e));
        }
        if let Some(e) = view.backfill_unfinished {
            return Err(Refusal::Record(e));
        }
        if let (Some((claim, _)), Some((_, now))) = (&view.ours, &self.system) {
            refuse_older_timeline(claim.timeline, *now)?;
        }
        Ok(Known {
            unrecorded: view.last_look.is_none(),
            claim: view.ours,
            publication: view.last_look,
            read: true,
            foreign_writer: view.writers_alternate,
            unproven: false,
        })
    }

    /// Whether this process carries a claim of its own into the next session.
    pub fn carries_claim(&self) -> bool {
        self.claim.is_some()
    }

    /// A session ran: its claim (once it started streaming) and its last matching look.
    /// Kept only by [`ended`](Self::ended) with [`Ended::Retry`].
    pub fn session_ran(&mut self, claim: Option<Claim>, publication: Option<(P, bool)>) {
        // A session that streamed skipped nothing or proved what it skipped: the next
        // may trust the record (or this claim) again.
        self.unproven &= claim.is_none();
        self.claim = claim.filter(|_| !self.exactly_once);
        self.publication = publication;
    }

    /// The session just ran ended with [`crate::SessionError::ReplayUnproven`]: the next
    /// session skips nothing (call after [`Self::session_ran`]).
    pub fn replay_unproven(&mut self) {
        self.unproven = true;
    }

    /// The session ended `how`: what the next one starts from.
    pub fn ended(&mut self, how: Ended) {
        match how {
            Ended::Retry => {}
            Ended::SlotTaken | Ended::ProcessEnds => {
                self.claim = None;
                self.publication = None;
            }
        }
    }
}

/// Refuses a server on timeline `now` when `recorded` is newer: a primary left running
/// after a standby was promoted. For [`LifeCore::known`], and a record read late.
pub fn refuse_older_timeline<E>(recorded: u32, now: u32) -> Result<(), Refusal<E>> {
    if now < recorded {
        return Err(Refusal::TimelineWentBack {
            seen: recorded,
            found: now,
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "life_tests.rs"]
mod tests;
