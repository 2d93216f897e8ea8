//! The audit trail streamed to a SIEM (`[audit.siem]`, docs/audit.md): the real `ostiary
//! serve` posting JSON lines to a receiver stand-in on loopback that can be told to fail.
//!
//! What it proves:
//! - every record arrives, in order, each once, in batches of at most `batch` lines, with
//!   the bearer token from the environment and the sequence range in headers; while the
//!   receiver fails nothing is skipped, `audit siem status` says why, and the stream catches
//!   up once it answers again; the token never reaches the server's log;
//! - after `kill -9` the next start resumes from the durable cursor (nothing delivered twice,
//!   nothing lost); `audit siem replay --from N` sends record N again; a clean stop delivers
//!   the trail's last records on its way out;
//! - OCSF events carry the record's sequence; a token variable that is not set refuses the
//!   start; the CLI refuses replays outside the trail and configs without a stream.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::support::cli::*;

const POLICY: &str = r#"
@id("allow-status")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path like "/status/*" };
"#;

const TOKEN_ENV: &str = "OSTIARY_TEST_SIEM_TOKEN";

/// How long the stream may take to deliver what the test waits for.
const DELIVERED_WITHIN: Duration = Duration::from_secs(30);

/// One POST the receiver got.
#[derive(Debug, Clone)]
struct Post {
    authorization: Option<String>,
    content_type: Option<String>,
    from: i64,
    to: i64,
    lines: Vec<Value>,
    /// What the receiver answered.
    status: u16,
}

/// A SIEM's ingest endpoint on 127.0.0.1: records every POST, answers `status`.
#[derive(Debug)]
struct Receiver {
    url: String,
    status: Arc<AtomicU16>,
    posts: Arc<Mutex<Vec<Post>>>,
}

impl Receiver {
    async fn start(status: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/ingest", listener.local_addr().unwrap());
        let answer = Arc::new(AtomicU16::new(status));
        let posts: Arc<Mutex<Vec<Post>>> = Arc::default();
        let (seen, code) = (posts.clone(), answer.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, code) = (seen.clone(), code.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (seen, code) = (seen.clone(), code.clone());
                        async move {
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned)
                            };
                            let number = |name: &str| {
                                header(name).and_then(|v| v.parse().ok()).unwrap_or(-1)
                            };
                            let (authorization, content_type) =
                                (header("authorization"), header("content-type"));
                            let (from, to) = (number("ostiary-seq-from"), number("ostiary-seq-to"));
                            let body = req.into_body().collect().await?.to_bytes();
                            let lines = String::from_utf8_lossy(&body)
                                .lines()
                                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                                .collect();
                            let status = code.load(Ordering::SeqCst);
                            seen.lock().unwrap().push(Post {
                                authorization,
                                content_type,
                                from,
                                to,
                                lines,
                                status,
                            });
                            let mut answer = Response::new(Full::new(Bytes::new()));
                            *answer.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, hyper::Error>(answer)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            url,
            status: answer,
            posts,
        }
    }

    fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }

    /// The posts it accepted (2xx).
    fn accepted(&self) -> Vec<Post> {
        self.posts()
            .into_iter()
            .filter(|p| (200..300).contains(&p.status))
            .collect()
    }

    /// The highest sequence number accepted so far (0: none).
    fn delivered_through(&self) -> i64 {
        self.accepted().iter().map(|p| p.to).max().unwrap_or(0)
    }

    async fn wait_for(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + DELIVERED_WITHIN;
        while !done(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {DELIVERED_WITHIN:?}; received {:#?}",
                self.posts()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn siem_toml(receiver: &Receiver, extra: &str) -> String {
    format!(
        "[audit.siem]\nurl = \"{}\"\ninterval = \"50ms\"\nretry_max = \"200ms\"\ntimeout = \"2s\"\n{extra}\n",
        receiver.url
    )
}

async fn start(receiver: &Receiver, extra: &str) -> (Upstream, Server) {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let server = Server::start_with(
        &upstream,
        &["api.example.test"],
        POLICY,
        &siem_toml(receiver, extra),
        "info",
    )
    .await;
    (upstream, server)
}

/// Every record in the trail, as `audit query` prints them, once there are at least `n`.
async fn trail(server: &Server, n: usize) -> Vec<Value> {
    audit_query(server, &["--limit", "1000000"], |r| r.len() >= n).await
}

async fn status(server: &Server) -> Value {
    let config = server.config_arg();
    let out = ostiary(&["--config", &config, "audit", "siem", "status", "--json"]).await;
    assert!(out.success(), "{out}");
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Requests through the proxy: `n` allowed and `n` denied.
async fn traffic(server: &Server, upstream: &Upstream, token: &str, n: usize) {
    for i in 0..n {
        let ok = get(server, token, &upstream.url(&format!("/status/200?n={i}"))).await;
        assert_eq!(ok.status.as_u16(), 200, "{ok:?}");
        let denied = get(server, token, &upstream.url("/forbidden")).await;
        assert_eq!(denied.status.as_u16(), 403, "{denied:?}");
    }
}

fn seqs(posts: &[Post]) -> Vec<i64> {
    posts
        .iter()
        .flat_map(|p| p.lines.iter().map(|l| l["seq"].as_i64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_reaches_the_siem_in_order_and_none_is_lost_while_it_is_down() {
    let token = format!("siem-token-{}", std::process::id());
    std::env::set_var(TOKEN_ENV, &token);
    let receiver = Receiver::start(503).await;
    let (upstream, server) = start(
        &receiver,
        &format!("format = \"records\"\nbatch = 4\ntoken_env = \"{TOKEN_ENV}\""),
    )
    .await;
    let (_, agent_token) = session(&server, "siem-agent").await;
    traffic(&server, &upstream, &agent_token, 5).await;

    // Down: tried again and again, nothing counted as delivered, and the status says why.
    receiver
        .wait_for("two failed attempts", |r| r.posts().len() >= 2)
        .await;
    assert!(receiver.accepted().is_empty());
    let down = status(&server).await;
    assert!(
        down["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("503"),
        "{down}"
    );
    assert_eq!(down["delivered_through"], 0, "{down}");
    assert!(down["behind"].as_i64().unwrap() > 0, "{down}");
    // Each attempt is the same batch again, from the first record: nothing skipped.
    for attempt in receiver.posts() {
        assert_eq!(attempt.from, 1, "{attempt:?}");
        assert!((1..=4).contains(&attempt.lines.len()), "{attempt:?}");
    }

    // Up again: it catches up, in order, each record once.
    receiver.answer(200);
    // The session's record and ten requests'.
    let records = trail(&server, 11).await;
    let head = records.len() as i64;
    receiver
        .wait_for("the whole trail", |r| r.delivered_through() >= head)
        .await;
    let accepted = receiver.accepted();
    let mut next = 1;
    for post in &accepted {
        assert_eq!(post.from, next, "a gap or a repeat before {post:?}");
        assert!(post.lines.len() <= 4, "{post:?}");
        let numbers: Vec<i64> = post
            .lines
            .iter()
            .map(|l| l["seq"].as_i64().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (post.from..=post.to).collect::<Vec<_>>(),
            "{post:?}"
        );
        assert_eq!(
            post.authorization.as_deref(),
            Some(format!("Bearer {token}").as_str())
        );
        assert_eq!(post.content_type.as_deref(), Some("application/x-ndjson"));
        // Each line links to the one before it: the chain, unbroken.
        for pair in post.lines.windows(2) {
            assert_eq!(pair[1]["prev"], pair[0]["hash"], "{post:?}");
        }
        next = post.to + 1;
    }
    let sent: Vec<&Value> = accepted
        .iter()
        .flat_map(|p| p.lines.iter().map(|l| &l["record"]))
        .take(records.len())
        .collect();
    let stored: Vec<&Value> = records.iter().collect();
    assert_eq!(sent, stored, "the stream differs from the trail");
    assert!(
        records.iter().any(|r| r["decision"] == "deny")
            && records.iter().any(|r| r["decision"] == "allow")
    );

    let caught_up = status(&server).await;
    assert!(caught_up["last_error"].is_null(), "{caught_up}");
    assert!(
        caught_up["delivered_through"].as_i64().unwrap() >= head,
        "{caught_up}"
    );
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("siem stream: delivery failed"), "{log}");
    assert!(!log.contains(&token), "the SIEM token reached the log");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_resumes_from_the_cursor_and_replay_sends_again() {
    let receiver = Receiver::start(200).await;
    let (upstream, mut server) = start(&receiver, "format = \"records\"\nbatch = 100").await;
    let (_, token) = session(&server, "siem-agent").await;
    traffic(&server, &upstream, &token, 2).await;
    let before = trail(&server, 4).await.len() as i64;
    receiver
        .wait_for("the first records", |r| r.delivered_through() >= before)
        .await;
    let delivered = receiver.delivered_through();

    // Down, more records, and the proxy killed with them undelivered.
    receiver.answer(503);
    traffic(&server, &upstream, &token, 2).await;
    let failures = receiver.posts().len();
    receiver
        .wait_for("a failed attempt", |r| r.posts().len() > failures)
        .await;
    server.child.kill().await.unwrap();
    let accepted_before = receiver.accepted().len();

    // The next start carries on from the cursor: no record twice, none missing.
    receiver.answer(200);
    server.child = spawn_serve(Some(&server.config), None, &server.log, "info");
    let control = server.control_addr;
    server.wait_healthy(control).await.unwrap();
    let head = trail(&server, before as usize + 4).await.len() as i64;
    receiver
        .wait_for("the records from before the kill", |r| {
            r.delivered_through() >= head
        })
        .await;
    let resumed = &receiver.accepted()[accepted_before..];
    assert_eq!(resumed[0].from, delivered + 1, "{resumed:?}");
    assert_eq!(
        seqs(resumed)[..(head - delivered) as usize],
        (delivered + 1..=head).collect::<Vec<_>>()[..]
    );

    // A replay sends record 2 and what follows again. Counted before the command: the
    // stream may deliver the replay before the command has even exited.
    let config = server.config_arg();
    let count = receiver.accepted().len();
    let out = ostiary(&[
        "--config", &config, "audit", "siem", "replay", "--from", "2",
    ])
    .await;
    assert!(out.success(), "{out}");
    receiver
        .wait_for("the replay", |r| {
            r.accepted()[count..].iter().any(|p| p.from == 2)
        })
        .await;
    for bad in ["0", "-3", &(head + 1000).to_string()] {
        let from = format!("--from={bad}");
        let out = ostiary(&["--config", &config, "audit", "siem", "replay", &from]).await;
        assert!(!out.success(), "replay --from {bad}: {out}");
        assert!(
            out.stderr.contains("numbered from 1")
                || out.stderr.contains("the trail ends at record"),
            "{bad}: {out}"
        );
    }

    // A clean stop delivers the trail's last records: the shutdown's signed checkpoint is
    // written after the stream's last round, and only the stop's final delivery sends it.
    traffic(&server, &upstream, &token, 1).await;
    let head = trail(&server, head as usize + 2).await.len() as i64;
    let dir = server.stop().await;
    let config = dir.path().join("ostiary.toml").display().to_string();
    let out = ostiary(&["--config", &config, "audit", "query", "--limit", "1000000"]).await;
    assert!(out.success(), "{out}");
    let last = out.stdout.lines().filter(|l| !l.trim().is_empty()).count() as i64;
    assert!(last > head, "the stop wrote no record");
    assert_eq!(
        receiver.delivered_through(),
        last,
        "the last records were not delivered at stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocsf_events_carry_the_sequence_and_bad_settings_are_refused() {
    let receiver = Receiver::start(200).await;
    let (upstream, server) = start(&receiver, "").await;
    let (_, token) = session(&server, "siem-agent").await;
    traffic(&server, &upstream, &token, 1).await;
    let head = trail(&server, 3).await.len() as i64;
    receiver
        .wait_for("the OCSF events", |r| r.delivered_through() >= head)
        .await;
    let events: Vec<Value> = receiver
        .accepted()
        .into_iter()
        .flat_map(|p| p.lines)
        .collect();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["metadata"]["sequence"], i as i64 + 1, "{event}");
        assert!(event["class_uid"].is_u64(), "{event}");
    }
    assert!(
        events
            .iter()
            .any(|e| e["class_uid"] == 4002 && e["unmapped"]["ostiary"]["decision"] == "deny"),
        "{events:#?}"
    );
    assert!(receiver
        .accepted()
        .iter()
        .all(|p| p.authorization.is_none()));
    let config = std::fs::read_to_string(&server.config).unwrap();
    // Kept: the refused start below uses its policies and state.
    let _kept = server.stop().await;

    // A token variable that is not set: the start is refused, naming it.
    let text = config.replace(
        "[audit.siem]\n",
        "[audit.siem]\ntoken_env = \"OSTIARY_TEST_SIEM_UNSET\"\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let refused_config = dir.path().join("ostiary.toml");
    std::fs::write(&refused_config, text).unwrap();
    let log = dir.path().join("serve.log");
    std::env::remove_var("OSTIARY_TEST_SIEM_UNSET");
    let mut child = spawn_serve(Some(&refused_config), None, &log, "info");
    let status = tokio::time::timeout(SERVER_DEADLINE, child.wait())
        .await
        .expect("serve exits")
        .unwrap();
    assert!(!status.success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("OSTIARY_TEST_SIEM_UNSET, which is not set"),
        "{said}"
    );

    // Without a stream configured, the CLI says so.
    let plain = dir.path().join("plain.toml");
    std::fs::write(
        &plain,
        format!(
            "[state]\ndir = \"{}\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let out = ostiary(&[
        "--config",
        &plain.display().to_string(),
        "audit",
        "siem",
        "status",
    ])
    .await;
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("no [audit.siem]"), "{out}");
}
