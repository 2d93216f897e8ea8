//! Real client programs through Ostiary, the way agent runtimes use it: `HTTPS_PROXY` /
//! `HTTP_PROXY` set to `http://agent:<token>@<proxy>` and the proxy's CA as the bundle.
//!
//! What it proves, per client (curl, Python `requests`, `httpx` over HTTP/1.1 and HTTP/2,
//! `websockets`, and a hand-rolled Rust h2 client doing CONNECT + TLS itself):
//! - an allowed request reaches the upstream byte for byte (body SHA-256 as the upstream
//!   computed it) and never carries the agent's `Proxy-Authorization` past the proxy;
//! - a denied request is answered by the proxy with docs/design.md §5's 403 JSON (`error: denied`,
//!   `request_id` equal to the `Ostiary-Request-Id` header, `policies` naming the forbid) and
//!   the upstream never sees it, and its audit record says the same;
//! - WebSocket upgrades pass when allowed and get no 101 when denied;
//! - gRPC-shaped h2 calls keep `te: trailers` and get their response trailers;
//! - large bodies stream intact both ways (4 MiB download, 16 MiB upload);
//! - plain `http://` absolute-form works and is decided like the rest;
//! - both `Basic` and `Bearer` proxy credentials authenticate, and none gets 407.
//!
//! Each test starts its own upstream and proxy on port 0, so they run in parallel.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ostiary_e2e::clients::{self, client_script, curl, CmdOutput};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::{grpc_frame, Upstream};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Allows the upstream routes the tests use on `api.example.test`, and forbids `/secret`
/// explicitly so that a denial names a determining policy.
const POLICY: &str = r#"
@id("allow-api")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { ["/echo", "/stream", "/upload", "/grpc", "/ws"].contains(context.path) };

@id("forbid-secret")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.path == "/secret" };
"#;

/// A body with bytes a careless proxy might mangle: quotes, newlines, non-ASCII.
const BODY: &str = "{\"prompt\": \"résumé ✓\",\n \"n\": [1, 2, 3]}\r\ntrailing line\n";

fn sha256_hex(data: &[u8]) -> String {
    hex_of(&Sha256::digest(data))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn borrow(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// An upstream and a proxy that trusts it and may reach its port.
async fn setup(policy: &str) -> (Upstream, TestProxy) {
    setup_with(policy, Upstream::builder()).await
}

async fn setup_with(
    policy: &str,
    builder: ostiary_e2e::upstream::UpstreamBuilder,
) -> (Upstream, TestProxy) {
    let upstream = builder.start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: policy.into(),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        ..Default::default()
    })
    .await;
    (upstream, proxy)
}

/// The JSON body a Python client printed (`body` is the response text).
fn body_json(out: &CmdOutput) -> Value {
    let v = out.json();
    let body = v["body"]
        .as_str()
        .unwrap_or_else(|| panic!("no body in client output:\n{out}"));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("body is not JSON ({e}):\n{out}"))
}

/// Checks a proxy-made 403 denial as docs/design.md §5 describes it, and its audit record.
async fn assert_denied(
    proxy: &TestProxy,
    status: u64,
    request_id_header: Option<&str>,
    body: &Value,
    path: &str,
) {
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "denied", "{body}");
    assert_eq!(
        body["policies"],
        serde_json::json!(["forbid-secret"]),
        "{body}"
    );
    assert_eq!(body["action"], "Ostiary::Action::\"http\"", "{body}");
    assert_eq!(
        body["resource"], "Ostiary::Host::\"api.example.test\"",
        "{body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    let request_id = body["request_id"].as_str().expect("request_id").to_owned();
    assert!(!request_id.is_empty());
    assert_eq!(request_id_header, Some(request_id.as_str()), "{body}");
    let record = proxy.audit_of(&request_id).await;
    assert_eq!(record.kind, "http");
    assert_eq!(record.decision, "deny");
    assert_eq!(record.error.as_deref(), Some("denied"));
    assert_eq!(record.status, Some(403));
    assert_eq!(record.path.as_deref(), Some(path));
    assert_eq!(record.policies, vec!["forbid-secret".to_owned()]);
    assert_eq!(record.upstream, None, "a denied request dials nothing");
}

/// GET and POST to `/echo` and a denied `/secret`, with one Python client.
async fn python_client_round(script: &str, http2: bool) {
    let (upstream, proxy) = setup(POLICY).await;
    let session = proxy.session("py-agent").await;
    let mut env = proxy.client_env(&session);
    if http2 {
        env.push(("OSTIARY_HTTP2".into(), "1".into()));
    }
    let env = borrow(&env);
    let script = client_script(script);
    let expected_version = if http2 { "HTTP/2" } else { "HTTP/1.1" };

    let get = clients::python(&script, &[&upstream.url("/echo?q=1")], &env).await;
    assert!(get.success(), "{get}");
    let v = get.json();
    assert_eq!(v["status"], 200, "{get}");
    assert_eq!(v["http_version"], expected_version, "{get}");
    let echo = body_json(&get);
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["path"], "/echo");
    assert_eq!(echo["query"], "q=1");
    assert_eq!(echo["body_len"], 0);
    assert_eq!(echo["body_sha256"], sha256_hex(b""));
    assert_eq!(echo["sni"], "api.example.test");
    assert_eq!(
        echo["authority"],
        format!("api.example.test:{}", upstream.port())
    );
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{echo}"
    );

    let post = clients::python(&script, &[&upstream.url("/echo"), "POST", BODY], &env).await;
    assert!(post.success(), "{post}");
    assert_eq!(post.json()["status"], 200, "{post}");
    let echo = body_json(&post);
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body_len"], BODY.len());
    assert_eq!(echo["body_sha256"], sha256_hex(BODY.as_bytes()));

    // What the upstream itself recorded, independent of what it answered.
    let seen = upstream.seen_path("/echo");
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for s in &seen {
        assert!(s.headers.get("proxy-authorization").is_none(), "{s:#?}");
        assert!(s.body_complete);
        assert_eq!(s.sni.as_deref(), Some("api.example.test"));
        // The upstream offers h2 and http/1.1: the proxy speaks to it what the agent spoke.
        let spoken = if http2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        assert_eq!(
            s.version, spoken,
            "the agent's protocol upstream too: {s:#?}"
        );
    }
    assert_eq!(seen[0].method, hyper::Method::GET);
    assert_eq!(seen[1].method, hyper::Method::POST);
    assert_eq!(seen[1].body_len, BODY.len() as u64);

    let denied = clients::python(&script, &[&upstream.url("/secret"), "POST", BODY], &env).await;
    assert!(denied.success(), "{denied}");
    let v = denied.json();
    assert_eq!(v["http_version"], expected_version, "{denied}");
    assert_eq!(v["headers"]["content-type"], "application/json", "{denied}");
    let body = body_json(&denied);
    assert_denied(
        &proxy,
        v["status"].as_u64().unwrap_or_default(),
        v["headers"]["ostiary-request-id"].as_str(),
        &body,
        "/secret",
    )
    .await;
    assert_eq!(
        upstream.count("/secret"),
        0,
        "a denied request is never forwarded"
    );
    assert_eq!(
        upstream.seen().len(),
        2,
        "the upstream saw only the two allowed requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_get_post_and_denied() {
    python_client_round("py_requests.py", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_httpx_h1_get_post_and_denied() {
    python_client_round("py_httpx.py", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_httpx_h2_get_post_and_denied() {
    python_client_round("py_httpx.py", true).await;
}

const WS_POLICY: &str = r#"
@id("allow-api")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { ["/echo", "/ws"].contains(context.path) };

@id("forbid-ws")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.path == "/ws" };
"#;

fn wss_url(upstream: &Upstream) -> String {
    format!("wss://{}:{}/ws", upstream.host(), upstream.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_through_the_proxy() {
    let (upstream, proxy) = setup(POLICY).await;
    let session = proxy.session("ws-agent").await;
    let env = proxy.client_env(&session);
    let message = "hello through ostiary ✓";
    let out = clients::python(
        client_script("py_ws.py"),
        &[&wss_url(&upstream), message],
        &borrow(&env),
    )
    .await;
    assert!(out.success(), "{out}");
    let v = out.json();
    assert_eq!(v["sent"], message, "{out}");
    assert_eq!(v["echo"], message, "{out}");

    let seen = upstream.seen_path("/ws");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(seen[0].version, Version::HTTP_11);
    assert!(seen[0].headers.get("proxy-authorization").is_none());
    assert!(seen[0]
        .header("upgrade")
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket")));

    let records = proxy.audit().await;
    let ws: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(ws.len(), 1, "{records:#?}");
    assert_eq!(ws[0].decision, "allow");
    assert_eq!(ws[0].status, Some(101));
    assert_eq!(ws[0].path.as_deref(), Some("/ws"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_denied_gets_no_upgrade_and_reaches_nothing() {
    let (upstream, proxy) = setup(WS_POLICY).await;
    let session = proxy.session("ws-agent").await;
    let env = proxy.client_env(&session);
    let out = clients::python(
        client_script("py_ws.py"),
        &[&wss_url(&upstream), "should not arrive"],
        &borrow(&env),
    )
    .await;
    assert_eq!(out.status, 3, "the handshake must fail:\n{out}");
    let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("403"),
        "expected a 403 handshake refusal, got {error:?}\n{out}"
    );
    assert_eq!(upstream.connections(), 0, "nothing reached the upstream");
    assert!(upstream.seen().is_empty());

    let records = proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 1, "{records:#?}");
    assert_eq!(http[0].decision, "deny");
    assert_eq!(http[0].status, Some(403));
    assert_eq!(http[0].policies, vec!["forbid-ws".to_owned()]);
    assert_eq!(http[0].path.as_deref(), Some("/ws"));
}

/// Opens a CONNECT tunnel through the proxy with `proxy_authorization`, then TLS to `host`
/// trusting only the proxy's CA, offering `alpn`. Returns the CONNECT status line on a
/// refusal.
async fn connect_tls(
    proxy: &TestProxy,
    host: &str,
    port: u16,
    proxy_authorization: &str,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut tcp = TcpStream::connect(proxy.proxy_addr).await.unwrap();
    let head = format!(
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: {proxy_authorization}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    // Byte by byte up to the blank line, so nothing after the head is consumed.
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = tcp.read(&mut byte).await.unwrap();
        assert!(
            n == 1,
            "proxy closed during CONNECT: {:?}",
            String::from_utf8_lossy(&response)
        );
        response.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let status_line = text.lines().next().unwrap_or_default().to_owned();
    if !status_line.starts_with("HTTP/1.1 200") {
        return Err(status_line);
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(proxy.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(host.to_owned()).unwrap();
    Ok(connector
        .connect(name, tcp)
        .await
        .expect("TLS with the proxy's leaf"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2_gets_its_trailers() {
    let (upstream, proxy) = setup(POLICY).await;
    let session = proxy.session("grpc-agent").await;
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("agent:{}", session.token));
    let tls = connect_tls(
        &proxy,
        upstream.host(),
        upstream.port(),
        &format!("Basic {basic}"),
        &[b"h2"],
    )
    .await
    .expect("CONNECT accepted");
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the proxy speaks h2 to the agent"
    );

    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake with the proxy");
    tokio::spawn(conn);
    let mut message = grpc_frame(b"first message");
    message.extend_from_slice(&grpc_frame(&[0u8, 1, 2, 255, 254]));
    let req = Request::post(format!(
        "https://{}:{}/grpc",
        upstream.host(),
        upstream.port()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from(message.clone())))
    .unwrap();
    let resp = sender.send_request(req).await.expect("h2 response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), Version::HTTP_2);
    assert_eq!(resp.headers()["content-type"], "application/grpc");
    let (_, mut body) = resp.into_parts();
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("response frame");
        match frame.into_data() {
            Ok(chunk) => data.extend_from_slice(&chunk),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    assert_eq!(data, message, "the messages are echoed intact");
    let trailers = trailers.expect("response trailers reached the client");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["grpc-message"], "ok");

    let seen = upstream.seen_path("/grpc");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].version,
        Version::HTTP_2,
        "h2 on the upstream side too"
    );
    assert_eq!(
        seen[0].header("te"),
        Some("trailers"),
        "te: trailers passes end to end"
    );
    assert_eq!(seen[0].header("content-type"), Some("application/grpc"));
    assert_eq!(seen[0].body_len, message.len() as u64);
    assert!(seen[0].headers.get("proxy-authorization").is_none());
}

/// The bytes `/stream?chunks=N&size=S` produces: chunk i is S copies of `b'a' + i % 26`.
fn stream_bytes(chunks: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks as usize * size);
    for i in 0..chunks {
        out.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, size));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stream_intact_both_ways() {
    let (upstream, proxy) = setup(POLICY).await;
    let session = proxy.session("bulk-agent").await;
    let env = proxy.client_env(&session);
    let env = borrow(&env);
    let dir = tempfile::tempdir().unwrap();

    let expected_download = stream_bytes(64, 65536);
    let mut upload = vec![0u8; 16 << 20];
    // Deterministic, non-repeating content (a counter hashed), so a dropped or
    // duplicated block changes the digest.
    for (i, block) in upload.chunks_mut(32).enumerate() {
        block.copy_from_slice(&Sha256::digest((i as u64).to_le_bytes()));
    }
    let upload_path = dir.path().join("upload.bin");
    std::fs::write(&upload_path, &upload).unwrap();
    let upload_arg = format!("@{}", upload_path.display());

    for version in ["--http1.1", "--http2"] {
        let out_path = dir.path().join(format!("download{version}.bin"));
        let out_arg = out_path.display().to_string();
        let down = curl(
            &[
                version,
                "-o",
                &out_arg,
                "-w",
                "%{http_code} %{size_download}",
                &upstream.url("/stream?chunks=64&size=65536"),
            ],
            &env,
        )
        .await;
        assert!(down.success(), "{down}");
        assert_eq!(down.stdout.trim(), "200 4194304", "{down}");
        let got = std::fs::read(&out_path).unwrap();
        assert_eq!(got.len(), expected_download.len());
        assert!(
            got == expected_download,
            "the download arrived altered ({version})"
        );

        let up = curl(
            &[
                version,
                "-H",
                "content-type: application/octet-stream",
                "--data-binary",
                &upload_arg,
                "-w",
                "\n%{http_code}",
                &upstream.url("/upload"),
            ],
            &env,
        )
        .await;
        assert!(up.success(), "{up}");
        let mut lines = up.stdout.lines();
        let body: Value = serde_json::from_str(lines.next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("upload answer is not JSON ({e}):\n{up}"));
        assert_eq!(lines.next(), Some("200"), "{up}");
        assert_eq!(body["received"], 16_777_216u64, "{up}");
        assert_eq!(body["sha256"], sha256_hex(&upload), "{up}");
    }
    let uploads = upstream.seen_path("/upload");
    assert_eq!(uploads.len(), 2);
    for s in uploads {
        assert_eq!(s.body_len, 16 << 20);
        assert!(s.body_complete);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_absolute_form_allowed_and_denied() {
    let (upstream, proxy) = setup_with(POLICY, Upstream::builder().tls(false)).await;
    let session = proxy.session("plain-agent").await;
    let env = proxy.client_env(&session);
    let env = borrow(&env);

    // curl: HTTP_PROXY from the session env, absolute-form with Basic credentials.
    let ok = curl(
        &["-i", "--data-binary", BODY, &upstream.url("/echo?via=curl")],
        &env,
    )
    .await;
    assert!(ok.success(), "{ok}");
    assert!(ok.stdout.starts_with("HTTP/1.1 200"), "{ok}");
    let echo: Value = serde_json::from_str(ok.stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}:\n{ok}"));
    assert_eq!(echo["body_sha256"], sha256_hex(BODY.as_bytes()), "{ok}");
    assert_eq!(echo["query"], "via=curl");
    assert_eq!(echo["sni"], Value::Null, "plain HTTP upstream");

    // requests: the same through its own proxy handling.
    let py = clients::python(
        client_script("py_requests.py"),
        &[&upstream.url("/echo"), "PUT", BODY],
        &env,
    )
    .await;
    assert!(py.success(), "{py}");
    assert_eq!(py.json()["status"], 200, "{py}");
    assert_eq!(body_json(&py)["body_sha256"], sha256_hex(BODY.as_bytes()));

    let seen = upstream.seen_path("/echo");
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert!(s.headers.get("proxy-authorization").is_none(), "{s:#?}");
        assert_eq!(
            s.header("host"),
            Some(&*format!("api.example.test:{}", upstream.port()))
        );
        assert_eq!(s.body_len, BODY.len() as u64);
    }

    let denied = curl(&["-i", &upstream.url("/secret")], &env).await;
    assert!(denied.success(), "{denied}");
    let (head, body) = denied
        .stdout
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head:\n{denied}"));
    assert!(head.starts_with("HTTP/1.1 403"), "{denied}");
    let request_id = head
        .lines()
        .find_map(|l| l.strip_prefix("ostiary-request-id: "))
        .map(str::trim);
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}:\n{denied}"));
    assert_denied(&proxy, 403, request_id, &body, "/secret").await;
    assert_eq!(upstream.count("/secret"), 0);
    assert_eq!(upstream.seen().len(), 2);

    let record = proxy.audit_of(body["request_id"].as_str().unwrap()).await;
    assert_eq!(record.scheme.as_deref(), Some("http"));
    assert_eq!(record.port, Some(upstream.port()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_and_bearer_proxy_credentials_authenticate() {
    let upstream = Upstream::builder().start().await;
    let plain = Upstream::builder().tls(false).start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICY.into(),
        ports: vec![upstream.port(), plain.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("auth-agent").await;
    let proxy_plain = format!("http://{}", proxy.proxy_addr);
    let ca = proxy.ca_path.display().to_string();
    let bearer = format!("Proxy-Authorization: Bearer {}", session.token);
    let basic_user = format!("agent:{}", session.token);

    // HTTPS through CONNECT, credentials on the CONNECT.
    let https = upstream.url("/echo");
    let cases: [(&str, Vec<&str>); 2] = [
        ("basic", vec!["--proxy-user", &basic_user]),
        ("bearer", vec!["--proxy-header", &bearer]),
    ];
    for (name, auth) in &cases {
        let mut args = vec![
            "--cacert",
            &ca,
            "-x",
            &proxy_plain,
            "-w",
            "\n%{http_connect} %{http_code}",
        ];
        args.extend(auth.iter().copied());
        args.push(&https);
        let out = curl(&args, &[]).await;
        assert!(out.success(), "{name}: {out}");
        assert_eq!(out.stdout.lines().last(), Some("200 200"), "{name}: {out}");
    }
    // Plain http, credentials on the absolute-form request itself.
    let http = plain.url("/echo");
    for (name, auth) in &cases {
        let mut args = vec!["-x", &proxy_plain, "-w", "\n%{http_code}"];
        args.extend(auth.iter().copied());
        args.push(&http);
        let out = curl(&args, &[]).await;
        assert!(out.success(), "{name}: {out}");
        assert_eq!(out.stdout.lines().last(), Some("200"), "{name}: {out}");
    }
    assert_eq!(upstream.count("/echo"), 2);
    assert_eq!(plain.count("/echo"), 2);
    for s in upstream.seen().iter().chain(plain.seen().iter()) {
        assert!(s.headers.get("proxy-authorization").is_none(), "{s:#?}");
    }

    // Without credentials, or with a forged token: 407 with the Basic challenge.
    let forged = format!("Proxy-Authorization: Bearer {}x", session.token);
    for auth in [vec![], vec!["--proxy-header", &forged]] {
        let mut args = vec!["-i", "-x", &proxy_plain];
        args.extend(auth.iter().copied());
        args.push(&http);
        let out = curl(&args, &[]).await;
        assert!(out.success(), "{out}");
        let (head, body) = out
            .stdout
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{out}"));
        assert!(head.starts_with("HTTP/1.1 407"), "{out}");
        assert!(
            head.lines()
                .any(|l| l.eq_ignore_ascii_case("proxy-authenticate: Basic realm=\"ostiary\"")),
            "{out}"
        );
        let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(body["error"], "unauthenticated", "{out}");
        assert!(
            body["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{out}"
        );
        let mut args = vec!["--cacert", &ca, "-x", &proxy_plain, "-w", "%{http_connect}"];
        args.extend(auth.iter().copied());
        args.push(&https);
        let out = curl(&args, &[]).await;
        assert!(
            !out.success(),
            "a refused CONNECT fails the transfer: {out}"
        );
        assert_eq!(out.stdout.trim(), "407", "{out}");
    }
    assert_eq!(
        plain.count("/echo"),
        2,
        "unauthenticated requests are never forwarded"
    );
    assert_eq!(upstream.count("/echo"), 2);
}
