//! Per-request cost of the session guardrails on the proxy's hot path: the gate (paused?
//! bytes spent?), the GCRA rate limits, `context.session` for Cedar, the call charge, the
//! byte count and the loop watchdog — the six things every request of a session pays for
//! whatever its tier, so they must stay small next to the work a request does anyway.
//!
//! Everything is measured in one run and reported as ratios against two baselines taken in
//! that run: the `Principal` clone and session-id hash every request already pays (the
//! floor), and the `read` tier's default checks (`limits` + `args_schema`, the cheapest
//! tier's stage, as in the `checks` bench). Cases:
//!
//! - one session, with and without rate limits configured;
//! - 10,000 live sessions: one hot session (map size alone), and round robin over all of
//!   them, each its own agent (cache misses, and a rate key per agent);
//! - each step on its own, to say where the time goes; the watchdog with a full trail (256
//!   events) for a call it has not seen and one it has;
//! - two threads on different sessions against one thread, to show whether the shared maps
//!   and their locks serialize sessions; with a control that shares nothing (what two cores
//!   give on this machine), one session on both threads for contrast, and the meter, the
//!   watchdog and the rate limiter apart, to say which lock it is.
//!
//! Criterion gives the typical time of each; a summary at the end times all cases
//! interleaved (batches of 64, p50 of 2,000 rounds) so machine noise hits them alike, and
//! prints each as ns per request and as ratios to the baselines.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use ostiary::check::{Checks, Subject};
use ostiary::config::{self, Rate, Sessions, Tiers};
use ostiary::guardrails::meter::Limits;
use ostiary::guardrails::pause::Seen;
use ostiary::guardrails::Guardrails;
use ostiary::metrics::Metrics;
use ostiary::session::watchdog::Event;
use ostiary::session::Principal;
use ostiary_policies::Catalog;
use serde_json::{json, Value};
use tempfile::TempDir;

const LIVE_SESSIONS: usize = 10_000;

/// The value of a guardrails call that, counting in memory, never waits (with shared
/// counters it would: that is the `counters` bench).
fn now<T>(f: impl std::future::Future<Output = T>) -> T {
    futures_util::FutureExt::now_or_never(f).expect("in-memory guardrails never wait")
}
/// The watchdog's ring (`TRAIL_CAPACITY`): past this many events every call evicts one.
const TRAIL: u64 = 256;
/// Distinct calls of the "known call" trail: below the default `repeat_max` of 20 per call
/// in a full ring (256 / 16 = 16), so the repeat rule never scans and never trips.
const KNOWN_CALLS: u64 = 16;
const TOOL: &str = "github.list_issues";

/// A guardrails instance on its own store, as the proxy loads it (default `[sessions]`:
/// the watchdog on, no default limits).
struct Rails {
    guardrails: Guardrails,
    _dir: TempDir,
}

impl Rails {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = ostiary::store::sqlite::open(&dir.path().join("guard.db"))
            .unwrap()
            .guard;
        Self {
            guardrails: Guardrails::load(store, Sessions::default(), None).unwrap(),
            _dir: dir,
        }
    }

    /// Open a session with call and cost limits, so `charge_call` does its checks, set
    /// high enough that a benchmark never reaches them.
    fn open(&self, session: &str, agent: &str, tenant: &str) -> Principal {
        let limits = Limits {
            max_calls: Some(u64::MAX / 2),
            max_cost_micros: Some(i64::MAX / 2),
            ..Default::default()
        };
        now(self.guardrails.open(session, limits, None, i64::MAX)).unwrap();
        Principal {
            session_id: session.into(),
            agent: agent.into(),
            tenant: tenant.into(),
            depth: 0,
            expires_at: i64::MAX,
            parent: None,
            parent_agent: None,
            profile: None,
        }
    }
}

/// A rate that always admits (10⁹ per second, a second of burst), so what is measured is
/// the limiter's bookkeeping, never a refusal.
fn open_rate() -> Rate {
    Rate {
        count: 1_000_000_000,
        period: Duration::from_secs(1),
        burst: 1_000_000_000,
    }
}

fn tiers(agent: bool, tenant: bool) -> Tiers {
    let mut t = Tiers::default();
    t.read.rate_agent = agent.then(open_rate);
    t.read.rate_tenant = tenant.then(open_rate);
    t
}

fn event(args_hash: u64) -> Event<'static> {
    Event {
        key: TOOL,
        args_hash,
        tier_rank: 0,
        denied: false,
        held: false,
        repeat_max: 20,
        repeat_window: Duration::from_secs(60),
        at: Instant::now(),
    }
}

/// What the pipeline asks of the guardrails for one allowed read call, in its order.
/// `args_hash` differs per call unless the caller repeats it on purpose, so the watchdog
/// never trips.
fn one_request(g: &Guardrails, p: &Principal, tiers: &Tiers, args_hash: u64) {
    now(g.gate(p)).expect("not paused, no byte limit");
    now(g.admit_rate(p, "read", tiers)).expect("the rate always admits");
    std::hint::black_box(g.session_state(p));
    g.meter
        .charge_call(&p.session_id, 1_000)
        .expect("limits out of reach");
    g.meter.add_bytes(&p.session_id, 512, 4096);
    let trip = g.watchdog.observe(&p.session_id, event(args_hash));
    debug_assert!(trip.is_none());
    std::hint::black_box(trip);
}

/// Fill a session's watchdog trail with `TRAIL` events cycling over `distinct` calls.
fn fill_trail(g: &Guardrails, session: &str, distinct: u64) {
    for i in 0..TRAIL {
        assert!(g.watchdog.observe(session, event(i % distinct)).is_none());
    }
}

/// Work every request does without guardrails: the pipeline keeps a clone of the principal
/// for the audit record and hashes the session id for its maps (registry, in-flight).
fn floor(p: &Principal) {
    let p = std::hint::black_box(p).clone();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.session_id.hash(&mut h);
    std::hint::black_box((p, h.finish()));
}

const TOOLS: &str = r#"
[[tool]]
name = "github.list_issues"
tier = "read"
match = { host = "api.github.com", method = "GET", path = "/repos/{owner}/{repo}/issues" }
args_schema = { type = "object", required = ["owner", "repo"], properties = { owner = { type = "string", pattern = "^[A-Za-z0-9-]+$" }, repo = { type = "string", maxLength = 100 }, state = { type = "string", enum = ["open", "closed", "all"] }, per_page = { type = "string" } } }
"#;

/// The `read` tier's default checks on a typical read call (the `checks` bench's case).
struct ReadChecks {
    checks: Checks,
    catalog: Catalog,
    args: Value,
    metrics: Metrics,
}

impl ReadChecks {
    fn new() -> Self {
        let c = Self {
            checks: Checks::new(Tiers::default(), &config::Checks::default()).unwrap(),
            catalog: Catalog::parse("tools.toml", TOOLS, None).unwrap(),
            args: json!({"owner": "acme", "repo": "widgets", "state": "open", "per_page": "50"}),
            metrics: Metrics::default(),
        };
        c.run(); // compile the schema
        c
    }

    fn run(&self) {
        let subject = Subject {
            tier: "read",
            agent: "bench",
            tenant: "default",
            session: "ses_bench",
            host: "api.github.com",
            method: "GET",
            path: "/repos/acme/widgets/issues",
            tool: self.catalog.get(TOOL),
            args: Some(&self.args),
            records: 0,
            body: Some(b""),
            declared_len: None,
            detectors: None,
        };
        // No remote check in this tier: the future completes on its first poll.
        let report = futures_util::FutureExt::now_or_never(self.checks.run(subject, &self.metrics))
            .expect("local checks never wait");
        std::hint::black_box(report);
    }
}

/// `(group, name, one request of the case)`.
type Case<'a> = (&'static str, &'static str, Box<dyn FnMut() + 'a>);

/// Every single-threaded case, each a closure doing one request's worth of its work, so
/// criterion and the interleaved summary measure exactly the same thing.
struct Fixture {
    single: Rails,
    loaded: Rails,
    one: Principal,
    hot: Principal,
    many: Vec<Principal>,
    no_rate: Tiers,
    rated: Tiers,
    full_new: Principal,
    full_known: Principal,
    read_checks: ReadChecks,
    args: Value,
    /// Distinct argument hashes, one per call.
    counter: AtomicU64,
}

impl Fixture {
    fn new() -> Self {
        let single = Rails::new();
        let one = single.open("ses_one", "agent-one", "acme");
        let full_new = single.open("ses_full_new", "agent-full", "acme");
        let full_known = single.open("ses_full_known", "agent-full", "acme");
        fill_trail(&single.guardrails, &full_new.session_id, TRAIL);
        fill_trail(&single.guardrails, &full_known.session_id, KNOWN_CALLS);

        // 10,000 live sessions, each its own agent, each having made a few calls: every
        // session has an account, a watchdog trail and rate keys, as under load.
        let loaded = Rails::new();
        let rated = tiers(true, true);
        let many: Vec<Principal> = (0..LIVE_SESSIONS)
            .map(|i| loaded.open(&format!("ses_{i:05}"), &format!("agent-{i:05}"), "acme"))
            .collect();
        for (i, p) in many.iter().enumerate() {
            for k in 0..4 {
                one_request(&loaded.guardrails, p, &rated, (i * 4 + k) as u64);
            }
        }
        let hot = many[LIVE_SESSIONS / 2].clone();
        Self {
            single,
            loaded,
            one,
            hot,
            many,
            no_rate: tiers(false, false),
            rated,
            full_new,
            full_known,
            read_checks: ReadChecks::new(),
            args: json!({"owner": "acme", "repo": "widgets", "state": "open", "per_page": "50"}),
            // Above every hash the set-up used, so each call is new to the watchdog.
            counter: AtomicU64::new(1 << 40),
        }
    }

    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// The first two are the baselines.
    fn cases(&self) -> Vec<Case<'_>> {
        let g = &self.single.guardrails;
        let l = &self.loaded.guardrails;
        let mut round_robin = 0usize;
        let mut known = 0u64;
        vec![
            (
                "baseline",
                "principal_clone_hash",
                Box::new(move || floor(&self.one)),
            ),
            (
                "baseline",
                "read_tier_checks",
                Box::new(move || self.read_checks.run()),
            ),
            (
                "all_guardrails_one_request",
                "one_session_no_rate",
                Box::new(move || one_request(g, &self.one, &self.no_rate, self.next())),
            ),
            (
                "all_guardrails_one_request",
                "one_session_rated",
                Box::new(move || one_request(g, &self.one, &self.rated, self.next())),
            ),
            (
                "all_guardrails_one_request",
                "10k_sessions_one_hot_rated",
                Box::new(move || one_request(l, &self.hot, &self.rated, self.next())),
            ),
            (
                "all_guardrails_one_request",
                "10k_sessions_round_robin_rated",
                Box::new(move || {
                    round_robin = (round_robin + 1) % LIVE_SESSIONS;
                    one_request(l, &self.many[round_robin], &self.rated, self.next())
                }),
            ),
            (
                "guardrails_step",
                "gate",
                Box::new(move || now(g.gate(&self.one)).unwrap()),
            ),
            (
                "guardrails_step",
                "admit_rate_none",
                Box::new(move || now(g.admit_rate(&self.one, "read", &self.no_rate)).unwrap()),
            ),
            (
                "guardrails_step",
                "admit_rate_agent_and_tenant",
                Box::new(move || now(g.admit_rate(&self.one, "read", &self.rated)).unwrap()),
            ),
            (
                "guardrails_step",
                "session_state",
                Box::new(move || {
                    std::hint::black_box(g.session_state(&self.one));
                }),
            ),
            (
                "guardrails_step",
                "charge_call",
                Box::new(move || {
                    g.meter.charge_call(&self.one.session_id, 1_000).unwrap();
                }),
            ),
            (
                "guardrails_step",
                "add_bytes",
                Box::new(move || g.meter.add_bytes(&self.one.session_id, 512, 4096)),
            ),
            (
                "guardrails_step",
                "observe_full_trail_new_call",
                Box::new(move || {
                    let trip = g
                        .watchdog
                        .observe(&self.full_new.session_id, event(self.next()));
                    std::hint::black_box(trip);
                }),
            ),
            (
                "guardrails_step",
                "observe_full_trail_known_call",
                Box::new(move || {
                    known = (known + 1) % KNOWN_CALLS;
                    let trip = g
                        .watchdog
                        .observe(&self.full_known.session_id, event(known));
                    debug_assert!(trip.is_none());
                    std::hint::black_box(trip);
                }),
            ),
            (
                // Not one of the six calls, but the watchdog's input is made per request
                // (pipeline: `Seen::new` serialises the arguments to hash them).
                "guardrails_step",
                "seen_new_fingerprint",
                Box::new(move || {
                    std::hint::black_box(Seen::new(TOOL, &self.args, "read", None, true));
                }),
            ),
        ]
    }
}

/// What each thread of a threaded case does per request.
#[derive(Clone, Copy)]
enum Work {
    /// The floor: shares nothing (the control — what two cores give this machine).
    Floor,
    /// All six guardrail calls.
    All,
    /// `gate`, `session_state`, `charge_call`, `add_bytes`: the meter's and the pause
    /// map's process-wide `RwLock`s plus the session's own `Mutex`.
    Meter,
    /// `watchdog.observe` (16 sharded mutexes).
    Watchdog,
    /// `admit_rate` (16 sharded mutexes).
    Rate,
}

/// How the threads' requests relate.
#[derive(Clone, Copy)]
enum Sharing {
    /// Own session, own agent, per-agent rate only: no key in common.
    Distinct,
    /// Own session and agent, one tenant with a tenant rate: that key (and its shard's
    /// lock) is shared by design.
    SharedTenantRate,
    /// One session (one account lock, one trail, one rate key).
    SameSession,
}

fn work(w: Work, g: &Guardrails, p: &Principal, tiers: &Tiers, args_hash: u64) {
    match w {
        Work::Floor => floor(p),
        Work::All => one_request(g, p, tiers, args_hash),
        Work::Meter => {
            now(g.gate(p)).unwrap();
            std::hint::black_box(g.session_state(p));
            g.meter.charge_call(&p.session_id, 1_000).unwrap();
            g.meter.add_bytes(&p.session_id, 512, 4096);
        }
        Work::Watchdog => {
            std::hint::black_box(g.watchdog.observe(&p.session_id, event(args_hash)));
        }
        Work::Rate => now(g.admit_rate(p, "read", tiers)).unwrap(),
    }
}

/// `iters` requests on each of `threads` threads at once; the time of the slowest thread,
/// from a common start (thread spawning is not counted).
fn threaded(
    rails: &Rails,
    threads: usize,
    (w, sharing): (Work, Sharing),
    iters: u64,
    salt: u64,
) -> Duration {
    let g = &rails.guardrails;
    let rated = tiers(true, matches!(sharing, Sharing::SharedTenantRate));
    let principals: Vec<Principal> = (0..threads)
        .map(|t| {
            let t = if matches!(sharing, Sharing::SameSession) {
                0
            } else {
                t
            };
            rails.open(
                &format!("ses_thread_{t}"),
                &format!("agent-thread-{t}"),
                "acme",
            )
        })
        .collect();
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = principals
            .iter()
            .enumerate()
            .map(|(t, p)| {
                let (barrier, rated) = (&barrier, &rated);
                s.spawn(move || {
                    // Distinct hashes per thread and per sample: the watchdog never trips.
                    let base = salt.wrapping_mul(1 << 32) + ((t as u64) << 56);
                    barrier.wait();
                    let started = Instant::now();
                    for i in 0..iters {
                        work(w, g, p, rated, base + i);
                    }
                    started.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

/// Each is run on 1 and on 2 threads (the machine has 2 cores: more threads would measure
/// the scheduler, not the locks). 2 threads taking as long per request as 1 means the
/// sessions do not wait for each other; twice as long means they are serialized.
const THREAD_CASES: [(&str, (Work, Sharing)); 7] = [
    ("floor_control", (Work::Floor, Sharing::Distinct)),
    ("all_distinct_sessions", (Work::All, Sharing::Distinct)),
    (
        "all_distinct_sessions_shared_tenant_rate",
        (Work::All, Sharing::SharedTenantRate),
    ),
    ("all_same_session", (Work::All, Sharing::SameSession)),
    ("meter_distinct_sessions", (Work::Meter, Sharing::Distinct)),
    (
        "watchdog_distinct_sessions",
        (Work::Watchdog, Sharing::Distinct),
    ),
    ("rate_distinct_agents", (Work::Rate, Sharing::Distinct)),
];

fn bench(c: &mut Criterion) {
    let f = Fixture::new();
    let mut cases = f.cases();
    let mut groups: Vec<&str> = cases.iter().map(|(g, _, _)| *g).collect();
    groups.dedup();
    for name in groups {
        let mut group = c.benchmark_group(name);
        for (_, case, run) in cases.iter_mut().filter(|(g, _, _)| *g == name) {
            group.bench_function(*case, |b| b.iter(&mut *run));
        }
        group.finish();
    }

    // Two threads on two cores: the machine has no more, so more threads would measure
    // the scheduler, not the locks.
    let rails = Rails::new();
    let mut group = c.benchmark_group("guardrails_threads");
    let mut salt = 0;
    for (name, case) in THREAD_CASES {
        for threads in [1, 2] {
            group.bench_function(format!("{name}/{threads}"), |b| {
                b.iter_custom(|iters| {
                    salt += 1;
                    threaded(&rails, threads, case, iters, salt)
                })
            });
        }
    }
    group.finish();
}

fn p50(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// All cases interleaved, batch by batch, then per request: ns, × the floor, and the share
/// of the read tier's checks.
fn summary() {
    const ROUNDS: usize = 2_000;
    const BATCH: u32 = 64;
    let f = Fixture::new();
    let mut cases = f.cases();
    // Warm caches and grow the trails to full before anything is timed.
    for (_, _, run) in cases.iter_mut() {
        for _ in 0..TRAIL * 2 {
            run();
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (i, (_, _, run)) in cases.iter_mut().enumerate() {
            let started = Instant::now();
            for _ in 0..BATCH {
                run();
            }
            times[i].push(started.elapsed() / BATCH);
        }
    }
    let p50s: Vec<Duration> = times.iter_mut().map(|t| p50(t)).collect();
    let (floor, checks) = (p50s[0].as_secs_f64(), p50s[1].as_secs_f64());
    println!("\nguardrails summary (p50 per request, interleaved, {ROUNDS} rounds of {BATCH}):");
    println!(
        "  {:<58} {:>9}  {:>8}  {:>12}",
        "case", "ns", "× floor", "× read checks"
    );
    for ((group, name, _), p) in cases.iter().zip(&p50s) {
        let s = p.as_secs_f64();
        println!(
            "  {:<58} {:>9.1}  {:>8.2}  {:>12.3}",
            format!("{group}/{name}"),
            s * 1e9,
            s / floor,
            s / checks
        );
    }

    // Threads: the median of 7 samples of 200,000 requests per thread, on 1 then 2 threads.
    let rails = Rails::new();
    const PER_THREAD: u64 = 200_000;
    let mut salt = 1_000;
    let mut per_request = |threads: usize, case: (Work, Sharing)| {
        let mut samples: Vec<Duration> = (0..7)
            .map(|_| {
                salt += 1;
                threaded(&rails, threads, case, PER_THREAD, salt)
            })
            .collect();
        p50(&mut samples).as_secs_f64() / PER_THREAD as f64
    };
    println!("  threads: wall time per request per thread (median of 7 × {PER_THREAD}):");
    println!(
        "  {:<58} {:>9}  {:>9}  {:>8}  {:>12}",
        "case", "1 thr ns", "2 thr ns", "2 ÷ 1", "2 × floor"
    );
    for (name, case) in THREAD_CASES {
        let (one, two) = (per_request(1, case), per_request(2, case));
        println!(
            "  {:<58} {:>9.1}  {:>9.1}  {:>8.2}  {:>12.2}",
            format!("guardrails_threads/{name}"),
            one * 1e9,
            two * 1e9,
            two / one,
            two / floor
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
