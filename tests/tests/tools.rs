//! REST tool calls end to end: curl through the proxy to a TLS upstream, with a tool catalog
//! and tier policies. A request matching a catalogued route is decided as
//! `Action::"tool:<name>"` with its arguments (path, query, JSON body); anything else stays
//! `Action::"http"`. Refused calls never reach the upstream.

use ostiary_e2e::clients::{curl, CmdOutput};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use sha2::{Digest, Sha256};

const TOOLS: &str = r#"
[[tool]]
name = "gh.create_issue"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/repos/{owner}/{repo}/issues" }
args_schema = { type = "object", required = ["title"], properties = { title = { type = "string" } } }
cost = 0.001

[[tool]]
name = "gh.get_repo"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/repos/{owner}/{repo}" }

[[tool]]
name = "gh.delete_repo"
tier = "irreversible"
match = { host = "api.example.test", method = "DELETE", path = "/repos/{owner}/{repo}" }
"#;

const POLICIES: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("write-with-title")
permit (principal, action in Ostiary::Action::"tier:write", resource)
when { context.args.title != "" };

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };

@id("http-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" || context.path == "/repos/a/issues" };
"#;

/// 1 KiB, so the over-limit test needs no large file.
const LIMIT: usize = 1024;

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    env: Vec<(String, String)>,
}

impl Rig {
    async fn start(policies: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: policies.into(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: format!("[proxy]\nmax_tool_body_bytes = {LIMIT}\n"),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        let env = proxy.client_env(&session);
        Self {
            upstream,
            proxy,
            env,
        }
    }

    /// `curl -X method url` with an optional JSON body given as a file; the status code is
    /// the last line of stdout.
    async fn call(&self, method: &str, path: &str, body: Option<&[u8]>) -> Reply {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let url = self.upstream.url(path);
        let file = self.proxy.dir.path().join("body.json");
        let data = format!("@{}", file.display());
        let mut args = vec!["--http1.1", "-X", method, "-w", "\n%{http_code}", &url];
        if let Some(body) = body {
            std::fs::write(&file, body).unwrap();
            args.extend([
                "-H",
                "content-type: application/json",
                "--data-binary",
                &data,
            ]);
        }
        Reply(curl(&args, &env).await)
    }
}

struct Reply(CmdOutput);

impl Reply {
    fn status(&self) -> u16 {
        let out = &self.0;
        let last = out.stdout.lines().last().unwrap_or_default();
        last.parse()
            .unwrap_or_else(|_| panic!("no status in curl output: {out}"))
    }

    fn json(&self) -> Value {
        let text = self
            .0
            .stdout
            .rsplit_once('\n')
            .map(|(b, _)| b)
            .unwrap_or("");
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {}", self.0))
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_decided_by_tier_and_arguments() {
    let rig = Rig::start(POLICIES).await;

    // read: allowed, forwarded with its exact body.
    let read_body = br#"{"fields": ["name"]}"#;
    let read = rig
        .call("GET", "/repos/acme/widgets", Some(read_body))
        .await;
    assert_eq!(
        read.status(),
        404,
        "forwarded (the upstream has no such route): {}",
        read.0
    );
    let seen = rig.upstream.seen_path("/repos/acme/widgets");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body_sha256.as_deref(),
        Some(sha256_hex(read_body).as_str())
    );

    // write with a valid body: allowed, the upstream saw the exact bytes.
    let write_body = b"{ \"title\" : \"Bug \\u00e9\",\n  \"labels\": [1, 2] }";
    let write = rig
        .call("POST", "/repos/acme/widgets/issues", Some(write_body))
        .await;
    assert_eq!(write.status(), 404, "{}", write.0);
    let seen = rig.upstream.seen_path("/repos/acme/widgets/issues");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, "POST");
    assert_eq!(
        seen[0].body_sha256.as_deref(),
        Some(sha256_hex(write_body).as_str())
    );

    // write with an empty title: a policy's verdict (default deny), 403.
    let empty = rig
        .call(
            "POST",
            "/repos/acme/widgets/issues",
            Some(br#"{"title": ""}"#),
        )
        .await;
    assert_eq!(empty.status(), 403, "{}", empty.0);
    let body = empty.json();
    assert_eq!(body["error"], "denied");
    assert_eq!(body["action"], "Ostiary::Action::\"tool:gh.create_issue\"");
    assert_eq!(body["resource"], "Ostiary::Tool::\"gh.create_issue\"");

    // write with a title that is not a string: the arguments fail the schema, 422.
    let bad = rig
        .call(
            "POST",
            "/repos/acme/widgets/issues",
            Some(br#"{"title": 7}"#),
        )
        .await;
    assert_eq!(bad.status(), 422, "{}", bad.0);
    let body = bad.json();
    assert_eq!(body["error"], "check_failed");
    assert_eq!(body["check"], "args_schema");
    assert!(
        body["detail"].as_str().unwrap().contains("args.title"),
        "{body}"
    );
    // A missing required argument is the same failure.
    let missing = rig
        .call("POST", "/repos/acme/widgets/issues", Some(b"{}"))
        .await;
    assert_eq!(missing.status(), 422, "{}", missing.0);
    assert_eq!(
        rig.upstream.seen_path("/repos/acme/widgets/issues").len(),
        1,
        "refused calls are never forwarded"
    );

    // irreversible: escalated; held for a human (202 approval_pending), nothing forwarded.
    let delete = rig.call("DELETE", "/repos/acme/widgets", None).await;
    assert_eq!(delete.status(), 202, "{}", delete.0);
    let body = delete.json();
    assert_eq!(body["error"], "approval_pending");
    assert!(
        body["approval_id"].as_str().unwrap().starts_with("apr_"),
        "{body}"
    );
    assert!(body["status_url"]
        .as_str()
        .unwrap()
        .contains("/v1/approvals/apr_"));
    assert_eq!(
        rig.upstream
            .seen_path("/repos/acme/widgets")
            .iter()
            .filter(|s| s.method == "DELETE")
            .count(),
        0
    );

    // The audit names the tool and tier, never the arguments.
    let records = rig.proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    let tools: Vec<_> = http
        .iter()
        .map(|r| (r.tool.as_deref(), r.tier.as_deref(), r.decision.as_str()))
        .collect();
    assert_eq!(
        tools,
        vec![
            (Some("gh.get_repo"), Some("read"), "allow"),
            (Some("gh.create_issue"), Some("write"), "allow"),
            (Some("gh.create_issue"), Some("write"), "deny"),
            (Some("gh.create_issue"), Some("write"), "deny"),
            (Some("gh.create_issue"), Some("write"), "deny"),
            (Some("gh.delete_repo"), Some("irreversible"), "escalate"),
        ],
        "{records:#?}"
    );
    assert_eq!(http[0].policies, vec!["read-ok".to_owned()]);
    assert_eq!(http[1].policies, vec!["write-with-title".to_owned()]);
    assert_eq!(http[3].error.as_deref(), Some("check_failed"));
    assert_eq!(http[5].error.as_deref(), Some("approval_pending"));
    assert_eq!(
        http[5].policies,
        vec!["irreversible-needs-human".to_owned()]
    );
    assert!(http[5].approval.is_some());
    // Arguments appear only in the decision kept for replay (bounded, credentials
    // redacted: docs/policies.md), never in the rest of a record.
    for record in &records {
        let mut record = record.clone();
        let kept = record.decided.take().map(|k| k.to_value());
        let json = serde_json::to_string(&record).unwrap();
        assert!(
            !json.contains("Bug"),
            "arguments stay out of the audit: {json}"
        );
        if let Some(kept) = kept {
            assert!(kept["action"]["type"].is_string(), "{kept:#}");
        }
    }
    assert!(
        http[1].decided.as_ref().unwrap().to_value()["action"]["args"]
            .to_string()
            .contains("Bug"),
        "the kept decision holds what a re-decision needs: {:#?}",
        http[1].decided
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_match_on_method_and_path_and_the_rest_stays_http() {
    let rig = Rig::start(POLICIES).await;

    // Not a route: decided as plain http (permitted for this path by `http-echo`).
    let other = rig.call("POST", "/repos/a/issues", Some(b"not json")).await;
    assert_eq!(other.status(), 404, "{}", other.0);
    assert_eq!(rig.upstream.count("/repos/a/issues"), 1);
    // GET on the create route's path: no route (the read route has two segments fewer), and
    // no http permit for it.
    let get = rig.call("GET", "/repos/a/b/issues", None).await;
    assert_eq!(get.status(), 403, "{}", get.0);
    assert_eq!(get.json()["action"], "Ostiary::Action::\"http\"");
    // POST on the read route's path: no route either.
    let post = rig.call("POST", "/repos/a/b", Some(b"{}")).await;
    assert_eq!(post.status(), 403, "{}", post.0);
    assert_eq!(post.json()["action"], "Ostiary::Action::\"http\"");
    // A trailing slash is the same route (most frameworks route it so): decided as the tool.
    let slash = rig.call("GET", "/repos/a/b/", None).await;
    assert_eq!(slash.status(), 404, "{}", slash.0);
    // The real routes.
    let create = rig
        .call(
            "POST",
            "/repos/a/b/issues?label=from-query",
            Some(br#"{"title": "t"}"#),
        )
        .await;
    assert_eq!(create.status(), 404, "{}", create.0);
    let read = rig.call("GET", "/repos/a/b?x=1", None).await;
    assert_eq!(read.status(), 404, "{}", read.0);
    let echo = rig.call("GET", "/echo", None).await;
    assert_eq!(echo.status(), 200, "{}", echo.0);

    let records = rig.proxy.audit().await;
    let tools: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "http")
        .map(|r| r.tool.as_deref())
        .collect();
    assert_eq!(
        tools,
        vec![
            None,
            None,
            None,
            Some("gh.get_repo"),
            Some("gh.create_issue"),
            Some("gh.get_repo"),
            None
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_arguments_are_read_and_two_sources_for_one_are_refused() {
    // Title from the query only: a string, so the schema is satisfied.
    let rig = Rig::start(POLICIES).await;
    let from_query = rig
        .call("POST", "/repos/a/b/issues?title=hello", None)
        .await;
    assert_eq!(from_query.status(), 404, "{}", from_query.0);
    // A title in the body and another in the query: upstreams disagree on which counts, so
    // neither is chosen — refused before policy, never forwarded.
    let both = rig
        .call(
            "POST",
            "/repos/a/b/issues?title=hello",
            Some(br#"{"title": ""}"#),
        )
        .await;
    assert_eq!(both.status(), 400, "{}", both.0);
    assert!(both.json()["reason"]
        .as_str()
        .unwrap()
        .contains("ambiguous"));
    assert_eq!(rig.upstream.count("/repos/a/b/issues"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_bodies_are_refused_and_never_forwarded() {
    let rig = Rig::start(POLICIES).await;
    let path = "/repos/a/b/issues";

    // Over the limit (declared by Content-Length): refused before the body is read.
    let big = format!(r#"{{"title": "{}"}}"#, "x".repeat(LIMIT));
    let over = rig.call("POST", path, Some(big.as_bytes())).await;
    assert_eq!(over.status(), 400, "{}", over.0);
    assert_eq!(over.json()["reason"], "body_too_large");

    // 10 MB: the same, quickly, without buffering it.
    let huge = vec![b' '; 10 * 1024 * 1024];
    let huge = rig.call("POST", path, Some(&huge)).await;
    assert_eq!(huge.status(), 400, "{}", huge.0);
    assert_eq!(huge.json()["reason"], "body_too_large");

    // Not JSON, and JSON that is not an object.
    for body in [&b"{not json"[..], b"[1, 2]", b"\"title\""] {
        let reply = rig.call("POST", path, Some(body)).await;
        assert_eq!(reply.status(), 400, "{}", reply.0);
        assert_eq!(reply.json()["error"], "bad_request");
    }

    // 10,000 levels of nesting: a parse error (serde_json's recursion limit), not a crash.
    // The limit is raised for this one so that the parser, not the size check, refuses it.
    let deep_rig = {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        let env = proxy.client_env(&session);
        Rig {
            upstream,
            proxy,
            env,
        }
    };
    let deep = format!(
        r#"{{"title": "t", "x": {}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let reply = deep_rig.call("POST", path, Some(deep.as_bytes())).await;
    assert_eq!(reply.status(), 400, "{}", reply.0);
    assert!(
        reply.json()["reason"]
            .as_str()
            .unwrap()
            .contains("recursion"),
        "{}",
        reply.0
    );
    // The proxy still serves.
    let ok = deep_rig
        .call("POST", path, Some(br#"{"title": "t"}"#))
        .await;
    assert_eq!(ok.status(), 404, "{}", ok.0);

    assert_eq!(rig.upstream.count(path), 0, "no refused body was forwarded");
    assert_eq!(deep_rig.upstream.count(path), 1);
}

/// A host reached only through tool permits (no `http` permit names it) is still let
/// through at CONNECT, so that its tool calls can be decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_only_host_is_intercepted() {
    let rig = Rig::start(
        r#"
        @id("read-ok")
        permit (principal, action in Ostiary::Action::"tier:read", resource);
        "#,
    )
    .await;
    let read = rig.call("GET", "/repos/a/b", None).await;
    assert_eq!(read.status(), 404, "{}", read.0);
    let other = rig.call("GET", "/echo", None).await;
    assert_eq!(other.status(), 403, "{}", other.0);
    assert_eq!(rig.upstream.count("/echo"), 0);
}
