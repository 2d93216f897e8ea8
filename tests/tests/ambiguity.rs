//! What the proxy decides is what the upstream executes (THREATS: "Authority and
//! ambiguity"). The upstream here is deliberately lenient (`clients/lenient_upstream.py`):
//! it decodes JSON as Go's `encoding/json` fills a struct (keys folded to lower case, the
//! last of equal keys wins) and routes paths loosely (slashes merged, `;parameters` cut,
//! `%2F` as `/`, a trailing slash dropped), and it logs every request it receives. A policy
//! lets plain `http` through to both hosts, so anything *not* recognised as the tool would
//! reach it: every ambiguous spelling must be refused (400) or decided as the tool, and the
//! log shows that nothing ambiguous arrived.

use std::path::PathBuf;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use ostiary_e2e::clients::PyTlsServer;
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, Reply};
use serde_json::{json, Value};

const API: &str = "api.lenient.test";
const MCP: &str = "mcp.lenient.test";

const POLICIES: &str = r#"
// Plain http to both hosts is allowed: only a request decided as a tool call is bounded.
@id("http-anything")
permit (principal, action == Ostiary::Action::"http", resource);

@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource)
when { ["initialize", "ping"].contains(context.method) };

@id("reads")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("small-refunds")
permit (principal, action in Ostiary::Action::"tier:high_impact", resource)
when { context.impact.records <= 100 };
"#;

fn tools_toml(port: u16) -> String {
    format!(
        r#"
[[tool]]
name = "pay.bulk_refund"
tier = "high_impact"
match = {{ host = "{API}", method = "POST", path = "/v1/refunds/bulk" }}
impact = {{ records = "/ids" }}

[[tool]]
name = "files.read"
tier = "read"
match = {{ mcp = "https://{MCP}:{port}/mcp", tool = "read_file" }}

[[tool]]
name = "files.delete"
tier = "irreversible"
match = {{ mcp = "https://{MCP}:{port}/mcp", tool = "delete_file" }}
"#
    )
}

/// The lenient upstream, killed on drop; `seen()` reads its log.
struct Lenient {
    port: u16,
    log: PathBuf,
    _server: PyTlsServer,
}

impl Lenient {
    async fn start(ca: &TestCa) -> Self {
        let server = PyTlsServer::start(ca, &[API, MCP], "lenient_upstream.py", |dir| {
            vec![dir.join("seen.jsonl").into()]
        })
        .await;
        Self {
            port: server.port,
            log: server.dir.path().join("seen.jsonl"),
            _server: server,
        }
    }

    /// Every request the upstream received, in order.
    fn seen(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

struct Rig {
    upstream: Lenient,
    proxy: TestProxy,
    token: String,
}

impl Rig {
    async fn start() -> Self {
        let ca = TestCa::new();
        let upstream = Lenient::start(&ca).await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(tools_toml(upstream.port)),
            names: vec![API.into(), MCP.into()],
            ports: vec![upstream.port],
            upstream_ca_pem: Some(ca.ca_pem()),
            ..Default::default()
        })
        .await;
        let token = proxy.session("agent").await.token;
        Self {
            upstream,
            proxy,
            token,
        }
    }

    /// `method path` with `body` to `host`, through an intercepted tunnel.
    async fn send(&self, host: &str, method: &str, path: &str, body: impl Into<Bytes>) -> Reply {
        self.send_with(host, method, path, &[], body).await
    }

    /// [`Self::send`] with extra `headers`.
    async fn send_with(
        &self,
        host: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let tls = raw::intercepted(
            &self.proxy,
            &self.token,
            host,
            self.upstream.port,
            &[b"http/1.1"],
        )
        .await;
        let mut sender = raw::h1(tls).await;
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(path)
            .header("host", format!("{host}:{}", self.upstream.port))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(body.into())).unwrap();
        raw::send_h1(&mut sender, req).await.expect("exchange")
    }

    /// Send, expect `400 bad_request` naming an ambiguity, and check nothing reached the
    /// upstream.
    async fn refused(&self, host: &str, method: &str, path: &str, body: &str, what: &str) {
        let before = self.upstream.seen().len();
        let reply = self.send(host, method, path, body.to_owned()).await;
        let (answer, record) = raw::assert_refused(&self.proxy, &reply, 400, "bad_request").await;
        let reason = answer["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("ambiguous"), "{what}: {reason}");
        assert_eq!(record.decision, "deny", "{what}: {record:#?}");
        assert_eq!(
            self.upstream.seen().len(),
            before,
            "{what}: reached the upstream"
        );
    }
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("re_{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_json_never_reaches_a_case_insensitive_upstream() {
    let rig = Rig::start().await;
    let many = json!(ids(5000));

    // The control: a small batch is decided as the tool, allowed, and the upstream reads
    // exactly what was decided.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/refunds/bulk",
            json!({"ids": ["re_1"]}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.json()["decoded"]["ids"], json!(["re_1"]), "{reply}");
    let records = rig.proxy.audit().await;
    let record = records.iter().rev().find(|r| r.kind == "http").unwrap();
    assert_eq!(
        record.tool.as_deref(),
        Some("pay.bulk_refund"),
        "{record:#?}"
    );
    assert_eq!(record.decision, "allow", "{record:#?}");
    // A large one is denied by the tool's policy.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/refunds/bulk",
            json!({"ids": many}).to_string(),
        )
        .await;
    raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;

    // The attack: one record for the proxy, 5,000 for a decoder that folds case or keeps
    // the last duplicate. Every spelling is refused before policy, and never forwarded.
    let many_text = many.to_string();
    for (body, what) in [
        (
            format!(r#"{{"ids":["re_1"],"IDS":{many_text}}}"#),
            "case-folded",
        ),
        (
            format!(r#"{{"ids":["re_1"],"Ids":{many_text}}}"#),
            "mixed case",
        ),
        (
            format!(r#"{{"ids":["re_1"],"ids":{many_text}}}"#),
            "duplicate",
        ),
        (
            format!(r#"{{"ids":["re_1"],"\u0049DS":{many_text}}}"#),
            "escaped",
        ),
        (
            format!(r#"{{"ids":["re_1"],"\u0069ds":{many_text}}}"#),
            "escaped duplicate",
        ),
        (
            r#"{"meta":{"k":1,"K":2},"ids":["re_1"]}"#.to_owned(),
            "nested",
        ),
        (
            format!(r#"{{"ids":["re_1"],"ids\u0000":{many_text}}}"#),
            "NUL",
        ),
    ] {
        rig.refused(API, "POST", "/v1/refunds/bulk", &body, what)
            .await;
    }
    // The query is arguments too: a key twice, or in the query and the body.
    rig.refused(
        API,
        "POST",
        "/v1/refunds/bulk?note=a&NOTE=b",
        "{}",
        "query twice",
    )
    .await;
    rig.refused(
        API,
        "POST",
        "/v1/refunds/bulk?ids=x",
        r#"{"ids":["re_1"]}"#,
        "query and body",
    )
    .await;

    // A second Content-Type: JSON for the proxy, a form for an upstream that takes the last.
    let before = rig.upstream.seen().len();
    let reply = rig
        .send_with(
            API,
            "POST",
            "/v1/refunds/bulk",
            &[("content-type", "application/x-www-form-urlencoded")],
            r#"{"note":"&ids=1&ids=2&ids=3"}"#,
        )
        .await;
    raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
    assert_eq!(
        rig.upstream.seen().len(),
        before,
        "two content types reached the upstream"
    );

    // JSON-RPC: `ping` for the proxy, `tools/call delete_file` for the server.
    let url_path = "/mcp";
    for (body, what) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"delete_file","arguments":{}}}"#,
            "method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"delete_file"}}"#,
            "duplicate method",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","NAME":"delete_file"}}"#,
            "tool name",
        ),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping","METHOD":"tools/call","params":{"name":"delete_file"}}]"#,
            "in a batch",
        ),
    ] {
        rig.refused(MCP, "POST", url_path, body, what).await;
    }
    // The control: a plain ping is forwarded and read as a ping.
    let reply = rig
        .send(
            MCP,
            "POST",
            url_path,
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        reply.json()["result"]["decoded"]["method"],
        "ping",
        "{reply}"
    );

    // Everything the upstream received was unambiguous: re-read strictly, it is what the
    // lenient decoder read.
    for seen in rig.upstream.seen() {
        let body = seen["body"].as_str().unwrap();
        if body.is_empty() {
            continue;
        }
        assert!(
            ostiary::strict_json::parse(body.as_bytes()).is_ok(),
            "an ambiguous body reached the upstream: {seen}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_an_upstream_routes_to_a_tool_are_decided_as_the_tool_or_refused() {
    let rig = Rig::start().await;
    let many = json!({"ids": ids(500)}).to_string();
    // Decided as the tool (and denied by its policy: 500 records), never as plain http,
    // which would be allowed: a trailing slash, the method in another case, an encoded
    // unreserved character.
    for (method, path) in [
        ("POST", "/v1/refunds/bulk/"),
        ("post", "/v1/refunds/bulk"),
        ("Post", "/v1/refunds/bulk/"),
        ("POST", "/v1/%72efunds/bulk"),
        ("POST", "/v1/refunds/%62%75%6C%6B"),
        ("POST", "/v1/refunds/bulk?x=1"),
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(API, method, path, many.clone()).await;
        let (_, record) = raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
        assert_eq!(
            record.tool.as_deref(),
            Some("pay.bulk_refund"),
            "{method} {path}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{method} {path} reached the upstream"
        );
    }
    // Refused: only a lenient upstream routes them to the tool.
    for path in [
        "//v1/refunds/bulk",
        "/v1//refunds/bulk",
        "/v1/refunds//bulk",
        "/v1/refunds/bulk;jsessionid=1",
        "/v1;x/refunds/bulk",
        "/v1/refunds%2Fbulk",
        "/v1/refunds%2fbulk",
        "/v1/refunds%5Cbulk",
        "/v1/refunds/bulk//",
    ] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(API, "POST", path, many.clone()).await;
        let (answer, _) = raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            answer["reason"]
                .as_str()
                .unwrap()
                .contains("pay.bulk_refund"),
            "{path}: {answer}"
        );
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{path} reached the upstream"
        );
    }
    // The normalised path is what is forwarded: an allowed call sent with an encoded
    // unreserved character arrives decoded.
    let reply = rig
        .send(
            API,
            "POST",
            "/v1/%72efunds/bulk",
            json!({"ids": ["re_1"]}).to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{reply}");
    let last = rig.upstream.seen().pop().unwrap();
    assert_eq!(last["path"], "/v1/refunds/bulk", "{last}");

    // The MCP endpoint: a trailing slash or `post` is the endpoint (its JSON-RPC decided:
    // delete_file has no permit), the lenient spellings are refused.
    let delete = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_file","arguments":{}}}"#;
    for (method, path) in [("POST", "/mcp/"), ("post", "/mcp"), ("POST", "/%6Dcp")] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(MCP, method, path, delete).await;
        assert_eq!(reply.status, 200, "{method} {path}: {reply}");
        let answer = reply.json();
        assert_eq!(answer["error"]["code"], -32001, "{method} {path}: {reply}");
        assert_eq!(answer["error"]["data"]["error"], "denied", "{reply}");
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{method} {path} reached the upstream"
        );
    }
    for path in ["//mcp", "/mcp;x", "/mcp//", "/%2Fmcp"] {
        let before = rig.upstream.seen().len();
        let reply = rig.send(MCP, "POST", path, delete).await;
        raw::assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert_eq!(
            rig.upstream.seen().len(),
            before,
            "{path} reached the upstream"
        );
    }
}
