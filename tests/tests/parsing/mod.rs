//! HTTP and TLS parsing under attack (THREATS.md, "HTTP and TLS parsing"), driven by raw
//! TCP and raw TLS clients that send what well-behaved clients refuse to:
//!
//! - domain fronting: an SNI or an inner `Host`/`:authority` naming another host than the
//!   CONNECT, and per-request decisions inside one tunnel;
//! - request smuggling shapes on the plain listener and inside an intercepted h1 tunnel
//!   (400 `bad_request`, never forwarded), oversized heads (431) and slowloris;
//! - path confusion: the policy sees exactly the path the upstream receives;
//! - an upstream answer head past its bound (502); an upstream whose certificate the proxy
//!   cannot verify is `upstream_certificates.rs`;
//! - the one JSON shape of every refusal Ostiary produces.
//!
//! Every test here talks only to loopback: the upstreams are local and their names are
//! mapped to 127.0.0.1 by `egress.resolve`; the one test naming a private address uses the
//! stub resolver and the recording dialer.

use std::sync::Arc;
use std::time::Duration;

use ostiary::Options;
use ostiary_e2e::proxy::{ProxySpec, RecordingDialer, StubResolver, TestProxy, ALLOW_ALL};
use ostiary_e2e::raw::{
    absolute_get, assert_refused, auth_line, connect, h1, h2, intercepted, request, send_h1,
    send_h2, tls, wait_for_audit, watching_config, Reply, Wire,
};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

mod sni;

/// Only `/echo` on any host; everything else is denied by default.
const ECHO_ONLY: &str = r#"
@id("allow-echo")
permit (principal, action == Ostiary::Action::"http", resource)
when { context.path == "/echo" };
"#;

/// A TLS upstream (and a plain one) behind a proxy with `policies`, plus a session.
struct Fixture {
    tls: Upstream,
    plain: Upstream,
    proxy: TestProxy,
    session: Session,
}

async fn fixture_with(policies: &str, extra_toml: &str) -> Fixture {
    let tls = Upstream::builder().start().await;
    let plain = Upstream::builder().tls(false).start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: policies.into(),
        ports: vec![tls.port(), plain.port()],
        upstream_ca_pem: Some(tls.ca_pem()),
        extra_toml: extra_toml.into(),
        ..Default::default()
    })
    .await;
    let session = proxy.session("parsing-agent").await;
    Fixture {
        tls,
        plain,
        proxy,
        session,
    }
}

async fn fixture(policies: &str) -> Fixture {
    fixture_with(policies, "").await
}

impl Fixture {
    /// `api.example.test:<tls port>`: the tunnel's authority and its inner `Host`.
    fn authority(&self) -> String {
        format!("{}:{}", self.tls.host(), self.tls.port())
    }

    /// An intercepted tunnel to the TLS upstream, negotiating `alpn`.
    async fn tunnel(&self, alpn: &[&[u8]]) -> tokio_rustls::client::TlsStream<TcpStream> {
        intercepted(
            &self.proxy,
            &self.session.token,
            self.tls.host(),
            self.tls.port(),
            alpn,
        )
        .await
    }

    /// CONNECT accepted, TLS not started yet.
    async fn connected(&self) -> TcpStream {
        let (wire, reply) = connect(
            self.proxy.proxy_addr,
            &self.authority(),
            &auth_line(&self.session.token),
        )
        .await;
        assert_eq!(reply.status, 200, "{reply}");
        wire.into_inner()
    }

    fn assert_upstreams_untouched(&self) {
        assert!(self.tls.seen().is_empty(), "{:#?}", self.tls.seen());
        assert!(self.plain.seen().is_empty(), "{:#?}", self.plain.seen());
    }
}

// ---------------------------------------------------------------------------------------
// Domain fronting
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h1_host_differing_from_the_tunnel_is_421() {
    let fx = fixture(ALLOW_ALL).await;
    let port = fx.tls.port();
    let cases = [
        ("/echo".to_owned(), "other.test".to_owned()),
        ("/echo".to_owned(), format!("other.test:{port}")),
        // Same host, another port: another origin.
        ("/echo".to_owned(), "api.example.test:1".to_owned()),
        // Absolute-form inside the tunnel: the request target names the other host.
        ("https://other.test/echo".to_owned(), fx.authority()),
    ];
    for (target, host) in &cases {
        let mut wire = Wire::new(fx.tunnel(&[b"http/1.1"]).await);
        wire.send(format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let reply = wire.response().await.unwrap();
        let (body, record) = assert_refused(&fx.proxy, &reply, 421, "misdirected_request").await;
        assert_eq!(body["tunnel"], fx.authority(), "{target} {host}");
        let named = if target.starts_with("https://") {
            "other.test"
        } else {
            host.as_str()
        };
        assert_eq!(body["host"], named, "{target} {host}");
        assert_eq!(record.kind, "http");
    }
    fx.assert_upstreams_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_authority_differing_from_the_tunnel_is_421() {
    let fx = fixture(ALLOW_ALL).await;
    let mut sender = h2(fx.tunnel(&[b"h2"]).await).await;
    for (url, named) in [
        (
            "https://other.test/echo".to_owned(),
            "other.test".to_owned(),
        ),
        (
            format!("https://other.test:{}/echo", fx.tls.port()),
            format!("other.test:{}", fx.tls.port()),
        ),
        (
            "https://api.example.test:1/echo".to_owned(),
            "api.example.test:1".to_owned(),
        ),
    ] {
        let reply = send_h2(&mut sender, request("GET", &url, None))
            .await
            .unwrap();
        let (body, _) = assert_refused(&fx.proxy, &reply, 421, "misdirected_request").await;
        assert_eq!(body["tunnel"], fx.authority());
        assert_eq!(body["host"], named);
    }
    // The connection stays usable for its own host.
    let ok = send_h2(&mut sender, request("GET", &fx.tls.url("/echo"), None))
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{ok}");
    assert_eq!(fx.tls.seen().len(), 1);
    assert_eq!(fx.tls.count("/echo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_in_a_tunnel_is_decided_on_its_own() {
    let fx = fixture(ECHO_ONLY).await;
    let host = fx.authority();
    let mut sender = h1(fx.tunnel(&[b"http/1.1"]).await).await;
    for (path, allowed) in [("/echo", true), ("/status/200", false), ("/echo", true)] {
        let reply = send_h1(&mut sender, request("GET", path, Some(&host)))
            .await
            .unwrap();
        if allowed {
            assert_eq!(reply.status, 200, "h1 {path}: {reply}");
        } else {
            let (body, _) = assert_refused(&fx.proxy, &reply, 403, "denied").await;
            assert_eq!(body["resource"], "Ostiary::Host::\"api.example.test\"");
        }
    }
    let mut sender = h2(fx.tunnel(&[b"h2"]).await).await;
    for (path, allowed) in [
        ("/status/200", false),
        ("/echo", true),
        ("/status/201", false),
    ] {
        let reply = send_h2(&mut sender, request("GET", &fx.tls.url(path), None))
            .await
            .unwrap();
        if allowed {
            assert_eq!(reply.status, 200, "h2 {path}: {reply}");
        } else {
            assert_refused(&fx.proxy, &reply, 403, "denied").await;
        }
    }
    assert_eq!(fx.tls.count("/echo"), 3);
    assert_eq!(fx.tls.seen().len(), 3, "no denied path was forwarded");
}

// ---------------------------------------------------------------------------------------
// Smuggling and malformed heads
// ---------------------------------------------------------------------------------------

/// The request bytes of one smuggling shape, for `target` with `Host: host` and the
/// proxy-auth line `auth` (empty inside a tunnel).
fn smuggling_request(case: &str, target: &str, host: &str, auth: &str) -> Vec<u8> {
    let head = |version: &str| format!("POST {target} {version}\r\nHost: {host}\r\n{auth}");
    let text = |version: &str, rest: &str| format!("{}{rest}", head(version)).into_bytes();
    match case {
        "cl_te" => text(
            "HTTP/1.1",
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        "te_cl" => text(
            "HTTP/1.1",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        ),
        "duplicate_content_length_equal" => text(
            "HTTP/1.1",
            "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        ),
        "duplicate_content_length_different" => text(
            "HTTP/1.1",
            "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        ),
        "te_on_http10" => text("HTTP/1.0", "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        "bare_lf" => text("HTTP/1.1", "X-Bare: lf\nContent-Length: 0\r\n\r\n"),
        "obs_fold" => text(
            "HTTP/1.1",
            "X-Folded: first\r\n second\r\nContent-Length: 0\r\n\r\n",
        ),
        "chunk_size_overflow" => text(
            "HTTP/1.1",
            "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF1\r\nhello\r\n0\r\n\r\n",
        ),
        "nul_in_header_value" => text("HTTP/1.1", "X-Nul: a\0b\r\nContent-Length: 0\r\n\r\n"),
        "cr_in_header_value" => text("HTTP/1.1", "X-Cr: a\rb\r\nContent-Length: 0\r\n\r\n"),
        "non_utf8_header_value" => {
            let mut bytes = head("HTTP/1.1").into_bytes();
            bytes.extend_from_slice(b"X-Bin: caf\xe9\xff\r\nContent-Length: 0\r\n\r\n");
            bytes
        }
        other => panic!("unknown smuggling case {other}"),
    }
}

/// Send `bytes` on `io` and read the answer; the peer may close while we still write.
async fn send_and_read<S: AsyncRead + AsyncWrite + Unpin>(io: S, bytes: &[u8]) -> Reply {
    let mut wire = Wire::new(io);
    // A refusal may come (and the connection close) before every byte was accepted.
    let _ = wire.send(bytes).await;
    wire.response()
        .await
        .unwrap_or_else(|e| panic!("no answer to a malformed request: {e}"))
}

/// 400 `bad_request` with its audit record, and nothing forwarded.
async fn assert_smuggling_refused(fx: &Fixture, reply: &Reply, case: &str) {
    let (_, record) = assert_refused(&fx.proxy, reply, 400, "bad_request").await;
    assert!(record.reason.is_some(), "{case}: {record:#?}");
    fx.assert_upstreams_untouched();
}

async fn smuggle_plain(case: &str) {
    let fx = fixture(ALLOW_ALL).await;
    let target = fx.plain.url("/echo");
    let host = format!("api.example.test:{}", fx.plain.port());
    let bytes = smuggling_request(case, &target, &host, &auth_line(&fx.session.token));
    let stream = TcpStream::connect(fx.proxy.proxy_addr).await.unwrap();
    let reply = send_and_read(stream, &bytes).await;
    assert_smuggling_refused(&fx, &reply, case).await;
}

async fn smuggle_tunnel(case: &str) {
    let fx = fixture(ALLOW_ALL).await;
    let bytes = smuggling_request(case, "/echo", &fx.authority(), "");
    let reply = send_and_read(fx.tunnel(&[b"http/1.1"]).await, &bytes).await;
    assert_smuggling_refused(&fx, &reply, case).await;
}

macro_rules! smuggling_tests {
    ($($case:ident),* $(,)?) => {
        /// Each shape in absolute form on the proxy listener.
        mod smuggling_plain {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::smuggle_plain(stringify!($case)).await;
                }
            )*
        }
        /// Each shape inside an intercepted HTTP/1.1 tunnel.
        mod smuggling_tunnel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::smuggle_tunnel(stringify!($case)).await;
                }
            )*
        }
    };
}

smuggling_tests!(
    cl_te,
    te_cl,
    duplicate_content_length_equal,
    duplicate_content_length_different,
    te_on_http10,
    bare_lf,
    obs_fold,
    chunk_size_overflow,
    nul_in_header_value,
    cr_in_header_value,
    non_utf8_header_value,
);

/// A head with one `kib` KiB header (`X-Big`); the agent's limit is 64 KiB.
fn big_header_request(target: &str, host: &str, auth: &str, kib: usize) -> Vec<u8> {
    let big = "a".repeat(kib * 1024);
    format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\n{auth}X-Big: {big}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

async fn assert_431(fx: &Fixture, reply: &Reply) {
    let (body, _) = assert_refused(&fx.proxy, reply, 431, "bad_request").await;
    assert_eq!(body["reason"], "header_too_large", "{reply}");
    fx.assert_upstreams_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_on_the_plain_listener_is_431() {
    let fx = fixture(ALLOW_ALL).await;
    let host = format!("api.example.test:{}", fx.plain.port());
    let bytes = big_header_request(
        &fx.plain.url("/echo"),
        &host,
        &auth_line(&fx.session.token),
        100,
    );
    let stream = TcpStream::connect(fx.proxy.proxy_addr).await.unwrap();
    let reply = send_and_read(stream, &bytes).await;
    assert_431(&fx, &reply).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_inside_a_tunnel_is_431() {
    let fx = fixture(ALLOW_ALL).await;
    let bytes = big_header_request("/echo", &fx.authority(), "", 100);
    let reply = send_and_read(fx.tunnel(&[b"http/1.1"]).await, &bytes).await;
    assert_431(&fx, &reply).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// A head just inside the limit (one 60 KiB header) is the agent's to send: hyper's own
/// buffer bound (`max_buf_size`, lowered so a streaming connection holds less) must not
/// refuse what the wire guard accepts.
async fn a_head_just_inside_the_limit_is_forwarded_on_both_listeners() {
    let fx = fixture(ALLOW_ALL).await;
    let host = format!("api.example.test:{}", fx.plain.port());
    // /reflect answers with the header it got (`x-reflect-x-big`): the upstream's head is
    // as large, and within the upstream side's bound too.
    let token = auth_line(&fx.session.token);
    let bytes = big_header_request(&fx.plain.url("/reflect"), &host, &token, 60);
    let stream = TcpStream::connect(fx.proxy.proxy_addr).await.unwrap();
    let reply = send_and_read(stream, &bytes).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.headers["x-reflect-x-big"].len(), 60 * 1024);
    let bytes = big_header_request("/reflect", &fx.authority(), "", 60);
    let reply = send_and_read(fx.tunnel(&[b"http/1.1"]).await, &bytes).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.headers["x-reflect-x-big"].len(), 60 * 1024);
}

/// An upstream answer whose head is past 64 KiB (`forward::MAX_UPSTREAM_HEAD_BYTES`) is a 502,
/// audited, never passed on: the same whether hyper's buffer refused it (a head that came in
/// several reads) or the bound did (one read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_head_past_the_read_buffer_is_502() {
    let fx = fixture_with(ALLOW_ALL, "[proxy]\nmax_header_bytes = 262144\n").await;
    let bytes = big_header_request("/reflect", &fx.authority(), "", 100);
    let reply = send_and_read(fx.tunnel(&[b"http/1.1"]).await, &bytes).await;
    let (body, _) = assert_refused(&fx.proxy, &reply, 502, "upstream_error").await;
    assert!(reply.headers.get("x-reflect-x-big").is_none(), "{reply}");
    let reason = body["reason"].as_str().unwrap_or_default().to_owned();
    assert!(
        reason.contains("too large") || reason.contains("head"),
        "{body}"
    );
}

const SLOW_HEADERS: &str = "[proxy]\nheader_read_timeout = \"1s\"\n";

/// Dribble a header one byte every 500 ms; the proxy must close the connection within a
/// few seconds (header_read_timeout = 1s). Returns how long it took.
async fn dribble_until_closed<S>(io: S, head: &str) -> Duration
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(8);
    let (mut reader, mut writer) = tokio::io::split(io);
    writer.write_all(head.as_bytes()).await.unwrap();
    let dribble = async {
        for byte in b"X-Slow: ".iter().chain(b"z".repeat(100).iter()).cycle() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if writer.write_all(&[*byte]).await.is_err() || writer.flush().await.is_err() {
                break;
            }
        }
        // The write side failed: wait for the read side to report the close as well.
        std::future::pending::<()>().await;
    };
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // A 408 or similar may precede the close; keep reading to the end.
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        () = closed => {}
        () = dribble => unreachable!(),
        () = tokio::time::sleep_until(deadline) => {
            panic!("a slowloris connection was still open after {:?}", deadline - started)
        }
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_on_the_plain_listener_is_closed() {
    let fx = fixture_with(ALLOW_ALL, SLOW_HEADERS).await;
    let head = format!(
        "GET {} HTTP/1.1\r\nHost: api.example.test\r\n{}",
        fx.plain.url("/echo"),
        auth_line(&fx.session.token)
    );
    let stream = TcpStream::connect(fx.proxy.proxy_addr).await.unwrap();
    let took = dribble_until_closed(stream, &head).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    fx.assert_upstreams_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_inside_a_tunnel_is_closed() {
    let fx = fixture_with(ALLOW_ALL, SLOW_HEADERS).await;
    let head = format!("GET /echo HTTP/1.1\r\nHost: {}\r\n", fx.authority());
    let took = dribble_until_closed(fx.tunnel(&[b"http/1.1"]).await, &head).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    fx.assert_upstreams_untouched();
}

// ---------------------------------------------------------------------------------------
// Path confusion
// ---------------------------------------------------------------------------------------

const NO_ADMIN: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("no-admin")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.path like "/admin*" };
"#;

/// The newest `http` audit record (requests here are sent one after another).
async fn last_http_record(proxy: &TestProxy) -> ostiary::audit::AuditRecord {
    proxy
        .audit()
        .await
        .into_iter()
        .rev()
        .find(|r| r.kind == "http")
        .expect("an http audit record")
}

/// Paths as sent, and as decided and forwarded: only RFC 3986's equivalences are applied
/// (escape hex uppercased; `/%61dmin` is `/admin` — see the test after the next).
const CONFUSING_PATHS: &[(&str, &str)] = &[
    ("/a;x=1", "/a;x=1"),
    ("//double", "//double"),
    ("/a%2fb", "/a%2Fb"),
    ("/a%2Fb", "/a%2Fb"),
    ("/ADMIN", "/ADMIN"),
    ("/.well-known/x", "/.well-known/x"),
    ("/a..b", "/a..b"),
    ("/%7Ex", "/~x"),
];

/// Dot-segments are refused outright: upstreams resolve them differently, so a path rule
/// could be walked around with them.
const DOT_SEGMENT_PATHS: &[&str] = &[
    "/a/%2e%2e/secret",
    "/a/../b",
    "/a/./b",
    "/echo/../admin",
    "/echo/%2E%2e/admin",
];

/// Asserts, for one forwarded request, that the path the policy saw (audit) is the path the
/// upstream received, byte for byte, and that both are `decided`.
async fn assert_same_path(
    proxy: &TestProxy,
    upstream: &Upstream,
    (sent, decided): (&str, &str),
    reply: &Reply,
) {
    assert_ne!(
        reply.status, 403,
        "{sent} was not expected to be denied:\n{reply}"
    );
    let record = last_http_record(proxy).await;
    let seen = upstream.seen();
    let last = seen
        .last()
        .unwrap_or_else(|| panic!("{sent} was not forwarded"));
    assert_eq!(record.path.as_deref(), Some(decided), "policy saw");
    assert_eq!(last.path_only(), decided, "upstream received");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_sees_exactly_the_path_the_upstream_receives() {
    let fx = fixture(NO_ADMIN).await;
    // Inside a tunnel, raw h1 so that no client library rewrites the path.
    let mut wire = Wire::new(fx.tunnel(&[b"http/1.1"]).await);
    for &(path, decided) in CONFUSING_PATHS {
        wire.send(format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", fx.authority()).as_bytes())
            .await
            .unwrap();
        let reply = wire.response().await.unwrap();
        assert_same_path(&fx.proxy, &fx.tls, (path, decided), &reply).await;
    }
    // In absolute form on the plain listener.
    for &(path, decided) in CONFUSING_PATHS {
        let url = format!("http://api.example.test:{}{path}", fx.plain.port());
        let reply = absolute_get(&fx.proxy, &url, &auth_line(&fx.session.token)).await;
        assert_same_path(&fx.proxy, &fx.plain, (path, decided), &reply).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_are_refused_and_never_forwarded() {
    let fx = fixture(NO_ADMIN).await;
    let mut wire = Wire::new(fx.tunnel(&[b"http/1.1"]).await);
    for &path in DOT_SEGMENT_PATHS {
        wire.send(format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", fx.authority()).as_bytes())
            .await
            .unwrap();
        let reply = wire.response().await.unwrap();
        let (body, record) = assert_refused(&fx.proxy, &reply, 400, "bad_request").await;
        assert!(
            body["reason"].as_str().unwrap().contains("dot-segment"),
            "{body}"
        );
        assert_eq!(record.path, None, "refused before the path was accepted");
    }
    for &path in DOT_SEGMENT_PATHS {
        let url = format!("http://api.example.test:{}{path}", fx.plain.port());
        let reply = absolute_get(&fx.proxy, &url, &auth_line(&fx.session.token)).await;
        assert_refused(&fx.proxy, &reply, 400, "bad_request").await;
    }
    assert!(fx.tls.seen().is_empty() && fx.plain.seen().is_empty());
}

/// An escaped unreserved character is that character (RFC 3986 §6.2.2.2): `/%61dmin` is
/// `/admin` to the policy and to the upstream, which receives the normalised path, so a
/// forbid on a path prefix cannot be walked around by spelling. Other escapes stay escapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_unreserved_characters_are_the_characters_to_policy_and_upstream() {
    let fx = fixture(NO_ADMIN).await;
    let mut sender = h1(fx.tunnel(&[b"http/1.1"]).await).await;
    let host = fx.authority();
    // `%61` is `a` (RFC 3986 §6.2.2.2): every spelling of /admin is /admin to the policy.
    for (path, seen_as) in [
        ("/admin", "/admin"),
        ("/admin/users", "/admin/users"),
        ("/adminx", "/adminx"),
        ("/%61dmin", "/admin"),
        ("/%61%64%6D%69%6e", "/admin"),
        ("/%41dmin/../x", ""),
    ] {
        let reply = send_h1(&mut sender, request("GET", path, Some(&host)))
            .await
            .unwrap();
        if seen_as.is_empty() {
            assert_refused(&fx.proxy, &reply, 400, "bad_request").await;
            continue;
        }
        let (body, record) = assert_refused(&fx.proxy, &reply, 403, "denied").await;
        assert_eq!(body["policies"], serde_json::json!(["no-admin"]), "{path}");
        assert_eq!(record.path.as_deref(), Some(seen_as), "{path}");
    }
    assert!(fx.tls.seen().is_empty());
    // Escapes of anything else stay escapes (hex uppercased, the same URI), and the
    // upstream receives exactly the path the policy decided on.
    for (path, normal) in [
        ("/a%2fb", "/a%2Fb"),
        ("/%7euser", "/~user"),
        ("/x%20y", "/x%20y"),
    ] {
        let before = fx.tls.seen().len();
        let reply = send_h1(&mut sender, request("GET", path, Some(&host)))
            .await
            .unwrap();
        assert_eq!(
            reply.status, 404,
            "forwarded; no such route upstream:\n{reply}"
        );
        assert_eq!(
            last_http_record(&fx.proxy).await.path.as_deref(),
            Some(normal)
        );
        let seen = fx.tls.seen();
        assert_eq!(seen.len(), before + 1);
        assert_eq!(
            seen[before].path, normal,
            "the upstream got the decided path"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The shape of Ostiary's own refusals
// ---------------------------------------------------------------------------------------

fn keys(body: &Value) -> Vec<String> {
    let mut keys: Vec<String> = body.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_carries_a_request_id_and_one_json_shape() {
    let tls_up = Upstream::builder().start().await;
    let stub = StubResolver::default();
    let dialer = RecordingDialer::default();
    let proxy = TestProxy::start(ProxySpec {
        policies: ECHO_ONLY.into(),
        ports: vec![tls_up.port()],
        upstream_ca_pem: Some(tls_up.ca_pem()),
        options: Options {
            resolver: Arc::new(stub.clone()),
            dialer: Arc::new(dialer.clone()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let session = proxy.session("shape-agent").await;
    let auth = auth_line(&session.token);
    let base = ["error", "message", "request_id"];
    let with = |extra: &[&str]| {
        let mut all: Vec<String> = base.iter().chain(extra).map(|s| s.to_string()).collect();
        all.sort();
        all
    };

    // 400: https:// in absolute form must use CONNECT.
    let reply = absolute_get(&proxy, "https://api.example.test/echo", &auth).await;
    let (body, _) = assert_refused(&proxy, &reply, 400, "bad_request").await;
    assert_eq!(keys(&body), with(&["reason"]), "{body}");

    // 407
    let reply = absolute_get(&proxy, "http://api.example.test/echo", "").await;
    let (body, _) = assert_refused(&proxy, &reply, 407, "unauthenticated").await;
    assert_eq!(keys(&body), with(&["reason"]), "{body}");

    // 403 destination_blocked (the stub answers a private address; nothing is dialed).
    stub.answer("private.test", vec![vec!["10.0.0.1".parse().unwrap()]]);
    let (_, reply) = connect(proxy.proxy_addr, "private.test:443", &auth).await;
    let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
    assert_eq!(keys(&body), with(&["address", "reason"]), "{body}");

    // 403 denied and 421, inside one tunnel.
    let authority = format!("api.example.test:{}", tls_up.port());
    let mut sender = h1(intercepted(
        &proxy,
        &session.token,
        "api.example.test",
        tls_up.port(),
        &[b"http/1.1"],
    )
    .await)
    .await;
    let reply = send_h1(&mut sender, request("GET", "/other", Some(&authority)))
        .await
        .unwrap();
    let (body, _) = assert_refused(&proxy, &reply, 403, "denied").await;
    assert_eq!(
        keys(&body),
        with(&["action", "policies", "resource"]),
        "{body}"
    );
    let reply = send_h1(&mut sender, request("GET", "/echo", Some("other.test")))
        .await
        .unwrap();
    let (body, _) = assert_refused(&proxy, &reply, 421, "misdirected_request").await;
    assert_eq!(keys(&body), with(&["host", "tunnel"]), "{body}");

    assert!(tls_up.seen().is_empty());
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}
