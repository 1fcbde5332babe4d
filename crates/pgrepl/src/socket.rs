//! Transport setup: TCP or Unix socket, then the SSLRequest negotiation and TLS handshake.

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;

use crate::config::{ConnectConfig, SslMode};
use crate::error::ReplError;
use crate::tls::{client_config, handshake_error, server_end_point_hash, server_name};

pub(crate) trait AsyncStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncStream for T {}

pub(crate) type BoxStream = Box<dyn AsyncStream>;

/// An open transport, encrypted or not.
pub(crate) struct Transport {
    pub stream: BoxStream,
    /// `tls-server-end-point` hash; `Some` only over TLS, with a certificate whose
    /// signature algorithm defines one.
    pub cert_hash: Option<Vec<u8>>,
    /// TLS is in use.
    pub encrypted: bool,
}

/// Dead-peer detection on every TCP connection to the server (replication and SQL).
/// A walsender that is gone (terminated without a FIN reaching us, a network partition,
/// a crashed host) must be noticed in well under `wal_sender_timeout` (60 s by default),
/// or a standby instance may take over the slot while this one still thinks it streams.
/// Without these, Linux retries unacknowledged data for ~15 minutes.
pub(crate) mod tcp {
    use std::time::Duration;

    /// Data written (status updates, queries) unacknowledged this long kills the
    /// connection (`TCP_USER_TIMEOUT`).
    pub const USER_TIMEOUT: Duration = Duration::from_secs(20);
    /// Keepalive probes after this much silence...
    pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
    /// ...every this often...
    pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
    /// ...and this many unanswered probes kill it (10 + 3 × 5 = 25 s on an idle link).
    pub const KEEPALIVE_RETRIES: u32 = 3;
}

/// Keepalive and user timeout ([`tcp`]) on a connected socket.
fn set_dead_peer_detection(tcp: &TcpStream) -> std::io::Result<()> {
    let sock = SockRef::from(tcp);
    let keepalive = TcpKeepalive::new()
        .with_time(tcp::KEEPALIVE_IDLE)
        .with_interval(tcp::KEEPALIVE_INTERVAL);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "macos"
    ))]
    let keepalive = keepalive.with_retries(tcp::KEEPALIVE_RETRIES);
    sock.set_tcp_keepalive(&keepalive)?;
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    sock.set_tcp_user_timeout(Some(tcp::USER_TIMEOUT))?;
    Ok(())
}

/// `SSLRequest`: Int32 length 8, Int32 magic 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

pub(crate) async fn open(cfg: &ConnectConfig) -> Result<Transport, ReplError> {
    if cfg.is_unix_socket() {
        // libpq does not run TLS over Unix sockets either: the kernel is the transport.
        let path = format!("{}/.s.PGSQL.{}", cfg.host.trim_end_matches('/'), cfg.port);
        let stream = UnixStream::connect(&path)
            .await
            .map_err(ReplError::io("connecting to the Unix socket"))?;
        return Ok(Transport {
            stream: Box::new(stream),
            cert_hash: None,
            encrypted: false,
        });
    }
    let mut tcp = TcpStream::connect((cfg.host.as_str(), cfg.port))
        .await
        .map_err(ReplError::io("connecting over TCP"))?;
    tcp.set_nodelay(true)
        .map_err(ReplError::io("setting TCP_NODELAY"))?;
    set_dead_peer_detection(&tcp)
        .map_err(ReplError::io("setting TCP keepalive and user timeout"))?;
    if cfg.ssl_mode == SslMode::Disable {
        return Ok(Transport {
            stream: Box::new(tcp),
            cert_hash: None,
            encrypted: false,
        });
    }
    // Build the TLS config first so a bad root file is reported before any network talk.
    let tls_config = client_config(cfg)?;
    let name = server_name(&cfg.host)?;
    tcp.write_all(&SSL_REQUEST)
        .await
        .map_err(ReplError::io("sending SSLRequest"))?;
    // Exactly one byte: anything buffered beyond it would be unauthenticated (CVE-2021-23222).
    let answer = tcp
        .read_u8()
        .await
        .map_err(ReplError::io("reading the SSLRequest answer"))?;
    match answer {
        b'S' => {
            let tls = TlsConnector::from(tls_config)
                .connect(name, tcp)
                .await
                .map_err(handshake_error)?;
            // Channel binding needs the hash; without a certificate, or with one whose
            // signature algorithm defines none, no binding is offered.
            let cert_hash = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|cert| server_end_point_hash(cert));
            Ok(Transport {
                stream: Box::new(tls),
                cert_hash,
                encrypted: true,
            })
        }
        b'N' if cfg.ssl_mode == SslMode::Prefer => Ok(Transport {
            stream: Box::new(tcp),
            cert_hash: None,
            encrypted: false,
        }),
        b'N' => Err(ReplError::Tls(format!(
            "server does not support TLS, but sslmode={}",
            cfg.ssl_mode
        ))),
        other => Err(ReplError::Protocol(format!(
            "unexpected answer {other:#04x} to SSLRequest"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_connections_detect_dead_peers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        set_dead_peer_detection(&tcp).unwrap();
        let sock = SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), tcp::KEEPALIVE_IDLE);
        #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
        {
            assert_eq!(
                sock.tcp_keepalive_interval().unwrap(),
                tcp::KEEPALIVE_INTERVAL
            );
            assert_eq!(
                sock.tcp_keepalive_retries().unwrap(),
                tcp::KEEPALIVE_RETRIES
            );
            assert_eq!(sock.tcp_user_timeout().unwrap(), Some(tcp::USER_TIMEOUT));
        }
        // Found well before wal_sender_timeout's default of 60 s, idle or not.
        let idle = tcp::KEEPALIVE_IDLE + tcp::KEEPALIVE_INTERVAL * tcp::KEEPALIVE_RETRIES;
        assert!(idle < std::time::Duration::from_secs(30));
        assert!(tcp::USER_TIMEOUT < std::time::Duration::from_secs(30));
    }
}
