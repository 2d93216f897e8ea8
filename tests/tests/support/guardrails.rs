//! The guardrail tests' rig: a proxy with a small tool catalog over a test upstream, and
//! sessions (agents) created through the control API, each with its own client.

#![allow(dead_code)]

use std::time::Duration;

use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use serde_json::{json, Value};

const TOOLS: &str = r#"
[[tool]]
name = "t.read"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/read/{id}" }

[[tool]]
name = "t.write"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/write/{id}" }
cost = 0.4

[[tool]]
name = "t.irrev"
tier = "irreversible"
match = { host = "api.example.test", method = "DELETE", path = "/idem/irrev/{id}" }

[[tool]]
name = "t.guarded"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/guarded/{id}" }
"#;

/// Everything allowed, except that policy itself reads the session's usage.
pub const POLICIES: &str = r#"
@id("all-tiers")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);
@id("plain-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("guarded-after-two-calls")
forbid (principal, action == Ostiary::Action::"tool:t.guarded", resource)
when { context.session.calls >= 2 };
"#;

pub struct Rig {
    pub upstream: Upstream,
    pub proxy: TestProxy,
    pub http: reqwest::Client,
}

/// A session as the control API created it.
pub struct Agent {
    pub id: String,
    pub token: String,
    pub client: reqwest::Client,
    pub body: Value,
}

impl Rig {
    pub async fn start(extra: &str) -> Self {
        Self::start_with(extra, POLICIES).await
    }

    /// With other policies than [`POLICIES`].
    pub async fn start_with(extra: &str, policies: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: policies.into(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra.into(),
            ..Default::default()
        })
        .await;
        Rig {
            upstream,
            proxy,
            http: reqwest::Client::new(),
        }
    }

    pub fn control_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.control_addr)
    }

    /// A control API call with the admin token (or `bearer` instead).
    pub async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        bearer: Option<&str>,
    ) -> (u16, Value) {
        let token = bearer.unwrap_or(&self.proxy.admin_token);
        let mut req = self
            .http
            .request(method, self.control_url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A control API call about `agent`'s session: `/v1/sessions/{id}{suffix}`, or its
    /// dead letters (`suffix` = `"dead-letters"`).
    pub async fn session_call(
        &self,
        method: reqwest::Method,
        agent: &Agent,
        suffix: &str,
    ) -> (u16, Value) {
        let path = match suffix {
            "dead-letters" => format!("/v1/dead-letters?session={}", agent.id),
            _ => format!("/v1/sessions/{}{suffix}", agent.id),
        };
        self.control(method, &path, None, None).await
    }

    /// The same session through the proxy's current listener (after a restart).
    pub fn reconnect(&self, agent: Agent) -> Agent {
        Agent {
            client: self.client_for(&agent.token),
            ..agent
        }
    }

    pub fn client_for(&self, token: &str) -> reqwest::Client {
        client_for(&self.proxy, token)
    }

    /// Create a session (`body` as `POST /v1/sessions` takes it); `parent`: as that
    /// session, with its token.
    pub async fn agent(&self, body: Value, parent: Option<&Agent>) -> Result<Agent, (u16, Value)> {
        let (status, created) = self
            .control(
                reqwest::Method::POST,
                "/v1/sessions",
                Some(body),
                parent.map(|p| p.token.as_str()),
            )
            .await;
        if status != 201 {
            return Err((status, created));
        }
        let token = created["token"].as_str().unwrap().to_owned();
        let client = self.client_for(&token);
        Ok(Agent {
            id: created["session_id"].as_str().unwrap().to_owned(),
            token,
            client,
            body: created,
        })
    }

    /// `POST /idem/write/{id}` (the `t.write` tool, cost 0.4) with an empty JSON body.
    pub async fn write(&self, agent: &Agent, id: &str) -> (u16, Value, reqwest::header::HeaderMap) {
        self.call(
            agent,
            "POST",
            &format!("/idem/write/{id}"),
            &[],
            Some(json!({})),
        )
        .await
    }

    pub async fn call(
        &self,
        agent: &Agent,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = agent.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            self.upstream.url(path),
        );
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = match req.send().await {
            Ok(response) => response,
            // A tunnel refused at CONNECT (the session is gone) never gets to a response.
            Err(e) if format!("{e:?}").contains("ProxyAuthRequired") => {
                return (407, Value::Null, Default::default())
            }
            Err(e) => panic!("{e:?}"),
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }
}

/// An HTTPS client through `proxy` with a session's `token`, trusting the proxy's CA.
pub fn client_for(proxy: &TestProxy, token: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://agent:{token}@{}", proxy.proxy_addr)).unwrap())
        .add_root_certificate(reqwest::Certificate::from_pem(proxy.ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
