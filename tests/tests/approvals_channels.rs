//! How approvers are reached by email and how their links behave (docs/design.md §10, THREATS
//! "Approvals"), end to end against a real SMTP server that keeps every mail
//! ([`ostiary_e2e::smtp::SmtpSink`]). Each test reads what an approver would get, follows
//! the link in it, and checks what happened where it happens: the approval's state in the
//! control API, the upstream's count of applied effects, the agent's retry and the audit.
//!
//! - one multipart mail per approver with the same facts in both parts, HTML escaped; the
//!   link's page, and its POST approving; the agent collects the upstream's answer;
//! - prefetching (GET/HEAD a hundred times) changes nothing;
//! - refused links: replayed, expired, tampered, spliced, another approver's or another
//!   approval's, an approver not on the list.
//!
//! Slack, reminders and failing channels are in `approvals_notify.rs`.

use crate::support::approvals as support;
use crate::support::channels;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use channels::*;
use ostiary_e2e::smtp::SmtpSink;
use serde_json::Value;
use support::Rig;

/// The token of a review link, decoded; and a link with `bytes` as its token.
fn token_bytes(link: &str) -> Vec<u8> {
    let token = link.rsplit_once("/approve/").unwrap().1;
    URL_SAFE_NO_PAD.decode(token).unwrap()
}

fn with_token(link: &str, bytes: &[u8]) -> String {
    let base = link.rsplit_once("/approve/").unwrap().0;
    format!("{base}/approve/{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// The signed fields of a token (as `link.rs` lays them out: version, nonce[16], expiry i64,
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
    // Every refusal (GET, HEAD and POST of each) is on the record, naming no approval and
    // carrying no token.
    let records = rig.proxy.audit().await;
    let on_record: Vec<_> = records
        .iter()
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|why| why.starts_with("a review link refused"))
        })
        .collect();
    assert_eq!(on_record.len(), refused.len() * 3, "{on_record:#?}");
    for record in on_record {
        assert_eq!(
            (record.kind.as_str(), record.decision.as_str()),
            ("approval", "deny"),
            "{record:#?}"
        );
        assert_eq!(record.approval, None, "{record:#?}");
        assert!(!format!("{record:?}").contains(&token), "{record:#?}");
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
