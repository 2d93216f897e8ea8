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

// Held requests: approved, denied, waited for too long.
mod held;
// Bad tokens, unreachable listeners, bad input.
mod refusals;
