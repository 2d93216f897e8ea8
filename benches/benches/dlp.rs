//! DLP scanning cost (issue 6: ≥ 500 MB/s per core on 1 MiB bodies with the default set):
//! a 1 MiB JSON-ish body without findings scanned whole, streamed through the scanner in
//! 16 KiB chunks, and streamed through `DlpBody`; a 1 KiB body's scan time; and building
//! the detectors; the same body streamed with 100 literal values (whose fixed hold-back
//! window is rescanned with every chunk), in 16 KiB and 256-byte chunks. A plain timing
//! loop first prints the figures; Criterion then gives its own estimates.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, Criterion, Throughput};
use hyper::body::{Body, Frame};
use ostiary::body::{BoxError, ProxyBody};
use ostiary::check::dlp::{Detectors, DlpBody, StreamScanner};

const CHUNK: usize = 16 * 1024;
const MIB: usize = 1024 * 1024;

/// JSON-ish text of `len` bytes: ids, names, timestamps, a base64 field, prose — the
/// digits and letters the detectors' anchors and card probe meet in real bodies.
fn body(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 256);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{{\"id\":{i},\"name\":\"item-{i}\",\"state\":\"open\",\"n\":{},\
                 \"ts\":{},\"sha\":\"{:040x}\",\"blob\":\"ZXhhbXBsZSBkYXRhIGZvciB0aGUgYmVuY2g=\",\
                 \"note\":\"the quick brown fox jumps over the lazy dog - see 1234 5678\"}}\n",
                i * 7919,
                1_732_950_000_000u64 + i,
                u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834)
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    Bytes::from(out)
}

fn chunks(body: &Bytes) -> VecDeque<Bytes> {
    (0..body.len())
        .step_by(CHUNK)
        .map(|at| body.slice(at..(at + CHUNK).min(body.len())))
        .collect()
}

fn whole(d: &Detectors, body: &Bytes) -> usize {
    assert!(d.scan(body).is_none());
    body.len()
}

fn streamed(d: &Arc<Detectors>, body: &Bytes) -> usize {
    streamed_in(d, body, CHUNK)
}

fn streamed_in(d: &Arc<Detectors>, body: &Bytes, size: usize) -> usize {
    let mut s = StreamScanner::new(d.clone());
    let mut n = 0;
    let pieces = (0..body.len())
        .step_by(size)
        .map(|at| body.slice(at..(at + size).min(body.len())));
    for c in pieces {
        n += s.push(c).expect("no finding").len();
    }
    n + s.finish().expect("no finding").len()
}

/// A body whose frames are all ready.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

fn drain(mut body: ProxyBody) -> usize {
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => n += frame.data_ref().map_or(0, Bytes::len),
            Poll::Ready(None) => return n,
            Poll::Ready(Some(Err(e))) => panic!("{e}"),
            Poll::Pending => unreachable!("frames are always ready"),
        }
    }
}

fn passthrough(body: &Bytes) -> usize {
    drain(ostiary::body::stream(Frames(chunks(body))))
}

fn dlp_body(d: &Arc<Detectors>, body: &Bytes) -> usize {
    let (b, _) = DlpBody::new(ostiary::body::stream(Frames(chunks(body))), d.clone());
    drain(b)
}

/// Median time of `f` over `rounds` runs.
fn median(rounds: usize, mut f: impl FnMut() -> usize) -> Duration {
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(f());
            started.elapsed()
        })
        .collect();
    times.sort();
    times[rounds / 2]
}

fn figures(d: &Arc<Detectors>) {
    let big = body(MIB);
    assert_eq!(streamed(d, &big), big.len());
    assert_eq!(dlp_body(d, &big), big.len());
    let mbps = |t: Duration| MIB as f64 / t.as_secs_f64() / 1e6;
    let w = median(200, || whole(d, &big));
    let s = median(200, || streamed(d, &big));
    let b = median(200, || dlp_body(d, &big));
    let p = median(200, || passthrough(&big));
    println!(
        "dlp 1 MiB, no finding: whole-buffer scan {:.0} MB/s, StreamScanner 16 KiB chunks \
         {:.0} MB/s, DlpBody {:.0} MB/s (pass-through body {:.0} MB/s)",
        mbps(w),
        mbps(s),
        mbps(b),
        mbps(p)
    );
    let small = body(1024);
    let t = median(100_000, || whole(d, &small));
    println!("dlp 1 KiB body scan: {t:?}");
    let started = Instant::now();
    let built = Detectors::default_set();
    println!("building the default set: {:?}", started.elapsed());
    let literals = (0..100)
        .map(|i| {
            (
                format!("cred{i}"),
                format!("broker-secret-value-{i:04}").into_bytes(),
            )
        })
        .collect();
    let started = Instant::now();
    let with = Arc::new(Detectors::with_literals(&built, literals));
    println!("adding 100 literal values: {:?}", started.elapsed());
    let w = median(200, || whole(&with, &big));
    let s = median(200, || streamed(&with, &big));
    let t = median(20, || streamed_in(&with, &big, 256));
    let t0 = median(20, || streamed_in(d, &big, 256));
    println!(
        "dlp 1 MiB with 100 literal values: whole {:.0} MB/s, StreamScanner 16 KiB chunks \
         {:.0} MB/s, 256-byte chunks {:.0} MB/s (default set alone, 256-byte chunks {:.0} MB/s)",
        mbps(w),
        mbps(s),
        mbps(t),
        mbps(t0)
    );
}

fn literal_set(base: &Detectors) -> Arc<Detectors> {
    let literals = (0..100)
        .map(|i| {
            (
                format!("cred{i}"),
                format!("broker-secret-value-{i:04}").into_bytes(),
            )
        })
        .collect();
    Arc::new(Detectors::with_literals(base, literals))
}

fn bench(c: &mut Criterion) {
    let d = Arc::new(Detectors::default_set());
    let big = body(MIB);
    let mut group = c.benchmark_group("dlp_1mib");
    group.throughput(Throughput::Bytes(MIB as u64));
    group.bench_function("whole", |b| b.iter(|| whole(&d, &big)));
    group.bench_function("stream_16k", |b| b.iter(|| streamed(&d, &big)));
    group.bench_function("dlp_body_16k", |b| b.iter(|| dlp_body(&d, &big)));
    let with = literal_set(&d);
    group.bench_function("literals_stream_16k", |b| b.iter(|| streamed(&with, &big)));
    group.bench_function("literals_stream_256", |b| {
        b.iter(|| streamed_in(&with, &big, 256))
    });
    group.finish();
    let small = body(1024);
    let mut group = c.benchmark_group("dlp_1kib");
    group.throughput(Throughput::Bytes(1024));
    group.bench_function("whole", |b| b.iter(|| whole(&d, &small)));
    group.finish();
}

criterion_group!(benches, bench);

fn main() {
    figures(&Arc::new(Detectors::default_set()));
    benches();
    Criterion::default().configure_from_args().final_summary();
}
