//! Shared by the brokered-credential test crates (`credentials_inject.rs`,
//! `credentials_scrub.rs`, `credentials_cli.rs`): the canary secrets and the hosts they are
//! bound to, the rig (a TLS upstream that reflects what it receives, a proxy with the file
//! backend, one session), requests through intercepted tunnels, and the checks that no form
//! of a secret reached the client. Each crate uses a subset, so unused items are allowed
//! here rather than duplicated per file.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper::client::conn::{http1, http2};
use ostiary::audit::AuditRecord;
use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::raw::{self, Reply, ReqBody};
use ostiary_e2e::upstream::{Seen, Upstream};
use ostiary_sdk::Session;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The secret of the `github` binding (header injection on `api.example.test`).
pub(crate) const CANARY: &str = "ghp_CANARY_5f3a9e1c7b2d";
/// The secret of the `basic` binding (basic auth on `basic.example.test`).
pub(crate) const CANARY_BASIC: &str = "bsc_CANARY_91d2e7a04f6b";
/// The secret of the `query` binding (query parameter on `query.example.test`).
pub(crate) const CANARY_QUERY: &str = "qry_CANARY_3c8b5e2f9a17";
/// An all-lowercase secret (hex-ish API keys are), for reflections that lowercase.
pub(crate) const CANARY_LOWER: &str = "lc_canary_7e3f9a2b5c1d";
/// A secret with `/` (AWS secret keys have them), for reflections that escape it.
pub(crate) const CANARY_SLASH: &str = "sl/CANARY/4d2a8c6e0f13";
/// What the scrubber puts where a secret was.
pub(crate) const REDACTED: &str = "[REDACTED by ostiary]";

pub(crate) const ALL_SECRETS: [&str; 5] = [
    CANARY,
    CANARY_BASIC,
    CANARY_QUERY,
    CANARY_LOWER,
    CANARY_SLASH,
];

pub(crate) const BOUND: &str = "api.example.test";
pub(crate) const OTHER: &str = "other.example.test";
pub(crate) const BASIC_HOST: &str = "basic.example.test";
pub(crate) const QUERY_HOST: &str = "query.example.test";
pub(crate) const MISSING_HOST: &str = "missing.example.test";
pub(crate) const CRLF_HOST: &str = "crlf.example.test";
pub(crate) const NUL_HOST: &str = "nul.example.test";
pub(crate) const LOWER_HOST: &str = "lower.example.test";
pub(crate) const SLASH_HOST: &str = "slash.example.test";

pub(crate) const HOSTS: [&str; 9] = [
    BOUND,
    OTHER,
    BASIC_HOST,
    QUERY_HOST,
    MISSING_HOST,
    CRLF_HOST,
    NUL_HOST,
    LOWER_HOST,
    SLASH_HOST,
];

/// The secrets file: one value with CR/LF and one with NUL, which must never become a
/// header.
pub(crate) fn secrets_toml(github: &str) -> String {
    format!(
        "github = \"{github}\"\nbasic = \"{CANARY_BASIC}\"\nquery = \"{CANARY_QUERY}\"\n\
         crlf = \"{CANARY}\\r\\nX-Evil: 1\"\nnul = \"{CANARY}\\u0000X-Evil\"\n\
         lower = \"{CANARY_LOWER}\"\n\
         slash = \"{CANARY_SLASH}\"\n"
    )
}

/// The `[broker]` and `[[credential]]` tables of every rig.
pub(crate) fn broker_toml(file: &Path, ttl: &str) -> String {
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
name = "nul"
source = {{ file = "nul" }}
hosts = ["{NUL_HOST}"]
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

/// `Bearer <secret>`, the value the `github` binding injects.
pub(crate) fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// An upstream answering to every test name, a proxy with the file backend, one session.
pub(crate) struct Rig {
    pub(crate) upstream: Upstream,
    pub(crate) proxy: TestProxy,
    pub(crate) session: Session,
    pub(crate) secrets: PathBuf,
    _secrets_dir: tempfile::TempDir,
}

impl Rig {
    pub(crate) async fn start() -> Self {
        Self::start_with("5m", ALLOW_ALL, None, true).await
    }

    /// `http2: false` makes the upstream HTTP/1.1-only (reason phrases travel).
    pub(crate) async fn start_with(
        ttl: &str,
        policies: &str,
        tools: Option<fn(u16) -> String>,
        http2: bool,
    ) -> Self {
        Self::start_from(ttl, policies, tools, http2, &secrets_toml(CANARY)).await
    }

    /// [`Rig::start`] with the file backend holding `secrets` (TOML) at start-up.
    pub(crate) async fn start_with_file(secrets: &str) -> Self {
        Self::start_from("5m", ALLOW_ALL, None, true, secrets).await
    }

    async fn start_from(
        ttl: &str,
        policies: &str,
        tools: Option<fn(u16) -> String>,
        http2: bool,
        secrets_text: &str,
    ) -> Self {
        let mut names: Vec<&str> = HOSTS.to_vec();
        names.push("localhost");
        let upstream = Upstream::builder().names(&names).http2(http2).start().await;
        let secrets_dir = tempfile::tempdir().unwrap();
        let secrets = secrets_dir.path().join("secrets.toml");
        std::fs::write(&secrets, secrets_text).unwrap();
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

    /// A fresh intercepted tunnel to `host` as `session`, offering `alpn`.
    pub(crate) async fn tunnel_as(
        &self,
        session: &Session,
        host: &str,
        alpn: &[&[u8]],
    ) -> TlsStream<TcpStream> {
        raw::intercepted(
            &self.proxy,
            &session.token,
            host,
            self.upstream.port(),
            alpn,
        )
        .await
    }

    /// A fresh intercepted tunnel to `host` as the rig's session, offering `alpn`.
    pub(crate) async fn tunnel(&self, host: &str, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
        self.tunnel_as(&self.session, host, alpn).await
    }

    /// An HTTP/1.1 connection over a fresh intercepted tunnel to `host`.
    pub(crate) async fn h1(&self, host: &str) -> http1::SendRequest<ReqBody> {
        raw::h1(self.tunnel(host, &[b"http/1.1"]).await).await
    }

    /// An HTTP/2 connection over a fresh intercepted tunnel to `host`.
    pub(crate) async fn h2(&self, host: &str) -> http2::SendRequest<ReqBody> {
        raw::h2(self.tunnel(host, &[b"h2"]).await).await
    }

    /// A bodiless origin-form request for `host` on the upstream's port.
    pub(crate) fn request(
        &self,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Request<ReqBody> {
        request(method, path, host, self.upstream.port(), headers)
    }

    /// `scheme://host:<upstream port>path`.
    pub(crate) fn url(&self, scheme: &str, host: &str, path: &str) -> String {
        format!("{scheme}://{host}:{}{path}", self.upstream.port())
    }

    /// One request through a fresh intercepted tunnel to `host` (HTTP/1.1), as `session`.
    pub(crate) async fn send_as(
        &self,
        session: &Session,
        method: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut sender = raw::h1(self.tunnel_as(session, host, &[b"http/1.1"]).await).await;
        let req = self.request(method, host, path, headers);
        raw::send_h1(&mut sender, req)
            .await
            .unwrap_or_else(|e| panic!("{method} {host}{path}: {e}"))
    }

    pub(crate) async fn get(&self, host: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send_as(&self.session, "GET", host, path, headers)
            .await
    }

    /// `POST path` with a JSON `body` through a fresh intercepted tunnel to `host`.
    pub(crate) async fn post_json(
        &self,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> Reply {
        self.post_json_as(&self.session, host, path, headers, body)
            .await
    }

    /// [`Rig::post_json`] as `session`.
    pub(crate) async fn post_json_as(
        &self,
        session: &Session,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &'static str,
    ) -> Reply {
        let mut builder = Request::builder()
            .method("POST")
            .uri(path)
            .header("host", format!("{host}:{}", self.upstream.port()))
            .header("content-type", "application/json");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let req = builder
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let mut sender = raw::h1(self.tunnel_as(session, host, &[b"http/1.1"]).await).await;
        raw::send_h1(&mut sender, req)
            .await
            .unwrap_or_else(|e| panic!("POST {host}{path}: {e}"))
    }

    /// `GET http://host:port/path` in absolute form on the proxy listener (plain http).
    pub(crate) async fn plain_get(&self, host: &str, path: &str) -> Reply {
        let url = self.url("http", host, path);
        raw::absolute_get(&self.proxy, &url, &raw::auth_line(&self.session.token)).await
    }

    /// Requests the upstream received over a TLS connection whose SNI was `host`.
    pub(crate) fn seen_at(&self, host: &str) -> Vec<Seen> {
        seen_at(&self.upstream, host)
    }

    /// The one request the upstream received for `host`.
    pub(crate) fn only_seen_at(&self, host: &str) -> Seen {
        let seen = self.seen_at(host);
        assert_eq!(
            seen.len(),
            1,
            "expected exactly one request at {host}: {seen:#?}"
        );
        seen.into_iter().next().unwrap()
    }

    /// The upstream received no request at all.
    pub(crate) fn assert_upstream_saw_nothing(&self, why: &str) {
        let seen = self.upstream.seen();
        assert!(seen.is_empty(), "the upstream saw {why}: {seen:#?}");
    }

    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.proxy.client_env(&self.session)
    }
}

/// Requests `upstream` received over a TLS connection whose SNI was `host`.
pub(crate) fn seen_at(upstream: &Upstream, host: &str) -> Vec<Seen> {
    upstream
        .seen()
        .into_iter()
        .filter(|s| s.sni.as_deref() == Some(host))
        .collect()
}

pub(crate) fn request(
    method: &str,
    path: &str,
    host: &str,
    port: u16,
    headers: &[(&str, &str)],
) -> Request<ReqBody> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("{host}:{port}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// `fut` within [`raw::IO_DEADLINE`], or a panic naming `what`.
pub(crate) async fn in_time<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(raw::IO_DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} not in time"))
}

pub(crate) fn assert_status(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status, "{reply}");
}

/// Every form of `secret` a client must never see: raw, percent-encoded, base64 and
/// base64url whole (padded or not), and the characters that any base64/base64url blob
/// holding the secret at one of the three byte alignments must contain.
pub(crate) fn forms(secret: &str) -> Vec<String> {
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
pub(crate) fn leaks_in(what: &str, haystack: &[u8], secrets: &[&str]) -> Vec<String> {
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

/// No form of any of [`ALL_SECRETS`] in `haystack`.
pub(crate) fn assert_no_leak(what: &str, haystack: &[u8]) {
    let found = leaks_in(what, haystack, &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}");
}

/// Every canary form in status, headers (names and values) and body of `reply`.
pub(crate) fn leaks(reply: &Reply, secrets: &[&str]) -> Vec<String> {
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

/// No form of any of `secrets` in the status, headers or body of `reply`.
pub(crate) fn assert_clean_of(reply: &Reply, secrets: &[&str]) {
    let found = leaks(reply, secrets);
    assert!(
        found.is_empty(),
        "secret leaked to the client: {found:#?}\n{reply}"
    );
}

/// No form of any of [`ALL_SECRETS`] in the status, headers or body of `reply`.
pub(crate) fn assert_clean(reply: &Reply) {
    assert_clean_of(reply, &ALL_SECRETS);
}

/// The upstream's reflection of the injected `Authorization` arrived, redacted.
pub(crate) fn assert_reflected_auth_redacted(reply: &Reply) {
    assert_eq!(
        reply.header("x-reflect-authorization"),
        Some(bearer(REDACTED).as_str()),
        "{reply}"
    );
}

/// Everything the upstream saw of one request, as text, to look for values in.
pub(crate) fn seen_text(seen: &Seen) -> String {
    let mut text = format!("{}\n", seen.path);
    for (name, value) in &seen.headers {
        text.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    text
}

pub(crate) fn query_values<'a>(path: &'a str, name: &str) -> Vec<&'a str> {
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
pub(crate) async fn allowed_record(rig: &Rig, host: &str) -> AuditRecord {
    raw::wait_for_audit(&rig.proxy, host, |r| {
        r.kind == "http" && r.decision == "allow" && r.host.as_deref() == Some(host)
    })
    .await
}

pub(crate) fn borrow(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
