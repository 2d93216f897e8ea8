//! Brokered credentials end to end with the file backend (DESIGN §9, THREATS "Credentials"):
//! a real proxy, a real TLS upstream that reflects whatever it receives (`/reflect`), and
//! real clients (hyper over an intercepted tunnel, curl).
//!
//! What it proves:
//! - the bound host receives the secret in the configured form (header template, basic
//!   auth, query parameter), the agent's own `Authorization`/`Cookie`/parameter never reach
//!   it, and an unbound host gets the agent's headers untouched and nothing injected;
//! - placeholders from `POST /v1/sessions` are swapped towards their hosts and refused
//!   (403 `placeholder_exfiltration`, audited) anywhere else, however they are hidden;
//! - whatever the upstream reflects (headers, `Set-Cookie`, `Location`, SSE, compressed,
//!   base64, error pages) reaches the client without the secret in any form, an
//!   undecodable encoding is refused, and a response without a secret is untouched;
//! - plain http and WebSocket upgrades to a bound host are refused; broker failures are
//!   503 with nothing sent; the per-session cache honours the TTL and teardown;
//! - the canary appears in no audit record (API and raw SQLite), metric or error body.
//!
//! Every test starts its own upstream and proxy on loopback ports.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use ostiary::audit::AuditRecord;
use ostiary_e2e::clients::curl;
use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::raw::{self, Reply};
use ostiary_e2e::upstream::{Seen, Upstream};
use ostiary_sdk::Session;
use serde_json::Value;

/// The secret of the `github` binding (header injection on `api.example.test`).
const CANARY: &str = "ghp_CANARY_5f3a9e1c7b2d";
/// The secret of the `basic` binding (basic auth on `basic.example.test`).
const CANARY_BASIC: &str = "bsc_CANARY_91d2e7a04f6b";
/// The secret of the `query` binding (query parameter on `query.example.test`).
const CANARY_QUERY: &str = "qry_CANARY_3c8b5e2f9a17";
/// An all-lowercase secret (hex-ish API keys are), for reflections that lowercase.
const CANARY_LOWER: &str = "lc_canary_7e3f9a2b5c1d";
/// A secret with `/` (AWS secret keys have them), for reflections that escape it.
const CANARY_SLASH: &str = "sl/CANARY/4d2a8c6e0f13";
/// What the scrubber puts where a secret was.
const REDACTED: &str = "[REDACTED by ostiary]";

const BOUND: &str = "api.example.test";
const OTHER: &str = "other.example.test";
const BASIC_HOST: &str = "basic.example.test";
const QUERY_HOST: &str = "query.example.test";
const MISSING_HOST: &str = "missing.example.test";
const CRLF_HOST: &str = "crlf.example.test";
const LOWER_HOST: &str = "lower.example.test";
const SLASH_HOST: &str = "slash.example.test";

const HOSTS: [&str; 8] = [
    BOUND,
    OTHER,
    BASIC_HOST,
    QUERY_HOST,
    MISSING_HOST,
    CRLF_HOST,
    LOWER_HOST,
    SLASH_HOST,
];

/// The secrets file: one value with CR/LF, which must never become a header.
fn secrets_toml(github: &str) -> String {
    format!(
        "github = \"{github}\"\nbasic = \"{CANARY_BASIC}\"\nquery = \"{CANARY_QUERY}\"\n\
         crlf = \"{CANARY}\\r\\nX-Evil: 1\"\nlower = \"{CANARY_LOWER}\"\n\
         slash = \"{CANARY_SLASH}\"\n"
    )
}

/// The `[broker]` and `[[credential]]` tables of every rig.
fn broker_toml(file: &std::path::Path, ttl: &str) -> String {
    format!(
        r#"
[broker]
backend = "file"
file = "{file}"

[[credential]]
name = "github"
source = {{ file = "github" }}
hosts = ["{BOUND}"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}
ttl = "{ttl}"

[[credential]]
name = "basic"
source = {{ file = "basic" }}
hosts = ["{BASIC_HOST}"]
inject = {{ basic = {{ username = "x-access-token" }} }}

[[credential]]
name = "query"
source = {{ file = "query" }}
hosts = ["{QUERY_HOST}"]
inject = {{ query = "api_key" }}

[[credential]]
name = "missing"
source = {{ file = "not-in-the-file" }}
hosts = ["{MISSING_HOST}"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}

[[credential]]
name = "crlf"
source = {{ file = "crlf" }}
hosts = ["{CRLF_HOST}"]
inject = {{ header = "X-Token", value = "{{secret}}" }}

[[credential]]
name = "lower"
source = {{ file = "lower" }}
hosts = ["{LOWER_HOST}"]
inject = {{ header = "X-Api-Key", value = "{{secret}}" }}

[[credential]]
name = "slash"
source = {{ file = "slash" }}
hosts = ["{SLASH_HOST}"]
inject = {{ header = "X-Api-Key", value = "{{secret}}" }}
"#,
        file = file.display()
    )
}

/// An upstream answering to every test name, a proxy with the file backend, one session.
struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    session: Session,
    secrets: PathBuf,
    _secrets_dir: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Self {
        Self::start_with("5m", ALLOW_ALL, None, true).await
    }

    /// `http2: false` makes the upstream HTTP/1.1-only (reason phrases travel).
    async fn start_with(
        ttl: &str,
        policies: &str,
        tools: Option<fn(u16) -> String>,
        http2: bool,
    ) -> Self {
        let mut names: Vec<&str> = HOSTS.to_vec();
        names.push("localhost");
        let upstream = Upstream::builder().names(&names).http2(http2).start().await;
        let secrets_dir = tempfile::tempdir().unwrap();
        let secrets = secrets_dir.path().join("secrets.toml");
        std::fs::write(&secrets, secrets_toml(CANARY)).unwrap();
        let proxy = TestProxy::start(ProxySpec {
            policies: policies.into(),
            tools_toml: tools.map(|tools| tools(upstream.port())),
            names: HOSTS.iter().map(|h| h.to_string()).collect(),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: broker_toml(&secrets, ttl),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        Self {
            upstream,
            proxy,
            session,
            secrets,
            _secrets_dir: secrets_dir,
        }
    }

    /// One request through a fresh intercepted tunnel to `host` (HTTP/1.1), as `session`.
    async fn send_as(
        &self,
        session: &Session,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let tls = raw::intercepted(
            &self.proxy,
            &session.token,
            host,
            self.upstream.port(),
            &[b"http/1.1"],
        )
        .await;
        let mut sender = raw::h1(tls).await;
        let req = request(method, path, host, self.upstream.port(), headers);
        raw::send_h1(&mut sender, req)
            .await
            .unwrap_or_else(|e| panic!("{method} {host}{path}: {e}"))
    }

    async fn get(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send_as(&self.session, "GET", host, path, headers)
            .await
    }

    /// Requests the upstream received over a TLS connection whose SNI was `host`.
    fn seen_at(&self, host: &str) -> Vec<Seen> {
        self.upstream
            .seen()
            .into_iter()
            .filter(|s| s.sni.as_deref() == Some(host))
            .collect()
    }

    /// The one request the upstream received for `host`.
    fn only_seen_at(&self, host: &str) -> Seen {
        let seen = self.seen_at(host);
        assert_eq!(
            seen.len(),
            1,
            "expected exactly one request at {host}: {seen:#?}"
        );
        seen.into_iter().next().unwrap()
    }

    fn env(&self) -> Vec<(String, String)> {
        self.proxy.client_env(&self.session)
    }
}

fn request(
    method: &str,
    path: &str,
    host: &str,
    port: u16,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("{host}:{port}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// Every form of `secret` a client must never see: raw, percent-encoded, base64 and
/// base64url whole (padded or not), and the characters that any base64/base64url blob
/// holding the secret at one of the three byte alignments must contain.
fn forms(secret: &str) -> Vec<String> {
    let mut out = vec![secret.to_owned()];
    let percent: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    out.push(percent);
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    out.push(STANDARD.encode(secret));
    out.push(URL_SAFE.encode(secret));
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for shift in 0..3usize {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(secret.as_bytes());
            let encoded = engine.encode(&shifted);
            let start = (8 * shift).div_ceil(6);
            let end = (8 * (shift + secret.len())) / 6;
            out.push(encoded[start..end].to_owned());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Where in `haystack` any form of any of `secrets` occurs (empty: clean).
fn leaks_in(what: &str, haystack: &[u8], secrets: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for secret in secrets {
        for form in forms(secret) {
            if haystack.windows(form.len()).any(|w| w == form.as_bytes()) {
                found.push(format!("{what} holds {form:?} (a form of {secret:?})"));
            }
        }
    }
    found
}

/// Every canary form in status, headers (names and values) and body of `reply`.
fn leaks(reply: &Reply, secrets: &[&str]) -> Vec<String> {
    let mut found = leaks_in("status", reply.status.as_str().as_bytes(), secrets);
    for (name, value) in &reply.headers {
        found.extend(leaks_in(
            &format!("header {name}"),
            value.as_bytes(),
            secrets,
        ));
        found.extend(leaks_in("header name", name.as_str().as_bytes(), secrets));
    }
    found.extend(leaks_in("body", &reply.body, secrets));
    found
}

const ALL_SECRETS: [&str; 5] = [
    CANARY,
    CANARY_BASIC,
    CANARY_QUERY,
    CANARY_LOWER,
    CANARY_SLASH,
];

fn assert_clean(reply: &Reply) {
    let found = leaks(reply, &ALL_SECRETS);
    assert!(
        found.is_empty(),
        "secret leaked to the client: {found:#?}\n{reply}"
    );
}

/// Everything the upstream saw of one request, as text, to look for values in.
fn seen_text(seen: &Seen) -> String {
    let mut text = format!("{}\n", seen.path);
    for (name, value) in &seen.headers {
        text.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    text
}

fn query_values<'a>(path: &'a str, name: &str) -> Vec<&'a str> {
    path.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .collect()
}

/// The (only) allowed `http` record of a request to `host`.
async fn allowed_record(rig: &Rig, host: &str) -> AuditRecord {
    raw::wait_for_audit(&rig.proxy, host, |r| {
        r.kind == "http" && r.decision == "allow" && r.host.as_deref() == Some(host)
    })
    .await
}

fn borrow(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

// ---------------------------------------------------------------------------------------
// 1, 9. Header injection, agent credentials replaced, audit names the credential.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_injection_replaces_agent_credentials_and_nothing_comes_back() {
    let rig = Rig::start().await;
    let reply = rig
        .get(
            BOUND,
            "/reflect",
            &[
                ("authorization", "Bearer agent-chosen-token"),
                ("cookie", "session=agent-cookie"),
                ("x-note", "hello"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");

    // The upstream got the secret, and none of the agent's own credentials.
    let seen = rig.only_seen_at(BOUND);
    let auth: Vec<_> = seen.headers.get_all("authorization").iter().collect();
    assert_eq!(auth.len(), 1, "{seen:#?}");
    assert_eq!(auth[0], format!("Bearer {CANARY}").as_str());
    assert!(
        seen.headers.get("cookie").is_none(),
        "agent cookie forwarded: {seen:#?}"
    );
    let text = seen_text(&seen);
    assert!(!text.contains("agent-chosen-token"), "{text}");
    assert!(!text.contains("agent-cookie"), "{text}");
    assert!(!text.contains("proxy-authorization"), "{text}");
    assert_eq!(seen.header("x-note"), Some("hello"));

    // The reflection came back, with the secret redacted everywhere.
    assert_clean(&reply);
    assert_eq!(
        reply.header("x-reflect-authorization"),
        Some(format!("Bearer {REDACTED}").as_str()),
        "{reply}"
    );
    assert_eq!(
        reply.header("set-cookie"),
        Some(format!("s=Bearer {REDACTED}; Path=/").as_str()),
        "{reply}"
    );
    assert_eq!(reply.header("x-reflect-x-note"), Some("hello"));
    let echo = reply.json();
    let echoed_auth = echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|pair| pair[0] == "authorization")
        .unwrap_or_else(|| panic!("{echo}"));
    assert_eq!(echoed_auth[1], format!("Bearer {REDACTED}"));

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
async fn head_response_headers_are_scrubbed() {
    let rig = Rig::start().await;
    let reply = rig
        .send_as(&rig.session, "HEAD", BOUND, "/reflect", &[])
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert!(reply.body.is_empty());
    assert_eq!(
        reply.header("x-reflect-authorization"),
        Some(format!("Bearer {REDACTED}").as_str()),
        "{reply}"
    );
    assert_clean(&reply);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_host_gets_the_agents_headers_untouched_and_nothing_injected() {
    let rig = Rig::start().await;
    let reply = rig
        .get(
            OTHER,
            "/reflect",
            &[
                ("authorization", "Bearer agent-chosen-token"),
                ("cookie", "session=agent-cookie"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = rig.only_seen_at(OTHER);
    assert_eq!(
        seen.header("authorization"),
        Some("Bearer agent-chosen-token")
    );
    assert_eq!(seen.header("cookie"), Some("session=agent-cookie"));
    assert!(leaks_in("upstream", seen_text(&seen).as_bytes(), &ALL_SECRETS).is_empty());
    // Nothing to scrub: the reflection is the agent's own value, verbatim.
    assert_eq!(
        reply.header("x-reflect-authorization"),
        Some("Bearer agent-chosen-token")
    );
    let record = allowed_record(&rig, OTHER).await;
    assert!(record.credentials.is_empty(), "{record:#?}");
}

// ---------------------------------------------------------------------------------------
// 2. Basic and query forms.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_injection_replaces_the_agents_authorization() {
    let rig = Rig::start().await;
    let reply = rig
        .get(
            BASIC_HOST,
            "/reflect",
            &[("authorization", "Basic YWdlbnQ6b3du")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
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
    let reply = rig
        .get(
            QUERY_HOST,
            "/reflect?api_key=agent-own&x=1&api%5Fkey=sneaky",
            &[],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = rig.only_seen_at(QUERY_HOST);
    assert_eq!(
        query_values(&seen.path, "api_key"),
        vec![CANARY_QUERY],
        "{}",
        seen.path
    );
    assert_eq!(query_values(&seen.path, "x"), vec!["1"], "{}", seen.path);
    assert!(!seen.path.contains("agent-own"), "{}", seen.path);
    assert!(!seen.path.contains("sneaky"), "{}", seen.path);
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
    assert_eq!(
        rig.session
            .placeholders
            .get("GITHUB_TOKEN")
            .map(String::as_str),
        Some("ostiary:github"),
        "{:?}",
        rig.session.placeholders
    );
    assert!(
        rig.session
            .placeholders
            .values()
            .all(|v| v.starts_with("ostiary:")),
        "{:?}",
        rig.session.placeholders
    );
    assert!(
        rig.env()
            .iter()
            .any(|(k, v)| k == "GITHUB_TOKEN" && v == "ostiary:github"),
        "the session's environment carries the placeholder"
    );

    let reply = rig
        .get(
            BOUND,
            "/reflect?token=ostiary:github&enc=ostiary%3Agithub",
            &[("x-api-key", "ostiary:github")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = rig.only_seen_at(BOUND);
    assert_eq!(seen.header("x-api-key"), Some(CANARY), "{seen:#?}");
    assert_eq!(
        query_values(&seen.path, "token"),
        vec![CANARY],
        "{}",
        seen.path
    );
    assert_eq!(
        query_values(&seen.path, "enc"),
        vec![CANARY],
        "{}",
        seen.path
    );
    assert!(
        !seen_text(&seen).contains("ostiary:"),
        "{}",
        seen_text(&seen)
    );
    assert_clean(&reply);
}

/// The checks every placeholder refusal must pass; the upstream saw nothing at all.
async fn assert_exfiltration_refused(rig: &Rig, reply: &Reply, what: &str) {
    let (body, record) = raw::assert_refused(&rig.proxy, reply, 403, "denied").await;
    assert_eq!(
        body["reason"], "placeholder_exfiltration",
        "{what}: {reply}"
    );
    assert_eq!(body["credential"], "github", "{what}: {reply}");
    assert_eq!(record.decision, "deny", "{what}: {record:#?}");
    assert!(record.credentials.is_empty(), "{what}: {record:#?}");
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
    let url = format!(
        "http://{OTHER}:{}/reflect?k=ostiary:github",
        rig.upstream.port()
    );
    let reply = raw::absolute_get(&rig.proxy, &url, &raw::auth_line(&rig.session.token)).await;
    assert_exfiltration_refused(&rig, &reply, "absolute-form").await;
    assert!(
        rig.upstream.seen().is_empty(),
        "the upstream saw a refused request: {:#?}",
        rig.upstream.seen()
    );
    // A name that is not a credential is just text.
    let reply = rig.get(OTHER, "/reflect?t=ostiary:gitlab", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
}

/// Base64 without its padding still decodes in many servers (Go's RawStdEncoding,
/// lenient decoders); the placeholder inside must be found all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_unpadded_basic_auth_is_refused() {
    let rig = Rig::start().await;
    let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("user:ostiary:github");
    assert!(!unpadded.ends_with('='));
    let reply = rig
        .get(
            OTHER,
            "/reflect",
            &[("authorization", &format!("Basic {unpadded}"))],
        )
        .await;
    assert_exfiltration_refused(&rig, &reply, "unpadded basic auth").await;
    assert!(rig.upstream.seen().is_empty(), "{:#?}", rig.upstream.seen());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_an_mcp_call_to_an_unbound_host_is_refused() {
    let rig = Rig::start_with("5m", TOOL_POLICIES, Some(mcp_tools), true).await;
    let call = |body: &'static str| {
        Request::builder()
            .method("POST")
            .uri("/mcp")
            .header("host", format!("{OTHER}:{}", rig.upstream.port()))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        OTHER,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    let reply = raw::send_h1(
        &mut sender,
        call(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"ostiary:github"}}}"#,
        ),
    )
    .await
    .unwrap();
    assert_exfiltration_refused(&rig, &reply, "mcp tools/call").await;
    assert_eq!(rig.upstream.count("/mcp"), 0, "{:#?}", rig.upstream.seen());
    // Control: the same call without the placeholder is forwarded.
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        OTHER,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    raw::send_h1(
        &mut sender,
        call(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/etc/motd"}}}"#,
        ),
    )
    .await
    .unwrap();
    assert_eq!(rig.upstream.count("/mcp"), 1, "{:#?}", rig.upstream.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_in_a_tool_call_body_to_an_unbound_host_is_refused() {
    let rig = Rig::start_with("5m", TOOL_POLICIES, Some(|_| TOOLS.to_owned()), true).await;
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        OTHER,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    let send = |body: &'static str| {
        Request::builder()
            .method("POST")
            .uri("/tickets")
            .header("host", format!("{OTHER}:{}", rig.upstream.port()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    // Allowed as a tool call without a placeholder (proves the route is recognised and
    // permitted: the upstream answers 404 for /tickets, which is its own).
    let ok = raw::send_h1(&mut sender, send(r#"{"title":"plain"}"#))
        .await
        .unwrap();
    assert_eq!(ok.status, StatusCode::NOT_FOUND, "{ok}");
    let record = allowed_record(&rig, OTHER).await;
    assert_eq!(
        record.tool.as_deref(),
        Some("tickets.create"),
        "{record:#?}"
    );

    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        OTHER,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    let reply = raw::send_h1(
        &mut sender,
        send(r#"{"title":"leak ostiary:github please"}"#),
    )
    .await
    .unwrap();
    assert_exfiltration_refused(&rig, &reply, "tool body").await;
    assert_eq!(
        rig.upstream.count("/tickets"),
        1,
        "only the clean call arrived"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Scrubbing every reflect mode.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reflection_mode_is_scrubbed() {
    let rig = Rig::start().await;
    for mode in ["json", "gzip", "br", "zstd", "deflate", "b64", "error"] {
        let path = format!("/reflect?mode={mode}");
        let reply = rig
            .get(
                BOUND,
                &path,
                &[("accept-encoding", "gzip, br, zstd, deflate")],
            )
            .await;
        assert_clean(&reply);
        let want = if mode == "error" { 500 } else { 200 };
        assert_eq!(reply.status.as_u16(), want, "{mode}: {reply}");
        assert!(
            reply.header("content-encoding").is_none(),
            "{mode}: the body must arrive decoded: {reply}"
        );
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        match mode {
            "b64" => {
                // The base64 of the echo had the secret at some alignment; it is gone, and
                // a marker stands where it was.
                assert!(body.contains(REDACTED), "{mode}: {body}");
            }
            "error" => {
                assert!(body.contains("<h1>Internal Server Error</h1>"), "{body}");
                assert!(
                    body.contains(&format!("authorization: Bearer {REDACTED}")),
                    "{body}"
                );
            }
            _ => {
                let echo: Value = serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("{mode}: decoded body is not JSON ({e}): {body}"));
                assert!(
                    echo["headers"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p[0] == "authorization" && p[1] == format!("Bearer {REDACTED}")),
                    "{mode}: {echo}"
                );
                // The upstream was asked for identity: a credential-bearing request must
                // be scrubbable without decoding.
                let sent = rig.upstream.seen().last().unwrap().clone();
                assert_eq!(sent.header("accept-encoding"), Some("identity"), "{mode}");
            }
        }
    }
    assert_eq!(rig.seen_at(BOUND).len(), 7);
    for seen in rig.seen_at(BOUND) {
        assert_eq!(
            seen.header("authorization"),
            Some(format!("Bearer {CANARY}").as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reflection_mode_is_scrubbed_over_h2() {
    let rig = Rig::start().await;
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        BOUND,
        rig.upstream.port(),
        &[b"h2"],
    )
    .await;
    let mut sender = raw::h2(tls).await;
    for mode in ["json", "gzip", "zstd", "b64", "error"] {
        let uri = format!(
            "https://{BOUND}:{}/reflect?mode={mode}",
            rig.upstream.port()
        );
        let req = raw::request("GET", &uri, None);
        let reply = raw::send_h2(&mut sender, req).await.unwrap();
        assert_clean(&reply);
        assert!(
            reply
                .body
                .windows(REDACTED.len())
                .any(|w| w == REDACTED.as_bytes()),
            "{mode}: {reply}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_stream_scrubbed() {
    let rig = Rig::start().await;
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        BOUND,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = raw::h1(tls).await;
    let req = request(
        "GET",
        "/reflect?mode=sse&delay_ms=2",
        BOUND,
        rig.upstream.port(),
        &[("accept", "text/event-stream")],
    );
    let response = tokio::time::timeout(raw::IO_DEADLINE, sender.send_request(req))
        .await
        .expect("head in time")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut all = Vec::new();
    let mut frames = 0;
    while let Some(frame) = tokio::time::timeout(raw::IO_DEADLINE, body.frame())
        .await
        .expect("frame in time")
    {
        let frame = frame.expect("frame");
        if let Ok(data) = frame.into_data() {
            frames += 1;
            let found = leaks_in("sse frame", &data, &ALL_SECRETS);
            assert!(found.is_empty(), "{found:#?}");
            all.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8_lossy(&all);
    assert!(
        frames > 1,
        "the events streamed in several frames: {frames}"
    );
    assert!(
        text.contains(&format!(
            "event: header\ndata: authorization: Bearer {REDACTED}\n\n"
        )),
        "{text}"
    );
    assert!(text.ends_with("event: end\ndata: done\n\n"), "{text}");
    assert!(leaks_in("sse", &all, &ALL_SECRETS).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_encoding_is_refused_and_nothing_of_the_body_passes() {
    let rig = Rig::start().await;
    let reply = rig.get(BOUND, "/reflect?mode=compress", &[]).await;
    let (_, record) = raw::assert_refused(&rig.proxy, &reply, 502, "upstream_error").await;
    assert_clean(&reply);
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        !body.contains("\"headers\""),
        "echo content reached the client: {body}"
    );
    assert!(reply.header("x-reflect-authorization").is_none(), "{reply}");
    assert!(reply.header("set-cookie").is_none(), "{reply}");
    assert_eq!(record.credentials, vec!["github".to_owned()], "{record:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_location_is_scrubbed_and_the_next_host_gets_nothing() {
    let rig = Rig::start().await;
    // The 302 itself, read raw.
    let reply = rig.get(BOUND, "/reflect?mode=redirect", &[]).await;
    assert_eq!(reply.status, StatusCode::FOUND, "{reply}");
    assert_clean(&reply);
    let location = reply
        .header("location")
        .unwrap_or_else(|| panic!("{reply}"));
    assert!(
        location.starts_with(&format!(
            "https://{OTHER}:{}/reflect?auth=",
            rig.upstream.port()
        )),
        "{location}"
    );
    assert!(location.contains("REDACTED"), "{location}");

    // curl following it, through the proxy.
    let env = rig.env();
    let url = format!(
        "https://{BOUND}:{}/reflect?mode=redirect",
        rig.upstream.port()
    );
    let out = curl(&["-L", "-i", "--max-redirs", "2", &url], &borrow(&env)).await;
    let found = leaks_in("curl stdout", out.stdout.as_bytes(), &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}\n{out}");
    assert!(
        leaks_in("curl stderr", out.stderr.as_bytes(), &ALL_SECRETS).is_empty(),
        "{out}"
    );
    let at_other = rig.seen_at(OTHER);
    assert_eq!(
        at_other.len(),
        1,
        "curl followed the redirect once:\n{out}\n{at_other:#?}"
    );
    let followed = &at_other[0];
    assert!(
        leaks_in(
            "redirect target",
            seen_text(followed).as_bytes(),
            &ALL_SECRETS
        )
        .is_empty(),
        "re-injected or leaked towards {OTHER}: {followed:#?}"
    );
    assert!(followed.header("authorization").is_none(), "{followed:#?}");
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains("HTTP/1.1 302") || out.stdout.contains("HTTP/2 302"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_without_secrets_is_byte_identical() {
    let rig = Rig::start().await;
    let via_proxy = rig.get(BOUND, "/reflect?mode=plain", &[]).await;
    assert_eq!(via_proxy.status, StatusCode::OK, "{via_proxy}");
    // Direct, trusting the upstream's CA, no proxy.
    let tcp = tokio::net::TcpStream::connect(rig.upstream.addr())
        .await
        .unwrap();
    let tls = raw::tls(
        tcp,
        raw::client_config(&rig.upstream.ca_pem(), &[b"http/1.1"]),
        BOUND,
    )
    .await
    .unwrap();
    let mut sender = raw::h1(tls).await;
    let direct = raw::send_h1(
        &mut sender,
        request(
            "GET",
            "/reflect?mode=plain",
            BOUND,
            rig.upstream.port(),
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(direct.status, StatusCode::OK);
    assert_eq!(direct.body, ostiary_e2e::upstream::plain_reflect_body());
    assert!(
        via_proxy.body == direct.body,
        "the proxy changed a body without secrets ({} vs {} bytes)",
        via_proxy.body.len(),
        direct.body.len()
    );
    assert_eq!(via_proxy.header("x-plain"), direct.header("x-plain"));
    assert_eq!(via_proxy.header("content-type"), Some("text/plain"));
    // The credential was injected all the same, so the scrubber was in the path.
    let injected = rig.seen_at(BOUND);
    assert_eq!(
        injected[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
}

/// KNOWN GAP (fails): `Scrubber::scrub_headers` (proxy/src/scrub/mod.rs) rewrites header
/// values only, so an upstream that reflects a secret into a header *name* passes it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reflected_into_a_header_name_is_scrubbed() {
    let rig = Rig::start().await;
    let reply = rig.get(LOWER_HOST, "/reflect?mode=names", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert_eq!(
        rig.only_seen_at(LOWER_HOST).header("x-api-key"),
        Some(CANARY_LOWER)
    );
    // The value reflections are scrubbed...
    assert_eq!(reply.header("x-reflect-x-api-key"), Some(REDACTED));
    // ...and the name reflection must be too.
    assert_clean(&reply);
}

/// KNOWN GAP (fails): the scrubber knows raw, base64 and percent-encoded forms, not JSON's
/// `\/` escape, so a PHP-style JSON echo of a secret holding `/` reaches the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reflected_in_escaped_json_is_scrubbed() {
    let rig = Rig::start().await;
    let reply = rig.get(SLASH_HOST, "/reflect?mode=json_slashes", &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert_eq!(
        rig.only_seen_at(SLASH_HOST).header("x-api-key"),
        Some(CANARY_SLASH)
    );
    assert_clean(&reply);
    let escaped = CANARY_SLASH.replace('/', "\\/");
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        !body.contains(&escaped),
        "the JSON-escaped secret {escaped} reached the client:\n{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reflecting_the_secret_are_scrubbed() {
    let rig = Rig::start().await;
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        BOUND,
        rig.upstream.port(),
        &[b"h2"],
    )
    .await;
    let mut sender = raw::h2(tls).await;
    let uri = format!(
        "https://{BOUND}:{}/reflect?mode=trailers",
        rig.upstream.port()
    );
    let response = tokio::time::timeout(
        raw::IO_DEADLINE,
        sender.send_request(raw::request("GET", &uri, None)),
    )
    .await
    .expect("head in time")
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let collected = tokio::time::timeout(raw::IO_DEADLINE, response.into_body().collect())
        .await
        .expect("body in time")
        .unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the upstream's trailers reach an h2 client");
    assert_eq!(
        trailers
            .get("x-trailer-authorization")
            .map(|v| v.to_str().unwrap()),
        Some(format!("Bearer {REDACTED}").as_str()),
        "{trailers:?}"
    );
    for (name, value) in &trailers {
        let found = leaks_in(&format!("trailer {name}"), value.as_bytes(), &ALL_SECRETS);
        assert!(found.is_empty(), "{found:#?}");
    }
    assert!(leaks_in("body", &collected.to_bytes(), &ALL_SECRETS).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_phrase_reflecting_the_secret_is_scrubbed() {
    let rig = Rig::start_with("5m", ALLOW_ALL, None, false).await;
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        BOUND,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut wire = raw::Wire::new(tls);
    let head = format!(
        "GET /reflect?mode=reason HTTP/1.1\r\nHost: {BOUND}:{}\r\nConnection: close\r\n\r\n",
        rig.upstream.port()
    );
    wire.send(head.as_bytes()).await.unwrap();
    // Read the raw bytes: the status line is what matters here.
    let mut tls = wire.into_inner();
    let mut bytes = Vec::new();
    let _ = tokio::time::timeout(
        raw::IO_DEADLINE,
        tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut bytes),
    )
    .await
    .expect("answer in time");
    let text = String::from_utf8_lossy(&bytes);
    let status_line = text.lines().next().unwrap_or_default();
    // The reflected phrase arrives, scrubbed.
    assert_eq!(
        status_line,
        format!("HTTP/1.1 200 Echo Bearer {REDACTED}"),
        "{text}"
    );
    assert!(
        rig.only_seen_at(BOUND).header("authorization") == Some(&format!("Bearer {CANARY}")),
        "the upstream got the credential"
    );
    let found = leaks_in("raw response", &bytes, &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}\n{text}");
}

/// KNOWN BUG (fails): `codings()` in proxy/src/scrub/body.rs lowercases an unknown
/// `Content-Encoding` token and puts it in `ScrubError::UndecodableEncoding`, whose text
/// becomes the 502 body's `message`, the audit `reason` and the log line. The header was
/// scrubbed case-sensitively before, so an upstream that answers with the secret in upper
/// case gets the proxy itself to rebuild an all-lowercase secret for the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_changed_secret_in_content_encoding_is_not_rebuilt_in_the_error() {
    let rig = Rig::start().await;
    let reply = rig
        .get(LOWER_HOST, "/reflect?mode=encoding_upper", &[])
        .await;
    assert_eq!(
        rig.only_seen_at(LOWER_HOST).header("x-api-key"),
        Some(CANARY_LOWER)
    );
    let (_, record) = raw::assert_refused(&rig.proxy, &reply, 502, "upstream_error").await;
    let audit = serde_json::to_string(&record).unwrap();
    let mut found = leaks(&reply, &ALL_SECRETS);
    found.extend(leaks_in("audit record", audit.as_bytes(), &ALL_SECRETS));
    assert!(found.is_empty(), "{found:#?}\n{reply}");
}

// ---------------------------------------------------------------------------------------
// 5. Plain http and upgrades to a bound host.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_a_bound_host_is_refused() {
    let rig = Rig::start().await;
    let url = format!("http://{BOUND}:{}/reflect", rig.upstream.port());
    let reply = raw::absolute_get(&rig.proxy, &url, &raw::auth_line(&rig.session.token)).await;
    let (body, _) = raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
    assert_eq!(body["reason"], "credential_needs_tls", "{reply}");
    assert_eq!(body["credential"], "github", "{reply}");
    assert_eq!(
        rig.upstream.connections(),
        0,
        "nothing reached the upstream"
    );
    // Control: plain http to an unbound host is forwarded (and fails at the TLS upstream
    // with an upstream error, not a credential refusal).
    let url = format!("http://{OTHER}:{}/reflect", rig.upstream.port());
    let reply = raw::absolute_get(&rig.proxy, &url, &raw::auth_line(&rig.session.token)).await;
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
    let (body, _) = raw::assert_refused(&rig.proxy, &reply, 403, "denied").await;
    assert_eq!(body["reason"], "credential_over_upgrade", "{reply}");
    assert_eq!(body["credential"], "github", "{reply}");
    assert_eq!(rig.upstream.count("/ws"), 0);
    // Control: the same handshake to an unbound host switches protocols.
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        OTHER,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut wire = raw::Wire::new(tls);
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
    assert_eq!(reply.status, StatusCode::SWITCHING_PROTOCOLS, "{reply}");
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
    // The file itself gone (a new session, so nothing is cached).
    std::fs::remove_file(&rig.secrets).unwrap();
    let fresh = rig.proxy.session("agent-2").await;
    let reply = rig.send_as(&fresh, "GET", BOUND, "/reflect", &[]).await;
    assert_unavailable(&rig, &reply, "github").await;
    assert!(
        rig.upstream.seen().is_empty(),
        "the upstream saw a request without its credential: {:#?}",
        rig.upstream.seen()
    );
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
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert_eq!(auth_of_last(&rig), format!("Bearer {CANARY}"));

    const ROTATED: &str = "ghp_ROTATED_0e6d2c9b1a44";
    std::fs::write(&rig.secrets, secrets_toml(ROTATED)).unwrap();
    // The running session keeps its cached value...
    rig.get(BOUND, "/echo", &[]).await;
    assert_eq!(
        auth_of_last(&rig),
        format!("Bearer {CANARY}"),
        "cache ignored"
    );
    // ...a new session reads the file again...
    let fresh = rig.proxy.session("agent-2").await;
    rig.send_as(&fresh, "GET", BOUND, "/echo", &[]).await;
    assert_eq!(auth_of_last(&rig), format!("Bearer {ROTATED}"));
    // ...and the first one does once its TTL has passed.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let reply = rig.get(BOUND, "/reflect", &[]).await;
    assert_eq!(
        auth_of_last(&rig),
        format!("Bearer {ROTATED}"),
        "served past its TTL"
    );
    // The scrubber follows the rotation.
    let found = leaks(&reply, &[ROTATED, CANARY]);
    assert!(found.is_empty(), "{found:#?}\n{reply}");

    // Teardown: an open tunnel and a new CONNECT are both refused.
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.session.token,
        BOUND,
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut open = raw::h1(tls).await;
    rig.proxy
        .control()
        .delete_session(&rig.session.session_id)
        .await
        .expect("session deleted");
    let before = rig.seen_at(BOUND).len();
    let reply = raw::send_h1(
        &mut open,
        request("GET", "/echo", BOUND, rig.upstream.port(), &[]),
    )
    .await
    .unwrap();
    raw::assert_ostiary_error(&reply, 407, "unauthenticated");
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
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
}

// ---------------------------------------------------------------------------------------
// 8. The canary in audit, metrics and error bodies.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_is_in_no_audit_record_metric_or_error_body() {
    let rig = Rig::start().await;
    let mut replies = Vec::new();
    for path in [
        "/reflect",
        "/reflect?mode=gzip",
        "/reflect?mode=error",
        "/reflect?mode=compress",
        "/reflect?mode=redirect",
    ] {
        replies.push(
            rig.get(BOUND, path, &[("x-api-key", "ostiary:github")])
                .await,
        );
    }
    replies.push(rig.get(OTHER, "/reflect?t=ostiary:github", &[]).await);
    replies.push(rig.get(CRLF_HOST, "/reflect", &[]).await);
    replies.push(rig.get(MISSING_HOST, "/reflect", &[]).await);
    replies.push(rig.get(BASIC_HOST, "/reflect?mode=error", &[]).await);
    replies.push(
        rig.get(QUERY_HOST, "/reflect?mode=redirect&api_key=x", &[])
            .await,
    );
    let url = format!("http://{BOUND}:{}/reflect", rig.upstream.port());
    replies.push(raw::absolute_get(&rig.proxy, &url, &raw::auth_line(&rig.session.token)).await);
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(
        statuses,
        [200, 200, 500, 502, 302, 403, 503, 503, 500, 302, 403]
    );
    for reply in &replies {
        assert_clean(reply);
    }
    // The upstream did receive them (the canary existed in the exchange).
    assert!(rig
        .seen_at(BOUND)
        .iter()
        .all(|s| s.header("x-api-key") == Some(CANARY)));

    // Audit, through the API...
    let records = rig.proxy.audit().await;
    assert!(records.len() >= replies.len(), "{records:#?}");
    let json = serde_json::to_string(&records).unwrap();
    let found = leaks_in("audit records", json.as_bytes(), &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}");
    // ...and every cell of every table of the SQLite store.
    let conn = rusqlite::Connection::open_with_flags(
        &rig.proxy.shared.db_path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(tables.iter().any(|t| t.contains("audit")), "{tables:?}");
    let mut cells = 0usize;
    for table in &tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..columns {
                let bytes: Vec<u8> = match row.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                        t.to_vec()
                    }
                    other => format!("{other:?}").into_bytes(),
                };
                cells += 1;
                let found = leaks_in(&format!("{table} column {i}"), &bytes, &ALL_SECRETS);
                assert!(found.is_empty(), "{found:#?}");
            }
        }
    }
    assert!(cells > 0);

    // Metrics.
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", rig.proxy.control_addr))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .unwrap();
    assert!(metrics.status().is_success());
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("github"),
        "credential metrics name the binding:\n{metrics}"
    );
    assert!(
        metrics.lines().any(|l| !l.starts_with('#')
            && l.contains("exfiltration")
            && l.contains("\"github\"")
            && !l.ends_with(" 0")),
        "the placeholder exfiltration attempt is counted:\n{metrics}"
    );
    let found = leaks_in("metrics", metrics.as_bytes(), &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}");
}
