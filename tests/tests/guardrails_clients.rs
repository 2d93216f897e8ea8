//! Session guardrails (issue 7) seen by real clients, end to end:
//!
//! - a Python agent (`requests`, `tests/clients/loop_agent.py`) stuck in a loop of identical
//!   tool calls is paused by the watchdog at exactly the configured count — the upstream
//!   sees no call past it — with a dead letter and a "resume?" approval for a human, and
//!   the same program works again once resumed and is shut out once terminated;
//! - two agents under one per-agent rate limit: one saturating it gets `429` with a
//!   usable `Retry-After`, the other is never refused (its latency, alone and beside the
//!   flood, is printed for the report, not asserted: 2 shared CPU cores make timings noise);
//! - a child session spawned with its parent's token, against a real OpenBao minting
//!   PostgreSQL users: the child gets its own lease, not its parent's; the parent's
//!   placeholder is refused in the child and forwards nothing; deleting the parent ends both
//!   sessions and revokes both leases.
//!
//! The point of real clients: agents are Python programs and HTTP libraries, and a pause or
//! a limit only helps if what they receive is an answer they can act on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ostiary_e2e::clients::{client_script, python, CmdOutput};
use ostiary_e2e::openbao::{OpenBao, BROKER_POLICY};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::upstream::{Seen, Upstream};
use ostiary_sdk::{SdkError, Session};
use serde_json::{json, Value};

/// One catalogued read tool on the test upstream's echo route.
const TOOLS: &str = r#"
[[tool]]
name = "kb.lookup"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/echo" }
"#;

/// Everything is allowed by policy: what is refused here is the guardrails' doing.
fn policies() -> String {
    format!(
        "{ALLOW_ALL}\n@id(\"reads\")\npermit (principal, action in [Ostiary::Action::\"tier:read\"], resource);\n"
    )
}

/// A reflecting upstream and a proxy with the tool catalog and `extra` config.
struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
}

impl Rig {
    async fn start(extra: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: policies(),
            tools_toml: Some(TOOLS.into()),
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra.into(),
            ..Default::default()
        })
        .await;
        Self { upstream, proxy }
    }
}

/// What one run of `loop_agent.py` reported.
struct Run {
    statuses: Vec<u16>,
    request_ids: Vec<Option<String>>,
    /// The first answer of each distinct status: `{"body", "headers"}`.
    first: Value,
    out: CmdOutput,
}

impl Run {
    fn body(&self, status: u16) -> &Value {
        &self.first[status.to_string()]["body"]
    }
}

/// Run `loop_agent.py` as `session`'s agent process would run: proxy and CA bundle from the
/// session's environment, `count` identical `GET url` calls, `headers` as `NAME:VALUE`.
async fn loop_agent(
    proxy: &TestProxy,
    session: &Session,
    count: usize,
    url: &str,
    headers: &[String],
) -> Run {
    let env = proxy.client_env(session);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let count = count.to_string();
    let mut args = vec![count.as_str(), url, "GET"];
    for h in headers {
        args.extend(["-H", h.as_str()]);
    }
    let out = python(client_script("loop_agent.py"), &args, &env).await;
    assert!(out.success(), "loop_agent.py failed:\n{out}");
    let json = out.json();
    let statuses = json["statuses"]
        .as_array()
        .unwrap_or_else(|| panic!("no statuses:\n{out}"))
        .iter()
        .map(|s| s.as_u64().unwrap() as u16)
        .collect();
    let request_ids = json["request_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().map(str::to_owned))
        .collect();
    Run {
        statuses,
        request_ids,
        first: json["first"].clone(),
        out,
    }
}

/// Poll `check` until it gives a value or `within` passes.
async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_python_agent_is_paused_within_the_configured_n_then_resumed_and_terminated() {
    let rig = Rig::start(
        r#"
[tiers.read]
repeat_max = 10

[approvals]
approvers = ["ops@example.com"]
"#,
    )
    .await;
    let session = rig.proxy.session("looper").await;
    let control = rig.proxy.control();
    let url = rig.upstream.url("/echo?q=same");

    let run = loop_agent(&rig.proxy, &session, 50, &url, &[]).await;
    assert_eq!(run.statuses.len(), 50, "{}", run.out);
    // The watchdog looks at a call once it has been answered, so the 10th identical call
    // (the one that reaches repeat_max) is still forwarded and answered normally; the trip
    // pauses the session for its *next* request. Hence: 10 answers from the upstream, then
    // 423 for every one of the 40 calls after it — not one slips through.
    assert!(
        run.statuses[..10].iter().all(|s| *s == 200),
        "the first 10 calls are answered: {:?}",
        run.statuses
    );
    assert!(
        run.statuses[10..].iter().all(|s| *s == 423),
        "every call after the 10th is refused 423: {:?}",
        run.statuses
    );
    let paused = run.body(423);
    assert_eq!(paused["error"], "session_paused", "{paused}");
    let reason = paused["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("kb.lookup") && reason.contains("10"),
        "the reason names the tool and the count: {paused}"
    );
    assert_eq!(
        rig.upstream.count("/echo"),
        10,
        "the upstream saw exactly repeat_max calls"
    );
    // Each refusal is Ostiary's own answer: it carries a request id and is audited as such.
    let refusal = run.request_ids[10]
        .as_deref()
        .expect("a 423 carries Ostiary-Request-Id");
    let record = rig.proxy.audit_of(refusal).await;
    assert_eq!(
        record.error.as_deref(),
        Some("session_paused"),
        "{record:?}"
    );
    assert_eq!(record.status, Some(423), "{record:?}");

    // The dead letter is written off the request path: wait for it.
    let id = session.session_id.as_str();
    let letter = eventually(Duration::from_secs(5), || async {
        let letters = control.dead_letters(Some(id)).await.ok()?;
        letters["dead_letters"].as_array()?.first().cloned()
    })
    .await
    .expect("a dead letter for the paused session");
    assert_eq!(letter["session"], id, "{letter}");
    assert_eq!(letter["kind"], "repeat", "{letter}");
    assert_eq!(letter["snapshot"]["trip"]["kind"], "repeat", "{letter}");
    // Every forwarded call is in the snapshot (forwarded answers carry no request id of
    // Ostiary's, so they are counted: 10 allowed records of the tool, not one more).
    let recent = letter["snapshot"]["recent_audit"]
        .as_array()
        .expect("recent_audit in the snapshot");
    assert!(
        recent.iter().all(|r| r["session"] == id),
        "another session's records in the snapshot: {recent:?}"
    );
    let forwarded = recent
        .iter()
        .filter(|r| r["tool"] == "kb.lookup" && r["decision"] == "allow" && r["status"] == 200)
        .count();
    assert_eq!(
        forwarded, 10,
        "the looping calls in recent_audit: {recent:?}"
    );

    // A human is asked "resume this session?".
    let approval = eventually(Duration::from_secs(5), || async {
        let pending = control.approvals(Some("pending")).await.ok()?;
        pending["approvals"]
            .as_array()?
            .iter()
            .find(|a| a["tool"] == "ostiary.resume_session" && a["session"] == id)
            .cloned()
    })
    .await;
    assert!(approval.is_some(), "no resume approval in the queue");
    let shown = control.session(id).await.unwrap();
    assert_eq!(shown["state"], "paused", "{shown}");
    assert_eq!(shown["paused"]["kind"], "repeat", "{shown}");

    // Resumed: the same program, started again, gets answers again.
    control.resume_session(id).await.expect("resume");
    let again = control.resume_session(id).await;
    assert!(
        matches!(again, Err(SdkError::Api { status: 409, .. })),
        "resuming a live session is a conflict: {again:?}"
    );
    let run = loop_agent(&rig.proxy, &session, 3, &url, &[]).await;
    assert_eq!(run.statuses, [200, 200, 200], "{}", run.out);
    assert_eq!(rig.upstream.count("/echo"), 13);

    // Terminated: the token is dead, the tunnel is refused at CONNECT.
    control.terminate_session(id).await.expect("terminate");
    let run = loop_agent(&rig.proxy, &session, 1, &url, &[]).await;
    assert_eq!(run.statuses, [407], "{}", run.out);
    assert_eq!(rig.upstream.count("/echo"), 13, "nothing after terminate");
}

/// One call's outcome in the rate test.
struct Outcome {
    status: u16,
    retry_after: Option<String>,
    body: Value,
    took: Duration,
}

async fn call(client: &reqwest::Client, url: &str) -> Outcome {
    let started = Instant::now();
    let response = client.get(url).send().await.expect("the proxy answers");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = response.text().await.unwrap_or_default();
    Outcome {
        status,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        took: started.elapsed(),
    }
}

fn client_for(proxy: &TestProxy, session: &Session) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy.proxy_url(session)).unwrap())
        .add_root_certificate(reqwest::Certificate::from_pem(proxy.ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// B's 100 calls, paced under its own 20/s (one every 60 ms) so that any 429 it gets could
/// only come from A's flood leaking into B's limit.
async fn paced_calls(client: &reqwest::Client, url: &str) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(100);
    let mut tick = tokio::time::interval(Duration::from_millis(60));
    for _ in 0..100 {
        tick.tick().await;
        out.push(call(client, url).await);
    }
    out
}

fn percentile(outcomes: &[Outcome], p: f64) -> Duration {
    let mut took: Vec<Duration> = outcomes.iter().map(|o| o.took).collect();
    took.sort();
    let i = ((took.len() as f64 * p).ceil() as usize).clamp(1, took.len()) - 1;
    took[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_saturating_its_rate_limit_does_not_slow_another() {
    let rig = Rig::start(
        r#"
[tiers.read]
rate_agent = "20/s"
repeat_max = 0
"#,
    )
    .await;
    let a = rig.proxy.session("agent-a").await;
    let b = rig.proxy.session("agent-b").await;
    let url = rig.upstream.url("/echo?q=same");
    let client_b = client_for(&rig.proxy, &b);

    let alone = paced_calls(&client_b, &url).await;

    // A: 4 concurrent tasks, each at least 200 calls and on until B is done.
    let done = Arc::new(AtomicBool::new(false));
    let client_a = client_for(&rig.proxy, &a);
    let started = Instant::now();
    let hammer: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, done) = (client_a.clone(), url.clone(), done.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                while out.len() < 200 || !done.load(Ordering::SeqCst) {
                    out.push(call(&client, &url).await);
                }
                out
            })
        })
        .collect();
    // Let A use up its burst first, so B runs beside a limit that is already closed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let beside = paced_calls(&client_b, &url).await;
    done.store(true, Ordering::SeqCst);
    let mut flood = Vec::new();
    for task in hammer {
        flood.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();

    let refused: Vec<&Outcome> = flood.iter().filter(|o| o.status == 429).collect();
    let admitted = flood.iter().filter(|o| o.status == 200).count();
    assert_eq!(
        admitted + refused.len(),
        flood.len(),
        "A got only 200 or 429: {:?}",
        flood
            .iter()
            .filter(|o| o.status != 200 && o.status != 429)
            .map(|o| (o.status, &o.body))
            .next()
    );
    // GCRA at 20/s with a burst of 20: what A gets through is bounded by the elapsed time.
    let bound = 20 + (20.0 * elapsed.as_secs_f64()).ceil() as usize + 2;
    assert!(
        admitted <= bound,
        "A got {admitted} calls through in {elapsed:?} (at most {bound} at 20/s)"
    );
    assert!(
        refused.len() >= flood.len() / 2,
        "A hammered {} times but was refused only {}",
        flood.len(),
        refused.len()
    );
    for o in &refused {
        assert_eq!(o.body["error"], "limit_exceeded", "{}", o.body);
        assert_eq!(o.body["limit"], "rate:agent", "{}", o.body);
        let header: u64 = o
            .retry_after
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a 429 without a numeric Retry-After: {}", o.body));
        assert!(header >= 1, "Retry-After {header}");
        assert_eq!(o.body["retry_after"], json!(header), "{}", o.body);
    }

    for (label, run) in [("alone", &alone), ("beside A", &beside)] {
        let limited: Vec<&Value> = run
            .iter()
            .filter(|o| o.status != 200)
            .map(|o| &o.body)
            .collect();
        assert!(limited.is_empty(), "B ({label}) was refused: {:?}", limited);
    }
    println!(
        "rate isolation: A made {} calls in {elapsed:?}: {admitted} admitted, {} refused 429",
        flood.len(),
        refused.len()
    );
    println!(
        "B latency alone:    p50 {:?}, p99 {:?}",
        percentile(&alone, 0.50),
        percentile(&alone, 0.99)
    );
    println!(
        "B latency beside A: p50 {:?}, p99 {:?}",
        percentile(&beside, 0.50),
        percentile(&beside, 0.99)
    );
}

const DB_HOST: &str = "db.example.test";
const TOKEN_VAR: &str = "OSTIARY_E2E_VAULT_TOKEN";
const PLACEHOLDER_VAR: &str = "REPORTS_DB_TOKEN";

/// The user and password the upstream received in a Basic `Authorization`.
fn basic_pair(seen: &Seen) -> (String, String) {
    let value = seen.header("authorization").expect("Authorization sent");
    let encoded = value.strip_prefix("Basic ").expect("Basic credentials");
    let pair = String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap();
    let (user, password) = pair.split_once(':').expect("user:password");
    (user.to_owned(), password.to_owned())
}

async fn pg_login(user: &str, password: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port=5432 dbname=test user={user} password={password}"),
        tokio_postgres::NoTls,
    )
    .await?;
    let task = tokio::spawn(connection);
    client.simple_query("SELECT 1").await?;
    drop(client);
    let _ = task.await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_session_never_gets_its_parents_credential() -> Result<()> {
    let bao = OpenBao::start().await?;
    let role = format!("kids{}", std::process::id());
    bao.enable_database_postgres(&role).await?;
    let token = bao.token_with_policy(BROKER_POLICY, "1h").await?;
    // Each nextest test is its own process: the variable is this test's alone.
    std::env::set_var(TOKEN_VAR, &token);
    let ca = TestCa::default();
    let upstream = Upstream::builder().names(&[DB_HOST]).ca(&ca).start().await;
    let proxy = TestProxy::start(ProxySpec {
        names: vec![DB_HOST.into()],
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        extra_toml: format!(
            r#"
[broker]
backend = "vault"
reap_interval = "200ms"
[broker.vault]
addr = "{addr}"
auth = {{ token_env = "{TOKEN_VAR}" }}

[[credential]]
name = "reports-db"
source = {{ vault_database = {{ role = "{role}" }} }}
hosts = ["{DB_HOST}"]
inject = {{ basic = {{}} }}
"#,
            addr = bao.addr()
        ),
        ..Default::default()
    })
    .await;
    let url = upstream.url("/echo");
    // The agent's SDK sends its API key from the environment; the proxy swaps in the secret.
    let with_key = |placeholder: &str| vec![format!("Authorization:Bearer {placeholder}")];
    // The leases named by a session's forwarded requests (answers from the upstream carry
    // no request id of Ostiary's, so they are found by session).
    let leases_of = |session: &Session| {
        let (proxy, id) = (&proxy, session.session_id.clone());
        async move {
            proxy
                .audit()
                .await
                .into_iter()
                .filter(|r| r.kind == "http" && r.session.as_deref() == Some(id.as_str()))
                .flat_map(|r| r.leases)
                .collect::<Vec<_>>()
        }
    };

    let parent = proxy.session("planner").await;
    let parent_key = parent.placeholders[PLACEHOLDER_VAR].clone();
    assert_eq!(parent_key, "ostiary:reports-db");
    let run = loop_agent(&proxy, &parent, 1, &url, &with_key(&parent_key)).await;
    assert_eq!(run.statuses, [200], "{}", run.out);
    let parent_lease = leases_of(&parent).await;
    assert!(
        parent_lease.len() == 1 && parent_lease[0].starts_with("database/creds/"),
        "{parent_lease:?}"
    );
    let (parent_user, parent_password) = basic_pair(&upstream.seen()[0]);

    // The parent spawns a child with its own token, as an agent framework would (the child
    // runs as the parent's agent: naming no agent needs no spawn permit).
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/sessions", proxy.control_addr))
        .bearer_auth(&parent.token)
        .json(&json!({}))
        .send()
        .await?;
    assert_eq!(answer.status().as_u16(), 201);
    let created: Value = answer.json().await?;
    assert_eq!(created["parent"], parent.session_id.as_str(), "{created}");
    assert_eq!(created["depth"], 1, "{created}");
    let child: Session = serde_json::from_value(created.clone())?;
    let child_key = child.placeholders[PLACEHOLDER_VAR].clone();
    assert_eq!(
        child_key,
        format!("ostiary:reports-db@{}", child.session_id),
        "{created}"
    );

    // The child's own placeholder: a credential of its own, minted for it.
    let run = loop_agent(&proxy, &child, 1, &url, &with_key(&child_key)).await;
    assert_eq!(run.statuses, [200], "{}", run.out);
    let child_lease = leases_of(&child).await;
    assert!(
        child_lease.len() == 1 && child_lease[0].starts_with("database/creds/"),
        "{child_lease:?}"
    );
    assert_ne!(
        child_lease, parent_lease,
        "the child got its parent's lease"
    );
    let (child_user, child_password) = basic_pair(&upstream.seen()[1]);
    assert_ne!(child_user, parent_user, "the child got its parent's user");
    pg_login(&parent_user, &parent_password)
        .await
        .context("the parent's user logs in")?;
    pg_login(&child_user, &child_password)
        .await
        .context("the child's user logs in")?;

    // The parent's placeholder in the child: refused, and nothing is forwarded.
    let forwarded = upstream.seen().len();
    let run = loop_agent(&proxy, &child, 1, &url, &with_key(&parent_key)).await;
    assert_eq!(run.statuses, [403], "{}", run.out);
    let body = run.body(403);
    assert_eq!(body["error"], "denied", "{body}");
    assert_eq!(body["reason"], "placeholder_of_another_session", "{body}");
    assert_eq!(body["credential"], "reports-db", "{body}");
    assert_eq!(upstream.seen().len(), forwarded, "forwarded anyway");

    // Deleting the parent ends the child too, and both leases are revoked.
    proxy.control().delete_session(&parent.session_id).await?;
    for (who, session, key) in [
        ("parent", &parent, &parent_key),
        ("child", &child, &child_key),
    ] {
        let run = loop_agent(&proxy, session, 1, &url, &with_key(key)).await;
        assert_eq!(run.statuses, [407], "{who}: {}", run.out);
    }
    assert!(
        pg_login(&parent_user, &parent_password).await.is_err(),
        "the parent's user still logs in"
    );
    assert!(
        pg_login(&child_user, &child_password).await.is_err(),
        "the child's user still logs in"
    );
    let audit = proxy.audit().await;
    let ended = |id: &str| {
        audit
            .iter()
            .find(|r| {
                r.kind == "session" && r.session.as_deref() == Some(id) && !r.leases.is_empty()
            })
            .cloned()
    };
    let parent_end = ended(&parent.session_id).context("the parent's teardown record")?;
    let child_end = ended(&child.session_id).context("the child's teardown record")?;
    assert_eq!(parent_end.leases, parent_lease);
    assert_eq!(child_end.leases, child_lease);
    assert!(
        parent_end
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("session revoked")),
        "{:?}",
        parent_end.reason
    );
    assert!(
        child_end
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(&parent.session_id)),
        "the child's record says its parent ended: {:?}",
        child_end.reason
    );
    assert_eq!(
        child_end.parent.as_deref(),
        Some(parent.session_id.as_str())
    );
    Ok(())
}
