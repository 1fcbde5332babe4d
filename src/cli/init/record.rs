//! The slot's progress record as `init` writes it, and the look at the publication it
//! carries: the baseline `run` compares the publication with.

use super::*;
use outboxd_relay::pipeline::RelayError;

/// Whether `init` writes the slot's progress record (a topic, and Kafka to write it to).
pub(super) fn records_kept(s: &Settings) -> bool {
    s.progress_topic.is_some() && !s.producer.bootstrap_servers.trim().is_empty()
}

/// The publication as it is now (`None`: it does not exist), refused unless the look
/// vouches for every commit before it.
pub(super) async fn settled_look(
    s: &Settings,
    sql: &Client,
    pg: &ConnectConfig,
) -> Result<Option<PublicationSeen>, InitError> {
    let table = s
        .relay_table
        .then_some((s.table_schema.as_str(), s.table_name.as_str()));
    let looked = look_at_publication(sql, (pg, &mut None), &s.publication, table)
        .await
        .map_err(|e| InitError::Refused(e.to_string()))?;
    if !looked.settled {
        // Recorded or compared with, this look would be where a change it could not see
        // is re-published from: too late.
        return Err(InitError::Refused(format!(
            "the synchronous standbys (synchronous_standby_names) did not confirm a commit within {:?}: a transaction committed but still waiting for them is invisible to queries, and it may change publication {:?} unseen. Bring the standbys back, or empty synchronous_standby_names and reload, then run `outboxd init` again",
            pgrepl::preflight::SETTLE_TIMEOUT,
            s.publication
        )));
    }
    Ok(looked.seen)
}

/// Writes this cluster's progress record when the topic has none: the explicit step that
/// lets `run` stream from a cluster whose slot name another cluster's record also names
/// (a migration, or clusters sharing the topic). Kafka is optional for `init`: without
/// it, or unreachable, this is a warning and `run` writes the record once it streams.
pub(super) async fn record_cluster(
    s: &Settings,
    sql: &Client,
    shared: &mut Shared<'_>,
    (position, created_since): (Option<Lsn>, Option<i64>),
    renew: bool,
    baseline: Option<PublicationSeen>,
) -> Result<(), InitError> {
    let Some(topic) = &s.progress_topic else {
        return Ok(());
    };
    if !records_kept(s) {
        say!("skip progress record (OUTBOXD_KAFKA_BOOTSTRAP_SERVERS is not set; `outboxd run` writes it)");
        return Ok(());
    }
    let flags = shared.flags.clone();
    let replace_record = flags.replace_record || flags.accept_publication || renew;
    let pg = shared.pg;
    let Records { system, read } = shared.records(s, topic).await?;
    let identity = crate::cli::slot_identity(s, &system.system_id);
    let warn = |e: &dyn std::fmt::Display| {
        say!("warn progress record in {topic}: {e}; run `outboxd init` again once Kafka answers if `outboxd run` refuses a record of another cluster");
    };
    let (store, found) = match read {
        Ok(read) => read,
        Err(e) => {
            warn(e);
            return Ok(());
        }
    };
    // Every shard's slot was in the read; a missing one is said, not assumed recordless.
    let records = match found.remove(&s.slot) {
        Some(Ok(records)) => records,
        Some(Err(e)) => {
            warn(&e);
            return Ok(());
        }
        None => {
            warn(&"the slot was not in the read of the topic");
            return Ok(());
        }
    };
    // A back-fill's slot left with no record (its recording refused, or `init` killed
    // just before): the state's look, from before the slot, is still the one to compare
    // with (unless the operator accepts the publication now, over the existing slot), and
    // its creation time the record's.
    let left = match (&baseline, &records.ours, &records.backfill, position) {
        (None, None, Some(b), Some(at)) if created_since.is_none() => {
            b.look_before_slot(at).map(|look| (b, look))
        }
        _ => None,
    };
    let (baseline, created_since) = match left {
        Some((b, look)) => (
            Some(look.clone()).filter(|_| !flags.accept_publication),
            b.slot_created_at,
        ),
        None => (baseline, created_since),
    };
    let replaced = match &records.ours {
        Some(old) if replace_record => Some(old.clone()),
        Some(old) => {
            // What `run` will compare with: a change since is refused here as there. Nothing
            // is recorded, so a look the standbys did not settle is compared as `run`
            // compares its start: another catalog is a change, the same one is left to
            // `run`'s later looks.
            if let (Some(last), true) = (&old.publication, s.relay_table) {
                let table = (s.table_schema.as_str(), s.table_name.as_str());
                let now = look_at_publication(sql, (pg, &mut None), &s.publication, Some(table))
                    .await
                    .map_err(|e| InitError::Refused(e.to_string()))?;
                compare_publication(&s.publication, last, now.seen.as_ref())
                    .map_err(|e| InitError::Refused(e.to_string()))?;
            }
            say!(
                "ok  progress record in {topic} (exists for system identifier {}: confirmed {}, recorded {}; after restoring an older backup of this cluster, `outboxd init --replace-progress-record` replaces it)",
                system.system_id,
                old.confirmed_lsn(),
                old.recorded_at_text()
            );
            return Ok(());
        }
        None => None,
    };
    // Only the slot's own position: the record never claims more than the slot has
    // confirmed (a slot created here starts where nothing before it is relayed anyway),
    // and names no transaction, so it proves no replay delivered.
    let position = position.unwrap_or(Lsn::ZERO);
    // The time to re-publish from should the slot be lost: a new slot's creation, or
    // what the replaced record said of a position at or before this one (a later one
    // would name a time past rows this position has not relayed).
    // Not over `--replace-progress-record`: a record replaced as wrong (another copy's,
    // or not outboxd's) names no time worth trusting.
    let since = outbox_core::slot_fate::init_record_since(
        created_since,
        replaced.as_ref().map(|old| &old.claim),
        flags.accept_publication,
        position,
    );
    let mut record = ProgressRecord::slot_created(system.timeline, position, since);
    // The publication as it is now: the baseline `run` compares it with. A record
    // replaced over a slot that stays must not accept a change unseen (only
    // `--accept-publication-change` does); a new slot starts a new history.
    let table = s
        .relay_table
        .then_some((s.table_schema.as_str(), s.table_name.as_str()));
    let now = settled_look(s, sql, pg).await?;
    // The look `run` would compare with: the replaced record's, or, with none under this
    // key, one under the cluster's former key, if the slot was here before (a slot made
    // just now cannot have missed rows to an earlier change).
    let recorded = match (&replaced, created_since) {
        (Some(old), _) => old.publication.as_ref(),
        (None, None) => records.last_look(),
        (None, Some(_)) => None,
    };
    // A slot created by this init: the publication must be as it was just before (a
    // change while a back-fill ran hid rows from the slot). That look is what is recorded,
    // so `run`, `check` and a later `init` refuse the change too, until an operator
    // accepts it over the slot (no flag given with its creation accepts what came after).
    let (baseline, changed) = match (baseline, table) {
        (Some(before), Some(_)) => {
            let changed = compare_publication(&s.publication, &before, now.as_ref()).err();
            (Some(before), changed)
        }
        _ => (None, None),
    };
    if let (false, false, true) = (flags.accept_publication, renew, table.is_some()) {
        match recorded {
            Some(last) => compare_publication(&s.publication, last, now.as_ref())
                .map_err(|e| InitError::Refused(e.to_string()))?,
            // A slot that was here before, and no look to compare with (a new progress
            // topic, a deleted record): recorded now, today's publication would become the
            // baseline, and `run` would stream past rows a change while it was stopped
            // hid. The slot's horizon is judged first, as `run` and `check` judge it.
            None if created_since.is_none() => {
                judge_unrecorded_publication(sql, &s.publication, &s.slot, identity.key(), topic)
                    .await
                    .map_err(|e| InitError::Refused(e.to_string()))?
            }
            None => {}
        }
    }
    // Accepted: the rows the change hid are the operator's to re-publish, and prune's to
    // keep until then. Recorded first: a change accepted unrecorded would let prune
    // delete them.
    if let (true, false, true) = (flags.accept_publication, renew, table.is_some()) {
        let hidden = match recorded {
            Some(last) => match compare_publication(&s.publication, last, now.as_ref()) {
                Ok(()) => None,
                Err(RelayError::PublicationChanged { since, .. }) => Some(format!(
                    "the outbox rows committed since {since}, minus your longest transaction (created_at is a transaction's start)"
                )),
                Err(_) => Some(republish_text(None)),
            },
            None if created_since.is_none() => {
                judge_unrecorded_publication(sql, &s.publication, &s.slot, identity.key(), topic)
                    .await
                    .err()
                    .map(|_| republish_text(None))
            }
            None => None,
        };
        if let Some(rows) = hidden {
            let why = format!(
                "a change of publication {} was accepted by `outboxd init --accept-publication-change`",
                s.publication
            );
            let owed = RepublishOwed::new(why, rows).after(records.republish.as_ref());
            write_owed(store, &identity, topic, owed).await?;
        }
    }
    record.publication = baseline.or(now);
    let written = tokio::time::timeout(KAFKA_WAIT, store.write_and_wait(&identity, &record)).await;
    if let Some(changed) = changed {
        return Err(InitError::Refused(changed.to_string()));
    }
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            warn(&e);
            return Ok(());
        }
        Err(_) => {
            warn(&format!("Kafka did not acknowledge within {KAFKA_WAIT:?}"));
            return Ok(());
        }
    }
    if let Some(old) = replaced {
        say!(
            "ok  progress record in {topic} (replaced: it said confirmed {} recorded {}; it now says {} and proves nothing delivered, so the next replay is published whole)",
            old.confirmed_lsn(),
            old.recorded_at_text(),
            record.confirmed_lsn()
        );
        return Ok(());
    }
    let others: Vec<&str> = records
        .other_clusters
        .iter()
        .map(|(id, _)| id.as_str())
        .collect();
    say!(
        "ok  progress record in {topic} (written for system identifier {}{})",
        system.system_id,
        if others.is_empty() {
            String::new()
        } else {
            format!(
                "; the topic also records this slot on system identifier {}",
                others.join(", ")
            )
        }
    );
    Ok(())
}

/// Records, before the slot is created, that rows committed while it was lost are owed a
/// re-publish, so that `outboxd prune` deletes nothing until the operator says they are
/// back in Kafka. Without a readable progress topic there is nowhere to say it: the
/// operator is told to pause prune by hand.
pub(super) async fn record_owed(
    s: &Settings,
    shared: &mut Shared<'_>,
    owed: RepublishOwed,
) -> Result<(), InitError> {
    let by_hand = |why: &str| {
        say!(
            "warn {why}: pause `outboxd prune` by hand until {} are re-published",
            owed.rows
        );
    };
    let Some(topic) = s.progress_topic.as_deref().filter(|_| records_kept(s)) else {
        by_hand("no progress topic records that rows are owed a re-publish");
        return Ok(());
    };
    let Records { system, read } = shared.records(s, topic).await?;
    let identity = crate::cli::slot_identity(s, &system.system_id);
    match read {
        Ok((store, found)) => {
            let earlier = match found.get(&s.slot) {
                Some(Ok(records)) => records.republish.as_ref(),
                _ => None,
            };
            write_owed(store, &identity, topic, owed.after(earlier)).await
        }
        Err(e) => {
            by_hand(&format!("{topic} cannot be read ({e})"));
            Ok(())
        }
    }
}

async fn write_owed(
    store: &ProgressStore,
    identity: &SlotIdentity,
    topic: &str,
    owed: RepublishOwed,
) -> Result<(), InitError> {
    let failed = |why: String| {
        InitError::Refused(format!(
            "cannot record in {topic} that {} are owed a re-publish ({why}), so nothing was changed: run the same command again once Kafka answers",
            owed.rows
        ))
    };
    match tokio::time::timeout(KAFKA_WAIT, store.write_republish(identity, &owed)).await {
        Ok(Ok(())) => {
            say!(
                "ok  {topic} records that {} are owed a re-publish: `outboxd prune` deletes nothing until you run `outboxd init --republish-done` once they are re-published",
                owed.rows
            );
            Ok(())
        }
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed(format!("no acknowledgement within {KAFKA_WAIT:?}"))),
    }
}

/// `--republish-done`: every owed re-publish of the shards' slots is marked done, and
/// prune deletes again. Of a sharded outbox, only the shards `OUTBOXD_SHARDS` selects
/// (all by default): each shard's owed rows are said as it is marked.
pub(super) async fn mark_republished(
    s: &Settings,
    shared: &mut Shared<'_>,
) -> Result<(), InitError> {
    let selected: Vec<String> = s.per_shard().into_iter().map(|v| v.slot).collect();
    let Some(topic) = s.progress_topic.as_deref().filter(|_| records_kept(s)) else {
        return Err(InitError::Refused(
            "--republish-done needs the progress topic (OUTBOXD_PROGRESS_TOPIC and OUTBOXD_KAFKA_BOOTSTRAP_SERVERS), where owed re-publishes are recorded".into(),
        ));
    };
    let all = shared.all;
    let Records { system, read } = shared.records(s, topic).await?;
    let (store, found) = read.as_ref().map_err(|e| {
        InitError::Refused(format!(
            "{topic} cannot be read ({e}), so no re-publish was marked done: run the same command again once Kafka answers"
        ))
    })?;
    for view in all.iter().filter(|v| selected.contains(&v.slot)) {
        let owed = match found.get(&view.slot) {
            Some(Ok(records)) => records.republish.clone(),
            Some(Err(e)) => {
                return Err(InitError::Refused(format!(
                    "the progress record of slot {} cannot be read ({e}), so its re-publish was not marked done",
                    view.slot
                )))
            }
            None => None,
        };
        match owed {
            Some(owed) if !owed.done => {
                let identity = crate::cli::slot_identity(view, &system.system_id);
                let done = RepublishOwed { done: true, ..owed };
                let written =
                    tokio::time::timeout(KAFKA_WAIT, store.write_republish(&identity, &done)).await;
                let why = match written {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!("no acknowledgement within {KAFKA_WAIT:?}")),
                };
                if let Some(why) = why {
                    return Err(InitError::Refused(format!(
                        "Kafka did not take the mark for slot {} ({why}): run the same command again",
                        view.slot
                    )));
                }
                say!(
                    "ok  slot {}: the re-publish of {} (owed since {}) is marked done; `outboxd prune` deletes again",
                    view.slot,
                    done.rows,
                    done.recorded_at_text()
                );
            }
            _ => say!("ok  slot {}: no re-publish is owed", view.slot),
        }
    }
    Ok(())
}
