//! One session's replay rules, without IO: what is held, dropped as delivered, published
//! again, or skipped inside a partly delivered transaction, and what the session claims
//! for its progress record. The relay's session and the simulator (`crates/sim`) drive
//! the same code; the rules themselves are [`crate::delivered`]'s.
//!
//! The caller keeps the [`crate::InFlightLedger`]: a held record is registered there like
//! any produced one (so it counts against the caps and holds the watermark back) and
//! handed to [`ReplayCore::hold`] instead of the producer. [`Step::Drop`] gives back the
//! tickets to settle as acked without sending; [`Step::Release`] the records to send, in
//! order.

use std::collections::VecDeque;

use pgoutput::Lsn;

use crate::delivered::{
    Begin, DeliveredPosition, Doubt, PartialTxn, ReplayProof, RowId, RowLedger, Settle, TxnId,
};
use crate::ledger::Ticket;

/// At most this many committed transactions wait to become the claim's next mark; losing
/// the oldest only makes marks sparser.
const MARK_CANDIDATES: usize = 4096;

/// A record held while the proof is pending.
#[derive(Debug)]
pub struct Held<R> {
    pub ticket: Ticket,
    pub record: R,
    pub row: Option<RowId>,
}

/// What the caller must do after an input.
#[derive(Debug)]
#[must_use]
pub enum Step<R> {
    Nothing,
    /// Proven delivered: settle each held record's ticket as acked, publish nothing
    /// (their rows are already done here).
    Drop(Vec<Held<R>>),
    /// Doubted: send these, in this order.
    Release(Doubt, Vec<Held<R>>),
    /// The transaction that begins is the partly delivered one: its first `rows`
    /// published rows are skipped ([`ReplayCore::next_row`] says which).
    Resume {
        rows: u64,
    },
    /// Doubted after the hold spilled ([`ReplayCore::spill`]): records were dropped that
    /// nothing proved in Kafka, so the session must end without confirming past them.
    Unproven(Doubt),
}

/// What the next published row of the open transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRow {
    /// Publish it (`None`: outside a transaction, a non-transactional message).
    Publish(Option<RowId>),
    /// One of the leading rows of a partly delivered transaction: already in Kafka.
    InKafka,
}

/// The partly delivered transaction came back with fewer published rows than its claim
/// counted ([`Doubt::PartialRows`]), or with other leading rows ([`Doubt::PartialDigest`]):
/// the rows skipped so far may not be in Kafka, so the session must end before anything
/// of it is confirmed, and the next one publishes it whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialMismatch {
    pub commit_lsn: Lsn,
    pub recorded: u64,
    pub read: u64,
    pub reason: Doubt,
}

/// What came back, against what the progress record says.
impl std::fmt::Display for PartialMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let PartialMismatch {
            commit_lsn,
            recorded,
            read,
            reason,
        } = self;
        write!(f, "{commit_lsn} came back with ")?;
        if *reason == Doubt::PartialDigest {
            write!(
                f,
                "other leading rows than the {recorded} the progress record names"
            )
        } else {
            write!(
                f,
                "{read} published rows where the progress record counted {recorded} delivered"
            )
        }
    }
}

/// How a session starts: what it was told, and where it is.
#[derive(Debug, Clone)]
pub struct ReplayStart {
    pub timeline: u32,
    /// The slot's confirmed position: where the stream starts.
    pub start: Lsn,
    /// `IDENTIFY_SYSTEM`'s WAL position: nothing of this history lies past it.
    pub server_end: Lsn,
    /// The claim (progress record, or the previous session's) and its lineage.
    pub claim: Option<(DeliveredPosition, u64)>,
    /// This session's settings.
    pub fingerprint: u64,
    /// Another lineage was seen writing the record: nothing is skipped.
    pub foreign_writer: bool,
    /// At most this many published rows between two marks of the claims it writes (0:
    /// only the newest confirmed transaction is marked): a later replay holds what lies
    /// before its next mark, and a hold that fills the in-flight caps spills.
    pub mark_every: u64,
    /// At most this many rows kept in the row ledger past each transaction's leading done
    /// ones ([`RowLedger`]): `InFlightCaps::tracked_rows`.
    pub tracked_rows: usize,
    /// A fresh random lineage, used if the claim is not continued.
    pub new_lineage: u64,
    /// Another, for the claim of its own a session starts when it doubts the one it
    /// continued (two copies doubting one claim must not share a lineage).
    pub doubt_lineage: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct ReplayCore<R> {
    proof: ReplayProof,
    held: Vec<Held<R>>,
    /// What the session claims Kafka has: the claim it started with while not doubted,
    /// plus the transactions confirmed since.
    claim: DeliveredPosition,
    lineage: u64,
    /// The lineage before a doubt replaced it: records of it may still be the newest.
    prev_lineage: u64,
    /// The newest committed transactions, not confirmed yet: the newest confirmed one
    /// becomes the claim's newest mark.
    committed: VecDeque<(TxnId, Lsn)>,
    /// Committed transactions chosen as marks as they commit, so that at most
    /// `mark_every` rows lie between two (chosen here, not from `committed`, which keeps
    /// only the newest few thousand: single-row transactions outnumber it).
    boundaries: VecDeque<(TxnId, Lsn)>,
    /// The last committed transaction, and the rows since the last boundary up to it.
    since_boundary: (Option<(TxnId, Lsn)>, u64),
    /// See [`ReplayStart::mark_every`].
    mark_every: u64,
    open: Option<TxnId>,
    rows: RowLedger,
    /// Leading published rows of the open transaction still to skip.
    skip_rows: u64,
    /// The recorded row count of the open, partly delivered transaction, for its Commit.
    partial_rows: Option<u64>,
    /// The recorded partial transaction while its skipped rows' digest is not checked
    /// yet: until then it, and not what the skipped rows count as done, is the claim.
    verifying: Option<PartialTxn>,
    /// Doubts met (each is counted; the caller logs the first).
    doubts: Vec<Doubt>,
    /// Whether the open transaction's records are held.
    hold_open: bool,
    /// The hold spilled ([`ReplayCore::spill`]): records are dropped before their proof,
    /// and the first held one stays, keeping the confirmed position behind them.
    spilled: bool,
    /// Where the session started: the base of a claim of its own.
    start: Lsn,
    /// The lineage a doubt switches to (then spent: a claim is given up once).
    doubt_lineage: u64,
}

impl<R> ReplayCore<R> {
    /// The doubts met at the start are in [`ReplayCore::take_doubts`].
    pub fn new(s: ReplayStart) -> Self {
        let mut doubts = Vec::new();
        let fresh = |lsn| DeliveredPosition::at(s.timeline, lsn, s.fingerprint);
        let (proof, claim, lineage) = match s.claim {
            None => (ReplayProof::none(), fresh(s.start), s.new_lineage),
            Some((known, lineage)) => {
                // Positions past this server's end are another history's: cut them off;
                // what is left must still be proven like any claim.
                let (known, lineage) = match known.within(s.server_end) {
                    None => (known, lineage),
                    Some(cut) => {
                        doubts.push(Doubt::PastServerEnd);
                        (cut, s.new_lineage)
                    }
                };
                let (proof, doubt) = ReplayProof::new(&known, s.fingerprint, s.start);
                let doubt = doubt.or_else(|| {
                    (s.foreign_writer && (proof.holding() || proof.partial().is_some()))
                        .then_some(Doubt::ForeignWriter)
                });
                match doubt {
                    Some(d) => {
                        doubts.push(d);
                        (ReplayProof::none(), fresh(s.start), s.new_lineage)
                    }
                    // A claim is continued only through a proof in this stream: one with
                    // nothing left to prove here may be another history's, and its base
                    // would then vouch for transactions this history's relays never sent.
                    // The partly delivered transaction it names is still skipped only on
                    // its exact identity.
                    // Its position proves nothing either, but keeping it keeps the record
                    // from moving back (it is within this server's WAL).
                    // Its time still bounds what came after its position, which the
                    // new claim's is at or past; not when another live copy writes the
                    // record (its time is that copy's).
                    None if !proof.holding() => {
                        let at = DeliveredPosition {
                            since: known.since.filter(|_| !s.foreign_writer),
                            ..fresh(s.start.max(known.lsn))
                        };
                        (proof, at, s.new_lineage)
                    }
                    None => {
                        let lineage = if lineage == 0 { s.new_lineage } else { lineage };
                        (proof, known, lineage)
                    }
                }
            }
        };
        ReplayCore {
            proof,
            held: Vec::new(),
            claim: DeliveredPosition {
                fingerprint: s.fingerprint,
                timeline: s.timeline,
                ..claim
            },
            lineage,
            prev_lineage: 0,
            committed: VecDeque::new(),
            boundaries: VecDeque::new(),
            since_boundary: (None, 0),
            mark_every: s.mark_every,
            open: None,
            rows: RowLedger::new(s.tracked_rows),
            skip_rows: 0,
            partial_rows: None,
            verifying: None,
            doubts,
            hold_open: false,
            spilled: false,
            start: s.start,
            doubt_lineage: s.doubt_lineage,
        }
    }

    /// Doubts met since the last call, oldest first.
    pub fn take_doubts(&mut self) -> Vec<Doubt> {
        std::mem::take(&mut self.doubts)
    }

    /// Whether what is produced now must be handed to [`ReplayCore::hold`]: the open
    /// transaction is held, or (outside one) a mark is still to be proven.
    pub fn holding(&self) -> bool {
        if self.open.is_some() {
            self.hold_open
        } else {
            self.proof.holding() && !self.held.is_empty()
        }
    }

    /// Whether the leading rows skipped so far in the open transaction are still unproven:
    /// their digest is checked once the recorded count is reached, and a mismatch ends the
    /// session unconfirmed. Until then a skip is provisional.
    pub fn proving_partial(&self) -> bool {
        self.verifying.is_some()
    }

    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// The lineage written now, and the one before it.
    pub fn lineages(&self) -> (u64, u64) {
        (self.lineage, self.prev_lineage)
    }

    /// A Begin.
    pub fn begin(&mut self, txn: TxnId) -> Step<R> {
        self.open = Some(txn);
        self.rows.begin(txn);
        self.skip_rows = 0;
        self.partial_rows = None;
        self.verifying = None;
        let verdict = self.proof.on_begin(txn);
        self.hold_open = verdict == Begin::Hold;
        match verdict {
            Begin::Hold | Begin::Publish => Step::Nothing,
            Begin::SkipRows { rows, digest } => {
                self.skip_rows = rows;
                self.partial_rows = Some(rows);
                self.verifying = Some(PartialTxn {
                    txn,
                    rows,
                    digest: Some(digest),
                });
                Step::Resume { rows }
            }
            Begin::Release(d) => self.settle(Settle::Release(d)),
        }
    }

    /// Takes the next published row (a record or a dead letter) of the open transaction,
    /// with its [`crate::delivered::row_identity`]. An error: the rows skipped are not the
    /// recorded ones, and the transaction must not be confirmed.
    pub fn next_row(&mut self, identity: u64) -> Result<NextRow, PartialMismatch> {
        let row = self.rows.next_row(identity);
        if self.skip_rows == 0 {
            return Ok(NextRow::Publish(row));
        }
        self.skip_rows -= 1;
        if let Some(row) = row {
            self.rows.done(row);
        }
        if self.skip_rows == 0 {
            if let Some(recorded) = self.verifying.take() {
                let replayed = self.rows.open_done();
                if replayed.and_then(|r| r.digest) != recorded.digest {
                    return Err(self.partial_mismatch(recorded, Doubt::PartialDigest));
                }
            }
        }
        Ok(NextRow::InKafka)
    }

    /// The partly delivered transaction is not what its claim says: the claim is given
    /// up, and the rows skipped count as done, so no claim may name it partly delivered
    /// again.
    fn partial_mismatch(&mut self, recorded: PartialTxn, reason: Doubt) -> PartialMismatch {
        let read = self.rows.open_rows();
        self.rows = self.rows.emptied();
        self.verifying = None;
        self.partial_rows = None;
        self.skip_rows = 0;
        self.doubted(reason);
        PartialMismatch {
            commit_lsn: recorded.txn.commit_lsn,
            recorded: recorded.rows,
            read,
            reason,
        }
    }

    /// A record registered in the ledger while [`ReplayCore::holding`]. After a spill it
    /// is dropped at once: returned, for the caller to settle as acked.
    #[must_use]
    pub fn hold(&mut self, ticket: Ticket, record: R, row: Option<RowId>) -> Option<Held<R>> {
        let held = Held {
            ticket,
            record,
            row,
        };
        if self.spilled {
            if let Some(row) = row {
                self.rows.done(row);
            }
            return Some(held);
        }
        self.held.push(held);
        None
    }

    /// Whether the row ledger may take another row ([`RowLedger::has_room`]).
    pub fn rows_have_room(&self) -> bool {
        self.rows.has_room()
    }

    /// Rows the row ledger keeps ([`RowLedger::kept`]).
    pub fn rows_kept(&self) -> usize {
        self.rows.kept()
    }

    /// A published row's ack.
    pub fn acked(&mut self, row: RowId) {
        self.rows.done(row);
    }

    /// The open transaction's Commit; call before the ledger's. An error: the partly
    /// delivered transaction did not match its claim, and must not be confirmed.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<Step<R>, PartialMismatch> {
        let txn = self.open.take();
        let rows = self.rows.open_rows();
        if let (Some(recorded), Some(txn)) = (self.partial_rows.take(), txn) {
            if self.rows.open_rows() < recorded {
                let recorded = PartialTxn {
                    txn,
                    rows: recorded,
                    digest: None,
                };
                return Err(self.partial_mismatch(recorded, Doubt::PartialRows));
            }
        }
        self.rows.commit();
        self.skip_rows = 0;
        if let Some(txn) = txn {
            if self.committed.len() >= MARK_CANDIDATES {
                self.committed.pop_front();
            }
            self.committed.push_back((txn, end_lsn));
            self.choose_boundary(txn, end_lsn, rows);
        }
        Ok(match self.proof.on_commit(end_lsn) {
            Some(settle) => self.settle(settle),
            None => Step::Nothing,
        })
    }

    /// A keepalive outside any transaction.
    pub fn keepalive(&mut self, wal_end: Lsn) -> Step<R> {
        match self.proof.on_keepalive(wal_end) {
            Some(settle) => self.settle(settle),
            None => Step::Nothing,
        }
    }

    /// The in-flight caps are reached while holding (nothing held is ever acked, so
    /// waiting for room would wait forever). Publishing the hold would be a duplicate of
    /// each record the next mark proves; a replay from a checkpoint minutes old, after a
    /// PostgreSQL crash, reaches marks thinned far apart. So the hold spills instead: the
    /// held records but the first are dropped before their proof, returned for the caller
    /// to settle as acked, and so is every record held from now until the next mark. The
    /// first stays in flight: nothing past it is confirmed before the proof, and a doubt
    /// then ends the session ([`Step::Unproven`]); the next one, told by
    /// `LifeCore::replay_unproven`, publishes them from the slot. Memory stays within the
    /// caps however far back a replay starts.
    pub fn spill(&mut self) -> Vec<Held<R>> {
        if self.held.is_empty() {
            return Vec::new();
        }
        self.spilled = true;
        // The first one's row too: its ticket, not its row, keeps the position back, and
        // a row left undone would keep every later row of its transaction in the row
        // ledger (a bulk insert replayed whole). None is claimed as partial meanwhile.
        for row in self.held.iter().filter_map(|h| h.row) {
            self.rows.done(row);
        }
        self.held.split_off(1)
    }

    /// Whether records were dropped unproven ([`ReplayCore::spill`]) and no mark has
    /// proven them yet.
    pub fn spilled(&self) -> bool {
        self.spilled
    }

    /// A doubt from outside the stream (another writer of the record).
    pub fn doubt(&mut self, d: Doubt) -> Step<R> {
        if !self.proof.holding() && self.proof.partial().is_none() {
            return Step::Nothing;
        }
        self.settle(Settle::Release(d))
    }

    fn settle(&mut self, settle: Settle) -> Step<R> {
        let held = std::mem::take(&mut self.held);
        match settle {
            Settle::Proven => {
                self.spilled = false;
                for row in held.iter().filter_map(|h| h.row) {
                    self.rows.done(row);
                }
                Step::Drop(held)
            }
            Settle::Release(d) => {
                self.doubted(d);
                if self.spilled {
                    return Step::Unproven(d);
                }
                Step::Release(d, held)
            }
        }
    }

    fn doubted(&mut self, d: Doubt) {
        self.doubts.push(d);
        self.proof.doubt();
        // What the session confirms from here on is its own claim, in a lineage of its
        // own: the one it read is not this history's. Its position stays what the claim
        // said only while the claim stood; from here the caller's confirmed position (see
        // `claim_at`) rebuilds it.
        self.claim = DeliveredPosition::at(self.claim.timeline, self.start, self.claim.fingerprint);
        self.hold_open = false;
        if self.doubt_lineage != 0 && self.doubt_lineage != self.lineage {
            self.prev_lineage = self.lineage;
            self.lineage = std::mem::take(&mut self.doubt_lineage);
        }
    }

    /// The partly acked transaction worth recording at `lsn`. After a spill, until proven,
    /// only the claim's own: rows dropped unproven count as done, and must not be claimed.
    fn partial_at(&self, lsn: Lsn) -> Option<PartialTxn> {
        let claimed = self.proof.partial().filter(|p| p.txn.commit_lsn >= lsn);
        if self.spilled {
            return claimed;
        }
        self.verifying
            .or_else(|| self.rows.partial(lsn))
            .or(claimed)
    }

    /// A transaction of `rows` published rows committed: the one before it becomes a
    /// boundary if counting this one would put more than `mark_every` rows since the
    /// last. (The rows since then are not reset when [`Self::claim_at`] marks a newer
    /// transaction: counting too many only makes marks denser.)
    fn choose_boundary(&mut self, txn: TxnId, end_lsn: Lsn, rows: u64) {
        let (last, since) = &mut self.since_boundary;
        if let Some(last) = (*last).filter(|_| self.mark_every > 0) {
            if since.saturating_add(rows) > self.mark_every {
                if self.boundaries.len() >= MARK_CANDIDATES {
                    self.boundaries.pop_front();
                }
                self.boundaries.push_back(last);
                *since = 0;
            }
        }
        *since = since.saturating_add(rows);
        *last = Some((txn, end_lsn));
    }

    /// What the session claims Kafka has when `confirmed` is confirmed, and its lineage:
    /// the newest confirmed transaction becomes the newest mark, after the boundaries up
    /// to it (a replay holds what lies before its next mark, and one write can cover more
    /// than the in-flight caps: one Kafka transaction of the exactly-once mode, or a
    /// second of at-least-once records). The position never moves back: a session starts
    /// at the slot's, often behind the claim it read, and recording that would make the
    /// next one publish everything the claim covered.
    pub fn claim_at(&mut self, confirmed: Lsn) -> (DeliveredPosition, u64) {
        while let Some(&(txn, end)) = self.boundaries.front() {
            if end > confirmed {
                break;
            }
            self.boundaries.pop_front();
            self.claim.push_mark(txn, end);
        }
        let mut newest = None;
        while let Some(&(txn, end)) = self.committed.front() {
            if end > confirmed {
                break;
            }
            newest = Some((txn, end));
            self.committed.pop_front();
        }
        if let Some((txn, end)) = newest {
            self.claim.push_mark(txn, end);
        }
        self.claim.lsn = self.claim.lsn.max(confirmed);
        self.rows.confirmed(self.claim.lsn);
        self.claim.partial = self.partial_at(self.claim.lsn);
        (self.claim.clone(), self.lineage)
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
