//! The server a session connected to: its version, its cluster and its timeline.

use outbox_core::Refusal;

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

/// The error a refusal of `outbox_core::LifeCore` stops the relay with, on `server`.
pub(super) fn refused(r: Refusal<RelayError>, server: &(String, u16)) -> RelayError {
    match r {
        Refusal::OtherSystem { expected, found } => RelayError::OtherCluster { expected, found },
        Refusal::TimelineWentBack { seen, found } => RelayError::TimelineWentBack {
            host: server.0.clone(),
            port: server.1,
            seen,
            found,
        },
        Refusal::Record(e) => e,
    }
}

/// Refuses a server on an older timeline than the one recorded (see
/// [`RelayError::TimelineWentBack`]).
pub(super) fn refuse_older_timeline(
    recorded: u32,
    now: u32,
    server: &(String, u16),
) -> Result<(), RelayError> {
    outbox_core::life::refuse_older_timeline(recorded, now).map_err(|r| refused(r, server))
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::error::ErrorClass;

    #[test]
    fn refusals_stop_with_exit_3_naming_the_server() {
        let at = ("db1".to_owned(), 5432);
        let mut life = outbox_core::LifeCore::<()>::new(false);
        assert!(life.connected::<RelayError>("7", 2, at.clone()).is_ok());
        // Back to timeline 1: an old primary left running after the promotion.
        let back = life
            .connected("7", 1, at.clone())
            .map_err(|r| refused(r, &at))
            .err();
        assert!(
            matches!(&back, Some(e @ RelayError::TimelineWentBack { seen: 2, found: 1, port: 5432, .. }) if e.exit_code() == 3),
            "{back:?}"
        );
        let err = life
            .connected("8", 2, at.clone())
            .map_err(|r| refused(r, &at))
            .err();
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
