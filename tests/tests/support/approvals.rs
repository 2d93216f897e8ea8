//! Shared by the approval-queue test crates (`approvals.rs`, `approvals_channels.rs`,
//! `approvals_browser.rs`): a TLS upstream whose `/idem/` routes honour `Idempotency-Key`
//! (and record each effect once), a proxy with a catalog of one irreversible tool that
//! policy escalates, and an agent client (reqwest through the proxy, trusting its CA).
//! Each crate uses a subset, so unused items are allowed here.
#![allow(dead_code)]

use std::time::Duration;

use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use serde_json::Value;

/// `pay.refund` and `pay.echo` (the upstream's reflecting route) are irreversible
/// (escalated); `pay.lookup` is a read (allowed).
pub(crate) const TOOLS: &str = r#"
[[tool]]
name = "pay.refund"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/idem/refunds/{charge}" }
impact = { records = "/ids" }
cost = 0.25

[[tool]]
name = "pay.echo"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/reflect" }

[[tool]]
name = "pay.lookup"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/lookup" }
"#;

pub(crate) const POLICIES: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

/// The same, with irreversible calls forbidden outright (a policy change after approval).
pub(crate) const POLICIES_LOCKED: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("no-refunds")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource);
"#;

pub(crate) const APPROVER: &str = "alice@example.com";

/// An upstream, a proxy, and one agent session.
pub(crate) struct Rig {
    pub upstream: Upstream,
    pub proxy: TestProxy,
    pub session: Session,
    pub agent: Agent,
}

impl Rig {
    /// `approvals` is the body of the `[approvals]` section (approvers etc.).
    pub(crate) async fn start(approvals: &str) -> Self {
        Self::start_with(approvals, POLICIES).await
    }

    pub(crate) async fn start_with(approvals: &str, policies: &str) -> Self {
        Self::start_on(approvals, policies, None).await
    }

    /// The same, with the proxy's state in `state_dir` (for a test that reaches into it).
    pub(crate) async fn start_on(
        approvals: &str,
        policies: &str,
        state_dir: Option<std::path::PathBuf>,
    ) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            state_dir,
            policies: policies.into(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            watch_interval: Some("100ms".into()),
            extra_toml: format!("[approvals]\n{approvals}\n"),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        let agent = Agent::new(&proxy, &session);
        Self {
            upstream,
            proxy,
            session,
            agent,
        }
    }

    /// `https://api.example.test:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        self.upstream.url(path)
    }

    /// Ask for a refund of `charge` covering `ids`: held for approval. Returns the 202's
    /// approval id.
    pub(crate) async fn hold(&self, charge: &str, ids: &[u32]) -> String {
        let reply = self.refund(charge, ids, &[]).await;
        assert_eq!(reply.status, 202, "{reply:?}");
        assert_eq!(reply.json["error"], "approval_pending", "{reply:?}");
        let id = reply.json["approval_id"].as_str().unwrap().to_owned();
        assert_eq!(reply.header("ostiary-approval"), Some(id.as_str()));
        id
    }

    /// The refund request (the same bytes every time for the same arguments).
    pub(crate) async fn refund(&self, charge: &str, ids: &[u32], headers: &[(&str, &str)]) -> Resp {
        let body = refund_body(ids);
        self.agent
            .send(
                "POST",
                &self.url(&format!("/idem/refunds/{charge}")),
                Some(body),
                headers,
            )
            .await
    }

    /// Effects the upstream applied for `charge`.
    pub(crate) fn applied(&self, charge: &str) -> usize {
        let path = format!("/idem/refunds/{charge}");
        self.upstream
            .effects()
            .iter()
            .filter(|e| e.path == path)
            .count()
    }

    /// Requests for `charge` that reached the upstream at all.
    pub(crate) fn delivered(&self, charge: &str) -> usize {
        self.upstream
            .seen_path(&format!("/idem/refunds/{charge}"))
            .len()
    }

    /// Wait until approval `id` has status `status` (polling the admin API).
    pub(crate) async fn wait_status(&self, id: &str, status: &str) -> Value {
        let control = self.proxy.control();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let a = control.approval(id).await.unwrap();
            if a["status"] == status {
                return a;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "approval {id} never reached {status}: {a:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub(crate) fn refund_body(ids: &[u32]) -> String {
    serde_json::json!({ "ids": ids, "reason": "duplicate charge" }).to_string()
}

/// The agent's HTTP client: through the proxy with its session token, trusting its CA.
#[derive(Clone)]
pub(crate) struct Agent {
    client: reqwest::Client,
    /// The session token, for the status URL called directly.
    pub token: String,
}

impl Agent {
    pub(crate) fn new(proxy: &TestProxy, session: &Session) -> Self {
        let ca = reqwest::Certificate::from_pem(proxy.ca_pem.as_bytes()).unwrap();
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(proxy.proxy_url(session)).unwrap())
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Self {
            client,
            token: session.token.clone(),
        }
    }

    pub(crate) async fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<String>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.client.request(method, url);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        Resp::from(req.send().await.expect("request through the proxy")).await
    }

    /// GET the status URL through the proxy.
    pub(crate) async fn status(&self, url: &str, headers: &[(&str, &str)]) -> Resp {
        self.send("GET", url, None, headers).await
    }
}

/// A response, read whole.
#[derive(Debug)]
pub(crate) struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
    /// The body as JSON (`Null` when it is not JSON).
    pub json: Value,
}

impl Resp {
    pub(crate) async fn from(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.text().await.unwrap_or_default();
        let json = serde_json::from_str(&body).unwrap_or(Value::Null);
        Self {
            status,
            headers,
            body,
            json,
        }
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}
