//! The server a session connected to: its version, its cluster and its timeline.

use super::error::RelayError;

/// The oldest PostgreSQL outboxd supports: pgoutput's `messages` option, the
/// `CREATE_REPLICATION_SLOT` forms and the catalog views it relies on (and the versions
/// its tests run on) start here.
pub const MIN_SERVER_VERSION_NUM: u32 = 140_000;

pub(super) fn check_server_version(version_num: u32) -> Result<(), RelayError> {
    if version_num < MIN_SERVER_VERSION_NUM {
        return Err(RelayError::UnsupportedServer { version_num });
    }
    Ok(())
}

/// The cluster this process streams from, as the first connection found it.
#[derive(Debug, Clone)]
pub(super) struct SeenSystem {
    system_id: String,
    timeline: u32,
}

/// Refuses a connection to another cluster (a different system identifier: a restored
/// backup or a wrong host, whose LSNs mean nothing for our slot), and returns the earlier
/// timeline when it changed (a promotion keeps the identifier and starts a new timeline).
pub(super) fn check_system(
    seen: &mut Option<SeenSystem>,
    now: &pgrepl::SystemInfo,
    server: (&str, u16),
) -> Result<Option<u32>, RelayError> {
    match seen {
        None => {
            *seen = Some(SeenSystem {
                system_id: now.system_id.clone(),
                timeline: now.timeline,
            });
            Ok(None)
        }
        Some(s) if s.system_id != now.system_id => Err(RelayError::OtherCluster {
            expected: s.system_id.clone(),
            found: now.system_id.clone(),
        }),
        // A promotion only ever moves to a newer timeline. An older one is a primary that
        // was left running after a standby took over (split brain): its history was
        // abandoned, and what it holds past the fork is not the cluster's.
        Some(s) if now.timeline < s.timeline => Err(RelayError::TimelineWentBack {
            host: server.0.to_owned(),
            port: server.1,
            seen: s.timeline,
            found: now.timeline,
        }),
        Some(s) if s.timeline != now.timeline => {
            let previous = s.timeline;
            s.timeline = now.timeline;
            Ok(Some(previous))
        }
        Some(_) => Ok(None),
    }
}

/// Refuses a server on an older timeline than the one recorded: a primary left running
/// after a standby was promoted (see [`RelayError::TimelineWentBack`]).
pub(super) fn refuse_older_timeline(
    recorded: u32,
    now: u32,
    server: &(String, u16),
) -> Result<(), RelayError> {
    if now < recorded {
        return Err(RelayError::TimelineWentBack {
            host: server.0.clone(),
            port: server.1,
            seen: recorded,
            found: now,
        });
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::ErrorClass;

    fn info(system_id: &str, timeline: u32) -> pgrepl::SystemInfo {
        pgrepl::SystemInfo {
            system_id: system_id.into(),
            timeline,
            xlog_pos: pgoutput::Lsn::ZERO,
            dbname: None,
        }
    }

    #[test]
    fn another_cluster_is_refused_and_a_new_timeline_reported_once() {
        let mut seen = None;
        let at = ("db1", 5432);
        assert_eq!(check_system(&mut seen, &info("7", 1), at).ok(), Some(None));
        assert_eq!(check_system(&mut seen, &info("7", 1), at).ok(), Some(None));
        assert_eq!(
            check_system(&mut seen, &info("7", 2), at).ok(),
            Some(Some(1))
        );
        assert_eq!(check_system(&mut seen, &info("7", 2), at).ok(), Some(None));
        // Back to timeline 1: an old primary left running after the promotion.
        let back = check_system(&mut seen, &info("7", 1), at).err();
        assert!(
            matches!(&back, Some(e @ RelayError::TimelineWentBack { seen: 2, found: 1, .. }) if e.exit_code() == 3),
            "{back:?}"
        );
        let err = check_system(&mut seen, &info("8", 2), at).err();
        assert!(
            matches!(&err, Some(e @ RelayError::OtherCluster { .. }) if e.exit_code() == 3 && e.class() == ErrorClass::Permanent),
            "{err:?}"
        );
    }

    #[test]
    fn servers_before_14_are_refused_with_exit_3() {
        let e = check_server_version(130_015).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().contains("PostgreSQL 14 or newer"), "{e}");
        assert!(check_server_version(140_000).is_ok());
        assert!(check_server_version(180_001).is_ok());
    }
}
