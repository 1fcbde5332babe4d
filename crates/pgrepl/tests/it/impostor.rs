//! Fake servers on loopback that do not know the password: an AuthenticationOk in the
//! middle of SCRAM, a cleartext request (first, or partway through SCRAM), trust where
//! SCRAM was required. Each case runs the replication connection and the SQL connection,
//! and where the installed psql (libpq 15) can express the same settings, psql too, and
//! compares the outcome: refused, or accepted (the fake then sees a query). What the
//! fake received (a password?) is asserted as well.

use std::sync::Arc;

use pgrepl::{
    ChannelBinding, ConnectConfig, ErrorClass, Password, ReplError, ReplicationConnection, SslMode,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the fake does once the client's startup message is in.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// Offers SCRAM-SHA-256(-PLUS), reads the client-first message, says AuthenticationOk.
    OkAfterSaslInitial,
    /// Offers SCRAM, answers the client-first with a made-up server-first, then says
    /// AuthenticationOk without SASLFinal.
    OkAfterSaslContinue,
    /// Offers SCRAM, reads the client-first message, then asks for a cleartext password.
    CleartextAfterSasl,
    /// Asks for a cleartext password.
    Cleartext,
    /// AuthenticationOk at once (trust).
    Trust,
}

/// What the fake saw of the client.
#[derive(Debug, Default)]
struct Seen {
    /// A PasswordMessage that was not a SASL message: a password given away.
    password: Option<Vec<u8>>,
    /// The client went on past authentication (sent a query or a replication command).
    accepted: bool,
}

async fn read_msg<S: AsyncRead + Unpin>(s: &mut S) -> Option<(u8, Vec<u8>)> {
    let tag = s.read_u8().await.ok()?;
    let len = s.read_u32().await.ok()?;
    let mut body = vec![0; usize::try_from(len).ok()?.checked_sub(4)?];
    s.read_exact(&mut body).await.ok()?;
    Some((tag, body))
}

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&u32::try_from(body.len() + 4).unwrap().to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn auth(code: u32, extra: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(extra);
    msg(b'R', &body)
}

fn ready_sequence() -> Vec<u8> {
    let mut out = auth(0, b"");
    for (k, v) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("DateStyle", "ISO, MDY"),
    ] {
        out.extend(msg(b'S', format!("{k}\0{v}\0").as_bytes()));
    }
    out.extend(msg(b'K', &[0, 0, 0, 1, 0, 0, 0, 2]));
    out.extend(msg(b'Z', b"I"));
    out
}

async fn script<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, script: Script, tls: bool) -> Seen {
    let mut seen = Seen::default();
    let mechanisms: &[u8] = if tls {
        b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"
    } else {
        b"SCRAM-SHA-256\0\0"
    };
    let mut out = Vec::new();
    match script {
        Script::Trust => {}
        Script::Cleartext => {
            s.write_all(&auth(3, b"")).await.ok();
            match read_msg(s).await {
                Some((b'p', body)) => seen.password = Some(body),
                _ => return seen,
            }
        }
        Script::OkAfterSaslInitial | Script::OkAfterSaslContinue | Script::CleartextAfterSasl => {
            s.write_all(&auth(10, mechanisms)).await.ok();
            let Some((b'p', first)) = read_msg(s).await else {
                return seen;
            };
            match script {
                Script::OkAfterSaslContinue => {
                    // The client nonce is after "r=" in the client-first message.
                    let text = String::from_utf8_lossy(&first).into_owned();
                    let nonce = text
                        .split("r=")
                        .nth(1)
                        .and_then(|r| r.split([',', '\0']).next())
                        .unwrap_or_default()
                        .to_owned();
                    let server_first = format!("r={nonce}impostor,s=c2FsdHNhbHQ=,i=4096");
                    s.write_all(&auth(11, server_first.as_bytes())).await.ok();
                    if read_msg(s).await.is_none() {
                        return seen;
                    }
                }
                Script::CleartextAfterSasl => {
                    s.write_all(&auth(3, b"")).await.ok();
                    match read_msg(s).await {
                        Some((b'p', body)) => seen.password = Some(body),
                        _ => return seen,
                    }
                }
                _ => {}
            }
        }
    }
    out.extend(ready_sequence());
    if s.write_all(&out).await.is_err() {
        return seen;
    }
    if let Some((b'Q', _)) = read_msg(s).await {
        seen.accepted = true;
        let mut err = msg(
            b'E',
            b"SERROR\0VERROR\0C42000\0Mimpostor accepted the connection\0\0",
        );
        err.extend(msg(b'Z', b"I"));
        s.write_all(&err).await.ok();
        // The client hangs up (psql) or waits (a stream); either ends this connection.
        let _ = read_msg(s).await;
    }
    seen
}

fn server_tls() -> Arc<rustls::ServerConfig> {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap(),
    )
}

/// One fake server for one connection; its task returns what it saw.
async fn fake(s: Script, tls: bool) -> (u16, tokio::task::JoinHandle<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tls.then(|| tokio_rustls::TlsAcceptor::from(server_tls()));
    let task = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        // SSLRequest / GSSENCRequest until the startup message.
        loop {
            let len = tcp.read_u32().await.unwrap();
            let code = tcp.read_u32().await.unwrap();
            let mut rest = vec![0; usize::try_from(len).unwrap() - 8];
            tcp.read_exact(&mut rest).await.unwrap();
            match (code, &acceptor) {
                (80_877_103, Some(acceptor)) => {
                    tcp.write_all(b"S").await.unwrap();
                    let mut tls = acceptor.accept(tcp).await.unwrap();
                    let (_, _) = read_startup(&mut tls).await;
                    return script(&mut tls, s, true).await;
                }
                (80_877_103 | 80_877_104, _) => tcp.write_all(b"N").await.unwrap(),
                _ => return script(&mut tcp, s, false).await,
            }
        }
    });
    (port, task)
}

async fn read_startup<S: AsyncRead + Unpin>(s: &mut S) -> (u32, Vec<u8>) {
    let len = s.read_u32().await.unwrap();
    let mut rest = vec![0; usize::try_from(len).unwrap() - 4];
    s.read_exact(&mut rest).await.unwrap();
    (len, rest)
}

fn client(port: u16, tls: bool) -> ConnectConfig {
    let mut cfg = ConnectConfig::new("127.0.0.1", port, "victim", "shop");
    cfg.password = Some(Password::from("the-real-secret"));
    cfg.ssl_mode = if tls {
        SslMode::Require
    } else {
        SslMode::Disable
    };
    cfg
}

/// A refusal says why, and is permanent: retrying would meet the same impostor.
fn refused_as_impostor(e: &ReplError) -> bool {
    assert!(matches!(e.root(), ReplError::AuthRefused { .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
    false
}

/// Refused or accepted, by the replication connection (which then sends
/// IDENTIFY_SYSTEM, seen by the fake as a query).
async fn replication(s: Script, cfg: &ConnectConfig) -> (bool, Seen) {
    let (port, task) = fake(s, cfg.ssl_mode != SslMode::Disable).await;
    let mut cfg = cfg.clone();
    cfg.port = port;
    let accepted = match ReplicationConnection::connect(&cfg).await {
        Ok(mut conn) => {
            let _ = conn.identify_system().await;
            true
        }
        Err(e) => refused_as_impostor(&e),
    };
    (accepted, task.await.unwrap())
}

async fn sql(s: Script, cfg: &ConnectConfig) -> (bool, Seen) {
    let (port, task) = fake(s, cfg.ssl_mode != SslMode::Disable).await;
    let mut cfg = cfg.clone();
    cfg.port = port;
    let accepted = match cfg.connect_sql().await {
        Ok(client) => {
            let _ = client.simple_query("SELECT 1").await;
            drop(client);
            true
        }
        Err(e) => refused_as_impostor(&e),
    };
    (accepted, task.await.unwrap())
}

/// psql (libpq 15) against the same fake: accepted when it got as far as its query.
async fn psql(s: Script, tls: bool, env: &[(&str, &str)]) -> (bool, Seen) {
    let (port, task) = fake(s, tls).await;
    let conninfo = format!(
        "host=127.0.0.1 port={port} user=victim dbname=shop sslmode={} gssencmode=disable sslrootcert=/nonexistent/root.crt",
        if tls { "require" } else { "disable" }
    );
    let out = tokio::process::Command::new("psql")
        .args(["-X", "-w", "-c", "SELECT 1", &conninfo])
        .env("PGPASSWORD", "the-real-secret")
        .envs(env.iter().copied())
        .env_remove("PGSERVICE")
        .output()
        .await
        .expect("psql (postgresql-client) must be installed");
    let seen = task.await.unwrap();
    // psql: 2 when the connection failed, 1 when the connection worked and the query failed.
    let code = out.status.code();
    assert!(
        code == Some(1) || code == Some(2),
        "psql {s:?}: {code:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code == Some(1), seen)
}

#[tokio::test]
async fn early_authentication_ok_in_scram_is_refused_on_both_connections() {
    for s in [Script::OkAfterSaslInitial, Script::OkAfterSaslContinue] {
        for tls in [true, false] {
            let cfg = client(0, tls);
            let (accepted, seen) = replication(s, &cfg).await;
            assert!(!accepted && !seen.accepted, "replication, {s:?} tls={tls}");
            let (accepted, seen) = sql(s, &cfg).await;
            assert!(!accepted && !seen.accepted, "SQL, {s:?} tls={tls}");
        }
    }
    // libpq 15 with the default channel_binding=prefer takes it (libpq 16+ refuses it only
    // under require_auth=scram-sha-256); outboxd is stricter there.
    let (libpq, seen) = psql(Script::OkAfterSaslInitial, true, &[]).await;
    assert!(libpq && seen.accepted);
    // libpq 15 refuses it under channel_binding=require, as outboxd does with any setting.
    let mut cfg = client(0, true);
    cfg.channel_binding = ChannelBinding::Require;
    let (accepted, _) = replication(Script::OkAfterSaslInitial, &cfg).await;
    let (libpq, _) = psql(
        Script::OkAfterSaslInitial,
        true,
        &[("PGCHANNELBINDING", "require")],
    )
    .await;
    assert!(!accepted && !libpq, "outboxd {accepted}, libpq {libpq}");
}

#[tokio::test]
async fn a_switch_to_cleartext_partway_through_scram_gets_no_password() {
    for tls in [true, false] {
        let cfg = client(0, tls);
        let (accepted, seen) = replication(Script::CleartextAfterSasl, &cfg).await;
        assert!(
            !accepted && seen.password.is_none(),
            "replication tls={tls}"
        );
        let (accepted, seen) = sql(Script::CleartextAfterSasl, &cfg).await;
        assert!(!accepted && seen.password.is_none(), "SQL tls={tls}");
    }
    // libpq 15 by default hands over the password; outboxd is stricter.
    let (libpq, seen) = psql(Script::CleartextAfterSasl, false, &[]).await;
    assert!(libpq && seen.password.is_some());
    // libpq 15 with channel_binding=require refuses it too, and sends no password.
    let (libpq, seen) = psql(
        Script::CleartextAfterSasl,
        true,
        &[("PGCHANNELBINDING", "require")],
    )
    .await;
    assert!(!libpq && seen.password.is_none());
}

#[tokio::test]
async fn channel_binding_require_refuses_what_libpq_refuses() {
    let mut cfg = client(0, true);
    cfg.channel_binding = ChannelBinding::Require;
    for s in [Script::Cleartext, Script::Trust] {
        let (repl, repl_seen) = replication(s, &cfg).await;
        let (sql_ok, sql_seen) = sql(s, &cfg).await;
        let (libpq, _) = psql(s, true, &[("PGCHANNELBINDING", "require")]).await;
        assert_eq!((repl, sql_ok, libpq), (false, false, false), "{s:?}");
        assert!(
            repl_seen.password.is_none() && sql_seen.password.is_none(),
            "{s:?}"
        );
    }
    // Without TLS there is nothing to bind to: refused before any password is sent.
    let mut plain = client(0, false);
    plain.channel_binding = ChannelBinding::Require;
    let (repl, _) = replication(Script::OkAfterSaslContinue, &plain).await;
    let (libpq, _) = psql(
        Script::OkAfterSaslContinue,
        false,
        &[("PGCHANNELBINDING", "require")],
    )
    .await;
    assert!(!repl && !libpq);
    // channel_binding=prefer (the default) takes trust and cleartext, as libpq does.
    let cfg = client(0, true);
    for s in [Script::Cleartext, Script::Trust] {
        let (repl, _) = replication(s, &cfg).await;
        let (sql_ok, _) = sql(s, &cfg).await;
        let (libpq, _) = psql(s, true, &[]).await;
        assert_eq!((repl, sql_ok), (libpq, libpq), "{s:?}");
    }
}

/// `require_auth` is libpq 16+; the installed psql (libpq 15) ignores PGREQUIREAUTH, so
/// these assert libpq 16's documented behaviour: refuse before answering.
#[tokio::test]
async fn require_auth_refuses_a_cleartext_request_before_sending_the_password() {
    let mut cfg = client(0, false);
    cfg.require_auth = "scram-sha-256".parse().unwrap();
    for s in [Script::Cleartext, Script::Trust] {
        let (repl, seen) = replication(s, &cfg).await;
        assert!(!repl && seen.password.is_none(), "replication {s:?}");
        let (sql_ok, seen) = sql(s, &cfg).await;
        assert!(!sql_ok && seen.password.is_none(), "SQL {s:?}");
    }
    cfg.require_auth = "!password".parse().unwrap();
    let (repl, seen) = replication(Script::Cleartext, &cfg).await;
    assert!(!repl && seen.password.is_none());
    let (sql_ok, _) = sql(Script::Trust, &cfg).await;
    assert!(sql_ok, "!password allows trust");
    cfg.require_auth = "password".parse().unwrap();
    let (repl, seen) = replication(Script::Cleartext, &cfg).await;
    assert!(repl && seen.password.as_deref() == Some(&b"the-real-secret\0"[..]));
}
