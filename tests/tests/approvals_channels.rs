//! How approvers are reached and how they answer (DESIGN §10, THREATS "Approvals"), end to
//! end against real stand-ins: an SMTP server that keeps every mail ([`SmtpSink`]) and an
//! HTTP receiver for the Slack incoming webhook ([`SlackReceiver`]). Each test reads what an
//! approver would get, follows the link in it or presses its button (a signed Slack
//! callback), and checks what happened where it happens: the approval's state in the
//! control API, the upstream's count of applied effects, the agent's retry, the audit
//! records and `/metrics`.
//!
//! - email: one multipart mail per approver with the same facts in both parts, HTML escaped;
//!   the link's page, and its POST approving; the agent collects the upstream's answer;
//! - prefetching (GET/HEAD a hundred times) changes nothing;
//! - refused links: replayed, expired, tampered, spliced, another approver's or another
//!   approval's, an approver not on the list;
//! - Slack: the Block Kit message, its link buttons, and signed callbacks (approve, deny)
//!   with bad signatures, stale timestamps, replays and unmapped users refused;
//! - reminders after `ttl`;
//! - notification channels down: retried with backoff, visible on `/metrics` and in the API,
//!   and nothing lost.

#[path = "support/approvals.rs"]
mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ostiary_e2e::slack::{button_urls, button_values, interaction_body, sign, SlackReceiver};
use ostiary_e2e::smtp::{Mail, SmtpSink};
use serde_json::Value;
use support::{refund_body, Rig};

const ALICE: &str = "alice@example.com";
const BOB: &str = "bob@example.com";
/// How long a stand-in is waited on for a notification (a bound, never asserted).
const WAIT: Duration = Duration::from_secs(15);

/// The `[approvals]` body: alice and bob, mail through `sink`, a quick clock, and `extra`.
fn mail_config(sink: &SmtpSink, extra: &str) -> String {
    format!(
        "approvers = [\"{ALICE}\", \"{BOB}\"]\n\
         smtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n\
         {extra}\n",
        sink.url()
    )
}

/// A name for an environment variable no other test uses.
fn unique_env(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "OSTIARY_TEST_{prefix}_{:x}{:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// A plain HTTP client for the control listener (never through the proxy).
fn web() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Status and body of a response.
async fn read(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

async fn get(url: &str) -> (u16, String) {
    read(web().get(url).send().await.unwrap()).await
}

async fn head(url: &str) -> (u16, String) {
    read(web().head(url).send().await.unwrap()).await
}

/// What the review page's form posts.
async fn post_form(url: &str, form: &str) -> (u16, String) {
    read(
        web()
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The review links (`/approve/<token>`) in a mail's plain text.
fn review_links(mail: &Mail) -> Vec<String> {
    mail.links()
        .into_iter()
        .filter(|l| l.contains("/approve/"))
        .collect()
}

/// The one review link of the one mail `to` got (asserting there is exactly one of each).
fn only_link(sink: &SmtpSink, to: &str) -> String {
    let mails = sink.messages_to(to);
    assert_eq!(mails.len(), 1, "mails to {to}: {mails:#?}");
    let links = review_links(&mails[0]);
    assert_eq!(links.len(), 1, "{}", mails[0].text);
    links[0].clone()
}

/// The approval's status as the control API reports it.
async fn status_of(rig: &Rig, id: &str) -> String {
    let a = rig.proxy.control().approval(id).await.unwrap();
    a["status"].as_str().unwrap().to_owned()
}

/// `/metrics`, as text.
async fn metrics(rig: &Rig) -> String {
    let (status, text) = get(&format!("http://{}/metrics", rig.proxy.control_addr)).await;
    assert_eq!(status, 200);
    text
}

/// The value of series `name` whose labels include every `labels` pair; 0 when absent.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let has = |(k, v): &(&str, &str)| {
            series_labels
                .split(',')
                .any(|pair| pair == format!("{k}=\"{v}\""))
        };
        if labels.iter().all(has) {
            return value.parse().unwrap();
        }
    }
    0.0
}

/// Poll `/metrics` until `check` holds (bounded; the failure shows the last text).
async fn wait_metrics(rig: &Rig, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics(rig).await;
        if check(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The token of a review link, decoded; and a link with `bytes` as its token.
fn token_bytes(link: &str) -> Vec<u8> {
    let token = link.rsplit_once("/approve/").unwrap().1;
    URL_SAFE_NO_PAD.decode(token).unwrap()
}

fn with_token(link: &str, bytes: &[u8]) -> String {
    let base = link.rsplit_once("/approve/").unwrap().0;
    format!("{base}/approve/{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// The signed fields of a token (DESIGN of `link.rs`: version, nonce[16], expiry i64,
/// id and approver length-prefixed, then a 32-byte MAC), with one of them replaced: a
/// forger's splice that keeps the original MAC.
fn splice(link: &str, id: Option<&str>, approver: Option<&str>) -> String {
    let bytes = token_bytes(link);
    let (signed, mac) = bytes.split_at(bytes.len() - 32);
    let header = &signed[..1 + 16 + 8];
    let mut rest = &signed[header.len()..];
    let mut field = || {
        let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
        let text = String::from_utf8(rest[2..2 + len].to_vec()).unwrap();
        rest = &rest[2 + len..];
        text
    };
    let (old_id, old_approver) = (field(), field());
    let mut out = header.to_vec();
    for text in [id.unwrap_or(&old_id), approver.unwrap_or(&old_approver)] {
        out.extend_from_slice(&(text.len() as u16).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(mac);
    with_token(link, &out)
}

// ---------------------------------------------------------------------------------------
// Email
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_approver_is_mailed_and_alice_s_link_approves() {
    let sink = SmtpSink::start().await;
    let rig = Rig::start(&mail_config(&sink, "tick = \"50ms\"")).await;
    // Arguments the agent controls, with markup in them.
    let body = serde_json::json!({
        "ids": [4101, 4102],
        "reason": "<script>alert('pwned')</script>",
    })
    .to_string();
    let url = rig.url("/idem/refunds/ch_mail");
    let held = rig.agent.send("POST", &url, Some(body.clone()), &[]).await;
    assert_eq!(held.status, 202, "{held:?}");
    let id = held.json["approval_id"].as_str().unwrap().to_owned();

    let mails = sink.wait_for(2, WAIT).await;
    assert_eq!(mails.len(), 2, "{mails:#?}");
    let destination = format!("https://api.example.test:{}", rig.upstream.port());
    for who in [ALICE, BOB] {
        let to = sink.messages_to(who);
        assert_eq!(to.len(), 1, "one mail for {who}: {mails:#?}");
        let m = &to[0];
        assert_eq!(m.to, vec![who.to_owned()]);
        assert_eq!(m.from, "ostiary@example.com");
        assert!(m.subject.starts_with("Approval needed"), "{}", m.subject);
        assert!(m.subject.contains("pay.refund"), "{}", m.subject);
        assert!(m.raw.contains("multipart/alternative"), "{}", m.raw);
        // The same facts in both parts.
        for fact in [
            "pay.refund",
            destination.as_str(),
            "agent-1",
            "4101",
            "4102",
            "irreversible",
            id.as_str(),
        ] {
            assert!(m.text.contains(fact), "text lacks {fact:?}:\n{}", m.text);
            assert!(m.html.contains(fact), "html lacks {fact:?}:\n{}", m.html);
        }
        // The agent's markup is data: literal in the text, escaped in the HTML.
        assert!(
            m.text.contains("<script>alert('pwned')</script>"),
            "{}",
            m.text
        );
        assert!(!m.html.contains("<script"), "{}", m.html);
        assert!(
            m.html
                .contains("&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"),
            "{}",
            m.html
        );
        // One link, addressed to this approver, in both parts.
        let links = review_links(m);
        assert_eq!(links.len(), 1, "{}", m.text);
        assert!(m.html.contains(&links[0]), "{}", m.html);
    }
    let alice_link = only_link(&sink, ALICE);
    let bob_link = only_link(&sink, BOB);
    assert_ne!(alice_link, bob_link, "each approver has their own link");
    assert!(alice_link.starts_with(&format!("http://{}/approve/", rig.proxy.control_addr)));

    // Alice follows her link: the page shows what will run, and decides nothing.
    let (status, page) = get(&alice_link).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("pay.refund"), "{page}");
    assert!(page.contains(&destination), "{page}");
    assert!(page.contains(ALICE), "{page}");
    assert!(page.contains("id=\"approve\""), "{page}");
    assert!(!page.contains("<script>"), "{page}");
    assert_eq!(status_of(&rig, &id).await, "pending");

    // The form's POST approves.
    let (status, done) = post_form(&alice_link, "decision=approve&reason=checked").await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("Approved"), "{done}");
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(executed["approver"], ALICE);
    assert_eq!(executed["channel"], "page");
    assert_eq!(executed["reason"], "checked");

    // The agent's retry collects the upstream's own answer; applied exactly once.
    let collected = rig
        .agent
        .send("POST", &url, Some(body), &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 201, "{collected:?}");
    assert_eq!(collected.json["applied"], 1);
    assert_eq!((rig.applied("ch_mail"), rig.delivered("ch_mail")), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetching_a_link_changes_nothing_then_its_post_denies() {
    let sink = SmtpSink::start().await;
    let rig = Rig::start(&mail_config(&sink, "tick = \"50ms\"")).await;
    let id = rig.hold("ch_scan", &[7]).await;
    assert_eq!(sink.wait_for(2, WAIT).await.len(), 2);
    let link = only_link(&sink, ALICE);

    // What mail scanners and link previewers do.
    for _ in 0..100 {
        let (status, page) = get(&link).await;
        assert_eq!(status, 200, "{page}");
        assert!(page.contains("id=\"approve\""), "the form is still offered");
        let (status, body) = head(&link).await;
        assert_eq!(status, 200);
        assert!(body.is_empty());
    }
    let still = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(still["status"], "pending", "{still:#}");
    assert!(still["approver"].is_null(), "{still:#}");
    assert_eq!(rig.delivered("ch_scan"), 0);
    let decisions = rig
        .proxy
        .audit()
        .await
        .into_iter()
        .filter(|r| r.kind == "approval" && r.approval.as_deref() == Some(id.as_str()))
        .count();
    assert_eq!(decisions, 0, "no transition was recorded");

    // The link is still good for its one decision.
    let (status, done) = post_form(&link, "decision=deny&reason=not+ours").await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("Denied"), "{done}");
    let denied = rig.wait_status(&id, "denied").await;
    assert_eq!(denied["approver"], ALICE);
    let retry = rig
        .refund("ch_scan", &[7], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_denied");
    assert_eq!(retry.json["approver"], ALICE);
    assert_eq!(rig.delivered("ch_scan"), 0);
}

// ---------------------------------------------------------------------------------------
// Links that must not decide
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_decides_once_and_its_replay_is_refused() {
    let sink = SmtpSink::start().await;
    let rig = Rig::start(&mail_config(&sink, "tick = \"50ms\"")).await;
    let id = rig.hold("ch_replay", &[1]).await;
    sink.wait_for(2, WAIT).await;
    let link = only_link(&sink, ALICE);

    let (status, first) = post_form(&link, "decision=approve").await;
    assert_eq!(status, 200, "{first}");
    rig.wait_status(&id, "executed").await;

    // The very same POST again, and the opposite decision with the same link.
    for form in ["decision=approve", "decision=deny"] {
        let (status, page) = post_form(&link, form).await;
        // A spent link says so before anything else.
        assert_eq!(status, 410, "{page}");
        assert!(page.contains("already used"), "{page}");
    }
    let after = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(after["status"], "executed", "{after:#}");
    assert_eq!(after["approver"], ALICE);
    assert_eq!(after["attempts"], 1);
    // A GET of a used link shows the outcome, without a form.
    let (status, page) = get(&link).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("no longer waiting"), "{page}");
    assert!(!page.contains("id=\"approve\""), "{page}");
    assert_eq!(
        (rig.applied("ch_replay"), rig.delivered("ch_replay")),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_past_its_deadline_is_refused_and_the_approval_expires() {
    let rig = Rig::start(&format!(
        "approvers = [\"{ALICE}\", \"{BOB}\"]\n\
         ttl = \"200ms\"\ndeadline = \"600ms\"\ntick = \"50ms\""
    ))
    .await;
    let id = rig.hold("ch_late", &[1]).await;
    let link = rig.proxy.control().approval_link(&id, ALICE).await.unwrap();
    let expired = rig.wait_status(&id, "expired").await;
    assert!(expired["approver"].is_null(), "{expired:#}");

    let (status, page) = get(&link).await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("expired"), "{page}");
    assert!(!page.contains("id=\"approve\""), "{page}");
    assert_eq!(head(&link).await.0, 403);
    let (status, page) = post_form(&link, "decision=approve").await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("expired"), "{page}");

    let after = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(after["status"], "expired", "{after:#}");
    assert!(after["approver"].is_null(), "{after:#}");
    let retry = rig
        .refund("ch_late", &[1], &[("ostiary-approval", &id)])
        .await;
    assert_eq!(retry.status, 403, "{retry:?}");
    assert_eq!(retry.json["error"], "approval_expired");
    assert_eq!(rig.delivered("ch_late"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_and_spliced_links_are_refused_and_burn_nothing() {
    let sink = SmtpSink::start().await;
    let rig = Rig::start(&mail_config(&sink, "tick = \"50ms\"")).await;
    let a = rig.hold("ch_a", &[1]).await;
    let b = rig.hold("ch_b", &[2]).await;
    assert_eq!(a.len(), b.len(), "ids of one shape");
    sink.wait_for(4, WAIT).await;
    let link_for = |to: &str, id: &str| {
        sink.messages_to(to)
            .iter()
            .filter(|m| m.text.contains(id))
            .flat_map(review_links)
            .next()
            .unwrap_or_else(|| panic!("no mail to {to} about {id}"))
    };
    let alice_a = link_for(ALICE, &a);
    let bob_a = link_for(BOB, &a);
    let alice_b = link_for(ALICE, &b);

    let mut refused = Vec::new();
    // Characters flipped at the start, the middle and the end of the token.
    let token = alice_a.rsplit_once("/approve/").unwrap().1.to_owned();
    for at in [0, token.len() / 2, token.len() - 2, token.len() - 1] {
        let mut t = token.clone().into_bytes();
        t[at] = if t[at] == b'A' { b'B' } else { b'A' };
        let t = String::from_utf8(t).unwrap();
        refused.push((format!("flipped at {at}"), alice_a.replace(&token, &t)));
    }
    // Cut short, and one character longer.
    refused.push(("truncated".into(), alice_a[..alice_a.len() - 4].to_owned()));
    refused.push(("extended".into(), format!("{alice_a}A")));
    // Bob's link turned into alice's: the approver field rewritten under bob's MAC.
    refused.push(("bob as alice".into(), splice(&bob_a, None, Some(ALICE))));
    // Alice's link for A pointed at B under A's MAC.
    refused.push(("A's link at B".into(), splice(&alice_a, Some(&b), None)));
    // B's id with A's nonce and MAC: a whole link for B assembled from A's parts.
    let mut mixed = token_bytes(&alice_b);
    let from_a = token_bytes(&alice_a);
    mixed[1..17].copy_from_slice(&from_a[1..17]);
    let mac_at = mixed.len() - 32;
    mixed[mac_at..].copy_from_slice(&from_a[from_a.len() - 32..]);
    refused.push((
        "B with A's nonce and MAC".into(),
        with_token(&alice_b, &mixed),
    ));
    // A link for an approval that does not exist, signed by no one.
    refused.push((
        "forged".into(),
        splice(&alice_a, Some("apr_000000000000000000000000"), None),
    ));

    for (what, link) in &refused {
        let (status, page) = get(link).await;
        assert_eq!(status, 403, "GET {what}: {page}");
        assert!(!page.contains("id=\"approve\""), "{what}: {page}");
        assert_eq!(head(link).await.0, 403, "HEAD {what}");
        let (status, page) = post_form(link, "decision=approve").await;
        assert_eq!(status, 403, "POST {what}: {page}");
        assert!(page.contains("not valid"), "{what}: {page}");
        for id in [&a, &b] {
            assert_eq!(status_of(&rig, id).await, "pending", "after {what}");
        }
    }

    // The genuine links were not burnt by any of it. A's decides A, and only A.
    let (status, page) = post_form(&alice_a, "decision=approve").await;
    assert_eq!(status, 200, "{page}");
    rig.wait_status(&a, "executed").await;
    assert_eq!(status_of(&rig, &b).await, "pending");
    // Bob's link for A, now that A is decided, cannot decide anything either.
    let (status, page) = post_form(&bob_a, "decision=deny").await;
    assert!(matches!(status, 409 | 410), "{status}: {page}");
    assert_eq!(status_of(&rig, &b).await, "pending");
    // B is decided by its own link, as the approver that link was signed for.
    let bob_b = link_for(BOB, &b);
    let (status, page) = post_form(&bob_b, "decision=deny").await;
    assert_eq!(status, 200, "{page}");
    let denied = rig.wait_status(&b, "denied").await;
    assert_eq!(denied["approver"], BOB, "the link's approver, nobody else");
    assert_eq!(rig.applied("ch_a"), 1);
    assert_eq!(rig.delivered("ch_b"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_link_is_issued_to_someone_not_on_the_list() {
    let rig = Rig::start(&format!("approvers = [\"{ALICE}\", \"{BOB}\"]")).await;
    let id = rig.hold("ch_who", &[1]).await;
    let url = format!("http://{}/v1/approvals/{id}/link", rig.proxy.control_addr);
    for who in ["mallory@example.com", "agent-1", "", "ALICE@example.com"] {
        let response = web()
            .post(&url)
            .bearer_auth(&rig.proxy.admin_token)
            .json(&serde_json::json!({ "approver": who }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 403, "{who:?}: {body}");
        assert_eq!(body["error"], "not_an_approver", "{who:?}: {body}");
        assert!(body.get("url").is_none(), "{body}");
    }
    // Listed approvers do get one, and only with the admin token.
    let ok = web()
        .post(&url)
        .bearer_auth(&rig.proxy.admin_token)
        .json(&serde_json::json!({ "approver": BOB }))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let anonymous = web()
        .post(&url)
        .json(&serde_json::json!({ "approver": BOB }))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(status_of(&rig, &id).await, "pending");
    assert_eq!(rig.delivered("ch_who"), 0);
}

// ---------------------------------------------------------------------------------------
// Slack
// ---------------------------------------------------------------------------------------

/// A rig whose Slack webhook is `receiver` and whose callbacks are signed with `secret`;
/// Slack user U123 is alice.
async fn slack_rig(receiver: &SlackReceiver, secret: &str) -> Rig {
    slack_rig_with(receiver, secret, "").await
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
         tick = \"50ms\"\n{extra}"
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
