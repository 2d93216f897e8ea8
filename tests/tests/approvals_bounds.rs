//! Holds are bounded (issue 13 item 7; THREATS "Authority and ambiguity": approval floods),
//! end to end against a real proxy, a TLS upstream, the agent's client through the proxy,
//! the SMTP sink and the local Slack receiver:
//!
//! - a session's pending holds are capped (`max_pending_approvals`, default 5): past it REST
//!   gets `429 limit_exceeded` (`limit: "approvals"`) and MCP a JSON-RPC `-32001` carrying
//!   the same body; the cap counts the whole session tree, is stored, and holds across a
//!   restart; a decision frees a slot; bad caps are `400`;
//! - identical holds of one session join one approval (same id, one notification), other
//!   sessions get their own;
//! - a burst of holds reaches each approver as one notice and one digest, also across a
//!   restart;
//! - the watchdog pauses a session that floods holds;
//! - Slack carries approver-bound links only when `slack_links = "shared"`.

use crate::support::approvals as support;
use crate::support::channels;

use std::time::Duration;

use channels::{get, unique_env, web, ALICE, BOB, WAIT};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::slack::{button_urls, button_values, SlackReceiver};
use ostiary_e2e::smtp::SmtpSink;
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use serde_json::{json, Value};
use support::{refund_body, Agent, Resp, POLICIES, TOOLS};

/// A proxy with the approvals catalog plus one MCP tool (`ops.wipe`, irreversible, on the
/// upstream's `/mcp`), `extra` appended to its config.
struct Bounds {
    upstream: Upstream,
    proxy: TestProxy,
}

impl Bounds {
    async fn start(extra: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let tools = format!(
            "{TOOLS}\n[[tool]]\nname = \"ops.wipe\"\ntier = \"irreversible\"\n\
             match = {{ mcp = \"{}\", tool = \"wipe\" }}\n",
            upstream.url("/mcp")
        );
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(tools),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra.into(),
            ..Default::default()
        })
        .await;
        Self { upstream, proxy }
    }

    /// `POST /v1/sessions` with `body`, as the admin or (`as_parent`) a session.
    async fn create(&self, body: &Value, as_parent: Option<&str>) -> (u16, Value) {
        let token = as_parent.unwrap_or(&self.proxy.admin_token);
        let response = web()
            .post(format!("http://{}/v1/sessions", self.proxy.control_addr))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A session created with `body` (which must succeed) and its agent.
    async fn agent(&self, body: Value, as_parent: Option<&str>) -> (Session, Agent) {
        let (status, created) = self.create(&body, as_parent).await;
        assert_eq!(status, 201, "{created}");
        let session: Session = serde_json::from_value(created).unwrap();
        let agent = Agent::new(&self.proxy, &session);
        (session, agent)
    }

    async fn refund(&self, agent: &Agent, charge: &str, ids: &[u32]) -> Resp {
        let url = self.upstream.url(&format!("/idem/refunds/{charge}"));
        agent.send("POST", &url, Some(refund_body(ids)), &[]).await
    }

    /// A hold that must be acknowledged: its approval id.
    async fn hold(&self, agent: &Agent, charge: &str) -> String {
        let reply = self.refund(agent, charge, &[1]).await;
        assert_eq!(reply.status, 202, "{charge}: {reply:?}");
        reply.json["approval_id"].as_str().unwrap().to_owned()
    }

    /// JSON-RPC to the catalogued MCP endpoint: HTTP status and the parsed answer.
    async fn mcp(&self, agent: &Agent, body: Value) -> Resp {
        let url = self.upstream.url("/mcp");
        agent.send("POST", &url, Some(body.to_string()), &[]).await
    }

    async fn pending(&self) -> Vec<Value> {
        let listed = self
            .proxy
            .control()
            .approvals(Some("pending"))
            .await
            .unwrap();
        listed["approvals"].as_array().cloned().unwrap_or_default()
    }

    fn reached(&self, charge: &str) -> usize {
        self.upstream
            .seen_path(&format!("/idem/refunds/{charge}"))
            .len()
    }
}

fn wipe(id: u64, target: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "wipe", "arguments": {"target": target}}})
}

/// The refusal of a hold past a cap of `max`, as docs/design.md §5 has it.
fn assert_cap(body: &Value, max: u64) {
    assert_eq!(body["error"], "limit_exceeded", "{body}");
    assert_eq!(body["limit"], "approvals", "{body}");
    assert_eq!(body["used"], max, "{body}");
    assert_eq!(body["max"], max, "{body}");
    assert!(
        body["retry_after"].as_u64().is_some_and(|s| s > 0),
        "{body}"
    );
    assert!(body.get("approval_id").is_none(), "{body}");
}

// ---------------------------------------------------------------------------------------
// The cap
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_holds_over_rest_hits_429_approvals_at_the_cap() {
    let rig = Bounds::start("").await;
    let (_, agent) = rig.agent(json!({"agent": "flooder"}), None).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(rig.hold(&agent, &format!("ch_flood_{n}")).await);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "five distinct holds: {ids:?}");
    // The sixth — another charge, another tool, another body: the cap is the session's.
    for (method, path, body) in [
        ("POST", "/idem/refunds/ch_flood_5", refund_body(&[1])),
        ("POST", "/idem/refunds/ch_flood_0", refund_body(&[2, 3])),
        ("POST", "/reflect", json!({"note": "x"}).to_string()),
    ] {
        let reply = agent
            .send(method, &rig.upstream.url(path), Some(body), &[])
            .await;
        assert_eq!(reply.status, 429, "{path}: {reply:?}");
        assert_cap(&reply.json, 5);
        let after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(Some(after), reply.json["retry_after"].as_u64());
    }
    assert_eq!(rig.pending().await.len(), 5, "nothing stored past the cap");
    assert_eq!(rig.reached("ch_flood_5") + rig.reached("ch_flood_0"), 0);
    // Another session of the same agent has a cap of its own.
    let (_, other) = rig.agent(json!({"agent": "flooder"}), None).await;
    rig.hold(&other, "ch_flood_other").await;
    // Every refusal is audited as what it is.
    let records = rig.proxy.audit().await;
    let capped = records
        .iter()
        .filter(|r| r.error.as_deref() == Some("limit_exceeded"))
        .count();
    assert_eq!(capped, 3, "{records:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flooding_holds_over_mcp_gets_jsonrpc_32001_with_the_same_body() {
    let rig = Bounds::start("").await;
    let (_, agent) = rig
        .agent(
            json!({"agent": "mcp-flooder", "max_pending_approvals": 3}),
            None,
        )
        .await;
    let mut first = String::new();
    for n in 0..3u64 {
        let reply = rig.mcp(&agent, wipe(n + 1, &format!("disk{n}"))).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.json["error"]["code"], -32002, "{reply:?}");
        assert_eq!(reply.json["id"], n + 1);
        if n == 0 {
            first = reply.json["error"]["data"]["approval_id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
    }
    let reply = rig.mcp(&agent, wipe(9, "disk9")).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json["id"], 9);
    assert_eq!(reply.json["error"]["code"], -32001, "{reply:?}");
    assert_cap(&reply.json["error"]["data"], 3);
    // A batch: the first call again (another JSON-RPC id) joins its approval; two new
    // calls are refused one by one.
    let batch = json!([wipe(21, "disk0"), wipe(22, "disk21"), wipe(23, "disk22")]);
    let reply = rig.mcp(&agent, batch).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let answers = reply.json.as_array().expect("a batch answer");
    assert_eq!(answers.len(), 3, "{reply:?}");
    assert_eq!(answers[0]["id"], 21);
    assert_eq!(answers[0]["error"]["code"], -32002);
    assert_eq!(answers[0]["error"]["data"]["approval_id"], first.as_str());
    for answer in &answers[1..] {
        assert_eq!(answer["error"]["code"], -32001, "{answer}");
        assert_cap(&answer["error"]["data"], 3);
    }
    // The cap is the session's across transports: a REST hold is refused too.
    let reply = rig.refund(&agent, "ch_after_mcp", &[1]).await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_cap(&reply.json, 3);
    assert_eq!(rig.pending().await.len(), 3);
    assert!(
        rig.upstream.seen_path("/mcp").is_empty(),
        "nothing forwarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_is_stored_and_survives_a_restart() {
    let mut rig = Bounds::start("").await;
    let (session, agent) = rig
        .agent(
            json!({"agent": "restarter", "max_pending_approvals": 2}),
            None,
        )
        .await;
    let a = rig.hold(&agent, "ch_r1").await;
    rig.hold(&agent, "ch_r2").await;
    assert_eq!(rig.refund(&agent, "ch_r3", &[1]).await.status, 429);

    rig.proxy.restart().await;
    let agent = Agent::new(&rig.proxy, &session);
    // Nothing in memory survived; the store did: the session's own cap (2, not the
    // default 5) and its two pending holds.
    let reply = rig.refund(&agent, "ch_r3", &[1]).await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_cap(&reply.json, 2);
    // A decision frees a slot, after the restart as before it.
    rig.proxy
        .control()
        .decide(&a, false, ALICE, Some("no"))
        .await
        .unwrap();
    let c = rig.hold(&agent, "ch_r3").await;
    assert_ne!(c, a);
    assert_eq!(rig.refund(&agent, "ch_r4", &[1]).await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_hold_frees_a_slot() {
    let rig = Bounds::start("[approvals]\napprovers = [\"alice@example.com\"]\n").await;
    let (_, agent) = rig
        .agent(
            json!({"agent": "decided", "max_pending_approvals": 2}),
            None,
        )
        .await;
    let a = rig.hold(&agent, "ch_d1").await;
    let b = rig.hold(&agent, "ch_d2").await;
    assert_eq!(rig.refund(&agent, "ch_d3", &[1]).await.status, 429);
    let control = rig.proxy.control();
    // Denied: a slot.
    control.decide(&a, false, ALICE, None).await.unwrap();
    rig.hold(&agent, "ch_d3").await;
    assert_eq!(rig.refund(&agent, "ch_d4", &[1]).await.status, 429);
    // Approved and executed: another.
    control.decide(&b, true, ALICE, None).await.unwrap();
    rig.hold(&agent, "ch_d4").await;
    assert_eq!(rig.refund(&agent, "ch_d5", &[1]).await.status, 429);
    // Collecting the approved one works as ever (it is not a new hold).
    let url = rig.upstream.url("/idem/refunds/ch_d2");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = agent
            .send(
                "POST",
                &url,
                Some(refund_body(&[1])),
                &[("ostiary-approval", &b)],
            )
            .await;
        if got.status == 201 {
            break;
        }
        assert_eq!(got.status, 202, "{got:?}");
        assert!(tokio::time::Instant::now() < deadline, "{got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_tree_shares_its_root_s_cap_and_bad_caps_are_refused() {
    let rig = Bounds::start("").await;
    let (root, root_agent) = rig
        .agent(json!({"agent": "root", "max_pending_approvals": 3}), None)
        .await;
    // Bad values: negative, fractional, text, over the ceiling, absurd, wrong types.
    for bad in [
        json!(-1),
        json!(2.5),
        json!("3"),
        json!(1001),
        json!(18_446_744_073_709_551_615u64),
        json!(1e300),
        json!(true),
        json!([1]),
    ] {
        let body = json!({"agent": "x", "max_pending_approvals": bad});
        let (status, answer) = rig.create(&body, None).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["error"], "bad_request", "{bad}: {answer}");
    }
    // A child never gets more than its parent; naming none, it gets the parent's.
    let ask = json!({"agent": "root", "max_pending_approvals": 4});
    let (status, answer) = rig.create(&ask, Some(&root.token)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("parent"),
        "{answer}"
    );
    let (status, child) = rig
        .create(&json!({"agent": "root"}), Some(&root.token))
        .await;
    assert_eq!(status, 201, "{child}");
    assert_eq!(child["limits"]["max_pending_approvals"], 3, "{child}");
    let child: Session = serde_json::from_value(child).unwrap();
    let child_agent = Agent::new(&rig.proxy, &child);
    // The child's holds count against the root's cap: 2 + 1 fill the tree.
    rig.hold(&root_agent, "ch_t1").await;
    rig.hold(&root_agent, "ch_t2").await;
    rig.hold(&child_agent, "ch_t3").await;
    for agent in [&child_agent, &root_agent] {
        let reply = rig.refund(agent, "ch_t4", &[1]).await;
        assert_eq!(reply.status, 429, "{reply:?}");
        assert_cap(&reply.json, 3);
    }
    // A grandchild with a cap of its own is still inside the root's.
    let (status, grandchild) = rig
        .create(
            &json!({"agent": "root", "max_pending_approvals": 1}),
            Some(&child.token),
        )
        .await;
    assert_eq!(status, 201, "{grandchild}");
    let grandchild: Session = serde_json::from_value(grandchild).unwrap();
    let reply = rig
        .refund(&Agent::new(&rig.proxy, &grandchild), "ch_t5", &[1])
        .await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(reply.json["max"], 3, "the root's cap: {reply:?}");
    // Zero means no holds at all.
    let (_, none) = rig
        .agent(json!({"agent": "zero", "max_pending_approvals": 0}), None)
        .await;
    let reply = rig.refund(&none, "ch_zero", &[1]).await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(
        (reply.json["used"].clone(), reply.json["max"].clone()),
        (json!(0), json!(0))
    );
}

// ---------------------------------------------------------------------------------------
// Joining
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_holds_join_one_approval_and_one_notification() {
    let sink = SmtpSink::start().await;
    let rig = Bounds::start(&format!(
        "[approvals]\napprovers = [\"{ALICE}\", \"{BOB}\"]\ntick = \"50ms\"\n\
         smtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n",
        sink.url()
    ))
    .await;
    let (_, agent) = rig
        .agent(json!({"agent": "joiner", "max_pending_approvals": 2}), None)
        .await;
    let first = rig.refund(&agent, "ch_same", &[4, 5]).await;
    assert_eq!(first.status, 202, "{first:?}");
    // Five more of the very same request: the same approval, however many, and they do
    // not fill the cap. (Ten holds within a minute would pause the session: see below.)
    for _ in 0..5 {
        let again = rig.refund(&agent, "ch_same", &[4, 5]).await;
        assert_eq!(again.status, 202, "{again:?}");
        assert_eq!(again.json["approval_id"], first.json["approval_id"]);
        assert_eq!(again.json["status_url"], first.json["status_url"]);
        assert_eq!(
            again.header("ostiary-approval"),
            first.header("ostiary-approval")
        );
    }
    // A different body is a different request (and takes the second slot).
    let other = rig.hold(&agent, "ch_same_other").await;
    let id = first.json["approval_id"].as_str().unwrap().to_owned();
    assert_ne!(other, id);
    assert_eq!(rig.refund(&agent, "ch_third", &[1]).await.status, 429);
    // Another session sending the very same request gets its own approval.
    let (_, stranger) = rig.agent(json!({"agent": "joiner"}), None).await;
    let theirs = rig.refund(&stranger, "ch_same", &[4, 5]).await;
    assert_eq!(theirs.status, 202);
    assert_ne!(theirs.json["approval_id"], first.json["approval_id"]);

    // One notification per approver for the joined approval: its outbox has two entries,
    // both sent, and the sink got one mail each naming it.
    let control = rig.proxy.control();
    let deadline = tokio::time::Instant::now() + WAIT;
    let shown = loop {
        let shown = control.approval(&id).await.unwrap();
        let sent = shown["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| !n["sent_ms"].is_null());
        if sent {
            break shown;
        }
        assert!(tokio::time::Instant::now() < deadline, "{shown:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        shown["notifications"].as_array().unwrap().len(),
        2,
        "{shown:#}"
    );
    for who in [ALICE, BOB] {
        let about: Vec<_> = sink
            .messages_to(who)
            .into_iter()
            .filter(|m| m.text.contains(&id))
            .collect();
        assert_eq!(about.len(), 1, "{who}: {about:#?}");
    }
    // The joins are audited under the one approval.
    let records = rig.proxy.audit().await;
    let joined = records
        .iter()
        .filter(|r| r.kind == "approval" && r.approval.as_deref() == Some(id.as_str()))
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|t| t.contains("joins this approval"))
        })
        .count();
    assert_eq!(joined, 5);
    // Once decided, the same request again is a new question.
    control.decide(&id, false, ALICE, None).await.unwrap();
    let anew = rig.refund(&agent, "ch_same", &[4, 5]).await;
    assert_eq!(anew.status, 202, "{anew:?}");
    assert_ne!(anew.json["approval_id"].as_str(), Some(id.as_str()));
    assert_eq!(rig.reached("ch_same"), 0);
}

// ---------------------------------------------------------------------------------------
// Notifications: one notice, then one digest
// ---------------------------------------------------------------------------------------

fn mail_rig_config(sink: &SmtpSink, window: &str) -> String {
    format!(
        "[approvals]\napprovers = [\"{ALICE}\", \"{BOB}\"]\ntick = \"50ms\"\n\
         digest_window = \"{window}\"\n\
         smtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n",
        sink.url()
    )
}

/// Wait until every notification of `ids` is sent (the outbox says so).
async fn all_sent(proxy: &TestProxy, ids: &[String]) {
    let control = proxy.control();
    let deadline = tokio::time::Instant::now() + WAIT + Duration::from_secs(10);
    for id in ids {
        loop {
            let shown = control.approval(id).await.unwrap();
            let owed = shown["notifications"].as_array().unwrap();
            if !owed.is_empty() && owed.iter().all(|n| !n["sent_ms"].is_null()) {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{shown:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Each approver got one notice about `ids[0]` and then one digest listing the rest, each
/// with its own working link.
async fn assert_notice_then_digest(sink: &SmtpSink, ids: &[String]) {
    for who in [ALICE, BOB] {
        let mails = sink.messages_to(who);
        assert_eq!(mails.len(), 2, "{who}: {mails:#?}");
        assert!(
            mails[0].subject.starts_with("Approval needed"),
            "{}",
            mails[0].subject
        );
        assert!(mails[0].text.contains(&ids[0]), "{}", mails[0].text);
        let digest = &mails[1];
        let n = ids.len() - 1;
        assert!(
            digest
                .subject
                .starts_with(&format!("{n} approvals waiting")),
            "{}",
            digest.subject
        );
        let links: Vec<String> = digest
            .links()
            .into_iter()
            .filter(|l| l.contains("/approve/"))
            .collect();
        assert_eq!(links.len(), n, "{}", digest.text);
        for (id, link) in ids[1..].iter().zip(&links) {
            assert!(digest.text.contains(id.as_str()), "{id} in {}", digest.text);
            let (status, page) = get(link).await;
            assert_eq!(status, 200, "{page}");
            assert!(page.contains(id.as_str()) && page.contains(who), "{page}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_holds_is_one_notice_then_one_digest_per_approver() {
    let sink = SmtpSink::start().await;
    let rig = Bounds::start(&mail_rig_config(&sink, "3s")).await;
    let (_, agent) = rig.agent(json!({"agent": "burst"}), None).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(rig.hold(&agent, &format!("ch_burst_{n}")).await);
    }
    all_sent(&rig.proxy, &ids).await;
    assert_notice_then_digest(&sink, &ids).await;
    assert_eq!(sink.messages().len(), 4, "2 approvers × (notice + digest)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_collected_before_a_restart_is_sent_once_after_it() {
    let sink = SmtpSink::start().await;
    let mut rig = Bounds::start(&mail_rig_config(&sink, "8s")).await;
    let (session, agent) = rig.agent(json!({"agent": "burst"}), None).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(rig.hold(&agent, &format!("ch_rs_{n}")).await);
    }
    // The first notices are out, the rest collected (their deliveries unsent) ...
    assert_eq!(sink.wait_for(2, WAIT).await.len(), 2);
    let control = rig.proxy.control();
    for id in &ids[1..] {
        let shown = control.approval(id).await.unwrap();
        let owed = shown["notifications"].as_array().unwrap();
        assert!(owed.iter().all(|n| n["sent_ms"].is_null()), "{shown:#}");
    }
    // ... when the proxy restarts.
    rig.proxy.restart().await;
    let _ = Agent::new(&rig.proxy, &session);
    all_sent(&rig.proxy, &ids).await;
    assert_notice_then_digest(&sink, &ids).await;
}

/// A notice the mail server has kept but not yet acknowledged when the proxy is told to
/// stop is marked sent before the proxy stops, not sent again by the next start. The sink
/// holds its `250` back, so the stop falls inside that window every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_in_flight_when_the_proxy_stops_is_sent_once() {
    let sink = SmtpSink::start().await;
    sink.hold_acceptance(Duration::from_millis(700));
    let mut rig = Bounds::start(&mail_rig_config(&sink, "8s")).await;
    let (session, agent) = rig.agent(json!({"agent": "inflight"}), None).await;
    let id = rig.hold(&agent, "ch_inflight").await;
    // Both approvers' notices are with the server, the second not yet acknowledged ...
    assert_eq!(sink.wait_for(2, WAIT).await.len(), 2);
    // ... when the proxy restarts.
    rig.proxy.restart().await;
    sink.hold_acceptance(Duration::ZERO);
    let _ = Agent::new(&rig.proxy, &session);
    all_sent(&rig.proxy, std::slice::from_ref(&id)).await;
    // Ten ticks of the new proxy's outbox: time enough to send again what was not marked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mails = sink.messages();
    assert_eq!(mails.len(), 2, "one notice per approver: {mails:#?}");
    for approver in [ALICE, BOB] {
        assert_eq!(
            sink.messages_to(approver).len(),
            1,
            "{approver}: {mails:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Slack
// ---------------------------------------------------------------------------------------

async fn slack_bounds(receiver: &SlackReceiver, links: &str) -> Bounds {
    let env = unique_env("SLACK_BOUNDS");
    std::env::set_var(&env, receiver.url());
    Bounds::start(&format!(
        "[approvals]\napprovers = [\"{ALICE}\", \"{BOB}\"]\ntick = \"50ms\"\n\
         digest_window = \"2s\"\nslack_webhook_env = \"{env}\"\n{links}\n"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_gets_no_approver_bound_link_unless_shared_and_bursts_are_digested() {
    for (links, shared) in [("", false), ("slack_links = \"shared\"", true)] {
        let receiver = SlackReceiver::start().await;
        let rig = slack_bounds(&receiver, links).await;
        let (_, agent) = rig.agent(json!({"agent": "slacker"}), None).await;
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(rig.hold(&agent, &format!("ch_slack_{n}")).await);
        }
        all_sent(&rig.proxy, &ids).await;
        let posts = receiver.messages();
        assert_eq!(posts.len(), 2, "one notice, one digest: {posts:#?}");
        let decide = |id: &String| {
            vec![
                ("approve".to_owned(), id.clone()),
                ("deny".to_owned(), id.clone()),
            ]
        };
        assert_eq!(button_values(&posts[0]), decide(&ids[0]));
        let digest_buttons: Vec<_> = ids[1..].iter().flat_map(decide).collect();
        assert_eq!(button_values(&posts[1]), digest_buttons);
        assert!(posts[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("2 approvals waiting"));
        for post in &posts {
            let urls = button_urls(post);
            let text = post.to_string();
            if shared {
                // Opted in: one "Review as …" button per approver and approval.
                let per_post = if post == &posts[0] { 2 } else { 4 };
                assert_eq!(urls.len(), per_post, "{post:#}");
            } else {
                assert!(urls.is_empty(), "{post:#}");
                assert!(!text.contains("/approve/"), "{post:#}");
                assert!(text.contains("No review link is posted here"), "{post:#}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_links_settings_other_than_none_or_shared_are_refused() {
    for (value, loads) in [
        ("\"none\"", true),
        ("\"shared\"", true),
        ("false", true),
        ("true", true),
        ("\"everyone\"", false),
        ("\"Shared\"", false),
        ("1", false),
    ] {
        let text = format!("[approvals]\nslack_links = {value}\n");
        let loaded = ostiary::Config::from_toml(&text, std::path::Path::new("t"));
        assert_eq!(loaded.is_ok(), loads, "{value}: {loaded:?}");
    }
    let config = ostiary::Config::from_toml("", std::path::Path::new("t")).unwrap();
    assert_eq!(
        config.approvals.slack_links,
        ostiary::config::SlackLinks::None
    );
}

// ---------------------------------------------------------------------------------------
// The watchdog
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_pauses_a_session_that_floods_holds() {
    let rig = Bounds::start("[approvals]\napprovers = [\"alice@example.com\"]\n").await;
    // Distinct requests: five held, then refused at the cap; the tenth hold event trips
    // the watchdog (default `holds = 10` within 60 s).
    let (a, agent) = rig.agent(json!({"agent": "flood-distinct"}), None).await;
    let mut statuses = Vec::new();
    for n in 0..12 {
        statuses.push(rig.refund(&agent, &format!("ch_wd_{n}"), &[1]).await.status);
    }
    assert_eq!(statuses[..5], [202; 5], "{statuses:?}");
    assert_eq!(statuses[5..10], [429; 5], "{statuses:?}");
    assert_eq!(statuses[10..], [423; 2], "{statuses:?}");
    // Identical requests: each joins the one approval, and each is a hold all the same.
    let (b, same) = rig.agent(json!({"agent": "flood-same"}), None).await;
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(rig.refund(&same, "ch_wd_same", &[1]).await.status);
    }
    assert_eq!(statuses[..10], [202; 10], "{statuses:?}");
    assert_eq!(statuses[10], 423, "{statuses:?}");
    // Both dead letters say why.
    let control = rig.proxy.control();
    for session in [&a, &b] {
        let deadline = tokio::time::Instant::now() + WAIT;
        let letter = loop {
            let letters = control
                .dead_letters(Some(&session.session_id))
                .await
                .unwrap();
            if let Some(letter) = letters["dead_letters"].get(0) {
                break letter.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "{letters}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(letter["kind"], "hold_burst", "{letter:#}");
        let reason = letter["reason"].as_str().unwrap();
        assert!(reason.contains("10 requests were held"), "{reason}");
    }
    // A session that is only polling its one approval is not flooding.
    let (_, patient) = rig.agent(json!({"agent": "patient"}), None).await;
    let id = rig.hold(&patient, "ch_wd_patient").await;
    let url = rig.upstream.url("/idem/refunds/ch_wd_patient");
    for _ in 0..15 {
        let got = patient
            .send(
                "POST",
                &url,
                Some(refund_body(&[1])),
                &[("ostiary-approval", &id)],
            )
            .await;
        assert_eq!(got.status, 202, "{got:?}");
    }
}
