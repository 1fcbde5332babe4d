//! A deliberately tiny HTTP/1.1 endpoint for scrapers and orchestrators: one request per
//! connection, only the request head is read (bounded in size and time), then
//! `Connection: close`. Nothing here can hold the relay up.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::relays::Telemetry;
use super::render::PROMETHEUS_CONTENT_TYPE;

const MAX_HEAD_BYTES: usize = 8 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown waits for responses already being written.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const TEXT: &str = "text/plain; charset=utf-8";

/// Serves `/metrics`, `/healthz` and `/readyz` until `shutdown` completes.
pub async fn serve_http(
    listener: TcpListener,
    telemetry: Arc<Telemetry>,
    stall_after: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // Shutdown first, so a flood of connections cannot delay it.
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(handle(stream, Arc::clone(&telemetry), stall_after));
                }
                Err(error) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!(%error, "metrics endpoint accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
        while connections.try_join_next().is_some() {}
    }
    let drain = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
}

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    head_only: bool,
}

impl Response {
    fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: body.into(),
            head_only: false,
        }
    }
}

enum HeadError {
    TooLarge,
    /// Closed, reset or unreadable: nobody to answer.
    Gone,
}

async fn handle(mut stream: TcpStream, telemetry: Arc<Telemetry>, stall: Duration) {
    let response = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Ok(head)) => respond(&head, &telemetry, stall),
        Ok(Err(HeadError::TooLarge)) => Response::text(
            "431 Request Header Fields Too Large",
            "request head too large",
        ),
        Ok(Err(HeadError::Gone)) => return,
        Err(_) => Response::text("408 Request Timeout", "request head not received in time"),
    };
    let bytes = encode(&response);
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    if let Ok(Err(error)) = tokio::time::timeout(WRITE_TIMEOUT, write).await {
        tracing::debug!(%error, "metrics endpoint write failed");
    }
}

/// Reads until the blank line ending the head; the body, if any, is never read.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|_| HeadError::Gone)?;
        let data = chunk.get(..n).ok_or(HeadError::Gone)?;
        if data.is_empty() {
            return Err(HeadError::Gone);
        }
        head.extend_from_slice(data);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() >= MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Length of the head including its terminating blank line, once complete. Bare `\n`
/// line endings are accepted, as RFC 9112 allows.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Method and path (query stripped) of the request line.
fn request_target(head: &[u8]) -> Option<(&str, &str)> {
    let line_end = head.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(head.get(..line_end)?)
        .ok()?
        .trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Some((method, path))
}

fn respond(head: &[u8], telemetry: &Telemetry, stall: Duration) -> Response {
    let Some((method, path)) = request_target(head) else {
        return Response::text("400 Bad Request", "malformed request line");
    };
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Response::text("405 Method Not Allowed", "only GET and HEAD"),
    };
    let mut response = match path {
        "/metrics" => Response {
            status: "200 OK",
            content_type: PROMETHEUS_CONTENT_TYPE,
            body: telemetry.render_prometheus(),
            head_only: false,
        },
        "/healthz" => match telemetry.liveness() {
            Ok(()) => Response::text("200 OK", "ok"),
            Err(reason) => Response::text("503 Service Unavailable", reason),
        },
        "/readyz" => match telemetry.readiness(Instant::now(), stall) {
            Ok(()) => Response::text("200 OK", "ready"),
            Err(reason) => Response::text("503 Service Unavailable", reason),
        },
        _ => Response::text("404 Not Found", "not found"),
    };
    response.head_only = head_only;
    response
}

fn encode(r: &Response) -> Vec<u8> {
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    let mut bytes = head.into_bytes();
    if !r.head_only {
        bytes.extend_from_slice(r.body.as_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests;
