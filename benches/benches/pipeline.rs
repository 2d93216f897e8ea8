//! Per-request cost of the whole proxy pipeline, end to end: a real Ostiary started
//! in-process with the e2e rig, a loopback HTTPS upstream from the same rig, and one agent
//! client (reqwest through the proxy, trusting its CA) whose keep-alive connection is reused
//! across iterations, so what is timed is one request through every phase — authentication,
//! recognition, the session gate and meters, the tier's checks and rate limit, the Cedar
//! decision, the forward over a pooled upstream connection, the answer, the audit record —
//! and not a CONNECT or a TLS handshake.
//!
//! Cases:
//! - `direct_get`: the same GET sent straight to the upstream (the floor: client, upstream
//!   and TLS alone), so a run's figures can be read against what the machine gave that run;
//! - `proxy_get`: an HTTPS `GET /echo` (small JSON answer) decided as `Action::"http"`;
//! - `proxy_tool_post`: a 1 KiB JSON `POST /echo` recognised as a catalogued `read` tool call,
//!   so the body is buffered, parsed into `args`, checked (`limits`, `args_schema`) and
//!   rate-limited before the decision.
//! - `proxy_get_audit_off`, `proxy_tool_post_audit_off`: the same two through a second proxy
//!   whose audit chain is kept nowhere ([`Discard`], through `Options::audit_store`): every
//!   record is still built, queued, serialised and sealed by the writer thread, but no row is
//!   inserted or committed. "Audit on ≥ 0.95× audit off" (issue 17) is read from these.
//! - `proxy_tool_create`, `proxy_tool_create_undo`: the same 1 KiB POST to the upstream's
//!   `/records` (which answers `{"id": …}`), as a tool without and with an `undo` (issue 20):
//!   the second reads the answer to render `DELETE /records/{response.id}` and writes it to
//!   the store's undo journal before the agent has the answer. Two host names of one
//!   upstream, so the two differ in the tool's `undo` alone.
//!
//! Each case is measured twice, on two clocks: `pipeline/*` in wall time (what the agent
//! waits), `pipeline_cpu/*` in CPU time of every thread of the process (what the request
//! costs the machine; see [`Clock`] for why both). A criterion "time" in `pipeline_cpu` is
//! CPU time per request.
//!
//! Written to compare the pipeline before and after a restructuring (issue 15), so it uses
//! only what the rig offered before it: run the same file on both trees, in one sitting.
//! Limits are set high enough that thousands of iterations never trip one (every request is
//! asserted to be a 200): a billion calls and bytes, an agent rate of a billion per second,
//! and the watchdog's repeat rule off for the `read` tier (the benchmark repeats one call by
//! design; the watchdog itself stays on and sees every call).
//!
//! `OSTIARY_BENCH_CONFIG` (TOML) is appended to both proxies' configuration, to compare a
//! setting in one sitting (`OSTIARY_BENCH_CONFIG=$'[audit]\ngroup_commit = "2ms"'`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use ostiary::server::Options;
use ostiary::store::audit::{AppendError, AuditQuery, AuditRow, AuditStore, Seal, Tip};
use ostiary::store::StoreError;
use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::upstream::Upstream;
use reqwest::{Certificate, Client, Proxy};
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// A REST tool on the upstream's echo route, so the proxy buffers and parses its body.
const TOOLS: &str = r#"
[[tool]]
name = "bench.note"
tier = "read"
match = { host = "api.example.test", method = "POST", path = "/echo" }
args_schema = { type = "object", required = ["title"], properties = { title = { type = "string" }, body = { type = "string" } } }
cost = 0.000001

[[tool]]
name = "bench.create"
tier = "read"
match = { host = "api.example.test", method = "POST", path = "/records" }
cost = 0.000001

[[tool]]
name = "bench.create_undoable"
tier = "read"
match = { host = "undo.example.test", method = "POST", path = "/records" }
cost = 0.000001
undo = { method = "DELETE", path = "/records/{response.id}" }
"#;

/// The name the undoable tool is served at (the same upstream).
const UNDO_HOST: &str = "undo.example.test";

/// Far beyond what a run sends: the meters and the limiter do their bookkeeping, never refuse.
const LIMITS: &str = r#"
[sessions]
max_calls = 1000000000
max_cost = 1000000000.0
max_bytes_sent = 1000000000000
max_bytes_received = 1000000000000

[tiers.read]
rate_agent = "1000000000/s"
repeat_max = 0
"#;

/// Size of the tool call's JSON body.
const BODY_BYTES: usize = 1024;

/// The audit-off rung's chain: appends move the tip, nothing is kept.
#[derive(Debug, Default)]
struct Discard(Mutex<Option<Tip>>);

impl AuditStore for Discard {
    fn append(&self, _after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError> {
        if let (Some(row), Ok(mut tip)) = (rows.last(), self.0.lock()) {
            *tip = Some(Tip {
                seq: row.seq,
                hash: row.hash.clone(),
            });
        }
        Ok(())
    }
    fn append_after(&self, after: &Tip, seal: &mut Seal<'_>) -> Result<Vec<AuditRow>, AppendError> {
        let rows = seal(&[]).map_err(AppendError::Refused)?;
        self.append(after, &rows)?;
        Ok(rows)
    }
    fn last(&self) -> Result<Option<Tip>, StoreError> {
        Ok(self.0.lock().ok().and_then(|tip| tip.clone()))
    }
    fn last_decided(&self, _: &str) -> Result<Option<AuditRow>, StoreError> {
        Ok(None)
    }
    fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError> {
        let last = self.last()?;
        Ok(last.filter(|tip| tip.seq == seq).map(|tip| tip.hash))
    }
    fn scan(&self, _: i64, _: &mut dyn FnMut(AuditRow) -> bool) -> Result<(), StoreError> {
        Ok(())
    }
    fn query(&self, _: &AuditQuery) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    fn recent(&self, _: &str, _: u32) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

struct Rig {
    upstream: Upstream,
    // Kept alive for the whole run; dropping them shuts the proxies down.
    _proxies: [TestProxy; 2],
    // After the proxies: their databases live here until they have stopped.
    _state: TempDir,
    through: Client,
    /// Through the proxy whose audit chain is [`Discard`]ed.
    through_audit_off: Client,
    direct: Client,
    body: String,
    // Last, so the proxy, the upstream and the clients are dropped while it still runs.
    rt: Runtime,
}

impl Rig {
    fn start() -> Self {
        // Two workers, as many as the machine's cores: the proxy, the upstream and the
        // client's connection tasks share them; the timed loop runs on the bench's thread.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let state = state_dir();
        let extra = format!(
            "{LIMITS}\n{}",
            std::env::var("OSTIARY_BENCH_CONFIG").unwrap_or_default()
        );
        let (upstream, proxies, through, through_audit_off, direct) = rt.block_on(async {
            let upstream = Upstream::builder()
                .names(&["api.example.test", UNDO_HOST])
                .start()
                .await;
            let policies = format!(
                "{ALLOW_ALL}\n@id(\"bench-read-tools\")\n\
                 permit (principal, action in Ostiary::Action::\"tier:read\", resource);\n"
            );
            let start = |dir: &str, audit_store: Option<Arc<dyn AuditStore>>| {
                TestProxy::start(ProxySpec {
                    policies: policies.clone(),
                    state_dir: Some(state.path().join(dir)),
                    tools_toml: Some(TOOLS.into()),
                    names: vec!["api.example.test".into(), UNDO_HOST.into()],
                    ports: vec![upstream.port()],
                    upstream_ca_pem: Some(upstream.ca_pem()),
                    extra_toml: extra.clone(),
                    options: Options {
                        audit_store,
                        ..Default::default()
                    },
                    ..Default::default()
                })
            };
            let proxy = start("state", None).await;
            let audit_off = start("state-audit-off", Some(Arc::new(Discard::default()))).await;
            let mut agents = Vec::new();
            for p in [&proxy, &audit_off] {
                let session = p.session("bench").await;
                agents.push(
                    Client::builder()
                        .proxy(Proxy::all(p.proxy_url(&session)).expect("the proxy URL"))
                        .add_root_certificate(Certificate::from_pem(p.ca_pem.as_bytes()).unwrap())
                        .build()
                        .expect("the agent client"),
                );
            }
            let through_audit_off = agents.pop().expect("two agents");
            let through = agents.pop().expect("two agents");
            // The floor goes to the upstream itself: a name the client cannot resolve is
            // pinned to the upstream's loopback address.
            let direct = Client::builder()
                .no_proxy()
                .resolve(upstream.host(), upstream.addr())
                .add_root_certificate(Certificate::from_pem(upstream.ca_pem().as_bytes()).unwrap())
                .build()
                .expect("the direct client");
            (
                upstream,
                [proxy, audit_off],
                through,
                through_audit_off,
                direct,
            )
        });
        Self {
            upstream,
            _proxies: proxies,
            _state: state,
            through,
            through_audit_off,
            direct,
            body: tool_body(),
            rt,
        }
    }

    /// One request of `case`, its answer read to the end; anything but a 200 ends the run.
    async fn send(&self, case: Case, url: &str) {
        let (client, post) = match case {
            Case::Direct => (&self.direct, false),
            Case::ProxyGet => (&self.through, false),
            Case::ToolPost => (&self.through, true),
            Case::ProxyGetAuditOff => (&self.through_audit_off, false),
            Case::ToolPostAuditOff => (&self.through_audit_off, true),
            Case::ToolCreate | Case::ToolCreateUndo => (&self.through, true),
        };
        let request = match post {
            false => client.get(url),
            true => client
                .post(url)
                .header("content-type", "application/json")
                .body(self.body.clone()),
        };
        let response = request.send().await.expect("an answer");
        let status = response.status();
        let body = response.bytes().await.expect("the answer's body");
        assert!(
            status == 200
                || (status == 201 && matches!(case, Case::ToolCreate | Case::ToolCreateUndo)),
            "{case:?} refused ({status}): {}",
            String::from_utf8_lossy(&body)
        );
        std::hint::black_box(body);
    }

    /// `iters` requests of `case`, one after another on one kept-alive connection (a fresh
    /// client opens it during criterion's warm-up), as `clock` counts them.
    fn measure(&self, clock: Clock, case: Case, url: &str, iters: u64) -> Duration {
        self.rt.block_on(async {
            // The CPU clock is read only when it is the one counted: reading it costs a few
            // file reads per sample.
            let cpu = matches!(clock, Clock::Cpu).then(cpu_time);
            let wall = Instant::now();
            for _ in 0..iters {
                self.send(case, url).await;
            }
            match cpu {
                Some(start) => cpu_time().saturating_sub(start),
                None => wall.elapsed(),
            }
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Case {
    Direct,
    ProxyGet,
    ToolPost,
    ProxyGetAuditOff,
    ToolPostAuditOff,
    ToolCreate,
    ToolCreateUndo,
}

impl Case {
    const ALL: [Case; 7] = [
        Case::Direct,
        Case::ProxyGet,
        Case::ProxyGetAuditOff,
        Case::ToolPost,
        Case::ToolPostAuditOff,
        Case::ToolCreate,
        Case::ToolCreateUndo,
    ];

    /// Where the case sends its request.
    fn url(self, upstream: &Upstream) -> String {
        match self {
            Case::ToolCreate => upstream.url("/records"),
            Case::ToolCreateUndo => format!("https://{UNDO_HOST}:{}/records", upstream.port()),
            _ => upstream.url("/echo"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Case::Direct => "direct_get",
            Case::ProxyGet => "proxy_get",
            Case::ToolPost => "proxy_tool_post",
            Case::ProxyGetAuditOff => "proxy_get_audit_off",
            Case::ToolPostAuditOff => "proxy_tool_post_audit_off",
            Case::ToolCreate => "proxy_tool_create",
            Case::ToolCreateUndo => "proxy_tool_create_undo",
        }
    }
}

/// What a sample counts. Wall time is what an agent waits, but on a shared two-core machine
/// it is mostly the scheduler's queue: every request hops between the client, the proxy's
/// and the upstream's tasks and the audit thread, and each hop waits for a core. CPU time
/// (all threads of this process: client, proxy, upstream, audit writer) is the work the
/// request costs, and moves far less with other people's builds.
#[derive(Debug, Clone, Copy)]
enum Clock {
    Wall,
    Cpu,
}

/// CPU time run so far by every live thread of this process, from the scheduler's own
/// nanosecond accounting (`/proc/self/task/*/schedstat`, first field). A thread that starts
/// and exits within one sample is missed; the runtime's threads live for the whole run.
fn cpu_time() -> Duration {
    let mut total = 0u64;
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux)");
    for task in tasks.flatten() {
        // A thread may exit between the listing and the read.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            let ran = text.split_whitespace().next().and_then(|n| n.parse().ok());
            total += ran.unwrap_or(0u64);
        }
    }
    Duration::from_nanos(total)
}

/// Where the proxy keeps its state: in memory (`/dev/shm`) where there is one. The audit
/// writer syncs its log before every head checkpoint (at most every 50 ms) and refuses
/// requests (503) once a write stalls past 2 s or 1,024 records wait; on a disk shared
/// with other builds an fsync can take that long, and the bench would measure the disk. On
/// tmpfs the fsync returns at once and the writer's own work (sealing, SQLite) is still
/// paid.
fn state_dir() -> TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let builder = tempfile::Builder::new()
        .prefix("ostiary-pipeline-")
        .tempdir_in(shm);
    builder
        .or_else(|_| tempfile::tempdir())
        .expect("a state directory")
}

/// `{"title": …, "body": "xxx…"}`, exactly [`BODY_BYTES`] long.
fn tool_body() -> String {
    let head = r#"{"title":"pipeline bench","body":""#;
    let tail = r#""}"#;
    let pad = "x".repeat(BODY_BYTES - head.len() - tail.len());
    let body = format!("{head}{pad}{tail}");
    assert_eq!(body.len(), BODY_BYTES);
    body
}

fn pipeline(c: &mut Criterion) {
    let rig = Rig::start();
    for (clock, group) in [(Clock::Wall, "pipeline"), (Clock::Cpu, "pipeline_cpu")] {
        let mut group = c.benchmark_group(group);
        group
            .sample_size(100)
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(6));
        for case in Case::ALL {
            let url = case.url(&rig.upstream);
            group.bench_function(case.name(), |b| {
                b.iter_custom(|iters| rig.measure(clock, case, &url, iters))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
