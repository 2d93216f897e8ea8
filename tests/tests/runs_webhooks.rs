//! Webhook triggers (`[[trigger]] kind = "webhook"`) against the real `ostiary serve`, with
//! deliveries signed in the test as GitHub and Stripe sign them.
//!
//! What it proves:
//! - a signed delivery answers 202 with the run's id and a status URL that answers, and
//!   starts exactly one run, which succeeds having seen the payload delivered; the same
//!   delivery (same `X-GitHub-Delivery`) sent again starts nothing more: 200, `Ostiary-Duplicate:
//!   true` and the first run's id;
//! - a forged signature (401), a Stripe delivery with a stale timestamp (401), a payload over
//!   the trigger's limit with an honest `Content-Length` and chunked without one (413), a
//!   payload the schema refuses (422 `check_failed`) and an unknown trigger (404) each start
//!   nothing and each leave a `trigger` record with decision `deny` and the error's kind;
//! - `rate = "2/m"` lets two deliveries through and answers the third 429 `limit_exceeded`
//!   with `Retry-After`;
//! - a sandboxed run (profile `default`) started by a webhook carries its payload through the
//!   proxy to an upstream: the payload reached an agent in a sandbox;
//! - on `listen.triggers` deliveries are taken and the control API's other routes are not
//!   there (404);
//! - the payload file a run reads holds the bytes that were delivered and signed.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::runs::*;

/// A GitHub webhook whose run copies its payload into the marks and lists its id.
fn github_trigger(marks: &Marks, name: &str, extra: &str) -> String {
    format!(
        r#"
[[trigger]]
name = "{name}"
kind = "webhook"
agent = "ci-bot"
profile = "none"
command = ["sh", "-c", '''cp "$OSTIARY_TRIGGER_PAYLOAD" "{marks}/$OSTIARY_RUN_ID.json" && echo "$OSTIARY_RUN_ID" >> "{marks}/{name}.runs"''']
signature = {{ scheme = "github", secret = "gh" }}
dedup = {{ header = "X-GitHub-Delivery", window = "1h" }}
{extra}
"#,
        marks = marks.dir().display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_delivery_starts_one_run_that_sees_its_payload_and_repeats_start_nothing() {
    let marks = Marks::new();
    let rig = RunsRig::start(&github_trigger(&marks, "gh-push", "")).await;
    let body =
        br#"{"ref":"refs/heads/main","after":"9f1c0de","repository":{"full_name":"acme/app"}}"#;
    let headers = github_headers(body, "delivery-0001");

    let first = deliver(rig.control(), "gh-push", &headers, body).await;
    assert_eq!(first.status.as_u16(), 202, "{first}");
    assert!(first.header("ostiary-duplicate").is_none(), "{first}");
    let answer = first.json();
    let run_id = answer["run_id"].as_str().unwrap().to_owned();
    assert!(run_id.starts_with("run_"), "{answer}");
    assert_eq!(answer["trigger"], "gh-push", "{answer}");
    assert_eq!(
        answer["status_url"],
        format!("http://{}/v1/runs/{run_id}", rig.control()),
        "{answer}"
    );

    let run = rig.wait_status(&run_id, "succeeded").await;
    assert_eq!(run["kind"], "webhook", "{run:#}");
    assert_eq!(run["attempt"], 1, "{run:#}");
    assert_eq!(run["exit_code"], 0, "{run:#}");
    assert_eq!(
        run["payload_sha256"],
        hex::encode(Sha256::digest(body)),
        "{run:#}"
    );
    // The run saw the payload delivered, at the path it was given.
    let seen = std::fs::read(marks.path(&format!("{run_id}.json"))).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&seen).unwrap(),
        serde_json::from_slice::<Value>(body).unwrap()
    );
    assert_eq!(seen, body, "the payload file differs from the delivery");
    // The status URL answers with the run.
    let path = format!("/v1/runs/{run_id}");
    let status = rig.call("GET", &path, Some(&rig.admin), None).await;
    assert_eq!(status.status.as_u16(), 200, "{status}");
    assert_eq!(status.json()["status"], "succeeded");

    // The same delivery again, twice: nothing more starts, each answer names the first run.
    for _ in 0..2 {
        let again = deliver(rig.control(), "gh-push", &headers, body).await;
        assert_eq!(again.status.as_u16(), 200, "{again}");
        assert_eq!(again.header("ostiary-duplicate"), Some("true"), "{again}");
        assert_eq!(again.json()["run_id"], run_id.as_str(), "{again}");
        assert_eq!(again.json()["duplicate"], true, "{again}");
    }
    // A new delivery (another id) starts a run of its own, which ends; by then a run the
    // repeats had started would have been listed.
    let other = br#"{"ref":"refs/heads/dev"}"#;
    let second = deliver(
        rig.control(),
        "gh-push",
        &github_headers(other, "delivery-0002"),
        other,
    )
    .await;
    assert_eq!(second.status.as_u16(), 202, "{second}");
    let second_id = second.json()["run_id"].as_str().unwrap().to_owned();
    rig.wait_status(&second_id, "succeeded").await;
    let listed = rig.runs("trigger=gh-push").await;
    let ids: Vec<&str> = listed
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second_id.as_str(), run_id.as_str()], "{listed:#?}");
    assert_eq!(marks.lines("gh-push.runs"), [run_id.clone(), second_id]);

    // Each delivery is on record: two runs queued, two duplicates.
    let records = rig
        .trigger_records(|r| r.iter().filter(|r| r["decision"] == "allow").count() >= 4)
        .await;
    let allowed: Vec<&Value> = records
        .iter()
        .filter(|r| r["decision"] == "allow")
        .collect();
    assert_eq!(allowed.len(), 4, "{records:#?}");
    let duplicates = allowed
        .iter()
        .filter(|r| r["run"]["duplicate"] == true && r["run"]["run_id"] == run_id.as_str())
        .count();
    assert_eq!(duplicates, 2, "{records:#?}");
    rig.server.stop().await;
}

/// `(status, error kind)` of a refusal, with its body.
fn refusal(reply: &ostiary_e2e::raw::Reply) -> (u16, String, Value) {
    let body = reply.json();
    (
        reply.status.as_u16(),
        body["error"].as_str().unwrap_or_default().to_owned(),
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_deliveries_start_nothing_and_each_is_audited() {
    let marks = Marks::new();
    let gh = github_trigger(
        &marks,
        "gh-push",
        r#"max_payload_bytes = 2048
schema = { type = "object", required = ["ref"], properties = { ref = { type = "string" } } }"#,
    );
    let triggers = format!(
        r#"{gh}
[[trigger]]
name = "stripe-events"
kind = "webhook"
agent = "billing-bot"
profile = "none"
command = ["sh", "-c", '''echo "$OSTIARY_RUN_ID" >> "{marks}/stripe-events.runs"''']
signature = {{ scheme = "stripe", secret = "stripe", tolerance = "5m" }}
"#,
        marks = marks.dir().display()
    );
    let rig = RunsRig::start(&triggers).await;
    let control = rig.control();
    let body = br#"{"ref":"refs/heads/main"}"#;

    // Forged: signed with another secret.
    let mut forged = github_headers(body, "forged-1");
    forged[0].1 = format!(
        "sha256={}",
        hex::encode(Sha256::digest(b"not the signature"))
    );
    let (status, kind, answer) = refusal(&deliver(control, "gh-push", &forged, body).await);
    assert_eq!(
        (status, kind.as_str()),
        (401, "unauthenticated"),
        "{answer}"
    );
    assert!(
        answer["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("does not match"),
        "{answer}"
    );

    // Stripe: the same header made now is taken (so the header is right), made ten minutes
    // ago it is stale.
    let event = br#"{"id":"evt_1","type":"invoice.paid"}"#;
    let fresh = deliver(
        control,
        "stripe-events",
        &[stripe_header(event, now_secs())],
        event,
    )
    .await;
    assert_eq!(fresh.status.as_u16(), 202, "{fresh}");
    let fresh_id = fresh.json()["run_id"].as_str().unwrap().to_owned();
    let stale_event = br#"{"id":"evt_2","type":"invoice.paid"}"#;
    let stale = deliver(
        control,
        "stripe-events",
        &[stripe_header(stale_event, now_secs() - 600)],
        stale_event,
    )
    .await;
    let (status, kind, answer) = refusal(&stale);
    assert_eq!(
        (status, kind.as_str()),
        (401, "unauthenticated"),
        "{answer}"
    );
    assert!(
        answer["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("beyond the 300 s tolerated"),
        "{answer}"
    );

    // Over the limit, correctly signed: with its length declared, and chunked with none.
    let big = format!(
        r#"{{"ref":"refs/heads/main","pad":"{}"}}"#,
        "x".repeat(4000)
    );
    let big = big.as_bytes();
    let signed = github_headers(big, "big-1");
    let (status, kind, answer) = refusal(&deliver(control, "gh-push", &signed, big).await);
    assert_eq!(
        (status, kind.as_str()),
        (413, "payload_too_large"),
        "{answer}"
    );
    assert_eq!(answer["max"], 2048, "{answer}");
    let signed = github_headers(big, "big-2");
    let (status, kind, answer) = refusal(&deliver_chunked(control, "gh-push", &signed, big).await);
    assert_eq!(
        (status, kind.as_str()),
        (413, "payload_too_large"),
        "{answer}"
    );

    // Signed, but not what the schema wants.
    let wrong = br#"{"branch":"main"}"#;
    let (status, kind, answer) = refusal(
        &deliver(
            control,
            "gh-push",
            &github_headers(wrong, "schema-1"),
            wrong,
        )
        .await,
    );
    assert_eq!((status, kind.as_str()), (422, "check_failed"), "{answer}");

    // No such trigger.
    let (status, kind, answer) = refusal(
        &deliver(
            control,
            "no-such-trigger",
            &github_headers(body, "x-1"),
            body,
        )
        .await,
    );
    assert_eq!((status, kind.as_str()), (404, "not_found"), "{answer}");

    // A good delivery last: once its run has ended, the refused ones would have been listed
    // had they queued anything.
    let good = deliver(control, "gh-push", &github_headers(body, "good-1"), body).await;
    assert_eq!(good.status.as_u16(), 202, "{good}");
    let good_id = good.json()["run_id"].as_str().unwrap().to_owned();
    rig.wait_status(&good_id, "succeeded").await;
    rig.wait_status(&fresh_id, "succeeded").await;
    let mut listed: Vec<String> = rig
        .runs("")
        .await
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = vec![good_id.clone(), fresh_id.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(marks.lines("gh-push.runs"), [good_id]);
    assert_eq!(marks.lines("stripe-events.runs"), [fresh_id]);

    // Each refusal is on record as a denied trigger delivery, with its kind.
    let want = [
        ("unauthenticated", 2),
        ("payload_too_large", 2),
        ("check_failed", 1),
        ("not_found", 1),
    ];
    let count = |records: &[Value], kind: &str| {
        records
            .iter()
            .filter(|r| r["decision"] == "deny" && r["error"] == kind)
            .count()
    };
    let records = rig
        .trigger_records(|r| want.iter().all(|(kind, n)| count(r, kind) >= *n))
        .await;
    for (kind, n) in want {
        assert_eq!(count(&records, kind), n, "{kind}: {records:#?}");
    }
    assert_eq!(
        records.iter().filter(|r| r["decision"] == "deny").count(),
        6,
        "{records:#?}"
    );
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_lets_two_deliveries_through_and_refuses_the_third() {
    let marks = Marks::new();
    let rig = RunsRig::start(&github_trigger(&marks, "gh-rated", r#"rate = "2/m""#)).await;
    let mut ids = Vec::new();
    for n in 1..=2 {
        let body = format!(r#"{{"ref":"refs/heads/b{n}"}}"#);
        let reply = deliver(
            rig.control(),
            "gh-rated",
            &github_headers(body.as_bytes(), &format!("rated-{n}")),
            body.as_bytes(),
        )
        .await;
        assert_eq!(reply.status.as_u16(), 202, "delivery {n}: {reply}");
        ids.push(reply.json()["run_id"].as_str().unwrap().to_owned());
    }
    let body = br#"{"ref":"refs/heads/b3"}"#;
    let third = deliver(
        rig.control(),
        "gh-rated",
        &github_headers(body, "rated-3"),
        body,
    )
    .await;
    let (status, kind, answer) = refusal(&third);
    assert_eq!((status, kind.as_str()), (429, "limit_exceeded"), "{answer}");
    let retry_after: u64 = third
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {third}"))
        .parse()
        .unwrap();
    // One run every 30 s comes back.
    assert!((1..=30).contains(&retry_after), "{third}");

    for id in &ids {
        rig.wait_status(id, "succeeded").await;
    }
    assert_eq!(rig.runs("trigger=gh-rated").await.len(), 2);
    let records = rig
        .trigger_records(|r| r.iter().any(|r| r["error"] == "limit_exceeded"))
        .await;
    let limited: Vec<&Value> = records
        .iter()
        .filter(|r| r["error"] == "limit_exceeded")
        .collect();
    assert_eq!(limited.len(), 1, "{records:#?}");
    assert_eq!(limited[0]["decision"], "deny", "{records:#?}");
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_run_started_by_a_webhook_carries_its_payload_through_the_proxy() {
    crate::support::sandbox::require_sandbox();
    // The command posts its payload file to the upstream with the session's proxy and CA,
    // which it finds in its environment.
    let triggers = r#"
[[trigger]]
name = "gh-sandboxed"
kind = "webhook"
agent = "demo"
profile = "default"
command = ["sh", "-c", '''curl -q -sS -f -o /dev/null -H "Content-Type: application/json" --data-binary @"$OSTIARY_TRIGGER_PAYLOAD" "@UPSTREAM@/echo"''']
signature = { scheme = "github", secret = "gh" }
"#;
    let rig = RunsRig::start_with(
        triggers,
        Options {
            tls: true,
            ..Options::default()
        },
    )
    .await;
    let body = format!(
        r#"{{"ref":"refs/heads/main","nonce":"{}"}}"#,
        unique_token()
    );
    let body = body.as_bytes();
    let reply = deliver(
        rig.control(),
        "gh-sandboxed",
        &github_headers(body, "sandboxed-1"),
        body,
    )
    .await;
    assert_eq!(reply.status.as_u16(), 202, "{reply}");
    let run_id = reply.json()["run_id"].as_str().unwrap().to_owned();
    let run = rig
        .wait_run(&run_id, "the sandboxed run ends", |r| {
            !matches!(r["status"].as_str(), Some("queued" | "running"))
        })
        .await;
    assert_eq!(run["status"], "succeeded", "{run:#}\n{}", rig.log());

    // The upstream got the payload, from the run's session, through the proxy.
    let posts = rig.upstream.seen_path("/echo");
    assert_eq!(posts.len(), 1, "{posts:#?}");
    assert_eq!(posts[0].method, "POST");
    assert_eq!(
        posts[0].body_sha256.as_deref(),
        Some(hex::encode(Sha256::digest(body)).as_str()),
        "the upstream did not get the payload delivered"
    );
    let session = run["session"].as_str().unwrap().to_owned();
    let records = crate::support::cli::audit_query(&rig.server, &["--session", &session], |r| {
        r.iter().any(|r| r["path"] == "/echo")
    })
    .await;
    let echo: Vec<&Value> = records.iter().filter(|r| r["path"] == "/echo").collect();
    assert_eq!(echo.len(), 1, "{records:#?}");
    assert_eq!(echo[0]["decision"], "allow");
    assert_eq!(echo[0]["agent"], "demo");
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_triggers_listener_takes_deliveries_and_nothing_else() {
    let marks = Marks::new();
    let rig = RunsRig::start_with(
        &github_trigger(&marks, "gh-push", ""),
        Options {
            triggers_listener: true,
            ..Options::default()
        },
    )
    .await;
    let listener = rig.triggers_addr.unwrap();
    let body = br#"{"ref":"refs/heads/main"}"#;
    let reply = deliver(
        listener,
        "gh-push",
        &github_headers(body, "listener-1"),
        body,
    )
    .await;
    assert_eq!(reply.status.as_u16(), 202, "{reply}");
    let run_id = reply.json()["run_id"].as_str().unwrap().to_owned();
    rig.wait_status(&run_id, "succeeded").await;
    assert_eq!(marks.lines("gh-push.runs"), std::slice::from_ref(&run_id));

    // A forged delivery is refused there as on the control listener.
    let mut forged = github_headers(body, "listener-2");
    forged[0].1 = format!("sha256={}", "0".repeat(64));
    let refused = deliver(listener, "gh-push", &forged, body).await;
    assert_eq!(refused.status.as_u16(), 401, "{refused}");

    // The control API is not there, admin token or not.
    let admin = format!("Authorization: Bearer {}\r\n", rig.admin);
    for (method, path, body) in [
        ("GET", "/v1/runs", ""),
        ("GET", &*format!("/v1/runs/{run_id}"), ""),
        ("POST", "/v1/runs", r#"{"trigger":"gh-push"}"#),
        ("POST", "/v1/sessions", r#"{"agent":"x"}"#),
        ("GET", "/v1/audit", ""),
        ("GET", "/metrics", ""),
    ] {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {listener}\r\n{admin}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let reply = ostiary_e2e::raw::exchange(listener, request.as_bytes())
            .await
            .unwrap();
        assert_eq!(reply.status.as_u16(), 404, "{method} {path}: {reply}");
    }
    // The same routes answer on the control listener.
    assert_eq!(rig.runs("").await.len(), 1);
    rig.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payload_file_holds_the_bytes_delivered_and_signed() {
    let marks = Marks::new();
    let rig = RunsRig::start(&github_trigger(&marks, "gh-push", "")).await;
    // As senders write them: indented, and an id past what a double holds exactly.
    let body = b"{\n  \"ref\": \"refs/heads/main\",\n  \"id\": 12345678901234567890123,\n  \"size\": 1.50\n}\n";
    let reply = deliver(
        rig.control(),
        "gh-push",
        &github_headers(body, "bytes-1"),
        body,
    )
    .await;
    assert_eq!(reply.status.as_u16(), 202, "{reply}");
    let run_id = reply.json()["run_id"].as_str().unwrap().to_owned();
    let run = rig.wait_status(&run_id, "succeeded").await;
    let seen = std::fs::read(marks.path(&format!("{run_id}.json"))).unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("12345678901234567890123"),
        "the run's payload changed the delivered id 12345678901234567890123: it reads {text:?}"
    );
    assert_eq!(
        hex::encode(Sha256::digest(&seen)),
        run["payload_sha256"].as_str().unwrap(),
        "the run's payload file is not the payload whose digest the run shows: it reads {text:?}"
    );
    rig.server.stop().await;
}
