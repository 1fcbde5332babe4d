//! A clean shutdown's steps, in `outbox_core::Shutdown`'s order: the IO of each.

use std::time::Duration;

use outbox_core::{Happened, LookEnd, Shutdown, ShutdownRules, ShutdownStep};
use pgrepl::ReplicationStream;

use super::{RelayError, Session, SessionEnd};

/// The final progress record gets at least this long, even past the shutdown deadline.
const FINAL_PROGRESS_WRITE_MIN: Duration = Duration::from_secs(1);

impl Session<'_> {
    /// A clean shutdown requested now.
    pub(super) fn shutdown_requested(&self) -> Shutdown {
        Shutdown::new(self.shutdown_rules(), self.since_start())
    }

    pub(super) fn shutdown_rules(&self) -> ShutdownRules {
        ShutdownRules {
            exactly_once: self.txn.is_some(),
            watches_publication: self.publication.is_some(),
            keeps_record: self.progress.is_some(),
            timeout: self.cfg.shutdown_timeout,
            final_record_min: FINAL_PROGRESS_WRITE_MIN,
        }
    }

    /// After reading stopped: the shutdown's steps, in `outbox_core::Shutdown`'s order.
    pub(super) async fn drain(
        &mut self,
        stream: &mut ReplicationStream,
        s: &mut Shutdown,
    ) -> Result<SessionEnd, RelayError> {
        // The error the shutdown ends with: the first failure that decides the exit code.
        let mut failed: Option<RelayError> = None;
        loop {
            let happened = match s.step() {
                ShutdownStep::ReadOn => return Ok(SessionEnd::Shutdown),
                // Confirmed up to the failure: its error still decides the exit code (a
                // permanent one is not a clean stop; a retryable one is, as in `run`).
                ShutdownStep::Stop | ShutdownStep::Done => {
                    return match failed.take() {
                        Some(e) => Err(e),
                        None => Ok(SessionEnd::Shutdown),
                    }
                }
                ShutdownStep::FinishKafkaTxn => match self
                    .commit_kafka_txn(Some(self.instant(s.deadline())))
                    .await
                {
                    Ok(()) => Happened::KafkaTxnCommitted,
                    // Committed whole or not at all: an abort leaves it to the next start.
                    Err(e) => {
                        let stop_by = Some(self.instant(s.deadline()));
                        failed = Some(self.abort_open_txn(e, stop_by).await);
                        Happened::KafkaTxnFailed
                    }
                },
                ShutdownStep::AwaitAcks => {
                    match self.await_acks(self.instant(s.deadline()), true).await {
                        Ok(true) => {}
                        Ok(false) => tracing::warn!(
                            unacked = self.core.ledger().len(),
                            "shutdown timeout: unacknowledged messages will be re-sent after restart"
                        ),
                        // The failure froze the position before the failed message: what
                        // was acked before it is still looked at and confirmed below.
                        Err(e) => {
                            tracing::warn!(
                                unacked = self.core.ledger().len(),
                                "a delivery failed while draining ({e}): the slot is confirmed \
                                 before it, and the rest is sent again after the restart"
                            );
                            failed = Some(e);
                        }
                    }
                    Happened::AcksAwaited
                }
                ShutdownStep::LastLook => {
                    // So the final position can cover what was acked since the look before.
                    let left = s.look_time(self.since_start());
                    let (end, error) = match tokio::time::timeout(left, self.watch_publication())
                        .await
                    {
                        Ok(Ok(())) => (LookEnd::Answered, None),
                        Ok(Err(
                            e @ (RelayError::PublicationChanged { .. }
                            | RelayError::PublicationDropped { .. }),
                        )) => (LookEnd::Stopped, Some(e)),
                        Ok(Err(e)) => {
                            tracing::warn!("the last look at the publication failed ({e}): the slot stays confirmed at the look before, and what was acked since is sent again after the restart");
                            (LookEnd::Failed, None)
                        }
                        Err(_) => {
                            tracing::warn!("the last look at the publication timed out: the slot stays confirmed at the look before");
                            (LookEnd::TimedOut, None)
                        }
                    };
                    // A publication change stops before the confirm: it is the error that
                    // matters then.
                    if error.is_some() {
                        failed = error;
                    }
                    Happened::Looked(end)
                }
                ShutdownStep::Confirm => {
                    self.advance();
                    tracing::info!(confirmed = %self.core.confirmed(), "confirming the final position and closing the stream");
                    stream.send_status_now().await?;
                    Happened::Confirmed
                }
                ShutdownStep::WriteRecord => {
                    self.write_final_record(s.record_time(self.since_start()))
                        .await;
                    Happened::RecordWritten
                }
            };
            s.on(happened);
        }
    }

    /// The final progress record, within `left`: with Kafka down the write would otherwise
    /// hold the shutdown for its own 30 s timeout. A record left older only records that
    /// the slot exists.
    async fn write_final_record(&mut self, left: Duration) {
        if self.progress.is_none() {
            return;
        }
        let record = self.progress_record();
        let Some(p) = &self.progress else {
            return;
        };
        match tokio::time::timeout(left, p.store.write_and_wait(&p.identity, &record)).await {
            Ok(Ok(())) => self.obs.progress_recorded(record.confirmed_lsn()),
            Ok(Err(e)) => {
                self.obs.progress_write_failed();
                tracing::warn!("writing the final progress record failed: {e}");
            }
            Err(_) => tracing::warn!(
                "writing the final progress record timed out after {left:?}; it stays at an older position"
            ),
        }
    }
}
