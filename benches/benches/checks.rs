//! Cost of the `read` tier's checks (`limits`, `args_schema`) on a typical read tool call,
//! against the same call through a tier with no checks, in one run: the issue's target is
//! ≤ 20 µs p50 added. Both are measured interleaved so machine noise hits them alike.

use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use ostiary::check::{Checks, Subject};
use ostiary::config;
use ostiary::metrics::Metrics;
use ostiary_policies::Catalog;
use serde_json::{json, Value};

const TOOLS: &str = r#"
[[tool]]
name = "github.list_issues"
tier = "read"
match = { host = "api.github.com", method = "GET", path = "/repos/{owner}/{repo}/issues" }
args_schema = { type = "object", required = ["owner", "repo"], properties = { owner = { type = "string", pattern = "^[A-Za-z0-9-]+$" }, repo = { type = "string", maxLength = 100 }, state = { type = "string", enum = ["open", "closed", "all"] }, per_page = { type = "string" } } }
"#;

struct Fixture {
    with_checks: Checks,
    without: Checks,
    catalog: Catalog,
    args: Value,
    metrics: Metrics,
}

fn fixture() -> Fixture {
    let defaults = config::Tiers::default();
    let mut bare = config::Tiers::default();
    bare.read.checks.clear();
    Fixture {
        with_checks: Checks::new(defaults, &config::Checks::default()).unwrap(),
        without: Checks::new(bare, &config::Checks::default()).unwrap(),
        catalog: Catalog::parse("tools.toml", TOOLS, None).unwrap(),
        args: json!({"owner": "acme", "repo": "widgets", "state": "open", "per_page": "50"}),
        metrics: Metrics::default(),
    }
}

fn once(f: &Fixture, checks: &Checks) {
    let subject = Subject {
        tier: "read",
        agent: "bench",
        tenant: "default",
        session: "ses_bench",
        host: "api.github.com",
        method: "GET",
        path: "/repos/acme/widgets/issues",
        tool: f.catalog.get("github.list_issues"),
        args: Some(&f.args),
        records: 0,
        body: Some(b""),
        declared_len: None,
        detectors: None,
    };
    // No remote check in this tier: the future completes on its first poll.
    let report = futures_util::FutureExt::now_or_never(checks.run(subject, &f.metrics))
        .expect("local checks never wait");
    std::hint::black_box(report);
}

fn bench(c: &mut Criterion) {
    let f = fixture();
    once(&f, &f.with_checks); // compile the schema
    let mut group = c.benchmark_group("checks");
    group.bench_function("read_tier_no_checks_baseline", |b| {
        b.iter(|| once(&f, &f.without))
    });
    group.bench_function("read_tier_default_checks", |b| {
        b.iter(|| once(&f, &f.with_checks))
    });
    group.finish();
}

fn percentiles() {
    const ROUNDS: usize = 100_000;
    let f = fixture();
    once(&f, &f.with_checks);
    let (mut base, mut checked): (Vec<Duration>, Vec<Duration>) =
        (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        let t = Instant::now();
        once(&f, &f.without);
        base.push(t.elapsed());
        let t = Instant::now();
        once(&f, &f.with_checks);
        checked.push(t.elapsed());
    }
    base.sort();
    checked.sort();
    let (b, c) = (base[ROUNDS / 2], checked[ROUNDS / 2]);
    println!(
        "read tier p50: no checks {b:?}, limits + args_schema {c:?}, added {:?} (p90 added {:?})",
        c.saturating_sub(b),
        checked[ROUNDS * 9 / 10].saturating_sub(base[ROUNDS * 9 / 10])
    );
}

criterion_group!(benches, bench);

fn main() {
    percentiles();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
