//! Cost of deciding on unambiguous input (issue 13, item 2): the strict JSON parser against
//! serde_json's own `Value` parser on the same bodies, and the path normaliser against passing
//! the path through, measured in one run so the ratio is what to read. And the watch over a
//! streamed POST to a host that serves tools (`method_override`): its form and part readers
//! over 1 MiB, against copying the same 1 MiB once.

use ostiary::method_override::Reader;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::{json, Value};

/// A typical REST tool body (~1 KiB) and a JSON-RPC batch of 64 `tools/call`s (~10 KiB).
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let tool = json!({
        "title": "Bump the parser",
        "body": "x".repeat(800),
        "labels": ["bug", "security", "parser"],
        "assignees": ["alice", "bob"],
        "milestone": 7,
        "meta": {"source": "agent", "run": "r_123", "attempt": 2},
    });
    let batch: Vec<Value> = (0..64)
        .map(|i| {
            json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                   "params": {"name": "read_file", "arguments": {"path": format!("/notes/{i}.txt")}}})
        })
        .collect();
    vec![
        ("tool_body_1k", serde_json::to_vec(&tool).unwrap()),
        ("jsonrpc_batch_64", serde_json::to_vec(&batch).unwrap()),
    ]
}

fn json_parsers(c: &mut Criterion) {
    let mut group = c.benchmark_group("json");
    for (name, body) in bodies() {
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("serde_json", name), &body, |b, body| {
            b.iter(|| serde_json::from_slice::<Value>(std::hint::black_box(body)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("strict", name), &body, |b, body| {
            b.iter(|| ostiary::strict_json::parse(std::hint::black_box(body)).unwrap())
        });
    }
    group.finish();
}

fn paths(c: &mut Criterion) {
    let mut group = c.benchmark_group("path");
    for (name, path) in [
        ("plain", "/repos/acme/widgets/issues/1234/comments"),
        (
            "escaped",
            "/repos/acme/wid%67ets/issues/%31234/comments%2Fx",
        ),
    ] {
        group.bench_function(BenchmarkId::new("normalize", name), |b| {
            b.iter(|| ostiary::path_forms::normalize(std::hint::black_box(path)).len())
        });
        group.bench_function(BenchmarkId::new("routed", name), |b| {
            b.iter(|| ostiary::path_forms::routed(std::hint::black_box(path)))
        });
    }
    group.finish();
}

/// 1 MiB of bytes no text would hold (a file upload's), deterministic.
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn method_override(c: &mut Criterion) {
    const MIB: usize = 1 << 20;
    let upload = noise(MIB);
    let form: Vec<u8> = (0..)
        .flat_map(|i| format!("field{i}={}&", "v".repeat(100)).into_bytes())
        .take(MIB)
        .collect();
    let mut multipart = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; \
        filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        .to_vec();
    multipart.extend_from_slice(&upload);
    multipart.extend_from_slice(b"\r\n--XyZ--\r\n");
    let mut group = c.benchmark_group("method_override");
    group.throughput(Throughput::Bytes(MIB as u64));
    for (name, body) in [("upload", &upload), ("form", &form)] {
        group.bench_with_input(BenchmarkId::new("copy", name), body, |b, body| {
            b.iter(|| std::hint::black_box(body).to_vec())
        });
        group.bench_with_input(BenchmarkId::new("untyped", name), body, |b, body| {
            b.iter(|| ostiary::method_override::FormKeys::name_override(std::hint::black_box(body)))
        });
    }
    group.bench_with_input(
        BenchmarkId::new("multipart", "upload"),
        &multipart,
        |b, body| {
            b.iter(|| {
                let mut parts = ostiary::method_override::PartNames::default();
                for chunk in std::hint::black_box(body).chunks(16 * 1024) {
                    parts.push(chunk);
                }
                parts.finish()
            })
        },
    );
    group.finish();
}

criterion_group!(benches, json_parsers, paths, method_override);
criterion_main!(benches);
