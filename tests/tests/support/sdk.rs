//! The rig of tests/tests/sdk_rust.rs: a loopback HTTPS upstream for `api.example.test` and
//! `secure.example.test`, a proxy in front of it with the catalog and policies that test's
//! table lists, and helpers that read the SDK's errors.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{AgentClient, ControlClient, NewSession, Refusal, SdkError, Session};

pub(crate) const API: &str = "api.example.test";
pub(crate) const SECURE: &str = "secure.example.test";
pub(crate) const APPROVER: &str = "alice@example.com";

pub(crate) const TOOLS: &str = r#"
[[tool]]
name = "demo.read"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/read/{id}" }

[[tool]]
name = "demo.write"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/write/{id}" }
args_schema = { type = "object", properties = { title = { type = "string" } } }

[[tool]]
name = "demo.delete"
tier = "irreversible"
match = { host = "api.example.test", method = "DELETE", path = "/idem/delete/{id}" }

[[tool]]
name = "demo.secret"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/secret/{id}" }

[[tool]]
name = "vault.read"
tier = "read"
match = { host = "secure.example.test", method = "GET", path = "/idem/vault/{id}" }
"#;

pub(crate) const POLICIES: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);

@id("no-secrets")
forbid (principal, action == Ostiary::Action::"tool:demo.secret", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };

@id("plain-http")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test");
"#;

/// An upstream, a proxy in front of it, and the secrets file its broker reads.
pub(crate) struct Rig {
    pub(crate) upstream: Upstream,
    pub(crate) proxy: TestProxy,
    _secrets: tempfile::TempDir,
}

impl Rig {
    pub(crate) async fn start() -> Self {
        Self::start_with("").await
    }

    /// `tiers` is appended to the config (more `[tiers.*]` settings).
    pub(crate) async fn start_with(tiers: &str) -> Self {
        let upstream = Upstream::builder()
            .names(&[API, SECURE, "localhost"])
            .start()
            .await;
        let secrets = tempfile::tempdir().unwrap();
        let file = secrets.path().join("secrets.toml");
        std::fs::write(&file, "present = \"not-used\"\n").unwrap();
        let extra = format!(
            r#"
[approvals]
approvers = ["{APPROVER}"]
tick = "100ms"

[tiers.write]
repeat_max = 3
budget = "2s"

{tiers}

[broker]
backend = "file"
file = "{file}"

[[credential]]
name = "vaulted"
source = {{ file = "absent" }}
hosts = ["{SECURE}"]
inject = {{ header = "X-Api-Key", value = "{{secret}}" }}
"#,
            file = file.display()
        );
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(TOOLS.into()),
            names: vec![API.into(), SECURE.into()],
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra,
            ..Default::default()
        })
        .await;
        Self {
            upstream,
            proxy,
            _secrets: secrets,
        }
    }

    pub(crate) fn control(&self) -> ControlClient {
        ControlClient::builder()
            .url(format!("http://{}", self.proxy.control_addr))
            .admin_token(&self.proxy.admin_token)
            .build()
            .expect("the control client builds")
    }

    pub(crate) async fn session(&self, new: NewSession) -> Session {
        self.control()
            .create_session(&new)
            .await
            .expect("session created")
    }

    pub(crate) async fn agent(&self, name: &str) -> (Session, AgentClient) {
        let session = self.session(agent(name)).await;
        let client = session.client().expect("the session's client builds");
        (session, client)
    }

    /// `https://<host>:<port><path>` on the upstream, through the proxy.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("https://{API}:{}{path}", self.upstream.port())
    }

    pub(crate) fn url_on(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.upstream.port())
    }
}

pub(crate) fn agent(name: &str) -> NewSession {
    NewSession {
        agent: name.into(),
        ..Default::default()
    }
}

/// A path no other call used: identical calls trip the watchdog.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The proxy's refusal in `result`, or a panic saying what came instead.
pub(crate) fn refused<T: std::fmt::Debug>(result: Result<T, SdkError>) -> Refusal {
    match result {
        Err(SdkError::Refused(refusal)) => *refusal,
        other => panic!("expected the proxy's refusal, got {other:?}"),
    }
}

/// The control API's refusal in `result`: its status and typed reading.
pub(crate) fn api_refusal<T: std::fmt::Debug>(result: Result<T, SdkError>) -> (u16, Refusal) {
    match result {
        Err(SdkError::Api {
            status,
            refusal: Some(refusal),
            ..
        }) => (status, *refusal),
        other => panic!("expected a control API refusal, got {other:?}"),
    }
}

pub(crate) fn config_error<T: std::fmt::Debug>(result: Result<T, SdkError>) -> String {
    match result {
        Err(SdkError::Config(message)) => message,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

/// A loopback port nothing listens on.
pub(crate) async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Hold a `DELETE` for approval through `client`; the pending refusal's approval id.
pub(crate) async fn hold(rig: &Rig, client: &AgentClient, item: &str) -> String {
    let pending = match refused(
        client
            .send(client.delete(rig.url(&format!("/idem/delete/{item}"))))
            .await,
    ) {
        Refusal::ApprovalPending(p) => p,
        other => panic!("not held: {other:?}"),
    };
    pending.approval_id().expect("an approval id").to_owned()
}
