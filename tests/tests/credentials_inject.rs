//! Brokered credentials end to end with the file backend, the request side (docs/design.md §9,
//! THREATS "Credentials"): a real proxy, a real TLS upstream that reflects whatever it
//! receives (`/reflect`), and real clients over intercepted tunnels. What the upstream's
//! answers carry back is `credentials_scrub.rs`; the rig is `support/credentials.rs`.
//!
//! What it proves, because a broker is only safe if the secret goes to its host alone:
//! - the bound host receives the secret in the configured form (header template, basic
//!   auth, query parameter), the agent's own `Authorization`/`Cookie`/parameter never reach
//!   it, and an unbound host gets the agent's headers untouched and nothing injected; the
//!   audit record names the credential, never its value;
//! - placeholders from `POST /v1/sessions` are overwritten by the credential at their
//!   binding's injection point and refused (403 `placeholder_exfiltration`, audited)
//!   towards any other host, however they are hidden (headers, query, path, basic auth,
//!   cookies, MCP and tool-call bodies); misplaced ones towards the bound host are
//!   `placeholders_binding.rs`;
//! - plain http and WebSocket upgrades to a bound host are refused; broker failures are
//!   503 with nothing sent; the per-session cache honours the TTL and teardown.
//!
//! Every test starts its own upstream and proxy on loopback ports.

use std::time::Duration;

use base64::Engine;
use http::StatusCode;
use ostiary::audit::AuditRecord;
use ostiary_e2e::clients::curl;
use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::raw::{self, Reply};
use ostiary_e2e::upstream::Upstream;

use crate::support::credentials as credentials_support;
use credentials_support::*;

/// The agent's own credentials, which must never reach a bound host.
const AGENT_AUTH: (&str, &str) = ("authorization", "Bearer agent-chosen-token");
const AGENT_COOKIE: (&str, &str) = ("cookie", "session=agent-cookie");

// ---------------------------------------------------------------------------------------
// 1, 9. Header injection, agent credentials replaced, audit names the credential.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_injection_replaces_agent_credentials_and_nothing_comes_back() {
    let rig = Rig::start().await;
    let headers = [AGENT_AUTH, AGENT_COOKIE, ("x-note", "hello")];
    let reply = rig.get(BOUND, "/reflect", &headers).await;
    assert_status(&reply, StatusCode::OK);

    // The upstream got the secret, and none of the agent's own credentials.
    let seen = rig.only_seen_at(BOUND);
    let auth: Vec<_> = seen.headers.get_all("authorization").iter().collect();
    assert_eq!(auth.len(), 1, "{seen:#?}");
    assert_eq!(auth[0], bearer(CANARY).as_str());
    assert!(
        seen.headers.get("cookie").is_none(),
        "agent cookie forwarded: {seen:#?}"
    );
    let text = seen_text(&seen);
    for agents in ["agent-chosen-token", "agent-cookie", "proxy-authorization"] {
        assert!(!text.contains(agents), "{text}");
    }
    assert_eq!(seen.header("x-note"), Some("hello"));

    // The reflection came back, with the secret redacted everywhere.
    assert_clean(&reply);
    assert_reflected_auth_redacted(&reply);
    let cookie = format!("s={}; Path=/", bearer(REDACTED));
    assert_eq!(reply.header("set-cookie"), Some(cookie.as_str()), "{reply}");
    assert_eq!(reply.header("x-reflect-x-note"), Some("hello"));
    let echo = reply.json();
    let echoed_auth = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0] == "authorization")
        .unwrap_or_else(|| panic!("{echo}"));
    assert_eq!(echoed_auth[1], bearer(REDACTED));

    // 9. The audit record names the credential, never its value.
    // An allowed answer is the upstream's and carries no request id: find it by host.
    let record = allowed_record(&rig, BOUND).await;
    assert_eq!(record.decision, "allow", "{record:#?}");
    assert_eq!(record.credentials, vec!["github".to_owned()], "{record:#?}");
    assert!(
        record.leases.is_empty(),
        "file credentials have no lease: {record:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_host_gets_the_agents_headers_untouched_and_nothing_injected() {
    let rig = Rig::start().await;
    let reply = rig
        .get(OTHER, "/reflect", &[AGENT_AUTH, AGENT_COOKIE])
        .await;
    assert_status(&reply, StatusCode::OK);
    let seen = rig.only_seen_at(OTHER);
    assert_eq!(seen.header("authorization"), Some(AGENT_AUTH.1));
    assert_eq!(seen.header("cookie"), Some(AGENT_COOKIE.1));
    assert!(leaks_in("upstream", seen_text(&seen).as_bytes(), &ALL_SECRETS).is_empty());
    // Nothing to scrub: the reflection is the agent's own value, verbatim.
    assert_eq!(reply.header("x-reflect-authorization"), Some(AGENT_AUTH.1));
    let record = allowed_record(&rig, OTHER).await;
    assert!(record.credentials.is_empty(), "{record:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. Basic and query forms.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_injection_replaces_the_agents_authorization() {
    let rig = Rig::start().await;
    let agents = [("authorization", "Basic YWdlbnQ6b3du")];
    let reply = rig.get(BASIC_HOST, "/reflect", &agents).await;
    assert_status(&reply, StatusCode::OK);
    let seen = rig.only_seen_at(BASIC_HOST);
    let pair =
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{CANARY_BASIC}"));
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Basic {pair}").as_str())
    );
    assert_eq!(seen.headers.get_all("authorization").iter().count(), 1);
    // The whole base64 pair is a secret-bearing form too.
    let found = leaks_in("reply", reply.to_string().as_bytes(), &[&pair]);
    assert!(found.is_empty(), "{found:#?}\n{reply}");
    assert_clean(&reply);
    assert!(
        reply
            .header("x-reflect-authorization")
            .is_some_and(|v| v.starts_with("Basic ") && v.contains("[REDACTED")),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_injection_replaces_the_agents_parameter() {
    let rig = Rig::start().await;
    let path = "/reflect?api_key=agent-own&x=1&api%5Fkey=sneaky";
    let reply = rig.get(QUERY_HOST, path, &[]).await;
    assert_status(&reply, StatusCode::OK);
    let seen = rig.only_seen_at(QUERY_HOST);
    let path = seen.path.as_str();
    assert_eq!(query_values(path, "api_key"), vec![CANARY_QUERY], "{path}");
    assert_eq!(query_values(path, "x"), vec!["1"], "{path}");
    assert!(!path.contains("agent-own"), "{path}");
    assert!(!path.contains("sneaky"), "{path}");
    assert_clean(&reply);
    assert!(
        reply
            .header("x-reflect-query")
            .is_some_and(|q| q.contains(REDACTED)),
        "{reply}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Placeholders.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_are_exported_and_swapped_towards_their_host() {
    let rig = Rig::start().await;
    let placeholders = &rig.session.placeholders;
    assert_eq!(
        placeholders.get("GITHUB_TOKEN").map(String::as_str),
        Some("ostiary:github"),
        "{placeholders:?}"
    );
    assert!(
        placeholders.values().all(|v| v.starts_with("ostiary:")),
        "{placeholders:?}"
    );
    assert!(
        rig.env()
            .iter()
            .any(|(k, v)| k == "GITHUB_TOKEN" && v == "ostiary:github"),
        "the session's environment carries the placeholder"
    );

    // At its binding's injection point (here `Authorization`), the placeholder is
    // overwritten by the credential; anywhere else it is refused (placeholders_binding.rs).
    let reply = rig
        .get(
            BOUND,
            "/reflect",
            &[("authorization", "Bearer ostiary:github")],
        )
        .await;
    assert_status(&reply, StatusCode::OK);
    let seen = rig.only_seen_at(BOUND);
    assert_eq!(
        seen.header("authorization"),
        Some(bearer(CANARY).as_str()),
        "{seen:#?}"
    );
    let text = seen_text(&seen);
    assert!(!text.contains("ostiary:"), "{text}");
    assert_clean(&reply);
}

/// A 403 refusal naming the `github` binding and `reason`, audited as denied; `what`
/// labels the case in failures.
async fn assert_github_refused(rig: &Rig, reply: &Reply, reason: &str, what: &str) -> AuditRecord {
    let (body, record) = raw::assert_refused(&rig.proxy, reply, 403, "denied").await;
    assert_eq!(body["reason"], reason, "{what}: {reply}");
    assert_eq!(body["credential"], "github", "{what}: {reply}");
    record
}

/// The checks every placeholder refusal must pass.
async fn assert_exfiltration_refused(rig: &Rig, reply: &Reply, what: &str) {
    let record = assert_github_refused(rig, reply, "placeholder_exfiltration", what).await;
    assert_eq!(record.decision, "deny", "{what}: {record:#?}");
    // The record names the credential the placeholder stood for; nothing was injected.
    assert_eq!(record.credentials, ["github"], "{what}: {record:#?}");
    assert!(record.leases.is_empty(), "{what}: {record:#?}");
    assert_clean(reply);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_towards_unbound_hosts_are_refused_however_hidden() {
    let rig = Rig::start().await;
    let basic = base64::engine::general_purpose::STANDARD.encode("user:ostiary:github");
    let basic = format!("Basic {basic}");
    // (what, path, headers)
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);
    let cases: Vec<Case> = vec![
        ("header", "/reflect", vec![("x-api-key", "ostiary:github")]),
        (
            "bearer",
            "/reflect",
            vec![("authorization", "Bearer ostiary:github")],
        ),
        ("query", "/reflect?token=ostiary:github", vec![]),
        (
            "percent-encoded query",
            "/reflect?token=ostiary%3Agithub",
            vec![],
        ),
        ("percent-encoded path", "/reflect/ostiary%3agithub", vec![]),
        (
            "basic auth",
            "/reflect",
            vec![("authorization", basic.as_str())],
        ),
        ("cookie", "/reflect", vec![("cookie", "t=ostiary:github")]),
    ];
    for (what, path, headers) in &cases {
        let reply = rig.get(OTHER, path, headers).await;
        assert_exfiltration_refused(&rig, &reply, what).await;
    }
    // Also through a plain absolute-form request on the proxy listener.
    let reply = rig.plain_get(OTHER, "/reflect?k=ostiary:github").await;
    assert_exfiltration_refused(&rig, &reply, "absolute-form").await;
    rig.assert_upstream_saw_nothing("a refused request");
    // A name that is not a credential is just text.
    let reply = rig.get(OTHER, "/reflect?t=ostiary:gitlab", &[]).await;
    assert_status(&reply, StatusCode::OK);
}

/// Base64 without its padding still decodes in many servers (Go's RawStdEncoding,
/// lenient decoders); the placeholder inside must be found all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_unpadded_basic_auth_is_refused() {
    let rig = Rig::start().await;
    let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("user:ostiary:github");
    assert!(!unpadded.ends_with('='));
    let basic = format!("Basic {unpadded}");
    let reply = rig
        .get(OTHER, "/reflect", &[("authorization", &basic)])
        .await;
    assert_exfiltration_refused(&rig, &reply, "unpadded basic auth").await;
    rig.assert_upstream_saw_nothing("a refused request");
}

const TOOLS: &str = r#"
[[tool]]
name = "tickets.create"
tier = "write"
match = { host = "other.example.test", method = "POST", path = "/tickets" }
args_schema = { type = "object", properties = { title = { type = "string" } } }
"#;

const TOOL_POLICIES: &str = r#"
@id("allow-all-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("allow-all-connect")
permit (principal, action == Ostiary::Action::"connect", resource);
@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"#;

/// An MCP endpoint on the unbound host (the upstream answers 404 there: nothing here
/// needs a real MCP server, since a refused call is never forwarded).
fn mcp_tools(port: u16) -> String {
    format!(
        r#"
[[tool]]
name = "files.read"
tier = "read"
match = {{ mcp = "https://{OTHER}:{port}/mcp", tool = "read_file" }}
"#
    )
}

/// A REST tool on the bound host (any port), and nothing else reaching it.
fn rest_tools(_port: u16) -> String {
    format!(
        r#"
[[tool]]
name = "echo.get"
tier = "read"
match = {{ host = "{BOUND}", method = "GET", path = "/reflect" }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_reached_only_through_tools_gets_its_placeholder_and_no_other_does() {
    // Only tool permits: no `http` permit names any host.
    let policies = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"#;
    let rig = Rig::start_with("5m", policies, Some(rest_tools), true).await;
    let placeholders = &rig.session.placeholders;
    assert_eq!(
        placeholders.get("GITHUB_TOKEN").map(String::as_str),
        Some("ostiary:github"),
        "{placeholders:?}"
    );
    // The other bindings' hosts are reached by neither a permit nor a tool.
    assert_eq!(placeholders.len(), 1, "{placeholders:?}");
}

/// What an MCP client sends with a JSON-RPC call.
const MCP_ACCEPT: [(&str, &str); 1] = [("accept", "application/json, text/event-stream")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_an_mcp_call_to_an_unbound_host_is_refused() {
    let rig = Rig::start_with("5m", TOOL_POLICIES, Some(mcp_tools), true).await;
    let reply = rig
        .post_json(
            OTHER,
            "/mcp",
            &MCP_ACCEPT,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"ostiary:github"}}}"#,
        )
        .await;
    assert_exfiltration_refused(&rig, &reply, "mcp tools/call").await;
    assert_eq!(rig.upstream.count("/mcp"), 0, "{:#?}", rig.upstream.seen());
    // Control: the same call without the placeholder is forwarded.
    rig.post_json(
        OTHER,
        "/mcp",
        &MCP_ACCEPT,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/etc/motd"}}}"#,
    )
    .await;
    assert_eq!(rig.upstream.count("/mcp"), 1, "{:#?}", rig.upstream.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_a_tool_call_body_to_an_unbound_host_is_refused() {
    let rig = Rig::start_with("5m", TOOL_POLICIES, Some(|_| TOOLS.to_owned()), true).await;
    // Allowed as a tool call without a placeholder (proves the route is recognised and
    // permitted: the upstream answers 404 for /tickets, which is its own).
    let ok = rig
        .post_json(OTHER, "/tickets", &[], r#"{"title":"plain"}"#)
        .await;
    assert_status(&ok, StatusCode::NOT_FOUND);
    let record = allowed_record(&rig, OTHER).await;
    assert_eq!(
        record.tool.as_deref(),
        Some("tickets.create"),
        "{record:#?}"
    );

    let leak = r#"{"title":"leak ostiary:github please"}"#;
    let reply = rig.post_json(OTHER, "/tickets", &[], leak).await;
    assert_exfiltration_refused(&rig, &reply, "tool body").await;
    assert_eq!(
        rig.upstream.count("/tickets"),
        1,
        "only the clean call arrived"
    );
}

// ---------------------------------------------------------------------------------------
// 5. Plain http and upgrades to a bound host.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_a_bound_host_is_refused() {
    let rig = Rig::start().await;
    let reply = rig.plain_get(BOUND, "/reflect").await;
    assert_github_refused(&rig, &reply, "credential_needs_tls", "plain http").await;
    assert_eq!(
        rig.upstream.connections(),
        0,
        "nothing reached the upstream"
    );
    // Control: plain http to an unbound host is forwarded (and fails at the TLS upstream
    // with an upstream error, not a credential refusal).
    let reply = rig.plain_get(OTHER, "/reflect").await;
    assert_ne!(reply.status, StatusCode::FORBIDDEN, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_to_a_bound_host_is_refused() {
    let rig = Rig::start().await;
    let ws_headers: [(&str, &str); 4] = [
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "13"),
    ];
    let reply = rig.get(BOUND, "/ws", &ws_headers).await;
    assert_github_refused(&rig, &reply, "credential_over_upgrade", "websocket").await;
    assert_eq!(rig.upstream.count("/ws"), 0);
    // Control: the same handshake to an unbound host switches protocols.
    let mut wire = raw::Wire::new(rig.tunnel(OTHER, &[b"http/1.1"]).await);
    let mut text = format!(
        "GET /ws HTTP/1.1\r\nHost: {OTHER}:{}\r\n",
        rig.upstream.port()
    );
    for (n, v) in ws_headers {
        text.push_str(&format!("{n}: {v}\r\n"));
    }
    text.push_str("\r\n");
    wire.send(text.as_bytes()).await.unwrap();
    let reply = wire.connect_response().await.unwrap();
    assert_status(&reply, StatusCode::SWITCHING_PROTOCOLS);
}

// ---------------------------------------------------------------------------------------
// 6. Broker failures.

async fn assert_unavailable(rig: &Rig, reply: &Reply, credential: &str) {
    assert_eq!(reply.status.as_u16(), 503, "{reply}");
    let body = raw::assert_ostiary_error(reply, 503, "credential_unavailable");
    assert_eq!(body["credential"], credential, "{reply}");
    let record = rig.proxy.audit_of(reply.request_id().unwrap()).await;
    assert_eq!(
        record.error.as_deref(),
        Some("credential_unavailable"),
        "{record:#?}"
    );
    assert_ne!(record.decision, "allow", "{record:#?}");
    assert_clean(reply);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_failures_answer_503_and_send_nothing() {
    let rig = Rig::start().await;
    // The name is not in the file.
    let reply = rig.get(MISSING_HOST, "/reflect", &[]).await;
    assert_unavailable(&rig, &reply, "missing").await;
    // A value with CR/LF: never a header.
    let reply = rig.get(CRLF_HOST, "/reflect", &[]).await;
    assert_unavailable(&rig, &reply, "crlf").await;
    assert!(!reply.to_string().contains("X-Evil"), "{reply}");
    // A value with NUL: never a header either.
    let reply = rig.get(NUL_HOST, "/reflect", &[]).await;
    assert_unavailable(&rig, &reply, "nul").await;
    assert!(!reply.to_string().contains("X-Evil"), "{reply}");
    // The file itself gone (a new session, so nothing is cached).
    std::fs::remove_file(&rig.secrets).unwrap();
    let fresh = rig.proxy.session("agent-2").await;
    let reply = rig.send_as(&fresh, "GET", BOUND, "/reflect", &[]).await;
    assert_unavailable(&rig, &reply, "github").await;
    rig.assert_upstream_saw_nothing("a request without its credential");
}

// ---------------------------------------------------------------------------------------
// 7. Caching and teardown.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_credentials_last_until_their_ttl_and_die_with_the_session() {
    let rig = Rig::start_with("1s", ALLOW_ALL, None, true).await;
    let auth_of_last = |rig: &Rig| {
        rig.seen_at(BOUND)
            .last()
            .and_then(|s| s.header("authorization").map(str::to_owned))
            .unwrap()
    };
    let reply = rig.get(BOUND, "/echo", &[]).await;
    assert_status(&reply, StatusCode::OK);
    assert_eq!(auth_of_last(&rig), bearer(CANARY));

    const ROTATED: &str = "ghp_ROTATED_0e6d2c9b1a44";
    std::fs::write(&rig.secrets, secrets_toml(ROTATED)).unwrap();
    // The running session keeps its cached value...
    rig.get(BOUND, "/echo", &[]).await;
    assert_eq!(auth_of_last(&rig), bearer(CANARY), "cache ignored");
    // ...a new session reads the file again...
    let fresh = rig.proxy.session("agent-2").await;
    rig.send_as(&fresh, "GET", BOUND, "/echo", &[]).await;
    assert_eq!(auth_of_last(&rig), bearer(ROTATED));
    // ...and the first one does once its TTL has passed.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let reply = rig.get(BOUND, "/reflect", &[]).await;
    assert_eq!(auth_of_last(&rig), bearer(ROTATED), "served past its TTL");
    // The scrubber follows the rotation.
    assert_clean_of(&reply, &[ROTATED, CANARY]);

    // Teardown: an open tunnel is closed (a request racing the close is refused) and a new
    // CONNECT is refused.
    let mut open = rig.h1(BOUND).await;
    rig.proxy
        .control()
        .delete_session(&rig.session.session_id)
        .await
        .expect("session deleted");
    let before = rig.seen_at(BOUND).len();
    if let Ok(reply) = raw::send_h1(&mut open, rig.request("GET", BOUND, "/echo", &[])).await {
        raw::assert_ostiary_error(&reply, 407, "unauthenticated");
    }
    let (_, connect) = raw::connect(
        rig.proxy.proxy_addr,
        &format!("{BOUND}:{}", rig.upstream.port()),
        &raw::auth_line(&rig.session.token),
    )
    .await;
    assert_eq!(connect.status.as_u16(), 407, "{connect}");
    assert_eq!(
        rig.seen_at(BOUND).len(),
        before,
        "nothing sent after teardown"
    );
    // The other session is unaffected.
    let reply = rig.send_as(&fresh, "GET", BOUND, "/echo", &[]).await;
    assert_status(&reply, StatusCode::OK);
}

// ---------------------------------------------------------------------------------------
// THREATS: "credentials are injected only after the upstream certificate was verified for
// that host".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_reaches_an_upstream_whose_certificate_is_not_trusted() {
    // A server answering for the bound name with a certificate from a CA the proxy does
    // not trust (an impostor on the path, a misissued certificate).
    let impostor = Upstream::builder().names(&[BOUND]).start().await;
    let secrets_dir = tempfile::tempdir().unwrap();
    let secrets = secrets_dir.path().join("secrets.toml");
    std::fs::write(&secrets, secrets_toml(CANARY)).unwrap();
    let proxy = TestProxy::start(ProxySpec {
        names: vec![BOUND.into()],
        ports: vec![impostor.port()],
        extra_toml: broker_toml(&secrets, "5m"),
        ..Default::default()
    })
    .await;
    let session = proxy.session("agent-1").await;
    let tls = raw::intercepted(
        &proxy,
        &session.token,
        BOUND,
        impostor.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    let req = http::Request::builder()
        .uri("/reflect")
        .header("host", format!("{BOUND}:{}", impostor.port()))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let reply = raw::send_h1(&mut sender, req).await.unwrap();
    let (body, _) = raw::assert_refused(&proxy, &reply, 502, "upstream_error").await;
    assert!(
        impostor.connections() >= 1,
        "the proxy did dial the impostor"
    );
    assert!(
        impostor.seen().is_empty(),
        "an HTTP request (and its credential) reached an unverified upstream"
    );
    assert!(!reply.to_string().contains(CANARY), "{body}");
}

// ---------------------------------------------------------------------------------------
// docs/design.md §9: "a placeholder sent anywhere else is refused" — in a streamed body too.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_deep_in_a_streamed_body_is_stopped_before_it_leaves() {
    let rig = Rig::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload.bin");
    // 2 MiB before the placeholder: well past anything the proxy reads before forwarding.
    let offset = 2 * 1024 * 1024;
    let mut data = vec![b'a'; offset];
    data.extend_from_slice(b"\"ostiary:github\"");
    data.extend_from_slice(&vec![b'z'; 64 * 1024]);
    std::fs::write(&file, &data).unwrap();
    let env = rig.env();
    let url = rig.url("https", OTHER, "/upload");
    let upload = format!("@{}", file.display());
    let out = curl(
        &[
            "-sS",
            "-X",
            "POST",
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &upload,
            "-w",
            "\n%{http_code}",
            &url,
        ],
        &borrow(&env),
    )
    .await;
    assert!(
        out.stdout.trim_end().ends_with("403"),
        "expected 403 for the body's placeholder:\n{out}"
    );
    assert!(out.stdout.contains("placeholder_exfiltration"), "{out}");
    for seen in rig.seen_at(OTHER) {
        assert!(
            !seen.body_complete,
            "the upstream got the whole body: {seen:#?}"
        );
        assert!(
            (seen.body_len as usize) < offset + "ostiary:github".len(),
            "the upstream got past the placeholder: {} bytes",
            seen.body_len
        );
    }
    let audit = rig.proxy.audit().await;
    assert!(
        audit.iter().any(|r| r.decision == "deny"
            && r.host.as_deref() == Some(OTHER)
            && r.reason
                .as_deref()
                .is_some_and(|t| t.contains("placeholder"))),
        "no deny record of the attempt"
    );
    // The same body to the bound host is refused too (no binding injects into a body);
    // control: without the placeholder it passes whole.
    let url = rig.url("https", BOUND, "/upload");
    let post = |upload: String| {
        let url = url.clone();
        let env = env.clone();
        async move {
            curl(
                &[
                    "-sS",
                    "-X",
                    "POST",
                    "--data-binary",
                    &upload,
                    "-w",
                    "\n%{http_code}",
                    &url,
                ],
                &borrow(&env),
            )
            .await
        }
    };
    let out = post(upload).await;
    assert!(out.stdout.trim_end().ends_with("403"), "{out}");
    let clean = dir.path().join("clean.bin");
    std::fs::write(&clean, &data[..offset]).unwrap();
    let out = post(format!("@{}", clean.display())).await;
    assert!(out.stdout.trim_end().ends_with("200"), "{out}");
    let seen = rig.seen_at(BOUND);
    assert!(
        seen.iter().all(|s| (s.body_len as usize) <= offset
            && (!s.body_complete || s.body_len as usize == offset)),
        "the placeholder reached the bound host: {seen:#?}"
    );
    assert_eq!(
        seen.iter().filter(|s| s.body_complete).count(),
        1,
        "{seen:#?}"
    );
}
