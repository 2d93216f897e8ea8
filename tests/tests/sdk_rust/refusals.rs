//! What the SDK refuses or reports as its own errors: a wrong admin token (never shown),
//! listeners that cannot be reached, and every bad input, refused before anything is sent.

use super::*;

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
