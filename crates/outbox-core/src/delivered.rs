//! Skipping what Kafka already has when PostgreSQL replays it, only where it is proven.
//!
//! A logical slot's `confirmed_flush_lsn` is made durable only at checkpoints, so after a
//! PostgreSQL restart the server sends again every transaction since the last one. The
//! relay's progress record (and, within one process, the last session) says what was
//! delivered. That claim is only trusted where this stream proves it: names (system
//! identifier, database, slot, timeline) are shared by clones, restored backups and
//! promoted copies, so they prove nothing.
//!
//! - A claim ([`DeliveredPosition`]) names the exact transactions its last writes ended
//!   at ([`TxnMark`]: commit and end LSN, xid, commit time) and a fingerprint of the
//!   settings that decide what is published.
//! - A session holds every replayed record ([`ReplayProof`] says [`Begin::Hold`]),
//!   without publishing it, until the stream shows it the next recorded transaction at
//!   its recorded position, identical in every field: then what it held is delivered and
//!   dropped ([`Settle::Proven`]). Any doubt ([`Doubt`]) publishes what is held: a
//!   mismatch, a mark the stream passed without showing it, a claim past the server's
//!   WAL end, another fingerprint, the hold reaching the in-flight caps. Duplicates,
//!   never a loss.
//! - No clock takes part: commit times are only compared for equality.
//! - Inside the transaction the claim was partly acked in ([`PartialTxn`]), only its first
//!   published rows are skipped, counted over the rows the relay publishes (records and
//!   dead letters), never over changes it ignores, and only under the same fingerprint;
//!   and only when the replayed leading rows have the recorded [`RowDigest`] (a count alone
//!   proves nothing: anyone who may write the progress topic could raise it).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use pgoutput::{Lsn, PgTimestamp};

/// One transaction exactly: what a replay must show at the same position to prove that
/// it is the transaction that was delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMark {
    /// Which write of the claim added it (1, 2, …), carried across processes; decides
    /// which marks are kept (see [`DeliveredPosition::push_mark`]).
    pub seq: u64,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub xid: u32,
    /// PostgreSQL's microseconds since 2000-01-01, exactly as the Begin carries it.
    pub commit_time: i64,
}

impl TxnMark {
    fn is(&self, id: TxnId) -> bool {
        self.commit_lsn == id.commit_lsn && self.xid == id.xid && self.commit_time == id.commit_time
    }
}

/// What a Begin says of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnId {
    pub commit_lsn: Lsn,
    pub xid: u32,
    pub commit_time: i64,
}

impl TxnId {
    pub fn new(commit_lsn: Lsn, xid: u32, commit_time: PgTimestamp) -> Self {
        TxnId {
            commit_lsn,
            xid,
            commit_time: commit_time.0,
        }
    }
}

/// The leading published rows of one transaction that the broker acked, in order from
/// its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartialTxn {
    pub txn: TxnId,
    pub rows: u64,
    /// The [`RowDigest`] of those rows; `None` (a record written before digests) proves
    /// nothing, so nothing of it is skipped.
    pub digest: Option<u64>,
}

/// FNV-1a, the hash of fingerprints and row digests: stable across builds and platforms
/// (they are compared with what another process wrote).
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// The identity of one published row, as a replay sees it again before mapping it: for
/// an outbox row the raw value of its id column (the outbox's primary key), for an
/// emitted message its WAL position. Cheap (a few dozen bytes hashed) and exact: the
/// same transaction on the same history gives the same identities.
pub fn row_identity(tag: u8, bytes: &[u8]) -> u64 {
    fnv(
        FNV_OFFSET,
        std::iter::once(tag).chain(bytes.iter().copied()),
    )
}

/// A transaction's leading published rows' identities, folded in order: what a
/// [`PartialTxn`] proves its row count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowDigest(u64);

impl Default for RowDigest {
    fn default() -> Self {
        RowDigest(FNV_OFFSET)
    }
}

impl RowDigest {
    #[must_use]
    pub fn push(self, identity: u64) -> Self {
        RowDigest(fnv(self.0, identity.to_le_bytes()))
    }

    pub fn value(self) -> u64 {
        self.0
    }
}

/// Marks kept at every write, and again at each coarser level (see `keeps`).
const MARKS_PER_LEVEL: u64 = 40;
/// Levels of marks: level L keeps every 2^L-th write of the last `MARKS_PER_LEVEL << L`.
const MARK_LEVELS: u32 = 6;
/// At most this many marks are read from a claim (a record written by a bug or by hand
/// must not cost the reader unbounded memory).
pub const MAX_MARKS: usize = 256;

/// Whether mark `seq` is kept when the newest is `latest`: every mark of the last 40,
/// every 2nd of the last 80, every 4th of the last 160, … every 64th of the last 2560.
/// About 160 marks (~10 KB of record), dense where replays usually start and sparse
/// further back, where a replay costs duplicates up to the first mark it reaches. A write
/// adds one mark, or more where many rows lie between (`ReplayStart::mark_every`, a
/// quarter of the in-flight cap): a hold between kept marks fits the caps while they are
/// at most 4 apart, the last 160 marks (after a PostgreSQL crash, the slot's position of
/// the last checkpoint may be further back).
fn keeps(seq: u64, latest: u64) -> bool {
    let level = seq.trailing_zeros().min(MARK_LEVELS);
    latest.saturating_sub(seq) < MARKS_PER_LEVEL << level
}

/// What a writer claims the broker has, and on which history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveredPosition {
    pub timeline: u32,
    /// Everything before this was acked (an `end_lsn` or a keepalive's `walEnd` the relay
    /// confirmed). Not a proof of anything by itself.
    pub lsn: Lsn,
    /// Where the claim begins: the slot's position when its writers started relaying
    /// under these settings. It says nothing of transactions before it (relayed under
    /// other settings, or by a claim it doubted), so a replay from below it publishes
    /// them.
    pub base: Lsn,
    /// Transactions its writes ended at, oldest first, each fully acked and
    /// `end_lsn <= lsn`.
    pub marks: Vec<TxnMark>,
    /// A transaction at or past `lsn` whose leading published rows are acked.
    pub partial: Option<PartialTxn>,
    /// The writer's [`Fingerprint`]: a claim made under other settings proves nothing.
    pub fingerprint: u64,
    /// A server time no transaction past `lsn` committed before (PostgreSQL's microseconds
    /// since 2000-01-01): the commit time of the newest mark, or the server's clock just
    /// before the slot was created. What an operator re-publishes from when the slot is
    /// lost. Only ever read from a commit or the server, never the writer's clock: a
    /// record rewritten later with the same position must not name a later time. `None`:
    /// unknown (re-publish everything that may be missing).
    pub since: Option<i64>,
}

impl DeliveredPosition {
    /// A claim of nothing but a position (a new slot's start, or a record of an older
    /// version): it skips nothing.
    pub fn at(timeline: u32, lsn: Lsn, fingerprint: u64) -> Self {
        DeliveredPosition {
            timeline,
            lsn,
            base: lsn,
            marks: Vec::new(),
            partial: None,
            fingerprint,
            since: None,
        }
    }

    /// Adds the transaction the confirmed position reached (if it is newer than the last
    /// mark), and thins the older marks.
    pub fn push_mark(&mut self, txn: TxnId, end_lsn: Lsn) {
        let last = self.marks.last().copied();
        if last.is_some_and(|m| m.end_lsn >= end_lsn) {
            return;
        }
        let seq = last.map_or(1, |m| m.seq.saturating_add(1));
        self.marks.push(TxnMark {
            seq,
            commit_lsn: txn.commit_lsn,
            end_lsn,
            xid: txn.xid,
            commit_time: txn.commit_time,
        });
        // The newest, not the latest clock reading: after a clock step back, a later
        // transaction may carry an earlier time, and the bound must stay below it.
        self.since = Some(txn.commit_time);
        self.marks.retain(|m| keeps(m.seq, seq));
    }

    /// The claim as far as a server whose WAL ends at `server_end` can show it: marks
    /// past that end are another history's (a copy that wrote more WAL, or the history
    /// before a restore), and so is a partial transaction there. `None`: nothing was cut.
    pub fn within(&self, server_end: Lsn) -> Option<DeliveredPosition> {
        let beyond = self.lsn > server_end
            || self.marks.iter().any(|m| m.end_lsn > server_end)
            || self.partial.is_some_and(|p| p.txn.commit_lsn > server_end);
        if !beyond {
            return None;
        }
        let marks: Vec<TxnMark> = self
            .marks
            .iter()
            .filter(|m| m.end_lsn <= server_end)
            .copied()
            .collect();
        Some(DeliveredPosition {
            timeline: self.timeline,
            lsn: marks.last().map_or(self.base, |m| m.end_lsn),
            base: self.base.min(server_end),
            since: marks.last().map(|m| m.commit_time),
            marks,
            partial: None,
            fingerprint: self.fingerprint,
        })
    }

    /// The newest mark, the transaction the claim is proven by.
    pub fn newest_mark(&self) -> Option<&TxnMark> {
        self.marks.last()
    }
}

/// Names a reason a replay was published instead of skipped, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doubt {
    /// The claim was written under other settings (table, publication, prefix, topics…).
    Fingerprint,
    /// The claim names positions past the server's WAL end: another copy's record.
    PastServerEnd,
    /// The transaction at a recorded position is another one.
    Mismatch,
    /// The stream went past a recorded position without showing its transaction.
    Passed,
    /// Another writer records under this key (two live copies of one cluster).
    ForeignWriter,
    /// The partly acked transaction came back with fewer published rows than recorded.
    PartialRows,
    /// The partly acked transaction's leading rows are not the recorded ones (their
    /// digest differs), or the record names none (written before digests).
    PartialDigest,
}

impl Doubt {
    pub fn as_str(self) -> &'static str {
        match self {
            Doubt::Fingerprint => "fingerprint",
            Doubt::PastServerEnd => "past_server_end",
            Doubt::Mismatch => "mismatch",
            Doubt::Passed => "passed",
            Doubt::ForeignWriter => "foreign_writer",
            Doubt::PartialRows => "partial_rows",
            Doubt::PartialDigest => "partial_digest",
        }
    }

    pub const ALL: [Doubt; 7] = [
        Doubt::Fingerprint,
        Doubt::PastServerEnd,
        Doubt::Mismatch,
        Doubt::Passed,
        Doubt::ForeignWriter,
        Doubt::PartialRows,
        Doubt::PartialDigest,
    ];

    /// What it means, for the one log line a session writes about it.
    pub fn explain(self) -> &'static str {
        match self {
            Doubt::Fingerprint => "the progress record was written under other settings (table, publication, message prefix, heartbeat, topics or mapping)",
            Doubt::PastServerEnd => "the progress record names positions past this server's WAL end: another copy of this cluster (a clone, snapshot or restore) records under the same key; set OUTBOXD_CLUSTER_NAME differently on each copy",
            Doubt::Mismatch => "the transaction at a recorded position is not the recorded one: the server's history is not the one the record was written on (a clone, restore or failover)",
            Doubt::Passed => "the stream went past a recorded position without the recorded transaction: the server's history is not the one the record was written on",
            Doubt::ForeignWriter => "another relay writes this slot's progress record (two live copies of one cluster share one Kafka); set OUTBOXD_CLUSTER_NAME differently on each copy",
            Doubt::PartialRows => "the partly delivered transaction came back with fewer published rows than recorded",
            Doubt::PartialDigest => "the leading rows of the partly delivered transaction are not the ones the progress record names (a record from before row digests, or one written by another principal: only outboxd's may write OUTBOXD_PROGRESS_TOPIC, see docs/replay-skip.md)",
        }
    }
}

/// What to do with the records of a transaction that begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Publish them.
    Publish,
    /// Hold them, unpublished, until the claim is proven or doubted.
    Hold,
    /// Release what is held (publish it), for this reason, and publish these too.
    Release(Doubt),
    /// Its first `rows` published rows are in Kafka if their [`RowDigest`] is `digest`:
    /// drop those (the caller checks the digest before anything past them), publish the
    /// rest.
    SkipRows { rows: u64, digest: u64 },
}

/// What becomes of the records held so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Delivered: drop them unpublished.
    Proven,
    /// Publish them.
    Release(Doubt),
}

/// The proof of one session's replay against a claim. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct ReplayProof {
    /// Marks past the session's start not yet proven, oldest first.
    marks: VecDeque<TxnMark>,
    /// The claim's base: transactions before it are published, not held.
    base: Lsn,
    /// The open transaction is the next mark by its Begin; its end decides.
    at_mark: bool,
    partial: Option<PartialTxn>,
}

impl ReplayProof {
    /// Skips nothing.
    pub fn none() -> Self {
        ReplayProof::default()
    }

    /// A session starting at the slot's `start` with `known` claimed (already cut to the
    /// server's WAL end, see [`DeliveredPosition::within`]), and `fingerprint` its own
    /// settings'. The doubt that made it skip nothing, if one did.
    pub fn new(known: &DeliveredPosition, fingerprint: u64, start: Lsn) -> (Self, Option<Doubt>) {
        let marks: VecDeque<TxnMark> = known
            .marks
            .iter()
            .filter(|m| m.end_lsn > start)
            .take(MAX_MARKS)
            .copied()
            .collect();
        let partial = known.partial.filter(|p| p.rows > 0);
        if marks.is_empty() && partial.is_none() {
            return (ReplayProof::none(), None);
        }
        if known.fingerprint != fingerprint {
            return (ReplayProof::none(), Some(Doubt::Fingerprint));
        }
        (
            ReplayProof {
                marks,
                base: known.base,
                at_mark: false,
                partial,
            },
            None,
        )
    }

    /// Whether what is produced now must be held.
    pub fn holding(&self) -> bool {
        !self.marks.is_empty()
    }

    /// The partly acked transaction still to come.
    pub fn partial(&self) -> Option<PartialTxn> {
        self.partial
    }

    /// Marks not proven yet (and not doubted).
    pub fn pending_marks(&self) -> impl Iterator<Item = &TxnMark> {
        self.marks.iter()
    }

    /// Gives up the claim: nothing more is held or skipped.
    pub fn doubt(&mut self) {
        self.marks.clear();
        self.at_mark = false;
        self.partial = None;
    }

    /// A transaction's Begin.
    pub fn on_begin(&mut self, txn: TxnId) -> Begin {
        if txn.commit_lsn < self.base {
            // The claim says nothing of it.
            return Begin::Publish;
        }
        if let Some(next) = self.marks.front().copied() {
            if txn.commit_lsn < next.commit_lsn {
                return Begin::Hold;
            }
            if next.is(txn) {
                self.at_mark = true;
                return Begin::Hold;
            }
            self.doubt();
            return Begin::Release(Doubt::Mismatch);
        }
        match self.partial {
            Some(p) if p.txn == txn => {
                self.partial = None;
                match p.digest {
                    Some(digest) => Begin::SkipRows {
                        rows: p.rows,
                        digest,
                    },
                    // A count alone proves nothing.
                    None => {
                        self.doubt();
                        Begin::Release(Doubt::PartialDigest)
                    }
                }
            }
            Some(p) if txn.commit_lsn >= p.txn.commit_lsn => {
                // Past it (or another transaction in its place): nothing more to skip.
                self.partial = None;
                Begin::Publish
            }
            _ => Begin::Publish,
        }
    }

    /// The open transaction's Commit.
    pub fn on_commit(&mut self, end_lsn: Lsn) -> Option<Settle> {
        if !std::mem::take(&mut self.at_mark) {
            return None;
        }
        match self.marks.pop_front() {
            Some(m) if m.end_lsn == end_lsn => Some(Settle::Proven),
            _ => {
                self.doubt();
                Some(Settle::Release(Doubt::Mismatch))
            }
        }
    }

    /// A keepalive outside any transaction: the server has sent everything before
    /// `wal_end`, so a mark at or before it that was not shown is not in this history.
    pub fn on_keepalive(&mut self, wal_end: Lsn) -> Option<Settle> {
        let next = self.marks.front()?;
        if wal_end >= next.end_lsn {
            self.doubt();
            return Some(Settle::Release(Doubt::Passed));
        }
        None
    }
}

/// A stable 64-bit hash (FNV-1a) of the settings that decide which rows are published
/// and where, fed as named fields so that reordering the code does not change it.
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Fingerprint(FNV_OFFSET)
    }
}

impl Fingerprint {
    pub fn add(self, name: &str, value: &str) -> Self {
        let bytes = name
            .bytes()
            .chain([0u8])
            .chain(value.bytes())
            .chain([0xffu8]);
        Fingerprint(fnv(self.0, bytes))
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// One published row of a transaction: its commit LSN and its index among the rows the
/// relay published (or dead-lettered) in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowId {
    pub commit_lsn: Lsn,
    pub index: u64,
}

#[derive(Debug)]
struct TxnRows {
    txn: TxnId,
    /// Rows read so far.
    read: u64,
    /// Rows 0..done are all done (acked, or already in Kafka).
    done: u64,
    /// The digest of rows 0..done.
    digest: RowDigest,
    /// The identities of rows done..read, in order.
    pending: VecDeque<u64>,
    /// Done rows past the first not done one.
    ahead: BTreeSet<u64>,
    committed: bool,
}

impl TxnRows {
    fn advance(&mut self) {
        self.done += 1;
        if let Some(identity) = self.pending.pop_front() {
            self.digest = self.digest.push(identity);
        }
    }

    fn partial(&self) -> PartialTxn {
        PartialTxn {
            txn: self.txn,
            rows: self.done,
            digest: Some(self.digest.value()),
        }
    }
}

/// Which leading published rows of each transaction with rows in flight are done. An
/// entry leaves as soon as its transaction is committed and all its rows are done, so it
/// holds no more entries than there are transactions with messages in flight, plus the
/// open one. The biggest of those that left is kept as `finished` until the confirmed
/// position passes it: until then the watermark does not cover it, and a record that
/// named neither would make a restart publish it whole.
///
/// The rows between a transaction's first not done row and its last read are kept one by
/// one, to digest in order: a row stuck unacked (a partition without a leader) while the
/// rest of a bulk insert is acked would keep every later row. So reading waits while
/// `limit` of them are kept over all transactions ([`RowLedger::has_room`]), as it waits
/// for the in-flight caps. Following fewer rows is no way out: under exactly-once a claim
/// must name every row a committed Kafka transaction holds, or a restart publishes them
/// again.
#[derive(Debug)]
pub struct RowLedger {
    txns: BTreeMap<Lsn, TxnRows>,
    open: Option<Lsn>,
    finished: Option<PartialTxn>,
    limit: usize,
    /// Rows kept in `pending` over all transactions.
    kept: usize,
}

impl Default for RowLedger {
    fn default() -> Self {
        RowLedger::new(usize::MAX)
    }
}

impl RowLedger {
    /// A ledger keeping at most `limit` rows past the leading done ones (see the type).
    pub fn new(limit: usize) -> Self {
        RowLedger {
            txns: BTreeMap::new(),
            open: None,
            finished: None,
            limit,
            kept: 0,
        }
    }

    /// The same limit, nothing in it.
    pub fn emptied(&self) -> Self {
        RowLedger::new(self.limit)
    }

    /// A transaction's Begin.
    pub fn begin(&mut self, txn: TxnId) {
        self.txns.entry(txn.commit_lsn).or_insert(TxnRows {
            txn,
            read: 0,
            done: 0,
            digest: RowDigest::default(),
            pending: VecDeque::new(),
            ahead: BTreeSet::new(),
            committed: false,
        });
        self.open = Some(txn.commit_lsn);
    }

    /// The next published row of the open transaction, with its [`row_identity`] (`None`
    /// outside one).
    pub fn next_row(&mut self, identity: u64) -> Option<RowId> {
        let commit_lsn = self.open?;
        let t = self.txns.get_mut(&commit_lsn)?;
        let index = t.read;
        t.read += 1;
        t.pending.push_back(identity);
        self.kept += 1;
        Some(RowId { commit_lsn, index })
    }

    /// The open transaction's done rows and their digest.
    pub fn open_done(&self) -> Option<PartialTxn> {
        self.open
            .and_then(|lsn| self.txns.get(&lsn))
            .map(TxnRows::partial)
    }

    /// Published rows of the open transaction so far.
    pub fn open_rows(&self) -> u64 {
        self.open
            .and_then(|lsn| self.txns.get(&lsn))
            .map_or(0, |t| t.read)
    }

    /// The row is acked, or already in Kafka.
    pub fn done(&mut self, row: RowId) {
        let Some(t) = self.txns.get_mut(&row.commit_lsn) else {
            return;
        };
        if row.index == t.done {
            t.advance();
            self.kept = self.kept.saturating_sub(1);
            while t.ahead.remove(&t.done) {
                t.advance();
                self.kept = self.kept.saturating_sub(1);
            }
        } else if row.index > t.done {
            t.ahead.insert(row.index);
        }
        if t.committed && t.done == t.read {
            self.finish(row.commit_lsn);
        }
    }

    /// The open transaction's Commit.
    pub fn commit(&mut self) {
        if let Some(lsn) = self.open.take() {
            if let Some(t) = self.txns.get_mut(&lsn) {
                t.committed = true;
                if t.done == t.read {
                    self.finish(lsn);
                }
            }
        }
    }

    /// A committed transaction with every row done leaves; the biggest is remembered.
    fn finish(&mut self, lsn: Lsn) {
        let Some(t) = self.txns.remove(&lsn) else {
            return;
        };
        if t.done > 0 && self.finished.is_none_or(|f| t.done >= f.rows) {
            self.finished = Some(t.partial());
        }
    }

    /// Forgets the finished transaction once `confirmed` covers it.
    pub fn confirmed(&mut self, confirmed: Lsn) {
        if self.finished.is_some_and(|f| f.txn.commit_lsn < confirmed) {
            self.finished = None;
        }
    }

    /// Rows kept past the leading done rows of their transactions.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Whether another row may be read: fewer than the limit kept past the leading done
    /// rows of their transactions.
    pub fn has_room(&self) -> bool {
        self.kept < self.limit
    }

    /// The transaction at or past `confirmed` with the most leading rows done (the one
    /// worth resuming inside, or one done whole but not confirmed yet), if any has some.
    pub fn partial(&self, confirmed: Lsn) -> Option<PartialTxn> {
        self.txns
            .range(confirmed..)
            .filter(|(_, t)| t.done > 0)
            .map(|(_, t)| t.partial())
            .chain(self.finished.filter(|f| f.txn.commit_lsn >= confirmed))
            .max_by_key(|p| p.rows)
    }

    pub fn len(&self) -> usize {
        self.txns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }
}

#[cfg(test)]
#[path = "delivered_tests.rs"]
mod tests;
