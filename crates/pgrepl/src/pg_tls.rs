//! The ordinary SQL connection (tokio-postgres) over the replication connection's own
//! transport ([`crate::socket::open`]): the same SSLRequest negotiation, TLS
//! configuration, SNI and keepalives. tokio-postgres then runs the startup and SCRAM over
//! the already-negotiated stream (its "direct" negotiation, so it sends no second
//! SSLRequest), binding to the same certificate hash.
//!
//! tokio-postgres knows `channel_binding` but not `require_auth`, and answers a cleartext
//! request with the password at once; [`AuthGuard`] reads the server's first
//! authentication request before tokio-postgres sees it and fails the stream when
//! [`crate::auth::judge_first`] refuses it, so no password leaves.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

use crate::auth::{judge_first, FirstRequest};
use crate::config::ConnectConfig;
use crate::error::ReplError;
use crate::socket::BoxStream;
use crate::wire::{self, AuthRequest, Backend};

/// Longest authentication request the guard buffers; a SASL mechanism list is tens of
/// bytes, so anything near this is not a PostgreSQL server.
const MAX_AUTH_REQUEST: usize = 64 * 1024;

/// Where the guard is in the server's first messages.
enum Scan {
    /// Reading a message header (tag and length).
    Header { buf: [u8; 5], have: usize },
    /// Collecting an authentication request's body.
    Auth { body: Vec<u8>, need: usize },
    /// Passing over the rest of another message (a notice, NegotiateProtocolVersion).
    Skip { remaining: usize },
    /// The first authentication request was judged: everything passes.
    Done,
}

/// The server-to-client side of the SQL connection until its first authentication
/// request has been judged; transparent afterwards.
pub(crate) struct AuthGuard {
    inner: BoxStream,
    cfg: ConnectConfig,
    bindable: bool,
    scan: Scan,
    /// The refusal, for [`ConnectConfig::connect_sql`]: tokio-postgres only keeps the
    /// I/O error's text.
    refused: Arc<Mutex<Option<ReplError>>>,
}

impl AuthGuard {
    pub(crate) fn new(
        inner: BoxStream,
        cfg: &ConnectConfig,
        bindable: bool,
        refused: Arc<Mutex<Option<ReplError>>>,
    ) -> Self {
        AuthGuard {
            inner,
            cfg: cfg.clone(),
            bindable,
            scan: Scan::Header {
                buf: [0; 5],
                have: 0,
            },
            refused,
        }
    }

    /// Feeds bytes the server sent; an error ends the connection before tokio-postgres
    /// acts on the request.
    fn scan(&mut self, mut input: &[u8]) -> Result<(), ReplError> {
        while !input.is_empty() {
            match &mut self.scan {
                Scan::Done => return Ok(()),
                Scan::Header { buf, have } => {
                    let take = (buf.len() - *have).min(input.len());
                    buf[*have..*have + take].copy_from_slice(&input[..take]);
                    *have += take;
                    input = &input[take..];
                    if *have < buf.len() {
                        continue;
                    }
                    let tag = buf[0];
                    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
                    let body_len = usize::try_from(len)
                        .ok()
                        .and_then(|l| l.checked_sub(4))
                        .ok_or_else(|| {
                            ReplError::Protocol(format!("invalid message length {len}"))
                        })?;
                    self.scan = match tag {
                        b'R' if body_len > MAX_AUTH_REQUEST => {
                            return Err(ReplError::Protocol(format!(
                                "authentication request of {body_len} bytes"
                            )))
                        }
                        b'R' => Scan::Auth {
                            body: Vec::with_capacity(body_len),
                            need: body_len,
                        },
                        // An error ends the startup; tokio-postgres reports it.
                        b'E' => Scan::Done,
                        _ => Scan::Skip {
                            remaining: body_len,
                        },
                    };
                    if let Scan::Auth { need: 0, .. } = self.scan {
                        self.judge(Vec::new())?;
                    }
                }
                Scan::Skip { remaining } => {
                    let take = (*remaining).min(input.len());
                    *remaining -= take;
                    input = &input[take..];
                    if *remaining == 0 {
                        self.scan = Scan::Header {
                            buf: [0; 5],
                            have: 0,
                        };
                    }
                }
                Scan::Auth { body, need } => {
                    let take = (*need - body.len()).min(input.len());
                    body.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if body.len() == *need {
                        let body = std::mem::take(body);
                        self.judge(body)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn judge(&mut self, body: Vec<u8>) -> Result<(), ReplError> {
        self.scan = Scan::Done;
        let Backend::Auth(request) = wire::decode(b'R', Bytes::from(body))? else {
            return Ok(());
        };
        let first = match &request {
            AuthRequest::Ok => FirstRequest::Ok,
            AuthRequest::Cleartext => FirstRequest::Cleartext,
            AuthRequest::Md5 { .. } => FirstRequest::Md5,
            AuthRequest::Sasl { mechanisms } => FirstRequest::Sasl(mechanisms),
            // tokio-postgres refuses these itself.
            AuthRequest::SaslContinue(_) | AuthRequest::SaslFinal(_) => FirstRequest::Other,
            AuthRequest::Other(_) => FirstRequest::Other,
        };
        judge_first(&self.cfg, &first, self.bindable)
    }
}

impl AsyncRead for AuthGuard {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if matches!(this.scan, Scan::Done) {
            return Poll::Ready(Ok(()));
        }
        match this.scan(&buf.filled()[before..]) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) => {
                let text = e.to_string();
                if let Ok(mut slot) = this.refused.lock() {
                    *slot = Some(e);
                }
                Poll::Ready(Err(io::Error::new(io::ErrorKind::PermissionDenied, text)))
            }
        }
    }
}

impl AsyncWrite for AuthGuard {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A `TlsConnect` for a stream whose TLS (if any) is already up: it only reports the
/// channel-binding hash to tokio-postgres.
pub(crate) struct Negotiated {
    pub(crate) cert_hash: Option<Vec<u8>>,
}

impl TlsConnect<AuthGuard> for Negotiated {
    type Stream = NegotiatedStream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<NegotiatedStream>> + Send>>;

    fn connect(self, stream: AuthGuard) -> Self::Future {
        Box::pin(async move {
            Ok(NegotiatedStream {
                inner: stream,
                cert_hash: self.cert_hash,
            })
        })
    }
}

pub(crate) struct NegotiatedStream {
    inner: AuthGuard,
    cert_hash: Option<Vec<u8>>,
}

impl AsyncRead for NegotiatedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for NegotiatedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl TlsStream for NegotiatedStream {
    fn channel_binding(&self) -> ChannelBinding {
        match &self.cert_hash {
            Some(hash) => ChannelBinding::tls_server_end_point(hash.clone()),
            None => ChannelBinding::none(),
        }
    }
}
