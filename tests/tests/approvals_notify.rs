//! How approvers are notified beyond a single mail (docs/design.md §10, THREATS
//! "Approvals"), end to end against a real SMTP server and an HTTP receiver for the Slack
//! incoming webhook ([`SlackReceiver`]):
//!
//! - Slack: the Block Kit message, its link buttons, and signed callbacks (approve, deny)
//!   with bad signatures, stale timestamps, replays and unmapped users refused;
//! - reminders after `ttl`;
//! - notification channels down: retried with backoff, visible on `/metrics` and in the API,
//!   and nothing lost.

use crate::support::approvals as support;
use crate::support::channels;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use channels::*;
use ostiary_e2e::slack::{button_urls, button_values, interaction_body, sign, SlackReceiver};
use ostiary_e2e::smtp::SmtpSink;
use serde_json::Value;
use support::{refund_body, Rig};

/// A rig whose Slack webhook is `receiver` and whose callbacks are signed with `secret`;
/// Slack user U123 is alice; the channel is the approvers' own (`slack_links = "shared"`,
/// opted in: the default posts no approver-bound link, see `approvals_bounds.rs`).
async fn slack_rig(receiver: &SlackReceiver, secret: &str) -> Rig {
    slack_rig_with(receiver, secret, "slack_links = \"shared\"").await
}

async fn slack_rig_with(receiver: &SlackReceiver, secret: &str, extra: &str) -> Rig {
    let webhook_env = unique_env("SLACK_HOOK");
    let secret_env = unique_env("SLACK_SECRET");
    std::env::set_var(&webhook_env, receiver.url());
    std::env::set_var(&secret_env, secret);
    Rig::start(&format!(
        "approvers = [\"{ALICE}\", \"{BOB}\"]\n\
         slack_webhook_env = \"{webhook_env}\"\n\
         slack_signing_secret_env = \"{secret_env}\"\n\
         slack_users = {{ \"U123\" = \"{ALICE}\" }}\n\
         tick = \"50ms\"\ndigest_window = \"0s\"\n{extra}"
    ))
    .await
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// POST a callback as Slack would: the form body, its timestamp and signature headers.
async fn callback(rig: &Rig, body: &str, timestamp: i64, signature: &str) -> (u16, Value) {
    let response = web()
        .post(format!(
            "http://{}/v1/slack/interactions",
            rig.proxy.control_addr
        ))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", timestamp.to_string())
        .header("x-slack-signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_message_names_the_request_and_its_link_buttons_open_the_page() {
    let receiver = SlackReceiver::start().await;
    let rig = slack_rig(&receiver, "s3cret-signing").await;
    let id = rig.hold("ch_slack_msg", &[5, 6]).await;
    let messages = receiver.wait_for(1, WAIT).await;
    assert_eq!(messages.len(), 1, "{messages:#?}");
    let message = &messages[0];
    let all = message.to_string();
    let destination = format!("https://api.example.test:{}", rig.upstream.port());
    for fact in ["pay.refund", destination.as_str(), "agent-1", id.as_str()] {
        assert!(all.contains(fact), "message lacks {fact:?}: {message:#}");
    }
    assert!(message["text"].as_str().unwrap().contains("pay.refund"));
    assert_eq!(
        button_values(message),
        vec![
            ("approve".to_owned(), id.clone()),
            ("deny".to_owned(), id.clone())
        ]
    );
    let urls = button_urls(message);
    assert_eq!(urls.len(), 2, "one review button per approver: {message:#}");
    for url in &urls {
        assert!(
            url.starts_with(&format!("http://{}/approve/", rig.proxy.control_addr)),
            "{url}"
        );
    }
    // Following the first link button: the page, addressed to that approver.
    let (status, page) = get(&urls[0]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("pay.refund"), "{page}");
    assert!(page.contains(&destination), "{page}");
    assert!(page.contains(ALICE), "{page}");
    assert_eq!(status_of(&rig, &id).await, "pending");
    // And it decides, like a mailed link.
    let (status, page) = post_form(&urls[1], "decision=approve").await;
    assert_eq!(status, 200, "{page}");
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(executed["approver"], BOB);
    assert_eq!(rig.applied("ch_slack_msg"), 1);
    assert_eq!(receiver.messages().len(), 1, "one message per round");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_slack_links_only_identity_bound_buttons_are_posted() {
    // A channel is shared: with `slack_links = false` no approver's link is in it, and a
    // decision comes only from a verified callback of a mapped Slack user.
    let receiver = SlackReceiver::start().await;
    let secret = "s3cret-signing";
    let rig = slack_rig_with(&receiver, secret, "slack_links = false").await;
    let id = rig.hold("ch_slack_nolinks", &[7]).await;
    let messages = receiver.wait_for(1, WAIT).await;
    let message = &messages[0];
    assert!(button_urls(message).is_empty(), "{message:#}");
    assert!(!message.to_string().contains("/approve/"), "{message:#}");
    assert_eq!(
        button_values(message),
        vec![
            ("approve".to_owned(), id.clone()),
            ("deny".to_owned(), id.clone())
        ]
    );
    let body = interaction_body("approve", &id, "U123");
    let ts = now_secs();
    let (status, reply) = callback(&rig, &body, ts, &sign(secret, ts, &body)).await;
    assert_eq!(status, 200, "{reply}");
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(executed["approver"], ALICE);
    assert_eq!(executed["channel"], "slack");
    assert_eq!(rig.applied("ch_slack_nolinks"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_callbacks_are_verified_and_decide_once() {
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    let receiver = SlackReceiver::start().await;
    let rig = slack_rig(&receiver, SECRET).await;
    let id = rig.hold("ch_slack", &[9]).await;
    assert_eq!(receiver.wait_for(1, WAIT).await.len(), 1);
    let approve = interaction_body("approve", &id, "U123");

    // Signed with another secret.
    let ts = now_secs();
    let (status, body) = callback(&rig, &approve, ts, &sign("not-the-secret", ts, &approve)).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"], "unauthenticated");
    // Correctly signed, but six minutes old.
    let old = now_secs() - 360;
    let (status, body) = callback(&rig, &approve, old, &sign(SECRET, old, &approve)).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("from now"),
        "{body}"
    );
    // A signature over another body (the deny click) does not carry over.
    let ts = now_secs();
    let deny = interaction_body("deny", &id, "U123");
    let (status, body) = callback(&rig, &approve, ts, &sign(SECRET, ts, &deny)).await;
    assert_eq!(status, 401, "{body}");
    // Genuine, from a Slack user who is not an approver.
    let stranger = interaction_body("approve", &id, "U999");
    let ts = now_secs();
    let (status, body) = callback(&rig, &stranger, ts, &sign(SECRET, ts, &stranger)).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "not_an_approver");
    assert_eq!(status_of(&rig, &id).await, "pending");
    assert_eq!(rig.delivered("ch_slack"), 0);

    // Genuine, from alice: approved and executed once.
    let ts = now_secs();
    let signature = sign(SECRET, ts, &approve);
    let (status, body) = callback(&rig, &approve, ts, &signature).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "approved");
    assert_eq!(body["approval_id"], id.as_str());
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(executed["approver"], ALICE);
    assert_eq!(executed["channel"], "slack");

    // The very same callback again: a replay.
    let (status, body) = callback(&rig, &approve, ts, &signature).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("replay"),
        "{body}"
    );
    let collected = rig
        .refund("ch_slack", &[9], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!((rig.applied("ch_slack"), rig.delivered("ch_slack")), (1, 1));
    let after = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(after["attempts"], 1);

    // Deny through Slack.
    let other = rig.hold("ch_slack_no", &[10]).await;
    let deny = interaction_body("deny", &other, "U123");
    let ts = now_secs();
    let (status, body) = callback(&rig, &deny, ts, &sign(SECRET, ts, &deny)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "denied");
    let retry = rig
        .refund("ch_slack_no", &[10], &[("ostiary-approval", &other)])
        .await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_denied");
    assert_eq!(retry.json["approver"], ALICE);
    assert_eq!(rig.delivered("ch_slack_no"), 0);

    // Each refused callback is on the record (three bad signatures, one replay), without
    // the signature it carried.
    let records = rig.proxy.audit().await;
    let refused: Vec<_> = records
        .iter()
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|why| why.starts_with("a Slack callback refused"))
        })
        .collect();
    assert_eq!(refused.len(), 4, "{refused:#?}");
    for record in refused {
        assert_eq!(
            (record.kind.as_str(), record.decision.as_str()),
            ("approval", "deny"),
            "{record:#?}"
        );
        assert_eq!(record.error.as_deref(), Some("unauthenticated"));
        assert!(!format!("{record:?}").contains(&signature), "{record:#?}");
    }
}

// ---------------------------------------------------------------------------------------
// Time and failures
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvers_are_reminded_while_it_stays_pending() {
    let sink = SmtpSink::start().await;
    let rig = Rig::start(&mail_config(
        &sink,
        "ttl = \"300ms\"\ndeadline = \"30s\"\ntick = \"50ms\"",
    ))
    .await;
    let id = rig.hold("ch_remind", &[3]).await;
    let mails = sink.wait_for(4, WAIT).await;
    assert!(mails.len() >= 4, "{mails:#?}");
    for who in [ALICE, BOB] {
        let to = sink.messages_to(who);
        assert!(to.len() >= 2, "{who}: {to:#?}");
        assert!(
            to[0].subject.starts_with("Approval needed"),
            "{}",
            to[0].subject
        );
        assert!(to[1].subject.starts_with("Reminder"), "{}", to[1].subject);
        assert!(to[1].subject.contains("pay.refund"), "{}", to[1].subject);
        assert!(to[1].text.contains(&id), "{}", to[1].text);
    }
    let a = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(a["status"], "pending", "{a:#}");
    assert!(a["rounds"].as_u64().unwrap() >= 2, "{a:#}");
    let reminded: Vec<_> = rig
        .proxy
        .audit()
        .await
        .into_iter()
        .filter(|r| r.kind == "approval" && r.approval.as_deref() == Some(id.as_str()))
        .filter(|r| r.decision == "escalate")
        .collect();
    assert!(!reminded.is_empty(), "no reminded transition in the audit");
    assert!(
        reminded[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("approvers notified again"),
        "{:?}",
        reminded[0]
    );
    assert!(
        metric(
            &metrics(&rig).await,
            "ostiary_approval_transitions_total",
            &[("transition", "reminded")]
        ) >= 1.0
    );

    // The reminder's link decides as well.
    let reminder = &sink.messages_to(ALICE)[1];
    let link = review_links(reminder).pop().unwrap();
    let (status, page) = post_form(&link, "decision=approve").await;
    assert_eq!(status, 200, "{page}");
    rig.wait_status(&id, "executed").await;
    assert_eq!(rig.applied("ch_remind"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_that_fail_are_retried_shown_and_never_lose_the_approval() {
    let sink = SmtpSink::start().await;
    sink.set_down(true);
    let receiver = SlackReceiver::start().await;
    receiver.fail_next(3);
    let webhook_env = unique_env("SLACK_HOOK");
    std::env::set_var(&webhook_env, receiver.url());
    let rig = Rig::start(&mail_config(
        &sink,
        &format!(
            "slack_webhook_env = \"{webhook_env}\"\n\
             tick = \"50ms\"\nretry_initial = \"100ms\"\nretry_max = \"400ms\""
        ),
    ))
    .await;
    // Held and acknowledged whatever the channels do.
    let id = rig.hold("ch_down", &[8]).await;

    // Failing shows on /metrics ...
    let text = wait_metrics(&rig, "failed mail and a failing gauge", |t| {
        metric(
            t,
            "ostiary_approval_notifications_total",
            &[("channel", "email"), ("outcome", "failed")],
        ) > 0.0
            && metric(t, "ostiary_approval_notifications_failing", &[]) > 0.0
    })
    .await;
    assert_eq!(
        metric(
            &text,
            "ostiary_approval_notifications_total",
            &[("channel", "email"), ("outcome", "sent")]
        ),
        0.0
    );
    // ... and in the approval: not delivered, with the last error.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let a = rig.proxy.control().approval(&id).await.unwrap();
        let emails: Vec<Value> = a["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["channel"] == "email")
            .cloned()
            .collect();
        if emails.len() == 2 && emails.iter().all(|n| n["attempts"].as_u64() >= Some(1)) {
            break emails;
        }
        assert!(tokio::time::Instant::now() < deadline, "{a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for n in &shown {
        assert!(n["sent_ms"].is_null(), "{n}");
        let error = n["last_error"].as_str().unwrap();
        assert!(error.contains("SMTP"), "{n}");
        assert!(error.contains("421"), "the relay's own answer: {n}");
    }
    assert!(sink.refused() >= 2, "the relay was really tried");
    assert!(sink.messages().is_empty());
    assert_eq!(status_of(&rig, &id).await, "pending");

    // Slack failed three times, then went through: one message, after four posts.
    let posted = receiver.wait_for(1, WAIT).await;
    assert_eq!(posted.len(), 1);
    assert_eq!(
        button_values(&posted[0])[0],
        ("approve".to_owned(), id.clone())
    );
    assert_eq!(receiver.attempts(), 4);
    // Counted once the proxy has read the webhook's answer.
    let text = wait_metrics(&rig, "the Slack message counted as sent", |t| {
        metric(
            t,
            "ostiary_approval_notifications_total",
            &[("channel", "slack"), ("outcome", "sent")],
        ) == 1.0
    })
    .await;
    assert_eq!(
        metric(
            &text,
            "ostiary_approval_notifications_total",
            &[("channel", "slack"), ("outcome", "failed")]
        ),
        3.0
    );

    // The relay comes back: both mails arrive, retried, and the gauge clears.
    sink.set_down(false);
    let mails = sink.wait_for(2, WAIT).await;
    assert_eq!(mails.len(), 2, "{mails:#?}");
    assert_eq!(sink.messages_to(ALICE).len(), 1);
    assert_eq!(sink.messages_to(BOB).len(), 1);
    let text = wait_metrics(&rig, "the failing gauge back at 0", |t| {
        metric(t, "ostiary_approval_notifications_failing", &[]) == 0.0
    })
    .await;
    assert_eq!(
        metric(
            &text,
            "ostiary_approval_notifications_total",
            &[("channel", "email"), ("outcome", "sent")]
        ),
        2.0
    );
    let a = rig.proxy.control().approval(&id).await.unwrap();
    for n in a["notifications"].as_array().unwrap() {
        assert!(n["sent_ms"].is_i64(), "{n}");
        assert!(n["last_error"].is_null(), "{n}");
    }

    // Nothing was lost: the retried mail's link decides, and the request runs once.
    let link = only_link(&sink, ALICE);
    let (status, page) = post_form(&link, "decision=approve").await;
    assert_eq!(status, 200, "{page}");
    rig.wait_status(&id, "executed").await;
    let collected = rig
        .refund("ch_down", &[8], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!(rig.applied("ch_down"), 1);
    // The body the upstream got is the one the agent sent.
    let seen = rig.upstream.seen_path("/idem/refunds/ch_down");
    assert_eq!(
        seen[0].body_sha256.as_deref(),
        Some(
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                refund_body(&[8]).as_bytes()
            ))
            .as_str()
        )
    );
}
