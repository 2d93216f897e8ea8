//! Held requests through the SDK: approved and collected, waited for until a human approves,
//! denied, and waited for too long.

use super::*;

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
