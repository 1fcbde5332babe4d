//! Logs go to stderr as text or JSON; librdkafka's logs arrive through `tracing` too.
//!
//! `outboxd run` hands its lines to a thread of their own. The relay's one thread also
//! writes the walsender's status updates, and a write to a stderr nobody reads (a full
//! pipe behind a log shipper that fell behind, a file on a disk stalled by another
//! process's fsyncs) would block it: no status update, and the server ends the
//! replication connection after `wal_sender_timeout`. Lines that do not fit in
//! [`QUEUE_BYTES`] are dropped, counted, and the count is logged once the queue drains.
//! The one-shot commands write directly, in order with what they print.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, Settings};

/// The most the queued lines may hold, each counted with [`LINE_COST`] for the channel's
/// and the allocator's share: a stalled reader costs about this much memory at most.
const QUEUE_BYTES: usize = 8 << 20;
const LINE_COST: usize = 64;

/// How long an exit waits for the queued lines to be written (a stderr that is never
/// read again must not hold the exit).
pub const EXIT_FLUSH: Duration = Duration::from_secs(5);

/// Whether log writes may block the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Directly, in order with the command's own output.
    Direct,
    /// Through the writer thread: the caller never waits for stderr.
    Queued,
}

pub fn init(settings: &Settings, writes: Writes) {
    let filter =
        EnvFilter::try_new(&settings.log_filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Lines(writes == Writes::Queued && start_writer()))
        .with_target(true)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match settings.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Waits up to `limit` for the lines queued so far to reach stderr.
pub fn flush(limit: Duration) {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let (done, written) = mpsc::sync_channel(1);
    if queue.tx.send(Message::Flush(done)).is_ok() {
        let _ = written.recv_timeout(limit);
    }
}

enum Message {
    Line(Vec<u8>),
    Flush(mpsc::SyncSender<()>),
}

struct Queue {
    tx: mpsc::Sender<Message>,
    /// Bytes sent and not yet written.
    queued: AtomicUsize,
    /// Lines dropped since the last report.
    dropped: AtomicU64,
}

static QUEUE: OnceLock<Queue> = OnceLock::new();

impl Queue {
    /// `keep`: queued even over [`QUEUE_BYTES`] (errors: rare, and the one that stops the
    /// relay carries its remedy).
    fn push(&self, line: Vec<u8>, keep: bool) {
        let cost = line.len() + LINE_COST;
        if self.queued.fetch_add(cost, Ordering::AcqRel) + cost > QUEUE_BYTES && !keep {
            self.queued.fetch_sub(cost, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Err(mpsc::SendError(Message::Line(line))) = self.tx.send(Message::Line(line)) {
            // The writer thread is gone: directly, rather than not at all.
            self.queued.fetch_sub(cost, Ordering::AcqRel);
            let _ = std::io::stderr().write_all(&line);
        }
    }
}

/// Starts the writer thread; false if it cannot be started (then writes are direct).
fn start_writer() -> bool {
    let (tx, rx) = mpsc::channel();
    let queue = Queue {
        tx,
        queued: AtomicUsize::new(0),
        dropped: AtomicU64::new(0),
    };
    if QUEUE.set(queue).is_err() {
        return true;
    }
    let started = std::thread::Builder::new()
        .name("outboxd-log".into())
        .spawn(move || write_lines(&rx))
        .is_ok();
    if started {
        // What was logged before a panic comes before its message.
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            flush(Duration::from_secs(1));
            report(info);
        }));
    }
    started
}

fn write_lines(rx: &mpsc::Receiver<Message>) {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let mut stderr = std::io::stderr();
    for message in rx {
        match message {
            Message::Line(line) => {
                let _ = stderr.write_all(&line);
                let cost = line.len() + LINE_COST;
                let left = queue
                    .queued
                    .fetch_sub(cost, Ordering::AcqRel)
                    .saturating_sub(cost);
                // Said once the reader keeps up again, through the same format.
                if left < QUEUE_BYTES / 2 {
                    report_dropped(queue);
                }
            }
            Message::Flush(done) => {
                // An exit: the count goes out first, behind what is queued.
                if report_dropped(queue) {
                    let _ = queue.tx.send(Message::Flush(done));
                } else {
                    let _ = done.send(());
                }
            }
        }
    }
}

/// Logs how many lines were dropped since the last report; true if there were any.
fn report_dropped(queue: &Queue) -> bool {
    let dropped = queue.dropped.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        tracing::warn!(
            dropped,
            "{dropped} log lines were dropped: stderr was not read fast enough (the relay does not wait for its log reader)"
        );
    }
    dropped > 0
}

/// The subscriber's writer: one line per event, queued when `.0`.
struct Lines(bool);

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::new(),
            queued: self.0,
            keep: false,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line {
            buf: Vec::new(),
            queued: self.0,
            keep: *meta.level() == tracing::Level::ERROR,
        }
    }
}

/// An event's text, written or queued whole when the formatter is done with it.
struct Line {
    buf: Vec<u8>,
    queued: bool,
    /// Queued even when the queue is full (see [`Queue::push`]).
    keep: bool,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.buf);
        match QUEUE.get().filter(|_| self.queued) {
            Some(queue) => queue.push(line, self.keep),
            None => {
                let _ = std::io::stderr().write_all(&line);
            }
        }
    }
}
