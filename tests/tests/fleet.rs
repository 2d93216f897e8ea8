//! Several replicas, as behind a load balancer: real `ostiary serve` processes on one
//! PostgreSQL schema (sessions, approvals, the audit chain), one Redis prefix (budgets, rate
//! limits, spawn counts, teardown news) and one set of keys (`state.keys_dir`, made by
//! `ostiary state init`). What holds for one process must hold for the fleet:
//!
//! - a session made on one replica works on all; a budget of 30 calls spread over three
//!   replicas stops at exactly 30; a rate of 10/s holds within GCRA tolerance across them;
//!   a fan-out of 3 children holds across them;
//! - an approval held on one replica and approved through another's page runs once; the
//!   replica that claimed it killed mid-execution (`kill -9`, the upstream still holding the
//!   request) is relieved by another after the claim's lease, and the upstream applies the
//!   effect once (the re-send carries the same `Idempotency-Key`);
//! - teardown on one replica cuts a tunnel open on another;
//! - Redis gone (stopped, or hung) → budget-bearing requests refused `503
//!   state_unavailable`, `/readyz` failing, and service back when Redis is;
//!   PostgreSQL unreachable → `/readyz` failing and nothing forwarded without its record;
//! - `ostiary audit verify` passes over the shared chain after concurrent load on three
//!   replicas, and fails once a row is edited.
//!
//! Redis and PostgreSQL are the machine's (`OSTIARY_TEST_REDIS`, `OSTIARY_TEST_POSTGRES`);
//! the tests that stop Redis run a `redis-server` of their own, and the one that cuts
//! PostgreSQL puts a TCP relay of its own in front of it. Timings are printed, not asserted
//! (bounds are generous deadlines): run with `--nocapture` to read them.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/postgres.rs"]
mod postgres;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ostiary_e2e::raw::{self, auth_line, Wire, IO_DEADLINE};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession, SdkError, Session};
use postgres::{psql, Schema};
use serde_json::Value;
use tokio::process::{Child, Command};

const TOOLS: &str = r#"
[[tool]]
name = "pay.lookup"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/echo" }

[[tool]]
name = "pay.status"
tier = "write"
match = { host = "api.example.test", method = "GET", path = "/status/{code}" }

[[tool]]
name = "pay.note"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/notes/{n}" }

[[tool]]
name = "pay.refund"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/idem/refunds/{charge}" }
"#;

const POLICIES: &str = r#"
@id("reads-and-writes")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

/// What every fleet here configures: fast sweeps and reaping, a short claim lease, a
/// drain that does not hold a test up.
const BASE_TOML: &str = r#"
[approvals]
approvers = ["alice@example.com"]
tick = "200ms"
claim_lease = "2s"

[broker]
reap_interval = "1s"
"#;

/// Most fleets here repeat one call on purpose: the loop watchdog is the watchdog test's.
const NO_WATCHDOG: &str = "[sessions.watchdog]\nenabled = false\n";

const APPROVER: &str = "alice@example.com";

fn redis_url() -> String {
    std::env::var("OSTIARY_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// One `ostiary serve` of a fleet.
struct Replica {
    name: String,
    child: Child,
    proxy_addr: SocketAddr,
    control_addr: SocketAddr,
    log: PathBuf,
}

/// What the replicas of a fleet share, and the replicas.
struct Fleet {
    dir: tempfile::TempDir,
    keys: PathBuf,
    policies: PathBuf,
    ca_file: PathBuf,
    store: String,
    redis: String,
    prefix: String,
    token: String,
    upstream_port: u16,
    extra: String,
    replicas: Vec<Replica>,
    _schema: Schema,
}

impl Fleet {
    /// `n` replicas on a fresh schema and prefix; `store`/`redis` override where they dial
    /// (a relay in front of PostgreSQL, a Redis of the test's own).
    async fn start(
        upstream: &Upstream,
        n: usize,
        extra: &str,
        store: Option<&dyn Fn(&Schema) -> String>,
        redis: Option<String>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        // The operator's step: the shared keys, made once.
        let made = cli::ostiary(&["state", "init", "--dir", &keys.display().to_string()]).await;
        assert!(made.success(), "{made}");
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
        std::fs::write(policies.join("tools.toml"), TOOLS).unwrap();
        let ca_file = upstream.write_ca(dir.path());
        let schema = Schema::create();
        let mut fleet = Self {
            store: store.map_or_else(|| schema.url(), |f| f(&schema)),
            redis: redis.unwrap_or_else(redis_url),
            prefix: unique("fleet"),
            token: ostiary::state::random_hex(32),
            upstream_port: upstream.port(),
            extra: if extra.contains("[sessions.watchdog]") {
                format!("{BASE_TOML}\n{extra}")
            } else {
                format!("{BASE_TOML}\n{NO_WATCHDOG}\n{extra}")
            },
            replicas: Vec::new(),
            dir,
            keys,
            policies,
            ca_file,
            _schema: schema,
        };
        for i in 0..n {
            let replica = fleet.start_replica(i).await;
            fleet.replicas.push(replica);
        }
        fleet
    }

    /// Start replica `i` (free ports; retried if another process takes one meanwhile).
    async fn start_replica(&self, i: usize) -> Replica {
        let name = format!("r{i}");
        let home = self.dir.path().join(&name);
        std::fs::create_dir_all(&home).unwrap();
        let mut last = String::new();
        for attempt in 0..3 {
            let proxy_addr: SocketAddr = ([127, 0, 0, 1], cli::free_port()).into();
            let control_addr: SocketAddr = ([127, 0, 0, 1], cli::free_port()).into();
            let config = home.join("ostiary.toml");
            std::fs::write(&config, self.config_text(&home, proxy_addr, control_addr)).unwrap();
            let log = home.join(format!("serve-{attempt}.log"));
            let mut child = self.spawn(&config, &log, &name);
            match cli::wait_healthy(&mut child, control_addr, &log).await {
                Ok(()) => {
                    return Replica {
                        name,
                        child,
                        proxy_addr,
                        control_addr,
                        log,
                    }
                }
                Err(text) => {
                    let _ = child.kill().await;
                    if !text.contains("binding") {
                        panic!("replica {name} did not start:\n{text}");
                    }
                    last = text;
                }
            }
        }
        panic!("replica {name} did not start:\n{last}");
    }

    fn config_text(&self, home: &Path, proxy: SocketAddr, control: SocketAddr) -> String {
        format!(
            r#"
[listen]
proxy = "{proxy}"
control = "{control}"
drain = "1s"

[state]
dir = "{state}"
store = "{store}"
redis = "{redis}"
redis_prefix = "{prefix}"
keys_dir = "{keys}"

[policy]
dir = "{policies}"

[egress]
ports = [80, 443, {port}]
allow_private = ["127.0.0.1/32"]
resolve = {{ "api.example.test" = "127.0.0.1" }}
ca_file = "{ca}"
{extra}
"#,
            state = home.join("state").display(),
            store = self.store,
            redis = self.redis,
            prefix = self.prefix,
            keys = self.keys.display(),
            policies = self.policies.display(),
            port = self.upstream_port,
            ca = self.ca_file.display(),
            extra = self.extra,
        )
    }

    /// `ostiary serve` with the fleet's admin token and this replica's name.
    fn spawn(&self, config: &Path, log: &Path, name: &str) -> Child {
        let out = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(cli::ostiary_bin());
        cmd.arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .env("OSTIARY_LOG", "info")
            .env("OSTIARY_ADMIN_TOKEN", &self.token)
            .env("OSTIARY_REPLICA_ID", name)
            .kill_on_drop(true);
        for var in [
            "OSTIARY_CONFIG",
            "OSTIARY_LOG_FORMAT",
            "OSTIARY_STATE_STORE",
            "OSTIARY_STATE_REDIS",
        ] {
            cmd.env_remove(var);
        }
        for var in ostiary_e2e::clients::SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.spawn().expect("starting ostiary serve")
    }

    fn control(&self, i: usize) -> ControlClient {
        ControlClient::new(
            format!("http://{}", self.replicas[i].control_addr),
            &self.token,
        )
    }

    /// An agent's HTTPS client through replica `i` with `session`'s token.
    fn agent(&self, i: usize, session: &Session) -> reqwest::Client {
        let ca = std::fs::read(self.keys.join("ca.pem")).unwrap();
        reqwest::Client::builder()
            .proxy(
                reqwest::Proxy::all(format!(
                    "http://agent:{}@{}",
                    session.token, self.replicas[i].proxy_addr
                ))
                .unwrap(),
            )
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    fn url(&self, path: &str) -> String {
        format!("https://api.example.test:{}{path}", self.upstream_port)
    }

    /// A root session of `agent`, with no limits, made through replica `i`.
    async fn root(&self, i: usize, agent: &str) -> Session {
        self.session(
            i,
            NewSession {
                agent: agent.into(),
                ..Default::default()
            },
        )
        .await
    }

    async fn session(&self, i: usize, new: NewSession) -> Session {
        self.control(i)
            .create_session(&new)
            .await
            .expect("creating a session")
    }

    /// `GET /readyz` of replica `i`: status and body.
    async fn ready(&self, i: usize) -> (u16, Value) {
        control_get(self.replicas[i].control_addr, "/readyz", None).await
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.replicas[i].log).unwrap_or_default()
    }
}

impl Drop for Fleet {
    /// A failing test shows what the replicas said.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (i, replica) in self.replicas.iter().enumerate() {
                let log = self.log(i);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- {} (last lines, newest first):", replica.name);
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// `GET path` on a control listener, with the admin token if given.
async fn control_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(10));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let response = req.send().await.expect("the control listener answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Status and JSON body of an agent's GET.
async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = match client.get(url).send().await {
        Ok(response) => response,
        // Refused at CONNECT: reqwest says so as an error, not a response.
        Err(e) if format!("{e:?}").contains("ProxyAuthRequired") => return (407, Value::Null),
        Err(e) => panic!("the proxy answers: {e:?}"),
    };
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn api_status(e: &SdkError) -> u16 {
    match e {
        SdkError::Api { status, .. } => *status,
        other => panic!("not an API refusal: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_its_budget_and_its_fan_out_hold_across_three_replicas_and_the_chain_verifies() {
    let upstream = Upstream::builder().start().await;
    let mut fleet = Fleet::start(&upstream, 3, "[sessions]\nmax_children = 3\n", None, None).await;

    // Made on replica 0, used on all three.
    let session = fleet
        .session(
            0,
            NewSession {
                agent: "billing".into(),
                max_calls: Some(30),
                ..Default::default()
            },
        )
        .await;
    let agents: Vec<reqwest::Client> = (0..3).map(|i| fleet.agent(i, &session)).collect();
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 200, "replica {i}: {body}");
    }
    // The rest of the budget, raced round-robin: exactly 30 in all.
    let started = Instant::now();
    let answers = futures_util::future::join_all((0..42).map(|n| {
        let agent = agents[n % 3].clone();
        let url = fleet.url("/echo");
        async move { get(&agent, &url).await }
    }))
    .await;
    let elapsed = started.elapsed();
    let allowed = answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(allowed + 3, 30, "{answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != 200) {
        assert_eq!(*status, 429, "{body}");
        assert_eq!(body["error"], "limit_exceeded", "{body}");
        assert_eq!(body["limit"], "calls", "{body}");
    }
    assert_eq!(
        upstream.count("/echo"),
        30,
        "nothing past the budget went upstream"
    );
    println!("42 calls over 3 replicas in {elapsed:?}: 27 allowed, 15 refused at the budget");
    // Every replica refuses the spent session alike.
    for agent in &agents {
        assert_eq!(get(agent, &fleet.url("/echo")).await.0, 429);
    }

    // A fan-out of 3, raced through the three replicas by the parent itself.
    let parent = fleet.root(1, "planner").await;
    // An `Idempotency-Key` used through one replica is replayed by another.
    let mut outcomes = Vec::new();
    for i in [0, 2] {
        let response = fleet
            .agent(i, &parent)
            .post(fleet.url("/idem/notes/1"))
            .header("idempotency-key", "note-1")
            .header("content-type", "application/json")
            .body(r#"{"text": "once"}"#)
            .send()
            .await
            .unwrap();
        outcomes.push((
            response.status().as_u16(),
            response.headers().contains_key("idempotency-replayed"),
        ));
    }
    assert_eq!(
        outcomes,
        [(201, false), (201, true)],
        "the second is the first's answer"
    );
    let notes = upstream
        .effects()
        .iter()
        .filter(|e| e.path == "/idem/notes/1")
        .count();
    assert_eq!(notes, 1, "applied once across replicas");
    let spawned = futures_util::future::join_all((0..9).map(|n| {
        let client = ControlClient::new(
            format!("http://{}", fleet.replicas[n % 3].control_addr),
            &parent.token,
        );
        async move {
            client
                .create_session(&NewSession {
                    agent: "planner".into(),
                    ..Default::default()
                })
                .await
        }
    }))
    .await;
    let children: Vec<&Session> = spawned.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(
        children.len(),
        3,
        "{:?}",
        spawned
            .iter()
            .map(|r| r.as_ref().err().map(ToString::to_string))
            .collect::<Vec<_>>()
    );
    for refused in spawned.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(api_status(refused), 429, "{refused}");
        assert!(refused.to_string().contains("children"), "{refused}");
    }
    // A child ends on one replica: another has room for one more child.
    fleet
        .control(2)
        .delete_session(&children[0].session_id)
        .await
        .unwrap();
    let again = ControlClient::new(
        format!("http://{}", fleet.replicas[0].control_addr),
        &parent.token,
    )
    .create_session(&NewSession {
        agent: "planner".into(),
        ..Default::default()
    })
    .await;
    let again = again.unwrap_or_else(|e| panic!("{e}"));
    // The parent ends through replica 0: its children, made through the others, end too.
    assert_eq!(
        get(&fleet.agent(1, &again), &fleet.url("/echo")).await.0,
        200
    );
    fleet
        .control(0)
        .delete_session(&parent.session_id)
        .await
        .unwrap();
    for child in children.iter().skip(1).copied().chain([&again]) {
        for i in 0..3 {
            let (status, _) = get(&fleet.agent(i, child), &fleet.url("/echo")).await;
            assert_eq!(status, 407, "child {} on replica {i}", child.session_id);
        }
    }

    // The chain the three wrote concurrently verifies, from any replica's config.
    for replica in std::mem::take(&mut fleet.replicas) {
        let mut replica = replica;
        cli::terminate(&mut replica.child, &replica.log).await;
    }
    let config = fleet.dir.path().join("r1").join("ostiary.toml");
    let config = config.display().to_string();
    let verified = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(verified.success(), "{verified}");
    let records: usize = psql(&format!("SELECT COUNT(*) FROM {}.audit", fleet._schema.0))
        .parse()
        .unwrap();
    assert!(records >= 45, "{records} records");
    println!(
        "audit verify over {records} records written by 3 replicas: {}",
        verified.stdout.trim()
    );
    psql(&format!(
        "UPDATE {}.audit SET record = replace(record, '\"allow\"', '\"deny\"') WHERE seq = 5",
        fleet._schema.0
    ));
    let tampered = cli::ostiary(&["--config", &config, "audit", "verify"]).await;
    assert!(!tampered.success(), "{tampered}");
    assert!(tampered.stdout.contains("record 5"), "{tampered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_within_gcra_tolerance_across_three_replicas() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(
        &upstream,
        3,
        "[tiers.write]\nrate_agent = \"10/s\"\n",
        None,
        None,
    )
    .await;
    let session = fleet.root(2, "poller").await;
    // Three agents, one per replica, as fast as each can go, for a while.
    let run = Duration::from_secs(3);
    let started = Instant::now();
    let results = futures_util::future::join_all((0..3).map(|i| {
        let agent = fleet.agent(i, &session);
        let url = fleet.url("/status/200");
        async move {
            let (mut admitted, mut refused) = (0usize, 0usize);
            while started.elapsed() < run {
                match get(&agent, &url).await {
                    (200, _) => admitted += 1,
                    (429, body) => {
                        assert_eq!(body["limit"], "rate:agent", "{body}");
                        refused += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            (admitted, refused)
        }
    }))
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let admitted: usize = results.iter().map(|r| r.0).sum();
    let refused: usize = results.iter().map(|r| r.1).sum();
    // GCRA: the burst (10) at once, then one every 100 ms, whichever replica asks.
    let most = 10 + (elapsed * 10.0).ceil() as usize + 1;
    println!(
        "rate 10/s over 3 replicas for {elapsed:.2}s: {admitted} admitted (at most {most}), {refused} refused, per replica {results:?}"
    );
    assert!(admitted <= most, "{admitted} admitted in {elapsed:.2}s");
    assert!(
        refused > admitted,
        "the agents pushed well past the rate: {results:?}"
    );
    assert!(admitted >= 20, "the rate admits what it should: {admitted}");
    assert!(
        results.iter().all(|r| r.0 > 0),
        "each replica admitted some: {results:?}"
    );
}

/// The approval id of a held refund of `charge` (`delay_ms`: the upstream answers that late).
async fn hold(fleet: &Fleet, agent: &reqwest::Client, charge: &str, delay_ms: u64) -> String {
    let url = fleet.url(&format!("/idem/refunds/{charge}?delay_ms={delay_ms}"));
    let response = agent
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"amount": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "approval_pending", "{body}");
    body["approval_id"].as_str().unwrap().to_owned()
}

/// Approve `id` on `through`'s page with a link replica `from` signed.
async fn approve_on_page(fleet: &Fleet, id: &str, from: usize, through: usize) {
    let link = fleet
        .control(from)
        .approval_link(id, APPROVER)
        .await
        .unwrap();
    let path = link
        .split_once("/approve/")
        .map(|(_, rest)| rest)
        .expect("a review link");
    let page = format!(
        "http://{}/approve/{path}",
        fleet.replicas[through].control_addr
    );
    let response = reqwest::Client::new()
        .post(&page)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("decision=approve&reason=checked")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
}

/// Poll any of `replicas` until approval `id` reaches `status`.
async fn wait_status(fleet: &Fleet, replicas: &[usize], id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        for &i in replicas {
            if let Ok(approval) = fleet.control(i).approval(id).await {
                if approval["status"] == status {
                    return approval;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "approval {id} never became {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The replica whose log says it claimed `id` most recently, by index.
fn claimer(fleet: &Fleet, id: &str) -> Option<usize> {
    (0..fleet.replicas.len()).find(|&i| {
        fleet
            .log(i)
            .lines()
            .any(|l| l.contains("approval claimed for execution") && l.contains(id))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_runs_once_across_replicas_even_when_its_executor_is_killed() {
    let upstream = Upstream::builder().start().await;
    let mut fleet = Fleet::start(&upstream, 3, "", None, None).await;
    let session = fleet.root(0, "billing").await;
    let agent = fleet.agent(0, &session);

    // Held on replica 0, approved through replica 1's page: executed once.
    let first = hold(&fleet, &agent, "ch_1", 0).await;
    approve_on_page(&fleet, &first, 0, 1).await;
    let done = wait_status(&fleet, &[0, 1, 2], &first, "executed").await;
    assert_eq!(done["attempts"], 1, "{done}");
    let key = format!("ostiary-{first}");
    let effects = |key: &str| {
        upstream
            .effects()
            .iter()
            .filter(|e| e.key.as_deref() == Some(key))
            .count()
    };
    assert_eq!(effects(&key), 1);
    // The agent collects it through another replica.
    let collected = fleet
        .agent(2, &session)
        .post(fleet.url("/idem/refunds/ch_1?delay_ms=0"))
        .header("content-type", "application/json")
        .header("ostiary-approval", &first)
        .body(r#"{"amount": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(collected.status().as_u16(), 201);

    // Held again, approved, and its executor killed while the upstream holds the request.
    let second = hold(&fleet, &agent, "ch_2", 6_000).await;
    approve_on_page(&fleet, &second, 2, 0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let killed = loop {
        if let Some(i) = claimer(&fleet, &second) {
            break i;
        }
        assert!(Instant::now() < deadline, "nobody claimed {second}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The upstream has it (applied, answering late): the kill lands mid-execution.
    let key = format!("ostiary-{second}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while effects(&key) == 0 {
        assert!(
            Instant::now() < deadline,
            "the execution never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed_at = Instant::now();
    fleet.replicas[killed].child.start_kill().unwrap();
    let _ = fleet.replicas[killed].child.wait().await;
    let others: Vec<usize> = (0..3).filter(|i| *i != killed).collect();
    let done = wait_status(&fleet, &others, &second, "executed").await;
    let recovered_in = killed_at.elapsed();
    assert_eq!(
        done["attempts"], 2,
        "re-sent once, by another replica: {done}"
    );
    assert_eq!(effects(&key), 1, "the effect applied once");
    let deliveries = upstream
        .seen()
        .iter()
        .filter(|s| s.path_only() == "/idem/refunds/ch_2")
        .count();
    assert_eq!(
        deliveries, 2,
        "sent by the killed replica, re-sent by another"
    );
    let rescuer = others
        .iter()
        .copied()
        .find(|&i| {
            fleet
                .log(i)
                .lines()
                .any(|l| l.contains("approval claimed for execution") && l.contains(&second))
        })
        .expect("another replica claimed it");
    println!(
        "replica {} killed mid-execution; {} re-sent it after {recovered_in:?} (claim lease 2s)",
        fleet.replicas[killed].name, fleet.replicas[rescuer].name
    );

    // A graceful stop (SIGTERM) mid-execution releases the claim instead of leaving it to
    // lapse: the last replica sends it again, and the upstream applies it once.
    let third = hold(&fleet, &fleet.agent(others[0], &session), "ch_3", 6_000).await;
    approve_on_page(&fleet, &third, others[0], others[1]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let stopping = loop {
        if let Some(i) = claimer(&fleet, &third) {
            break i;
        }
        assert!(Instant::now() < deadline, "nobody claimed {third}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let key = format!("ostiary-{third}");
    while effects(&key) == 0 {
        assert!(
            Instant::now() < deadline,
            "the execution never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    {
        let replica = &mut fleet.replicas[stopping];
        cli::terminate(&mut replica.child, &replica.log).await;
    }
    let last: Vec<usize> = others.iter().copied().filter(|i| *i != stopping).collect();
    let done = wait_status(&fleet, &last, &third, "executed").await;
    assert_eq!(done["attempts"], 2, "{done}");
    assert_eq!(effects(&key), 1, "the effect applied once");
    let released: usize = psql(&format!(
        "SELECT COUNT(*) FROM {}.audit WHERE record LIKE '%released at shutdown%' AND record LIKE '%{third}%'",
        fleet._schema.0
    ))
    .parse()
    .unwrap();
    assert_eq!(released, 1, "the release is in the audit trail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_on_one_replica_cuts_a_tunnel_open_on_another() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(&upstream, 3, "", None, None).await;
    let session = fleet.root(0, "tunneler").await;
    // An intercepted tunnel through replica 0, used once and left open.
    let authority = format!("api.example.test:{}", upstream.port());
    let (wire, reply) = raw::connect(
        fleet.replicas[0].proxy_addr,
        &authority,
        &auth_line(&session.token),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    let ca = std::fs::read_to_string(fleet.keys.join("ca.pem")).unwrap();
    let tls = raw::tls(
        wire.into_inner(),
        raw::client_config(&ca, &[b"http/1.1"]),
        "api.example.test",
    )
    .await
    .unwrap();
    let mut tunnel = Wire::new(tls);
    tunnel
        .send(format!("GET /echo HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(tunnel.response().await.unwrap().status, 200);

    // Ended through replica 2, which never served it.
    let ended = Instant::now();
    fleet
        .control(2)
        .delete_session(&session.session_id)
        .await
        .expect("replica 2 ends a session replica 0 made");
    assert!(
        tunnel.closed_within(IO_DEADLINE).await,
        "the tunnel on replica 0 outlived the teardown on replica 2"
    );
    println!(
        "tunnel on r0 cut {:?} after the teardown on r2",
        ended.elapsed()
    );
    assert_eq!(upstream.count("/echo"), 1);
    // And the token is refused everywhere.
    for i in 0..3 {
        let (status, _) = get(&fleet.agent(i, &session), &fleet.url("/echo")).await;
        assert_eq!(status, 407, "replica {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_spread_over_three_replicas_is_caught_as_one_and_paused_everywhere() {
    let upstream = Upstream::builder().start().await;
    let fleet = Fleet::start(
        &upstream,
        3,
        "[sessions.watchdog]\nenabled = true\n",
        None,
        None,
    )
    .await;
    let session = fleet.root(0, "looper").await;
    let agents: Vec<reqwest::Client> = (0..3).map(|i| fleet.agent(i, &session)).collect();
    // The same tool call 20 times (the read tier's `repeat_max`), round-robin: no replica
    // sees more than 7 of them, the loop is 20 long.
    for n in 0..20 {
        let (status, body) = get(&agents[n % 3], &fleet.url("/echo")).await;
        assert_eq!(status, 200, "call {n}: {body}");
    }
    // Paused by whichever replica saw the 20th; every replica refuses it once the pause
    // reaches its gate (at most 100 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 423, "replica {i}: {body}");
        assert_eq!(body["error"], "session_paused", "{body}");
    }
    assert_eq!(upstream.count("/echo"), 20);
    // One dead letter, seen from any replica; resumed through another, served everywhere.
    let letters = fleet
        .control(2)
        .dead_letters(Some(&session.session_id))
        .await
        .unwrap();
    let letters = letters["dead_letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match fleet.control(1).resume_session(&session.session_id).await {
            Ok(()) => break,
            // The dead letter is written a moment after the pause.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("resume: {e}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, agent) in agents.iter().enumerate() {
        let (status, body) = get(agent, &fleet.url("/echo")).await;
        assert_eq!(status, 200, "replica {i} after the resume: {body}");
    }
}

/// A `redis-server` of the test's own, on a free port, keeping nothing on disk.
struct OwnRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    async fn start() -> Self {
        let mut redis = Self {
            port: cli::free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        redis.run().await;
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn run(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is required (scripts/test.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.start_kill().unwrap();
            let _ = child.wait().await;
        }
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().and_then(Child::id).unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Poll replica `i`'s `/readyz` until its `ok` is `want`; the body.
async fn wait_ready(fleet: &Fleet, i: usize, want: bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = fleet.ready(i).await;
        if (status == 200) == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never became {want}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_budgets_refuse_readiness_fails_and_service_returns_with_it() {
    let upstream = Upstream::builder().start().await;
    let mut redis = OwnRedis::start().await;
    let fleet = Fleet::start(&upstream, 2, "", None, Some(redis.url())).await;
    let new = || NewSession {
        agent: "billing".into(),
        max_calls: Some(100),
        ..Default::default()
    };
    let session = fleet.session(0, new()).await;
    let agent = fleet.agent(1, &session);
    assert_eq!(get(&agent, &fleet.url("/echo")).await.0, 200);
    let ready = wait_ready(&fleet, 1, true).await;
    assert_eq!(ready["components"]["redis"]["ok"], true, "{ready}");

    // Hung (SIGSTOP): every budget-bearing request is refused, nothing goes upstream.
    redis.signal("-STOP");
    let (status, body) = get(&agent, &fleet.url("/echo")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "state_unavailable", "{body}");
    assert_eq!(body["component"], "redis", "{body}");
    assert!(
        !body.to_string().contains(&redis.port.to_string()),
        "no address for the agent: {body}"
    );
    let ready = wait_ready(&fleet, 1, false).await;
    assert_eq!(ready["components"]["redis"]["ok"], false, "{ready}");
    let (_, metrics) = control_get(
        fleet.replicas[1].control_addr,
        "/metrics",
        Some(&fleet.token),
    )
    .await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(metrics.contains("ostiary_state_available 0"), "{metrics}");
    assert_eq!(upstream.count("/echo"), 1);
    // A new session cannot be made either (its account would not exist).
    let refused = fleet.control(0).create_session(&new()).await.unwrap_err();
    assert_eq!(api_status(&refused), 503, "{refused}");

    // Back (SIGCONT): the same session is served again, readiness recovers.
    redis.signal("-CONT");
    wait_ready(&fleet, 1, true).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(&agent, &fleet.url("/echo")).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "the session was never served again: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Stopped and restarted empty: the accounts it held are gone, and their sessions stay
    // refused (not handed fresh budgets); new sessions work.
    redis.kill().await;
    let (status, body) = get(&agent, &fleet.url("/echo")).await;
    assert_eq!(
        (status, body["error"].clone()),
        (503, "state_unavailable".into()),
        "{body}"
    );
    wait_ready(&fleet, 0, false).await;
    redis.run().await;
    wait_ready(&fleet, 0, true).await;
    let (status, body) = get(&agent, &fleet.url("/echo")).await;
    assert_eq!(status, 503, "a lost account is not a fresh budget: {body}");
    let fresh = fleet.session(0, new()).await;
    assert_eq!(
        get(&fleet.agent(1, &fresh), &fleet.url("/echo")).await.0,
        200
    );
    assert_eq!(upstream.count("/echo"), 3);
}

/// A TCP relay in front of PostgreSQL that the test can cut (every connection closed, new
/// ones refused) and restore: PostgreSQL unreachable, as a partition would make it.
struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let gate = open.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if !gate.load(Ordering::Acquire) {
                    continue; // dropped: refused
                }
                let mut cuts = cuts.clone();
                // Only cuts from now on concern this connection.
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self { port, open, cut }
    }

    fn set(&self, open: bool) {
        self.open.store(open, Ordering::Release);
        if !open {
            self.cut.send_modify(|n| *n += 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_postgres_readiness_fails_and_nothing_goes_upstream_unrecorded() {
    let upstream = Upstream::builder().start().await;
    let base = url::Url::parse(&postgres::base_url()).unwrap();
    let pg: SocketAddr = format!(
        "{}:{}",
        base.host_str().unwrap_or("127.0.0.1"),
        base.port().unwrap_or(5432)
    )
    .parse()
    .expect("OSTIARY_TEST_POSTGRES names an IP address");
    let relay = Relay::start(pg).await;
    let port = relay.port;
    let through_relay = move |schema: &Schema| {
        let mut url = url::Url::parse(&schema.url()).unwrap();
        url.set_port(Some(port)).unwrap();
        url.to_string()
    };
    let fleet = Fleet::start(&upstream, 2, "", Some(&through_relay), None).await;
    let session = fleet.root(0, "billing").await;
    let agent = fleet.agent(1, &session);
    assert_eq!(get(&agent, &fleet.url("/echo")).await.0, 200);
    wait_ready(&fleet, 1, true).await;

    relay.set(false);
    let ready = wait_ready(&fleet, 1, false).await;
    assert_eq!(ready["components"]["store"]["ok"], false, "{ready}");
    // Whatever the agent is told, nothing reaches the upstream without its record.
    let before = upstream.count("/echo");
    let mut refused = Vec::new();
    for _ in 0..5 {
        let (status, body) = get(&agent, &fleet.url("/echo")).await;
        refused.push((status, body["error"].clone()));
    }
    println!("requests while PostgreSQL was unreachable: {refused:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(&agent, &fleet.url("/echo")).await;
        if status == 503 {
            assert_eq!(body["error"], "audit_unavailable", "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still forwarding without a store: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let forwarded_while_cut = upstream.count("/echo") - before;

    relay.set(true);
    wait_ready(&fleet, 1, true).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(&agent, &fleet.url("/echo")).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every request that went upstream has its record in the chain (the last one's is
    // written as its answer goes, so it is waited for).
    let count_allowed = || -> usize {
        psql(&format!(
            "SELECT COUNT(*) FROM {}.audit WHERE record LIKE '%\"decision\":\"allow\"%' AND record LIKE '%/echo%'",
            fleet._schema.0
        ))
        .parse()
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while count_allowed() < upstream.count("/echo") {
        assert!(
            Instant::now() < deadline,
            "{} allow records for {} upstream requests ({forwarded_while_cut} while cut)",
            count_allowed(),
            upstream.count("/echo")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "PostgreSQL cut: {forwarded_while_cut} requests forwarded while it was (each recorded once it was back)"
    );
}
