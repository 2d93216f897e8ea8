//! Changing policies safely (docs/policies.md), against the real `ostiary serve`: a shadow
//! set evaluated beside the enforced one, replay of the recorded trail against a candidate,
//! and promotion.
//!
//! What it proves:
//! - a shadow set that forbids what the enforced set allows changes nothing for the agent
//!   (every request still succeeds), and each disagreement is an audit record of kind
//!   `shadow` naming both decisions; `ostiary policy shadow report` counts them by policy,
//!   tool and agent;
//! - `ostiary policy replay --candidate <shadow dir>` over the recorded trail predicts
//!   exactly what the shadow set did live: the same requests, by request id, change;
//! - `ostiary policy promote` makes the shadow set the enforced one at once and for good
//!   (the policy directory holds it, `policy versions` lists it); under a stream of requests
//!   during the promotion every request is decided wholly by one set — its record's
//!   `policy_version` says which, and its answer is the one that set gives.

use std::collections::BTreeSet;
use std::time::Duration;

use ostiary_e2e::raw::{auth_line, exchange, Reply};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::support::cli::{audit_query, ostiary, session, Server};

const LIVE: &str = r#"
@id("echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

const SHADOW: &str = r#"
@id("echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };

@id("no-writes")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.method == "POST" };
"#;

async fn request(server: &Server, token: &str, method: &str, url: &str) -> Reply {
    let host = url.split('/').nth(2).unwrap_or_default();
    let request = format!(
        "{method} {url} HTTP/1.1\r\nHost: {host}\r\n{}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}",
        auth_line(token)
    );
    exchange(server.proxy_addr, request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{method} {url} through the proxy: {e}"))
}

async fn cli_json(server: &Server, args: &[&str]) -> Value {
    let config = server.config_arg();
    let mut all = vec!["--config", config.as_str(), "--json"];
    all.extend_from_slice(args);
    let out = ostiary(&all).await;
    assert!(out.success(), "ostiary {args:?}: {out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The loop watchdog is off: the load test repeats one request on purpose.
async fn start() -> (Upstream, Server) {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let server = Server::start_with_files(
        &upstream,
        &["api.example.test"],
        LIVE,
        &[("shadow/test.cedar", SHADOW)],
        "[sessions.watchdog]\nenabled = false\n",
        "info",
    )
    .await;
    (upstream, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_set_is_compared_replay_predicts_it_and_promotion_enforces_it() {
    let (upstream, server) = start().await;
    let (_, token) = session(&server, "writer").await;
    let url = upstream.url("/echo");
    let mut posts = 0;
    for i in 0..12 {
        let method = if i % 3 == 0 { "POST" } else { "GET" };
        let reply = request(&server, &token, method, &url).await;
        assert_eq!(
            reply.status.as_u16(),
            200,
            "{method}: the shadow set enforces nothing: {reply}"
        );
        posts += usize::from(method == "POST");
    }

    // Each disagreement, recorded; nothing else.
    let records = audit_query(&server, &[], |all| {
        all.iter().filter(|r| r["kind"] == "shadow").count() >= posts
    })
    .await;
    let shadow: Vec<&Value> = records.iter().filter(|r| r["kind"] == "shadow").collect();
    assert_eq!(shadow.len(), posts, "{shadow:#?}");
    for r in &shadow {
        assert_eq!(r["decision"], "deny", "{r:#}");
        assert_eq!(r["shadow"]["live"]["decision"], "allow", "{r:#}");
        assert_eq!(
            r["shadow"]["shadow"]["policies"],
            serde_json::json!(["no-writes"]),
            "{r:#}"
        );
        assert_eq!(r["agent"], "writer", "{r:#}");
    }
    let shadowed: BTreeSet<String> = shadow
        .iter()
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    let posted: BTreeSet<String> = records
        .iter()
        .filter(|r| r["kind"] == "http" && r["method"] == "POST")
        .map(|r| r["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(shadowed, posted, "exactly the POSTs disagree");

    let report = cli_json(&server, &["policy", "shadow", "report"]).await;
    assert_eq!(report["disagreements"], posts, "{report:#}");
    assert_eq!(report["by_policy"]["no-writes"], posts, "{report:#}");
    assert_eq!(report["by_agent"]["writer"], posts, "{report:#}");

    // Replay predicts exactly what the shadow set did live.
    let shadow_dir = server.dir.path().join("shadow");
    let shadow_dir = shadow_dir.to_str().unwrap();
    let replay = cli_json(&server, &["policy", "replay", "--candidate", shadow_dir]).await;
    assert_eq!(replay["changed"], posts, "{replay:#}");
    assert!(replay["decided"].as_u64().unwrap() >= 12, "{replay:#}");
    let predicted: BTreeSet<String> = replay["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["request_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(predicted, shadowed, "{replay:#}");
    for e in replay["examples"].as_array().unwrap() {
        assert_eq!(e["old"]["decision"], "allow", "{e:#}");
        assert_eq!(e["new"]["decision"], "deny", "{e:#}");
    }
    // Against the enforced set itself, nothing changes.
    let policies = server.dir.path().join("policies");
    let same = cli_json(
        &server,
        &[
            "policy",
            "replay",
            "--candidate",
            policies.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(same["changed"], 0, "{same:#}");

    // Promoted: enforced at once, on disk, and listed.
    let before = cli_json(&server, &["policy", "versions"]).await;
    let promoted = cli_json(&server, &["policy", "promote"]).await;
    assert_eq!(promoted["status"], "promoted", "{promoted:#}");
    assert_eq!(promoted["replaced"], before["current"], "{promoted:#}");
    let denied = request(&server, &token, "POST", &url).await;
    assert_eq!(denied.status.as_u16(), 403, "{denied}");
    assert_eq!(
        denied.json()["policies"],
        serde_json::json!(["no-writes"]),
        "{denied}"
    );
    assert_eq!(
        request(&server, &token, "GET", &url).await.status.as_u16(),
        200
    );
    assert_eq!(
        std::fs::read_to_string(policies.join("test.cedar")).unwrap(),
        SHADOW,
        "the policy directory holds the promoted set"
    );
    let after = cli_json(&server, &["policy", "versions"]).await;
    assert_eq!(after["current"], promoted["version"], "{after:#}");
    let promotion = audit_query(&server, &[], |all| {
        all.iter().any(|r| {
            r["kind"] == "policy"
                && r["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("shadow set promoted")
        })
    })
    .await;
    assert!(
        promotion.iter().any(|r| r["kind"] == "policy"
            && r["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("shadow set promoted")),
        "the promotion is audited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_under_load_decides_every_request_by_one_whole_set() {
    let (upstream, server) = start().await;
    let (_, token) = session(&server, "writer").await;
    let url = upstream.url("/echo");
    let v1 = cli_json(&server, &["policy", "versions"]).await["current"]
        .as_str()
        .unwrap()
        .to_owned();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..2 {
        let (stop, server_addr, token, url) =
            (stop.clone(), server.proxy_addr, token.clone(), url.clone());
        load.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let host = url.split('/').nth(2).unwrap_or_default();
                let request = format!(
                    "POST {url} HTTP/1.1\r\nHost: {host}\r\n{}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}",
                    auth_line(&token)
                );
                let reply = exchange(server_addr, request.as_bytes()).await.unwrap();
                answers.push(reply.status.as_u16());
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let promoted = cli_json(&server, &["policy", "promote"]).await;
    let v2 = promoted["version"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answers = Vec::new();
    for task in load {
        answers.extend(task.await.unwrap());
    }
    assert!(
        answers.contains(&200) && answers.contains(&403),
        "{answers:?}"
    );
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 403),
        "{answers:?}"
    );
    // Every request's record: the set that decided it, and the answer that set gives.
    let records = audit_query(&server, &[], |all| {
        all.iter()
            .filter(|r| r["kind"] == "http" && r["method"] == "POST")
            .count()
            >= answers.len()
    })
    .await;
    let posts: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] == "http" && r["method"] == "POST")
        .collect();
    assert_eq!(posts.len(), answers.len());
    for r in posts {
        let version = r["policy_version"].as_str().unwrap_or_default();
        match r["decision"].as_str().unwrap() {
            "allow" => assert_eq!(version, v1, "{r:#}"),
            "deny" => {
                assert_eq!(version, v2, "{r:#}");
                assert_eq!(r["policies"], serde_json::json!(["no-writes"]), "{r:#}");
            }
            other => panic!("{other}: {r:#}"),
        }
    }
}
