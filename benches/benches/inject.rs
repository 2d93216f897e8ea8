//! Cost of credential injection from a warm cache: the same request prepared for upstream
//! with and without a bound credential, in one run, so the figure is a difference (and a
//! ratio) against the plain preparation measured alongside it. The target: ≤ 5 µs
//! p50 added per request. Also the cost of the session-wide response scrubber (issue 13,
//! item 5): a request to an unbound host from a session that holds a secret (the cached
//! session scrubber is looked up, and the request asks for an identity-encoded whole
//! answer), against the same request from a session that holds none (the baseline).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use ostiary::body;
use ostiary::classify::Target;
use ostiary::egress::address::normalize_host;
use ostiary::inject::{self, credentials::Bound, credentials::Credentials};
use ostiary::metrics::Metrics;
use ostiary::session::Principal;
use ostiary_benches::principal;
use ostiary_broker::{Binding, Broker};

struct Fixture {
    credentials: Credentials,
    metrics: Metrics,
    principal: Principal,
    /// A session that never fetched a credential.
    fresh: Principal,
    bound: Target,
    unbound: Target,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets.toml");
    std::fs::write(
        &file,
        "github = \"ghp_bench_0123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    let binding: Binding = toml::from_str(
        "name = \"github\"\nsource = { file = \"github\" }\nhosts = [\"api.github.com\"]\n\
         inject = { header = \"Authorization\", value = \"Bearer {secret}\" }",
    )
    .unwrap();
    let broker = Broker::new(vec![binding], Some(file), None).unwrap();
    let target = |host: &str| Target {
        scheme: "https",
        host: normalize_host(host).unwrap(),
        port: 443,
        method: http::Method::POST,
        path: "/repos/o/r/issues".into(),
        query: "per_page=10".into(),
    };
    let metrics = Metrics::default();
    Fixture {
        credentials: Credentials::new(Arc::new(broker), &metrics),
        metrics,
        principal: principal("s-bench"),
        fresh: principal("s-bench-fresh"),
        bound: target("api.github.com"),
        unbound: target("api.example.com"),
        _dir: dir,
    }
}

fn request() -> http::Request<body::ProxyBody> {
    http::Request::builder()
        .method("POST")
        .uri("/repos/o/r/issues?per_page=10")
        .header("host", "api.github.com")
        .header("user-agent", "bench/1.0")
        .header("accept", "application/json")
        .header("content-type", "application/json")
        .header("authorization", "Bearer ostiary:github")
        .body(body::empty())
        .unwrap()
}

/// Prepare (and inject, when `target` is bound) one request of `principal`'s session.
async fn once_as(f: &Fixture, principal: &Principal, target: &Target) {
    let req = inject::prepare(request(), target, false).unwrap();
    let (mut parts, _body) = req.into_parts();
    // Towards the unbound host the placeholder is refused: the scan's cost counts all
    // the same.
    let refused = f.credentials.placeholders(
        &parts.headers,
        &parts.uri,
        None,
        &target.host.to_string(),
        principal,
        &f.metrics,
    );
    let injected = f
        .credentials
        .apply(
            &mut parts,
            Bound {
                target,
                principal,
                tool: None,
                upgrade: false,
                scope: None,
            },
            &f.metrics,
        )
        .await
        .unwrap();
    std::hint::black_box((parts, injected, refused.is_err()));
}

/// One request of the session that holds the credential.
async fn once(f: &Fixture, target: &Target) {
    once_as(f, &f.principal, target).await
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let f = fixture();
    rt.block_on(once(&f, &f.bound)); // warm the cache and the scrubber
    let mut group = c.benchmark_group("inject");
    group.bench_function("unbound_host_baseline", |b| {
        b.iter(|| rt.block_on(once_as(&f, &f.fresh, &f.unbound)))
    });
    group.bench_function("unbound_host_session_with_secret", |b| {
        b.iter(|| rt.block_on(once(&f, &f.unbound)))
    });
    group.bench_function("bound_host_warm_cache", |b| {
        b.iter(|| rt.block_on(once(&f, &f.bound)))
    });
    group.finish();
}

/// p50 of single requests, both kinds interleaved so machine noise hits them alike.
fn percentiles() {
    const ROUNDS: usize = 50_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let f = fixture();
    rt.block_on(once(&f, &f.bound));
    let mut plain: Vec<Duration> = Vec::with_capacity(ROUNDS);
    let mut holding: Vec<Duration> = Vec::with_capacity(ROUNDS);
    let mut injected: Vec<Duration> = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        rt.block_on(once_as(&f, &f.fresh, &f.unbound));
        plain.push(started.elapsed());
        let started = Instant::now();
        rt.block_on(once(&f, &f.unbound));
        holding.push(started.elapsed());
        let started = Instant::now();
        rt.block_on(once(&f, &f.bound));
        injected.push(started.elapsed());
    }
    plain.sort();
    holding.sort();
    injected.sort();
    let (p, h, i) = (plain[ROUNDS / 2], holding[ROUNDS / 2], injected[ROUNDS / 2]);
    println!(
        "inject p50: baseline (unbound host) {p:?}, warm-cache injection {i:?}, added {:?} ({:.2}x)",
        i.saturating_sub(p),
        i.as_secs_f64() / p.as_secs_f64()
    );
    println!(
        "inject p50: unbound host, session holding a secret {h:?}, added {:?} ({:.2}x)",
        h.saturating_sub(p),
        h.as_secs_f64() / p.as_secs_f64()
    );
}

criterion_group!(benches, bench);

fn main() {
    percentiles();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
