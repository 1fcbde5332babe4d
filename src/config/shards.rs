//! OUTBOXD_SHARD_COUNT and OUTBOXD_SHARDS: an outbox hash-partitioned by aggregate id,
//! one slot and publication per partition, relayed by one process or spread over several.

use outboxd_relay::pipeline::ShardSpec;

use super::{ConfigError, Env, Settings};

/// Which shards of a sharded outbox this process relays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    /// Partitions of the outbox (`FOR VALUES WITH (MODULUS count, ...)`).
    pub count: u32,
    /// Remainders relayed here, ascending, without repeats.
    pub relayed: Vec<u32>,
}

/// The name of shard `index`'s object derived from `base`: the slot, the publication and
/// the partition all follow it, so nothing else has to be configured per shard.
pub fn shard_name(base: &str, index: u32) -> String {
    format!("{base}_{index}")
}

/// The partition holding shard `index`'s rows: the relay's naming rule, which its layout
/// check enforces.
pub fn shard_table(table: &str, index: u32) -> String {
    ShardSpec::partition_name(table, index)
}

const SHARDS_ACCEPTS: &str = "all, comma-separated shard numbers (0-based, below OUTBOXD_SHARD_COUNT), or ordinal (the number at the end of HOSTNAME, as in a Kubernetes StatefulSet's pod outboxd-2)";

pub(super) fn shards(env: &Env<'_>) -> Result<Option<Shards>, ConfigError> {
    let count_text = env.string("OUTBOXD_SHARD_COUNT").unwrap_or_default();
    let selection = env.string("OUTBOXD_SHARDS").unwrap_or_default();
    if count_text.trim().is_empty() || count_text.trim() == "0" {
        if !matches!(selection.trim(), "" | "all") {
            return Err(ConfigError::new(
                "OUTBOXD_SHARDS",
                &selection,
                "only with OUTBOXD_SHARD_COUNT set (the number of partitions of the outbox)",
            ));
        }
        return Ok(None);
    }
    let count = match count_text.trim().parse::<u32>() {
        Ok(n) if (1..=256).contains(&n) => n,
        _ => {
            return Err(ConfigError::new(
                "OUTBOXD_SHARD_COUNT",
                &count_text,
                "a whole number from 1 to 256: the number of hash partitions of the outbox, each relayed through its own slot",
            ))
        }
    };
    let bad = || ConfigError::new("OUTBOXD_SHARDS", &selection, SHARDS_ACCEPTS);
    let mut relayed = match selection.trim() {
        "" | "all" => (0..count).collect::<Vec<_>>(),
        "ordinal" => {
            let host = env.raw("HOSTNAME").unwrap_or_default();
            let digits = host
                .rsplit_once('-')
                .map_or(host, |(_, n)| n)
                .trim()
                .to_owned();
            match digits.parse::<u32>() {
                Ok(n) => vec![n],
                Err(_) => {
                    return Err(ConfigError::new(
                        "OUTBOXD_SHARDS",
                        "ordinal",
                        format!("HOSTNAME={host:?} does not end in -<number>; {SHARDS_ACCEPTS}"),
                    ))
                }
            }
        }
        list => list
            .split(',')
            .map(|n| n.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<Vec<_>, _>>()?,
    };
    relayed.sort_unstable();
    relayed.dedup();
    if let Some(out_of_range) = relayed.iter().find(|&&n| n >= count) {
        return Err(ConfigError::new(
            "OUTBOXD_SHARDS",
            &selection,
            format!("shard {out_of_range} does not exist with OUTBOXD_SHARD_COUNT={count}; {SHARDS_ACCEPTS}"),
        ));
    }
    Ok(Some(Shards { count, relayed }))
}

/// Refuses what cannot work per shard: every slot sees every emitted message (they are
/// not filtered by publication), so each would be published once per shard.
pub(super) fn validate(s: &Settings) -> Result<(), ConfigError> {
    let Some(shards) = &s.shards else {
        return Ok(());
    };
    if let Some(prefix) = &s.message_prefix {
        return Err(ConfigError::new(
            "OUTBOXD_MESSAGE_PREFIX",
            prefix,
            "unset with OUTBOXD_SHARD_COUNT: every shard's slot decodes every emitted message, so each would be published once per shard; write events as rows of the outbox",
        ));
    }
    let longest = shard_name(&s.slot, shards.count.saturating_sub(1));
    if longest.len() > 63 {
        return Err(ConfigError::new(
            "OUTBOXD_SLOT",
            &s.slot,
            format!("a name short enough for its shard slots ({longest} is longer than 63 bytes)"),
        ));
    }
    for (var, name) in [
        (
            "OUTBOXD_PUBLICATION",
            shard_name(&s.publication, shards.count.saturating_sub(1)),
        ),
        (
            "OUTBOXD_TABLE",
            shard_table(&s.table_name, shards.count.saturating_sub(1)),
        ),
    ] {
        if name.len() > 63 {
            return Err(ConfigError::new(
                var,
                &name,
                "a name short enough for its shards' names (at most 63 bytes with the shard suffix)",
            ));
        }
    }
    Ok(())
}

impl Settings {
    /// The settings of each relayed shard, as if it were an outbox of its own: its slot,
    /// publication and partition. Unsharded: these settings, unchanged.
    pub fn per_shard(&self) -> Vec<Settings> {
        let Some(shards) = &self.shards else {
            return vec![self.clone()];
        };
        shards
            .relayed
            .iter()
            .map(|&index| self.shard_view(index, shards.count))
            .collect()
    }

    /// Shard `index` of `count`, whether or not this process relays it (`check` and
    /// `init` look at every shard).
    pub fn shard_view(&self, index: u32, count: u32) -> Settings {
        let mut s = self.clone();
        s.slot = shard_name(&self.slot, index);
        s.publication = shard_name(&self.publication, index);
        s.table_name = shard_table(&self.table_name, index);
        s.shard = Some(ShardSpec {
            index,
            count,
            root_schema: self.table_schema.clone(),
            root_table: self.table_name.clone(),
            key_column: self.columns.aggregate_id.clone(),
            publication_base: self.publication.clone(),
            slot_base: self.slot.clone(),
        });
        s.shards = None;
        s
    }

    /// Every shard of the outbox (not only the relayed ones); unsharded: these settings.
    pub fn all_shards(&self) -> Vec<Settings> {
        match &self.shards {
            Some(shards) => (0..shards.count)
                .map(|i| self.shard_view(i, shards.count))
                .collect(),
            None => vec![self.clone()],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::from_vars;

    fn settings(extra: &[(&str, &str)]) -> Result<super::Settings, super::ConfigError> {
        let mut vars: BTreeMap<String, String> = [("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", "k:9092")]
            .into_iter()
            .chain(extra.iter().copied())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        vars.entry("HOSTNAME".into())
            .or_insert_with(|| "box".into());
        from_vars(&vars)
    }

    #[test]
    fn unsharded_by_default_and_a_selection_needs_a_count() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.shards, None);
        assert_eq!(s.per_shard().len(), 1);
        assert_eq!(s.per_shard()[0].slot, "outboxd");
        let e = settings(&[("OUTBOXD_SHARDS", "1")]).unwrap_err();
        assert_eq!(e.var, "OUTBOXD_SHARDS");
    }

    #[test]
    fn every_shard_gets_its_own_slot_publication_and_partition() {
        let s = settings(&[
            ("OUTBOXD_SHARD_COUNT", "3"),
            ("OUTBOXD_TABLE", "app.events"),
        ])
        .unwrap();
        let views = s.per_shard();
        let names: Vec<_> = views
            .iter()
            .map(|v| {
                (
                    v.slot.as_str(),
                    v.publication.as_str(),
                    v.table_schema.as_str(),
                    v.table_name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("outboxd_0", "outboxd_0", "app", "events_shard_0"),
                ("outboxd_1", "outboxd_1", "app", "events_shard_1"),
                ("outboxd_2", "outboxd_2", "app", "events_shard_2"),
            ]
        );
        let of = views[2].shard.as_ref().unwrap();
        assert_eq!(
            (of.index, of.count, of.root_table.as_str()),
            (2, 3, "events")
        );
    }

    #[test]
    fn a_selection_picks_shards_and_ordinal_reads_the_host_name() {
        let s = settings(&[("OUTBOXD_SHARD_COUNT", "4"), ("OUTBOXD_SHARDS", "3, 1,1")]).unwrap();
        assert_eq!(s.shards.unwrap().relayed, [1, 3]);
        let s = settings(&[
            ("OUTBOXD_SHARD_COUNT", "4"),
            ("OUTBOXD_SHARDS", "ordinal"),
            ("HOSTNAME", "outboxd-2"),
        ])
        .unwrap();
        assert_eq!(s.per_shard()[0].slot, "outboxd_2");
        for (count, selection, host) in [
            ("4", "4", "x"),
            ("4", "ordinal", "outboxd-7"),
            ("4", "ordinal", "outboxd"),
            ("2", "a", "x"),
        ] {
            let e = settings(&[
                ("OUTBOXD_SHARD_COUNT", count),
                ("OUTBOXD_SHARDS", selection),
                ("HOSTNAME", host),
            ])
            .unwrap_err();
            assert_eq!(e.var, "OUTBOXD_SHARDS", "{selection} on {host}: {e}");
        }
        assert_eq!(
            settings(&[("OUTBOXD_SHARD_COUNT", "x")]).unwrap_err().var,
            "OUTBOXD_SHARD_COUNT"
        );
        assert_eq!(
            settings(&[("OUTBOXD_SHARD_COUNT", "257")]).unwrap_err().var,
            "OUTBOXD_SHARD_COUNT"
        );
    }

    #[test]
    fn emitted_messages_are_refused_with_shards() {
        let e = settings(&[
            ("OUTBOXD_SHARD_COUNT", "2"),
            ("OUTBOXD_MESSAGE_PREFIX", "outbox"),
        ])
        .unwrap_err();
        assert_eq!(e.var, "OUTBOXD_MESSAGE_PREFIX");
        assert!(e.accepts.contains("once per shard"), "{e}");
    }
}
