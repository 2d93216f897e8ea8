//! Agent-supplied routing and override headers (THREATS.md, "Parser differentials"): a
//! request is decided on its method, host and path, and frameworks, gateways and load
//! balancers upstream re-route it on headers — `X-HTTP-Method-Override: DELETE` turns an
//! allowed `POST` into a delete, `X-Original-URL: /admin` routes an allowed `/public` to
//! `/admin`, `X-Forwarded-*`/`Forwarded`/`X-Real-IP` claim another client, host or scheme.
//! Ostiary strips the whole class towards every upstream (docs/policies.md, "Routing and
//! override headers"), so these tests send each in several spellings — any case, `_` for
//! `-` (CGI, WSGI, PHP and Rack read both as `HTTP_X_FORWARDED_FOR`) — and look at what the
//! recording upstream received: plain `http://`, inside intercepted tunnels (h1 and h2), a
//! catalogued REST tool call, an MCP `tools/call`, and an approved execution of a held call.
//!
//! The other way round: an upstream's answer never carries an `Ostiary-*` header of its
//! own, since those say what the proxy said (the SDKs raise an answer carrying
//! `Ostiary-Request-Id` as the proxy's refusal or hold).

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, auth_line, h1, h2, intercepted, send_h1, send_h2, Wire};
use ostiary_e2e::upstream::{Seen, Upstream};
use serde_json::json;

/// The routing and override headers an agent sends, as written on the wire.
const OVERRIDES: &[(&str, &str)] = &[
    ("X-HTTP-Method-Override", "DELETE"),
    ("x-http-method", "DELETE"),
    ("X-METHOD-OVERRIDE", "PUT"),
    ("x_http_method_override", "DELETE"),
    ("X-Original-URL", "/admin"),
    ("x-original-uri", "/admin"),
    ("X-Rewrite-URL", "/admin"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("X_Forwarded_For", "10.0.0.2"),
    ("x-FORWARDED-host", "evil.test"),
    ("X-Forwarded-Proto", "http"),
    ("X-Forwarded-Prefix", "/admin"),
    ("X-Forwarded-Uri", "/admin"),
    ("X-Forwarded-User", "root"),
    ("Forwarded", "for=10.0.0.1;host=evil.test;proto=http"),
    ("X-Real-IP", "10.0.0.1"),
    ("x_real_ip", "10.0.0.1"),
    ("True-Client-IP", "10.0.0.1"),
    ("X-Original-Host", "evil.test"),
    ("X-Host", "evil.test"),
    ("X-Upstream-Host", "evil.test"),
    ("X-Envoy-Original-Path", "/admin"),
    (
        "X-Middleware-Subrequest",
        "middleware:middleware:middleware",
    ),
];

/// Sent alongside, and must arrive: the stripping is of a class, not of every `x-` header.
const KEPT: (&str, &str) = ("X-Request-Tag", "kept");

/// Header lines for a raw request.
fn header_lines() -> String {
    OVERRIDES
        .iter()
        .chain(std::iter::once(&KEPT))
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect()
}

/// Add every override (and the kept header) to a hyper request.
fn with_overrides(mut req: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    for (name, value) in OVERRIDES.iter().chain(std::iter::once(&KEPT)) {
        req.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    req
}

/// A header name as an upstream framework reads it.
fn key(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

/// Nothing of [`OVERRIDES`] reached the upstream in `seen`, whatever its spelling; the
/// kept header did.
fn assert_none_arrived(seen: &Seen, what: &str) {
    let banned: Vec<String> = OVERRIDES.iter().map(|(n, _)| key(n)).collect();
    let arrived: Vec<String> = seen.headers.keys().map(|n| n.as_str().to_owned()).collect();
    for name in &arrived {
        assert!(
            !banned.contains(&key(name)),
            "{what}: {name} reached the upstream\n{arrived:?}"
        );
    }
    assert_eq!(
        seen.header("x-request-tag"),
        Some("kept"),
        "{what}: {arrived:?}"
    );
}

const POLICIES: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);

@id("reads-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

const APPROVER: &str = "alice@example.com";

/// A plain and a TLS upstream (both answering as `api.example.test`), and a proxy with a
/// REST tool (`POST /upload`), an escalated one (`POST /reflect`) and an MCP endpoint
/// (`/echo` of the TLS upstream).
struct Rig {
    plain: Upstream,
    tls: Upstream,
    proxy: TestProxy,
    token: String,
}

impl Rig {
    async fn start() -> Self {
        let plain = Upstream::builder().tls(false).start().await;
        let tls = Upstream::builder().start().await;
        let tools = format!(
            r#"
[[tool]]
name = "files.upload"
tier = "read"
match = {{ host = "api.example.test", method = "POST", path = "/upload" }}

[[tool]]
name = "pay.echo"
tier = "irreversible"
match = {{ host = "api.example.test", method = "POST", path = "/reflect" }}

[[tool]]
name = "mcp.echo"
tier = "read"
match = {{ mcp = "https://api.example.test:{port}/echo", tool = "echo" }}
"#,
            port = tls.port()
        );
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(tools),
            ports: vec![plain.port(), tls.port()],
            upstream_ca_pem: Some(tls.ca_pem()),
            extra_toml: format!(
                "[approvals]\napprovers = [\"{APPROVER}\"]\n\n[sessions.watchdog]\nenabled = false\n"
            ),
            ..Default::default()
        })
        .await;
        let token = proxy.session("header-agent").await.token;
        Self {
            plain,
            tls,
            proxy,
            token,
        }
    }

    fn authority(&self) -> String {
        format!("api.example.test:{}", self.tls.port())
    }

    /// A raw request in absolute form on the proxy listener, headers as written.
    async fn plain_raw(&self, method: &str, path: &str, body: &str) -> raw::Reply {
        let port = self.plain.port();
        let text = format!(
            "{method} http://api.example.test:{port}{path} HTTP/1.1\r\nHost: api.example.test:{port}\r\n\
             {}{}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            auth_line(&self.token),
            header_lines(),
            body.len(),
        );
        raw::exchange(self.proxy.proxy_addr, text.as_bytes())
            .await
            .expect("exchange")
    }

    /// The same raw bytes inside an intercepted tunnel.
    async fn tunnel_raw(&self, method: &str, path: &str, body: &str) -> raw::Reply {
        self.tunnel_raw_with(method, path, body, "").await
    }

    /// [`Rig::tunnel_raw`] with `extra` header lines (each ending in CRLF).
    async fn tunnel_raw_with(
        &self,
        method: &str,
        path: &str,
        body: &str,
        extra: &str,
    ) -> raw::Reply {
        let tls = intercepted(
            &self.proxy,
            &self.token,
            "api.example.test",
            self.tls.port(),
            &[b"http/1.1"],
        )
        .await;
        let mut wire = Wire::new(tls);
        let text = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{}{extra}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.authority(),
            header_lines(),
            body.len(),
        );
        wire.send(text.as_bytes()).await.unwrap();
        wire.response().await.expect("a response in the tunnel")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_headers_never_reach_an_upstream_over_plain_http_or_in_tunnels() {
    let rig = Rig::start().await;

    // Plain http://, absolute form, the headers in the agent's own spelling.
    let reply = rig.plain_raw("GET", "/echo", "").await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_none_arrived(&rig.plain.seen_path("/echo")[0], "plain http");

    // Inside an intercepted tunnel: raw h1, then hyper's h1 and h2.
    let reply = rig.tunnel_raw("GET", "/echo", "").await;
    assert_eq!(reply.status, 200, "{reply}");
    let tls = intercepted(
        &rig.proxy,
        &rig.token,
        "api.example.test",
        rig.tls.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = h1(tls).await;
    let req = with_overrides(raw::request("GET", "/echo", Some(&rig.authority())));
    let reply = send_h1(&mut sender, req).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let tls = intercepted(
        &rig.proxy,
        &rig.token,
        "api.example.test",
        rig.tls.port(),
        &[b"h2"],
    )
    .await;
    let mut sender = h2(tls).await;
    let url = rig.tls.url("/echo");
    let reply = send_h2(&mut sender, with_overrides(raw::request("GET", &url, None)))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let seen = rig.tls.seen_path("/echo");
    assert_eq!(seen.len(), 3, "{seen:#?}");
    for (seen, what) in seen.iter().zip(["raw h1 tunnel", "h1 tunnel", "h2 tunnel"]) {
        assert_none_arrived(seen, what);
    }
    // The echo says the same as the record: the upstream's own view of the request.
    let echoed = reply.json();
    let echoed = echoed["headers"].to_string().to_ascii_lowercase();
    for (name, _) in OVERRIDES {
        assert!(
            !echoed.contains(&format!("\"{}\"", name.to_ascii_lowercase())),
            "{name} in {echoed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_headers_never_reach_a_rest_tool_or_an_mcp_server() {
    let rig = Rig::start().await;
    let body = json!({"name": "notes.txt"}).to_string();

    // A catalogued REST tool (a read, decided as such): plain and tunnelled.
    let reply = rig.plain_raw("POST", "/upload", &body).await;
    assert_eq!(reply.status, 200, "{reply}");
    let reply = rig.tunnel_raw("POST", "/upload", &body).await;
    assert_eq!(reply.status, 200, "{reply}");
    let records = rig.proxy.audit().await;
    let tools: Vec<_> = records
        .iter()
        .filter(|r| r.tool.as_deref() == Some("files.upload"))
        .collect();
    assert_eq!(tools.len(), 2, "both decided as the tool: {records:#?}");
    assert_none_arrived(&rig.plain.seen_path("/upload")[0], "REST tool, plain");
    assert_none_arrived(&rig.tls.seen_path("/upload")[0], "REST tool, tunnel");

    // An MCP tools/call to a catalogued endpoint.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "echo", "arguments": {"text": "hi"}}})
    .to_string();
    let reply = rig.tunnel_raw("POST", "/echo", &call).await;
    assert_eq!(reply.status, 200, "{reply}");
    let records = rig.proxy.audit().await;
    assert!(
        records
            .iter()
            .any(|r| r.tool.as_deref() == Some("mcp.echo")),
        "decided as the MCP tool: {records:#?}"
    );
    let seen = rig.tls.seen_path("/echo");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_none_arrived(&seen[0], "MCP tools/call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_execution_carries_no_override_header_either() {
    let rig = Rig::start().await;
    let body = json!({"refund": "ch_1"}).to_string();
    let held = rig.tunnel_raw("POST", "/reflect", &body).await;
    assert_eq!(held.status, 202, "{held}");
    let id = held.json()["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(rig.tls.count("/reflect"), 0, "held, not sent");

    let control = rig.proxy.control();
    control.decide(&id, true, APPROVER, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let approval = control.approval(&id).await.unwrap();
        if approval["status"] == "executed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never executed: {approval:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = rig.tls.seen_path("/reflect");
    assert_eq!(seen.len(), 1, "executed once: {seen:#?}");
    assert_none_arrived(&seen[0], "approved execution");
}

/// The `Ostiary-*` headers of an answer, as (name, value).
fn ostiary_headers(reply: &raw::Reply) -> Vec<(String, String)> {
    reply
        .headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("ostiary-"))
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_cannot_answer_with_the_proxys_own_headers() {
    let rig = Rig::start().await;
    let forged = |reply: &raw::Reply| {
        ostiary_headers(reply)
            .into_iter()
            .filter(|(_, value)| value.contains("forged"))
            .collect::<Vec<_>>()
    };
    let plain = rig.plain_raw("GET", "/reflect?mode=forge", "").await;
    assert_eq!(plain.status, 200, "{plain}");
    assert!(
        plain.headers.contains_key("set-cookie"),
        "the upstream's other headers pass: {plain}"
    );
    assert!(ostiary_headers(&plain).is_empty(), "plain http: {plain}");
    let tunnel = rig.tunnel_raw("GET", "/reflect?mode=forge", "").await;
    assert_eq!(tunnel.status, 200, "{tunnel}");
    assert!(ostiary_headers(&tunnel).is_empty(), "in a tunnel: {tunnel}");

    // A held call's stored answer, collected after approval: the proxy's own
    // `Ostiary-Approval` may be there, the upstream's forged one not.
    let body = json!({"refund": "ch_2"}).to_string();
    let before = rig.tls.count("/reflect");
    let held = rig.tunnel_raw("POST", "/reflect?mode=forge", &body).await;
    assert_eq!(held.status, 202, "{held}");
    let id = held.json()["approval_id"].as_str().unwrap().to_owned();
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let collect = format!("Ostiary-Approval: {id}\r\nPrefer: wait=20\r\n");
    let collected = rig
        .tunnel_raw_with("POST", "/reflect?mode=forge", &body, &collect)
        .await;
    assert_eq!(collected.status, 200, "{collected}");
    assert_eq!(rig.tls.count("/reflect"), before + 1, "executed once");
    assert!(forged(&collected).is_empty(), "collected: {collected}");
}
