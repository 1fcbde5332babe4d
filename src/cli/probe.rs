//! `outboxd probe`: one HTTP request to a running relay's /readyz (or /healthz), for
//! container health checks in an image without curl. Blocking std networking: a single
//! request needs no runtime, and every step is bounded by the timeout.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{say, EXIT_CONFIG, EXIT_NOT_READY, EXIT_OK, EXIT_UNREACHABLE};
use crate::config::HTTP_ADDR_DEFAULT;

/// An answer larger than this is not one of the relay's: /readyz says a line or two.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The relay's HTTP address, as it binds it
    #[arg(long, env = "OUTBOXD_HTTP_ADDR", default_value = HTTP_ADDR_DEFAULT, value_name = "HOST:PORT")]
    addr: String,
    /// What to ask: /readyz (ready to relay, or a ready standby) or /healthz (alive)
    #[arg(long, default_value = "/readyz", value_parser = ["/readyz", "/healthz"])]
    path: String,
    /// Give up after this long (connecting, writing and reading together)
    #[arg(long, default_value_t = 3000, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
}

pub fn probe(args: &ProbeArgs) -> i32 {
    let addr = args.addr.trim();
    if addr.is_empty() {
        eprintln!(
            "outboxd probe: OUTBOXD_HTTP_ADDR is empty, so the relay serves no HTTP endpoint to probe; \
             set it to the address the relay binds (e.g. 0.0.0.0:9187), or pass --addr"
        );
        return EXIT_CONFIG;
    }
    let targets = match addr.to_socket_addrs() {
        Ok(targets) => targets.map(asked_at).collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            eprintln!("outboxd probe: --addr / OUTBOXD_HTTP_ADDR={addr:?} is invalid ({e}): use host:port, e.g. 127.0.0.1:9187");
            return EXIT_CONFIG;
        }
        Err(e) => {
            eprintln!("outboxd probe: cannot resolve {addr:?}: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let deadline = Instant::now() + Duration::from_millis(args.timeout_ms);
    let mut failures = Vec::new();
    for target in targets {
        match ask(target, addr, &args.path, deadline) {
            Ok((200, body)) => {
                say!("{} {}: 200 {}", target, args.path, body.trim());
                return EXIT_OK;
            }
            Ok((status, body)) => {
                eprintln!(
                    "outboxd probe: {target} {} answered {status}: {}",
                    args.path,
                    body.trim()
                );
                return EXIT_NOT_READY;
            }
            Err(e) => failures.push(format!("{target}: {e}")),
        }
    }
    eprintln!(
        "outboxd probe: cannot reach the relay at {addr} ({}); is `outboxd run` running with this OUTBOXD_HTTP_ADDR?",
        failures.join("; ")
    );
    EXIT_UNREACHABLE
}

/// A relay bound to the unspecified address (`0.0.0.0`, `[::]`) is reached on loopback.
fn asked_at(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), bound.port())
        }
        _ => bound,
    }
}

fn remaining(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        ))
    } else {
        Ok(left)
    }
}

/// The status code and body of `GET path`.
fn ask(
    target: SocketAddr,
    host: &str,
    path: &str,
    deadline: Instant,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&target, remaining(deadline)?)?;
    stream.set_write_timeout(Some(remaining(deadline)?))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: outboxd-probe\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    let mut limited = (&stream).take(MAX_ANSWER_BYTES);
    let mut chunk = [0u8; 4096];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match limited.read(&mut chunk)? {
            0 => break,
            n => answer.extend_from_slice(chunk.get(..n).unwrap_or_default()),
        }
    }
    parse_answer(&answer).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the answer is not HTTP: is this the relay's address?",
        )
    })
}

/// `HTTP/1.x <code> ...`, then the body after the blank line.
fn parse_answer(answer: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut status_line = head.lines().next()?.split(' ');
    if !status_line.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = status_line.next()?.parse().ok()?;
    Some((code, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_and_body() {
        assert_eq!(
            parse_answer(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nnot ready"),
            Some((503, "not ready".into()))
        );
        assert_eq!(
            parse_answer(b"HTTP/1.1 200 OK\r\n\r\n"),
            Some((200, String::new()))
        );
        assert_eq!(parse_answer(b"SSH-2.0-OpenSSH_9.2\r\n"), None);
        assert_eq!(parse_answer(b""), None);
    }

    #[test]
    fn an_unspecified_bind_address_is_asked_on_loopback() {
        let asked = |s: &str| asked_at(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")));
        assert_eq!(asked("0.0.0.0:9187").to_string(), "127.0.0.1:9187");
        assert_eq!(asked("[::]:9187").to_string(), "[::1]:9187");
        assert_eq!(asked("10.1.2.3:80").to_string(), "10.1.2.3:80");
    }
}
