//! Sharded outboxes (`OUTBOXD_SHARD_COUNT`): the relay's real layout judge
//! (`outbox_core::shard`) against seeded histories of an application writing through the
//! partitioned root, migrations changing its partitions, and an operator changing the
//! shard count and following every fix the judge prints, literally, as actions
//! (`shards_catalog.rs` applies them to the model's catalog).
//!
//! Each shard's relay publishes what its slot decoded; a slot of a shard at or past the
//! count is read by nobody. What must hold: every committed row's event reaches Kafka
//! (published by a shard below the count from a slot that decoded it or a copy of it),
//! the leftovers the fix names are dropped only as it says and lose nothing, and the judge
//! accepts the final layout.

use std::collections::{BTreeMap, HashSet};

use outbox_core::shard::{self, Action, Fix, ShardSpec};

use crate::shards_catalog::{
    partition_name, shard_name, Catalog, Committed, Row, Slot, BASE, ROOT, SCHEMA,
};
use crate::{Rng, Tally, Violation};

/// Counts of one schedule, for the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShardStats {
    pub steps: u64,
    pub rows: u64,
    /// Inserts refused for a missing remainder (tried again later).
    pub refused_inserts: u64,
    pub migrations: u64,
    pub count_changes: u64,
    /// Layouts the judge refused, and plans the operator applied.
    pub refusals: u64,
    pub plans: u64,
    pub copies: u64,
    pub leftovers_dropped: u64,
}

impl Tally for ShardStats {
    fn add(&mut self, o: &Self) {
        self.steps += o.steps;
        self.rows += o.rows;
        self.refused_inserts += o.refused_inserts;
        self.migrations += o.migrations;
        self.count_changes += o.count_changes;
        self.refusals += o.refusals;
        self.plans += o.plans;
        self.copies += o.copies;
        self.leftovers_dropped += o.leftovers_dropped;
    }
}

/// The largest modulus a migration or a count makes.
const MAX_MODULUS: u32 = 8;

/// Drops a fix printed, waiting for their conditions: every remaining shard's slot
/// confirmed past the fix's COMMIT (how many events each had decoded by then).
struct PendingDrops {
    drops: Vec<Action>,
    confirmed_past: BTreeMap<String, usize>,
}

struct Shards {
    rng: Rng,
    trace: bool,
    step: u64,
    catalog: Catalog,
    slots: BTreeMap<String, Slot>,
    /// OUTBOXD_SHARD_COUNT.
    count: u32,
    /// outboxd relays the shards (the judge accepted the layout at its start).
    running: bool,
    /// Every event committed, and the step and table of its first commit (for the
    /// messages).
    committed: BTreeMap<u64, (u64, u32)>,
    kafka: HashSet<u64>,
    /// Inserts the root refused (no partition for their remainder): the application
    /// tries them again.
    waiting: Vec<Row>,
    next_event: u64,
    pending: Option<PendingDrops>,
    /// What happened to the catalog, for a violation's message.
    log: Vec<String>,
    stats: ShardStats,
}

/// Runs the shard schedule of `seed`.
pub fn run_shards(seed: u64) -> Result<ShardStats, Violation> {
    let mut rng = Rng::new(seed ^ 0x7368_6172_6473);
    let count = 1 + u32::try_from(rng.below(4)).unwrap_or(0);
    let mut sim = Shards {
        rng,
        trace: std::env::var_os("OUTBOXD_SIM_TRACE").is_some(),
        step: 0,
        catalog: Catalog::initial(count),
        slots: (0..count)
            .map(|i| (shard_name(i), Slot::default()))
            .collect(),
        count,
        running: true,
        committed: BTreeMap::new(),
        kafka: HashSet::new(),
        waiting: Vec::new(),
        next_event: 1,
        pending: None,
        log: vec![format!("start: {count} shards")],
        stats: ShardStats::default(),
    };
    let steps = 60 + sim.rng.below(140);
    for _ in 0..steps {
        sim.step_once()?;
    }
    sim.quiesce()?;
    sim.check_final()?;
    Ok(sim.stats)
}

impl Shards {
    fn spec(&self) -> ShardSpec {
        ShardSpec {
            index: 0,
            count: self.count,
            root_schema: SCHEMA.into(),
            root_table: ROOT.into(),
            key_column: "aggregate_id".into(),
            publication_base: BASE.into(),
            slot_base: BASE.into(),
        }
    }

    fn note(&mut self, what: String) {
        if self.trace {
            eprintln!("step {}: {what}", self.step);
        }
        self.log.push(format!("step {}: {what}", self.step));
    }

    fn violation(&self, what: String) -> Violation {
        // The catalog's history is short: migrations, counts and fixes.
        let tail: Vec<&str> = self
            .log
            .iter()
            .rev()
            .take(12)
            .rev()
            .map(String::as_str)
            .collect();
        Violation(format!("{what} (history: {})", tail.join("; ")))
    }

    fn step_once(&mut self) -> Result<(), Violation> {
        self.step += 1;
        self.stats.steps += 1;
        match self.rng.below(1000) {
            0..=519 => self.write(),
            520..=759 => self.relay(false),
            760..=819 => self.look()?,
            820..=879 => self.operator_fix()?,
            880..=909 => self.drop_leftovers()?,
            910..=969 => self.migrate(),
            _ => self.change_count(),
        }
        Ok(())
    }

    /// The application inserts a row through the root (or one the root refused before).
    fn write(&mut self) {
        let row = match self.waiting.is_empty() || self.rng.chance(500) {
            true => {
                let event = self.next_event;
                self.next_event += 1;
                Row {
                    event,
                    agg: self.rng.below(16),
                }
            }
            false => self.waiting.remove(0),
        };
        self.insert(row);
    }

    fn insert(&mut self, row: Row) -> bool {
        let Some(to) = self.catalog.route(&row) else {
            // No partition for its remainder: the insert fails, nothing committed.
            self.stats.refused_inserts += 1;
            self.waiting.push(row);
            return false;
        };
        let mut committed = Committed::new();
        self.catalog.insert(to, row, &mut committed);
        self.catalog.decode(&committed, &mut self.slots);
        self.committed.entry(row.event).or_insert((self.step, to));
        self.stats.rows += 1;
        true
    }

    /// Each running shard's relay publishes some of what its slot decoded (`all`: every
    /// event).
    fn relay(&mut self, all: bool) {
        if !self.running {
            return;
        }
        for i in 0..self.count {
            let take = self.rng.below(6);
            let Some(slot) = self.slots.get_mut(&shard_name(i)) else {
                continue;
            };
            let end = match all {
                true => slot.decoded.len(),
                false => slot
                    .decoded
                    .len()
                    .min(slot.confirmed + usize::try_from(take).unwrap_or(0)),
            };
            self.kafka.extend(&slot.decoded[slot.confirmed..end]);
            slot.confirmed = end;
        }
    }

    /// The running relay's layout check (every few ticks): it stops when the judge
    /// refuses.
    fn look(&mut self) -> Result<(), Violation> {
        if !self.running {
            return Ok(());
        }
        let (layout, objects) = self.catalog.facts(&self.slots);
        if let Err(refusal) = shard::judge_layout(Some(&layout), &self.spec(), &objects) {
            self.stats.refusals += 1;
            self.running = false;
            let head: String = refusal.message.chars().take(90).collect();
            self.note(format!("the relay stops: {head}"));
        }
        Ok(())
    }

    /// The operator, with outboxd stopped, runs `outboxd check` and follows it: the
    /// printed plan, literally (its statements before, the transaction at once, then
    /// `outboxd init --accept-publication-change`), and starts outboxd.
    fn operator_fix(&mut self) -> Result<(), Violation> {
        if self.running {
            return Ok(());
        }
        let (layout, objects) = self.catalog.facts(&self.slots);
        let plan = match shard::judge_layout(Some(&layout), &self.spec(), &objects) {
            Ok(()) => return self.start(),
            Err(refusal) => match refusal.fix {
                Fix::Plan(plan) => *plan,
                Fix::Rename(_) | Fix::Told => {
                    return Err(self.violation(format!(
                        "a refusal the model does not draw: {}",
                        refusal.message
                    )))
                }
            },
        };
        self.stats.plans += 1;
        self.note(format!(
            "the operator runs the fix: {}; BEGIN; {}; COMMIT",
            plan.before
                .iter()
                .map(Action::sql)
                .collect::<Vec<_>>()
                .join("; "),
            plan.transaction
                .iter()
                .map(Action::sql)
                .collect::<Vec<_>>()
                .join("; ")
        ));
        for action in &plan.before {
            self.before(action)
                .map_err(|e| self.violation(format!("the fix's `{}` fails: {e}", action.sql())))?;
        }
        // At once: a statement that fails ends the schedule (a fix that does not run is
        // a violation), so nothing is undone.
        let mut committed = Committed::new();
        for action in &plan.transaction {
            if let Err(e) = self.catalog.apply(action, &mut committed) {
                return Err(self.violation(format!(
                    "the fix's transaction fails at `{}`: {e}",
                    action.sql()
                )));
            }
        }
        self.stats.copies += u64::try_from(committed.len()).unwrap_or(0);
        self.catalog.decode(&committed, &mut self.slots);
        if !plan.leftovers.is_empty() {
            let confirmed_past = self
                .slots
                .iter()
                .map(|(name, slot)| (name.clone(), slot.decoded.len()))
                .collect();
            self.pending = Some(PendingDrops {
                drops: plan.leftovers.clone(),
                confirmed_past,
            });
        }
        // `outboxd init --accept-publication-change` checks the layout first.
        let (layout, objects) = self.catalog.facts(&self.slots);
        if let Err(r) = shard::judge_layout(Some(&layout), &self.spec(), &objects) {
            return Err(self.violation(format!(
                "`outboxd init` refuses the layout the fix made: {}",
                r.message
            )));
        }
        self.start()
    }

    /// A statement run on its own before the transaction.
    fn before(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::CreateSlot { name } => {
                if self.slots.insert(name.clone(), Slot::default()).is_some() {
                    return Err(format!("replication slot {name} already exists"));
                }
            }
            Action::DropSlot { name } => {
                self.slots
                    .remove(name)
                    .ok_or_else(|| format!("replication slot {name} does not exist"))?;
            }
            other => self.catalog.apply(other, &mut Committed::new())?,
        }
        Ok(())
    }

    /// `outboxd init` and `outboxd run`: the layout judged at the start; init creates a
    /// shard's missing publication (holding its partition) and slot.
    fn start(&mut self) -> Result<(), Violation> {
        let (layout, objects) = self.catalog.facts(&self.slots);
        if shard::judge_layout(Some(&layout), &self.spec(), &objects).is_err() {
            self.running = false;
            return Ok(());
        }
        for i in 0..self.count {
            let name = shard_name(i);
            if !self.catalog.publications.contains_key(&name) {
                let held = self
                    .catalog
                    .by_name(&partition_name(i))
                    .into_iter()
                    .collect();
                self.catalog.publications.insert(name.clone(), held);
                self.note(format!("init creates publication {name}"));
            }
            if !self.slots.contains_key(&name) {
                self.slots.insert(name.clone(), Slot::default());
                self.note(format!("init creates slot {name}"));
            }
        }
        self.running = true;
        Ok(())
    }
}

#[path = "shards_operator.rs"]
mod operator;
