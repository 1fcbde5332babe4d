//! The status-update writer: a task that owns the socket's write half.
//!
//! It answers to a timer, to keepalives that request a reply and to flush advances, and
//! never to the consumer: a consumer blocked on Kafka back-pressure stops *reading*, but
//! the walsender still gets a status update every interval and does not time out
//! (electric-sql#4105, Materialize#6827).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use pgoutput::{Lsn, PgTimestamp, StandbyStatusUpdate};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::{sleep_until, timeout, Instant};

use crate::socket::BoxStream;

/// At most one flush-triggered update per this period: acks arrive per message, the
/// server only needs the newest.
const FLUSH_RATE_LIMIT: Duration = Duration::from_millis(100);

/// A socket write that takes this long means the server is gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The status interval while the consumer does not read. Then only a failing write can
/// reveal a dead connection (the kernel reports a terminated walsender's RST, or a
/// TCP_USER_TIMEOUT expiry, to the next write), so writes come often: a peer gone while
/// Kafka is down is noticed within about a second of the kernel knowing.
const PAUSED_INTERVAL: Duration = Duration::from_secs(1);

/// State shared by the reader, the writer task and every [`FlushHandle`].
#[derive(Debug)]
pub(crate) struct Shared {
    flush: AtomicU64,
    /// Max walEnd received: the `write` field.
    received: AtomicU64,
    /// Status updates written to the socket.
    sent: AtomicU64,
    flush_advanced: Notify,
    pub(crate) reply_requested: Notify,
    /// Why the writer stopped, if it failed; the reader reports it.
    failure: Mutex<Option<(io::ErrorKind, String)>>,
    writer_failed: Notify,
    /// The consumer stopped reading (back-pressure): write status updates more often.
    paused: AtomicBool,
    pause_changed: Notify,
}

impl Shared {
    pub(crate) fn new(initial_flush: Lsn) -> Arc<Self> {
        Arc::new(Shared {
            flush: AtomicU64::new(initial_flush.0),
            received: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            flush_advanced: Notify::new(),
            reply_requested: Notify::new(),
            failure: Mutex::new(None),
            writer_failed: Notify::new(),
            paused: AtomicBool::new(false),
            pause_changed: Notify::new(),
        })
    }

    pub(crate) fn note_received(&self, wal_end: Lsn) {
        self.received.fetch_max(wal_end.0, Ordering::AcqRel);
    }

    pub(crate) fn received(&self) -> Lsn {
        Lsn(self.received.load(Ordering::Acquire))
    }

    pub(crate) fn status_updates_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub(crate) fn failure(&self) -> Option<io::Error> {
        let guard = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .map(|(kind, msg)| io::Error::new(*kind, msg.clone()))
    }

    fn set_failure(&self, e: &io::Error) {
        let mut guard = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        *guard = Some((e.kind(), e.to_string()));
        drop(guard);
        self.writer_failed.notify_waiters();
    }

    /// Resolves once the writer has failed, with why; any number of waiters.
    pub(crate) async fn wait_failure(&self) -> io::Error {
        loop {
            let notified = self.writer_failed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a failure set in between still wakes us.
            notified.as_mut().enable();
            if let Some(e) = self.failure() {
                return e;
            }
            notified.await;
        }
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        if self.paused.swap(paused, Ordering::AcqRel) != paused {
            self.pause_changed.notify_one();
        }
    }

    fn paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    fn status(&self, reply_requested: bool) -> StandbyStatusUpdate {
        let flush = Lsn(self.flush.load(Ordering::Acquire));
        StandbyStatusUpdate {
            // write ≥ flush keeps pg_stat_replication sane when the caller's flush comes
            // from a previous session and nothing has been received yet.
            write: self.received().max(flush),
            flush,
            apply: flush,
            client_time: PgTimestamp::now(),
            reply_requested,
        }
    }
}

/// The caller's durable position (e.g. the Kafka ack watermark). Cloneable; monotonic:
/// a lower value is ignored, because PG ≤16 would move `confirmed_flush_lsn` backwards.
#[derive(Debug, Clone)]
pub struct FlushHandle {
    pub(crate) shared: Arc<Shared>,
}

impl FlushHandle {
    /// Raises the flush position to `lsn` if it is higher; the writer reports it soon.
    pub fn advance(&self, lsn: Lsn) {
        let previous = self.shared.flush.fetch_max(lsn.0, Ordering::AcqRel);
        if lsn.0 > previous {
            self.shared.flush_advanced.notify_one();
        }
    }

    pub fn get(&self) -> Lsn {
        Lsn(self.shared.flush.load(Ordering::Acquire))
    }
}

pub(crate) enum Command {
    /// Send a status update now; answered once it is written.
    StatusNow(oneshot::Sender<io::Result<()>>),
    /// Send a final status update and CopyDone, then hand the write half back.
    Stop(oneshot::Sender<io::Result<WriteHalf<BoxStream>>>),
}

pub(crate) struct Writer {
    pub(crate) half: WriteHalf<BoxStream>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) interval: Duration,
    pub(crate) commands: mpsc::Receiver<Command>,
    buf: BytesMut,
    last_sent: Instant,
    last_sent_flush: Lsn,
}

impl Writer {
    pub(crate) fn new(
        half: WriteHalf<BoxStream>,
        shared: Arc<Shared>,
        interval: Duration,
        commands: mpsc::Receiver<Command>,
    ) -> Self {
        Writer {
            half,
            shared,
            interval,
            commands,
            buf: BytesMut::with_capacity(64),
            last_sent: Instant::now(),
            last_sent_flush: Lsn::ZERO,
        }
    }

    pub(crate) async fn run(mut self) {
        match self.run_inner().await {
            Ok(None) => {}
            Ok(Some(done)) => match self.finish().await {
                // The half goes back so the reader can end the session with Terminate.
                Ok(()) => {
                    let _ = done.send(Ok(self.half));
                }
                Err(e) => {
                    let _ = done.send(Err(e));
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "status writer stopped");
                self.shared.set_failure(&e);
            }
        }
    }

    /// Runs until a failure, the stream's drop (`None`) or a stop request (`Some`).
    async fn run_inner(
        &mut self,
    ) -> io::Result<Option<oneshot::Sender<io::Result<WriteHalf<BoxStream>>>>> {
        // An update right away tells the server our flush position from the start.
        self.send_status(false).await?;
        loop {
            let shared = Arc::clone(&self.shared);
            let next_periodic = self.last_sent + self.period();
            tokio::select! {
                // Commands first: a shutdown must not wait behind a timer tick.
                biased;
                command = self.commands.recv() => match command {
                    Some(Command::StatusNow(done)) => {
                        let result = self.send_status(false).await;
                        let failed = result.as_ref().err().map(|e| io::Error::new(e.kind(), e.to_string()));
                        let _ = done.send(result);
                        if let Some(e) = failed {
                            return Err(e);
                        }
                    }
                    Some(Command::Stop(done)) => return Ok(Some(done)),
                    // The stream was dropped without stop(): nothing left to report.
                    None => return Ok(None),
                },
                // The server asked for a reply; it terminates us if none comes.
                () = shared.reply_requested.notified() => self.send_status(false).await?,
                () = shared.flush_advanced.notified() => {
                    sleep_until(self.last_sent + FLUSH_RATE_LIMIT).await;
                    if self.shared.status(false).flush > self.last_sent_flush {
                        self.send_status(false).await?;
                    }
                }
                // Pausing shortens the period: start the shorter sleep now.
                () = shared.pause_changed.notified() => {}
                () = sleep_until(next_periodic) => self.send_status(false).await?,
            }
        }
    }

    fn period(&self) -> Duration {
        if self.shared.paused() {
            self.interval.min(PAUSED_INTERVAL)
        } else {
            self.interval
        }
    }

    async fn send_status(&mut self, reply_requested: bool) -> io::Result<()> {
        let status = self.shared.status(reply_requested);
        self.buf.clear();
        frontend::CopyData::new(status.to_bytes())?.write(&mut self.buf);
        self.write_buf().await?;
        self.last_sent = Instant::now();
        self.last_sent_flush = status.flush;
        self.shared.sent.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(write = %status.write, flush = %status.flush, "sent standby status update");
        Ok(())
    }

    async fn write_buf(&mut self) -> io::Result<()> {
        let write = async {
            self.half.write_all(&self.buf).await?;
            self.half.flush().await
        };
        timeout(WRITE_TIMEOUT, write).await.map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, "writing to the server timed out")
        })?
    }

    async fn finish(&mut self) -> io::Result<()> {
        self.send_status(false).await?;
        self.buf.clear();
        frontend::copy_done(&mut self.buf);
        self.write_buf().await
    }
}
