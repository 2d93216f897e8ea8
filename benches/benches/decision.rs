//! Cedar decision latency as the policy set grows (10 → 100 → 1,000 host permits), measured
//! in one run so the figures are ratios against the 10-policy baseline. Criterion gives the
//! typical time; a plain loop over 100,000 decisions per set gives the p50/p99 that the
//! performance targets are written in. The same loop runs over sets of per-path
//! (`context.path == "/pN"`), per-prefix (`like "/pN/*"`), per-tool (`resource ==
//! Tool::"tN"`) and per-argument (`context.args.repo == "rN"`) permits, which name no host
//! or tool in their scope, at 10 / 100 / 1,000 / 10,000, indexed (sliced on their leading
//! condition) and unindexed.

use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion};
use ostiary_benches::{
    argument_request, engine_with_arguments, engine_with_hosts, engine_with_paths,
    engine_with_prefixes, engine_with_tool_names, path_request, request, tool_request,
};

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for n in [10usize, 100, 1000] {
        let engine = engine_with_hosts(n);
        let allowed = request(n / 2);
        let denied = request(n + 1);
        group.bench_with_input(BenchmarkId::new("allow", n), &n, |b, _| {
            b.iter(|| engine.decide(std::hint::black_box(&allowed)))
        });
        group.bench_with_input(BenchmarkId::new("default_deny", n), &n, |b, _| {
            b.iter(|| engine.decide(std::hint::black_box(&denied)))
        });
    }
    group.finish();
}

/// p50 and p99 of single decisions, alternating allowed and denied hosts.
fn percentiles() {
    const ROUNDS: usize = 100_000;
    let mut p50s = Vec::new();
    for n in [10usize, 1000] {
        let engine = engine_with_hosts(n);
        let requests: Vec<_> = (0..64)
            .map(|i| request((i * 7919) % (n + n / 4 + 1)))
            .collect();
        let mut times: Vec<Duration> = Vec::with_capacity(ROUNDS);
        for i in 0..ROUNDS {
            let started = Instant::now();
            std::hint::black_box(engine.decide(&requests[i % requests.len()]));
            times.push(started.elapsed());
        }
        times.sort();
        let p50 = times[ROUNDS / 2];
        let p99 = times[ROUNDS * 99 / 100];
        println!("decision percentiles, {n:>4} policies: p50 {p50:?}  p99 {p99:?}");
        p50s.push(p50);
    }
    println!(
        "p50 at 1,000 policies / p50 at 10 policies: {:.2}x",
        p50s[1].as_secs_f64() / p50s[0].as_secs_f64()
    );
    // Per-path permits and per-prefix permits, no host in the scope (`when { context.path
    // == "/pN" }`, `like "/pN/*"`): sliced on the leading condition, unindexed for contrast.
    const ALL: &[usize] = &[10, 100, 1000, 10_000];
    literal_shapes("per-path", ALL, engine_with_paths, path_request);
    literal_shapes("per-prefix", ALL, engine_with_prefixes, |i| {
        let mut req = path_request(i);
        if let ostiary_policies::Action::Http { path, .. } = &mut req.action {
            path.push_str("/items");
        }
        req
    });
    // Per-tool permits conditioned on the tool (`resource == Tool::"tN"`) and per-value
    // permits of one tool (`context.args.repo == "rN"`): sliced on the condition.
    // Per-tool stops at 1,000 (see `CATALOG_TOOLS`).
    literal_shapes("per-tool", &ALL[..3], engine_with_tool_names, tool_request);
    literal_shapes("per-argument", ALL, engine_with_arguments, argument_request);
}

/// p50/p99 of `shape` policy sets of 10 and 1,000, indexed and not, and the indexed ratio.
fn literal_shapes(
    shape: &str,
    sizes: &[usize],
    engine_with: fn(usize) -> ostiary_policies::PolicyEngine,
    request_for: impl Fn(usize) -> ostiary_policies::AccessRequest,
) {
    const ROUNDS: usize = 10_000;
    let mut p50s = Vec::new();
    for &n in sizes {
        let engine = engine_with(n);
        let requests: Vec<_> = (0..64)
            .map(|i| request_for((i * 7919) % (n + n / 4 + 1)))
            .collect();
        for indexed in [true, false] {
            // The full set at 10,000 takes milliseconds a decision: fewer rounds.
            let rounds = if indexed {
                ROUNDS
            } else {
                (ROUNDS * 100 / n).clamp(200, ROUNDS)
            };
            let mut times: Vec<Duration> = Vec::with_capacity(rounds);
            for i in 0..rounds {
                let req = &requests[i % requests.len()];
                let started = Instant::now();
                if indexed {
                    std::hint::black_box(engine.decide(req));
                } else {
                    std::hint::black_box(engine.decide_unindexed(req));
                }
                times.push(started.elapsed());
            }
            times.sort();
            let (p50, p99) = (times[rounds / 2], times[rounds * 99 / 100]);
            let how = if indexed { "indexed" } else { "unindexed" };
            println!("{shape} permits, {n:>4} policies, {how:>9}: p50 {p50:?}  p99 {p99:?}");
            if indexed {
                p50s.push(p50);
            }
        }
    }
    for (n, p50) in sizes.iter().zip(&p50s).skip(1) {
        println!(
            "{shape} permits, indexed: p50 at {n} / p50 at 10: {:.2}x",
            p50.as_secs_f64() / p50s[0].as_secs_f64()
        );
    }
}

/// What keeping a decision for replay and the shadow set costs, against the decision itself
/// (a tool call with arguments, 100 per-argument permits): on the request path the kept JSON
/// (`recorded::to_json`, its argument strings scanned by the DLP detectors); on the shadow's
/// own thread reading it back and deciding it again.
fn keeping() {
    const ROUNDS: usize = 20_000;
    let engine = engine_with_arguments(100);
    let detectors = ostiary::check::dlp::Detectors::default_set();
    let secret = |s: &str| detectors.scan(s.as_bytes()).is_some();
    let requests: Vec<_> = (0..64).map(|i| argument_request(i % 100)).collect();
    let p50 = |mut times: Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (mut decide, mut keep, mut shadow) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let req = &requests[i % requests.len()];
        let started = Instant::now();
        let decision = std::hint::black_box(engine.decide(req));
        decide.push(started.elapsed());
        let started = Instant::now();
        let kept =
            std::hint::black_box(ostiary_policies::recorded::to_json(req, &decision, &secret));
        keep.push(started.elapsed());
        let started = Instant::now();
        let back = ostiary_policies::recorded::from_json(&kept.to_value())
            .expect("kept decisions read back");
        std::hint::black_box(engine.decide(&back.request));
        shadow.push(started.elapsed());
    }
    let (decide, keep, shadow) = (p50(decide), p50(keep), p50(shadow));
    println!(
        "keeping a decision: p50 decide {decide:?}, keep {keep:?} ({:.2}x the decision, on the \
         request path), shadow re-decision {shadow:?} ({:.2}x, on the shadow's thread)",
        keep.as_secs_f64() / decide.as_secs_f64(),
        shadow.as_secs_f64() / decide.as_secs_f64()
    );
}

criterion_group!(benches, decision);

fn main() {
    keeping();
    percentiles();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
