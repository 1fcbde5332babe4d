//! START_REPLICATION and the CopyBoth stream that follows.
//!
//! The stream is split: this side reads and decodes frames for the consumer; the
//! [`crate::status_writer`] task owns the write half and reports progress on its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use bytes::BytesMut;
use pgoutput::{
    LogicalMessage, Lsn, MessageDecoder, PgTimestamp, ReplicationFrame, TruncatedMessage,
};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::connection::ReplicationConnection;
use crate::error::{ReplError, ServerError};
use crate::options::{start_replication_sql, status_interval, StartOptions};
use crate::socket::BoxStream;
use crate::status_writer::{Command, FlushHandle, Shared, Writer};
use crate::wire::{self, Backend, Split};

/// What is kept of a CopyData over [`StartOptions::frame_limit`]: the XLogData header,
/// the pgoutput message's header and a row's leading columns (its id, aggregate and
/// event type in the usual column order), or a logical message's prefix.
pub const HEAD_LEN: usize = 64 * 1024;

/// How long [`ReplicationStream::stop`] waits for the server to end the COPY.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One item of the replication stream.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplicationEvent {
    /// A pgoutput message. `wal_start`/`wal_end` are not acknowledgeable positions; use
    /// `Commit::end_lsn`.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        send_time: PgTimestamp,
        message: LogicalMessage,
    },
    /// A pgoutput message longer than [`StartOptions::frame_limit`]: its start only, the
    /// rest was read and discarded. Positions as for `XLogData`.
    Oversized {
        wal_start: Lsn,
        wal_end: Lsn,
        send_time: PgTimestamp,
        message: TruncatedMessage,
    },
    /// A primary keepalive. Replies are sent by the writer; `wal_end` is exposed for idle
    /// advancement (ack it only with no transaction open or unacked).
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

impl ReplicationConnection {
    /// Sends START_REPLICATION and turns the connection into a [`ReplicationStream`].
    pub async fn start_replication(
        mut self,
        opts: StartOptions,
    ) -> Result<ReplicationStream, ReplError> {
        let version = self.server_version_num().await?;
        let sql = start_replication_sql(&opts, version)?;
        let server_bound = status_interval(&self.show("wal_sender_timeout").await?)?;
        let interval = match opts.status_interval {
            // The server drops a client silent for wal_sender_timeout: an explicit
            // interval may be shorter than half of it, never longer.
            Some(i) if i > server_bound => {
                tracing::warn!(
                    requested = ?i,
                    used = ?server_bound,
                    "the status interval is longer than half of the server's wal_sender_timeout; using the shorter one"
                );
                server_bound
            }
            Some(i) => i,
            None => server_bound,
        };
        tracing::info!(slot = %opts.slot, start = %opts.start_lsn, ?interval, "starting replication");
        self.conn
            .send("sending START_REPLICATION", |buf| {
                frontend::query(&sql, buf)
            })
            .await?;
        loop {
            match self.conn.recv("waiting for CopyBothResponse").await? {
                Backend::CopyBothResponse => break,
                Backend::Notice(n) => tracing::info!(notice = %n, "server notice"),
                Backend::Error(e) => {
                    // Read up to ReadyForQuery is pointless: the connection is dropped anyway.
                    return Err(stream_error(&opts.slot, e));
                }
                other => {
                    return Err(ReplError::Protocol(format!(
                        "unexpected answer to START_REPLICATION: {}",
                        other.describe()
                    )))
                }
            }
        }
        let rbuf = std::mem::take(&mut self.conn.rbuf);
        let (read, write) = tokio::io::split(self.conn.stream);
        let shared = Shared::new(opts.initial_flush);
        let (commands, rx) = mpsc::channel(4);
        let writer = tokio::spawn(Writer::new(write, Arc::clone(&shared), interval, rx).run());
        Ok(ReplicationStream {
            read,
            rbuf,
            shared,
            commands,
            writer: Some(writer),
            decoder: MessageDecoder::new(),
            frame_limit: opts.frame_limit.max(HEAD_LEN),
            discard: 0,
            slot: opts.slot,
            finished: false,
            behind: false,
            pace: false,
        })
    }
}

/// Maps a server error on the replication stream, recognising "slot in use".
pub(crate) fn stream_error(slot: &str, e: ServerError) -> ReplError {
    if e.code == "55006" {
        // "replication slot \"s\" is active for PID 1234"
        if let Some(pid) = e.message.rsplit(' ').next().and_then(|p| p.parse().ok()) {
            return ReplError::SlotInUse {
                slot: slot.to_owned(),
                pid,
            };
        }
    }
    ReplError::Server(Box::new(e))
}

/// The running replication stream. Dropping it closes the connection without a final
/// status update; prefer [`ReplicationStream::stop`].
pub struct ReplicationStream {
    read: ReadHalf<BoxStream>,
    rbuf: BytesMut,
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    writer: Option<JoinHandle<()>>,
    decoder: MessageDecoder,
    /// See [`StartOptions::frame_limit`].
    frame_limit: usize,
    /// Bytes of an oversized CopyData still to read and drop before the next message.
    discard: usize,
    slot: String,
    finished: bool,
    /// The last Begin committed long ago: a backlog is being read.
    behind: bool,
    /// Wait a moment before the next socket read, so a backlog arrives in bursts.
    pace: bool,
}

impl std::fmt::Debug for ReplicationStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationStream")
            .field("slot", &self.slot)
            .field("server_wal_end", &self.server_wal_end())
            .finish_non_exhaustive()
    }
}

impl ReplicationStream {
    /// The next event, or `None` once the server ended the stream.
    ///
    /// Cancel-safe, so it can be one branch of a `select!`: each await (the pacing sleep,
    /// the read into the stream's own buffer, the wait for a writer failure) may be
    /// dropped without losing bytes, and a frame is split off and decoded without
    /// awaiting (the tail of an oversized one is dropped by a counter kept in the
    /// stream, not in this future), so dropping this future loses nothing.
    pub async fn next(&mut self) -> Result<Option<ReplicationEvent>, ReplError> {
        loop {
            if let Some(event) = self.next_buffered()? {
                return Ok(Some(event));
            }
            if self.finished {
                return Ok(None);
            }
            // Only while behind. Pausing also after a read that stopped inside a
            // transaction at a steady load saved 4 % of the relay's CPU at 5,000 events/s
            // and cost 3 ms of p99 (docs/benchmarks.md, "Issue 21, round 2"): not kept.
            if std::mem::take(&mut self.pace) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            self.rbuf.reserve(64 * 1024);
            let shared = Arc::clone(&self.shared);
            tokio::select! {
                read = self.read.read_buf(&mut self.rbuf) => {
                    let n = read.map_err(ReplError::io("reading the replication stream"))?;
                    if n == 0 {
                        return Err(ReplError::Closed("reading the replication stream"));
                    }
                    self.pace = self.behind && n < 32 * 1024;
                }
                _ = shared.wait_failure() => {}
            }
        }
    }

    /// The next event already read from the socket, without waiting; `None` when the
    /// buffer holds no whole one (then [`ReplicationStream::next`] reads). A caller
    /// takes the rest of a burst in the same turn of its loop with it, rather than one
    /// `select!` per message: the walsender writes every message on its own.
    pub fn next_buffered(&mut self) -> Result<Option<ReplicationEvent>, ReplError> {
        if let Some(e) = self.shared.failure() {
            return Err(ReplError::Io {
                context: "sending a status update",
                source: e,
            });
        }
        while let Some(split) = self.split_next()? {
            let event = match split {
                Split::Whole(tag, body) => self.handle(tag, body)?,
                Split::Head { head, len } => Some(self.handle_head(head, len)?),
            };
            if event.is_some() {
                return Ok(event);
            }
        }
        Ok(None)
    }

    /// The next message (or head of one) in the buffer, after dropping what is left of
    /// an oversized one. Never awaits, so the stream stays cancel-safe.
    fn split_next(&mut self) -> Result<Option<Split>, ReplError> {
        if self.discard > 0 {
            let n = self.discard.min(self.rbuf.len());
            self.rbuf.advance(n);
            self.discard -= n;
            if self.discard > 0 {
                return Ok(None);
            }
        }
        let split = wire::split_stream_message(&mut self.rbuf, self.frame_limit, HEAD_LEN)?;
        if let Some(Split::Head { head, len }) = &split {
            self.discard = len.saturating_sub(head.len());
        }
        Ok(split)
    }

    /// The head of a CopyData of `len` bytes: an XLogData, as nothing else is that long.
    fn handle_head(
        &mut self,
        head: bytes::Bytes,
        len: usize,
    ) -> Result<ReplicationEvent, ReplError> {
        let kept = head.len();
        let ReplicationFrame::XLogData(x) = ReplicationFrame::decode(head)? else {
            return Err(ReplError::Protocol(format!(
                "a {len}-byte CopyData that is not XLogData on the replication stream"
            )));
        };
        self.shared.note_received(x.wal_end);
        // The XLogData header is the part of what was kept before the message.
        let message_len = len.saturating_sub(kept.saturating_sub(x.data.len()));
        let message = self.decoder.decode_truncated(x.data, message_len)?;
        tracing::debug!(len, wal_end = %x.wal_end, "read through a message over the frame limit");
        Ok(ReplicationEvent::Oversized {
            wal_start: x.wal_start,
            wal_end: x.wal_end,
            send_time: x.send_time,
            message,
        })
    }

    fn handle(
        &mut self,
        tag: u8,
        body: bytes::Bytes,
    ) -> Result<Option<ReplicationEvent>, ReplError> {
        match tag {
            b'd' => match ReplicationFrame::decode(body)? {
                ReplicationFrame::XLogData(x) => {
                    self.shared.note_received(x.wal_end);
                    let message = self.decoder.decode(x.data)?;
                    if let LogicalMessage::Begin(b) = &message {
                        let lag = PgTimestamp::now()
                            .unix_micros()
                            .saturating_sub(b.commit_time.unix_micros());
                        self.behind = lag > 200_000;
                    }
                    Ok(Some(ReplicationEvent::XLogData {
                        wal_start: x.wal_start,
                        wal_end: x.wal_end,
                        send_time: x.send_time,
                        message,
                    }))
                }
                ReplicationFrame::Keepalive(k) => {
                    self.shared.note_received(k.wal_end);
                    if k.reply_requested {
                        self.shared.reply_requested.notify_one();
                    }
                    Ok(Some(ReplicationEvent::Keepalive {
                        wal_end: k.wal_end,
                        reply_requested: k.reply_requested,
                    }))
                }
            },
            _ => match wire::decode(tag, body)? {
                Backend::Error(e) => Err(stream_error(&self.slot, e)),
                // PostgreSQL 18 decodes on past a missing publication with only a
                // warning ("skipped loading publication"): every row it would have sent
                // is then skipped, so it is the error PostgreSQL 17 and older raise.
                // Matched by its code and non-localized severity too, not only by its
                // (possibly translated) text.
                Backend::Notice(n)
                    if n.code == "42704"
                        && (n.severity == "WARNING"
                            || n.message.starts_with("skipped loading publication")) =>
                {
                    Err(ReplError::Server(Box::new(n)))
                }
                Backend::Notice(n) => {
                    tracing::info!(notice = %n, "server notice");
                    Ok(None)
                }
                Backend::CopyDone | Backend::CommandComplete | Backend::ParameterStatus { .. } => {
                    Ok(None)
                }
                Backend::ReadyForQuery => {
                    self.finished = true;
                    Ok(None)
                }
                other => Err(ReplError::Protocol(format!(
                    "unexpected message on the replication stream: {}",
                    other.describe()
                ))),
            },
        }
    }

    /// A cloneable handle through which the caller reports its durable position.
    pub fn flush_handle(&self) -> FlushHandle {
        FlushHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// A handle that resolves when the status writer fails (the connection is dead).
    /// Select on it even while not calling [`ReplicationStream::next`]: at back-pressure
    /// nothing reads the socket, and a failed write is the only sign of a dead server.
    pub fn failure(&self) -> StreamFailure {
        StreamFailure {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Tells the status writer whether the caller has stopped reading for a while
    /// (back-pressure); while paused it writes status updates every second, so a dead
    /// connection is found by a failing write (see [`ReplicationStream::failure`]).
    pub fn set_reading_paused(&self, paused: bool) {
        self.shared.set_paused(paused);
    }

    /// Standby status updates written so far in this stream.
    pub fn status_updates_sent(&self) -> u64 {
        self.shared.status_updates_sent()
    }

    /// The highest walEnd the server has sent (XLogData or keepalive).
    pub fn server_wal_end(&self) -> Lsn {
        self.shared.received()
    }

    /// Forces a status update and waits until it is written.
    pub async fn send_status_now(&self) -> Result<(), ReplError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::StatusNow(tx))
            .await
            .map_err(|_| self.writer_gone())?;
        rx.await
            .map_err(|_| self.writer_gone())?
            .map_err(ReplError::io("sending a status update"))
    }

    fn writer_gone(&self) -> ReplError {
        match self.shared.failure() {
            Some(source) => ReplError::Io {
                context: "sending a status update",
                source,
            },
            None => ReplError::Closed("sending a status update"),
        }
    }

    /// Ends replication cleanly: final status update, CopyDone, then drain the server's
    /// CopyDone/CommandComplete/ReadyForQuery (bounded by a timeout) and Terminate.
    /// Data that arrives meanwhile is discarded; it was never acknowledged.
    pub async fn stop(mut self) -> Result<(), ReplError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Stop(tx))
            .await
            .map_err(|_| self.writer_gone())?;
        let mut write = rx
            .await
            .map_err(|_| self.writer_gone())?
            .map_err(ReplError::io("sending CopyDone"))?;
        if let Some(handle) = self.writer.take() {
            let _ = handle.await;
        }
        let drain = async {
            while !self.finished {
                self.rbuf.reserve(64 * 1024);
                while let Some(split) = self.split_next()? {
                    match split {
                        Split::Whole(b'd', _) | Split::Head { .. } => {}
                        Split::Whole(tag, body) => {
                            self.handle(tag, body)?;
                        }
                    }
                }
                if self.finished {
                    break;
                }
                let n = self
                    .read
                    .read_buf(&mut self.rbuf)
                    .await
                    .map_err(ReplError::io("draining the replication stream"))?;
                if n == 0 {
                    return Err(ReplError::Closed("draining the replication stream"));
                }
            }
            Ok(())
        };
        tokio::time::timeout(STOP_TIMEOUT, drain)
            .await
            .map_err(|_| ReplError::Timeout("waiting for the server to end replication"))??;
        let mut buf = BytesMut::new();
        frontend::terminate(&mut buf);
        // Best effort: the session is over either way.
        let _ = write.write_all(&buf).await;
        let _ = write.shutdown().await;
        tracing::info!(slot = %self.slot, "replication stopped");
        Ok(())
    }
}

/// See [`ReplicationStream::failure`]. Cloneable, independent of the stream's borrow.
#[derive(Debug, Clone)]
pub struct StreamFailure {
    shared: Arc<Shared>,
}

impl StreamFailure {
    /// Resolves with the writer's error once it failed; pending forever otherwise.
    /// Cancel-safe.
    pub async fn wait(&self) -> ReplError {
        ReplError::Io {
            context: "sending a status update",
            source: self.shared.wait_failure().await,
        }
    }
}

impl Drop for ReplicationStream {
    fn drop(&mut self) {
        if let Some(handle) = self.writer.take() {
            handle.abort();
        }
    }
}
