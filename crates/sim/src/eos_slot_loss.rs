//! A lost slot in the exactly-once schedules: the slot invalidated or dropped, the relay
//! stopping on it as the session's tick and a start do (`outbox_core::slot_fate`, with
//! `lost_slot_claim`), and the operator following the errors literally, as in the
//! at-least-once schedules (`crate::slot_loss`: the same `outboxd init` runs and the same
//! re-insert): the slot recreated at the WAL's end, `outboxd init`'s record written
//! outside any transaction, and the outbox rows committed since the time named inserted
//! again with their own ids. Re-inserted rows Kafka had are duplicates by event id, the
//! documented price of the procedure; nothing else may be.

use outbox_core::slot_fate::{self, AtStart, Consent, HistorySeen, MissingRefusal, SlotNow};
use outbox_core::slot_fate::{SlotRecordSeen, SlotStop};

use super::{Eos, Session};
use crate::model::Change;
use crate::slot_loss::{self as operator, Lacking};
use crate::Violation;

/// One step in this many loses the slot, as in the at-least-once schedules (a few hundred
/// steps a schedule: about one schedule in five has a loss).
pub(super) const EVERY: u64 = 1_000;

impl Eos {
    /// The slot is invalidated (its WAL removed) or dropped. The walsenders end, so the
    /// slot is free; a running relay's tick sees it and the process exits, and the
    /// operator follows its error; otherwise the next start stops on it.
    pub(super) fn lose_slot(&mut self) -> Result<(), Violation> {
        if self.cluster.slot != SlotNow::Usable {
            return Ok(());
        }
        let now = match self.losses.chance(500) {
            true => SlotNow::Invalidated,
            false => SlotNow::Absent,
        };
        self.cluster.slot = now;
        self.stats.slot_losses += 1;
        if self.trace {
            eprintln!("  slot lost: {now:?}");
        }
        for inst in &mut self.instances {
            if let Some(s) = inst.session.as_mut() {
                s.stream_lost = true;
            }
        }
        let Some(i) = self.holder.take() else {
            return Ok(());
        };
        if self.instances[i].stopped_at.is_some() {
            // SIGSTOPped: it sees nothing until resumed, then its stream is gone.
            return Ok(());
        }
        let Some(mut s) = self.instances[i].session.take() else {
            return Ok(());
        };
        // The session's tick, as the relay's (`session/tick.rs`): the newest committed
        // record's claim names the time.
        let claim = outbox_core::lost_slot_claim(Some(&s.txn), &mut s.life.core);
        let named = match slot_fate::streaming(now, &claim) {
            Ok(()) => {
                return Err(Violation(
                    "exactly-once: a lost slot went unnoticed while streaming".into(),
                ))
            }
            Err(SlotStop::Invalidated { since } | SlotStop::Dropped { since }) => since,
            Err(_) => None,
        };
        // The error ends the process; its open Kafka transaction is left to the broker
        // (the next producer's `init_transactions`, or the timeout).
        drop(s);
        self.slot_procedure(named, "the relay's lost-slot error named")
    }

    /// A start finds the slot gone or invalidated (`slot_fate::at_start`): true when it
    /// may stream (the relay created it over nothing Kafka lacks), false when the process
    /// stopped and the operator followed the procedure.
    pub(super) fn slot_at_start(&mut self, i: usize) -> Result<bool, Violation> {
        let seen = self.instances[i].streamed;
        let stop = match slot_fate::at_start(self.cluster.slot, seen, true) {
            Ok(AtStart::Stream) => return Ok(true),
            Ok(AtStart::CreateIfNew) => {
                let table = operator::table_seen(&self.cluster.history);
                match slot_fate::judge_missing_slot(self.history_seen(), table, Consent::default())
                {
                    Ok(_) => {
                        self.created_silently(seen)?;
                        return Ok(true);
                    }
                    Err(MissingRefusal::Lost { since, .. }) => Some(since),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        if self.trace {
            eprintln!("  instance {i} stops on the slot at its start");
        }
        if let Some(Some(t)) = stop {
            self.check_named_time(t, "the relay's lost-slot error named")?;
        }
        self.slot_procedure(None, "")?;
        Ok(false)
    }

    /// The relay created the missing slot itself (no record of it, no outbox row): an
    /// event message Kafka lacks is then lost unnamed. A violation when this process
    /// streamed from the slot; otherwise the record's absence (the model's first start
    /// writes none, where `outboxd init` would have).
    fn created_silently(&mut self, seen: bool) -> Result<(), Violation> {
        let lacking = self.lacking_messages();
        if let (true, Some(&id)) = (seen, lacking.first()) {
            return Err(Violation(format!(
                "exactly-once: the slot, gone under the relay process that streamed from it, was created again silently, skipping event message {id} that no committed Kafka transaction holds"
            )));
        }
        self.lost_messages.extend(lacking);
        self.create_slot(false);
        Ok(())
    }

    /// The operator, told by the relay's error (`named`, if it named a time) and then by
    /// `outboxd init`: drops an invalidated slot, runs `outboxd init --recreate-lost-slot`
    /// as the refusal says, and re-inserts the rows committed since the time it names.
    fn slot_procedure(&mut self, named: Option<i64>, who: &str) -> Result<(), Violation> {
        if let Some(t) = named {
            self.check_named_time(t, who)?;
        }
        // A process crash-looping on the lost slot (no session) is restarted anew.
        for inst in &mut self.instances {
            if inst.session.is_none() {
                inst.new_process();
            }
        }
        self.cluster.slot = SlotNow::Absent;
        let history = self.history_seen();
        let table = operator::table_seen(&self.cluster.history);
        let refusal = match slot_fate::judge_missing_slot(history, table, Consent::default()) {
            Ok(_) => {
                self.told_lost();
                self.create_slot(true);
                return Ok(());
            }
            Err(r) => r,
        };
        if let MissingRefusal::Lost { since: Some(t), .. } = refusal {
            self.check_named_time(t, "outboxd init named")?;
        }
        let since = operator::recreate_lost_slot(history, table).map_err(|r| {
            Violation(format!(
                "exactly-once: outboxd init --recreate-lost-slot refused: {r:?}"
            ))
        })?;
        self.told_lost();
        self.create_slot(true);
        // The server's clock never steps back here: no margin.
        let copies = operator::rows_since(&self.cluster.history, since.unwrap_or(i64::MIN));
        if self.trace {
            eprintln!(
                "  operator: slot created again, {} rows inserted again since {since:?}",
                copies.len()
            );
        }
        if copies.is_empty() {
            return Ok(());
        }
        for ch in &copies {
            if let Change::Outbox { id, .. } = *ch {
                *self.reinserted.entry(id).or_default() += 1;
                self.stats.republished += 1;
            }
        }
        let size = 40 * u64::try_from(copies.len()).unwrap_or(1);
        let at = self.server_clock();
        self.cluster.commit(copies, size, at, false);
        Ok(())
    }

    /// The slot created at the server's WAL end, by the relay's start or by `outboxd
    /// init` (`by_init`), which writes its record outside any transaction.
    fn create_slot(&mut self, by_init: bool) {
        let cl = &mut self.cluster;
        cl.slot = SlotNow::Usable;
        cl.confirmed = cl.wal_end;
        cl.persisted = cl.wal_end;
        if by_init {
            let at = self.server_clock();
            let claim = operator::created_claim(self.cluster.timeline, self.cluster.wal_end, at);
            self.broker.write_record(claim, at);
        }
    }

    /// What the progress topic says of the slot, read through read_committed.
    fn history_seen(&self) -> HistorySeen {
        let newest = self.broker.newest_record();
        HistorySeen::Read {
            existed: newest.map(|(claim, _, written_at)| SlotRecordSeen {
                confirmed: claim.lsn,
                since: claim.since,
                written_at,
            }),
            topic_had_records: newest.is_some(),
        }
    }

    /// The event messages no committed Kafka transaction holds (and not already lost).
    fn lacking_messages(&self) -> Vec<u64> {
        if !self.cfg.relay_messages {
            return Vec::new();
        }
        let visible = self.broker.committed_ids();
        self.cluster
            .history
            .iter()
            .flat_map(|t| t.changes.iter())
            .filter_map(|ch| match *ch {
                Change::Message {
                    event: Some((id, _)),
                } => Some(id),
                _ => None,
            })
            .filter(|id| {
                !visible.contains(id)
                    && !self.lost_messages.contains(id)
                    && !self.buried.contains(id)
            })
            .collect()
    }

    /// The slot is created again: the event messages Kafka lacks were in its WAL alone,
    /// as the errors and `outboxd init` tell the operator.
    fn told_lost(&mut self) {
        let lost = self.lacking_messages();
        if self.trace && !lost.is_empty() {
            eprintln!("  event messages lost with the slot: {lost:?}");
        }
        self.stats.messages_lost += u64::try_from(lost.len()).unwrap_or(0);
        self.lost_messages.extend(lost);
    }

    /// Re-publishing from `since` loses nothing: no event committed before it (a row by
    /// its last insert) is missing from the read_committed view.
    fn check_named_time(&self, since: i64, who: &str) -> Result<(), Violation> {
        let visible = self.broker.committed_ids();
        // Kafka's burials (`eos_left_open.rs`) are no time's doing.
        let has = |id| {
            visible.contains(&id) || self.lost_messages.contains(&id) || self.buried.contains(&id)
        };
        let messages = self.cfg.relay_messages;
        match operator::lacking_before(&self.cluster.history, since, messages, has) {
            Some(Lacking::Row(id, at) | Lacking::Message(id, at)) => Err(Violation(format!(
                "exactly-once: {who} time {since}, past event {id} (committed at {at}), which no committed Kafka transaction holds"
            ))),
            None => Ok(()),
        }
    }

    /// Were the slot invalidated now, the relay's error would name a time to re-publish
    /// from (`slot_fate::streaming`, with the claim the relay's tick gives it): no event
    /// committed before it may be missing from the read_committed view.
    pub(super) fn check_lost_slot_time(&self, s: &mut Session) -> Result<(), Violation> {
        let claim = outbox_core::lost_slot_claim(Some(&s.txn), &mut s.life.core);
        let Err(SlotStop::Invalidated { since: Some(since) }) =
            slot_fate::streaming(SlotNow::Invalidated, &claim)
        else {
            return Ok(());
        };
        if s.lost_slot_checked.replace(since) == Some(since) {
            return Ok(());
        }
        self.check_named_time(since, "a lost slot's error would name")
    }
}
