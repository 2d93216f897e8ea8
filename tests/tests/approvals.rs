//! The approval queue end to end (docs/design.md §5, §10): an escalated tool call is held (202
//! `approval_pending`), decided through the control API, executed exactly once with an
//! `Idempotency-Key`, and collected by the agent's retry or from the status URL. Also the
//! ways it must not run: denied, expired, re-authorization refused after a policy change or
//! a revoked session, another session's id, a different request under the same id.
//! Channels (email, Slack, the page, the browser) and crashes have their own crates.

use crate::support::approvals as support;

use std::time::Duration;

use ostiary_e2e::proxy::TestProxy;
use serde_json::json;
use support::{refund_body, Agent, Rig, APPROVER, POLICIES_LOCKED};

fn approvers(extra: &str) -> String {
    format!("approvers = [\"{APPROVER}\", \"bob@example.com\"]\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_runs_once_after_approval_and_the_retry_collects_it() {
    let rig = Rig::start(&approvers("")).await;
    let body = refund_body(&[11, 12, 13]);

    let held = rig.refund("ch_1", &[11, 12, 13], &[]).await;
    assert_eq!(held.status, 202, "{held:?}");
    let id = held.json["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(held.header("ostiary-approval"), Some(id.as_str()));
    assert!(held.header("ostiary-request-id").is_some());
    let status_url = held.json["status_url"].as_str().unwrap().to_owned();
    assert_eq!(
        status_url,
        format!("http://{}/v1/approvals/{id}", rig.proxy.proxy_addr)
    );
    assert!(held.json["expires_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        rig.delivered("ch_1"),
        0,
        "nothing reaches the upstream before approval"
    );

    // What approvers see is what the proxy observed.
    let control = rig.proxy.control();
    let listed = control.approvals(Some("pending")).await.unwrap();
    assert_eq!(listed["counts"]["pending"], 1, "{listed}");
    let shown = control.approval(&id).await.unwrap();
    assert_eq!(shown["observed"]["tool"], "pay.refund");
    assert_eq!(shown["observed"]["tier"], "irreversible");
    assert_eq!(shown["observed"]["records"], 3);
    assert_eq!(shown["observed"]["cost"], 0.25);
    assert_eq!(shown["observed"]["args"]["charge"], "ch_1");
    assert_eq!(shown["policies"], json!(["irreversible-needs-human"]));
    assert_eq!(shown["agent"], "agent-1");
    assert_eq!(shown["request"]["method"], "POST");
    let headers = shown["request"]["headers"].to_string().to_lowercase();
    assert!(!headers.contains("proxy-authorization"), "{headers}");

    // A retry before the decision: still pending, still not forwarded.
    let early = rig
        .refund("ch_1", &[11, 12, 13], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(early.status, 202, "{early:?}");
    assert_eq!(early.json["status"], "pending");

    let decided = control
        .decide(&id, true, APPROVER, Some("checked the ledger"))
        .await
        .unwrap();
    assert_eq!(decided["status"], "approved");
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(executed["approver"], APPROVER);
    assert_eq!(executed["attempts"], 1);

    // Collected by the retry: the upstream's own answer, applied once, with the key.
    let collected = rig
        .refund("ch_1", &[11, 12, 13], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!(collected.json["applied"], 1);
    assert_eq!(collected.json["key"], format!("ostiary-{id}"));
    assert_eq!(collected.header("ostiary-approval"), Some(id.as_str()));
    let again = rig
        .refund("ch_1", &[11, 12, 13], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(again.status, 201);
    assert_eq!((rig.applied("ch_1"), rig.delivered("ch_1")), (1, 1));
    let seen = rig.upstream.seen_path("/idem/refunds/ch_1");
    assert_eq!(
        seen[0].header("idempotency-key"),
        Some(format!("ostiary-{id}").as_str())
    );
    assert_eq!(
        seen[0].body_sha256.as_deref(),
        Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body.as_bytes())).as_str())
    );
    assert!(seen[0].header("ostiary-approval").is_none());
    assert!(seen[0].header("proxy-authorization").is_none());

    // The status URL through the proxy: the same outcome as JSON.
    let status = rig.agent.status(&status_url, &[]).await;
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(status.json["status"], "executed");
    assert_eq!(status.json["response"]["status"], 201);
    assert!(status.json["response"]["body"]
        .as_str()
        .unwrap()
        .contains("\"applied\":1"));

    // Every transition is in the audit chain, under the approval's id.
    let records = rig.proxy.audit().await;
    let of: Vec<_> = records
        .iter()
        .filter(|r| r.approval.as_deref() == Some(id.as_str()))
        .map(|r| (r.kind.as_str(), r.decision.as_str()))
        .collect();
    assert_eq!(of[0], ("http", "escalate"), "{of:?}");
    assert!(of.contains(&("approval", "allow")), "{of:?}");
    let executed = records
        .iter()
        .find(|r| r.kind == "approval" && r.status == Some(201))
        .expect("an execution record");
    assert_eq!(executed.approver.as_deref(), Some(APPROVER));
    assert_eq!(executed.tool.as_deref(), Some("pay.refund"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_wait_blocks_until_the_outcome_is_there() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_2", &[1]).await;
    let agent = rig.agent.clone();
    let url = rig.url("/idem/refunds/ch_2");
    let waiting = {
        let id = id.clone();
        tokio::spawn(async move {
            agent
                .send(
                    "POST",
                    &url,
                    Some(refund_body(&[1])),
                    &[("ostiary-approval", &id), ("prefer", "wait=20")],
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "Prefer: wait holds the retry open");
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let collected = waiting.await.unwrap();
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!(rig.applied("ch_2"), 1);

    // A short wait on a pending approval answers 202 when it runs out.
    let other = rig.hold("ch_3", &[2]).await;
    let started = std::time::Instant::now();
    let pending = rig
        .refund(
            "ch_3",
            &[2],
            &[("ostiary-approval", &other), ("prefer", "wait=1")],
        )
        .await;
    assert_eq!(pending.status, 202);
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_never_runs() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_4", &[1, 2]).await;
    let decided = rig
        .proxy
        .control()
        .decide(&id, false, "bob@example.com", Some("not a duplicate"))
        .await
        .unwrap();
    assert_eq!(decided["status"], "denied");
    let retry = rig
        .refund("ch_4", &[1, 2], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_denied");
    assert_eq!(retry.json["approver"], "bob@example.com");
    assert_eq!(retry.json["approval_id"], id.as_str());
    // Decided once: approving afterwards is refused.
    let late = rig.proxy.control().decide(&id, true, APPROVER, None).await;
    assert!(late.unwrap_err().to_string().contains("denied"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.delivered("ch_4"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_must_be_the_same_request_of_the_same_session() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_5", &[1]).await;
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    rig.wait_status(&id, "executed").await;

    // Another body under the same id: refused, nothing sent.
    let other_body = rig
        .refund("ch_5", &[1, 2, 3, 4], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(other_body.status, 400, "{other_body:?}");
    assert_eq!(other_body.json["reason"], "approval_mismatch");
    // Another URL.
    let other_url = rig.refund("ch_6", &[1], &[("ostiary-approval", &id)]).await;
    assert_eq!(other_url.json["reason"], "approval_mismatch");
    // Another session cannot collect it (nor learn that it exists).
    let stranger = rig.proxy.session("agent-2").await;
    let stranger = Agent::new(&rig.proxy, &stranger);
    let stolen = stranger
        .send(
            "POST",
            &rig.url("/idem/refunds/ch_5"),
            Some(refund_body(&[1])),
            &[("ostiary-approval", &id)],
        )
        .await;
    assert_eq!(stolen.status, 400, "{stolen:?}");
    assert_eq!(stolen.json["reason"], "approval_unknown");
    let peek = stranger
        .status(
            &format!("http://{}/v1/approvals/{id}", rig.proxy.proxy_addr),
            &[],
        )
        .await;
    assert_eq!(peek.json["reason"], "approval_unknown", "{peek:?}");
    // A malformed id.
    let garbage = rig
        .refund("ch_5", &[1], &[("ostiary-approval", "../../etc/passwd")])
        .await;
    assert_eq!(garbage.status, 400);
    assert_eq!(rig.delivered("ch_5"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_is_reauthorized_under_the_policies_in_force_at_execution() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_7", &[1]).await;
    std::fs::write(
        rig.proxy.dir.path().join("policies/test.cedar"),
        POLICIES_LOCKED,
    )
    .unwrap();
    let reload = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!(
            "http://{}/v1/policy/reload",
            rig.proxy.control_addr
        ))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status(), 200);
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let refused = rig.wait_status(&id, "refused").await;
    assert!(
        refused["reason"].as_str().unwrap().contains("no-refunds"),
        "{refused:#}"
    );
    let retry = rig.refund("ch_7", &[1], &[("ostiary-approval", &id)]).await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "denied");
    assert_eq!(retry.json["status"], "refused");
    assert_eq!(rig.delivered("ch_7"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_session_s_approvals_never_run() {
    let rig = Rig::start(&approvers("")).await;
    let approved = rig.hold("ch_8", &[1]).await;
    let pending = rig.hold("ch_8b", &[1]).await;
    let control = rig.proxy.control();
    // Approved right before the session is revoked: it races the revocation, and either
    // ran first or is refused at execution — never run after the session ended.
    control
        .decide(&approved, true, APPROVER, None)
        .await
        .unwrap();
    control
        .delete_session(&rig.session.session_id)
        .await
        .unwrap();
    // Still pending when the session ended: expired at once, nobody is asked any more.
    let expired = rig.wait_status(&pending, "expired").await;
    assert!(
        expired["reason"]
            .as_str()
            .unwrap()
            .contains("session ended"),
        "{expired:#}"
    );
    assert!(control
        .decide(&pending, true, APPROVER, None)
        .await
        .is_err());
    assert_eq!(rig.delivered("ch_8b"), 0);
    let raced = loop {
        let a = control.approval(&approved).await.unwrap();
        if a["status"] == "executed" || a["status"] == "refused" {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ran = usize::from(raced["status"] == "executed");
    assert_eq!(rig.delivered("ch_8"), ran, "{raced:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_decided_after_its_session_ended_is_refused_at_execution() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_8c", &[1]).await;
    // The session expires in the registry (not torn down yet by the reaper): the decision
    // is recorded, and execution refuses it because the session is no longer live.
    rig.proxy
        .shared
        .sessions
        .revoke(&rig.session.session_id)
        .await
        .unwrap();
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let refused = rig.wait_status(&id, "refused").await;
    assert!(refused["reason"].as_str().unwrap().contains("session"));
    assert_eq!(rig.delivered("ch_8c"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_deciding_means_reminders_then_expiry_never_silence() {
    let rig = Rig::start(&approvers(
        "ttl = \"300ms\"\ndeadline = \"1500ms\"\ntick = \"50ms\"",
    ))
    .await;
    let id = rig.hold("ch_9", &[1]).await;
    let expired = rig.wait_status(&id, "expired").await;
    assert!(expired["rounds"].as_u64().unwrap() >= 3, "{expired:#}");
    let retry = rig.refund("ch_9", &[1], &[("ostiary-approval", &id)]).await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_expired");
    assert_eq!(retry.json["approval_id"], id.as_str());
    let late = rig.proxy.control().decide(&id, true, APPROVER, None).await;
    assert!(late.is_err(), "an expired approval cannot be approved");

    let records = rig.proxy.audit().await;
    let reasons: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "approval" && r.approval.as_deref() == Some(id.as_str()))
        .map(|r| (r.decision.clone(), r.error.clone()))
        .collect();
    let reminders = reasons.iter().filter(|(d, _)| d == "escalate").count();
    assert!(reminders >= 2, "{reasons:?}");
    assert!(reasons.contains(&("deny".into(), Some("approval_expired".into()))));
    let metrics = metrics(&rig.proxy).await;
    assert!(
        metrics.contains("ostiary_approval_transitions_total{transition=\"expired\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ostiary_approval_transitions_total{transition=\"reminded\"}"));
    assert_eq!(rig.delivered("ch_9"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_approvers_decide_and_never_the_agent() {
    // The agent's own name is even on the list: it still cannot approve.
    let rig = Rig::start("approvers = [\"alice@example.com\", \"agent-1\"]").await;
    let id = rig.hold("ch_10", &[1]).await;
    let control = rig.proxy.control();
    let stranger = control.decide(&id, true, "mallory@example.com", None).await;
    assert!(stranger
        .unwrap_err()
        .to_string()
        .contains("not one of the configured approvers"));
    let own = control.decide(&id, true, "agent-1", None).await;
    assert!(own.unwrap_err().to_string().contains("cannot approve"));
    let link = control.approval_link(&id, "agent-1").await;
    assert!(link.is_err(), "no link is issued to the agent either");
    assert_eq!(rig.wait_status(&id, "pending").await["status"], "pending");

    // Nor through the proxy: the control listener is never reachable from it.
    let through = rig
        .agent
        .send(
            "POST",
            &format!(
                "http://{}/v1/approvals/{id}/approve",
                rig.proxy.control_addr
            ),
            Some(json!({"approver": "alice@example.com"}).to_string()),
            &[(
                "authorization",
                &format!("Bearer {}", rig.proxy.admin_token),
            )],
        )
        .await;
    assert_eq!(through.status, 403, "{through:?}");
    assert_eq!(through.json["error"], "destination_blocked");
    assert_eq!(rig.wait_status(&id, "pending").await["status"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_deciders_at_once_execute_it_once() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_11", &[1]).await;
    let control = rig.proxy.control();
    let decisions = (0..16).map(|i| {
        let control = control.clone();
        let id = id.clone();
        async move {
            let who = if i % 2 == 0 {
                APPROVER
            } else {
                "bob@example.com"
            };
            control.decide(&id, true, who, None).await.is_ok()
        }
    });
    let wins = futures_util::future::join_all(decisions)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    assert_eq!(wins, 1, "one decision is recorded");
    rig.wait_status(&id, "executed").await;
    // Sweeps that run meanwhile find nothing left to claim.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!((rig.applied("ch_11"), rig.delivered("ch_11")), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_larger_than_an_approval_holds_are_refused() {
    let rig = Rig::start(&approvers("max_body_bytes = 64")).await;
    let big: Vec<u32> = (0..100).collect();
    let refused = rig.refund("ch_12", &big, &[]).await;
    assert_eq!(refused.status, 413, "{refused:?}");
    assert_eq!(refused.json["reason"], "approval_body_too_large");
    assert_eq!(refused.json["limit"], 64);
    let listed = rig.proxy.control().approvals(None).await.unwrap();
    assert_eq!(listed["approvals"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_url_answers_the_agent_directly_with_its_token() {
    let rig = Rig::start(&approvers("")).await;
    let id = rig.hold("ch_13", &[1]).await;
    let url = format!("http://{}/v1/approvals/{id}", rig.proxy.proxy_addr);
    let direct = reqwest::Client::builder().no_proxy().build().unwrap();
    let anonymous = direct.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 407);
    let mine = direct
        .get(&url)
        .bearer_auth(&rig.agent.token)
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 200);
    let body: serde_json::Value = mine.json().await.unwrap();
    assert_eq!(body["status"], "pending");
    assert_eq!(body["tool"], "pay.refund");
    assert!(body["response"].is_null());
}

async fn metrics(proxy: &TestProxy) -> String {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{}/metrics", proxy.control_addr))
        .bearer_auth(&proxy.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_injected_at_execution_and_scrubbed_from_the_stored_answer() {
    const SECRET: &str = "sk_live_CANARY_approval_7f3e91";
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("secrets.toml");
    std::fs::write(&file, format!("pay = \"{SECRET}\"\n")).unwrap();
    let rig = Rig::start(&approvers(&format!(
        r#"
[broker]
backend = "file"
file = "{}"

[[credential]]
name = "pay"
source = {{ file = "pay" }}
hosts = ["api.example.test"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}
"#,
        file.display()
    )))
    .await;
    let url = rig.url("/reflect");
    let body = json!({"note": "echo me"}).to_string();
    let agent_auth = ("authorization", "Bearer agent-chosen-junk");
    let held = rig
        .agent
        .send("POST", &url, Some(body.clone()), &[agent_auth])
        .await;
    assert_eq!(held.status, 202, "{held:?}");
    let id = held.json["approval_id"].as_str().unwrap().to_owned();
    let control = rig.proxy.control();
    let stored = control.approval(&id).await.unwrap().to_string();
    assert!(!stored.contains("agent-chosen-junk"), "{stored}");
    assert!(!stored.contains(SECRET), "{stored}");

    control.decide(&id, true, APPROVER, None).await.unwrap();
    let executed = rig.wait_status(&id, "executed").await;
    assert!(!executed.to_string().contains(SECRET), "{executed:#}");
    // The upstream got the broker's credential, minted at execution, not the agent's.
    let seen = rig.upstream.seen_path("/reflect");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );

    // What the upstream echoed back is scrubbed before it is stored and collected.
    let collected = rig
        .agent
        .send("POST", &url, Some(body), &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 200, "{collected:?}");
    assert!(collected.body.contains("echo me"), "{}", collected.body);
    assert!(!collected.body.contains(SECRET), "{}", collected.body);
    let status = rig
        .agent
        .status(held.json["status_url"].as_str().unwrap(), &[])
        .await;
    assert!(!status.body.contains(SECRET), "{}", status.body);
    let records = rig.proxy.audit().await;
    let execution = records
        .iter()
        .find(|r| r.kind == "approval" && r.status == Some(200))
        .expect("an execution record");
    assert_eq!(execution.credentials, vec!["pay".to_owned()]);
    for record in &records {
        assert!(!serde_json::to_string(record).unwrap().contains(SECRET));
    }
}

/// An execution whose audit record cannot be written stores no outcome: no answer the agent
/// could collect lacks its record. The trail is broken while the upstream is answering (its
/// newest row deleted, which the next append notices as another writer's change); the
/// approval stays `executing`, with nothing stored, for its claim to lapse and the execution
/// to be sent again with the same idempotency key once the trail takes records again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_whose_record_cannot_be_written_stores_no_answer() {
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let rig = Rig::start_on(&approvers(""), support::POLICIES, Some(state.clone())).await;
    // Applied upstream at once, answered 1.5 s later.
    let charge = "ch_late?delay_ms=1500";
    let id = rig.hold(charge, &[21]).await;
    let control = rig.proxy.control();
    control.decide(&id, true, APPROVER, None).await.unwrap();
    let applied = || {
        rig.upstream
            .effects()
            .iter()
            .filter(|e| e.path == "/idem/refunds/ch_late")
            .count()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while applied() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never executed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rig.proxy.shared.audit.flush().await);
    let db = rusqlite::Connection::open(state.join("ostiary.db")).unwrap();
    let last: i64 = db
        .query_row("SELECT max(seq) FROM audit", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        db.execute("DELETE FROM audit WHERE seq = ?1", [last])
            .unwrap(),
        1
    );

    // The answer has come back and the execution's record was refused by the broken trail.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rig.proxy.shared.audit.flush().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the trail never noticed the deleted row"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let shown = control.approval(&id).await.unwrap();
    assert_eq!(shown["status"], "executing", "{shown:#}");
    assert!(shown["result"].is_null(), "{shown:#}");
    assert_eq!(applied(), 1);
    let records: i64 = db
        .query_row(
            "SELECT count(*) FROM audit WHERE record LIKE '%executed (attempt%'",
            [],
            |r| r.get(0),
        )
        .unwrap_or(0);
    assert_eq!(records, 0, "an execution record was written after all");
}
