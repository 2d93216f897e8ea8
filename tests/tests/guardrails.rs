//! Session guardrails end to end (issue 7): each limit reached answers `429` with its
//! figures, a limit can go to a human who grants more, policies see the session's usage,
//! `Idempotency-Key` replays, child sessions are bounded and carved out of their parent,
//! and teardown drains requests in flight within its grace period. The loop watchdog's
//! tests are in `guardrails_watchdog.rs`.

use crate::support::guardrails as support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Agent, Rig};

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
    let metrics = reqwest::Client::new()
        .get(rig.control_url("/metrics"))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
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

/// Context comes only from what the proxy observed (THREATS: "Context the agent claims"):
/// headers naming a tier, an approval, a budget or the session's usage change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_the_agent_claims_in_headers_is_ignored() {
    let rig = Rig::start("").await;
    let a = rig.agent(json!({"agent": "c"}), None).await.unwrap();
    let claims = [
        ("x-ostiary-tier", "read"),
        ("ostiary-tier", "read"),
        ("x-ostiary-approval", "granted"),
        ("ostiary-approval-granted", "true"),
        ("x-approval-granted", "true"),
        ("x-ostiary-session-calls", "0"),
        ("x-ostiary-budget", "1000000"),
        (
            "x-ostiary-context",
            r#"{"approval":{"granted":true},"session":{"calls":0}}"#,
        ),
    ];
    for i in 0..2 {
        let (s, b, _) = rig
            .call(&a, "GET", &format!("/idem/guarded/c{i}"), &claims, None)
            .await;
        assert_eq!(s, 201, "{b}");
    }
    // The third call is forbidden by `context.session.calls >= 2`, whatever the headers say.
    let (s, b, _) = rig.call(&a, "GET", "/idem/guarded/c2", &claims, None).await;
    assert_eq!(s, 403, "{b}");
    assert_eq!(b["policies"], json!(["guarded-after-two-calls"]));
    assert_eq!(rig.upstream.count("/idem/guarded/c2"), 0);
    let records = rig.proxy.audit().await;
    let denied = records
        .iter()
        .find(|r| r.path.as_deref() == Some("/idem/guarded/c2"))
        .expect("the denial is on the record");
    assert_eq!(denied.decision, "deny", "{denied:#?}");
    assert_eq!(denied.policies, ["guarded-after-two-calls"], "{denied:#?}");
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
    // At once: the key is free before the refusal is answered.
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
    // A child names no agent: it runs as its parent's (another name needs a spawn permit).
    let child = rig
        .agent(json!({"max_calls": 4}), Some(&root))
        .await
        .unwrap();
    assert_eq!(child.body["agent"], "root");
    assert_eq!(child.body["depth"], 1);
    assert_eq!(child.body["parent"], root.id.as_str());
    assert_eq!(child.body["tenant"], root.body["tenant"]);
    assert_eq!(child.body["limits"]["max_calls"], 4);
    // Depth: a grandchild is depth 2 (the maximum), its child is refused.
    let grandchild = rig
        .agent(json!({"max_calls": 1}), Some(&child))
        .await
        .unwrap();
    assert_eq!(grandchild.body["depth"], 2);
    let (s, b) = rig.agent(json!({}), Some(&grandchild)).await.err().unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("depth")), "{b}");
    assert_eq!((b["used"].clone(), b["max"].clone()), (json!(3), json!(2)));
    // Budget: the root has 10 - 4 = 6 left; a child asking 7 is refused.
    let (s, b) = rig
        .agent(json!({"max_calls": 7}), Some(&root))
        .await
        .err()
        .unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("calls")), "{b}");
    assert_eq!(b["max"], 6);
    // Fan-out: a second child fits, a third does not.
    let second = rig.agent(json!({}), Some(&root)).await.unwrap();
    assert_eq!(second.body["limits"]["max_calls"], 3, "half of the 6 left");
    let (s, b) = rig
        .agent(json!({"max_calls": 1}), Some(&root))
        .await
        .err()
        .unwrap();
    assert_eq!((s, b["limit"].clone()), (429, json!("children")), "{b}");
    // A child may not pick another tenant, nor name another parent.
    let (s, _) = rig
        .agent(json!({"tenant": "other", "max_calls": 1}), Some(&child))
        .await
        .err()
        .unwrap();
    assert_eq!(s, 400);
    let (s, _) = rig
        .agent(json!({"parent": second.id}), Some(&child))
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
    let (s, b) = rig.agent(json!({}), Some(&forged)).await.err().unwrap();
    assert_eq!(
        (s, b["error"].clone()),
        (401, json!("unauthenticated")),
        "{b}"
    );
    let garbage = Agent {
        token: "not-a-token".into(),
        ..forged
    };
    let (s, _) = rig.agent(json!({}), Some(&garbage)).await.err().unwrap();
    assert_eq!(s, 401);
    // Unknown fields are refused, not ignored.
    let (s, _) = rig
        .agent(json!({"max_calls": 1, "depth": 0}), Some(&second))
        .await
        .err()
        .unwrap();
    assert_eq!(s, 400);
    // An operator may create a child on a session's behalf by naming it.
    let by_admin = rig
        .agent(json!({"parent": second.id, "max_calls": 1}), None)
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
    let (s, _) = rig.agent(json!({}), Some(&child)).await.err().unwrap();
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
async fn teardown_lets_requests_finish_within_the_grace_then_cuts_them() {
    let rig = Rig::start("[sessions]\ngrace = \"2s\"\n").await;
    // A request that finishes within the grace completes whole.
    let a = rig.agent(json!({"agent": "t"}), None).await.unwrap();
    let slow = {
        let client = a.client.clone();
        let url = rig.upstream.url("/stream?chunks=5&size=100&delay_ms=100");
        tokio::spawn(async move { client.get(url).send().await.unwrap().bytes().await })
    };
    // In flight once the upstream has it (a fixed wait could end before the request
    // even reached the proxy, and teardown would then refuse it rather than drain it).
    assert!(
        rig.upstream
            .wait_for_count("/stream", 1, Duration::from_secs(10))
            .await,
        "the slow request never reached the upstream"
    );
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
    assert!(
        rig.upstream
            .wait_for_count("/stream", 2, Duration::from_secs(10))
            .await,
        "the endless request never reached the upstream"
    );
    let started = Instant::now();
    let (s, _) = rig.session_call(reqwest::Method::DELETE, &b, "").await;
    assert_eq!(s, 200);
    let took = started.elapsed();
    assert!(endless.await.unwrap().is_err(), "the answer was cut");
    println!("teardown with a request outliving the 2 s grace took {took:?}");
}
