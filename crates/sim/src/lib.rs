//! A deterministic simulation of outboxd's rules: seeded PostgreSQL histories, broker
//! behaviour and faults, single-threaded, with no clock and no sockets. Each schedule is
//! one seed; the invariants are checked as it runs and once it is quiet. See
//! docs/simulation.md for what is modelled and what is not.
//!
//! What runs here is the relay's own rule code from `outbox_core`: the in-flight ledger
//! and its ack tracker (the flush position), the replay core (holds, proofs, doubts,
//! partial skips, the session's claim) and the progress record's marks. What the relay's
//! IO layer does around them (the session loop in `crates/relay`) is mirrored by
//! `Life` in a few lines per event.

use std::collections::{HashMap, HashSet, VecDeque};

use outbox_core::{
    DeliveredPosition, Fingerprint, InFlightCaps, InFlightLedger, NextRow, Outcome, Outgoing,
    ReplayCore, ReplayStart, RowId, Step, Ticket, TxnId,
};
use pgoutput::Lsn;

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

/// One change of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// An outbox row (`partition`: written through a partition of a partitioned outbox).
    Outbox { id: u64, agg: u32, partition: bool },
    /// A row of another table of the publication.
    Other,
    /// A transactional logical message: with the relay's prefix (an event) or another.
    Message { event: Option<(u64, u32)> },
}

#[derive(Debug, Clone)]
struct Txn {
    commit_lsn: Lsn,
    end_lsn: Lsn,
    xid: u32,
    commit_time: i64,
    changes: Vec<Change>,
}

impl Txn {
    fn id(&self) -> TxnId {
        TxnId {
            commit_lsn: self.commit_lsn,
            xid: self.xid,
            commit_time: self.commit_time,
        }
    }
}

/// One PostgreSQL server: its history (commit order), its slot and its WAL end.
#[derive(Debug, Clone)]
struct Cluster {
    history: Vec<Txn>,
    /// The slot's confirmed position, and what a crash falls back to (PostgreSQL 16 and
    /// older make it durable only at checkpoints).
    confirmed: Lsn,
    persisted: Lsn,
    wal_end: Lsn,
    next_xid: u32,
    falls_back: bool,
    timeline: u32,
    /// The topics its relay publishes to (0: production; 1: a staging copy's).
    tag: u8,
    /// Progress-record key: copies of one cluster share it unless named apart.
    key: u8,
}

/// A relay's settings, as far as they decide what is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    tag: u8,
    relay_messages: bool,
    heartbeat: bool,
    other_published: bool,
}

impl Config {
    fn fingerprint(self) -> u64 {
        let b = |v: bool| if v { "1" } else { "0" };
        Fingerprint::default()
            .add("tag", &self.tag.to_string())
            .add("messages", b(self.relay_messages))
            .add("heartbeat", b(self.heartbeat))
            .add("other", b(self.other_published))
            .finish()
    }

    /// Whether pgoutput sends the change to this session.
    fn streams(self, c: Change) -> bool {
        match c {
            Change::Outbox { .. } => true,
            Change::Other => self.other_published,
            Change::Message { .. } => self.relay_messages || self.heartbeat,
        }
    }
}

/// A record as written to Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    tag: u8,
    id: u64,
    agg: u32,
}

const PARTITIONS: usize = 3;

fn partition(agg: u32) -> usize {
    usize::try_from(agg).unwrap_or(0) % PARTITIONS
}

/// A progress record as the topic keeps it.
#[derive(Debug, Clone)]
struct Record {
    claim: DeliveredPosition,
    lineage: u64,
    /// The relay process that wrote it, and its claim: (cluster, process, epoch).
    writer: (usize, u64, u64),
}

/// The broker: what it holds (per partition, in append order) and the progress topic.
#[derive(Debug, Default)]
struct Kafka {
    log: Vec<Vec<Written>>,
    written: HashSet<(u8, u64)>,
    records: HashMap<u8, Vec<Record>>,
}

impl Kafka {
    fn write(&mut self, w: Written) {
        if self.log.is_empty() {
            self.log = vec![Vec::new(); PARTITIONS];
        }
        if let Some(p) = self.log.get_mut(partition(w.agg)) {
            p.push(w);
        }
        self.written.insert((w.tag, w.id));
    }
}

/// Where a session is in its stream.
#[derive(Debug, Clone, Copy)]
enum Cursor {
    /// Before the Begin of `history[0]`.
    Before(usize),
    /// Inside `history[0]`, before change `1` (streamed changes only).
    Inside(usize, usize),
}

/// One relay session: the rule code and a mirror of the relay's IO around it.
impl Life {
    /// The held records behind `tickets`, forgotten here.
    fn dropped(&mut self, tickets: &[Ticket]) -> Vec<(Ticket, Written)> {
        let (gone, kept): (Vec<_>, Vec<_>) =
            self.held.drain(..).partition(|(t, _)| tickets.contains(t));
        self.held = kept;
        gone
    }
}

struct Life {
    cluster: usize,
    /// Which relay process of its cluster runs it (a kill starts a new one).
    process: u64,
    cfg: Config,
    ledger: InFlightLedger,
    replay: ReplayCore<Written>,
    /// Produced and not acked, per partition, in produce order (an idempotent producer
    /// acks one partition in order).
    queues: Vec<VecDeque<(Ticket, Written, Option<RowId>)>>,
    cursor: Cursor,
    /// The transaction being read has its ledger entry open.
    open: bool,
    confirmed: Lsn,
    /// What was handed to the replay core to hold, to check what it drops.
    held: Vec<(Ticket, Written)>,
    /// A delivery failed: the session ends at its next read (reports of other partitions
    /// and status updates may come first).
    failing: bool,
    /// Where it started: what the slot covered then is not this session's to prove (a
    /// copy's slot covers what the original delivered to its own topics).
    start: Lsn,
}

/// What a schedule found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// Counts of one schedule, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub events: u64,
    pub duplicates: u64,
    pub kills: u64,
    pub proofs: u64,
    pub doubts: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.events += o.events;
        self.duplicates += o.duplicates;
        self.kills += o.kills;
        self.proofs += o.proofs;
        self.doubts += o.doubts;
    }
}

/// Bugs of the relay's IO layer (which `Life` mirrors) to re-introduce here, to show
/// the simulation bites: `OUTBOXD_SIM_MUTATION` in the tests. Bugs of the rule code
/// itself are re-introduced by patching it (scripts/sim-mutants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mutation {
    #[default]
    None,
    /// Count every streamed change of a transaction as a row (the partial-count bug).
    CountAllRows,
    /// Map only the outbox table's own rows, not its partitions'.
    IgnorePartitions,
}

impl Mutation {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "" | "none" => Mutation::None,
            "count_all_rows" => Mutation::CountAllRows,
            "ignore_partitions" => Mutation::IgnorePartitions,
            _ => return None,
        })
    }
}

struct Sim {
    trace: bool,
    rng: Rng,
    mutation: Mutation,
    clusters: Vec<Cluster>,
    /// Every history any cluster ever had (restores replace one): marks are looked up here.
    archive: Vec<Vec<Txn>>,
    kafka: Kafka,
    lives: Vec<Option<Life>>,
    /// What the relay process on each cluster carries between its sessions.
    carry: Vec<Option<(DeliveredPosition, u64)>>,
    configs: Vec<Config>,
    /// The current relay process of each cluster, and how often it gave up its claim
    /// (a doubt resets it: its record may then move back).
    processes: Vec<u64>,
    epochs: Vec<u64>,
    tags: HashMap<u64, u8>,
    snapshot: Option<Cluster>,
    next_id: u64,
    clock: i64,
    cap: usize,
    stats: Stats,
}

/// Runs the schedule of `seed`.
pub fn run(seed: u64, mutation: Mutation) -> Result<Stats, Violation> {
    let mut rng = Rng::new(seed);
    let cap = 2 + rng.index(10);
    let falls_back = rng.chance(600);
    let base = Config {
        tag: 0,
        relay_messages: rng.chance(500),
        heartbeat: rng.chance(500),
        other_published: rng.chance(500),
    };
    let mut sim = Sim {
        trace: std::env::var_os("OUTBOXD_SIM_TRACE").is_some(),
        rng,
        mutation,
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
        }],
        archive: Vec::new(),
        kafka: Kafka::default(),
        lives: vec![None],
        carry: vec![None],
        configs: vec![base],
        processes: vec![0],
        epochs: vec![0],
        tags: HashMap::new(),
        snapshot: None,
        next_id: 1,
        clock: 1_000_000,
        cap,
        stats: Stats::default(),
    };
    let steps = 150 + sim.rng.below(250);
    for _ in 0..steps {
        sim.step(true)?;
    }
    sim.quiesce()?;
    sim.check_final()?;
    Ok(sim.stats)
}

impl Sim {
    fn step(&mut self, faults: bool) -> Result<(), Violation> {
        self.stats.steps += 1;
        let roll = self.rng.below(1000);
        if self.trace {
            eprintln!("step {} roll {roll}", self.stats.steps);
        }
        match roll {
            0..=199 => self.commit_txn(),
            200..=499 => self.relay_read()?,
            500..=749 => self.ack()?,
            750..=809 => self.status_update()?,
            810..=859 => self.write_record()?,
            860..=889 => self.checkpoint(),
            890..=939 => self.start_relays(),
            _ if !faults => {}
            940..=954 => self.kill(),
            955..=964 => self.fail_delivery()?,
            965..=974 => self.restart_postgres(),
            975..=979 => self.take_snapshot(),
            980..=984 => self.restore(),
            985..=989 => self.clone_cluster(),
            990..=994 => self.change_config(),
            _ => self.clock_jump(),
        }
        Ok(())
    }

    fn commit_txn(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let n = 1 + self.rng.index(4);
        let mut changes = Vec::with_capacity(n);
        for _ in 0..n {
            let agg = u32::try_from(self.rng.below(4)).unwrap_or(0);
            let change = match self.rng.below(10) {
                0..=5 => {
                    let id = self.next_id;
                    self.next_id += 1;
                    Change::Outbox {
                        id,
                        agg,
                        partition: self.rng.chance(300),
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
            changes.push(change);
        }
        self.clock += 1 + i64::try_from(self.rng.below(5000)).unwrap_or(0);
        let cl = &mut self.clusters[c];
        let size = 40 * u64::try_from(n).unwrap_or(1) + self.rng.below(3) * 8;
        let commit_lsn = Lsn(cl.wal_end.0 + size);
        let end_lsn = Lsn(commit_lsn.0 + 24);
        cl.wal_end = end_lsn;
        cl.next_xid += 1;
        cl.history.push(Txn {
            commit_lsn,
            end_lsn,
            xid: cl.next_xid,
            commit_time: self.clock,
            changes,
        });
    }

    /// Starts a relay session on every cluster that has none (a restart after a kill,
    /// a failure or a server restart).
    fn start_relays(&mut self) {
        for c in 0..self.clusters.len() {
            if self.lives[c].is_some() {
                continue;
            }
            let cfg = self.configs[c];
            self.tags.insert(cfg.fingerprint(), cfg.tag);
            let cl = &self.clusters[c];
            let start = cl.confirmed;
            let claim = match self.carry[c].take() {
                Some(carried) => Some(carried),
                None => self
                    .kafka
                    .records
                    .get(&cl.key)
                    .and_then(|r| r.last())
                    .map(|r| (r.claim.clone(), r.lineage)),
            };
            if self.trace {
                eprintln!("  start relay on cluster {c} at {start:?} cfg {cfg:?} claim {claim:?}");
            }
            let replay = ReplayCore::new(ReplayStart {
                timeline: cl.timeline,
                start,
                server_end: cl.wal_end,
                claim,
                fingerprint: cfg.fingerprint(),
                foreign_writer: false,
                new_lineage: self.rng.next_u64() | 1,
                doubt_lineage: self.rng.next_u64() | 1,
            });
            let first = cl
                .history
                .iter()
                .position(|t| t.commit_lsn >= start)
                .unwrap_or(cl.history.len());
            let mut life = Life {
                cluster: c,
                process: self.processes[c],
                cfg,
                ledger: InFlightLedger::new(
                    start,
                    InFlightCaps {
                        max_messages: self.cap,
                        max_bytes: usize::MAX,
                    },
                ),
                replay,
                queues: vec![VecDeque::new(); PARTITIONS],
                cursor: Cursor::Before(first),
                open: false,
                confirmed: start,
                start,
                held: Vec::new(),
                failing: false,
            };
            self.count_doubts(&mut life);
            self.lives[c] = Some(life);
        }
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
        self.count_doubts(&mut life);
        match result {
            Ok(true) => self.lives[c] = Some(life),
            Ok(false) => self.end_life(life, true),
            Err(v) => return Err(v),
        }
        Ok(())
    }

    fn count_doubts(&mut self, life: &mut Life) {
        for d in life.replay.take_doubts() {
            self.stats.doubts += 1;
            if d != outbox_core::Doubt::HoldFull {
                self.epochs[life.cluster] += 1;
            }
        }
    }

    /// `Ok(false)`: the session ended (a partial-replay mismatch).
    fn read_one(&mut self, life: &mut Life) -> Result<bool, Violation> {
        if life.replay.held_len() > 0 && !life.ledger.has_room() {
            let step = life.replay.hold_full();
            self.apply(life, step)?;
        }
        if !life.ledger.has_room() {
            return Ok(true);
        }
        let cl = &self.clusters[life.cluster];
        match life.cursor {
            Cursor::Before(i) => {
                let Some(txn) = cl.history.get(i) else {
                    // Caught up: a keepalive with the server's WAL end.
                    let wal_end = cl.wal_end;
                    let step = life.replay.keepalive(wal_end);
                    self.apply(life, step)?;
                    life.ledger.on_keepalive(wal_end);
                    return Ok(true);
                };
                if !txn.changes.iter().any(|&ch| life.cfg.streams(ch)) {
                    // PostgreSQL 15+ sends no empty transaction.
                    life.cursor = Cursor::Before(i + 1);
                    return Ok(true);
                }
                if self.rng.chance(150) {
                    // A keepalive between transactions: everything before this one is sent.
                    let wal_end = i
                        .checked_sub(1)
                        .and_then(|p| cl.history.get(p))
                        .map_or(life.confirmed, |p| p.end_lsn);
                    let step = life.replay.keepalive(wal_end);
                    self.apply(life, step)?;
                    life.ledger.on_keepalive(wal_end);
                    return Ok(true);
                }
                let id = txn.id();
                if self.trace {
                    eprintln!(
                        "  begin cluster {} txn {i} {:?} {:?} holding {}",
                        life.cluster,
                        id.commit_lsn,
                        txn.changes,
                        life.replay.holding()
                    );
                }
                life.ledger
                    .begin()
                    .map_err(|e| Violation(format!("begin: {e}")))?;
                life.open = true;
                let step = life.replay.begin(id);
                self.apply(life, step)?;
                life.cursor = Cursor::Inside(i, 0);
            }
            Cursor::Inside(i, k) => {
                let txn = cl.history[i].clone();
                let streamed: Vec<Change> = txn
                    .changes
                    .iter()
                    .copied()
                    .filter(|&ch| life.cfg.streams(ch))
                    .collect();
                if self.rng.chance(100) {
                    // A keepalive inside a transaction: the decoder read past its commit
                    // before sending its changes. Only the ack tracker stands in the way.
                    life.ledger.on_keepalive(txn.end_lsn);
                }
                let Some(&change) = streamed.get(k) else {
                    let step = match life.replay.commit(txn.end_lsn) {
                        Ok(step) => step,
                        Err(_) => return Ok(false),
                    };
                    life.ledger
                        .commit(txn.end_lsn)
                        .map_err(|e| Violation(format!("commit: {e}")))?;
                    life.open = false;
                    self.apply(life, step)?;
                    life.cursor = Cursor::Before(i + 1);
                    return Ok(true);
                };
                life.cursor = Cursor::Inside(i, k + 1);
                let event = match change {
                    Change::Outbox { id, agg, partition } => {
                        if partition && self.mutation == Mutation::IgnorePartitions {
                            None
                        } else {
                            Some((id, agg))
                        }
                    }
                    Change::Message { event } if life.cfg.relay_messages => event,
                    Change::Other | Change::Message { .. } => {
                        if self.mutation == Mutation::CountAllRows {
                            let _ = life.replay.next_row();
                        }
                        None
                    }
                };
                if let Some((id, agg)) = event {
                    let next = life.replay.next_row();
                    if next == NextRow::InKafka && !self.kafka.written.contains(&(life.cfg.tag, id))
                    {
                        return Err(Violation(format!(
                            "event {id} was skipped inside a partly delivered transaction, and Kafka does not have it"
                        )));
                    }
                    if let NextRow::Publish(row) = next {
                        let w = Written {
                            tag: life.cfg.tag,
                            id,
                            agg,
                        };
                        let ticket = life
                            .ledger
                            .produced(Outgoing {
                                topic: "t",
                                bytes: 1,
                                commit_unix_micros: 0,
                                row,
                            })
                            .map_err(|e| Violation(format!("produced: {e}")))?;
                        if life.replay.holding() {
                            life.held.push((ticket, w));
                            life.replay.hold(ticket, w, row);
                        } else {
                            life.queues[partition(agg)].push_back((ticket, w, row));
                        }
                    }
                }
            }
        }
        if life.ledger.len() > self.cap {
            return Err(Violation(format!(
                "{} messages in flight, over the cap of {}",
                life.ledger.len(),
                self.cap
            )));
        }
        Ok(true)
    }

    fn apply(&mut self, life: &mut Life, step: Step<Written>) -> Result<(), Violation> {
        match step {
            Step::Nothing => {}
            Step::Resume { rows } => {
                if self.trace {
                    eprintln!("  resume skipping {rows} rows");
                }
            }
            Step::Drop(tickets) => {
                if self.trace {
                    eprintln!("  proven: dropping {} held", tickets.len());
                }
                self.stats.proofs += 1;
                for (_, w) in life.dropped(&tickets) {
                    if !self.kafka.written.contains(&(w.tag, w.id)) {
                        return Err(Violation(format!(
                            "a replay was proven delivered and dropped, but Kafka does not have event {} of it",
                            w.id
                        )));
                    }
                }
                for t in tickets {
                    life.ledger
                        .delivered(t, Outcome::Acked)
                        .map_err(|e| Violation(format!("drop: {e}")))?;
                }
            }
            Step::Release(d, held) => {
                if self.trace {
                    eprintln!("  release {d:?}: {} held", held.len());
                }
                life.held.clear();
                for h in held {
                    life.queues[partition(h.record.agg)].push_back((h.ticket, h.record, h.row));
                }
            }
        }
        Ok(())
    }

    /// The broker acks the oldest message of one partition of one session.
    fn ack(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let p = self.rng.index(PARTITIONS);
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        let Some((ticket, w, row)) = life.queues[p].pop_front() else {
            return Ok(());
        };
        if self.trace {
            eprintln!("  ack cluster {c} {w:?}");
        }
        self.kafka.write(w);
        self.stats.events += 1;
        life.ledger
            .delivered(ticket, Outcome::Acked)
            .map_err(|e| Violation(format!("ack: {e}")))?;
        if let Some(row) = row {
            life.replay.acked(row);
        }
        Ok(())
    }

    /// A status update: the slot moves to the session's watermark.
    fn status_update(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let Some(life) = self.lives[c].as_ref() else {
            return Ok(());
        };
        let (w, start) = (life.ledger.watermark(), life.start);
        self.confirm(c, w, start)
    }

    /// The slot of cluster `c` moves to `w`, sent by a session that started at `start`:
    /// every outbox row that session confirmed must be in Kafka.
    fn confirm(&mut self, c: usize, w: Lsn, start: Lsn) -> Result<(), Violation> {
        if let Some(life) = self.lives[c].as_mut() {
            life.confirmed = life.confirmed.max(w);
        }
        let cl = &mut self.clusters[c];
        if w > cl.confirmed {
            cl.confirmed = w;
        }
        let (tag, confirmed) = (cl.tag, cl.confirmed);
        let by_this_session = cl
            .history
            .iter()
            .skip_while(|t| t.end_lsn <= start)
            .take_while(|t| t.end_lsn <= confirmed);
        for t in by_this_session {
            for ch in &t.changes {
                if let Change::Outbox { id, .. } = ch {
                    if !self.kafka.written.contains(&(tag, *id)) {
                        return Err(Violation(format!(
                            "cluster {c} confirmed {confirmed:?} past event {id} (transaction {:?}) that Kafka does not have",
                            t.commit_lsn
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The session writes its claim; checked against every history there ever was.
    fn write_record(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        let confirmed = life.confirmed;
        let (claim, lineage) = life.replay.claim_at(confirmed);
        let writer = (c, life.process, self.epochs[c]);
        let key = self.clusters[c].key;
        let records = self.kafka.records.entry(key).or_default();
        // One process's records never move back while it keeps its claim (a doubt, or a
        // restart after a restore, may: the claim was wrong).
        if let Some(prev) = records.iter().rev().find(|r| r.writer == writer) {
            if claim.lsn < prev.claim.lsn {
                return Err(Violation(format!(
                    "the progress record moved back: {:?} after {:?}",
                    claim.lsn, prev.claim.lsn
                )));
            }
        }
        records.push(Record {
            claim,
            lineage,
            writer,
        });
        Ok(())
    }

    fn checkpoint(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cl = &mut self.clusters[c];
        cl.persisted = cl.confirmed;
    }

    /// Ends a session. What the producer had sent may or may not be written.
    fn end_life(&mut self, mut life: Life, carry: bool) {
        for q in &mut life.queues {
            let mut gap = false;
            for (_, w, _) in q.drain(..) {
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
        self.carry[life.cluster] = carry.then(|| life.replay.claim_at(life.confirmed));
    }

    fn kill(&mut self) {
        let c = self.rng.index(self.clusters.len());
        if let Some(life) = self.lives[c].take() {
            self.stats.kills += 1;
            self.end_life(life, false);
        }
        self.processes[c] += 1;
    }

    /// A delivery error: the session ends soon (at its next read); the process starts
    /// another from the slot.
    fn fail_delivery(&mut self) -> Result<(), Violation> {
        let c = self.rng.index(self.clusters.len());
        let p = self.rng.index(PARTITIONS);
        let Some(life) = self.lives[c].as_mut() else {
            return Ok(());
        };
        if let Some((ticket, _, _)) = life.queues[p].pop_front() {
            // An idempotent producer leaves no gap: what came after it in the partition
            // fails too.
            life.queues[p].clear();
            life.ledger
                .delivered(ticket, Outcome::Failed)
                .map_err(|e| Violation(format!("fail: {e}")))?;
            life.failing = true;
        }
        Ok(())
    }

    /// The server restarts (fast or immediate): the session ends; an older server falls
    /// back to the slot position of its last checkpoint.
    fn restart_postgres(&mut self) {
        let c = self.rng.index(self.clusters.len());
        if let Some(life) = self.lives[c].take() {
            self.end_life(life, true);
        }
        let cl = &mut self.clusters[c];
        if cl.falls_back && self.rng.chance(700) {
            cl.confirmed = cl.persisted;
        } else {
            cl.persisted = cl.confirmed;
        }
    }

    fn take_snapshot(&mut self) {
        if self.snapshot.is_none() {
            let mut snap = self.clusters[0].clone();
            snap.confirmed = snap.persisted;
            self.snapshot = Some(snap);
        }
    }

    /// An older backup of the first cluster replaces it (same system identifier; on the
    /// same timeline or a new one). Its relay process starts over.
    fn restore(&mut self) {
        let Some(mut snap) = self.snapshot.take() else {
            return;
        };
        if self.rng.chance(500) {
            snap.timeline += 1;
        }
        if let Some(life) = self.lives[0].take() {
            self.end_life(life, false);
        }
        self.carry[0] = None;
        self.processes[0] += 1;
        let old = std::mem::replace(&mut self.clusters[0], snap);
        self.archive.push(old.history);
    }

    /// A live copy of the first cluster, with its own relay sharing the Kafka cluster and
    /// (unless named apart) the progress record's key; its relay publishes to other
    /// topics, or to the same ones.
    fn clone_cluster(&mut self) {
        if self.clusters.len() > 1 {
            return;
        }
        let mut copy = self.clusters[0].clone();
        copy.confirmed = copy.persisted;
        copy.tag = u8::from(self.rng.chance(500));
        copy.key = u8::from(self.rng.chance(200));
        let cfg = Config {
            tag: copy.tag,
            ..self.configs[0]
        };
        self.clusters.push(copy);
        self.lives.push(None);
        self.carry.push(None);
        self.configs.push(cfg);
        self.processes.push(0);
        self.epochs.push(0);
    }

    /// The operator changes a relay's settings; its next process uses them.
    fn change_config(&mut self) {
        let c = self.rng.index(self.clusters.len());
        let cfg = &mut self.configs[c];
        match self.rng.below(3) {
            0 => cfg.relay_messages = !cfg.relay_messages,
            1 => cfg.heartbeat = !cfg.heartbeat,
            _ => cfg.other_published = !cfg.other_published,
        }
        if let Some(life) = self.lives[c].take() {
            self.end_life(life, false);
        }
        self.carry[c] = None;
        self.processes[c] += 1;
    }

    /// The server's clock steps: commit times only get compared for equality.
    fn clock_jump(&mut self) {
        if self.rng.chance(500) {
            self.clock += 10_000_000;
        } else {
            self.clock -= 5_000_000;
        }
    }

    /// No more faults or writes: the first cluster's relay runs until it has confirmed
    /// everything. A schedule that cannot get there is a violation (a hold never released,
    /// a stalled watermark).
    fn quiesce(&mut self) -> Result<(), Violation> {
        for _ in 0..200_000 {
            self.start_relays();
            let Some(life) = self.lives[0].as_ref() else {
                continue;
            };
            let cl = &self.clusters[0];
            let done = matches!(life.cursor, Cursor::Before(i) if i >= cl.history.len())
                && life.ledger.is_empty()
                && cl.confirmed >= life.ledger.watermark()
                && life.ledger.watermark() >= cl.history.last().map_or(Lsn::ZERO, |t| t.end_lsn);
            if done {
                return Ok(());
            }
            match self.rng.below(3) {
                0 => self.relay_read()?,
                1 => self.ack()?,
                _ => self.status_update()?,
            }
        }
        Err(Violation("the relay never caught up once quiet".into()))
    }

    /// Every event of the first cluster's history is in its topics, and per aggregate the
    /// first arrivals are in commit order.
    fn check_final(&mut self) -> Result<(), Violation> {
        let cl = &self.clusters[0];
        let mut order: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut ours = HashSet::new();
        for t in &cl.history {
            for ch in &t.changes {
                if let Change::Outbox { id, agg, .. } = *ch {
                    if !self.kafka.written.contains(&(cl.tag, id)) {
                        return Err(Violation(format!(
                            "event {id} (transaction {:?}) never reached Kafka",
                            t.commit_lsn
                        )));
                    }
                    order.entry(agg).or_default().push(id);
                    ours.insert(id);
                }
            }
        }
        let mut seen = HashSet::new();
        let mut arrived: HashMap<u32, Vec<u64>> = HashMap::new();
        for p in &self.kafka.log {
            for w in p.iter().filter(|w| w.tag == cl.tag && ours.contains(&w.id)) {
                if seen.insert(w.id) {
                    arrived.entry(w.agg).or_default().push(w.id);
                } else {
                    self.stats.duplicates += 1;
                }
            }
        }
        for (agg, ids) in &order {
            if arrived.get(agg) != Some(ids) {
                return Err(Violation(format!(
                    "aggregate {agg}: first arrivals {:?}, commit order {ids:?}",
                    arrived.get(agg)
                )));
            }
        }
        Ok(())
    }
}
