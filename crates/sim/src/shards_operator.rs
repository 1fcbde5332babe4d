//! The shard schedules' migrations, count changes, leftover drops and checks.

use outbox_core::shard::{self, Action};

use super::{Shards, MAX_MODULUS};
use crate::shards_catalog::{partition_name, shard_name, BASE, ROOT};
use crate::Violation;

/// `outbox_shard_<n>`: a name the judge looks for.
fn shard_named(name: &str) -> bool {
    name.strip_prefix(ROOT)
        .and_then(|n| n.strip_prefix("_shard_"))
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// A slot or publication's shard index (`outboxd_<n>`).
fn index_of(name: &str) -> Option<u32> {
    name.strip_prefix(BASE)?.strip_prefix('_')?.parse().ok()
}

impl Shards {
    /// The operator drops leftover slots and publications only when the printed
    /// conditions hold: the fix's drops once every remaining shard's slot confirmed past
    /// its COMMIT and none of them is a shard outboxd relays; the warning's (of
    /// `judge_leftover_shards`) once their slots relayed everything they decoded.
    pub(super) fn drop_leftovers(&mut self) -> Result<(), Violation> {
        let count = self.count;
        let relayed = |name: &str| index_of(name).is_some_and(|i| i < count);
        let drops = match self.pending.take() {
            Some(p) => {
                let past = p.confirmed_past.iter().all(|(name, at)| {
                    !relayed(name) || self.slots.get(name).is_none_or(|s| s.confirmed >= *at)
                });
                let named = |a: &Action| match a {
                    Action::DropSlot { name } | Action::DropPublication { name } => relayed(name),
                    _ => true,
                };
                if !self.running || !past || p.drops.iter().any(named) {
                    self.pending = Some(p);
                    return Ok(());
                }
                p.drops
            }
            None => {
                let (_, objects) = self.catalog.facts(&self.slots);
                if shard::judge_leftover_shards(&self.spec(), &objects).is_none() {
                    return Ok(());
                }
                let drops = shard::leftover_drops(&self.spec(), &objects);
                let all_relayed = drops.iter().all(|a| match a {
                    Action::DropSlot { name } => self
                        .slots
                        .get(name)
                        .is_none_or(|s| s.confirmed == s.decoded.len()),
                    _ => true,
                });
                if !all_relayed {
                    return Ok(());
                }
                drops
            }
        };
        self.note(format!(
            "the operator drops {}",
            drops.iter().map(Action::sql).collect::<Vec<_>>().join("; ")
        ));
        for action in &drops {
            match action {
                Action::DropSlot { name } => {
                    let Some(slot) = self.slots.remove(name) else {
                        continue;
                    };
                    self.stats.leftovers_dropped += 1;
                    // Nothing it decoded and did not publish may be lost with it.
                    let decoded_elsewhere = |e: &u64| {
                        self.slots
                            .iter()
                            .any(|(n, s)| relayed(n) && s.decoded[s.confirmed..].contains(e))
                    };
                    if let Some(e) = slot.decoded[slot.confirmed..]
                        .iter()
                        .find(|e| !self.kafka.contains(e) && !decoded_elsewhere(e))
                    {
                        return Err(self.violation(format!(
                            "the operator dropped slot {name} as printed, but event {e} (committed {}) that it decoded is neither in Kafka nor decoded by a remaining shard's slot",
                            self.first_commit(*e)
                        )));
                    }
                }
                Action::DropPublication { name } => {
                    self.catalog.publications.remove(name);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A migration outside outboxd (the docs say not to; the judge must still find a
    /// fix): split a partition's remainder into a modulus twice as large, detach a
    /// shard-named partition, or attach a detached one again at its old bound.
    pub(super) fn migrate(&mut self) {
        let attached: Vec<(u32, String, (u32, u32))> = self
            .catalog
            .tables
            .iter()
            .filter_map(|(id, t)| t.bound.map(|b| (*id, t.name.clone(), b)))
            .collect();
        match self.rng.below(3) {
            0 if !attached.is_empty() => {
                let (id, name, (m, r)) = attached[self.rng.index(attached.len())].clone();
                let big = m * 2;
                // A partition of the count's modulus under a name of its own is the
                // publication watch's to find (not modelled here); one detached under a
                // name not like a shard's is not looked for (the judge says so).
                if big > MAX_MODULUS || big == self.count || !shard_named(&name) {
                    return;
                }
                if let Some(t) = self.catalog.tables.get_mut(&id) {
                    t.bound = None;
                }
                let mut made = Vec::new();
                for k in [r, r + m] {
                    let shard_named = partition_name(k);
                    let to = match self.catalog.by_name(&shard_named) {
                        None => shard_named,
                        Some(_) => format!("{ROOT}_m{big}_{k}"),
                    };
                    if self.catalog.by_name(&to).is_some() || !self.catalog.bound_fits((big, k)) {
                        // Not this split: undone.
                        for id in made {
                            self.catalog.tables.remove(&id);
                        }
                        if let Some(t) = self.catalog.tables.get_mut(&id) {
                            t.bound = Some((m, r));
                        }
                        return;
                    }
                    made.push(self.catalog.add(to, Some((big, k))));
                }
                self.stats.migrations += 1;
                self.note(format!(
                    "a migration splits {name} (modulus {m}, remainder {r}) into modulus {big}"
                ));
            }
            1 if !attached.is_empty() => {
                let (id, name, _) = attached[self.rng.index(attached.len())].clone();
                // A partition detached under another name is not looked for (the judge
                // says so): not drawn.
                if !shard_named(&name) {
                    return;
                }
                if let Some(t) = self.catalog.tables.get_mut(&id) {
                    t.bound = None;
                }
                self.stats.migrations += 1;
                self.note(format!("a migration detaches {name}"));
            }
            _ => {
                let loose: Vec<(u32, String, (u32, u32))> = self
                    .catalog
                    .tables
                    .iter()
                    .filter(|(_, t)| t.bound.is_none() && shard_named(&t.name))
                    .filter_map(|(id, t)| t.was.map(|b| (*id, t.name.clone(), b)))
                    .collect();
                if loose.is_empty() {
                    return;
                }
                let (id, name, (m, r)) = loose[self.rng.index(loose.len())].clone();
                let in_its_publication = m != self.count
                    || (name == partition_name(r)
                        && self
                            .catalog
                            .publications
                            .get(&shard_name(r))
                            .is_some_and(|p| p.contains(&id)));
                if !self.catalog.bound_fits((m, r)) || !in_its_publication {
                    return;
                }
                if let Some(t) = self.catalog.tables.get_mut(&id) {
                    t.bound = Some((m, r));
                }
                self.stats.migrations += 1;
                self.note(format!("a migration attaches {name} again"));
            }
        }
    }

    /// The operator raises or lowers OUTBOXD_SHARD_COUNT and restarts outboxd, which
    /// judges the layout at its start (and stops with the fix when it is wrong).
    pub(super) fn change_count(&mut self) {
        let to = 1 + u32::try_from(self.rng.below(u64::from(MAX_MODULUS))).unwrap_or(0);
        // A partition of the new count's modulus that is not its shard's, in its
        // publication, is the publication watch's to find (not modelled here).
        let drawable = self.catalog.tables.iter().all(|(id, t)| match t.bound {
            Some((m, r)) if m == to => {
                t.name == partition_name(r)
                    && self
                        .catalog
                        .publications
                        .get(&shard_name(r))
                        .is_some_and(|p| p.contains(id))
            }
            _ => true,
        });
        if to == self.count || !drawable {
            return;
        }
        self.stats.count_changes += 1;
        self.note(format!("the operator sets OUTBOXD_SHARD_COUNT={to}"));
        self.count = to;
        self.running = false;
        // An earlier fix's drops are for the count it was printed for: the next fix (or
        // `outboxd check`'s warning) names what is left over now.
        self.pending = None;
        let (layout, objects) = self.catalog.facts(&self.slots);
        if shard::judge_layout(Some(&layout), &self.spec(), &objects).is_ok() {
            let _ = self.start();
        }
    }

    /// No more migrations or count changes: the operator follows every fix until
    /// outboxd runs, the application's refused inserts go in, and the relays catch up.
    pub(super) fn quiesce(&mut self) -> Result<(), Violation> {
        for _ in 0..20 {
            self.step += 1;
            if !self.running {
                self.operator_fix()?;
            }
            for row in std::mem::take(&mut self.waiting) {
                self.insert(row);
            }
            self.look()?;
            self.relay(true);
            self.drop_leftovers()?;
            // The relay's next look, after the drops.
            self.look()?;
            if self.running && self.waiting.is_empty() && self.pending.is_none() {
                self.relay(true);
                return Ok(());
            }
        }
        Err(self.violation(format!(
            "outboxd never ran again once quiet ({} inserts waiting, drops pending: {})",
            self.waiting.len(),
            self.pending.is_some()
        )))
    }

    /// Where event `e` was first committed, for a message (the table under its name
    /// now).
    fn first_commit(&self, e: u64) -> String {
        self.committed
            .get(&e)
            .map_or_else(String::new, |(step, table)| {
                let name = self
                    .catalog
                    .tables
                    .get(table)
                    .map_or("?", |t| t.name.as_str());
                format!("step {step} into the table now named {name}")
            })
    }

    pub(super) fn check_final(&self) -> Result<(), Violation> {
        let (layout, objects) = self.catalog.facts(&self.slots);
        if let Err(r) = shard::judge_layout(Some(&layout), &self.spec(), &objects) {
            return Err(
                self.violation(format!("the judge refuses the final layout: {}", r.message))
            );
        }
        if let Some(e) = self.committed.keys().find(|e| !self.kafka.contains(e)) {
            let decoders: Vec<&str> = self
                .slots
                .iter()
                .filter(|(_, s)| s.decoded.contains(e))
                .map(|(n, _)| n.as_str())
                .collect();
            return Err(self.violation(format!(
                "event {e} (committed {}) never reached Kafka (decoded by slots {decoders:?}, OUTBOXD_SHARD_COUNT={})",
                self.first_commit(*e),
                self.count
            )));
        }
        Ok(())
    }
}
