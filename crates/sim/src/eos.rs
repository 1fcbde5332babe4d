//! The exactly-once mode's schedules: the relay's rules (`SessionCore`) and its Kafka
//! transactions' rules (`KafkaTxnCore`) against a model broker with transactions, two
//! instances of one slot (the active one and a standby), and faults: kills between
//! sending and committing, a commit whose response is lost, an abortable error, the
//! broker's own abort of a transaction open past `transaction.timeout.ms`, and a zombie
//! (an instance stopped past the timeout, then resumed after the standby took over); and
//! SIGTERM, the relay's clean shutdown (`eos_shutdown.rs`).
//!
//! Invariants: the read_committed view holds every committed outbox row (and event
//! message) exactly once, in per-aggregate order; the slot is never confirmed past what
//! committed Kafka transactions hold; a fenced instance commits nothing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_core::{CommitStep, KafkaTxnCore, SessionError, TxnError};
use pgoutput::Lsn;

use crate::eos_broker::{Broker, Commit};
use crate::life::{self, Cursor, Life, OTHER, OUTBOX, OUTBOX_PARTITION};
use crate::model::{Change, Cluster, Config, Txn, PARTITIONS};
use crate::{Rng, Violation};

#[path = "eos_final.rs"]
mod eos_final;
#[path = "eos_instance.rs"]
mod instance;
#[path = "eos_left_open.rs"]
mod left_open;
#[path = "eos_shutdown.rs"]
mod shutdown;
#[path = "eos_slot_loss.rs"]
mod slot_loss;
use instance::Instance;

/// `transaction.timeout.ms` of the model.
const TIMEOUT: Duration = Duration::from_millis(1_000);
/// The event topic, as the left-open check names it.
const TOPIC: &str = "events";

/// A model partition as Kafka numbers it.
fn partition(p: usize) -> i32 {
    i32::try_from(p).unwrap_or(i32::MAX)
}

/// How long a walsender outlives a stopped relay before the slot is free.
const SENDER_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Counts of one exactly-once schedule.
#[derive(Debug, Default, Clone, Copy)]
pub struct EosStats {
    pub steps: u64,
    pub commits: u64,
    /// Commits inside a PostgreSQL transaction (its record names the leading rows).
    pub splits: u64,
    pub aborts: u64,
    /// Commits whose response was lost, made again.
    pub retried: u64,
    pub expired: u64,
    /// Instances that stopped because another fenced them.
    pub fenced: u64,
    pub kills: u64,
    pub zombies: u64,
    /// Sessions whose replay hold filled the caps and spilled.
    pub spills: u64,
    /// Replays in doubt: they publish again (none arise in these schedules).
    pub doubts: u64,
    /// Copies in the read_committed view: after a doubt, or rows a lost slot's procedure
    /// re-inserted that Kafka had (consumers drop them by event id).
    pub duplicates: u64,
    /// Slots invalidated or dropped.
    pub slot_losses: u64,
    /// Outbox rows the operator re-inserted after a lost slot.
    pub republished: u64,
    /// Event messages lost with a slot, as the operator was told.
    pub messages_lost: u64,
    /// SIGTERMs to an instance with a session, and those that ended cleanly.
    pub shutdowns: u64,
    pub clean_stops: u64,
    /// Coordinator aborts that wrote no marker to some of their partitions.
    pub markers_skipped: u64,
    /// Commits aborted instead: a transaction this process aborted left open below theirs.
    pub left_open: u64,
    /// Partitions where an older transaction, not proven aborted, was open below a commit.
    pub left_open_doubts: u64,
    /// Committed records left open that a later abort hid (Kafka's; not the relay's).
    pub buried: u64,
    /// Brokers that hung with records in flight: written, never acked.
    pub hangs: u64,
    /// Sessions that started without the record read (all replayed events published
    /// again: duplicates, as documented).
    pub records_unread: u64,
    /// Regions left open read back, and those found copies of the reader's records.
    pub regions_read: u64,
    pub copies_found: u64,
}

impl crate::Tally for EosStats {
    fn add(&mut self, o: &EosStats) {
        self.steps += o.steps;
        self.commits += o.commits;
        self.splits += o.splits;
        self.aborts += o.aborts;
        self.retried += o.retried;
        self.expired += o.expired;
        self.fenced += o.fenced;
        self.kills += o.kills;
        self.zombies += o.zombies;
        self.spills += o.spills;
        self.doubts += o.doubts;
        self.duplicates += o.duplicates;
        self.slot_losses += o.slot_losses;
        self.republished += o.republished;
        self.messages_lost += o.messages_lost;
        self.shutdowns += o.shutdowns;
        self.clean_stops += o.clean_stops;
        self.markers_skipped += o.markers_skipped;
        self.left_open += o.left_open;
        self.left_open_doubts += o.left_open_doubts;
        self.buried += o.buried;
        self.hangs += o.hangs;
        self.records_unread += o.records_unread;
        self.regions_read += o.regions_read;
        self.copies_found += o.copies_found;
    }
}

/// One relay session of an instance, with its producer's epoch.
struct Session {
    life: Life,
    txn: KafkaTxnCore,
    epoch: u64,
    /// The walsender went away (the instance was stopped too long): reading fails.
    stream_lost: bool,
    /// The position handed on, sent with the next status update.
    flush: Lsn,
    /// Its replay's hold spilled (counted once).
    spilled: bool,
    /// The lost-slot time last checked: it moves only with a commit, and what is committed
    /// stays so, so a time once checked needs no second look.
    lost_slot_checked: Option<i64>,
}

struct Eos {
    trace: bool,
    rng: Rng,
    /// The lost slots' draws: a stream of their own, so that the schedules keep the
    /// draws they had before lost slots were modelled (and the mutation table its seeds).
    losses: Rng,
    /// How often the operator re-inserted each outbox row (a lost slot's procedure).
    reinserted: HashMap<u64, u64>,
    /// Event messages lost with a slot: in the WAL only, never re-published.
    lost_messages: HashSet<u64>,
    cluster: Cluster,
    cfg: Config,
    cap: usize,
    rules: outbox_core::TxnRules,
    broker: Broker,
    instances: [Instance; 2],
    /// Which instance's walsender holds the slot.
    holder: Option<usize>,
    now: Duration,
    next_id: u64,
    stats: EosStats,
    /// How long aborts wait for the requests in flight: their own stream, so the other
    /// draws stay as they were.
    abort_waits: Rng,
    /// SIGTERMs and the draws of their shutdowns: their own stream too.
    sigterms: Rng,
    /// Which partitions a coordinator's abort skips: their own stream too.
    markers: Rng,
    /// Each producer epoch's instance and process.
    epoch_owners: HashMap<u64, (usize, u64)>,
    /// Transactions whose commit was asked for.
    commit_asked: HashSet<u64>,
    /// Copies of events that a commit in doubt over a transaction Kafka left open made
    /// visible (neither the relay nor its process could know it aborted).
    resurrected: HashMap<u64, u64>,
    /// Events of committed transactions Kafka left open and a later abort hid (the
    /// relay cannot tell them from aborted ones).
    buried: HashSet<u64>,
    /// Records left open that a check committed over in doubt, by transaction and
    /// partition.
    waived: HashSet<(u64, usize)>,
    /// Hung brokers (records written with no ack): their own stream.
    hangs: Rng,
    /// Transactions' partitions with an acked record, and those with records written
    /// but none acked (the relay cannot know where they begin).
    acked_in: HashSet<(u64, usize)>,
    hung: HashSet<(u64, usize)>,
    /// The partition whose broker hung: the next end likely finds it without a leader.
    fenced: Option<usize>,
}

/// Runs the exactly-once schedule of `seed`.
pub fn run_exactly_once(seed: u64) -> Result<EosStats, Violation> {
    let mut rng = Rng::new(seed ^ 0xe0_5e0_5e0);
    let cfg = Config {
        relay_table: true,
        tag: 0,
        relay_messages: rng.chance(400),
        heartbeat: false,
        other_published: rng.chance(400),
        dead_letter: true,
        // Bad rows are dead-lettered inside the transaction; records the producer refuses
        // as too large are the at-least-once schedules' business.
        limit_raised: true,
        former_partition: false,
    };
    let rules = outbox_core::TxnRules {
        commit_every: Duration::from_millis(50 + rng.below(400)),
        commit_events: 2 + rng.index(30),
        timeout: TIMEOUT,
        commit_attempts: 3,
    };
    let mut eos = Eos {
        trace: std::env::var_os("OUTBOXD_SIM_TRACE").is_some(),
        losses: Rng::new(seed ^ 0x6c6f_7374_5f73_6c6f),
        reinserted: HashMap::new(),
        lost_messages: HashSet::new(),
        // Often below a transaction's or a Kafka transaction's events: a replay's hold
        // fills the caps and spills (no doubt, so no duplicate).
        cap: 1 + rng.index(127),
        rng,
        cluster: Cluster {
            history: Vec::new(),
            confirmed: Lsn(100),
            persisted: Lsn(100),
            wal_end: Lsn(100),
            next_xid: 700,
            falls_back: false,
            timeline: 1,
            tag: 0,
            key: 0,
            publication: 1,
            visible: 1,
            outbox_published: true,
            accepted: 1,
            republished: HashSet::new(),
            slot: outbox_core::slot_fate::SlotNow::Usable,
            partition_dropped: false,
        },
        cfg,
        rules,
        broker: Broker::default(),
        instances: [Instance::new(), Instance::new()],
        holder: None,
        now: Duration::ZERO,
        next_id: 1,
        stats: EosStats::default(),
        abort_waits: Rng::new(seed ^ 0x6162_6f72_745f_7761),
        sigterms: Rng::new(seed ^ 0x7369_6774_6572_6d73),
        markers: Rng::new(seed ^ 0x6d61_726b_6572_7321),
        epoch_owners: HashMap::new(),
        commit_asked: HashSet::new(),
        resurrected: HashMap::new(),
        buried: HashSet::new(),
        waived: HashSet::new(),
        hangs: Rng::new(seed ^ 0x6875_6e67_5f62_726b),
        acked_in: HashSet::new(),
        hung: HashSet::new(),
        fenced: None,
    };
    eos.broker.trace = eos.trace;
    let steps = 100 + eos.rng.below(200);
    for _ in 0..steps {
        eos.step(true)?;
    }
    eos.quiesce()?;
    eos.check_final()?;
    eos.stats.markers_skipped = eos.broker.skipped_aborts;
    Ok(eos.stats)
}

impl Eos {
    fn step(&mut self, faults: bool) -> Result<(), Violation> {
        self.stats.steps += 1;
        if faults && self.losses.below(slot_loss::EVERY) == 0 {
            self.lose_slot()?;
        }
        if faults && self.sigterms.below(shutdown::EVERY) == 0 {
            let i = self.sigterms.index(2);
            self.sigterm(i)?;
        }
        let roll = self.rng.below(1000);
        let i = self.rng.index(2);
        match roll {
            0..=149 => self.commit_pg_txn(),
            150..=499 => self.relay_turn(i, true)?,
            500..=699 => self.relay_turn(i, false)?,
            700..=849 => self.pass_time(60)?,
            850..=919 => self.start(i)?,
            _ if !faults => {}
            920..=939 => self.kill(i),
            940..=949 => self.stop(i),
            950..=964 => self.resume(i)?,
            965..=969 => self.zombie(i)?,
            970..=979 => self.pass_time(700)?,
            _ => self.fail_abortable(i)?,
        }
        self.expire();
        Ok(())
    }

    /// A transaction commits on the server: a few rows, or now and then many (longer than
    /// half the timeout to relay, so split over Kafka transactions).
    fn commit_pg_txn(&mut self) {
        let n = match self.rng.chance(100) {
            true => 10 + self.rng.index(40),
            false => 1 + self.rng.index(4),
        };
        let mut changes = Vec::with_capacity(n);
        for _ in 0..n {
            let agg = u32::try_from(self.rng.below(4)).unwrap_or(0);
            let change = match self.rng.below(10) {
                0..=6 => {
                    let id = self.next_id;
                    self.next_id += 1;
                    Change::Outbox {
                        id,
                        agg,
                        partition: self.rng.chance(300),
                        bad: self.rng.chance(30),
                    }
                }
                7 => Change::Other,
                _ => {
                    let id = self.next_id;
                    self.next_id += 1;
                    Change::Message {
                        event: Some((id, agg)),
                    }
                }
            };
            changes.push(change);
        }
        let size = 40 * u64::try_from(n).unwrap_or(1);
        self.cluster
            .commit(changes, size, self.server_clock(), false);
    }

    /// The server's clock (it never steps back here), as commits carry it.
    fn server_clock(&self) -> i64 {
        i64::try_from(self.now.as_millis()).unwrap_or(0) + 1_000_000
    }

    /// The simulated clock, as the producer's delivery reports carry it.
    fn now_micros(&self) -> i64 {
        i64::try_from(self.now.as_micros()).unwrap_or(i64::MAX)
    }

    fn pass_time(&mut self, most_ms: u64) -> Result<(), Violation> {
        self.now += Duration::from_millis(1 + self.rng.below(most_ms));
        // A status update of the slot's holder: the position it handed on.
        if let Some(i) = self.holder {
            let flush = self.instances[i]
                .session
                .as_ref()
                .filter(|s| !s.stream_lost && self.instances[i].stopped_at.is_none())
                .map(|s| s.flush);
            if let Some(w) = flush {
                self.confirm(w)?;
            }
        }
        // A walsender whose relay stopped answering times out: the slot is free.
        for (i, inst) in self.instances.iter_mut().enumerate() {
            let gone = inst
                .stopped_at
                .is_some_and(|at| self.now.saturating_sub(at) >= SENDER_TIMEOUT);
            if gone && self.holder == Some(i) {
                self.holder = None;
                if let Some(s) = inst.session.as_mut() {
                    s.stream_lost = true;
                }
            }
        }
        Ok(())
    }

    /// The broker aborts a transaction open past the timeout and ends its epoch.
    fn expire(&mut self) {
        let skipped = self.skipped_markers();
        let expired = self.broker.expire(self.now, TIMEOUT, &skipped);
        // Its abort decides only what is open of an aborted transaction there, or buries
        // a committed one's (never this relay's doing).
        let _ = self.judge_decided(None);
        if expired && self.trace {
            eprintln!(
                "  broker: transaction expired, epoch now {}",
                self.broker.epoch
            );
        }
    }

    fn relay_turn(&mut self, i: usize, read: bool) -> Result<(), Violation> {
        if self.instances[i].stopped_at.is_some() {
            return Ok(());
        }
        let Some(mut s) = self.instances[i].session.take() else {
            return Ok(());
        };
        self.now += Duration::from_millis(self.rng.below(15));
        let result = match read {
            true => self.read(&mut s),
            false => self.ack_one(&mut s),
        };
        if !s.spilled && s.life.core.spilled() {
            s.spilled = true;
            self.stats.spills += 1;
        }
        let doubts = std::mem::take(&mut s.life.core.observer().doubts);
        if !doubts.is_empty() {
            // Published in doubt: a later session may skip what this one publishes.
            s.txn.first_writes().allow_copies(false);
            // In doubt, the replay publishes again: documented duplicates.
            self.stats.doubts += 1;
            if self.trace {
                eprintln!("  instance {i} doubts: {doubts:?}");
            }
        }
        if self.rng.chance(100) {
            // A look at the publication between commits (a tick's).
            let acked = s.life.core.watermark();
            s.life.core.raise_cap(acked);
        }
        let result = result.and_then(|()| {
            self.hand_on(i, &mut s)?;
            match s.txn.commit_due(self.now, s.life.core.in_transaction()) {
                true => self.commit(i, &mut s),
                false => Ok(()),
            }
        });
        match result {
            Ok(()) => {
                self.check_lost_slot_time(&mut s)?;
                self.instances[i].session = Some(s);
                Ok(())
            }
            Err(e) => self.end_session(i, s, e),
        }
    }

    /// The first event of the transactions `which` picks that no committed Kafka
    /// transaction holds, and its transaction.
    fn first_not_committed(&self, which: impl Fn(&Txn) -> bool) -> Option<(u64, &Txn)> {
        let visible = self.broker.committed_ids();
        self.cluster
            .history
            .iter()
            .filter(|t| which(t))
            .find_map(|t| {
                t.changes
                    .iter()
                    .filter_map(|&ch| self.event_id(ch))
                    // Buried by Kafka (a committed transaction's records left open, then
                    // an abort's marker): committed, and lost by no rule of the relay's.
                    .find(|id| !visible.contains(id) && !self.buried.contains(id))
                    .map(|id| (id, t))
            })
    }

    /// The next message of the stream, fed to the rules; what they queue is produced
    /// inside the open Kafka transaction (begun first if none is).
    fn read(&mut self, s: &mut Session) -> Result<(), Failure> {
        if s.stream_lost {
            return Err(Failure::Session("the walsender went away".into()));
        }
        let room = s.life.core.make_room().map_err(Failure::rules)?;
        self.produce(s)?;
        if !room {
            return Ok(());
        }
        let cl = &self.cluster;
        match s.life.cursor {
            Cursor::Before(i) => {
                let Some(txn) = cl.history.get(i).cloned() else {
                    let wal_end = cl.wal_end;
                    return s.life.core.on_keepalive(wal_end).map_err(Failure::rules);
                };
                if !txn.changes.iter().any(|&ch| s.life.cfg.streams(ch)) {
                    s.life.cursor = Cursor::Before(i + 1);
                    return Ok(());
                }
                s.life
                    .message(life::begin(&txn), txn.commit_time)
                    .map_err(Failure::rules)?;
                s.life.cursor = Cursor::Inside(i, 0);
            }
            Cursor::Inside(i, k) => {
                let txn = cl.history[i].clone();
                let streamed: Vec<Change> = txn
                    .changes
                    .iter()
                    .copied()
                    .filter(|&ch| s.life.cfg.streams(ch))
                    .collect();
                let Some(&change) = streamed.get(k) else {
                    s.life.cursor = Cursor::Before(i + 1);
                    s.life
                        .message(life::commit(&txn), txn.commit_time)
                        .map_err(Failure::rules)?;
                    return self.produce(s);
                };
                s.life.cursor = Cursor::Inside(i, k + 1);
                let fed = match change {
                    Change::Outbox { partition, .. } => {
                        let rel = if partition { OUTBOX_PARTITION } else { OUTBOX };
                        s.life.insert(rel, life::tuple(rel, change))
                    }
                    Change::Other => s.life.insert(OTHER, life::tuple(OTHER, change)),
                    Change::Message { event } => s
                        .life
                        .message(life::logical_message(&txn, event), txn.commit_time),
                };
                fed.map_err(Failure::rules)?;
            }
        }
        self.produce(s)
    }

    /// Hands what the rules queued to the producer: inside the open Kafka transaction.
    fn produce(&mut self, s: &mut Session) -> Result<(), Failure> {
        let before: usize = s.life.queues.iter().map(|q| q.len()).sum();
        s.life.pump().map_err(Failure::rules)?;
        let after: usize = s.life.queues.iter().map(|q| q.len()).sum();
        for _ in before..after {
            if s.txn.on_send(self.now) {
                // begin_transaction is local: the broker hears of it at the first produce.
                self.broker.begin(s.epoch, self.now);
            }
        }
        Ok(())
    }

    /// The broker appends the oldest message of one partition to the open transaction
    /// and acks it; a producer of an ended epoch is refused (fenced).
    fn ack_one(&mut self, s: &mut Session) -> Result<(), Failure> {
        let p = self.rng.index(PARTITIONS);
        if !s.life.queues[p].is_empty() && self.hangs.chance(4) {
            return self.hang(s, p);
        }
        let Some((ticket, w)) = s.life.queues[p].pop_front() else {
            return Ok(());
        };
        let Some(offset) = self.broker.append(s.epoch, p, w) else {
            s.life
                .core
                .on_delivery(ticket, false, self.now_micros())
                .map_err(Failure::rules)?;
            return Err(Failure::Txn(TxnError::Fenced("produce: _FENCED".into())));
        };
        self.first_write(s, p, offset, &w);
        s.life
            .core
            .on_delivery(ticket, true, self.now_micros())
            .map_err(Failure::rules)
    }

    /// The rules' position, passed on to the slot when the transaction rules allow it.
    fn hand_on(&mut self, i: usize, s: &mut Session) -> Result<(), Failure> {
        s.life.core.advance();
        if let Some(w) = s.txn.confirmable(s.life.core.confirmed()) {
            s.flush = w;
        }
        if self.holder == Some(i) && !s.stream_lost && self.rng.chance(300) {
            self.confirm(s.flush).map_err(Failure::Violation)?;
        }
        Ok(())
    }

    /// The slot moves to `w`: every row of a transaction it covers is visible to a
    /// read_committed reader.
    fn confirm(&mut self, w: Lsn) -> Result<(), Violation> {
        if w <= self.cluster.confirmed {
            return Ok(());
        }
        let confirmed = self.cluster.confirmed;
        if let Some((id, t)) = self.first_not_committed(|t| t.end_lsn > confirmed && t.end_lsn <= w)
        {
            return Err(Violation(format!(
                "exactly-once: the slot confirmed {w:?} past event {id} (transaction {:?}), which no committed Kafka transaction holds",
                t.commit_lsn
            )));
        }
        self.cluster.confirmed = self.cluster.confirmed.max(w);
        Ok(())
    }

    /// The event id of a change this relay publishes.
    fn event_id(&self, ch: Change) -> Option<u64> {
        match ch {
            Change::Outbox { id, .. } => Some(id),
            Change::Message {
                event: Some((id, _)),
            } if self.cfg.relay_messages => Some(id),
            _ => None,
        }
    }

    /// The relay's commit: every ack, the progress record last, `EndTxn`; then the slot.
    fn commit(&mut self, i: usize, s: &mut Session) -> Result<(), Failure> {
        let Some(_deadline) = s.txn.begin_commit(self.now) else {
            return Ok(());
        };
        for p in 0..PARTITIONS {
            while !s.life.queues[p].is_empty() {
                self.ack_partition(s, p)?;
            }
        }
        // A look at the publication (it never changes here): everything acked may be
        // claimed.
        let acked = s.life.core.watermark();
        s.life.core.raise_cap(acked);
        s.life.core.advance();
        let split = s.life.core.in_transaction();
        let claim = s.life.core.claim();
        if self.trace {
            eprintln!("  instance {i} commits (split {split}), record {claim:?}");
        }
        s.txn.recording(claim.0.clone());
        if !self
            .broker
            .append_record(s.epoch, claim, self.server_clock())
        {
            return Err(Failure::Txn(TxnError::Fenced("record: _FENCED".into())));
        }
        // The relay's check before the first commit into a partition: what is open
        // below this transaction's records there (`outbox_core::left_open`).
        let parts = s.txn.first_writes().to_check();
        let stable: Vec<Option<i64>> = parts
            .iter()
            .map(|(_, p)| {
                let p = usize::try_from(*p).unwrap_or(usize::MAX);
                Some(self.broker.last_stable_offset(p))
            })
            .collect();
        let ps: Vec<usize> = parts
            .iter()
            .map(|(_, p)| usize::try_from(*p).unwrap_or(usize::MAX))
            .collect();
        self.waive_if_unknown(i, &ps);
        let regions = self.read_regions(s, &stable);
        match s.txn.first_writes().judge_with(&stable, &regions) {
            Err(why) => {
                self.stats.left_open += 1;
                if matches!(why, outbox_core::LeftOpen::Copies { .. }) {
                    self.stats.copies_found += 1;
                }
                if self.trace {
                    eprintln!("  instance {i} aborts its commit: {why}");
                }
                return Err(Failure::Txn(TxnError::LeftOpen(why)));
            }
            Ok(doubts) => {
                if self.trace && !doubts.is_empty() {
                    eprintln!("  instance {i} commits over older open transactions: {doubts:?}");
                }

                self.stats.left_open_doubts += u64::try_from(doubts.len()).unwrap_or(0);
            }
        }
        s.txn.first_writes().commit_asked();
        if let Some(serial) = self.broker.open_serial() {
            self.commit_asked.insert(serial);
        }
        let mut attempt = 1;
        loop {
            // Now and then the response is lost: committed or not, the caller cannot tell.
            let lost = self.rng.chance(80);
            let skipped = self.skipped_markers();
            let answer = match self.broker.end_txn(s.epoch, Commit::Commit, &skipped) {
                Err(e) => Err(e),
                Ok(()) if lost => Err(TxnError::Retriable("EndTxn timed out".into())),
                Ok(()) => Ok(()),
            };
            let by = left_open::By {
                i,
                left_open: false,
                serial: None,
            };
            self.judge_decided(Some(by)).map_err(Failure::Violation)?;
            match answer {
                Ok(()) => break,
                Err(e) => match s.txn.after_commit_error(e, attempt) {
                    CommitStep::Again => {
                        self.stats.retried += 1;
                        attempt += 1;
                    }
                    CommitStep::Fail(e) => return Err(Failure::Txn(e)),
                },
            }
        }
        self.stats.commits += 1;
        self.stats.splits += u64::from(split);
        let committed = s.txn.committed(self.now, attempt);
        if attempt > 1 {
            // No KIP-890: a late produce request of the committed transaction, retried
            // by the same producer, lands in its next transaction.
            self.broker.late = Some((s.epoch, self.broker.last_committed_write()));
        }
        self.hand_on(i, s)?;
        committed.map_err(Failure::Txn)
    }

    fn ack_partition(&mut self, s: &mut Session, p: usize) -> Result<(), Failure> {
        let Some((ticket, w)) = s.life.queues[p].pop_front() else {
            return Ok(());
        };
        let offset = self.broker.append(s.epoch, p, w);
        if let Some(offset) = offset {
            self.first_write(s, p, offset, &w);
        }
        s.life
            .core
            .on_delivery(ticket, offset.is_some(), self.now_micros())
            .map_err(Failure::rules)?;
        match offset {
            Some(_) => Ok(()),
            None => Err(Failure::Txn(TxnError::Fenced("produce: _FENCED".into()))),
        }
    }

    fn quiesce(&mut self) -> Result<(), Violation> {
        for inst in &mut self.instances {
            inst.stopped_at = None;
        }
        for _ in 0..100_000 {
            let end = self.cluster.history.last().map_or(Lsn(100), |t| t.end_lsn);
            if self.cluster.confirmed >= end {
                return Ok(());
            }
            let i = self.rng.index(2);
            match self.rng.below(4) {
                0 => self.start(i)?,
                1 => self.relay_turn(i, false)?,
                2 => self.pass_time(60)?,
                _ => self.relay_turn(i, true)?,
            }
            self.expire();
        }
        Err(Violation(
            "exactly-once: the relay never caught up once quiet".into(),
        ))
    }
}

/// Why a session ends.
enum Failure {
    Txn(TxnError),
    /// The stream failed (an abortable end: the next session resumes from the record).
    Session(String),
    /// [`Failure::Session`] after a spilled replay was doubted: the next skips nothing.
    Unproven(String),
    Rules(SessionError),
    Violation(Violation),
}

impl Failure {
    /// A replay not proven (a partial one that did not match its record, or a spilled
    /// one doubted) ends the session, which the next one retries skipping nothing; any
    /// other error of the rules is a violation.
    fn rules(e: SessionError) -> Failure {
        match e {
            e if e.doubts_replay() => Failure::Unproven(e.to_string()),
            e => Failure::Rules(e),
        }
    }
}
