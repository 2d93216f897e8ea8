//! Cedar decision latency as the policy set grows (10 → 100 → 1,000 host permits), measured
//! in one run so the figures are ratios against the 10-policy baseline.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ostiary_benches::{engine_with_hosts, request};

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

criterion_group!(benches, decision);
criterion_main!(benches);
