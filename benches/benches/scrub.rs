//! Response scrubbing cost, against a plain pass-through of the same body measured in the
//! same run: throughput on a 1 MiB body (no secret, and a secret every 4 KiB) streamed in
//! 16 KiB frames, and the per-response overhead on a 1 KiB body (headers scrubbed, body
//! wrapped, scanned). Two more bodies stress what a streaming scrubber pays for: text full
//! of JSON, HTML and URL escapes (the scrubber looks through them for encoded secrets), and
//! the clean body in 256-byte frames (an SSE-like trickle, where a held-back tail is
//! rescanned with every frame). A plain timing loop first prints the figures and ratios;
//! Criterion then gives its own estimates.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, Criterion, Throughput};
use hyper::body::{Body, Frame};
use hyper::Response;
use ostiary::body::{BoxError, ProxyBody};
use ostiary::scrub::{scrub_response, Scrubber};

const SECRET: &str = "ghp_R2d2C3poBb8Lk4Zq9Xw7Vn5Mt1Hs6Jf0Ya3e";
const FRAME: usize = 16 * 1024;

/// A body whose frames are all ready (the upstream's bytes already read).
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

/// JSON-ish text of `len` bytes, with `SECRET` every `every` bytes when given.
fn body(len: usize, every: Option<usize>) -> Bytes {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    let mut next_secret = every.unwrap_or(usize::MAX);
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{{\"id\":{i},\"name\":\"item-{i}\",\"state\":\"open\",\"n\":{}}}\n",
                i * 7919
            )
            .as_bytes(),
        );
        i += 1;
        if out.len() >= next_secret {
            out.extend_from_slice(SECRET.as_bytes());
            next_secret += every.unwrap_or(0);
        }
    }
    out.truncate(len);
    Bytes::from(out)
}

/// JSON-ish text of `len` bytes whose strings carry escapes of every family the scrubber
/// decodes: JSON `\"` and `\uXXXX`, `\/`, HTML entities, percent-encoding.
fn escaped_body(len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 256);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "{{\"id\":{i},\"msg\":\"a \\\"quoted\\\" word \\u00e9t\\u00e9 \\u003cb\\u003e\",\
                 \"html\":\"Tom &amp; Jerry &lt;3 &#39;{i}&#x27;\",\
                 \"url\":\"https:\\/\\/x.test\\/p?q=a%20b%2Bc&n={i}\"}}\n"
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    Bytes::from(out)
}

fn response(body: &Bytes) -> Response<Frames> {
    response_in(body, FRAME)
}

fn response_in(body: &Bytes, frame: usize) -> Response<Frames> {
    let frames = (0..body.len())
        .step_by(frame)
        .map(|at| body.slice(at..(at + frame).min(body.len())))
        .collect();
    let mut r = Response::new(Frames(frames));
    let h = r.headers_mut();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("content-length", body.len().to_string().parse().unwrap());
    h.insert("date", "Mon, 30 Nov 2026 06:00:00 GMT".parse().unwrap());
    h.insert("server", "upstream/1.0".parse().unwrap());
    h.insert(
        "x-request-id",
        "0f8e2c1a-6b7d-4e3f-9a8b-1c2d3e4f5a6b".parse().unwrap(),
    );
    h.insert("cache-control", "no-store".parse().unwrap());
    h.insert(
        "etag",
        "\"33a64df551425fcc55e4d42a148795d9f25f89d4\""
            .parse()
            .unwrap(),
    );
    h.insert("vary", "accept-encoding".parse().unwrap());
    r
}

/// Read a body whose frames are always ready; the bytes seen.
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
    drain(ostiary::body::stream(response(body).into_body()))
}

fn scrubbed(scrubber: &Scrubber, body: &Bytes) -> usize {
    let r = scrub_response(scrubber, response(body)).expect("identity answers scrub");
    drain(r.into_body())
}

fn passthrough_in(body: &Bytes, frame: usize) -> usize {
    drain(ostiary::body::stream(response_in(body, frame).into_body()))
}

fn scrubbed_in(scrubber: &Scrubber, body: &Bytes, frame: usize) -> usize {
    let r = scrub_response(scrubber, response_in(body, frame)).expect("identity answers scrub");
    drain(r.into_body())
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

fn figures(scrubber: &Scrubber) {
    let mib = 1024 * 1024;
    let clean = body(mib, None);
    let dirty = body(mib, Some(4096));
    assert_eq!(scrubbed(scrubber, &clean), clean.len());
    assert!(
        scrubbed(scrubber, &dirty) < dirty.len(),
        "the secrets were found"
    );
    let mbps = |d: Duration| mib as f64 / d.as_secs_f64() / 1e6;
    let base = median(200, || passthrough(&clean));
    let none = median(200, || scrubbed(scrubber, &clean));
    let some = median(200, || scrubbed(scrubber, &dirty));
    println!(
        "scrub 1 MiB ({} patterns, max {} bytes): pass-through {:.0} MB/s, no match {:.0} MB/s \
         ({:.2}x the pass-through time), 256 matches {:.0} MB/s ({:.2}x)",
        scrubber.pattern_count(),
        scrubber.max_pattern_len(),
        mbps(base),
        mbps(none),
        none.as_secs_f64() / base.as_secs_f64(),
        mbps(some),
        some.as_secs_f64() / base.as_secs_f64(),
    );
    let escaped = escaped_body(mib);
    assert_eq!(scrubbed(scrubber, &escaped), escaped.len());
    let esc = median(200, || scrubbed(scrubber, &escaped));
    let base_small_frames = median(50, || passthrough_in(&clean, 256));
    let small_frames = median(50, || scrubbed_in(scrubber, &clean, 256));
    println!(
        "scrub 1 MiB full of escapes: {:.0} MB/s ({:.2}x the pass-through time); \
         clean 1 MiB in 256-byte frames: pass-through {:.0} MB/s, scrubbed {:.0} MB/s ({:.2}x)",
        mbps(esc),
        esc.as_secs_f64() / base.as_secs_f64(),
        mbps(base_small_frames),
        mbps(small_frames),
        small_frames.as_secs_f64() / base_small_frames.as_secs_f64(),
    );
    let small = body(1024, None);
    let base = median(100_000, || passthrough(&small));
    let scrub = median(100_000, || scrubbed(scrubber, &small));
    println!(
        "scrub 1 KiB response: pass-through {base:?}, scrubbed {scrub:?}: overhead {:?} \
         ({:.2}x the pass-through time)",
        scrub.saturating_sub(base),
        scrub.as_secs_f64() / base.as_secs_f64(),
    );
    println!(
        "scrub streaming hold-back: {} bytes ({}-byte secret)",
        scrubber.hold_back(),
        SECRET.len()
    );
    let started = Instant::now();
    let built = Scrubber::new([SECRET, "bench-user:bench-password"]);
    println!(
        "building a scrubber (2 secrets, {} patterns): {:?}",
        built.pattern_count(),
        started.elapsed()
    );
}

/// What a set of many secrets costs: compiling it as one scrubber against shards of 8
/// (`inject::known`), and scanning 1 MiB with each, against one secret's scan.
fn many_secrets_figures() {
    let secrets: Vec<String> = (0..64u128)
        .map(|i| {
            format!(
                "ghp_{:036x}",
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            )
        })
        .collect();
    let values = |n: usize| secrets[..n].iter().map(String::as_str);
    for n in [1, 8, 64] {
        let started = Instant::now();
        let one = Scrubber::new(values(n));
        println!(
            "building a scrubber of {n} secrets ({} patterns): {:?}",
            one.pattern_count(),
            started.elapsed()
        );
    }
    let mib = 1024 * 1024;
    let clean = body(mib, None);
    let one_secret = Scrubber::new(values(1));
    let whole = Scrubber::new(values(64));
    let shards: Vec<Scrubber> = secrets
        .chunks(8)
        .map(|c| Scrubber::new(c.iter().map(String::as_str)))
        .collect();
    let joined = Scrubber::join(&shards);
    let base = median(50, || scrubbed(&one_secret, &clean));
    let one = median(50, || scrubbed(&whole, &clean));
    let eight = median(50, || scrubbed(&joined, &clean));
    let small = body(1024, None);
    let base_small = median(20_000, || scrubbed(&one_secret, &small));
    let eight_small = median(20_000, || scrubbed(&joined, &small));
    println!(
        "scrub 1 MiB, no match: 1 secret {base:?}; 64 secrets as one scrubber {one:?} ({:.2}x),          as 8 shards of 8 {eight:?} ({:.2}x); 1 KiB: 1 secret {base_small:?}, 8 shards          {eight_small:?} ({:.2}x)",
        one.as_secs_f64() / base.as_secs_f64(),
        eight.as_secs_f64() / base.as_secs_f64(),
        eight_small.as_secs_f64() / base_small.as_secs_f64(),
    );
}

/// What the search for wrapped encodings costs: 1 MiB of MIME base64 lines (every break a
/// wrap candidate, so the body is searched twice) against 1 MiB of JSON lines (none).
fn wrapped_figures(scrubber: &Scrubber) {
    use base64::Engine;
    let mib = 1024 * 1024;
    let json = body(mib, None);
    let raw: Vec<u8> = (0..mib * 3 / 4).map(|i| (i * 7 % 251) as u8).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(raw);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(76)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    let mut mime = lines.join("\r\n").into_bytes();
    mime.truncate(mib);
    let mime = Bytes::from(mime);
    assert_eq!(scrubbed(scrubber, &mime), mime.len());
    // The load harness's 1 MiB body: lines of 1,023 `y`, every newline a wrap candidate.
    let mut ys = Vec::with_capacity(mib);
    while ys.len() < mib {
        ys.extend_from_slice(&[b'y'; 1023]);
        ys.push(b'\n');
    }
    let ys = Bytes::from(ys);
    let base = median(50, || scrubbed(scrubber, &json));
    let wrapped = median(50, || scrubbed(scrubber, &mime));
    let long_lines = median(50, || scrubbed(scrubber, &ys));
    println!(
        "scrub 1 MiB, no match: JSON lines {base:?}; MIME base64 lines (searched unwrapped too) \
         {wrapped:?} ({:.2}x); lines of 1,023 `y` {long_lines:?} ({:.2}x)",
        wrapped.as_secs_f64() / base.as_secs_f64(),
        long_lines.as_secs_f64() / base.as_secs_f64(),
    );
}

/// A WebSocket's upstream half: 1 MiB of 4 KiB text messages, read 16 KiB at a time,
/// through the frame scrubber with no secret known (frames pass as they came) and with one.
fn websocket_figures(scrubber: &Scrubber) {
    use ostiary::scrub::websocket::FrameScrubber;
    let message = body(4096, None);
    let mut wire = Vec::new();
    for _ in 0..256 {
        wire.extend_from_slice(&[0x81, 126, 0x10, 0x00]);
        wire.extend_from_slice(&message);
    }
    let run = |known: Option<Scrubber>| {
        let mut frames = FrameScrubber::new(Box::new(move || known.clone()));
        let mut out = Vec::with_capacity(FRAME * 2);
        let mut sent = 0;
        for read in wire.chunks(FRAME) {
            out.clear();
            frames
                .feed(read, &mut out)
                .expect("frames a server may send");
            sent += out.len();
        }
        sent
    };
    let none = median(50, || run(None));
    let one = median(50, || run(Some(scrubber.clone())));
    println!(
        "websocket 1 MiB in 4 KiB messages: no secret known {none:?}, one secret {one:?} \
         ({:.1}x; {:.0} MB/s)",
        one.as_secs_f64() / none.as_secs_f64(),
        wire.len() as f64 / one.as_secs_f64() / 1e6,
    );
}

fn bench(c: &mut Criterion) {
    let scrubber = Scrubber::new([SECRET]);
    let mib = 1024 * 1024;
    let clean = body(mib, None);
    let dirty = body(mib, Some(4096));
    let mut group = c.benchmark_group("scrub_1mib");
    group.throughput(Throughput::Bytes(mib as u64));
    group.bench_function("passthrough", |b| b.iter(|| passthrough(&clean)));
    group.bench_function("no_match", |b| b.iter(|| scrubbed(&scrubber, &clean)));
    group.bench_function("matches_every_4k", |b| {
        b.iter(|| scrubbed(&scrubber, &dirty))
    });
    let escaped = escaped_body(mib);
    group.bench_function("escapes_no_match", |b| {
        b.iter(|| scrubbed(&scrubber, &escaped))
    });
    group.bench_function("no_match_256b_frames", |b| {
        b.iter(|| scrubbed_in(&scrubber, &clean, 256))
    });
    group.finish();
    let small = body(1024, None);
    let mut group = c.benchmark_group("scrub_1kib_response");
    group.bench_function("passthrough", |b| b.iter(|| passthrough(&small)));
    group.bench_function("scrubbed", |b| b.iter(|| scrubbed(&scrubber, &small)));
    group.finish();
    c.bench_function("scrubber_new", |b| {
        b.iter(|| Scrubber::new(std::hint::black_box([SECRET])))
    });
}

criterion_group!(benches, bench);

fn main() {
    figures(&Scrubber::new([SECRET]));
    many_secrets_figures();
    wrapped_figures(&Scrubber::new([SECRET]));
    websocket_figures(&Scrubber::new([SECRET]));
    benches();
    Criterion::default().configure_from_args().final_summary();
}
