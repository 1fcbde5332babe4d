//! pg_recvlogical's own commit→receive latency: its `-f -` output read from a pipe.
//!
//! pg_recvlogical writes each XLogData payload (one pgoutput message) followed by `\n`,
//! with no length in front. The payloads are binary and may hold `\n` themselves, so the
//! stream cannot be split on newlines: a message ends at the first `\n` before which the
//! bytes decode as one whole pgoutput message. That is unambiguous because the decoder is
//! strict (lengths checked, trailing bytes an error): a proper prefix of a message ends
//! in a truncation, never in a different complete message.

use std::io::Read;
use std::process::ChildStdout;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use pgoutput::{DecodeError, LogicalMessage, MessageDecoder};

/// A transaction as pg_recvlogical received it: commit time and arrival time (unix µs),
/// and how many row changes it carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub commit_us: i64,
    pub arrival_us: i64,
    pub changes: u64,
}

/// Splits pg_recvlogical's output into messages and reports each Commit.
#[derive(Debug, Default)]
pub struct StreamReader {
    buf: Vec<u8>,
    /// Where the `\n` search resumes: the bytes from 0 to here hold no message end.
    scan: usize,
    decoder: MessageDecoder,
    changes: u64,
    /// Messages that did not decode (skipped up to the next `\n`).
    pub errors: u64,
    pub last_error: Option<DecodeError>,
}

impl StreamReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the stream, read at `arrival_us`; calls `on_commit` for
    /// every transaction they complete.
    pub fn push(&mut self, data: &[u8], arrival_us: i64, mut on_commit: impl FnMut(Received)) {
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(off) = self.buf[self.scan..].iter().position(|b| *b == b'\n') {
            let end = self.scan + off;
            match self
                .decoder
                .decode(Bytes::copy_from_slice(&self.buf[start..end]))
            {
                Ok(msg) => {
                    self.message(&msg, arrival_us, &mut on_commit);
                    start = end + 1;
                }
                // The `\n` is inside the payload: the message goes on past it.
                Err(DecodeError::Truncated { .. } | DecodeError::UnterminatedString { .. }) => {}
                Err(e) => {
                    self.errors += 1;
                    self.last_error = Some(e);
                    start = end + 1;
                }
            }
            self.scan = end + 1;
        }
        self.buf.drain(..start);
        self.scan -= start;
    }

    /// Bytes of a message not yet complete (non-zero at the end of the stream means the
    /// stream was cut or not understood).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    fn message(
        &mut self,
        msg: &LogicalMessage,
        arrival_us: i64,
        on_commit: &mut impl FnMut(Received),
    ) {
        match msg {
            LogicalMessage::Begin(_) => self.changes = 0,
            LogicalMessage::Insert(_) | LogicalMessage::Update(_) | LogicalMessage::Delete(_) => {
                self.changes += 1;
            }
            LogicalMessage::Commit(c) => on_commit(Received {
                commit_us: c.commit_time.unix_micros(),
                arrival_us,
                changes: std::mem::take(&mut self.changes),
            }),
            _ => {}
        }
    }
}

fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A thread reading pg_recvlogical's stdout until it closes, stamping each read.
pub struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    handle: Option<JoinHandle<StreamReader>>,
}

/// Large reads so the reader drains the pipe in few syscalls and pg_recvlogical never
/// blocks on a full pipe.
const READ_BUF: usize = 1 << 20;

impl Receiver {
    pub fn start(mut out: ChildStdout) -> Receiver {
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&received);
        let handle = std::thread::spawn(move || {
            let mut reader = StreamReader::new();
            let mut chunk = vec![0u8; READ_BUF];
            let mut batch = Vec::new();
            loop {
                let n = match out.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let now = unix_us();
                reader.push(&chunk[..n], now, |r| batch.push(r));
                if !batch.is_empty() {
                    if let Ok(mut g) = sink.lock() {
                        g.append(&mut batch);
                    }
                }
            }
            reader
        });
        Receiver {
            received,
            handle: Some(handle),
        }
    }

    /// Latencies (µs), one per row change, of the transactions committed within
    /// [from_ms, to_ms) (unix ms), and how many changes that is.
    pub fn window(&self, from_ms: i64, to_ms: i64) -> Vec<i64> {
        self.received
            .lock()
            .map(|g| latencies(&g, from_ms, to_ms))
            .unwrap_or_default()
    }

    /// Waits for the stream to close (pg_recvlogical exited); the reader's final state.
    pub fn finish(mut self) -> Option<StreamReader> {
        self.handle.take().and_then(|h| h.join().ok())
    }
}

/// One latency (µs) per row change, so a transaction of ten rows weighs as much as ten
/// single-row ones, as in the consumer's per-record samples of outboxd.
pub fn latencies(received: &[Received], from_ms: i64, to_ms: i64) -> Vec<i64> {
    let (from, to) = (from_ms.saturating_mul(1000), to_ms.saturating_mul(1000));
    received
        .iter()
        .filter(|r| r.commit_us >= from && r.commit_us < to)
        .flat_map(|r| {
            std::iter::repeat_n(
                r.arrival_us - r.commit_us,
                usize::try_from(r.changes).unwrap_or(0),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgoutput::{
        Begin, Column, Commit, Insert, Lsn, PgTimestamp, Relation, ReplicaIdentity, TupleData,
        TupleValue,
    };

    fn stream(messages: &[LogicalMessage]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.extend_from_slice(&m.to_bytes());
            out.push(b'\n');
        }
        out
    }

    fn txn(commit_time: i64, rows: &[&[u8]]) -> Vec<LogicalMessage> {
        let mut v = vec![LogicalMessage::Begin(Begin {
            final_lsn: Lsn(100),
            commit_time: PgTimestamp(commit_time),
            xid: 7,
        })];
        for r in rows {
            v.push(LogicalMessage::Insert(Insert {
                rel_id: 16384,
                xid: None,
                new_tuple: TupleData {
                    columns: vec![
                        TupleValue::Binary(Bytes::copy_from_slice(r)),
                        TupleValue::Text(Bytes::from_static(b"line 1\nline 2\n")),
                    ],
                },
            }));
        }
        v.push(LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(100),
            end_lsn: Lsn(140),
            commit_time: PgTimestamp(commit_time),
        }));
        v
    }

    fn relation() -> LogicalMessage {
        LogicalMessage::Relation(Relation {
            xid: None,
            rel_id: 16384,
            namespace: "public".into(),
            name: "outbox\nwith a newline".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![Column::new("id", 20), Column::new("payload", 3802)],
        })
    }

    fn sample_stream() -> Vec<u8> {
        let mut msgs = vec![relation()];
        // Binary values full of newlines, and a commit time whose bytes hold 0x0a.
        msgs.extend(txn(0x0a0a_0a0a, &[b"\n\n\n\n\n\n\n\n", b"\n"]));
        msgs.extend(txn(2_000_000, &[b"x\ny"]));
        stream(&msgs)
    }

    fn read_all(chunks: &[&[u8]]) -> (Vec<Received>, StreamReader) {
        let mut r = StreamReader::new();
        let mut got = Vec::new();
        for (n, c) in chunks.iter().enumerate() {
            r.push(c, i64::try_from(n).unwrap_or(0), |x| got.push(x));
        }
        (got, r)
    }

    #[test]
    fn newlines_inside_payloads_do_not_split_messages() {
        let bytes = sample_stream();
        assert!(bytes.iter().filter(|b| **b == b'\n').count() > 8 + 6);
        let (got, r) = read_all(&[&bytes]);
        assert_eq!(r.errors, 0, "{:?}", r.last_error);
        assert_eq!(r.pending(), 0);
        let us = pgoutput::time::PG_EPOCH_OFFSET_MICROS;
        assert_eq!(
            got,
            vec![
                Received {
                    commit_us: 0x0a0a_0a0a + us,
                    arrival_us: 0,
                    changes: 2
                },
                Received {
                    commit_us: 2_000_000 + us,
                    arrival_us: 0,
                    changes: 1
                },
            ]
        );
    }

    #[test]
    fn any_chunking_gives_the_same_transactions() {
        let bytes = sample_stream();
        let (whole, _) = read_all(&[&bytes]);
        for size in [1usize, 2, 3, 7, 16, 33] {
            let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
            let (got, r) = read_all(&chunks);
            assert_eq!(r.errors, 0);
            assert_eq!(r.pending(), 0);
            let strip = |v: &[Received]| -> Vec<(i64, u64)> {
                v.iter().map(|x| (x.commit_us, x.changes)).collect()
            };
            assert_eq!(strip(&got), strip(&whole), "chunks of {size}");
        }
    }

    #[test]
    fn a_cut_stream_leaves_bytes_pending_and_garbage_is_counted() {
        let bytes = sample_stream();
        let (got, r) = read_all(&[&bytes[..bytes.len() - 5]]);
        assert_eq!(got.len(), 1);
        assert!(r.pending() > 0);
        let (got, r) = read_all(&[b"\xff\xff\n", &bytes]);
        assert_eq!(r.errors, 1);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn latencies_weigh_each_change_and_keep_the_window() {
        let rx = |commit_ms: i64, lat_us: i64, changes| Received {
            commit_us: commit_ms * 1000,
            arrival_us: commit_ms * 1000 + lat_us,
            changes,
        };
        let got = latencies(
            &[
                rx(999, 1, 5),
                rx(1000, 300, 2),
                rx(1500, 700, 1),
                rx(2000, 9, 4),
            ],
            1000,
            2000,
        );
        assert_eq!(got, vec![300, 300, 700]);
    }
}
