//! The approval page in a real browser (issue 5, "Headless Chromium"): an approver reads the
//! mail the proxy sent, opens the link in Debian's Chromium (driven by Playwright, see
//! `ostiary_e2e::browser`), reads what will run as the page renders it, and clicks a button
//! whose form the browser POSTs under the page's own CSP. The agent's retry then gets the
//! upstream's answer, or the refusal.

use crate::support::approvals as support;

use std::time::Duration;

use ostiary_e2e::browser::review_in_browser;
use ostiary_e2e::smtp::SmtpSink;
use support::{refund_body, Rig, APPROVER};

const BOB: &str = "bob@example.com";

async fn mail_rig(sink: &SmtpSink) -> Rig {
    Rig::start(&format!(
        "approvers = [\"{APPROVER}\", \"{BOB}\"]\n\
         smtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n\
         tick = \"50ms\"",
        sink.url()
    ))
    .await
}

/// The review link in the one mail `to` received.
async fn mailed_link(sink: &SmtpSink, to: &str) -> String {
    sink.wait_for(2, Duration::from_secs(15)).await;
    let mails = sink.messages_to(to);
    assert_eq!(mails.len(), 1, "{mails:#?}");
    let links: Vec<String> = mails[0]
        .links()
        .into_iter()
        .filter(|l| l.contains("/approve/"))
        .collect();
    assert_eq!(links.len(), 1, "{}", mails[0].text);
    links[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_in_chromium_runs_the_request_and_the_agent_gets_the_answer() {
    let sink = SmtpSink::start().await;
    let rig = mail_rig(&sink).await;
    let id = rig.hold("ch_web", &[8841, 8842]).await;
    let link = mailed_link(&sink, APPROVER).await;

    let visit = review_in_browser(&link, Some("approve")).await.unwrap();
    assert_eq!(visit.http_status, Some(200), "{visit:#?}");
    assert_eq!(visit.tool.as_deref(), Some("pay.refund"), "{visit:#?}");
    assert_eq!(
        visit.destination.as_deref(),
        Some(format!("https://api.example.test:{}", rig.upstream.port()).as_str()),
        "{visit:#?}"
    );
    let args = visit.args.as_deref().unwrap_or_default();
    for shown in ["8841", "8842", "ch_web", "duplicate charge"] {
        assert!(args.contains(shown), "arguments lack {shown:?}: {args}");
    }
    assert_eq!(visit.agent.as_deref(), Some("agent-1"));
    assert_eq!(visit.status.as_deref(), Some("pending"));
    assert!(visit.text.contains(APPROVER), "{}", visit.text);
    assert_eq!(visit.after_click_status, Some(200), "{visit:#?}");
    let after = visit.after_click.as_deref().unwrap();
    assert!(after.contains("Approved"), "{after}");

    // The agent's retry, waiting for the outcome, gets the upstream's own answer.
    let collected = rig
        .refund(
            "ch_web",
            &[8841, 8842],
            &[("ostiary-approval", &id), ("prefer", "wait=10")],
        )
        .await;
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!(collected.json["applied"], 1);
    assert_eq!(collected.json["key"], format!("ostiary-{id}"));
    let shown = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(shown["status"], "executed");
    assert_eq!(shown["approver"], APPROVER);
    assert_eq!(shown["channel"], "page");
    assert_eq!((rig.applied("ch_web"), rig.delivered("ch_web")), (1, 1));
    let seen = rig.upstream.seen_path("/idem/refunds/ch_web");
    assert_eq!(
        seen[0].body_sha256.as_deref(),
        Some(
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                refund_body(&[8841, 8842]).as_bytes()
            ))
            .as_str()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denying_in_chromium_refuses_the_agent() {
    let sink = SmtpSink::start().await;
    let rig = mail_rig(&sink).await;
    let id = rig.hold("ch_web_no", &[17]).await;
    let link = mailed_link(&sink, APPROVER).await;

    let visit = review_in_browser(&link, Some("deny")).await.unwrap();
    assert_eq!(visit.tool.as_deref(), Some("pay.refund"), "{visit:#?}");
    assert_eq!(visit.after_click_status, Some(200), "{visit:#?}");
    assert!(visit.after_click.as_deref().unwrap().contains("Denied"));

    let retry = rig
        .refund(
            "ch_web_no",
            &[17],
            &[("ostiary-approval", &id), ("prefer", "wait=10")],
        )
        .await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_denied");
    assert_eq!(retry.json["approver"], APPROVER);
    assert_eq!(rig.delivered("ch_web_no"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_approval_s_page_has_no_buttons() {
    let sink = SmtpSink::start().await;
    let rig = mail_rig(&sink).await;
    let id = rig.hold("ch_web_done", &[23]).await;
    let alice = mailed_link(&sink, APPROVER).await;
    let bob = mailed_link(&sink, BOB).await;

    // Alice approves (the POST her page's form makes); then bob opens his own, unused link.
    let approved = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(&alice)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("decision=approve")
        .send()
        .await
        .unwrap();
    assert_eq!(approved.status(), 200);
    rig.wait_status(&id, "executed").await;

    let visit = review_in_browser(&bob, None).await.unwrap();
    assert_eq!(visit.http_status, Some(200), "{visit:#?}");
    assert_eq!(visit.tool.as_deref(), Some("pay.refund"));
    assert_eq!(visit.status.as_deref(), Some("executed"));
    assert!(
        visit.text.contains("no longer waiting for a decision"),
        "{}",
        visit.text
    );
    assert!(visit.text.contains(APPROVER), "who decided: {}", visit.text);
    // There is nothing to press: the browser finds neither button.
    for button in ["approve", "deny"] {
        let err = review_in_browser(&bob, Some(button)).await.unwrap_err();
        assert!(err.contains(&format!("no #{button} button")), "{err}");
    }
    assert_eq!(
        (rig.applied("ch_web_done"), rig.delivered("ch_web_done")),
        (1, 1)
    );
}
