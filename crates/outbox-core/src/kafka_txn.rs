//! The exactly-once mode's Kafka transactions, as rules without IO
//! (docs/transactional-mode.md): when a transaction begins and commits (by time, by
//! count, and split inside a PostgreSQL transaction as `transaction.timeout.ms` nears),
//! how long its acks may take, what each class of librdkafka's errors leads to, when the
//! slot may be confirmed, and telling another instance's fence from the broker's own
//! abort of a transaction open too long. The relay's session makes the calls and awaits
//! them; the simulator drives the same rules against a model broker.
//!
//! Times are offsets from an origin the caller picks (the relay: its process's start),
//! so that the rules never read a clock.

use std::time::Duration;

use pgoutput::Lsn;

use crate::{DeliveredPosition, FirstWrites, Observe, SessionCore};

/// A Kafka transaction call's failure, in librdkafka's classes: what the caller may do
/// next is [`TxnError::next`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    /// Call the same method again: librdkafka goes on with it in the background (a commit
    /// whose outcome is not known yet must never be aborted).
    #[error("Kafka transaction call did not complete: {0}")]
    Retriable(String),
    /// Abort the transaction and resume from the progress record.
    #[error("Kafka transaction failed and must be aborted: {0}")]
    Abortable(String),
    /// The broker refused this producer's epoch, and this instance no longer holds the
    /// slot: another instance with the same transactional.id (the slot's) took over.
    /// librdkafka says fenced for [`TxnError::Expired`] too; [`KafkaTxnCore::judge_fence`]
    /// tells them apart.
    #[error("fenced: another outboxd instance took over this slot's Kafka transactions ({}); {}", .0, self.remedy().unwrap_or_default())]
    Fenced(String),
    /// The broker itself aborted this instance's transaction, open longer than
    /// `transaction.timeout.ms`, and ended the producer's epoch (KIP-588): librdkafka
    /// reports that as fenced, but the slot is still this instance's, so nobody else
    /// called `init_transactions`. A new producer resumes from the progress record.
    #[error("the Kafka broker aborted this instance's transaction: {}", self.remedy().unwrap_or_default())]
    Expired(String),
    #[error("the transactional Kafka producer failed fatally: {0}")]
    Fatal(String),
    /// A commit would decide records it must not ([`crate::left_open`]).
    #[error("{}; {}", .0, self.remedy().unwrap_or_default())]
    LeftOpen(crate::LeftOpen),
}

/// What a [`TxnError`] leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnNext {
    /// The same call again (a commit: never aborted, it may have happened).
    CallAgain,
    /// Abort the transaction; the next session resumes from the progress record, with a
    /// new producer.
    AbortAndResume,
    /// The process stops: another instance holds the slot, or the producer is broken.
    Stop,
}

impl TxnError {
    /// What follows the short account of what happened: why it matters and what to do.
    /// The error's text ends with it, so whatever prints the error prints the remedy too.
    pub fn remedy(&self) -> Option<String> {
        let text = match self {
            TxnError::Fenced(_) => String::from(
                "this instance stopped without committing anything more. Run only one active \
                instance per slot (the standby waits for the slot): nothing is lost, the \
                instance that holds the slot publishes what this one did not commit",
            ),
            TxnError::Expired(detail) => format!(
                "it was open longer than transaction.timeout.ms \
                (OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS), most likely because outboxd was \
                stopped or starved of CPU meanwhile, and librdkafka reports that as fenced \
                ({detail}). No other instance holds the slot: resuming from the progress \
                record with a new producer, nothing of the aborted transaction was confirmed. \
                If this repeats, find what stalls outboxd, or raise \
                OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS (the broker caps it at \
                transaction.max.timeout.ms)"
            ),
            TxnError::LeftOpen(_) => String::from(
                "the transaction is aborted rather than committed (an abort marker of this \
                producer id closes what of it is open there), and outboxd resumes from the \
                slot: these events are published again, none of them was confirmed",
            ),
            _ => return None,
        };
        Some(text)
    }

    /// What this error leads to: the one place the classes are turned into actions.
    pub fn next(&self) -> TxnNext {
        match self {
            TxnError::Retriable(_) => TxnNext::CallAgain,
            TxnError::Abortable(_) | TxnError::Expired(_) | TxnError::LeftOpen(_) => {
                TxnNext::AbortAndResume
            }
            TxnError::Fenced(_) | TxnError::Fatal(_) => TxnNext::Stop,
        }
    }
}

/// The settings the rules need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnRules {
    /// Commit at the first PostgreSQL commit this long after the previous commit began.
    pub commit_every: Duration,
    /// Or at the first PostgreSQL commit after this many events.
    pub commit_events: usize,
    /// `transaction.timeout.ms`: the broker aborts a transaction open longer.
    pub timeout: Duration,
    /// How often a commit whose outcome is unknown is made before the session gives up
    /// (the next one's `init_transactions` settles it).
    pub commit_attempts: u32,
}

/// What the caller does after a commit call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitStep {
    /// Commit again: the outcome is unknown, so the transaction is never aborted.
    Again,
    /// The session ends with this error (then [`KafkaTxnCore::aborting`]).
    Fail(TxnError),
}

/// One session's Kafka transaction. Nothing is confirmed to PostgreSQL while one is
/// open: the slot moves only after `commit_transaction` returned OK.
#[derive(Debug, Clone)]
pub struct KafkaTxnCore {
    rules: TxnRules,
    /// When the open transaction began; `None`: none is open.
    open_since: Option<Duration>,
    /// When the last commit began (see [`commit_due_at`]).
    last_commit: Option<Duration>,
    /// How long commits take, a moving average: a commit begins that much before its
    /// interval is up, so that it becomes visible when the interval is.
    commit_took: Option<Duration>,
    events: usize,
    /// The position last passed on to the server.
    confirmed: Lsn,
    /// How long the transaction the session aborted after failing had been open when the
    /// abort was answered: the broker expires only transactions open `timeout` or longer
    /// (see `judge_fence`).
    age_at_abort: Option<Duration>,
    /// When the transaction the session aborted had begun.
    aborted_since: Option<Duration>,
    /// What the progress record produced in the open transaction claims.
    recording: Option<DeliveredPosition>,
    /// What the newest committed record claims: the session's start, then each commit's.
    committed_claim: Option<DeliveredPosition>,
    /// The partitions to check for a transaction Kafka left open before the first commit
    /// into each ([`crate::left_open`]).
    first_writes: FirstWrites,
}

impl KafkaTxnCore {
    pub fn new(rules: TxnRules) -> Self {
        KafkaTxnCore {
            rules,
            open_since: None,
            last_commit: None,
            commit_took: None,
            events: 0,
            confirmed: Lsn::ZERO,
            age_at_abort: None,
            aborted_since: None,
            recording: None,
            committed_claim: None,
            first_writes: FirstWrites::default(),
        }
    }

    /// Where the open transaction's records began in the partitions this session has
    /// not yet checked for a transaction Kafka left open.
    pub fn first_writes(&mut self) -> &mut FirstWrites {
        &mut self.first_writes
    }

    /// The session starts from `claim`: the committed record it read (or the slot's
    /// position, confirmed only after a commit).
    pub fn starts_from(&mut self, claim: DeliveredPosition) {
        self.committed_claim = Some(claim);
    }

    /// The progress record produced in the open transaction claims `claim`.
    pub fn recording(&mut self, claim: DeliveredPosition) {
        self.recording = Some(claim);
    }

    /// What the newest committed record claims. The session's own claim counts rows acked
    /// in the open transaction, which an abort takes back: a lost slot's error that named
    /// its time would have the operator re-publish from past rows Kafka's readers never
    /// see. `None` only before [`Self::starts_from`].
    pub fn committed_claim(&self) -> Option<&DeliveredPosition> {
        self.committed_claim.as_ref()
    }

    pub fn rules(&self) -> TxnRules {
        self.rules
    }

    pub fn is_open(&self) -> bool {
        self.open_since.is_some()
    }

    /// A record is about to be produced at `now`; true: begin a transaction first.
    pub fn on_send(&mut self, now: Duration) -> bool {
        let begin = self.open_since.is_none();
        if begin {
            self.open_since = Some(now);
        }
        self.events += 1;
        begin
    }

    /// `begin_transaction` failed after [`Self::on_send`] asked for it: nothing is open,
    /// so nothing is aborted (or counted) after the session ends.
    pub fn begin_failed(&mut self) {
        self.open_since = None;
        self.events = 0;
    }

    /// How long the open transaction has been open at `now`, and its events.
    pub fn open_for(&self, now: Duration) -> Option<(Duration, usize)> {
        self.open_since
            .map(|since| (now.saturating_sub(since), self.events))
    }

    /// When the open transaction is due to commit by time (then at the next PostgreSQL
    /// commit, or inside a PostgreSQL transaction, `in_pg_txn`, that long).
    pub fn commit_at(&self, in_pg_txn: bool) -> Option<Duration> {
        let since = self.open_since?;
        // Never later than half the timeout after it opened, between PostgreSQL
        // transactions too: an interval near `transaction.timeout.ms` would otherwise
        // leave no time for the acks, and every commit would be aborted and replayed.
        let split = since + self.rules.timeout / 2;
        Some(match in_pg_txn {
            false => {
                let every = self.rules.commit_every;
                let lead = self.commit_took.unwrap_or_default();
                commit_due_at(since, self.last_commit, every, lead).min(split)
            }
            true => split,
        })
    }

    /// Whether to commit at `now`: at a PostgreSQL commit after the interval or event
    /// count, or anywhere once the transaction nears `transaction.timeout.ms` (a
    /// PostgreSQL transaction split over Kafka transactions, each record naming the
    /// leading rows delivered: the claim's partial).
    pub fn commit_due(&self, now: Duration, in_pg_txn: bool) -> bool {
        let by_count =
            self.open_since.is_some() && self.events >= self.rules.commit_events && !in_pg_txn;
        self.commit_at(in_pg_txn).is_some_and(|at| now >= at) || by_count
    }

    /// The open transaction's last moment to have everything of it acknowledged, or it is
    /// aborted. The broker's clock starts later (at its first `AddPartitionsToTxn`); the
    /// tenth left is for the look, the progress record and `EndTxn`, so that outboxd
    /// aborts before the broker does (which would bump the producer's epoch).
    pub fn acks_deadline(&self) -> Option<Duration> {
        let timeout = self.rules.timeout;
        self.open_since.map(|since| since + timeout - timeout / 10)
    }

    /// A commit begins at `now`: its acks deadline, or `None` when nothing is open.
    pub fn begin_commit(&mut self, now: Duration) -> Option<Duration> {
        let deadline = self.acks_deadline()?;
        self.last_commit = Some(now);
        Some(deadline)
    }

    /// `commit_transaction` failed on its `attempt`th call.
    pub fn after_commit_error(&self, e: TxnError, attempt: u32) -> CommitStep {
        match e.next() {
            TxnNext::CallAgain if attempt < self.rules.commit_attempts => CommitStep::Again,
            _ => CommitStep::Fail(e),
        }
    }

    /// `commit_transaction` returned OK at `now` after `attempts` calls. An error still,
    /// after more than one: librdkafka has no KIP-890 (transactions v2), so after an
    /// `EndTxn` that timed out, a late request of the old transaction could land in the
    /// next one; the next session goes on with a new producer.
    pub fn committed(&mut self, now: Duration, attempts: u32) -> Result<(), TxnError> {
        // Committed, even when the answer below is an error.
        if let Some(claim) = self.recording.take() {
            self.committed_claim = Some(claim);
        }
        self.first_writes.committed();
        self.open_since = None;
        self.events = 0;
        if let (Some(began), 1) = (self.last_commit, attempts) {
            let took = now.saturating_sub(began);
            self.commit_took = Some(match self.commit_took {
                Some(avg) => (avg * 3 + took) / 4,
                None => took,
            });
        }
        match attempts > 1 {
            true => Err(TxnError::Retriable(
                "a Kafka commit had to be retried: starting over with a new producer".into(),
            )),
            false => Ok(()),
        }
    }

    /// The position to pass on to the server, when it moved: the rules' confirmed
    /// position `w`, only while no transaction is open (a session whose transaction
    /// failed ends, so everything acked with none open was committed).
    pub fn confirmable(&mut self, w: Lsn) -> Option<Lsn> {
        (self.open_since.is_none() && w > self.confirmed).then(|| {
            self.confirmed = w;
            w
        })
    }

    /// The session failed at `now`: true if a transaction is open and must be aborted
    /// (its records never visible to read_committed consumers, and the next start need
    /// not wait for it). Its age is kept for [`Self::judge_fence`].
    pub fn aborting(&mut self, now: Duration) -> bool {
        self.recording = None;
        let Some(since) = self.open_since.take() else {
            return false;
        };
        self.first_writes.aborted();
        self.aborted_since = Some(since);
        self.age_at_abort = Some(now.saturating_sub(since));
        true
    }

    /// The abort [`Self::aborting`] asked for was answered at `now`: a fence is judged by
    /// the transaction's age then. librdkafka's abort first waits for the requests in
    /// flight, and a slow broker is why a transaction is aborted, so the broker may expire
    /// it meanwhile: its age when the session failed is too young to tell.
    pub fn abort_answered(&mut self, now: Duration) {
        if let Some(since) = self.aborted_since {
            self.age_at_abort = Some(now.saturating_sub(since));
        }
    }

    /// The session's error after its abort answered: a fenced producer's answer replaces
    /// it (another instance took over). Any other failure of the abort, a fatal one
    /// included, leaves it to the next start: the session drops this producer anyway, and
    /// the next one's `init_transactions` aborts what is still open. A broker answering
    /// an abort with INVALID_TXN_STATE while PostgreSQL fails over is not a reason to exit.
    pub fn after_abort<E: From<TxnError>>(session: E, abort: Result<(), TxnError>) -> E {
        match abort {
            Err(fenced @ TxnError::Fenced(_)) => E::from(fenced),
            _ => session,
        }
    }

    /// Whether a fence may be the broker's own abort of a transaction open too long: the
    /// aborted one had been open at least `transaction.timeout.ms`, the least the broker
    /// expires. Only then is the slot's holder worth asking.
    pub fn may_have_expired(&self) -> bool {
        self.age_at_abort
            .is_some_and(|age| age >= self.rules.timeout)
    }

    /// Tells a fenced producer from one whose transaction the broker aborted: both bump
    /// the epoch, and librdkafka reports both as fenced. Only an instance holding the slot
    /// calls `init_transactions`, so while this session's walsender still holds it, or
    /// nobody does once PostgreSQL ended it (`slot_still_ours`), no other instance of this
    /// server can have taken over and stayed. But an instance on
    /// another server of the same system identifier (a promoted standby while the old
    /// primary still runs) shares the transactional.id, so expiry also needs its
    /// evidence, [`Self::may_have_expired`]. Held by another, younger, or in doubt: fenced.
    pub fn judge_fence(&self, why: String, slot_still_ours: bool) -> TxnError {
        match self.may_have_expired() && slot_still_ours {
            true => TxnError::Expired(why),
            false => TxnError::Fenced(why),
        }
    }
}

/// The claim a lost slot's error names while a session streams (its time is where the
/// operator re-publishes from): in exactly-once mode (`txn`) the newest committed
/// record's, since an abort takes back what the open transaction acked; otherwise the
/// session's own.
pub fn lost_slot_claim<O: Observe>(
    txn: Option<&KafkaTxnCore>,
    session: &mut SessionCore<O>,
) -> DeliveredPosition {
    match txn.and_then(KafkaTxnCore::committed_claim) {
        Some(committed) => committed.clone(),
        None => session.claim().0,
    }
}

/// When a transaction opened at `since` is due to commit by time, at a PostgreSQL commit:
/// `every` after the previous commit began, less `lead` (how long a commit takes), not
/// after this transaction opened. Events that arrive during a commit open the next
/// transaction only once it ends, and would otherwise wait that commit and a whole
/// interval, then the next commit: begun `lead` early, it ends when the interval is up,
/// so a `read_committed` consumer's wait is about the interval (issue 31: p99 within the
/// interval + 20 ms). Open at least a quarter of an interval, so that commits slower than
/// `every` do not turn into a string of tiny ones (half an interval held a commit of 30 ms
/// back from its lead).
fn commit_due_at(
    since: Duration,
    last_commit: Option<Duration>,
    every: Duration,
    lead: Duration,
) -> Duration {
    let floor = since + every / 4;
    match last_commit {
        Some(last) => (last + every).saturating_sub(lead).max(floor),
        None => since + every,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rules(timeout: Duration) -> TxnRules {
        TxnRules {
            commit_every: ms(100),
            commit_events: 1000,
            timeout,
            commit_attempts: 5,
        }
    }

    /// A lost slot's error names the newest committed record's time: what the open
    /// transaction acked is aborted with it (issue 33's probe, exactly-once seed 7).
    #[test]
    fn only_a_committed_record_names_a_lost_slots_time() {
        let claim = |lsn: u64, since: i64| DeliveredPosition {
            since: Some(since),
            ..DeliveredPosition::at(1, Lsn(lsn), 0)
        };
        let mut txn = KafkaTxnCore::new(rules(Duration::from_secs(60)));
        txn.starts_from(claim(100, 10));
        assert!(txn.on_send(ms(0)));
        txn.recording(claim(200, 20));
        assert_eq!(txn.committed_claim(), Some(&claim(100, 10)), "still open");
        txn.begin_commit(ms(1));
        txn.committed(ms(2), 1).expect("committed");
        assert_eq!(txn.committed_claim(), Some(&claim(200, 20)));
        assert!(txn.on_send(ms(3)));
        txn.recording(claim(300, 30));
        assert!(txn.aborting(ms(4)));
        txn.committed(ms(5), 1).expect("nothing open");
        assert_eq!(txn.committed_claim(), Some(&claim(200, 20)), "aborted");
        // A commit retried is still a commit, though the session then ends.
        assert!(txn.on_send(ms(6)));
        txn.recording(claim(400, 40));
        assert!(txn.committed(ms(7), 2).is_err());
        assert_eq!(txn.committed_claim(), Some(&claim(400, 40)));
    }

    #[test]
    fn a_failed_begin_leaves_nothing_to_abort() {
        let mut txn = KafkaTxnCore::new(rules(Duration::from_secs(60)));
        assert!(txn.on_send(ms(0)), "the first send begins a transaction");
        txn.begin_failed();
        assert!(
            !txn.aborting(ms(10)),
            "nothing was opened, so nothing is aborted"
        );
        assert!(txn.on_send(ms(20)), "the next send begins one again");
        assert!(txn.aborting(ms(30)));
    }

    #[test]
    fn acks_deadline_counts_from_the_transactions_start() {
        let mut txn = KafkaTxnCore::new(rules(Duration::from_secs(60)));
        assert_eq!(txn.acks_deadline(), None);
        txn.on_send(ms(1_000));
        // Not from the commit: a transaction open 50 s has 4 s left, not 54.
        assert_eq!(txn.begin_commit(ms(51_000)), Some(ms(55_000)));
        let mut short = KafkaTxnCore::new(rules(ms(1_000)));
        short.on_send(ms(0));
        assert_eq!(short.acks_deadline(), Some(ms(900)));
    }

    #[test]
    fn commits_keep_their_cadence() {
        let every = ms(100);
        let none = Duration::ZERO;
        // The session's first transaction: an interval after it opened.
        assert_eq!(commit_due_at(ms(0), None, every, none), ms(100));
        // Opened 20 ms after the last commit began (when it ended): 80 ms open, so
        // events that came during that commit wait no longer than an interval.
        assert_eq!(commit_due_at(ms(20), Some(ms(0)), every, none), ms(100));
        // Commits take 20 ms: this one begins 20 ms early, and ends when the interval is up.
        assert_eq!(commit_due_at(ms(20), Some(ms(0)), every, ms(20)), ms(80));
        // A commit of 70 ms: the transaction stays open a quarter of an interval.
        assert_eq!(commit_due_at(ms(70), Some(ms(0)), every, ms(70)), ms(95));
        // After a quiet spell: a quarter of an interval after it opened.
        assert_eq!(
            commit_due_at(ms(5_000), Some(ms(0)), every, none),
            ms(5_025)
        );
    }

    /// Issue 31's p99: a commit interval of 100 ms gave a p99 of 122–138 ms, an event
    /// that came at a commit's start waiting the interval and then the next commit.
    #[test]
    fn a_commit_begins_early_by_how_long_commits_take() {
        let mut txn = KafkaTxnCore::new(rules(Duration::from_secs(60)));
        txn.on_send(ms(0));
        assert_eq!(txn.commit_at(false), Some(ms(100)));
        txn.begin_commit(ms(100));
        assert_eq!(txn.committed(ms(130), 1), Ok(()));
        txn.on_send(ms(131));
        assert_eq!(
            txn.commit_at(false),
            Some(ms(170)),
            "30 ms early: ends at 200"
        );
        txn.begin_commit(ms(170));
        assert_eq!(txn.committed(ms(180), 1), Ok(()));
        txn.on_send(ms(181));
        assert_eq!(txn.commit_at(false), Some(ms(245)), "the average: 25 ms");
        // A retried commit says nothing of how long a commit takes.
        txn.begin_commit(ms(245));
        assert!(txn.committed(ms(900), 2).is_err());
        txn.on_send(ms(901));
        assert_eq!(
            txn.commit_at(false),
            Some(ms(926)),
            "a quarter of one open at least"
        );
    }

    #[test]
    fn inside_a_postgresql_transaction_only_the_timeout_splits() {
        let mut txn = KafkaTxnCore::new(rules(ms(1_000)));
        assert!(!txn.commit_due(ms(0), false));
        assert!(txn.on_send(ms(0)));
        assert!(!txn.on_send(ms(1)));
        assert!(txn.commit_due(ms(100), false));
        assert!(!txn.commit_due(ms(499), true));
        assert!(txn.commit_due(ms(500), true));
    }

    #[test]
    fn an_uncertain_commit_is_made_again_never_aborted() {
        let txn = KafkaTxnCore::new(rules(ms(1_000)));
        let timeout = TxnError::Retriable("timed out".into());
        assert_eq!(
            txn.after_commit_error(timeout.clone(), 1),
            CommitStep::Again
        );
        assert_eq!(
            txn.after_commit_error(timeout.clone(), 5),
            CommitStep::Fail(timeout)
        );
        let fenced = TxnError::Fenced("_FENCED".into());
        assert_eq!(
            txn.after_commit_error(fenced.clone(), 1),
            CommitStep::Fail(fenced)
        );
    }

    #[test]
    fn the_slot_moves_only_with_no_transaction_open() {
        let mut txn = KafkaTxnCore::new(rules(ms(1_000)));
        assert_eq!(txn.confirmable(Lsn(10)), Some(Lsn(10)));
        txn.on_send(ms(0));
        assert_eq!(txn.confirmable(Lsn(20)), None);
        assert!(txn.begin_commit(ms(5)).is_some());
        assert_eq!(txn.committed(ms(8), 1), Ok(()));
        assert_eq!(txn.confirmable(Lsn(20)), Some(Lsn(20)));
        txn.on_send(ms(10));
        assert!(txn.committed(ms(12), 2).is_err());
    }

    #[test]
    fn expiry_needs_the_age_and_the_slot() {
        let mut txn = KafkaTxnCore::new(rules(ms(1_000)));
        txn.on_send(ms(0));
        assert!(txn.aborting(ms(999)));
        assert!(!txn.aborting(ms(2_000)));
        assert_eq!(
            txn.judge_fence("f".into(), true),
            TxnError::Fenced("f".into())
        );
        txn.on_send(ms(3_000));
        assert!(txn.aborting(ms(4_000)));
        assert_eq!(
            txn.judge_fence("f".into(), true),
            TxnError::Expired("f".into())
        );
        assert_eq!(
            txn.judge_fence("f".into(), false),
            TxnError::Fenced("f".into())
        );
    }

    #[test]
    fn an_abort_answered_past_the_timeout_may_have_been_the_brokers_expiry() {
        let mut txn = KafkaTxnCore::new(rules(ms(1_000)));
        txn.on_send(ms(0));
        // The acks deadline (before the timeout) ends the session; the abort waits for
        // the requests in flight, and the broker expires the transaction meanwhile.
        assert!(txn.aborting(ms(900)));
        txn.abort_answered(ms(1_400));
        assert_eq!(
            txn.judge_fence("f".into(), true),
            TxnError::Expired("f".into())
        );
        // Answered before the timeout: the broker cannot have expired it.
        txn.on_send(ms(2_000));
        assert!(txn.aborting(ms(2_900)));
        txn.abort_answered(ms(2_950));
        assert_eq!(
            txn.judge_fence("f".into(), true),
            TxnError::Fenced("f".into())
        );
    }

    #[test]
    fn only_a_fenced_abort_replaces_the_error() {
        let session = TxnError::Abortable("delivery".into());
        let kept = KafkaTxnCore::after_abort(session.clone(), Err(TxnError::Retriable("t".into())));
        assert_eq!(kept, session);
        // A producer broken by its abort (INVALID_TXN_STATE after PostgreSQL went away)
        // is dropped all the same: the next session's init_transactions settles it.
        let broken = TxnError::Fatal("INVALID_TXN_STATE".into());
        assert_eq!(
            KafkaTxnCore::after_abort(session.clone(), Err(broken)),
            session
        );
        let fenced = TxnError::Fenced("f".into());
        assert_eq!(
            KafkaTxnCore::after_abort(session, Err(fenced.clone())),
            fenced
        );
    }
}
