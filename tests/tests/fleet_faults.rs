//! The fleet when something fails (the harness: `support/fleet.rs`):
//!
//! - an approval held on one replica and approved through another's page runs once; the
//!   replica that claimed it killed mid-execution (`kill -9`, the upstream still holding the
//!   request) is relieved by another after the claim's lease, and a replica stopped by
//!   `SIGTERM` releases it; the upstream applies the effect once (the re-send carries the
//!   same `Idempotency-Key`);
//! - Redis gone (hung, or killed) → budget-bearing requests refused `503 state_unavailable`,
//!   `/readyz` failing, and service back when Redis is;
//! - PostgreSQL unreachable → `/readyz` failing and nothing forwarded without its record.
//!
//! The tests that stop Redis run a `redis-server` of their own, and the one that cuts
//! PostgreSQL puts a TCP relay of its own in front of it, so the machine's servers, which
//! other tests share, are never touched.

use crate::support::cli;
use crate::support::fleet;
use crate::support::postgres;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet::{
    api_status, approve_on_page, claimer, control_get, get, hold, wait_ready, wait_status, Fleet,
};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::NewSession;
use postgres::{psql, Schema};
use tokio::process::{Child, Command};

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
    // Each replica reconnects on its own: replica 1 serves the agent below.
    wait_ready(&fleet, 1, true).await;
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
    // Refusals may come at CONNECT as well as in the tunnel (`get_as`).
    let get = || fleet.get_as(1, &session, &agent, "/echo");
    assert_eq!(get().await.0, 200);
    wait_ready(&fleet, 1, true).await;

    relay.set(false);
    let ready = wait_ready(&fleet, 1, false).await;
    assert_eq!(ready["components"]["store"]["ok"], false, "{ready}");
    // Whatever the agent is told, nothing reaches the upstream without its record.
    let before = upstream.count("/echo");
    let mut refused = Vec::new();
    for _ in 0..5 {
        let (status, body) = get().await;
        refused.push((status, body["error"].clone()));
    }
    println!("requests while PostgreSQL was unreachable: {refused:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get().await;
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
        let (status, body) = get().await;
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
