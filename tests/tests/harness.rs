//! Self-tests of the e2e harness: every upstream route hit directly (no Ostiary), with
//! hyper's own client over TLS (h1 and h2), tokio-tungstenite, curl and the Python clients,
//! plus a minimal CONNECT proxy standing in for Ostiary so the clients' proxy and
//! CA handling is proven before a real proxy test depends on it.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::HeaderMap;
use hyper::{Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::upstream::{grpc_frame, Upstream};
use rustls_pki_types::ServerName;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;

type ReqBody = UnsyncBoxBody<Bytes, Infallible>;

fn full(data: impl Into<Bytes>) -> ReqBody {
    Full::new(data.into()).boxed_unsync()
}

#[derive(Debug)]
struct Got {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
    data_frames: usize,
    trailers: Option<HeaderMap>,
    alpn: Option<Vec<u8>>,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

/// One request to `up` over a fresh connection speaking `version` (TLS when the upstream
/// has it, ALPN chosen to match), collecting the body frame by frame.
async fn send(up: &Upstream, version: Version, method: &str, path: &str, body: ReqBody) -> Got {
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let alpn: &[&[u8]] = if version == Version::HTTP_2 {
        &[b"h2"]
    } else {
        &[b"http/1.1"]
    };
    let mut req = Request::builder().method(method);
    req = if version == Version::HTTP_2 {
        req.uri(up.url(path))
    } else {
        req.uri(path)
            .header("host", format!("{}:{}", up.host(), up.port()))
    };
    let req = req.body(body).unwrap();
    if up.is_tls() {
        let connector = TlsConnector::from(up.ca().client_config(alpn));
        let name = ServerName::try_from(up.host().to_owned()).unwrap();
        let tls = connector.connect(name, tcp).await.expect("TLS handshake");
        let negotiated = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
        let mut got = exchange(TokioIo::new(tls), version, req).await;
        got.alpn = negotiated;
        got
    } else {
        exchange(TokioIo::new(tcp), version, req).await
    }
}

async fn exchange<I>(io: I, version: Version, req: Request<ReqBody>) -> Got
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let resp = if version == Version::HTTP_2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        sender.send_request(req).await.expect("h2 response")
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        sender.send_request(req).await.expect("h1 response")
    };
    let (parts, mut body) = resp.into_parts();
    let mut data = Vec::new();
    let mut data_frames = 0;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("response body frame");
        match frame.into_data() {
            Ok(chunk) => {
                data_frames += 1;
                data.extend_from_slice(&chunk);
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    Got {
        status: parts.status,
        version: parts.version,
        headers: parts.headers,
        body: data.into(),
        data_frames,
        trailers,
        alpn: None,
    }
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn echo_over_h1_and_h2_reports_and_records_the_request() {
    let up = Upstream::builder().start().await;
    for version in [Version::HTTP_11, Version::HTTP_2] {
        let got = send(&up, version, "POST", "/echo?x=1&y=two", full("hello body")).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.version, version);
        let expected_alpn: &[u8] = if version == Version::HTTP_2 {
            b"h2"
        } else {
            b"http/1.1"
        };
        assert_eq!(got.alpn.as_deref(), Some(expected_alpn));
        let v = got.json();
        assert_eq!(v["method"], "POST");
        assert_eq!(v["path"], "/echo");
        assert_eq!(v["query"], "x=1&y=two");
        assert_eq!(v["version"], format!("{version:?}"));
        assert_eq!(v["body_len"], 10);
        assert_eq!(v["body_sha256"], sha256_hex(b"hello body"));
        assert_eq!(v["sni"], "api.example.test");
        assert_eq!(
            v["authority"],
            format!("api.example.test:{}", up.port()),
            "{v}"
        );
    }
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(up.count("/echo"), 2);
    assert_eq!(up.connections(), 2);
    for (s, version) in seen.iter().zip([Version::HTTP_11, Version::HTTP_2]) {
        assert_eq!(s.method, hyper::Method::POST);
        assert_eq!(s.path, "/echo?x=1&y=two");
        assert_eq!(s.version, version);
        assert_eq!(s.body_len, 10);
        assert!(s.body_complete);
        assert_eq!(s.sni.as_deref(), Some("api.example.test"));
    }
    assert_eq!(
        seen[0].header("host"),
        Some(&*format!("api.example.test:{}", up.port()))
    );
}

#[tokio::test]
async fn echo_lists_repeated_headers() {
    let up = Upstream::builder().start().await;
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let connector = TlsConnector::from(up.ca().client_config(&[b"http/1.1"]));
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let req = Request::builder()
        .uri("/echo")
        .header("host", "localhost")
        .header("X-Multi", "a")
        .header("x-multi", "b")
        .header("X-Single", "one")
        .body(full(""))
        .unwrap();
    let got = exchange(TokioIo::new(tls), Version::HTTP_11, req).await;
    let v = got.json();
    assert_eq!(v["headers"]["x-multi"], serde_json::json!(["a", "b"]));
    assert_eq!(v["headers"]["x-single"], "one");
    assert_eq!(v["sni"], "localhost");
}

#[tokio::test]
async fn stream_arrives_in_pieces_over_time() {
    let up = Upstream::builder().start().await;
    for version in [Version::HTTP_11, Version::HTTP_2] {
        let started = Instant::now();
        let got = send(
            &up,
            version,
            "GET",
            "/stream?chunks=6&size=1000&delay_ms=30",
            full(""),
        )
        .await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.body.len(), 6000);
        assert!(got.body[..1000].iter().all(|b| *b == b'a'));
        assert!(got.body[5000..].iter().all(|b| *b == b'f'));
        assert!(got.data_frames >= 6, "{} frames", got.data_frames);
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(got.headers.get("content-length").is_none());
    }
}

#[tokio::test]
async fn upload_counts_a_streamed_body() {
    let up = Upstream::builder().start().await;
    for version in [Version::HTTP_11, Version::HTTP_2] {
        let chunks = (0..64)
            .map(|i| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![i as u8; 16 * 1024]))));
        let body = StreamBody::new(futures_util::stream::iter(chunks)).boxed_unsync();
        let got = send(&up, version, "PUT", "/upload", body).await;
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.json()["received"], 64 * 16 * 1024);
    }
    let seen = up.seen_path("/upload");
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|s| s.body_len == 64 * 16 * 1024 && s.body_complete));
}

#[tokio::test]
async fn grpc_echoes_the_message_with_trailers_over_h2() {
    let up = Upstream::builder().start().await;
    let framed = grpc_frame(b"\x0a\x05hello");
    let mut req = Request::builder()
        .method("POST")
        .uri(up.url("/grpc"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    req = req.version(Version::HTTP_2);
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let connector = TlsConnector::from(up.ca().client_config(&[b"h2"]));
    let tls = connector
        .connect(ServerName::try_from(up.host().to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let got = exchange(
        TokioIo::new(tls),
        Version::HTTP_2,
        req.body(full(framed.clone())).unwrap(),
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.headers["content-type"], "application/grpc");
    assert_eq!(&got.body[..], &framed[..]);
    let trailers = got.trailers.expect("gRPC trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "ok");

    let bad = send(
        &up,
        Version::HTTP_2,
        "POST",
        "/grpc",
        full(&b"\x00\x00\x00\x00\x09abc"[..]),
    )
    .await;
    assert_eq!(bad.trailers.expect("trailers")["grpc-status"], "13");
    assert!(bad.body.is_empty());
}

#[tokio::test]
async fn status_and_not_found() {
    let up = Upstream::builder().start().await;
    for (path, code) in [
        ("/status/418", 418),
        ("/status/503", 503),
        ("/status/204", 204),
        ("/status/abc", 400),
        ("/status/101", 400),
        ("/nope", 404),
        ("/", 404),
    ] {
        let got = send(&up, Version::HTTP_2, "GET", path, full("")).await;
        assert_eq!(got.status.as_u16(), code, "{path}");
    }
    assert_eq!(up.seen().len(), 7);
}

#[tokio::test]
async fn websocket_echo_with_tungstenite_over_tls() {
    let up = Upstream::builder().start().await;
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let connector = TlsConnector::from(up.ca().client_config(&[b"http/1.1"]));
    let tls = connector
        .connect(ServerName::try_from(up.host().to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://{}:{}/ws", up.host(), up.port());
    let (mut ws, resp) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("ws handshake");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("ping me")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("ping me"));
    ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::binary(vec![1u8, 2, 3])
    );
    ws.close(None).await.unwrap();
    let seen = up.seen_path("/ws");
    assert_eq!(seen.len(), 1);
    assert!(seen[0].body_complete);
    assert_eq!(seen[0].header("upgrade"), Some("websocket"));

    // h2 has no HTTP/1.1 Upgrade: the route must refuse rather than hang.
    let got = send(&up, Version::HTTP_2, "GET", "/ws", full("")).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn websocket_is_closed_when_upstream_drops() {
    let up = Upstream::builder().start().await;
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let connector = TlsConnector::from(up.ca().client_config(&[b"http/1.1"]));
    let tls = connector
        .connect(ServerName::try_from(up.host().to_owned()).unwrap(), tcp)
        .await
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(format!("wss://{}/ws", up.host()), tls)
        .await
        .unwrap();
    drop(up);
    let end = tokio::time::timeout(Duration::from_secs(5), ws.next()).await;
    assert!(
        matches!(
            end,
            Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_))))
        ),
        "{end:?}"
    );
}

#[tokio::test]
async fn plain_http_upstream_serves_h1_and_h2c() {
    let up = Upstream::builder().tls(false).start().await;
    assert!(up.url("/echo").starts_with("http://api.example.test:"));
    for version in [Version::HTTP_11, Version::HTTP_2] {
        let got = send(&up, version, "GET", "/echo", full("")).await;
        assert_eq!(got.json()["version"], format!("{version:?}"));
        assert_eq!(got.json()["sni"], Value::Null);
    }
    assert!(up.seen().iter().all(|s| s.sni.is_none()));
}

#[tokio::test]
async fn http1_only_upstream_negotiates_http11() {
    let up = Upstream::builder().http2(false).start().await;
    let got = send(&up, Version::HTTP_11, "GET", "/echo", full("")).await;
    assert_eq!(got.alpn.as_deref(), Some(&b"http/1.1"[..]));
    // A client insisting on h2 only finds no common protocol.
    let tcp = TcpStream::connect(up.addr()).await.unwrap();
    let connector = TlsConnector::from(up.ca().client_config(&[b"h2"]));
    let res = connector
        .connect(ServerName::try_from(up.host().to_owned()).unwrap(), tcp)
        .await;
    assert!(res.is_err(), "ALPN mismatch must fail the handshake");
}

#[tokio::test]
async fn upstreams_share_a_ca_and_certify_ip_names() {
    let ca = TestCa::new();
    let a = Upstream::builder()
        .ca(&ca)
        .names(&["a.example.test"])
        .start()
        .await;
    let b = Upstream::builder()
        .ca(&ca)
        .names(&["127.0.0.1"])
        .start()
        .await;
    assert_eq!(a.ca_pem(), b.ca_pem());
    assert_eq!(
        send(&a, Version::HTTP_2, "GET", "/echo", full(""))
            .await
            .status,
        StatusCode::OK
    );
    let tcp = TcpStream::connect(b.addr()).await.unwrap();
    let connector = TlsConnector::from(ca.client_config(&[b"h2"]));
    let ip = ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(ip, tcp).await.expect("IP SAN verifies");
    let (chain, key) = ca.issue(&["x.example.test", "::1"]);
    assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
    assert!(key.contains("BEGIN PRIVATE KEY"));
}

#[tokio::test]
async fn dropping_the_upstream_closes_its_port() {
    let up = Upstream::builder().start().await;
    let addr = up.addr();
    drop(up);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener still open after drop"
    );
}

#[tokio::test]
async fn wait_for_count_sees_late_requests() {
    let up = Upstream::builder().start().await;
    assert!(
        !up.wait_for_count("/echo", 1, Duration::from_millis(50))
            .await
    );
    send(&up, Version::HTTP_11, "GET", "/echo", full("")).await;
    assert!(
        up.wait_for_count("/echo", 1, Duration::from_millis(50))
            .await
    );
    up.seen_handle().lock().unwrap().clear();
    assert_eq!(up.count("/echo"), 0);
}

/// A synchronous test: no runtime of its own, blocking subprocess calls.
#[test]
fn detached_upstream_serves_blocking_callers() {
    let up = Upstream::builder().start_detached();
    let dir = tempfile::tempdir().unwrap();
    let ca = up.write_ca(dir.path());
    let out = std::process::Command::new("curl")
        .args([
            "-q",
            "-sS",
            "--cacert",
            ca.to_str().unwrap(),
            "--resolve",
            &up.resolve_arg(),
            &up.url("/echo"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["path"], "/echo");
    assert_eq!(up.count("/echo"), 1);
    let addr = up.addr();
    drop(up);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "port still open after drop"
    );
}
