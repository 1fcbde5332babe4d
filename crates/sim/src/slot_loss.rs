//! Lost slots: the first cluster's slot invalidated (its WAL removed) or dropped, the
//! relay's rules on it (`outbox_core::slot_fate`, as `run` and `outboxd init` apply them),
//! and the operator following the procedure the errors name: drop an invalidated slot, run
//! `outboxd init` (which names the time to re-publish from, or refuses over rows), then
//! `outboxd init --recreate-lost-slot`, and re-insert the outbox rows committed since that
//! time with their own ids (docs/operations.md, "A lost slot: re-publishing").

use outbox_core::slot_fate::{
    self, AtStart, Consent, Creation, HistorySeen, MissingRefusal, SlotNow, SlotRecordSeen,
    TableSeen,
};
use outbox_core::{DeliveredPosition, LifeCore};
use pgoutput::Lsn;

use std::collections::HashMap;

use crate::model::{Change, Record, Txn};
use crate::{Sim, Violation};

impl Sim {
    /// The first cluster's slot is invalidated or dropped. Not while a copy shares its
    /// record's key, or after one wrote it: the record's time would be that copy's.
    pub(crate) fn lose_slot(&mut self) -> Result<(), Violation> {
        let key = self.clusters[0].key;
        let shared = self.clusters.iter().skip(1).any(|k| k.key == key)
            || self
                .kafka
                .records
                .get(&key)
                .is_some_and(|r| r.iter().any(|r| r.writer.0 != 0));
        // Nor after a restore of an older backup: the record may then claim a position
        // of the history the backup lost, with a time past rows of the restored one
        // below it (seed 6128 without this; docs/simulation.md, "Not modelled").
        let restored = !self.archive.is_empty();
        if shared || restored || self.clusters[0].slot != SlotNow::Usable {
            return Ok(());
        }
        let now = if self.rng.chance(500) {
            SlotNow::Invalidated
        } else {
            SlotNow::Absent
        };
        self.clusters[0].slot = now;
        self.stats.slot_losses += 1;
        if self.emit_only && self.kinds.chance(300) {
            // The progress record gone too (a Kafka migration, its topic deleted): only the
            // process that streamed from the slot still knows it existed.
            self.kafka.records.remove(&key);
        }
        if self.trace {
            eprintln!("  slot of cluster 0 lost: {now:?}");
        }
        let Some(mut life) = self.lives[0].take() else {
            return Ok(());
        };
        if self.rng.chance(500) {
            // The walsender is gone: the stream breaks, and the process starts again.
            self.end_life(life, true);
            return Ok(());
        }
        // The relay's look at the slot's statistics sees it first.
        let verdict = slot_fate::streaming(now, &life.core.claim().0);
        self.end_life(life, false);
        match verdict {
            Ok(()) => Err(Violation(
                "a lost slot went unnoticed while streaming".into(),
            )),
            Err(stop) => {
                let named = match stop {
                    slot_fate::SlotStop::Invalidated { since }
                    | slot_fate::SlotStop::Dropped { since } => since,
                    _ => None,
                };
                self.slot_procedure(0, named)
            }
        }
    }

    /// A relay's start: `true` when it streams from the slot (created first if the rules
    /// allow), `false` when it stopped and the operator followed the procedure.
    pub(crate) fn slot_ready(&mut self, c: usize) -> Result<bool, Violation> {
        let process = self.processes[c];
        let seen = self.slot_seen.get(&c) == Some(&process);
        match slot_fate::at_start(self.clusters[c].slot, seen, true) {
            Ok(AtStart::Stream) => {}
            Ok(AtStart::CreateIfNew) => {
                let judged = slot_fate::judge_missing_slot(
                    self.history_seen(c),
                    self.table_seen(c),
                    Consent::default(),
                );
                match judged {
                    Ok(_) => {
                        self.created_silently(c, seen)?;
                        self.create_slot(c, false)?;
                    }
                    Err(refusal) => {
                        self.named_by(c, refusal, "the relay's lost-slot error")?;
                        self.slot_procedure(c, None)?;
                        return Ok(false);
                    }
                }
            }
            Err(stop) => {
                if self.trace {
                    eprintln!("  relay on cluster {c} stops: {stop:?}");
                }
                self.slot_procedure(c, None)?;
                return Ok(false);
            }
        }
        self.slot_seen.insert(c, process);
        Ok(true)
    }

    /// The relay exited on its slot (its error named `named`, if a time): the operator
    /// drops an invalidated slot, runs `outboxd init`, and, as its refusal says,
    /// `outboxd init --recreate-lost-slot`, then re-publishes from the time named.
    fn slot_procedure(&mut self, c: usize, named: Option<i64>) -> Result<(), Violation> {
        self.carry[c] = LifeCore::new(false);
        self.processes[c] += 1;
        if let Some(t) = named {
            self.check_republish_time(c, Some(t), "the relay's error")?;
        }
        self.clusters[c].slot = SlotNow::Absent;
        let history = self.history_seen(c);
        let rows = self.table_seen(c);
        let refusal = match slot_fate::judge_missing_slot(history, rows, Consent::default()) {
            Ok(_) => {
                self.told_lost(c);
                return self.create_slot(c, false);
            }
            Err(refusal) => refusal,
        };
        self.named_by(c, refusal, "outboxd init")?;
        let since = recreate_lost_slot(history, rows).map_err(|r| {
            Violation(format!(
                "outboxd init --recreate-lost-slot refused on cluster {c}: {r:?}"
            ))
        })?;
        // Re-inserted rows are published only through a publication that holds the
        // outbox: one changed meanwhile is put back first, by its own procedure.
        let cl = &self.clusters[c];
        if !cl.outbox_published || cl.publication != cl.accepted {
            self.publication_stop(c, pgoutput::Lsn::ZERO);
        }
        self.told_lost(c);
        self.create_slot(c, true)?;
        self.republish_since(c, since);
        Ok(())
    }

    /// The event messages of cluster `c` that Kafka lacks (and not already lost), with
    /// their commit times, where every relay process of it relayed them.
    fn lacking_messages(&self, c: usize) -> Vec<(u64, i64)> {
        if !self.steady[c] {
            return Vec::new();
        }
        let cl = &self.clusters[c];
        let family = [cl.tag & 1, (cl.tag & 1) | 2];
        cl.history
            .iter()
            .flat_map(|t| t.changes.iter().map(move |ch| (t.commit_time, *ch)))
            .filter_map(|(at, ch)| match ch {
                Change::Message {
                    event: Some((id, _)),
                } => Some((id, at)),
                _ => None,
            })
            .filter(|&(id, _)| {
                !self.lost_messages.contains(&id)
                    && !family
                        .iter()
                        .any(|&tag| self.kafka.written.contains(&(tag, id)))
            })
            .collect()
    }

    /// The operator creates the slot again, told by the errors (the relay's and
    /// `outboxd init`'s remedies, `RelayError::remedy`) that messages emitted since the
    /// time they name cannot be re-published from the table: the event messages Kafka
    /// lacks now were in the lost slot's WAL alone. Those before that time were checked
    /// (`check_republish_time`).
    fn told_lost(&mut self, c: usize) {
        let lost = self.lacking_messages(c);
        if self.trace && !lost.is_empty() {
            eprintln!("  event messages lost with the slot of cluster {c}: {lost:?}");
        }
        self.stats.messages_lost += u64::try_from(lost.len()).unwrap_or(0);
        self.lost_messages.extend(lost.iter().map(|&(id, _)| id));
    }

    /// A relay creates its missing slot with no one told. Event messages Kafka lacks are
    /// then lost without a trace: a violation when this process streamed from the slot
    /// (the seen-slot rule's witness), and the progress record's loss otherwise (outboxd
    /// refuses a progress topic that deletes records; the simulator models one anyway).
    fn created_silently(&mut self, c: usize, seen: bool) -> Result<(), Violation> {
        let lacking = self.lacking_messages(c);
        if let (true, Some(&(id, _))) = (seen, lacking.first()) {
            return Err(Violation(format!(
                "cluster {c}'s slot, gone under the relay process that streamed from it, was created again silently, skipping event message {id} that Kafka lacks"
            )));
        }
        self.lost_messages.extend(lacking.iter().map(|&(id, _)| id));
        Ok(())
    }

    /// Checks the time a refusal names, if it names one.
    fn named_by(&self, c: usize, refusal: MissingRefusal, who: &str) -> Result<(), Violation> {
        match refusal {
            MissingRefusal::Lost { since, .. } => self.check_republish_time(c, since, who),
            MissingRefusal::HistoryUnknown | MissingRefusal::RowsBeforeSlot { .. } => Ok(()),
        }
    }

    /// Every outbox row of cluster `c` that Kafka lacks (and no later copy of it
    /// re-publishes) committed at or after `since`, less the operator's margin for the
    /// server's clock stepping back: re-publishing from there loses none.
    fn check_republish_time(
        &self,
        c: usize,
        since: Option<i64>,
        who: &str,
    ) -> Result<(), Violation> {
        let Some(since) = since else {
            return Ok(());
        };
        let from = since.saturating_sub(self.clock_back);
        let cl = &self.clusters[c];
        let family = [cl.tag & 1, (cl.tag & 1) | 2];
        let has = |id| {
            self.lost_messages.contains(&id)
                || self.skipped_by_hand.contains(&(cl.tag & 1, id))
                || family
                    .iter()
                    .any(|&tag| self.kafka.written.contains(&(tag, id)))
        };
        match lacking_before(&cl.history, from, self.steady[c], has) {
            // An event message the time leaves out is lost unnamed: the operator is told
            // only that those since the time are.
            Some(Lacking::Message(id, at)) => Err(Violation(format!(
                "cluster {c}: {who} named a lost slot's time {since} past event message {id}, committed at {at}, which Kafka lacks"
            ))),
            Some(Lacking::Row(id, at)) => Err(Violation(format!(
                "cluster {c}: {who} named a lost slot's re-publish time {since} past event {id}, committed at {at}, which Kafka lacks"
            ))),
            None => Ok(()),
        }
    }

    /// The slot created at the server's WAL end, and its record written, as `init` (with
    /// `consent`) or `run` (without) do. Without consent, skipping any row Kafka lacks
    /// is a silent recreation.
    fn create_slot(&mut self, c: usize, consent: bool) -> Result<(), Violation> {
        if !consent {
            let cl = &self.clusters[c];
            let family = [cl.tag & 1, (cl.tag & 1) | 2];
            for t in cl.history.iter().filter(|t| !t.hidden) {
                for ch in &t.changes {
                    if let Change::Outbox { id, .. } = *ch {
                        if !self.skipped_by_hand.contains(&(cl.tag & 1, id))
                            && !family
                                .iter()
                                .any(|&tag| self.kafka.written.contains(&(tag, id)))
                        {
                            return Err(Violation(format!(
                                "cluster {c}'s slot, which existed, was created again silently, skipping event {id} that Kafka lacks"
                            )));
                        }
                    }
                }
            }
        }
        // The server's clock read just before the creation: past every commit so far.
        self.clock += 1;
        let cl = &mut self.clusters[c];
        cl.slot = SlotNow::Usable;
        cl.confirmed = cl.wal_end;
        cl.persisted = cl.wal_end;
        let claim = created_claim(cl.timeline, cl.wal_end, self.clock);
        if self.trace {
            eprintln!(
                "  slot of cluster {c} created at {:?} (consent {consent})",
                cl.wal_end
            );
        }
        self.kafka.records.entry(cl.key).or_default().push(Record {
            claim,
            lineage: 0,
            writer: (c, u64::MAX, 1),
            written_at: self.clock,
        });
        Ok(())
    }

    /// The operator re-inserts the outbox rows committed since `since` (less the margin;
    /// `None`: every row), with their own ids, in one statement after the new slot: each
    /// row is in the table once, where its last insert put it, and comes back in that
    /// order (docs/operations.md: the order the DELETE finds them).
    fn republish_since(&mut self, c: usize, since: Option<i64>) {
        let from = since.map_or(i64::MIN, |t| t.saturating_sub(self.clock_back));
        let copies = rows_since(&self.clusters[c].history, from);
        if self.trace {
            eprintln!(
                "  {} rows of cluster {c} published again from {from}",
                copies.len()
            );
        }
        self.publish_again(c, copies);
    }

    /// What the progress topic says of cluster `c`'s slot: its newest record.
    fn history_seen(&self, c: usize) -> HistorySeen {
        let newest = self
            .kafka
            .records
            .get(&self.clusters[c].key)
            .and_then(|r| r.last());
        HistorySeen::Read {
            existed: newest.map(|r| SlotRecordSeen {
                confirmed: r.claim.lsn,
                since: r.claim.since,
                written_at: r.written_at,
            }),
            topic_had_records: !self.kafka.records.is_empty(),
        }
    }

    fn table_seen(&self, c: usize) -> TableSeen {
        table_seen(&self.clusters[c].history)
    }
}

// The operator's side of a lost slot, the same in both kinds of schedule.

/// The outbox never deletes rows here: it holds every row ever committed.
pub(crate) fn table_seen(history: &[Txn]) -> TableSeen {
    let any = history.iter().any(|t| {
        t.changes
            .iter()
            .any(|ch| matches!(ch, Change::Outbox { .. }))
    });
    if any {
        TableSeen::Some
    } else {
        TableSeen::Empty
    }
}

/// `outboxd init --recreate-lost-slot`, run as `outboxd init`'s refusal says: the time
/// to re-publish from (`None`: every row).
pub(crate) fn recreate_lost_slot(
    history: HistorySeen,
    rows: TableSeen,
) -> Result<Option<i64>, MissingRefusal> {
    let consent = Consent {
        recreate_lost_slot: true,
        ..Consent::default()
    };
    match slot_fate::judge_missing_slot(history, rows, consent)? {
        Creation::Recreate { since } => Ok(since),
        // No record to name a time: every row still in the table, as the docs say
        // when unsure.
        Creation::FirstStart | Creation::OverRows => Ok(None),
    }
}

/// The record `outboxd init` writes for a slot it created at `wal_end` when the server's
/// clock read `clock`.
pub(crate) fn created_claim(timeline: u32, wal_end: Lsn, clock: i64) -> DeliveredPosition {
    let mut claim = DeliveredPosition::at(timeline, wal_end, 0);
    claim.since = slot_fate::init_record_since(Some(clock), None, false, wal_end);
    claim
}

/// Where each outbox row of `history` is in the table: its last insert (the operator's
/// re-insert deletes it first), by transaction and change.
fn last_inserts(history: &[Txn]) -> HashMap<u64, (usize, usize)> {
    let mut table = HashMap::new();
    for (i, t) in history.iter().enumerate() {
        for (k, ch) in t.changes.iter().enumerate() {
            if let Change::Outbox { id, .. } = *ch {
                table.insert(id, (i, k));
            }
        }
    }
    table
}

/// The operator's re-insert: the outbox rows whose last insert committed at or after
/// `from`, each once, with its own id, in the order the table has them.
pub(crate) fn rows_since(history: &[Txn], from: i64) -> Vec<Change> {
    let mut rows: Vec<(usize, usize)> = last_inserts(history)
        .into_values()
        .filter(|&(i, _)| history[i].commit_time >= from)
        .collect();
    rows.sort_unstable();
    rows.into_iter()
        .map(|(i, k)| history[i].changes[k])
        .collect()
}

/// An event that re-publishing from a time would leave out.
pub(crate) enum Lacking {
    Row(u64, i64),
    Message(u64, i64),
}

/// The first event of `history` (in commit order) committed before `from` that `has`
/// lacks: an outbox row by its last insert only (a row inserted again since is
/// re-published from there; a hidden one is the publication procedure's), an event
/// message, when `messages`, by its commit (the WAL alone has it).
pub(crate) fn lacking_before(
    history: &[Txn],
    from: i64,
    messages: bool,
    has: impl Fn(u64) -> bool,
) -> Option<Lacking> {
    // Looked for only where a row is lacking (rare but for re-inserted rows): this runs
    // after every turn of the exactly-once schedules.
    let inserted_later = |i: usize, id: u64| {
        history[i + 1..].iter().any(|t| {
            t.changes
                .iter()
                .any(|ch| matches!(*ch, Change::Outbox { id: again, .. } if again == id))
        })
    };
    for (i, t) in history.iter().enumerate() {
        if t.commit_time >= from {
            continue;
        }
        for ch in &t.changes {
            let lacking = match *ch {
                Change::Outbox { id, .. } if !t.hidden => Lacking::Row(id, t.commit_time),
                Change::Message {
                    event: Some((id, _)),
                } if messages => Lacking::Message(id, t.commit_time),
                _ => continue,
            };
            let (Lacking::Row(id, _) | Lacking::Message(id, _)) = lacking;
            if has(id) || matches!(lacking, Lacking::Row(..)) && inserted_later(i, id) {
                continue;
            }
            return Some(lacking);
        }
    }
    None
}
