use super::*;
use crate::telemetry::{Health, Metrics};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const STALL: Duration = Duration::from_millis(200);

struct Server {
    addr: std::net::SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

async fn start() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(Instant::now()));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_http(
        listener,
        Arc::new(Telemetry::single(Arc::clone(&metrics), Arc::clone(&health))),
        STALL,
        async {
            let _ = stopped.await;
        },
    ));
    Server {
        addr,
        health,
        metrics,
        stop,
        task,
    }
}

/// Sends raw bytes, returns (status line, headers, body).
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> (String, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(buf).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_owned(), body.to_owned())
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: relay\r\nUser-Agent: test\r\n\r\n");
    raw(addr, req.as_bytes()).await
}

#[tokio::test]
async fn telemetry_http_serves_metrics_health_and_404() {
    let s = start().await;
    s.metrics.add_events_published(9);

    let (status, headers, body) = get(s.addr, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("Content-Type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(headers.contains("Connection: close"), "{headers}");
    assert!(
        headers.contains(&format!("Content-Length: {}", body.len())),
        "{headers}"
    );
    assert!(
        body.contains("outboxd_events_published_total 9\n"),
        "{body}"
    );

    assert_eq!(get(s.addr, "/healthz").await.0, "HTTP/1.1 200 OK");
    assert_eq!(get(s.addr, "/healthz").await.2, "ok");
    assert_eq!(get(s.addr, "/healthz?verbose=1").await.2, "ok");

    let (status, _, body) = get(s.addr, "/nope").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    assert_eq!(body, "not found");

    let (status, _, _) = raw(
        s.addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");

    let (status, headers, body) = raw(s.addr, b"HEAD /healthz HTTP/1.1\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("Content-Length: 2"), "{headers}");
    assert_eq!(body, "");

    let (status, _, _) = raw(s.addr, b"garbage\r\n\r\n").await;
    assert_eq!(status, "HTTP/1.1 400 Bad Request");

    s.stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn telemetry_http_readiness_flips_on_stall() {
    let s = start().await;
    let (status, _, body) = get(s.addr, "/readyz").await;
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    assert!(body.contains("replication"), "{body}");

    s.health.set_replication_connected(true);
    s.health.set_producer_healthy(true);
    let (status, _, body) = get(s.addr, "/readyz").await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("HTTP/1.1 200 OK", "ready")
    );

    // Work arrives and the confirmed LSN does not move for longer than stall_after.
    s.health.set_unacked(true, Instant::now());
    tokio::time::sleep(STALL + Duration::from_millis(150)).await;
    let (status, _, body) = get(s.addr, "/readyz").await;
    assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
    assert!(body.contains("no acknowledged progress"), "{body}");
    // Liveness is unaffected by a stall.
    assert_eq!(get(s.addr, "/healthz").await.0, "HTTP/1.1 200 OK");

    s.health.record_progress(Instant::now());
    assert_eq!(get(s.addr, "/readyz").await.0, "HTTP/1.1 200 OK");
    s.health.set_producer_healthy(false);
    assert!(get(s.addr, "/readyz").await.2.contains("producer"));
    s.stop.send(()).unwrap();
}

#[tokio::test]
async fn telemetry_http_rejects_oversized_head() {
    let s = start().await;
    let mut req = b"GET /metrics HTTP/1.1\r\n".to_vec();
    while req.len() <= MAX_HEAD_BYTES {
        req.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    req.extend_from_slice(b"\r\n");
    let (status, _, _) = raw(s.addr, &req).await;
    assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    s.stop.send(()).unwrap();
}

#[test]
fn head_parsing() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
    assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    assert_eq!(
        request_target(b"GET /metrics HTTP/1.1\r\n\r\n"),
        Some(("GET", "/metrics"))
    );
    assert_eq!(
        request_target(b"GET /readyz?x=1 HTTP/1.0\n\n"),
        Some(("GET", "/readyz"))
    );
    assert_eq!(request_target(b"GET /metrics\r\n\r\n"), None);
    assert_eq!(request_target(b"GET /a b HTTP/1.1\r\n\r\n"), None);
    assert_eq!(request_target(b"GET / SPDY/3\r\n\r\n"), None);
}
