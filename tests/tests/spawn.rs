//! Identity only narrows (THREATS: "Authority and ambiguity"): a child session runs as its
//! parent's agent, another name needs `Action::"spawn"`, policies see `context.session`
//! (depth, parent_agent) on every action, and no number a session asks for can widen what
//! it or its parent holds.

use crate::support::guardrails as support;

use serde_json::{json, Value};
use support::{Agent, Rig};

/// `deployer` may write; everyone may read; `planner` may spawn `reviewer` (only from a
/// root session); a child of a planner may not POST; a child may not reach `/admin`.
const POLICIES: &str = r#"
@id("anyone-reads")
permit (principal, action == Ostiary::Action::"http", resource)
when { context.method == "GET" };

@id("deployer-writes")
permit (principal == Ostiary::Agent::"deployer", action == Ostiary::Action::"http", resource);

@id("planner-writes")
permit (principal == Ostiary::Agent::"planner", action == Ostiary::Action::"http", resource);

@id("planner-spawns-reviewer")
permit (principal == Ostiary::Agent::"planner", action == Ostiary::Action::"spawn",
        resource == Ostiary::Agent::"reviewer")
when { context.session.depth == 0 };

@id("reviewer-writes")
permit (principal == Ostiary::Agent::"reviewer", action == Ostiary::Action::"http", resource);

@id("planners-children-only-read")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.session.parent_agent == "planner" && context.method != "GET" };

@id("children-keep-out-of-admin")
forbid (principal, action, resource)
when { context.session.depth > 0 && context has path && context.path like "/admin*" };

@id("tools")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);
"#;

async fn rig() -> Rig {
    Rig::start_with("", POLICIES).await
}

async fn create(rig: &Rig, body: Value, parent: Option<&Agent>) -> Result<Agent, (u16, Value)> {
    rig.agent(body, parent).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_never_takes_another_agents_name_without_a_spawn_permit() {
    let rig = rig().await;
    let reader = create(&rig, json!({"agent": "reader"}), None)
        .await
        .unwrap();
    // The reader cannot write; `deployer` can.
    let (s, _, _) = rig
        .call(&reader, "POST", "/echo", &[], Some(json!({})))
        .await;
    assert_eq!(s, 403);

    // The attack: the reader's token creates a child named `deployer`, hoping for its
    // permits. Every spelling of another name is refused, with its own token and by an
    // operator naming the reader's session as the parent.
    for name in [
        "deployer", "Deployer", "planner", "reviewer", "reader2", "admin",
    ] {
        let (status, body) = create(&rig, json!({"agent": name}), Some(&reader))
            .await
            .err()
            .unwrap_or_else(|| panic!("{name}: a child was created"));
        assert_eq!(status, 403, "{name}: {body}");
        assert_eq!(body["error"], "denied", "{body}");
        assert_eq!(body["action"], "Ostiary::Action::\"spawn\"", "{body}");
        assert_eq!(
            body["resource"],
            format!("Ostiary::Agent::{name:?}"),
            "{body}"
        );
        assert_eq!(body["policies"], json!([]), "a default deny: {body}");
        assert!(body["request_id"].is_string(), "{body}");
    }
    let (status, body) = create(
        &rig,
        json!({"agent": "deployer", "parent": reader.id}),
        None,
    )
    .await
    .err()
    .unwrap();
    assert_eq!(
        (status, body["error"].clone()),
        (403, json!("denied")),
        "{body}"
    );
    // An invalid name is a bad request, not a policy question.
    let (status, _) = create(&rig, json!({"agent": "de ployer"}), Some(&reader))
        .await
        .err()
        .unwrap();
    assert_eq!(status, 400);
    // Nothing was created for any of them.
    let (_, shown) = rig.session_call(reqwest::Method::GET, &reader, "").await;
    assert_eq!(shown["children"], json!([]), "{shown}");

    // A child that names no agent, or its parent's, runs as the parent: no wider.
    for body in [json!({}), json!({"agent": "reader"})] {
        let child = create(&rig, body, Some(&reader)).await.unwrap();
        assert_eq!(child.body["agent"], "reader", "{}", child.body);
        let (s, _, _) = rig
            .call(&child, "POST", "/echo", &[], Some(json!({})))
            .await;
        assert_eq!(s, 403, "the child writes where its parent may not");
        let (s, _, _) = rig.call(&child, "GET", "/echo", &[], None).await;
        assert_eq!(s, 200);
    }

    // Every refusal is audited under the parent's session.
    let records = rig.proxy.audit().await;
    let spawns: Vec<_> = records.iter().filter(|r| r.kind == "spawn").collect();
    assert!(spawns.len() >= 7, "{spawns:#?}");
    assert!(spawns.iter().all(|r| r.decision == "deny"
        && r.session.as_deref() == Some(reader.id.as_str())
        && r.error.as_deref() == Some("denied")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permitted_spawn_gets_the_name_and_policies_see_the_child_in_every_context() {
    let rig = rig().await;
    let planner = create(&rig, json!({"agent": "planner"}), None)
        .await
        .unwrap();
    let reviewer = create(&rig, json!({"agent": "reviewer"}), Some(&planner))
        .await
        .unwrap();
    assert_eq!(reviewer.body["agent"], "reviewer");
    assert_eq!(reviewer.body["depth"], 1);
    // The permit is the parent's and bounded by its session: a reviewer may not spawn a
    // planner, and a planner's own child (depth 1) may not spawn a reviewer.
    let own = create(&rig, json!({"agent": "reviewer"}), Some(&reviewer))
        .await
        .unwrap();
    assert_eq!(
        own.body["agent"], "reviewer",
        "its own name needs no permit"
    );
    let (status, body) = create(&rig, json!({"agent": "planner"}), Some(&reviewer))
        .await
        .err()
        .unwrap();
    assert_eq!(status, 403, "{body}");
    let planner_child = create(&rig, json!({}), Some(&planner)).await.unwrap();
    let (status, body) = create(&rig, json!({"agent": "reviewer"}), Some(&planner_child))
        .await
        .err()
        .unwrap();
    assert_eq!(status, 403, "depth 1 may not spawn a reviewer: {body}");

    // context.session.parent_agent: the reviewer may write on its own permit, but not as
    // a planner's child; the planner itself writes.
    let (s, _, _) = rig
        .call(&reviewer, "POST", "/echo", &[], Some(json!({})))
        .await;
    assert_eq!(s, 403);
    let (s, body, _) = rig
        .call(&reviewer, "POST", "/echo", &[], Some(json!({})))
        .await;
    assert_eq!(
        body["policies"],
        json!(["planners-children-only-read"]),
        "{body}"
    );
    assert_eq!(s, 403);
    let (s, _, _) = rig
        .call(&planner, "POST", "/echo", &[], Some(json!({})))
        .await;
    assert_eq!(s, 200);
    // context.session.depth, in http and in tool calls alike.
    let (s, _, _) = rig.call(&planner, "GET", "/admin/x", &[], None).await;
    assert_ne!(s, 403, "a root may reach /admin");
    for child in [&reviewer, &planner_child] {
        let (s, body, _) = rig.call(child, "GET", "/admin/x", &[], None).await;
        assert_eq!(s, 403, "{body}");
        assert_eq!(
            body["policies"],
            json!(["children-keep-out-of-admin"]),
            "{body}"
        );
    }
    let (s, _, _) = rig.call(&reviewer, "GET", "/idem/read/1", &[], None).await;
    assert!(
        (200..300).contains(&s),
        "tool calls see the session too, and reads are fine: {s}"
    );

    // The creation is audited with the permit that allowed the name.
    let records = rig.proxy.audit().await;
    let allowed = records
        .iter()
        .find(|r| r.kind == "spawn" && r.decision == "allow")
        .unwrap_or_else(|| panic!("{records:#?}"));
    assert_eq!(
        allowed.policies,
        ["planner-spawns-reviewer"],
        "{allowed:#?}"
    );
    assert_eq!(allowed.session.as_deref(), Some(planner.id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_out_of_bounds_are_bad_requests_and_a_child_never_adds_to_its_parent() {
    let rig = rig().await;
    let root = create(
        &rig,
        json!({"agent": "reader", "max_calls": 10, "max_cost": 5.0}),
        None,
    )
    .await
    .unwrap();
    let bad_values = [
        json!({"max_cost": -1e6}),
        json!({"max_cost": -0.01}),
        json!({"max_cost": 1e13}),
        json!({"max_cost": 1.7e308}),
        json!({"max_cost": "NaN"}),
        json!({"max_cost": "inf"}),
        json!({"max_calls": -1}),
        json!({"max_calls": 1.5}),
        json!({"max_calls": 1e19}),
        json!({"max_calls": 18446744073709551615u64}),
        json!({"max_bytes_sent": -5}),
        json!({"max_bytes_received": 18446744073709551615u64}),
        json!({"ttl": "0s"}),
        json!({"ttl": "-5m"}),
        json!({"ttl": "1ms"}),
        json!({"ttl": "100000000000h"}),
        json!({"ttl": "soon"}),
        json!({"ttl": 60}),
    ];
    for bad in &bad_values {
        for parent in [None, Some(&root)] {
            let mut body = bad.clone();
            if parent.is_none() {
                body["agent"] = json!("r2");
            }
            let (status, answer) = create(&rig, body.clone(), parent)
                .await
                .err()
                .unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(status, 400, "{body}: {answer}");
            assert_eq!(answer["error"], "bad_request", "{body}: {answer}");
        }
    }
    // JSON's own non-numbers never parse at all.
    for text in [
        r#"{"max_cost": NaN}"#,
        r#"{"max_cost": Infinity}"#,
        r#"{"max_cost": 1e999}"#,
    ] {
        let response = rig
            .http
            .post(rig.control_url("/v1/sessions"))
            .bearer_auth(&root.token)
            .header("content-type", "application/json")
            .body(text)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{text}");
    }
    // The parent still has all of its budget: nothing was carved for a refused child, and
    // a negative child never inflated it.
    let (_, shown) = rig.session_call(reqwest::Method::GET, &root, "").await;
    assert_eq!(shown["limits"]["max_calls"], 10, "{shown}");
    assert_eq!(shown["limits"]["max_cost"], 5.0, "{shown}");
    let whole = create(&rig, json!({"max_calls": 10, "max_cost": 5.0}), Some(&root))
        .await
        .unwrap();
    assert_eq!(whole.body["limits"]["max_calls"], 10);
    let (status, body) = create(&rig, json!({"max_calls": 1}), Some(&root))
        .await
        .err()
        .unwrap();
    assert_eq!(
        (status, body["limit"].clone()),
        (429, json!("calls")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_asking_more_bytes_than_its_parent_gets_what_the_parent_has() {
    let rig = rig().await;
    let root = create(
        &rig,
        json!({"agent": "reader", "max_bytes_received": 4000}),
        None,
    )
    .await
    .unwrap();
    let child = create(
        &rig,
        json!({"max_bytes_received": 1_000_000_000u64}),
        Some(&root),
    )
    .await
    .unwrap();
    assert_eq!(
        child.body["limits"]["max_bytes_received"], 4000,
        "{}",
        child.body
    );
    let sibling = create(&rig, json!({}), Some(&root)).await.unwrap();
    // The two children share the parent's 4000 bytes: once the first has spent them, the
    // second is refused too, and so is the parent.
    for _ in 0..10 {
        let (s, _, _) = rig
            .call(&child, "GET", "/stream?chunks=1&size=1000", &[], None)
            .await;
        if s == 429 {
            break;
        }
    }
    for agent in [&child, &sibling, &root] {
        let (s, body, _) = rig.call(agent, "GET", "/echo", &[], None).await;
        assert_eq!(s, 429, "{}: {body}", agent.id);
        assert_eq!(body["limit"], "bytes_received", "{body}");
    }
}
