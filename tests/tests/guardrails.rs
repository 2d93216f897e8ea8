//! Session guardrails end to end (issue 7): each limit reached answers `429` with its
//! figures, a limit can go to a human who grants more, policies see the session's usage,
//! `Idempotency-Key` replays, child sessions are bounded and carved out of their parent,
//! the watchdog pauses a looping session until a human resumes or terminates it, and
//! teardown drains requests in flight within its grace period.

use std::time::{Duration, Instant};

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
const POLICIES: &str = r#"
@id("all-tiers")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);
@id("plain-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("guarded-after-two-calls")
forbid (principal, action == Ostiary::Action::"tool:t.guarded", resource)
when { context.session.calls >= 2 };
"#;

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    http: reqwest::Client,
}

/// A session as the control API created it.
struct Agent {
    id: String,
    token: String,
    client: reqwest::Client,
    body: Value,
}

impl Rig {
    async fn start(extra: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
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

    fn control_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.proxy.control_addr)
    }

    /// A control API call with the admin token (or `bearer` instead).
    async fn control(
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
    async fn session_call(
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
    fn reconnect(&self, agent: Agent) -> Agent {
        Agent {
            client: self.client_for(&agent.token),
            ..agent
        }
    }

    fn client_for(&self, token: &str) -> reqwest::Client {
        reqwest::Client::builder()
            .proxy(
                reqwest::Proxy::all(format!("http://agent:{token}@{}", self.proxy.proxy_addr))
                    .unwrap(),
            )
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.proxy.ca_pem.as_bytes()).unwrap(),
            )
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    /// Create a session (`body` as `POST /v1/sessions` takes it); `parent`: as that
    /// session, with its token.
    async fn agent(&self, body: Value, parent: Option<&Agent>) -> Result<Agent, (u16, Value)> {
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
    async fn write(&self, agent: &Agent, id: &str) -> (u16, Value, reqwest::header::HeaderMap) {
        self.call(
            agent,
            "POST",
            &format!("/idem/write/{id}"),
            &[],
            Some(json!({})),
        )
        .await
    }

    async fn call(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_answers_429_with_its_figures() {
    let rig = Rig::start(
        r#"
[tiers.read]
rate_agent = "3/m"
repeat_max = 0
[tiers.write]
repeat_max = 0
"#,
    )
    .await;

    // calls: three tool calls, then 429 naming the limit and the figures. Plain requests
    // are not tool calls and are not counted.
    let a = rig
        .agent(json!({"agent": "calls", "max_calls": 2}), None)
        .await
        .unwrap();
    assert_eq!(a.body["limits"]["max_calls"], 2, "{}", a.body);
    for i in 0..2 {
        let (s, b, _) = rig.write(&a, &format!("c{i}")).await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, h) = rig.write(&a, "c2").await;
    assert_eq!(s, 429, "{b}");
    assert_eq!(b["error"], "limit_exceeded");
    assert_eq!(b["limit"], "calls");
    assert_eq!((b["used"].clone(), b["max"].clone()), (json!(2), json!(2)));
    assert_eq!(b["retry_after"], Value::Null, "a budget does not refill");
    assert!(h.get("retry-after").is_none());
    let (s, _, _) = rig.call(&a, "GET", "/echo", &[], None).await;
    assert_eq!(s, 200, "plain requests are not tool calls");
    assert_eq!(
        rig.upstream.count("/idem/write/c2"),
        0,
        "nothing over the limit was sent"
    );

    // cost: 0.4 per write against 1.0 — the third would pass it.
    let c = rig
        .agent(json!({"agent": "cost", "max_cost": 1.0}), None)
        .await
        .unwrap();
    for i in 0..2 {
        let (s, b, _) = rig.write(&c, &format!("k{i}")).await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, _) = rig.write(&c, "k2").await;
    assert_eq!(s, 429, "{b}");
    assert_eq!(b["limit"], "cost");
    assert_eq!(
        (b["used"].clone(), b["max"].clone()),
        (json!(0.8), json!(1.0))
    );
    let (s, shown) = rig.session_call(reqwest::Method::GET, &c, "").await;
    assert_eq!(s, 200);
    assert_eq!(shown["usage"]["calls"], 2, "{shown}");
    assert_eq!(shown["usage"]["cost"], 0.8, "{shown}");
    // Each charged call's record carries its cost (`ostiary audit cost` adds them up).
    let records = rig.proxy.audit().await;
    let charged: i64 = records
        .iter()
        .filter(|r| r.session.as_deref() == Some(&c.id))
        .filter_map(|r| r.cost_micros)
        .sum();
    assert_eq!(charged, 800_000);

    // bytes: counted as they flow, the limit refuses the next request once passed.
    let b8 = rig
        .agent(json!({"agent": "bytes", "max_bytes_received": 3000}), None)
        .await
        .unwrap();
    let (s, _, _) = rig
        .call(
            &b8,
            "GET",
            "/stream?chunks=2&size=1000&delay_ms=0",
            &[],
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, _, _) = rig
        .call(
            &b8,
            "GET",
            "/stream?chunks=2&size=1000&delay_ms=0",
            &[],
            None,
        )
        .await;
    assert_eq!(s, 200, "2000 of 3000 received: still under");
    let (s, b, _) = rig.call(&b8, "GET", "/echo", &[], None).await;
    assert_eq!(s, 429, "{b}");
    assert_eq!(b["limit"], "bytes_received");
    assert_eq!(b["max"], 3000);
    assert!(b["used"].as_u64().unwrap() >= 4000, "{b}");
    let sent = rig
        .agent(json!({"agent": "sent", "max_bytes_sent": 1000}), None)
        .await
        .unwrap();
    let pad = "x".repeat(1200);
    let (s, _, _) = rig
        .call(&sent, "POST", "/upload", &[], Some(json!({ "pad": pad })))
        .await;
    assert_eq!(s, 200);
    let (s, b, _) = rig.call(&sent, "GET", "/echo", &[], None).await;
    assert_eq!((s, b["limit"].clone()), (429, json!("bytes_sent")), "{b}");

    // rate: 3 reads a minute per agent (burst 3): the fourth waits, with Retry-After.
    let r = rig.agent(json!({"agent": "rate"}), None).await.unwrap();
    for i in 0..3 {
        let (s, b, _) = rig
            .call(&r, "GET", &format!("/idem/read/r{i}"), &[], None)
            .await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, h) = rig.call(&r, "GET", "/idem/read/r3", &[], None).await;
    assert_eq!(s, 429, "{b}");
    assert_eq!(b["limit"], "rate:agent");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(b["retry_after"], retry);
    // The limit is the agent's, not the session's: a second session of it shares it.
    let r2 = rig.agent(json!({"agent": "rate"}), None).await.unwrap();
    let (s, _, _) = rig.call(&r2, "GET", "/idem/read/r4", &[], None).await;
    assert_eq!(s, 429);
    // Writes are another tier with no rate limit.
    let (s, _, _) = rig.write(&r, "r5").await;
    assert_eq!(s, 201);
    let metrics = reqwest::get(rig.control_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ostiary_limits_exceeded_total{limit=\"rate:agent\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_sees_the_session_s_usage() {
    let rig = Rig::start("").await;
    let a = rig.agent(json!({"agent": "p"}), None).await.unwrap();
    // `context.session.calls >= 2` forbids t.guarded: its first two calls pass.
    for i in 0..2 {
        let (s, b, _) = rig
            .call(&a, "GET", &format!("/idem/guarded/g{i}"), &[], None)
            .await;
        assert_eq!(s, 201, "{b}");
    }
    let (s, b, _) = rig.call(&a, "GET", "/idem/guarded/g2", &[], None).await;
    assert_eq!(s, 403, "{b}");
    assert_eq!(b["policies"], json!(["guarded-after-two-calls"]));
    // Another session starts from zero.
    let fresh = rig.agent(json!({"agent": "p"}), None).await.unwrap();
    let (s, _, _) = rig.call(&fresh, "GET", "/idem/guarded/g3", &[], None).await;
    assert_eq!(s, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_goes_to_a_human_who_grants_more() {
    let rig = Rig::start(
        r#"
[sessions]
escalate_limits = ["calls"]
[approvals]
approvers = ["alice@example.com"]
[tiers.write]
repeat_max = 0
"#,
    )
    .await;
    let a = rig
        .agent(json!({"agent": "e", "max_calls": 2}), None)
        .await
        .unwrap();
    for i in 0..2 {
        let (s, _, _) = rig.write(&a, &format!("e{i}")).await;
        assert_eq!(s, 201);
    }
    let (s, held, _) = rig
        .call(&a, "POST", "/idem/write/e2", &[], Some(json!({"n": 2})))
        .await;
    assert_eq!(s, 202, "{held}");
    let id = held["approval_id"].as_str().unwrap().to_owned();
    let control = rig.proxy.control();
    let shown = control.approval(&id).await.unwrap();
    assert!(
        shown["policies"].to_string().contains("limit:calls"),
        "{shown:#}"
    );
    assert_eq!(rig.upstream.count("/idem/write/e2"), 0);
    control
        .decide(&id, true, "alice@example.com", None)
        .await
        .unwrap();
    // The held call runs once, and the session has as much again: 2 more calls fit
    // (3 used of 4), the one after is held again.
    let (s, b, _) = rig
        .call(
            &a,
            "POST",
            "/idem/write/e2",
            &[("Ostiary-Approval", id.as_str()), ("Prefer", "wait=10")],
            Some(json!({"n": 2})),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(rig.upstream.count("/idem/write/e2"), 1);
    let (s, b, _) = rig.write(&a, "e3").await;
    assert_eq!(s, 201, "the grant works: {b}");
    let (s, _, _) = rig.write(&a, "e4").await;
    assert_eq!(s, 202, "and ends: the next one is held again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_gets_the_stored_outcome() {
    let rig = Rig::start("[tiers.write]\nrepeat_max = 0\n").await;
    let a = rig.agent(json!({"agent": "i"}), None).await.unwrap();
    let key = [("Idempotency-Key", "pay-1")];
    let (s1, first, _) = rig
        .call(
            &a,
            "POST",
            "/idem/write/pay",
            &key,
            Some(json!({"amount": 5})),
        )
        .await;
    assert_eq!(s1, 201, "{first}");
    let (s2, again, h) = rig
        .call(
            &a,
            "POST",
            "/idem/write/pay",
            &key,
            Some(json!({"amount": 5})),
        )
        .await;
    assert_eq!(
        (s2, &again),
        (201, &first),
        "the stored outcome, byte for byte"
    );
    assert_eq!(h["idempotency-replayed"], "true");
    assert_eq!(rig.upstream.count("/idem/write/pay"), 1, "executed once");
    // The retry cost nothing.
    let (_, shown) = rig.session_call(reqwest::Method::GET, &a, "").await;
    assert_eq!(shown["usage"]["calls"], 1, "{shown}");
    // The same key with another request: 422, nothing sent.
    let (s, b, _) = rig
        .call(
            &a,
            "POST",
            "/idem/write/pay",
            &key,
            Some(json!({"amount": 500})),
        )
        .await;
    assert_eq!(s, 422, "{b}");
    assert_eq!(b["error"], "idempotency_mismatch");
    assert_eq!(rig.upstream.count("/idem/write/pay"), 1);
    // Keys are per session: another session's same key runs on its own.
    let other = rig.agent(json!({"agent": "i"}), None).await.unwrap();
    let (s, _, h) = rig
        .call(
            &other,
            "POST",
            "/idem/write/pay",
            &key,
            Some(json!({"amount": 5})),
        )
        .await;
    assert_eq!(s, 201);
    assert!(h.get("idempotency-replayed").is_none());
    assert_eq!(rig.upstream.count("/idem/write/pay"), 2);
    // A plain (non-tool) mutating request is covered too.
    let plain = [("Idempotency-Key", "up-1")];
    for _ in 0..3 {
        let (s, _, _) = rig
            .call(&a, "POST", "/upload", &plain, Some(json!({"x": 1})))
            .await;
        assert_eq!(s, 200);
    }
    assert_eq!(rig.upstream.count("/upload"), 1);
    // A refused request leaves the key free: fixed, it runs.
    let bad = [("Idempotency-Key", "bad-1")];
    let (s, _, _) = rig
        .call(
            &a,
            "POST",
            "/idem/write/x",
            &bad,
            Some(json!({"note": "AKIAIOSFODNN7EXAMPLF"})),
        )
        .await;
    assert_eq!(s, 422, "dlp refuses it");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _, _) = rig
        .call(
            &a,
            "POST",
            "/idem/write/x",
            &bad,
            Some(json!({"note": "clean"})),
        )
        .await;
    assert_eq!(s, 201, "the key was released, not burnt");
    // Malformed keys are refused.
    let (s, _, _) = rig
        .call(
            &a,
            "POST",
            "/upload",
            &[("Idempotency-Key", "")],
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_bounded_carved_and_torn_down_with_their_parent() {
    let rig = Rig::start(
        r#"
[sessions]
max_depth = 2
max_children = 2
[tiers.write]
repeat_max = 0
"#,
    )
    .await;
    let root = rig
        .agent(json!({"agent": "root", "max_calls": 10}), None)
        .await
        .unwrap();
    let child = rig
        .agent(json!({"agent": "child", "max_calls": 4}), Some(&root))
        .await
        .unwrap();
    assert_eq!(child.body["depth"], 1);
    assert_eq!(child.body["parent"], root.id.as_str());
    assert_eq!(child.body["tenant"], root.body["tenant"]);
    assert_eq!(child.body["limits"]["max_calls"], 4);
    // Depth: a grandchild is depth 2 (the maximum), its child is refused.
    let grandchild = rig
        .agent(json!({"agent": "gc", "max_calls": 1}), Some(&child))
        .await
        .unwrap();
    assert_eq!(grandchild.body["depth"], 2);
    let (s, b) = rig
        .agent(json!({"agent": "ggc"}), Some(&grandchild))
        .await
        .err()
        .unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("depth")), "{b}");
    assert_eq!((b["used"].clone(), b["max"].clone()), (json!(3), json!(2)));
    // Budget: the root has 10 - 4 = 6 left; a child asking 7 is refused.
    let (s, b) = rig
        .agent(json!({"agent": "big", "max_calls": 7}), Some(&root))
        .await
        .err()
        .unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("calls")), "{b}");
    assert_eq!(b["max"], 6);
    // Fan-out: a second child fits, a third does not.
    let second = rig
        .agent(json!({"agent": "c2"}), Some(&root))
        .await
        .unwrap();
    assert_eq!(second.body["limits"]["max_calls"], 3, "half of the 6 left");
    let (s, b) = rig
        .agent(json!({"agent": "c3", "max_calls": 1}), Some(&root))
        .await
        .err()
        .unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("children")), "{b}");
    // A child may not pick another tenant, nor name another parent.
    let (s, _) = rig
        .agent(
            json!({"agent": "x", "tenant": "other", "max_calls": 1}),
            Some(&child),
        )
        .await
        .err()
        .unwrap();
    assert_eq!(s, 400);
    let (s, _) = rig
        .agent(json!({"agent": "x", "parent": second.id}), Some(&child))
        .await
        .err()
        .unwrap();
    assert_eq!(s, 403);
    // The child's calls come out of its own carve, less what it carved for its own child.
    for i in 0..3 {
        let (s, _, _) = rig.write(&child, &format!("ch{i}")).await;
        assert_eq!(s, 201);
    }
    let (s, b, _) = rig.write(&child, "ch4").await;
    assert_eq!((s, b["max"].clone()), (429, json!(3)), "{b}");
    // Only a valid, live session token creates a child: a forged one is 401, and so is a
    // token whose signature is fine but whose last character was changed.
    let forged = Agent {
        id: "ses_forged".into(),
        token: format!("{}x", &root.token[..root.token.len() - 1]),
        client: reqwest::Client::new(),
        body: Value::Null,
    };
    let (s, b) = rig
        .agent(json!({"agent": "f"}), Some(&forged))
        .await
        .err()
        .unwrap();
    assert_eq!(
        (s, b["error"].clone()),
        (401, json!("unauthenticated")),
        "{b}"
    );
    let garbage = Agent {
        token: "not-a-token".into(),
        ..forged
    };
    let (s, _) = rig
        .agent(json!({"agent": "f"}), Some(&garbage))
        .await
        .err()
        .unwrap();
    assert_eq!(s, 401);
    // Unknown fields are refused, not ignored.
    let (s, _) = rig
        .agent(
            json!({"agent": "f", "max_calls": 1, "depth": 0}),
            Some(&second),
        )
        .await
        .err()
        .unwrap();
    assert_eq!(s, 400);
    // An operator may create a child on a session's behalf by naming it.
    let by_admin = rig
        .agent(
            json!({"agent": "op-child", "parent": second.id, "max_calls": 1}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(by_admin.body["depth"], 2);
    assert_eq!(by_admin.body["parent"], second.id.as_str());

    // Tearing down the root tears down the whole tree.
    let (s, _) = rig.session_call(reqwest::Method::DELETE, &root, "").await;
    assert_eq!(s, 200);
    for agent in [&root, &child, &grandchild, &second, &by_admin] {
        let (s, _, _) = rig.call(agent, "GET", "/echo", &[], None).await;
        assert_eq!(s, 407, "{} still works", agent.id);
    }
    // A torn-down session's token creates nothing.
    let (s, _) = rig
        .agent(json!({"agent": "late"}), Some(&child))
        .await
        .err()
        .unwrap();
    assert_eq!(s, 401);
    // Idempotent: a second DELETE is a 404, nothing else happens.
    let (s, _) = rig.session_call(reqwest::Method::DELETE, &root, "").await;
    assert_eq!(s, 404);
    let records = rig.proxy.audit().await;
    let ended: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "session" && r.totals.is_some())
        .collect();
    assert_eq!(ended.len(), 5, "{ended:#?}");
    let of_child = ended
        .iter()
        .find(|r| r.session.as_deref() == Some(child.id.as_str()))
        .unwrap();
    assert_eq!(of_child.totals.unwrap().calls, 3, "{of_child:#?}");
    assert_eq!(of_child.parent.as_deref(), Some(root.id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_session_is_paused_then_resumed_or_terminated() {
    let rig = Rig::start(
        r#"
[tiers.read]
repeat_max = 5
[approvals]
approvers = ["alice@example.com"]
"#,
    )
    .await;
    let a = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let (s, _, _) = rig.call(&a, "GET", "/idem/read/same", &[], None).await;
        statuses.push(s);
    }
    // The 5th identical call trips the watchdog; from the 6th on the session is paused.
    assert_eq!(statuses[..5], [201; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 423), "{statuses:?}");
    assert_eq!(rig.upstream.count("/idem/read/same"), 5);
    // Every request of the session is refused, not just the repeated one.
    let (s, b, _) = rig.call(&a, "GET", "/echo", &[], None).await;
    assert_eq!(s, 423);
    assert_eq!(b["error"], "session_paused");
    assert!(b["reason"].as_str().unwrap().contains("t.read"), "{b}");
    // Other sessions carry on.
    let other = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    let (s, _, _) = rig.call(&other, "GET", "/idem/read/else", &[], None).await;
    assert_eq!(s, 201);

    // The dead letter holds the snapshot; the approvers got a "resume?" approval.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (letter, approval) = loop {
        let (_, letters) = rig
            .session_call(reqwest::Method::GET, &a, "dead-letters")
            .await;
        let pending = rig
            .proxy
            .control()
            .approvals(Some("pending"))
            .await
            .unwrap();
        let approval = pending["approvals"]
            .as_array()
            .and_then(|l| l.iter().find(|x| x["session"] == a.id.as_str()).cloned());
        if let (Some(letter), Some(approval)) = (letters["dead_letters"].get(0), approval) {
            break (letter.clone(), approval);
        }
        assert!(Instant::now() < deadline, "{letters} / {pending}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letter["kind"], "repeat");
    let recent = letter["snapshot"]["recent_audit"].as_array().unwrap();
    assert!(
        recent.iter().filter(|r| r["tool"] == "t.read").count() >= 5,
        "{letter:#}"
    );
    assert_eq!(letter["snapshot"]["trip"]["kind"], "repeat");
    let (_, shown) = rig.session_call(reqwest::Method::GET, &a, "").await;
    assert_eq!(shown["state"], "paused", "{shown}");

    // A human approves the "resume?" approval: the session works again.
    assert_eq!(approval["tool"], "ostiary.resume_session", "{approval}");
    let id = approval["approval_id"].as_str().unwrap().to_owned();
    rig.proxy
        .control()
        .decide(&id, true, "alice@example.com", None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _, _) = rig.call(&a, "GET", "/idem/read/new", &[], None).await;
        if s == 201 {
            break;
        }
        assert_eq!(s, 423);
        assert!(Instant::now() < deadline, "never resumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Resuming a live session is a conflict.
    let (s, _) = rig.session_call(reqwest::Method::POST, &a, "/resume").await;
    assert_eq!(s, 409);
    // Looping again trips again (the count started over). An operator resumes it from the
    // API this time: the approvers' pending "resume?" question is withdrawn with it.
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(rig.call(&a, "GET", "/idem/read/same", &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 201, 201, 201, 423, 423],
        "{statuses:?}"
    );
    let question = |listed: &Value| {
        listed["approvals"].as_array().and_then(|l| {
            l.iter()
                .find(|x| x["session"] == a.id.as_str() && x["approval_id"] != id.as_str())
                .cloned()
        })
    };
    let pending = rig
        .proxy
        .control()
        .approvals(Some("pending"))
        .await
        .unwrap();
    let second = question(&pending).unwrap_or_else(|| panic!("{pending}"));
    let (s, _) = rig.session_call(reqwest::Method::POST, &a, "/resume").await;
    assert_eq!(s, 200);
    let withdrawn = rig
        .proxy
        .control()
        .approval(second["approval_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(withdrawn["status"], "expired", "{withdrawn:#}");
    // And a third time, terminated.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(rig.call(&a, "GET", "/idem/read/same", &[], None).await.0);
    }
    assert_eq!(statuses, [201, 201, 201, 201, 201, 423], "{statuses:?}");
    let (s, b) = rig
        .session_call(reqwest::Method::POST, &a, "/terminate")
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, _, _) = rig.call(&a, "GET", "/echo", &[], None).await;
    assert_eq!(s, 407);
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &a, "dead-letters")
        .await;
    let resolved: Vec<_> = letters["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["resolved"].clone())
        .collect();
    assert_eq!(
        resolved,
        [json!("resumed"), json!("resumed"), json!("terminated")],
        "{letters}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_lets_requests_finish_within_the_grace_then_cuts_them() {
    let rig = Rig::start("[sessions]\ngrace = \"2s\"\n").await;
    // A request that finishes within the grace completes whole.
    let a = rig.agent(json!({"agent": "t"}), None).await.unwrap();
    let slow = {
        let client = a.client.clone();
        let url = rig.upstream.url("/stream?chunks=5&size=100&delay_ms=100");
        tokio::spawn(async move { client.get(url).send().await.unwrap().bytes().await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    let (s, _) = rig.session_call(reqwest::Method::DELETE, &a, "").await;
    assert_eq!(s, 200);
    let body = slow.await.unwrap().expect("finished within the grace");
    assert_eq!(body.len(), 500);
    assert!(started.elapsed() < Duration::from_secs(2));

    // One that would outlive the grace is cut when it runs out, and teardown returns.
    let b = rig.agent(json!({"agent": "t"}), None).await.unwrap();
    let endless = {
        let client = b.client.clone();
        let url = rig.upstream.url("/stream?chunks=1000&size=10&delay_ms=50");
        tokio::spawn(async move { client.get(url).send().await.unwrap().bytes().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (s, _) = rig.session_call(reqwest::Method::DELETE, &b, "").await;
    assert_eq!(s, 200);
    let took = started.elapsed();
    assert!(endless.await.unwrap().is_err(), "the answer was cut");
    println!("teardown with a request outliving the 2 s grace took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_pauses_survive_a_restart() {
    let mut rig = Rig::start("[tiers.read]\nrepeat_max = 3\n").await;
    let spent = rig
        .agent(json!({"agent": "spent", "max_calls": 2}), None)
        .await
        .unwrap();
    for i in 0..2 {
        assert_eq!(rig.write(&spent, &format!("s{i}")).await.0, 201);
    }
    let looper = rig.agent(json!({"agent": "looper"}), None).await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            rig.call(&looper, "GET", "/idem/read/x", &[], None).await.0,
            201
        );
    }
    assert_eq!(rig.call(&looper, "GET", "/echo", &[], None).await.0, 423);

    rig.proxy.restart().await;
    // New listeners: the agents reconnect with the same tokens.
    let spent = rig.reconnect(spent);
    let looper = rig.reconnect(looper);
    let (s, b, _) = rig.write(&spent, "s2").await;
    assert_eq!(s, 429, "a restart is no fresh budget: {b}");
    assert_eq!((b["used"].clone(), b["max"].clone()), (json!(2), json!(2)));
    let (s, b, _) = rig.call(&looper, "GET", "/echo", &[], None).await;
    assert_eq!(s, 423, "still paused after a restart: {b}");
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &looper, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "repeat", "{letters}");
    let (s, _) = rig
        .session_call(reqwest::Method::POST, &looper, "/resume")
        .await;
    assert_eq!(s, 200);
    assert_eq!(rig.call(&looper, "GET", "/echo", &[], None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_denial_bursts_and_tier_jumps_pause_a_session_too() {
    let rig = Rig::start(
        "[sessions.watchdog]\ncycle_repeats = 3\ndenials = 4\nbaseline_calls = 3\ntier_jumps = 2\n",
    )
    .await;
    // A→B→A→B→A→B: no call repeats often enough for the identical-call rule, but the
    // pattern does; the third period trips it.
    let cycler = rig.agent(json!({"agent": "cycler"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..7 {
        let path = if i % 2 == 0 {
            "/idem/read/a"
        } else {
            "/idem/read/b"
        };
        statuses.push(rig.call(&cycler, "GET", path, &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 201, 201, 201, 201, 423],
        "{statuses:?}"
    );
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &cycler, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "cycle", "{letters}");

    // Four refusals by policy in a row: the burst rule. (The first two calls are allowed;
    // `guarded-after-two-calls` refuses every one after.)
    let denied = rig.agent(json!({"agent": "denied"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..7 {
        let path = format!("/idem/guarded/g{i}");
        statuses.push(rig.call(&denied, "GET", &path, &[], None).await.0);
    }
    assert_eq!(
        statuses,
        [201, 201, 403, 403, 403, 403, 423],
        "{statuses:?}"
    );
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &denied, "dead-letters")
        .await;
    assert_eq!(
        letters["dead_letters"][0]["kind"], "denial_burst",
        "{letters}"
    );

    // Reads only, then attempts on a tier the session never used: the tier-jump rule.
    let jumper = rig.agent(json!({"agent": "jumper"}), None).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..3 {
        let path = format!("/idem/read/j{i}");
        statuses.push(rig.call(&jumper, "GET", &path, &[], None).await.0);
    }
    for i in 0..3 {
        let path = format!("/idem/irrev/x{i}");
        statuses.push(rig.call(&jumper, "DELETE", &path, &[], None).await.0);
    }
    assert_eq!(statuses, [201, 201, 201, 403, 403, 423], "{statuses:?}");
    let (_, letters) = rig
        .session_call(reqwest::Method::GET, &jumper, "dead-letters")
        .await;
    assert_eq!(letters["dead_letters"][0]["kind"], "tier_jump", "{letters}");
}
