//! A deterministic simulation of outboxd's rules: seeded PostgreSQL histories, broker
//! behaviour and faults, single-threaded, with no clock and no sockets. Each schedule is
//! one seed; the invariants are checked as it runs and once it is quiet. See
//! docs/simulation.md for what is modelled and what is not.
//!
//! What runs here is the relay's own rules, `outbox_core::SessionCore`: what each
//! relation is, which rows become records or dead letters, what is held, skipped and
//! confirmed, the in-flight caps and the session's claim. The relay's session
//! (`crates/relay`) is the IO around the same core; `Life` here feeds it pgoutput
//! messages built from seeded histories.
//!
//! `shards` runs a sharded outbox's layout judge (`outbox_core::shard`) against a model of
//! the catalog, an application writing through the partitioned root, migrations and an
//! operator applying the judge's printed fix as actions.

mod bad_row;
mod checks;
mod eos;
mod eos_broker;
mod faults;
mod life;
mod model;
mod publication;
mod records;
mod shards;
mod shards_catalog;
mod slot_loss;
mod starts;
mod stats;
mod sweep;

use std::collections::{HashMap, HashSet};

pub use eos::{run_exactly_once, EosStats};
pub use shards::{run_shards, ShardStats};
pub use stats::Stats;
pub use sweep::{env_u64, replay_from_env, sweep, Swept, Tally};

use outbox_core::{Ended, LifeCore, ReplayStart, SessionError};
use pgoutput::Lsn;

use life::{Cursor, Life, Seen, OTHER, OUTBOX, OUTBOX_PARTITION};
use model::{Change, Cluster, Config, Kafka, Record, Txn, PARTITIONS};

/// SplitMix64: small, fast, and the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(u64::try_from(len).unwrap_or(u64::MAX))).unwrap_or(0)
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// What a schedule found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

struct Sim {
    trace: bool,
    rng: Rng,
    clusters: Vec<Cluster>,
    /// Every history any cluster ever had (restores replace one): marks are looked up here.
    archive: Vec<Vec<Txn>>,
    kafka: Kafka,
    lives: Vec<Option<Life>>,
    /// What the relay process on each cluster carries between its sessions: the relay's
    /// own rules (`outbox_core::LifeCore`). A new process starts a new one.
    carry: Vec<LifeCore<()>>,
    configs: Vec<Config>,
    /// The current relay process of each cluster, and how often it gave up its claim
    /// (a doubt resets it: its record may then move back).
    processes: Vec<u64>,
    epochs: Vec<u64>,
    snapshot: Option<Cluster>,
    next_id: u64,
    clock: i64,
    /// How far the server's clock stepped back in all: the operator's margin when
    /// re-publishing from a time.
    clock_back: i64,
    /// The relay process of each cluster that streamed from its slot.
    slot_seen: HashMap<usize, u64>,
    /// Choices of the kinds of schedule added later (their own stream: see `run`).
    kinds: Rng,
    /// The relays relay emitted messages alone (`OUTBOXD_RELAY_TABLE=false`): the outbox
    /// table stays empty, every event is a `pg_logical_emit_message`.
    emit_only: bool,
    /// `sql/publication-guard.sql` is installed (on every server: copies and backups
    /// keep it): each publication change writes the guard's message in its transaction.
    guarded: bool,
    /// Per cluster: every relay process of it relayed event messages, so each must reach
    /// Kafka (or be lost with a slot, as the operator was told).
    steady: Vec<bool>,
    /// Event messages lost with a slot: in the WAL only, never re-published.
    lost_messages: HashSet<u64>,
    /// Events of bad transactions the operator skipped by advancing the slot, as the bad
    /// row's error offered: lost knowingly (a copy or a restored snapshot of the cluster
    /// may publish them late), by the family of topics (`tag & 1`) they were to go to.
    skipped_by_hand: HashSet<(u8, u64)>,
    cap: usize,
    /// The progress topic deletes old records (retention instead of compaction).
    uncompacted: bool,
    /// Progress-record writes in flight, and their fates.
    record_writes: records::RecordWrites,
    stats: Stats,
}

/// Runs the schedule of `seed`.
pub fn run(seed: u64) -> Result<Stats, Violation> {
    let mut rng = Rng::new(seed);
    let cap = 2 + rng.index(10);
    let falls_back = rng.chance(600);
    let uncompacted = rng.chance(200);
    let mut base = Config {
        tag: 0,
        relay_table: true,
        relay_messages: rng.chance(500),
        heartbeat: rng.chance(500),
        other_published: rng.chance(500),
        dead_letter: rng.chance(700),
        limit_raised: false,
        former_partition: false,
    };
    // Kinds of schedule added later draw from their own stream, so the schedules before
    // them keep their draws (and the mutation table its seeds).
    let mut kinds = Rng::new(seed ^ 0x6b69_6e64_735f_7631);
    let emit_only = kinds.chance(100);
    let expiring = kinds.chance(500);
    let guarded = kinds.chance(300);
    // An emit-only relay depends on its process's memory of the slot when the record is
    // gone: its table never refuses a creation.
    let uncompacted = uncompacted || (emit_only && expiring);
    if emit_only {
        base.relay_table = false;
        base.relay_messages = true;
    }
    let mut sim = Sim {
        trace: std::env::var_os("OUTBOXD_SIM_TRACE").is_some(),
        rng,
        clusters: vec![Cluster {
            history: Vec::new(),
            confirmed: Lsn(100),
            persisted: Lsn(100),
            wal_end: Lsn(100),
            next_xid: 700,
            falls_back,
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
        }],
        archive: Vec::new(),
        kafka: Kafka::default(),
        lives: vec![None],
        carry: vec![LifeCore::new(false)],
        configs: vec![base],
        processes: vec![0],
        epochs: vec![0],
        snapshot: None,
        next_id: 1,
        clock: 1_000_000,
        clock_back: 0,
        slot_seen: HashMap::new(),
        kinds,
        emit_only,
        guarded,
        steady: vec![base.relay_messages],
        lost_messages: HashSet::new(),
        skipped_by_hand: HashSet::new(),
        cap,
        uncompacted,
        record_writes: records::RecordWrites::new(seed),
        stats: Stats::default(),
    };
    sim.stats.emit_only = u64::from(emit_only);
    let steps = 150 + sim.rng.below(250);
    for _ in 0..steps {
        sim.step(true)?;
    }
    sim.quiesce()?;
    sim.check_final()?;
    Ok(sim.stats)
}

/// A partly delivered transaction that did not match its record, or a spilled replay
/// doubted: the rows skipped were never vouched for, and the session ends without
/// confirming them.
fn give_up_unproven(life: &mut Life, result: &Result<(), SessionError>) {
    if matches!(
        result,
        Err(SessionError::PartialReplay(_) | SessionError::ReplayUnproven(_))
    ) {
        life.unproven.clear();
        life.core.observer().skipped.clear();
    }
}

/// How a session ended.
enum End {
    /// The process starts another session with what it carries (a partial-replay
    /// mismatch, a delivery error).
    Retry,
    /// The relay stopped with a bad row under `stop`: the event it names, if any, and
    /// where an advance past it alone goes. The operator follows the error (`bad_row`).
    BadRow(Option<u64>, Lsn),
    /// A record held by a replay was refused as too large: the relay stops; the operator
    /// raises the limit, as the error says.
    RaiseLimit,
    /// Rows of the dropped partition: the relay stops; the operator names it in
    /// `OUTBOXD_FORMER_PARTITIONS`, as the error says.
    FormerPartition,
}

impl Sim {
    fn step(&mut self, faults: bool) -> Result<(), Violation> {
        self.stats.steps += 1;
        let roll = self.rng.below(1000);
        if self.trace {
            eprintln!("step {} roll {roll}", self.stats.steps);
        }
        match roll {
            0..=184 => self.commit_txn(false),
            185..=199 => self.commit_txn(true),
            200..=499 => self.relay_read()?,
            500..=739 => self.ack()?,
            740..=799 => self.status_update()?,
            800..=819 => self.look_at_publication()?,
            820..=849 => self.write_record()?,
            850..=874 => self.checkpoint(),
            875..=929 => self.start_relays()?,
            _ if !faults => {}
            930..=944 => self.kill(),
            945..=954 => self.fail_delivery()?,
            955..=962 => self.restart_postgres(),
            963..=967 => self.take_snapshot(),
            968..=972 => self.restore(),
            973..=977 => self.clone_cluster(),
            978..=983 => self.change_config(),
            984..=987 => self.change_publication(),
            988..=990 => self.expire_records(),
            991..=993 => self.graceful_stop()?,
            994..=995 => self.foreign_writer()?,
            996 => self.forge_partial(),
            998 => self.drop_partition(),
            999 => self.lose_slot()?,
            _ => self.clock_jump(),
        }
        Ok(())
    }

    /// A transaction commits on one cluster (`bare`: a non-transactional message is
    /// written instead, outside any transaction).
    fn commit_txn(&mut self, bare: bool) {
        let c = self.rng.index(self.clusters.len());
        let n = if bare { 1 } else { 1 + self.rng.index(4) };
        let mut changes = Vec::with_capacity(n);
        for _ in 0..n {
            let agg = u32::try_from(self.rng.below(4)).unwrap_or(0);
            let mut change = match if bare { 8 } else { self.rng.below(10) } {
                0..=5 => {
                    let id = self.next_id;
                    self.next_id += 1;
                    Change::Outbox {
                        id,
                        agg,
                        partition: self.rng.chance(300) && !self.clusters[c].partition_dropped,
                        bad: self.rng.chance(30),
                    }
                }
                6..=7 => Change::Other,
                8 => {
                    let id = self.next_id;
                    self.next_id += 1;
                    Change::Message {
                        event: Some((id, agg)),
                    }
                }
                _ => Change::Message { event: None },
            };
            if let (true, Change::Outbox { id, agg, .. }) = (self.emit_only, change) {
                // An emit-only relay's events: its table stays empty.
                change = Change::Message {
                    event: Some((id, agg)),
                };
            }
            changes.push(change);
        }
        self.clock += 1 + i64::try_from(self.rng.below(5000)).unwrap_or(0);
        let size = 40 * u64::try_from(n).unwrap_or(1) + self.rng.below(3) * 8;
        // Right after a bare message, a transaction whose changes were written before it
        // may commit at the message's end: where a slot advanced past the message stands.
        let after_bare = self.clusters[c].history.last().is_some_and(|t| t.bare);
        let size = if !bare && after_bare && self.rng.chance(300) {
            0
        } else {
            size
        };
        self.clusters[c].commit(changes, size, self.clock, bare);
    }

    /// Starts a relay session on every cluster that has none (a restart after a kill,
    /// a failure or a server restart).
    fn start_relays(&mut self) -> Result<(), Violation> {
        for c in 0..self.clusters.len() {
            if self.lives[c].is_some() {
                continue;
            }
            let cfg = self.configs[c];
            // Not modelled: a start while a commit waits for its standby (the relay's
            // unsettled start's look, which the record's look stands in for).
            let cl = &mut self.clusters[c];
            cl.visible = cl.publication;
            if cl.publication != cl.accepted {
                // The record's look at the publication does not match: the relay stops
                // (exit 3) and the operator follows the procedure it names.
                self.publication_stop(c, Lsn::ZERO);
                continue;
            }
            if !self.slot_ready(c)? {
                continue;
            }
            let cl = &self.clusters[c];
            let start = cl.confirmed;
            let Some(known) = self.known(c)? else {
                continue;
            };
            let cl = &self.clusters[c];
            let claim = known.claim;
            if self.trace {
                eprintln!("  start relay on cluster {c} at {start:?} cfg {cfg:?} claim {claim:?}");
            }
            let replay = ReplayStart {
                timeline: cl.timeline,
                start,
                server_end: cl.wal_end,
                claim,
                fingerprint: cfg
                    .fingerprint()
                    .map_err(|e| Violation(format!("settings: {e}")))?,
                // Another lineage was seen writing the record: nothing is skipped.
                foreign_writer: known.foreign_writer || self.rng.chance(20),
                mark_every: crate::model::caps(self.cap).mark_every(),
                // A sixteenth of the relay's (`InFlightCaps::tracked_rows`), so that transactions
                // stop being followed here.
                tracked_rows: self.cap / 2,
                new_lineage: self.rng.next_u64() | 1,
                doubt_lineage: self.rng.next_u64() | 1,
            };
            // PostgreSQL sends what commits at or after the slot's position (a bare
            // message: what ends past it).
            let first = cl
                .history
                .iter()
                .position(|t| t.decoded_from(start))
                .unwrap_or(cl.history.len());
            let mut life = Life::new(
                c,
                self.processes[c],
                cfg,
                self.cap,
                replay,
                Cursor::Before(first),
                Seen {
                    identity: cl.publication,
                    wal_lsn: cl.wal_end,
                },
            )?;
            life.cadence = outbox_core::RecordCadence::new(life::CADENCE, self.relay_clock());
            self.record_writes.sessions += 1;
            life.session = self.record_writes.sessions;
            self.after_rules(&mut life)?;
            self.lives[c] = Some(life);
        }
        Ok(())
    }

    /// One event of one session's stream, as the relay reads it.
    fn relay_read(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let Some(mut life) = self.lives[c].take() else {
            return Ok(());
        };
        if life.failing {
            self.end_life(life, true);
            return Ok(());
        }
        let result = self.read_one(&mut life);
        self.after_rules(&mut life)?;
        self.settle_read(life, result)?;
        self.on_guard(c)
    }

    /// After a read: the session goes on (its position handed on), or ends as the relay's
    /// would.
    fn settle_read(
        &mut self,
        mut life: Life,
        result: Result<(), SessionError>,
    ) -> Result<(), Violation> {
        let c = life.cluster;
        match result {
            Ok(()) => {
                self.hand_on(&mut life)?;
                self.lives[c] = Some(life);
                Ok(())
            }
            Err(e) => {
                let unproven = e.doubts_replay();
                match self.session_error(e)? {
                    End::Retry => {
                        self.end_life(life, true);
                        if unproven {
                            self.carry[c].replay_unproven();
                        }
                    }
                    End::BadRow(event, skip_to) => self.bad_row_stop(life, event, skip_to)?,
                    End::FormerPartition => {
                        self.stats.former_partition_stops += 1;
                        self.configs[c].former_partition = true;
                        self.end_life(life, false);
                        self.carry[c] = LifeCore::new(false);
                        self.processes[c] += 1;
                    }
                    End::RaiseLimit => {
                        self.configs[c].limit_raised = true;
                        self.end_life(life, false);
                        self.carry[c] = LifeCore::new(false);
                        self.processes[c] += 1;
                    }
                }
                Ok(())
            }
        }
    }

    /// What the relay does with an error of its rules: each ends the session.
    fn session_error(&self, e: SessionError) -> Result<End, Violation> {
        match e {
            SessionError::PartialReplay(_) | SessionError::ReplayUnproven(_) => Ok(End::Retry),
            SessionError::BadRow { error, skip_to, .. } => Ok(End::BadRow(
                error.event_id().map(model::event_number),
                skip_to,
            )),
            SessionError::ReleasedTooLarge { .. } => Ok(End::RaiseLimit),
            SessionError::OutboxLikeRelation { .. } => Ok(End::FormerPartition),
            other => Err(Violation(format!("the rules failed: {other}"))),
        }
    }

    /// Checks what the rules just did: everything skipped as delivered is in Kafka, the
    /// ledger is within its caps; and counts the doubts.
    fn after_rules(&mut self, life: &mut Life) -> Result<(), Violation> {
        let checks = life.core.observer();
        let mut skipped = std::mem::take(&mut checks.skipped);
        let doubts = std::mem::take(&mut checks.doubts);
        if life.core.proving_skips() {
            life.unproven.append(&mut skipped);
        } else {
            skipped.append(&mut life.unproven);
        }
        for _ in doubts {
            self.stats.doubts += 1;
            self.epochs[life.cluster] += 1;
        }
        if self.trace && !skipped.is_empty() {
            eprintln!("  skipped as delivered: {skipped:?}");
        }
        for w in skipped {
            self.stats.proofs += 1;
            if !self.kafka.written.contains(&(w.tag, w.id)) {
                return Err(Violation(format!(
                    "event {} was left unpublished as already delivered, and Kafka does not have it",
                    w.id
                )));
            }
        }
        let n = life.core.ledger().len();
        if n > self.cap {
            return Err(Violation(format!(
                "{n} messages in flight, over the cap of {}",
                self.cap
            )));
        }
        // One read past the row ledger's limit; a hold (no report awaited) may keep up to
        // the message cap, which the relay's limit is above, but this one is not.
        let kept = life.core.rows_kept();
        if kept > self.cap + 1 {
            return Err(Violation(format!(
                "{kept} rows kept in the row ledger, over its limit of {}",
                self.cap / 2
            )));
        }
        Ok(())
    }

    /// The next message of the session's stream, fed to its rules.
    fn read_one(&mut self, life: &mut Life) -> Result<(), SessionError> {
        let result = self.read_message(life);
        give_up_unproven(life, &result);
        result
    }

    fn read_message(&mut self, life: &mut Life) -> Result<(), SessionError> {
        // Now and then the producer refuses a record outright (a fatal error): the session
        // ends at its next read and the process starts another from the slot.
        life.fail_next_send = self.rng.chance(3);
        let room = life.core.make_room()?;
        life.pump()?;
        if !room {
            return Ok(());
        }
        let cl = &self.clusters[life.cluster];
        match life.cursor {
            Cursor::Before(i) => {
                let Some(txn) = cl.history.get(i) else {
                    // Caught up: a keepalive with the server's WAL end.
                    let wal_end = cl.wal_end;
                    return life.core.on_keepalive(wal_end);
                };
                let txn = txn.clone();
                if txn.bare {
                    life.cursor = Cursor::Before(i + 1);
                    if let Some(&Change::Message { event }) = txn.changes.first() {
                        if life.cfg.streams(Change::Message { event }) {
                            life.message(life::logical_message(&txn, event), self.clock)?;
                        }
                    }
                    return life.pump();
                }
                if !txn.guard && !txn.changes.iter().any(|&ch| self.streamed(life, &txn, ch)) {
                    // PostgreSQL 15+ sends no empty transaction.
                    life.cursor = Cursor::Before(i + 1);
                    return Ok(());
                }
                if self.rng.chance(150) {
                    // A keepalive between transactions: everything before this one is sent.
                    let wal_end = i
                        .checked_sub(1)
                        .and_then(|p| cl.history.get(p))
                        .map_or(life.start, |p| p.end_lsn);
                    return life.core.on_keepalive(wal_end);
                }
                if self.rng.chance(50) {
                    life.forget_relations();
                }
                if self.trace {
                    eprintln!(
                        "  begin cluster {} txn {i} {:?} {:?}",
                        life.cluster, txn.commit_lsn, txn.changes
                    );
                }
                life.message(life::begin(&txn), self.clock)?;
                life.cursor = Cursor::Inside(i, 0);
            }
            Cursor::Inside(i, k) => {
                let txn = cl.history[i].clone();
                let streamed: Vec<Change> = txn
                    .changes
                    .iter()
                    .copied()
                    .filter(|&ch| self.streamed(life, &txn, ch))
                    .collect();
                if self.rng.chance(100) {
                    // A keepalive inside a transaction: the decoder read past its commit
                    // before sending its changes.
                    life.core.on_keepalive(txn.end_lsn)?;
                }
                if txn.guard && k == 0 {
                    // The guard's message, the transaction's only change the relay gets.
                    life.cursor = Cursor::Inside(i, 1);
                    life.message(life::guard_message(&txn), self.clock)?;
                    return life.pump();
                }
                let Some(&change) = streamed.get(k) else {
                    life.cursor = Cursor::Before(i + 1);
                    return life.message(life::commit(&txn), self.clock);
                };
                life.cursor = Cursor::Inside(i, k + 1);
                match change {
                    Change::Outbox { partition, .. } => {
                        let rel = if partition { OUTBOX_PARTITION } else { OUTBOX };
                        life.partition_gone = cl.partition_dropped;
                        life.insert(rel, life::tuple(rel, change))?;
                    }
                    Change::Other => life.insert(OTHER, life::tuple(OTHER, change))?,
                    Change::Message { event } => {
                        life.message(life::logical_message(&txn, event), self.clock)?;
                    }
                }
            }
        }
        life.pump()
    }

    /// Whether pgoutput sends `ch` of `txn` to this session.
    fn streamed(&self, life: &Life, txn: &Txn, ch: Change) -> bool {
        life.cfg.streams(ch) && !(txn.hidden && matches!(ch, Change::Outbox { .. }))
    }

    /// The broker acks the oldest message of one partition of one session.
    fn ack(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let p = self.rng.index(PARTITIONS);
        let Some(mut life) = self.lives[c].take() else {
            return Ok(());
        };
        let handed = match self.broker_acks(&mut life, p) {
            Ok(true) => self.hand_on(&mut life),
            other => other.map(|_| ()),
        };
        self.lives[c] = Some(life);
        handed
    }

    /// The broker writes and acks the oldest message of partition `p` the session sent;
    /// false: there was none.
    fn broker_acks(&mut self, life: &mut Life, p: usize) -> Result<bool, Violation> {
        let Some((ticket, w)) = life.queues[p].pop_front() else {
            return Ok(false);
        };
        if self.trace {
            eprintln!("  ack cluster {} {w:?}", life.cluster);
        }
        self.kafka.write(w);
        self.stats.events += 1;
        self.stats.dead_letters += u64::from(w.dead);
        life.core
            .on_delivery(ticket, true, self.clock)
            .map_err(|e| Violation(format!("ack: {e}")))?;
        Ok(true)
    }

    /// A status update: the slot moves to what the rules let it confirm.
    fn status_update(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        // Checked when the rules handed it on.
        let w = life.core.confirmed();
        let cl = &mut self.clusters[c];
        cl.confirmed = cl.confirmed.max(w);
        Ok(())
    }

    /// Ends a session. What the producer had sent may or may not be written.
    fn end_life(&mut self, mut life: Life, carry: bool) {
        for q in &mut life.queues {
            let mut gap = false;
            for (_, w) in q.drain(..) {
                // An idempotent producer's partition is a prefix of what it sent.
                gap |= self.rng.chance(500);
                if self.trace {
                    eprintln!("  end of life {}: {w:?} written {}", life.cluster, !gap);
                }
                if !gap {
                    self.kafka.write(w);
                }
            }
        }
        let process = &mut self.carry[life.cluster];
        process.session_ran(Some(life.core.claim()), None);
        process.ended(if carry {
            Ended::Retry
        } else {
            Ended::ProcessEnds
        });
    }

    /// No more faults or writes: the first cluster's relay runs until it has confirmed
    /// everything. A schedule that cannot get there is a violation (a hold never released,
    /// a stalled watermark).
    fn quiesce(&mut self) -> Result<(), Violation> {
        if !self.clusters[0].outbox_published {
            self.clusters[0].outbox_published = true;
            self.clusters[0].publication += 1;
            if self.guarded {
                self.clock += 1;
                self.clusters[0].commit_guard(self.clock);
            }
        }
        self.clusters[0].visible = self.clusters[0].publication;
        for _ in 0..200_000 {
            self.start_relays()?;
            let Some(life) = self.lives[0].as_ref() else {
                continue;
            };
            let cl = &self.clusters[0];
            let ledger = life.core.ledger();
            let done = matches!(life.cursor, Cursor::Before(i) if i >= cl.history.len())
                && ledger.is_empty()
                && cl.confirmed >= ledger.watermark()
                && ledger.watermark() >= cl.history.last().map_or(Lsn::ZERO, |t| t.end_lsn);
            if done {
                return Ok(());
            }
            match self.rng.below(4) {
                0 => self.relay_read()?,
                1 => self.ack()?,
                2 => self.look_at_publication()?,
                _ => self.status_update()?,
            }
        }
        Err(Violation("the relay never caught up once quiet".into()))
    }
}
