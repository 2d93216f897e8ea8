//! The `check` phase end to end (issue 6): each tier's checks within its latency budget,
//! and what each tier does when the budget runs out — `read` lets the call through
//! (audited as unchecked), `write` refuses it (422), `irreversible` holds it for a human
//! (202). The external check is a real local HTTP server answering in 1 ms, in 300 ms, or
//! never; DLP is shown on buffered tool bodies and on streamed bodies that must be cut
//! before the secret leaves.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw;
use ostiary_e2e::upstream::Upstream;
use serde_json::{json, Value};

const TOOLS: &str = r#"
[[tool]]
name = "t.read"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/idem/read" }

[[tool]]
name = "t.write"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/write/{id}" }
args_schema = { type = "object", properties = { id = { type = "string", pattern = "^[a-z0-9-]+$" }, note = { type = "string", maxLength = 200 } } }

[[tool]]
name = "t.irrev"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/idem/irrev/{id}" }
"#;

/// Every tier is allowed by policy: what happens is the checks' doing.
const POLICIES: &str = r#"
@id("all-tiers")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write", Ostiary::Action::"tier:irreversible"], resource);
@id("plain-http")
permit (principal, action == Ostiary::Action::"http", resource);
"#;

/// The external check: answers `decision` after `delay_ms` (`u64::MAX`: never), and keeps
/// what it was asked.
#[derive(Clone)]
struct Guard {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    decision: Arc<Mutex<&'static str>>,
    asked: Arc<Mutex<Vec<Value>>>,
}

impl Guard {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let guard = Guard {
            addr: listener.local_addr().unwrap(),
            delay_ms: Arc::new(AtomicU64::new(1)),
            decision: Arc::new(Mutex::new("allow")),
            asked: Arc::default(),
        };
        let serving = guard.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let g = serving.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let g = g.clone();
                        async move {
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let asked: Value = serde_json::from_slice(&body).unwrap_or_default();
                            g.asked.lock().unwrap().push(asked.clone());
                            let delay = g.delay_ms.load(Ordering::SeqCst);
                            if delay == u64::MAX {
                                std::future::pending::<()>().await;
                            }
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            let decision = *g.decision.lock().unwrap();
                            let answer = json!({"decision": decision, "reason": format!("guard says {decision}")});
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                answer.to_string(),
                            ))))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        guard
    }

    fn set(&self, delay_ms: u64, decision: &'static str) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        *self.decision.lock().unwrap() = decision;
    }
}

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    guard: Guard,
    client: reqwest::Client,
    token: String,
}

impl Rig {
    async fn start(tiers: &str) -> Self {
        let guard = Guard::start().await;
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            // These tests repeat calls and refusals on purpose, which the loop watchdog
            // (tested in guardrails.rs) would rightly pause.
            extra_toml: format!(
                "{tiers}\n[checks.webhook]\nurl = \"http://{}/check\"\n[sessions.watchdog]\nenabled = false\n",
                guard.addr
            ),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(proxy.proxy_url(&session)).unwrap())
            .add_root_certificate(reqwest::Certificate::from_pem(proxy.ca_pem.as_bytes()).unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Rig {
            upstream,
            proxy,
            guard,
            client,
            token: session.token,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value, Duration) {
        let mut req = self.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            self.upstream.url(path),
        );
        if let Some(body) = body {
            req = req.json(&body);
        }
        let started = Instant::now();
        let response = req.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            started.elapsed(),
        )
    }

    async fn metrics(&self) -> String {
        reqwest::Client::new()
            .get(format!("http://{}/metrics", self.proxy.control_addr))
            .bearer_auth(&self.proxy.admin_token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// Every tier asks the webhook, each with a 100 ms budget and its own `on_budget`.
const WEBHOOK_TIERS: &str = r#"
[tiers.read]
budget = "100ms"
on_budget = "allow"
checks = ["limits", "args_schema", "webhook"]

[tiers.write]
budget = "100ms"
on_budget = "deny"
checks = ["limits", "args_schema", "dlp", "webhook"]

[tiers.irreversible]
budget = "100ms"
on_budget = "escalate"
checks = ["limits", "args_schema", "dlp", "webhook"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_in_time_a_late_one_and_a_silent_one_per_tier() {
    let rig = Rig::start(WEBHOOK_TIERS).await;

    // 1 ms: every tier passes and is forwarded.
    rig.guard.set(1, "allow");
    let (read, _, _) = rig.call("GET", "/idem/read", None).await;
    let (write, _, _) = rig
        .call("POST", "/idem/write/a1", Some(json!({"note": "ok"})))
        .await;
    let (irrev, _, _) = rig.call("POST", "/idem/irrev/a1", Some(json!({}))).await;
    assert_eq!((read, write, irrev), (201, 201, 201));
    let asked = rig.guard.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 3);
    assert_eq!(asked[1]["tool"], "t.write");
    assert_eq!(asked[1]["tier"], "write");
    assert_eq!(asked[1]["args"]["note"], "ok");
    assert_eq!(asked[1]["agent"], "agent-1");

    for (delay, label) in [(300, "late"), (u64::MAX, "silent")] {
        rig.guard.set(delay, "allow");
        let before = rig.upstream.effects().len();
        // read: forwarded anyway, audited as unchecked.
        let (status, body, took) = rig.call("GET", "/idem/read", None).await;
        assert_eq!(status, 201, "{label}: {body}");
        // write: refused, naming the check that did not answer.
        let (status, body, _) = rig
            .call("POST", &format!("/idem/write/{label}"), Some(json!({})))
            .await;
        assert_eq!(status, 422, "{label}: {body}");
        assert_eq!(body["error"], "check_failed");
        assert_eq!(body["check"], "webhook");
        assert!(body["detail"].as_str().unwrap().contains("100ms"), "{body}");
        // irreversible: held for a human.
        let (status, body, _) = rig
            .call("POST", &format!("/idem/irrev/{label}"), Some(json!({})))
            .await;
        assert_eq!(status, 202, "{label}: {body}");
        assert_eq!(body["error"], "approval_pending");
        assert_eq!(
            rig.upstream.effects().len(),
            before + 1,
            "{label}: only the read went through"
        );
        println!("{label} webhook: the read call took {took:?} (budget 100 ms)");
    }
    let held = rig
        .proxy
        .control()
        .approvals(Some("pending"))
        .await
        .unwrap();
    let id = held["approvals"][0]["approval_id"].as_str().unwrap();
    let shown = rig.proxy.control().approval(id).await.unwrap();
    assert!(
        shown["policies"]
            .as_array()
            .unwrap()
            .contains(&json!("check:webhook")),
        "{shown:#}"
    );

    // The audit says which checks ran, how they ended, and that the read went unchecked.
    let records = rig.proxy.audit().await;
    let unchecked: Vec<_> = records
        .iter()
        .filter(|r| r.tool.as_deref() == Some("t.read") && r.unchecked)
        .collect();
    assert_eq!(unchecked.len(), 2, "{records:#?}");
    let webhook = unchecked[0]
        .checks
        .iter()
        .find(|c| c.check == "webhook")
        .unwrap();
    assert_eq!(webhook.outcome, ostiary::check::Outcome::Timeout);
    let names: Vec<_> = unchecked[0]
        .checks
        .iter()
        .map(|c| c.check.as_str())
        .collect();
    assert_eq!(
        names,
        ["limits", "args_schema", "webhook"],
        "cheap checks first"
    );
    let metrics = rig.metrics().await;
    for expected in [
        "ostiary_checks_total{check=\"webhook\",outcome=\"timeout\"} 6",
        "ostiary_check_budget_exceeded_total{tier=\"read\",action=\"allow\"} 2",
        "ostiary_check_budget_exceeded_total{tier=\"write\",action=\"deny\"} 2",
        "ostiary_check_budget_exceeded_total{tier=\"irreversible\",action=\"escalate\"} 2",
        "ostiary_check_seconds_bucket{le=",
    ] {
        assert!(metrics.contains(expected), "{expected} missing:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_s_own_answers_deny_and_escalate() {
    let rig = Rig::start(WEBHOOK_TIERS).await;
    rig.guard.set(1, "deny");
    let (status, body, _) = rig.call("POST", "/idem/write/d1", Some(json!({}))).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["check"], "webhook");
    assert_eq!(body["detail"], "guard says deny");
    rig.guard.set(1, "escalate");
    let (status, body, _) = rig.call("POST", "/idem/write/e1", Some(json!({}))).await;
    assert_eq!(status, 202, "{body}");
    // A plain request cannot wait for a human: asked to, it is refused.
    let (status, body, _) = rig.call("GET", "/status/200", None).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("tool calls"),
        "{body}"
    );
    assert!(rig.upstream.effects().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_checks_fail_with_their_name_and_never_echo_the_value() {
    let rig = Rig::start(
        r#"
[tiers.write]
max_body_bytes = 256
"#,
    )
    .await;
    // args_schema: the full JSON Schema (a pattern Cedar's typing does not know).
    let (status, body, _) = rig
        .call("POST", "/idem/write/UPPER-case", Some(json!({})))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["check"], "args_schema");
    assert!(body["detail"].as_str().unwrap().contains("/id"), "{body}");
    assert!(!body.to_string().contains("UPPER-case"), "{body}");
    // limits: the tier's body size.
    let big = "x".repeat(300);
    let (status, body, _) = rig
        .call("POST", "/idem/write/b1", Some(json!({ "pad": big })))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["check"], "limits");
    // dlp on a tool call's body: the key is named by kind, never shown.
    let key = "AKIAIOSFODNN7EXAMPLF";
    let (status, body, _) = rig
        .call("POST", "/idem/write/k1", Some(json!({ "note": key })))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["check"], "dlp");
    assert!(!body.to_string().contains(key), "{body}");
    assert!(
        rig.upstream.effects().is_empty(),
        "nothing refused was sent"
    );
    let records = rig.proxy.audit().await;
    for r in &records {
        assert!(!serde_json::to_string(r).unwrap().contains(key));
    }
}

/// POST `chunks` as a streamed (chunked) body of a plain request through a tunnel.
async fn stream_post(rig: &Rig, path: &str, chunks: Vec<Bytes>) -> raw::Reply {
    let tls = raw::intercepted(
        &rig.proxy,
        &rig.token,
        "api.example.test",
        rig.upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let frames = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(c)))
            .collect::<Vec<_>>(),
    );
    let req = Request::post(path)
        .header("host", format!("api.example.test:{}", rig.upstream.port()))
        .body(StreamBody::new(frames))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    raw::Reply {
        status,
        headers,
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_is_cut_before_the_secret_leaves() {
    let rig = Rig::start("").await;
    let key = b"ghp_0123456789abcdefghijABCDEFGHIJ012345";
    assert_eq!(key.len(), 40);

    // 4 MiB in 64 KiB chunks, the key 3 MiB in.
    let mut body = vec![b'a'; 4 << 20];
    let at = 3 << 20;
    // As a value in text (`token=<key>\n`): a key glued inside a longer word is not one.
    body[at - 1] = b'=';
    body[at..at + key.len()].copy_from_slice(key);
    body[at + key.len()] = b'\n';
    let chunks: Vec<Bytes> = body.chunks(64 * 1024).map(Bytes::copy_from_slice).collect();
    let reply = stream_post(&rig, "/upload", chunks).await;
    assert_eq!(reply.status.as_u16(), 422, "{reply}");
    let refused = reply.json();
    assert_eq!(refused["check"], "dlp");
    assert!(
        refused["detail"].as_str().unwrap().contains("github"),
        "{refused}"
    );
    let seen = rig.upstream.seen_path("/upload");
    assert_eq!(seen.len(), 1);
    assert!(!seen[0].body_complete, "the upstream request was aborted");
    assert!(
        (seen[0].body_len as usize) <= at,
        "the upstream got {} bytes, the key starts at {at}",
        seen[0].body_len
    );

    // The key split across a chunk boundary at every position: never a byte of it out.
    for split in 1..key.len() {
        let mut body = vec![b'b'; 999];
        body.push(b' ');
        body.extend_from_slice(key);
        body.push(b' ');
        body.extend_from_slice(&[b'c'; 999]);
        let cut = 1000 + split;
        let chunks = vec![
            Bytes::copy_from_slice(&body[..cut]),
            Bytes::copy_from_slice(&body[cut..]),
        ];
        let reply = stream_post(&rig, &format!("/upload?split={split}"), chunks).await;
        assert_eq!(reply.status.as_u16(), 422, "split {split}: {reply}");
        let seen = rig.upstream.seen_path(&format!("/upload?split={split}"));
        let got = seen.first().map_or(0, |s| s.body_len as usize);
        assert!(
            got <= 1000,
            "split {split}: {got} bytes reached the upstream"
        );
    }

    // A clean streamed body goes through whole.
    let clean: Vec<Bytes> = (0..64)
        .map(|_| Bytes::from(vec![b'z'; 64 * 1024]))
        .collect();
    let reply = stream_post(&rig, "/upload?clean", clean).await;
    assert_eq!(reply.status.as_u16(), 200, "{reply}");
    assert_eq!(reply.json()["received"], 4 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_webhook_does_not_slow_another_tier() {
    // Only writes ask the webhook, and it never answers; reads pay for local checks only.
    let rig = Rig::start(
        r#"
[tiers.write]
budget = "250ms"
on_budget = "deny"
checks = ["limits", "args_schema", "webhook"]
"#,
    )
    .await;
    rig.guard.set(u64::MAX, "allow");
    let mut alone = Vec::new();
    for _ in 0..20 {
        let (status, _, took) = rig.call("GET", "/idem/read", None).await;
        assert_eq!(status, 201);
        alone.push(took);
    }
    // Now with writes waiting out their budget at the same time.
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let client = rig.client.clone();
            let url = rig.upstream.url(&format!("/idem/write/w{i}"));
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..4 {
                    let r = client.post(&url).json(&json!({})).send().await.unwrap();
                    statuses.push(r.status().as_u16());
                }
                statuses
            })
        })
        .collect();
    let mut busy = Vec::new();
    for _ in 0..20 {
        let (status, _, took) = rig.call("GET", "/idem/read", None).await;
        assert_eq!(status, 201, "reads are decided as before");
        busy.push(took);
    }
    for w in writers {
        assert!(w.await.unwrap().iter().all(|s| *s == 422));
    }
    alone.sort();
    busy.sort();
    println!(
        "read p50 alone {:?}, with 8 writers waiting on a silent webhook {:?} (write budget 250 ms)",
        alone[10], busy[10]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_dlp_cuts_an_answer_carrying_a_secret() {
    // Opt-in per tier: reads scan what comes back.
    let rig = Rig::start(
        r#"
[tiers.read]
checks = ["limits", "args_schema", "response_dlp"]
"#,
    )
    .await;
    // The reflecting route echoes the request's headers in its JSON answer.
    let key = "AKIAIOSFODNN7EXAMPLF";
    let clean = rig
        .client
        .get(rig.upstream.url("/reflect"))
        .header("x-note", "nothing to see")
        .send()
        .await
        .unwrap();
    assert_eq!(clean.status(), 200);
    assert!(clean.text().await.unwrap().contains("nothing to see"));

    let leaking = rig
        .client
        .get(rig.upstream.url("/reflect"))
        .header("x-note", format!("key {key} here"))
        .send()
        .await;
    // Cut before the chunk carrying the key: a small answer dies with its head (the agent
    // gets no answer at all), a longer one part-way through its body.
    if let Ok(response) = leaking {
        if let Ok(body) = response.bytes().await {
            assert!(
                !String::from_utf8_lossy(&body).contains(key),
                "the key reached the agent"
            );
        }
    }
    let metrics = rig.metrics().await;
    assert!(
        metrics.contains("ostiary_checks_total{check=\"response_dlp\",outcome=\"fail\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_the_broker_holds_never_leaves_in_a_body() {
    const SECRET: &str = "pay_live_CANARY_3e8f1c9a77d2";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets.toml");
    std::fs::write(&file, format!("pay = \"{SECRET}\"\n")).unwrap();
    let rig = Rig::start(&format!(
        r#"
[broker]
backend = "file"
file = "{}"

[[credential]]
name = "pay"
source = {{ file = "pay" }}
hosts = ["api.example.test"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}
"#,
        file.display()
    ))
    .await;
    // A read first: the broker fetches the credential for this session and injects it.
    let (status, _, _) = rig.call("GET", "/idem/read", None).await;
    assert_eq!(status, 201);
    let seen = rig.upstream.seen_path("/idem/read");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    // The value itself in a body (a tool call's, then a streamed one): refused by name.
    let (status, body, _) = rig
        .call("POST", "/idem/write/s1", Some(json!({ "note": SECRET })))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["check"], "dlp");
    assert!(
        body["detail"].as_str().unwrap().contains("credential:pay"),
        "{body}"
    );
    assert!(!body.to_string().contains(SECRET));
    let mut streamed = b"token=".to_vec();
    streamed.extend_from_slice(SECRET.as_bytes());
    let reply = stream_post(&rig, "/upload", vec![Bytes::from(streamed)]).await;
    assert_eq!(reply.status.as_u16(), 422, "{reply}");
    assert!(rig
        .upstream
        .seen_path("/upload")
        .iter()
        .all(|s| !s.body_complete));
    assert_eq!(rig.upstream.effects().len(), 1, "only the read was applied");
}
