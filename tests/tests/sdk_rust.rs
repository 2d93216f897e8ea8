//! The Rust SDK (`ostiary-sdk`, docs/sdk-rust.md) through its public API only, against a real
//! proxy: sessions, child sessions and teardown through the control client; requests through
//! the `reqwest` client a session builds, with every refusal read as its typed error; held
//! requests approved or denied through the control client while the agent waits; the audit
//! trail; and every input the SDK must refuse, each refused before anything is sent.
//!
//! The rig: a loopback HTTPS upstream answering for `api.example.test` and
//! `secure.example.test`, a proxy in front of it with this catalog and these policies:
//!
//! | tool | call | outcome |
//! |---|---|---|
//! | `demo.read` | `GET /idem/read/{id}` | allowed (`read-ok`) |
//! | `demo.write` | `POST /idem/write/{id}`, `title` a string | allowed (`write-ok`); 3 identical calls pause the session |
//! | `demo.delete` | `DELETE /idem/delete/{id}` | held for approval (`irreversible-needs-human`) |
//! | `demo.secret` | `GET /idem/secret/{id}` | denied (`no-secrets`) |
//! | `vault.read` | `GET /idem/vault/{id}` on `secure.example.test` | its credential's file entry is missing: 503 |
//!
//! Plain requests to `api.example.test` are allowed (`plain-http`).

use std::time::{Duration, Instant, SystemTime};

use crate::support::sdk as support;
use ostiary_e2e::pki::TestCa;
use ostiary_sdk::{
    AgentClient, ApprovalQuery, ApprovalStatus, AuditQuery, ControlClient, NewSession, Refusal,
    SdkError, Session, APPROVAL_HEADER,
};
use serde_json::{json, Value};
use support::*;

// ---------------------------------------------------------------------------------------
// The control client: sessions, children, teardown.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_children_are_created_and_torn_down() {
    let rig = Rig::start().await;
    let control = rig.control();
    let root = rig
        .session(NewSession {
            agent: "planner".into(),
            max_calls: Some(10),
            ..Default::default()
        })
        .await;
    assert_eq!((root.agent.as_str(), root.depth), ("planner", 0));
    assert_eq!(root.parent, None);
    assert_eq!(root.limits["max_calls"], 10, "{:?}", root.limits);
    assert!(root.proxy_url.contains(&root.token));
    let shown = format!("{root:?}");
    assert!(
        !shown.contains(&root.token),
        "Debug shows the token: {shown}"
    );

    // A child made with the parent's own token: its agent, depth + 1, a carved budget.
    let child = control
        .create_child(
            &root,
            &NewSession {
                max_calls: Some(4),
                ..Default::default()
            },
        )
        .await
        .expect("child created");
    assert_eq!(child.parent.as_deref(), Some(root.session_id.as_str()));
    assert_eq!((child.agent.as_str(), child.depth), ("planner", 1));
    assert_eq!(child.limits["max_calls"], 4, "{:?}", child.limits);
    // More than the parent has left is a limit, typed as on the data plane.
    let (status, refusal) = api_refusal(
        control
            .create_child(
                &root,
                &NewSession {
                    max_calls: Some(1000),
                    ..Default::default()
                },
            )
            .await,
    );
    assert_eq!(status, 429);
    match refusal {
        Refusal::LimitExceeded(l) => assert_eq!(l.limit(), Some("calls"), "{l}"),
        other => panic!("{other:?}"),
    }
    // An operator's child on the root's behalf (admin token, parent named).
    let operators = rig
        .session(NewSession {
            parent: Some(root.session_id.clone()),
            ..Default::default()
        })
        .await;
    assert_eq!(operators.parent.as_deref(), Some(root.session_id.as_str()));

    let status = control.session_status(&root.session_id).await.unwrap();
    assert_eq!(status.state, "live");
    assert!(!status.is_paused() && status.paused_reason().is_none());
    assert!(status.children.contains(&child.session_id), "{status:?}");
    assert!(
        status.children.contains(&operators.session_id),
        "{status:?}"
    );
    let raw = control.session(&child.session_id).await.unwrap();
    assert_eq!(raw["depth"], 1);

    // The child works until its parent is torn down, with it.
    let client = child.client().unwrap();
    let item = unique("child");
    let ok = client
        .send(client.get(rig.url(&format!("/idem/read/{item}"))))
        .await
        .expect("the child's request");
    assert_eq!(ok.status(), 201);
    control.delete_session(&root.session_id).await.unwrap();
    for gone in [&root, &child, &operators] {
        let (status, refusal) = api_refusal(control.session_status(&gone.session_id).await);
        assert_eq!(status, 404);
        assert!(matches!(refusal, Refusal::NotFound(_)), "{refusal:?}");
    }
    // Through a tunnel the proxy refuses the token at CONNECT...
    let late = refused(
        client
            .send(client.get(rig.url(&format!("/idem/read/{}", unique("late")))))
            .await,
    );
    match &late {
        Refusal::Unauthenticated(p) => assert_eq!(p.status(), Some(407), "{p}"),
        other => panic!("{other:?}"),
    }
    assert!(!late.to_string().contains(&child.token));
    // ...and in plain http with its JSON body.
    let plain = format!("http://{API}:{}/idem/read/plain", rig.upstream.port());
    match refused(client.send(client.get(plain)).await) {
        Refusal::Unauthenticated(p) => {
            assert_eq!((p.status(), p.kind()), (Some(407), "unauthenticated"));
            assert!(p.request_id().is_some(), "{p}");
        }
        other => panic!("{other:?}"),
    }
    // Tearing down what is gone is not an error; a gone parent spawns nothing.
    control.delete_session(&root.session_id).await.unwrap();
    let (status, refusal) = api_refusal(control.create_child(&root, &agent("")).await);
    assert_eq!(status, 401);
    assert!(
        matches!(refusal, Refusal::Unauthenticated(_)),
        "{refusal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_client_is_configured_from_the_environment_or_explicitly() {
    let rig = Rig::start().await;
    let url = format!("http://{}", rig.proxy.control_addr);
    // Only this test touches these variables (each test is its own process under nextest).
    std::env::set_var("OSTIARY_CONTROL_URL", format!("{url}/"));
    std::env::set_var("OSTIARY_ADMIN_TOKEN", &rig.proxy.admin_token);
    let control = ControlClient::from_env().expect("configured from the environment");
    assert_eq!(control.url(), url, "the trailing slash is dropped");
    assert!(control.has_admin_token());
    let session = control.create_session(&agent("from-env")).await.unwrap();
    assert_eq!(session.agent, "from-env");
    // What is given explicitly wins over the environment.
    let explicit = ControlClient::builder()
        .url(format!("http://127.0.0.1:{}", closed_port().await))
        .admin_token("explicit-token-0123")
        .build()
        .unwrap();
    assert!(matches!(
        explicit.create_session(&agent("x")).await,
        Err(SdkError::Transport { .. })
    ));
    // A bad variable is named in the error.
    std::env::set_var("OSTIARY_CONTROL_URL", "ftp://127.0.0.1:21");
    let message = config_error(ControlClient::from_env());
    assert!(message.contains("OSTIARY_CONTROL_URL"), "{message}");
    // Neither variable: the default URL and no admin token.
    std::env::remove_var("OSTIARY_CONTROL_URL");
    std::env::remove_var("OSTIARY_ADMIN_TOKEN");
    let defaults = ControlClient::from_env().unwrap();
    assert_eq!(defaults.url(), "http://127.0.0.1:8081");
    assert!(!defaults.has_admin_token());
}

// ---------------------------------------------------------------------------------------
// The agent's client: allowed, denied, refused at CONNECT.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_request_goes_through_the_proxy_with_its_ca() {
    let rig = Rig::start().await;
    let (session, client) = rig.agent("reader").await;
    let item = unique("read");
    let path = format!("/idem/read/{item}");
    let response = client.send(client.get(rig.url(&path))).await.unwrap();
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["path"], path.as_str());
    assert_eq!(rig.upstream.count(&path), 1);
    // The upstream's own refusal is not Ostiary's: handed back, not raised.
    let own = client
        .send(client.get(rig.url("/status/403")))
        .await
        .unwrap();
    assert_eq!(own.status(), 403);
    assert!(own.headers().get("ostiary-request-id").is_none());

    // The builder's client, raw: through the proxy (its CA trusted, the upstream's not)...
    let raw = session.client_builder().unwrap().build().unwrap();
    let path = format!("/idem/read/{}", unique("raw"));
    let answer = raw.get(rig.url(&path)).send().await.unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(rig.upstream.count(&path), 1);
    // ...so a denial reaches it as the proxy's answer, unread.
    let denied = raw.get(rig.url("/idem/secret/raw")).send().await.unwrap();
    assert_eq!(denied.status(), 403);
    assert!(denied.headers().get("ostiary-request-id").is_some());
    // Wrapped, the same client raises it.
    let wrapped = AgentClient::with_http(&session, raw).unwrap();
    assert_eq!(wrapped.session_id(), session.session_id);
    assert!(matches!(
        refused(wrapped.send(wrapped.get(rig.url("/idem/secret/w"))).await),
        Refusal::Denied(_)
    ));
    // Without the proxy's CA the intercepted TLS is not trusted: the CA is what makes it work.
    let untrusting = ostiary_sdk::reqwest::Client::builder()
        .proxy(ostiary_sdk::reqwest::Proxy::all(session.proxy_url.as_str()).unwrap())
        .build()
        .unwrap();
    assert!(untrusting
        .get(rig.url("/idem/read/no-ca"))
        .send()
        .await
        .is_err());
    let shown = format!("{client:?}");
    assert!(!shown.contains(&session.token), "{shown}");

    // A destination refused outright is refused at CONNECT: no body to read.
    let port_one = format!("https://{API}:1/idem/read/x");
    match client.send(client.get(port_one)).await {
        Err(SdkError::TunnelRefused { host }) => assert_eq!(host, format!("{API}:1")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_names_its_policies_and_is_in_the_audit_trail() {
    let rig = Rig::start().await;
    let (session, client) = rig.agent("snoop").await;
    let path = format!("/idem/secret/{}", unique("s"));
    let refusal = refused(client.send(client.get(rig.url(&path))).await);
    let Refusal::Denied(denied) = &refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(denied.policies(), ["no-secrets"]);
    assert_eq!(
        denied.action(),
        Some(r#"Ostiary::Action::"tool:demo.secret""#)
    );
    assert_eq!(denied.resource(), Some(r#"Ostiary::Tool::"demo.secret""#));
    assert_eq!(
        (denied.problem().status(), denied.problem().kind()),
        (Some(403), "denied")
    );
    let request_id = refusal.request_id().expect("a request id").to_owned();
    assert_eq!(rig.upstream.count(&path), 0, "nothing reached the upstream");

    // The audit record of that refusal carries the id the agent saw.
    let control = rig.control();
    let records = control
        .audit(
            &AuditQuery::new()
                .session(&session.session_id)
                .decision("deny"),
        )
        .await
        .unwrap();
    assert!(
        records
            .iter()
            .any(|r| r["request_id"] == request_id.as_str()),
        "{records:#?}"
    );
    assert!(records
        .iter()
        .all(|r| r["session"] == session.session_id.as_str() && r["decision"] == "deny"));
    let recent = control
        .audit(
            &AuditQuery::new()
                .session(&session.session_id)
                .since_ago(Duration::from_secs(600))
                .limit(1),
        )
        .await
        .unwrap();
    assert_eq!(recent.len(), 1, "{recent:#?}");
    let future = SystemTime::now() + Duration::from_secs(3600);
    let none = control
        .audit(&AuditQuery::new().session(&session.session_id).since(future))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:#?}");
}

// ---------------------------------------------------------------------------------------
// Held requests: approved, denied, waited for too long.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_pending_until_approved_then_collected() {
    let rig = Rig::start().await;
    let (session, client) = rig.agent("cleaner").await;
    let item = unique("del");
    let path = format!("/idem/delete/{item}");
    let refusal = refused(client.send(client.delete(rig.url(&path))).await);
    let Refusal::ApprovalPending(pending) = &refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(pending.problem().status(), Some(202));
    let id = pending.approval_id().unwrap().to_owned();
    assert!(id.starts_with("apr_"), "{id}");
    assert!(pending.status_url().unwrap().ends_with(&id));
    assert_eq!(pending.approval_status(), Some("pending"));
    assert!(pending.expires_at().unwrap().ends_with('Z'));
    assert_eq!(rig.upstream.count(&path), 0, "nothing before approval");

    // The approvers see it in the queue, typed.
    let control = rig.control();
    let listed = control
        .list_approvals(&ApprovalQuery::pending().session(&session.session_id))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].approval_id, id);
    assert_eq!(listed[0].status, ApprovalStatus::Pending);
    assert_eq!(listed[0].tool.as_deref(), Some("demo.delete"));
    assert_eq!(listed[0].agent.as_deref(), Some("cleaner"));
    let whole = control.approval(&id).await.unwrap();
    assert_eq!(whole["policies"], json!(["irreversible-needs-human"]));

    let approved = control
        .approve(&id, APPROVER, Some("checked"))
        .await
        .unwrap();
    assert_eq!(approved.status, ApprovalStatus::Approved);
    assert_eq!(approved.approver.as_deref(), Some(APPROVER));
    // Deciding twice is a conflict; an id nobody holds is not found.
    let (status, refusal) = api_refusal(control.approve(&id, APPROVER, None).await);
    assert_eq!(status, 409);
    assert!(matches!(refusal, Refusal::Conflict(_)), "{refusal:?}");
    let (status, refusal) = api_refusal(control.approval("apr_nobody").await);
    assert_eq!(status, 404);
    assert!(matches!(refusal, Refusal::NotFound(_)), "{refusal:?}");

    // The agent's wait returns the upstream's answer to the request, executed once.
    let outcome = client
        .wait_for_approval(&id, Duration::from_secs(30))
        .await
        .expect("the outcome");
    assert_eq!(outcome.status(), 201);
    assert_eq!(
        outcome.headers()[APPROVAL_HEADER].to_str().unwrap(),
        id.as_str()
    );
    let body: Value = outcome.json().await.unwrap();
    assert_eq!(body["path"], path.as_str());
    assert_eq!(body["key"], format!("ostiary-{id}"));
    // Collected again by re-sending the request with its id: the same stored answer.
    let retry = client
        .send(
            client
                .delete(rig.url(&path))
                .header(APPROVAL_HEADER, id.as_str()),
        )
        .await
        .unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(rig.upstream.count(&path), 1, "executed exactly once");
    let shown = control.approval(&id).await.unwrap();
    assert_eq!(shown["status"], "executed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_waiting_returns_the_answer_once_a_human_approves() {
    let rig = Rig::start().await;
    let (session, client) = rig.agent("waiter").await;
    let path = format!("/idem/delete/{}", unique("wait"));
    let control = rig.control();
    let sid = session.session_id.clone();
    let human = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = control
                .list_approvals(&ApprovalQuery::pending().session(&sid))
                .await
                .unwrap();
            if let Some(first) = held.first() {
                control
                    .approve(&first.approval_id, APPROVER, None)
                    .await
                    .unwrap();
                return first.approval_id.clone();
            }
            assert!(Instant::now() < deadline, "nothing was held");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let response = client
        .send_waiting(client.delete(rig.url(&path)), Duration::from_secs(60))
        .await
        .expect("approved and executed");
    let id = human.await.unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()[APPROVAL_HEADER].to_str().unwrap(),
        id.as_str()
    );
    assert_eq!(rig.upstream.count(&path), 1);
    // A request that is not held comes back as it would from send.
    let plain = client
        .send_waiting(
            client.get(rig.url(&format!("/idem/read/{}", unique("r")))),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(plain.status(), 201);
    assert!(matches!(
        refused(
            client
                .send_waiting(
                    client.get(rig.url("/idem/secret/w")),
                    Duration::from_secs(5)
                )
                .await
        ),
        Refusal::Denied(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_approval_is_approval_denied() {
    let rig = Rig::start().await;
    let (_session, client) = rig.agent("cleaner").await;
    let item = unique("del");
    let path = format!("/idem/delete/{item}");
    let id = hold(&rig, &client, &item).await;
    let denied = rig
        .control()
        .deny(&id, APPROVER, Some("not today"))
        .await
        .unwrap();
    assert_eq!(denied.status, ApprovalStatus::Denied);

    // From the status URL...
    let refusal = refused(client.wait_for_approval(&id, Duration::from_secs(30)).await);
    let Refusal::ApprovalDenied(no) = &refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(no.approval_id(), Some(id.as_str()));
    assert_eq!(no.approver(), Some(APPROVER));
    assert_eq!(no.reason(), Some("not today"));
    assert!(!no.expired());
    // ...and from the proxy's own answer to the collecting retry.
    let refusal = refused(
        client
            .send(
                client
                    .delete(rig.url(&path))
                    .header(APPROVAL_HEADER, id.as_str()),
            )
            .await,
    );
    let Refusal::ApprovalDenied(no) = &refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(
        (no.problem().status(), no.problem().kind()),
        (Some(403), "approval_denied")
    );
    assert_eq!(no.approver(), Some(APPROVER));
    assert_eq!(rig.upstream.count(&path), 0, "never executed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_is_an_approval_timeout() {
    let rig = Rig::start().await;
    let (_session, client) = rig.agent("patient").await;
    let item = unique("del");
    let id = hold(&rig, &client, &item).await;
    let started = Instant::now();
    match client.wait_for_approval(&id, Duration::from_secs(1)).await {
        Err(SdkError::ApprovalTimeout {
            approval_id,
            waited,
        }) => {
            assert_eq!(approval_id, id);
            assert!(waited >= Duration::from_secs(1), "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(1)..Duration::from_secs(20)).contains(&took),
        "{took:?}"
    );
    // The same for a re-sent request: the identical hold joins the same approval.
    match client
        .send_waiting(
            client.delete(rig.url(&format!("/idem/delete/{item}"))),
            Duration::from_secs(1),
        )
        .await
    {
        Err(SdkError::ApprovalTimeout { approval_id, .. }) => assert_eq!(approval_id, id),
        other => panic!("{other:?}"),
    }
    // A zero timeout asks once and says it is still pending.
    assert!(matches!(
        client.wait_for_approval(&id, Duration::ZERO).await,
        Err(SdkError::ApprovalTimeout { .. })
    ));
    // The approval is still there to decide.
    let shown = rig.control().approval(&id).await.unwrap();
    assert_eq!(shown["status"], "pending");
    // Waiting for what this session never held, or for nothing, is refused.
    match refused(
        client
            .wait_for_approval("apr_not_ours", Duration::from_secs(1))
            .await,
    ) {
        Refusal::BadRequest(p) => assert_eq!(p.reason(), Some("approval_unknown"), "{p}"),
        other => panic!("{other:?}"),
    }
    config_error(client.wait_for_approval("", Duration::from_secs(1)).await);
}

// ---------------------------------------------------------------------------------------
// Limits, pauses, checks, credentials.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_and_rates_are_limit_exceeded_with_their_figures() {
    let rig = Rig::start_with("[tiers.read]\nrate_agent = \"3/m\"\n").await;
    let session = rig
        .session(NewSession {
            agent: "budgeted".into(),
            max_calls: Some(2),
            ..Default::default()
        })
        .await;
    let client = session.client().unwrap();
    let write = |id: String| {
        client
            .post(rig.url(&format!("/idem/write/{id}")))
            .json(&json!({ "title": "t" }))
    };
    for _ in 0..2 {
        let ok = client.send(write(unique("b"))).await.unwrap();
        assert_eq!(ok.status(), 201);
    }
    let third = unique("b");
    match refused(client.send(write(third.clone())).await) {
        Refusal::LimitExceeded(l) => {
            assert_eq!(l.problem().status(), Some(429));
            assert_eq!(l.limit(), Some("calls"));
            assert_eq!((l.used(), l.max()), (Some(2.0), Some(2.0)));
            assert_eq!(l.retry_after(), None, "a budget does not refill");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.upstream.count(&format!("/idem/write/{third}")), 0);

    // A rate reopens: it says when.
    let (_, rated) = rig.agent("rated").await;
    for _ in 0..3 {
        let path = format!("/idem/read/{}", unique("r"));
        assert_eq!(
            rated
                .send(rated.get(rig.url(&path)))
                .await
                .unwrap()
                .status(),
            201
        );
    }
    let path = format!("/idem/read/{}", unique("r"));
    match refused(rated.send(rated.get(rig.url(&path))).await) {
        Refusal::LimitExceeded(l) => {
            assert_eq!(l.limit(), Some("rate:agent"));
            let after = l.retry_after().expect("a rate says when it reopens");
            assert!((1..=60).contains(&after), "{after}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_session_is_session_paused_until_resumed() {
    let rig = Rig::start().await;
    let (session, client) = rig.agent("looper").await;
    let same = rig.url(&format!("/idem/write/{}", unique("loop")));
    let write = || {
        client
            .post(same.as_str())
            .json(&json!({ "title": "again" }))
    };
    // [tiers.write] repeat_max = 3: the third identical write trips the watchdog.
    for _ in 0..3 {
        assert_eq!(client.send(write()).await.unwrap().status(), 201);
    }
    let refusal = refused(client.send(write()).await);
    let Refusal::SessionPaused(paused) = &refusal else {
        panic!("{refusal:?}");
    };
    assert_eq!(paused.status(), Some(423));
    let reason = paused.reason().expect("a reason").to_owned();
    assert!(reason.contains("demo.write"), "{reason}");
    // Every request of the session is refused now, not only the repeated one.
    let other = rig.url(&format!("/idem/read/{}", unique("other")));
    assert!(matches!(
        refused(client.send(client.get(other.as_str())).await),
        Refusal::SessionPaused(_)
    ));
    let control = rig.control();
    let status = control.session_status(&session.session_id).await.unwrap();
    assert!(status.is_paused(), "{status:?}");
    assert_eq!(status.paused_reason(), Some(reason.as_str()));
    let letters = control
        .dead_letters(Some(&session.session_id))
        .await
        .unwrap();
    assert_eq!(letters["dead_letters"][0]["kind"], "repeat", "{letters}");
    // A paused parent spawns nothing.
    let (status, refusal) = api_refusal(control.create_child(&session, &agent("")).await);
    assert_eq!(status, 423);
    assert!(matches!(refusal, Refusal::SessionPaused(_)), "{refusal:?}");

    control.resume_session(&session.session_id).await.unwrap();
    let after = client.send(client.get(other.as_str())).await.unwrap();
    assert_eq!(after.status(), 201);
    // Resuming what is not paused is a conflict whose message says why.
    match control.resume_session(&session.session_id).await {
        Err(SdkError::Api {
            status: 409,
            message,
            refusal: Some(refusal),
        }) => {
            assert!(message.contains("not paused"), "{message}");
            assert!(matches!(*refusal, Refusal::Conflict(_)), "{refusal:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_checks_and_missing_credentials_are_typed() {
    let rig = Rig::start().await;
    let (_session, client) = rig.agent("careless").await;
    let path = format!("/idem/write/{}", unique("typed"));
    match refused(
        client
            .send(client.post(rig.url(&path)).json(&json!({ "title": 7 })))
            .await,
    ) {
        Refusal::CheckFailed(c) => {
            assert_eq!(c.problem().status(), Some(422));
            assert_eq!(c.check(), Some("args_schema"));
            assert!(c.detail().unwrap().contains("title"), "{c}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.upstream.count(&path), 0);
    let path = format!("/idem/vault/{}", unique("v"));
    match refused(client.send(client.get(rig.url_on(SECURE, &path))).await) {
        Refusal::CredentialUnavailable(c) => {
            assert_eq!(c.problem().status(), Some(503));
            assert_eq!(c.credential(), Some("vaulted"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.upstream.count(&path), 0);
}

// ---------------------------------------------------------------------------------------
// Bad tokens, unreachable listeners, bad input.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_admin_token_is_unauthenticated_and_never_shown() {
    let rig = Rig::start().await;
    let wrong = "wrong-admin-token-0123456789";
    let control = ControlClient::new(format!("http://{}", rig.proxy.control_addr), wrong);
    let error = control
        .list_approvals(&ApprovalQuery::new())
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(401));
    assert!(
        matches!(error.refusal(), Some(Refusal::Unauthenticated(_))),
        "{error:?}"
    );
    assert!(error.request_id().is_some());
    for shown in [
        error.to_string(),
        format!("{error:?}"),
        format!("{control:?}"),
    ] {
        assert!(!shown.contains(wrong), "{shown}");
    }
    // A session's token is not an admin token either.
    let session = rig.session(agent("not-an-admin")).await;
    let as_session =
        ControlClient::new(format!("http://{}", rig.proxy.control_addr), &session.token);
    assert_eq!(
        as_session.approvals(None).await.unwrap_err().status(),
        Some(401)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_listeners_are_transport_errors_without_the_token() {
    let port = closed_port().await;
    let token = "admin-token-that-must-never-show";
    let control = ControlClient::new(format!("http://127.0.0.1:{port}"), token);
    match control.create_session(&agent("nobody-home")).await {
        Err(SdkError::Transport { url, message }) => {
            assert_eq!(url, format!("http://127.0.0.1:{port}/v1/sessions"));
            assert!(message.contains("ostiary serve"), "{message}");
            assert!(!message.contains(token), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The proxy down: the agent's request fails the same way, without the session token.
    let session = session_at(&format!(
        "http://agent:session-token-never-shown@127.0.0.1:{port}"
    ));
    let client = session.client().unwrap();
    let error = client
        .send(client.get("https://api.example.test/idem/read/x"))
        .await
        .unwrap_err();
    assert!(matches!(error, SdkError::Transport { .. }), "{error:?}");
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains("session-token-never-shown"), "{shown}");
    }
}

/// A session as the control API would answer it, pointing at `proxy_url` (for inputs no
/// real proxy hands out), with a CA of its own.
fn session_at(proxy_url: &str) -> Session {
    serde_json::from_value(json!({
        "session_id": "ses_test", "agent": "a", "tenant": "default",
        "token": "session-token-never-shown", "expires_at": 0,
        "proxy_url": proxy_url, "ca_pem": TestCa::new().ca_pem(),
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_refused_before_anything_is_sent() {
    // Pointed at a closed port: anything sent would be a transport error instead.
    let nowhere = format!("http://127.0.0.1:{}", closed_port().await);
    for (url, leak) in [
        ("ftp://127.0.0.1:21".to_owned(), None),
        ("not a url".to_owned(), None),
        ("http://".to_owned(), None),
        (
            "http://admin:url-secret-123@127.0.0.1:1".to_owned(),
            Some("url-secret-123"),
        ),
    ] {
        let message = config_error(
            ControlClient::builder()
                .url(&url)
                .admin_token("t0k3n")
                .build(),
        );
        // The same URL given to `new` is reported by the first call.
        let lazily = config_error(ControlClient::new(&url, "t0k3n").approvals(None).await);
        assert_eq!(message, lazily);
        if let Some(secret) = leak {
            assert!(!message.contains(secret), "{message}");
        }
    }
    let control = ControlClient::new(&nowhere, "admin-token");
    config_error(control.create_session(&NewSession::default()).await);
    config_error(control.session("").await);
    config_error(control.session_status(" ").await);
    config_error(control.delete_session("").await);
    config_error(control.resume_session("").await);
    config_error(control.terminate_session("").await);
    config_error(control.end_run("", "done", None).await);
    config_error(control.approval("").await);
    config_error(control.approve("", APPROVER, None).await);
    config_error(control.approve("apr_1", "", None).await);
    config_error(control.deny("apr_1", " ", None).await);
    config_error(control.approval_link("apr_1", "").await);
    let orphan = NewSession {
        parent: Some(String::new()),
        ..Default::default()
    };
    config_error(control.create_session(&orphan).await);
    // No admin token: refused for every admin call, before sending.
    let tokenless = ControlClient::new(&nowhere, "");
    assert!(!tokenless.has_admin_token());
    let message = config_error(tokenless.approvals(None).await);
    assert!(message.contains("OSTIARY_ADMIN_TOKEN"), "{message}");
    config_error(tokenless.audit(&AuditQuery::new()).await);
    config_error(tokenless.create_session(&agent("a")).await);
    // The session's own token needs none: it is sent (and finds nobody).
    let parent = session_at("http://agent:t@127.0.0.1:1");
    assert!(matches!(
        tokenless.create_child(&parent, &agent("")).await,
        Err(SdkError::Transport { .. })
    ));
    // A session a client cannot be built from.
    let mut bad_ca = session_at("http://agent:t@127.0.0.1:1");
    bad_ca.ca_pem = "not a certificate".into();
    config_error(bad_ca.client_builder());
    config_error(bad_ca.client());
    for proxy_url in ["::not a url::", "https://agent:t@127.0.0.1:1", "http://"] {
        let session = session_at(proxy_url);
        config_error(session.client());
    }
    let mut tokenless_session = session_at("http://agent:t@127.0.0.1:1");
    tokenless_session.token.clear();
    config_error(tokenless_session.client());
    let client = session_at("http://agent:t@127.0.0.1:1").client().unwrap();
    config_error(client.send(client.get("not a url")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_control_api_refuses_is_typed() {
    let rig = Rig::start().await;
    let control = rig.control();
    let (status, refusal) = api_refusal(
        control
            .create_session(&NewSession {
                agent: "a".into(),
                ttl: Some("forever".into()),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status, 400);
    assert!(matches!(refusal, Refusal::BadRequest(_)), "{refusal:?}");
    let (status, _) = api_refusal(
        control
            .create_session(&NewSession {
                parent: Some("ses_nobody".into()),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status, 404);
    let (status, refusal) = api_refusal(control.terminate_session("ses_nobody").await);
    assert_eq!(status, 404);
    assert!(matches!(refusal, Refusal::NotFound(_)), "{refusal:?}");
    let (status, refusal) = api_refusal(
        control
            .list_approvals(&ApprovalQuery::new().status(ApprovalStatus::Other("sideways".into())))
            .await,
    );
    assert_eq!(status, 400);
    assert!(matches!(refusal, Refusal::BadRequest(_)), "{refusal:?}");
    // An approver the queue does not know may not decide.
    let (_, client) = rig.agent("held").await;
    let id = hold(&rig, &client, &unique("del")).await;
    let (status, refusal) = api_refusal(control.approve(&id, "mallory@example.com", None).await);
    assert_eq!(status, 403);
    match refusal {
        Refusal::Denied(d) => assert_eq!(d.problem().kind(), "not_an_approver"),
        other => panic!("{other:?}"),
    }
    assert!(control
        .approval_link(&id, APPROVER)
        .await
        .unwrap()
        .contains("/approve/"));
}
