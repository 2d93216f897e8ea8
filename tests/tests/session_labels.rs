//! Policies that remember the session, end to end: a real proxy over a TLS upstream serving
//! several hosts, sessions made through the control API, reqwest through the proxy.
//!
//! The lethal trifecta: a session that read a `private_data` tool and fetched from an
//! `untrusted_input` host may not POST to an external host (denied) nor publish a paste
//! without a human (escalated), where a fresh session may do both; its child, spawned after,
//! is refused the same; the taint outlives a restart. And windowed counts: the fourth
//! refund of the hour waits for a human.

use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use serde_json::{json, Value};

const HOSTS: &[&str] = &[
    "crm.example.test",
    "news.example.test",
    "upload.example.test",
    "pay.example.test",
];

const TOOLS: &str = r#"
[[tool]]
name   = "crm.read_customer"
tier   = "read"
match  = { host = "crm.example.test", method = "GET", path = "/idem/customers/{id}" }
labels = ["private_data"]

[[tool]]
name  = "paste.create"
tier  = "write"
match = { host = "upload.example.test", method = "POST", path = "/idem/pastes" }

[[tool]]
name  = "pay.refund"
tier  = "write"
match = { host = "pay.example.test", method = "POST", path = "/idem/refunds" }

[[host]]
name   = "news.example.test"
labels = ["untrusted_input"]
"#;

const POLICIES: &str = r#"
@id("tools")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);

@id("http")
permit (principal, action == Ostiary::Action::"http", resource);

@id("no-exfiltration-after-private-and-untrusted")
forbid (principal, action == Ostiary::Action::"http", resource)
when {
  context.method == "POST" &&
  context.session.labels.contains("private_data") &&
  context.session.labels.contains("untrusted_input")
};

@id("paste-after-private-and-untrusted-needs-a-human")
@escalate("approval")
forbid (principal, action == Ostiary::Action::"tool:paste.create", resource)
when { context.session.labels.containsAll(["private_data", "untrusted_input"]) }
unless { context.approval.granted };

@id("more-than-3-refunds-an-hour-needs-a-human")
@escalate("approval")
forbid (principal, action == Ostiary::Action::"tool:pay.refund", resource)
when { context.session.recent.tool_1h >= 3 }
unless { context.approval.granted };
"#;

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    http: reqwest::Client,
}

/// A session as the control API made it, with a client going through the proxy.
struct Agent {
    id: String,
    token: String,
    client: reqwest::Client,
}

impl Rig {
    async fn start() -> Self {
        let upstream = Upstream::builder().names(HOSTS).start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(TOOLS.into()),
            names: HOSTS.iter().map(|h| (*h).to_owned()).collect(),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            ..Default::default()
        })
        .await;
        Rig {
            upstream,
            proxy,
            http: reqwest::Client::new(),
        }
    }

    fn client_for(&self, token: &str) -> reqwest::Client {
        crate::support::guardrails::client_for(&self.proxy, token)
    }

    /// A root session of `agent`, or a child of `parent` made with the parent's token.
    async fn agent(&self, agent: &str, parent: Option<&Agent>) -> Agent {
        let token = parent.map_or(self.proxy.admin_token.as_str(), |p| p.token.as_str());
        let response = self
            .http
            .post(format!("http://{}/v1/sessions", self.proxy.control_addr))
            .bearer_auth(token)
            .json(&json!({ "agent": agent }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let created: Value = response.json().await.unwrap();
        let token = created["token"].as_str().unwrap().to_owned();
        Agent {
            id: created["session_id"].as_str().unwrap().to_owned(),
            client: self.client_for(&token),
            token,
        }
    }

    /// `GET /v1/sessions/{id}`.
    async fn show(&self, agent: &Agent) -> Value {
        self.http
            .get(format!(
                "http://{}/v1/sessions/{}",
                self.proxy.control_addr, agent.id
            ))
            .bearer_auth(&self.proxy.admin_token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `method https://host:port/path` as `agent`, with a JSON body for a POST. What went
    /// through is checked as a 2xx: the tools' routes answer 201, the echo 200.
    async fn call(&self, agent: &Agent, method: &str, host: &str, path: &str) -> (u16, Value) {
        let url = format!("https://{host}:{}{path}", self.upstream.port());
        let mut req = agent
            .client
            .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
        if method == "POST" {
            req = req.json(&json!({ "text": "quarterly numbers" }));
        }
        let response = req.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Requests the upstream received for `host` on `path` (by SNI).
    fn reached(&self, host: &str, path: &str) -> usize {
        self.upstream
            .seen()
            .iter()
            .filter(|s| s.sni.as_deref() == Some(host) && s.path_only() == path)
            .count()
    }
}

/// Refused by policy, `policy` alone determining it.
fn assert_denied(reply: &(u16, Value), policy: &str) {
    let (status, body) = reply;
    assert_eq!(*status, 403, "{body}");
    assert_eq!(body["error"], "denied", "{body}");
    assert_eq!(body["policies"], json!([policy]), "{body}");
}

fn assert_held(reply: &(u16, Value)) {
    let (status, body) = reply;
    assert_eq!(*status, 202, "{body}");
    assert_eq!(body["error"], "approval_pending", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_read_private_data_and_untrusted_input_may_not_write_out_nor_may_its_child()
{
    let mut rig = Rig::start().await;
    let fresh = rig.agent("researcher", None).await;
    let tainted = rig.agent("researcher", None).await;

    // A fresh session may write to the external host, and publish a paste.
    assert_eq!(
        rig.call(&fresh, "POST", "upload.example.test", "/upload")
            .await
            .0
            / 100,
        2
    );
    assert_eq!(
        rig.call(&fresh, "POST", "upload.example.test", "/idem/pastes")
            .await
            .0
            / 100,
        2
    );

    // One label is not the trifecta: reading private data alone still lets it write.
    let read = rig
        .call(&tainted, "GET", "crm.example.test", "/idem/customers/7")
        .await;
    assert_eq!(read.0 / 100, 2, "{}", read.1);
    assert_eq!(
        rig.call(&tainted, "POST", "upload.example.test", "/upload")
            .await
            .0
            / 100,
        2
    );
    // Fetching untrusted content completes it.
    assert_eq!(
        rig.call(&tainted, "GET", "news.example.test", "/echo")
            .await
            .0
            / 100,
        2
    );
    let uploads = rig.reached("upload.example.test", "/upload");
    let pastes = rig.reached("upload.example.test", "/idem/pastes");
    assert_denied(
        &rig.call(&tainted, "POST", "upload.example.test", "/upload")
            .await,
        "no-exfiltration-after-private-and-untrusted",
    );
    assert_held(
        &rig.call(&tainted, "POST", "upload.example.test", "/idem/pastes")
            .await,
    );
    // Reading is still fine: the policy is about writes.
    assert_eq!(
        rig.call(&tainted, "GET", "upload.example.test", "/echo")
            .await
            .0
            / 100,
        2
    );

    // What it touched is on the session, and shown.
    let shown = rig.show(&tainted).await;
    assert_eq!(
        shown["labels"],
        json!(["private_data", "untrusted_input"]),
        "{shown}"
    );
    assert_eq!(
        shown["recent"]["tool:crm.read_customer"],
        json!({"10m": 1, "1h": 1}),
        "{shown}"
    );
    assert_eq!(
        shown["recent"]["tier:read"],
        json!({"10m": 1, "1h": 1}),
        "{shown}"
    );
    assert_eq!(rig.show(&fresh).await["labels"], json!([]));

    // Its child, spawned with its token, starts with its labels: refused the same.
    let child = rig.agent("researcher", Some(&tainted)).await;
    assert_eq!(
        rig.show(&child).await["labels"],
        json!(["private_data", "untrusted_input"])
    );
    assert_denied(
        &rig.call(&child, "POST", "upload.example.test", "/upload")
            .await,
        "no-exfiltration-after-private-and-untrusted",
    );
    assert_held(
        &rig.call(&child, "POST", "upload.example.test", "/idem/pastes")
            .await,
    );
    // A fresh session's child has nothing to inherit, and the fresh session may still write.
    let fresh_child = rig.agent("researcher", Some(&fresh)).await;
    assert_eq!(
        rig.call(&fresh_child, "POST", "upload.example.test", "/upload")
            .await
            .0
            / 100,
        2
    );
    assert_eq!(
        rig.call(&fresh, "POST", "upload.example.test", "/upload")
            .await
            .0
            / 100,
        2
    );
    // Nothing the tainted sessions asked for reached the upstream.
    assert_eq!(rig.reached("upload.example.test", "/upload"), uploads + 2);
    assert_eq!(rig.reached("upload.example.test", "/idem/pastes"), pastes);

    // A restart washes nothing out: the labels are in the store.
    rig.proxy.restart().await;
    let tainted = Agent {
        client: rig.client_for(&tainted.token),
        ..tainted
    };
    assert_denied(
        &rig.call(&tainted, "POST", "upload.example.test", "/upload")
            .await,
        "no-exfiltration-after-private-and-untrusted",
    );
    let fresh = Agent {
        client: rig.client_for(&fresh.token),
        ..fresh
    };
    assert_eq!(
        rig.call(&fresh, "POST", "upload.example.test", "/upload")
            .await
            .0
            / 100,
        2
    );

    // The refusals are audited with the policy that made them.
    let records = rig.proxy.audit().await;
    let refused = records
        .iter()
        .filter(|r| {
            r.session.as_deref() == Some(tainted.id.as_str())
                && r.policies
                    .iter()
                    .any(|p| p == "no-exfiltration-after-private-and-untrusted")
        })
        .count();
    assert_eq!(refused, 2, "before and after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fourth_refund_within_the_hour_waits_for_a_human() {
    let rig = Rig::start().await;
    let agent = rig.agent("payments-bot", None).await;
    for n in 1..=3 {
        let reply = rig
            .call(&agent, "POST", "pay.example.test", "/idem/refunds")
            .await;
        assert_eq!(reply.0 / 100, 2, "refund {n}: {}", reply.1);
    }
    assert_held(
        &rig.call(&agent, "POST", "pay.example.test", "/idem/refunds")
            .await,
    );
    assert_eq!(rig.reached("pay.example.test", "/idem/refunds"), 3);
    // A held call is not a call made: the count stays at three.
    let shown = rig.show(&agent).await;
    assert_eq!(
        shown["recent"]["tool:pay.refund"],
        json!({"10m": 3, "1h": 3}),
        "{shown}"
    );
    assert_eq!(
        shown["recent"]["tier:write"],
        json!({"10m": 3, "1h": 3}),
        "{shown}"
    );
    assert_eq!(shown["labels"], json!([]), "{shown}");
    // The count is the session's own: another session's first refund goes.
    let other = rig.agent("payments-bot", None).await;
    assert_eq!(
        rig.call(&other, "POST", "pay.example.test", "/idem/refunds")
            .await
            .0
            / 100,
        2
    );
}

/// Two replicas on one PostgreSQL and one Redis: what a session touched on one replica is
/// on the session on the other, at its next request there; so are its recent calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_and_recent_calls_are_shared_by_replicas() {
    use crate::support::fleet::{control_get, get, Fleet};
    use ostiary_sdk::NewSession;

    // The fleet's one upstream name carries the labels through tools on it.
    const FLEET_TOOLS: &str = r#"
[[tool]]
name   = "crm.read_customer"
tier   = "read"
match  = { host = "api.example.test", method = "GET", path = "/idem/customers/{id}" }
labels = ["private_data"]

[[tool]]
name   = "news.fetch"
tier   = "read"
match  = { host = "api.example.test", method = "GET", path = "/echo" }
labels = ["untrusted_input"]

[[tool]]
name  = "pay.refund"
tier  = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/refunds/{n}" }

[[tool]]
name  = "paste.create"
tier  = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/pastes" }
"#;
    let upstream = Upstream::builder().start().await;
    // No replica yet: they start on this catalog and these policies.
    let mut fleet = Fleet::start(&upstream, 0, "", None, None).await;
    std::fs::write(fleet.policies.join("tools.toml"), FLEET_TOOLS).unwrap();
    std::fs::write(fleet.policies.join("test.cedar"), POLICIES).unwrap();
    for i in 0..2 {
        let replica = fleet.start_replica(i).await;
        fleet.replicas.push(replica);
    }
    let session = fleet.root(0, "researcher").await;
    let on = [fleet.agent(0, &session), fleet.agent(1, &session)];
    let upload = |i: usize| {
        let client = on[i].clone();
        let url = fleet.url("/upload");
        async move {
            let response = client
                .post(url)
                .json(&json!({"text": "quarterly numbers"}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };

    // private_data on replica 0, untrusted_input on replica 1.
    assert_eq!(
        get(&on[0], &fleet.url("/idem/customers/7")).await.0 / 100,
        2
    );
    assert_eq!(upload(1).await.0, 200, "one label is not the trifecta");
    assert_eq!(get(&on[1], &fleet.url("/echo")).await.0, 200);
    // Each replica refuses the write: replica 0 saw only the first label itself.
    for i in [0, 1] {
        assert_denied(
            &upload(i).await,
            "no-exfiltration-after-private-and-untrusted",
        );
    }
    // Shown alike by both.
    for i in [0, 1] {
        let (status, shown) = control_get(
            fleet.replicas[i].control_addr,
            &format!("/v1/sessions/{}", session.session_id),
            Some(&fleet.token),
        )
        .await;
        assert_eq!(status, 200, "{shown}");
        assert_eq!(
            shown["labels"],
            json!(["private_data", "untrusted_input"]),
            "{shown}"
        );
        assert_eq!(
            shown["recent"]["tier:read"],
            json!({"10m": 2, "1h": 2}),
            "{shown}"
        );
    }
    // A child made through replica 1 carries them to replica 0.
    let child = fleet
        .session(
            1,
            NewSession {
                parent: Some(session.session_id.clone()),
                ..Default::default()
            },
        )
        .await;
    let child_on_0 = fleet.agent(0, &child);
    let response = child_on_0
        .post(fleet.url("/upload"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);

    // Refunds counted across replicas: the fourth of the hour, wherever it lands, is held.
    let payer = fleet.root(1, "payments-bot").await;
    let on = [fleet.agent(0, &payer), fleet.agent(1, &payer)];
    for n in 0..4 {
        let response = on[n % 2]
            .post(fleet.url(&format!("/idem/refunds/{n}")))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if n < 3 {
            assert_eq!(status / 100, 2, "refund {n}: {body}");
        } else {
            assert_held(&(status, body));
        }
    }
}
