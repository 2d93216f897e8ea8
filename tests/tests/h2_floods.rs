//! HTTP/2 floods against the intercepted h2 server (THREATS.md, "HTTP and TLS parsing":
//! "HTTP/2 rapid reset and CONTINUATION floods → bounded memory and CPU, connections
//! closed"):
//!
//! - rapid reset (CVE-2023-44487): thousands of requests each cancelled by `RST_STREAM`
//!   the moment it is sent. The proxy must close the connection early, the upstream must
//!   see only a small fraction of them, and another agent's tunnel keeps being served;
//! - CONTINUATION flood (CVE-2024-27316 family): one header block that never ends. The
//!   proxy must close the connection after a small multiple of `proxy.max_header_bytes`,
//!   forward nothing, and serve the next connection normally;
//! - late resets: each request cancelled a few milliseconds after it was sent, once the
//!   proxy has started on it — invisible to h2's pending-accept limit; the proxy's
//!   `reset_guard` tells such a connection to go away;
//! - PING flood: pings whose acknowledgements are never read. The proxy must stop reading
//!   (or close) instead of queueing acknowledgements without bound.
//!
//! Well-behaved h2 clients cannot be made to misbehave like this, so the attacking
//! connections are written frame by frame (with a minimal HPACK encoder) over the TLS the
//! proxy terminates inside a real CONNECT tunnel; a watcher task reads what the proxy sends
//! back and records how many bytes had been written when the connection ended. Every wait
//! has a deadline, so a proxy that hangs fails the test instead of stalling the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, intercepted};
use ostiary_e2e::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;

type Tls = TlsStream<TcpStream>;

/// `proxy.max_header_bytes` of the default config, which the h2 server uses as its
/// `SETTINGS_MAX_HEADER_LIST_SIZE`.
const MAX_HEADER_BYTES: u64 = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Rig: one TLS upstream behind a proxy, two agents (the attacker and a bystander)
// ---------------------------------------------------------------------------------------

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    attacker: String,
    bystander: String,
}

impl Rig {
    async fn start() -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            // The loop watchdog would pause a session repeating one call thousands of
            // times; that would cut the flood at the session level and hide whether the h2
            // server itself bounds it, which is what is tested here.
            extra_toml: "[sessions.watchdog]\nenabled = false\n".into(),
            ..Default::default()
        })
        .await;
        let attacker = proxy.session("attacker").await.token;
        let bystander = proxy.session("bystander").await.token;
        Self {
            upstream,
            proxy,
            attacker,
            bystander,
        }
    }

    fn authority(&self) -> String {
        format!("{}:{}", self.upstream.host(), self.upstream.port())
    }

    /// A well-behaved h2 client (hyper's) of the bystander, on a tunnel of its own.
    async fn bystander(&self) -> hyper::client::conn::http2::SendRequest<raw::ReqBody> {
        let tls = intercepted(
            &self.proxy,
            &self.bystander,
            self.upstream.host(),
            self.upstream.port(),
            &[b"h2"],
        )
        .await;
        raw::h2(tls).await
    }

    /// `GET path` by the bystander on `sender`: the proxy must still serve it normally.
    async fn bystander_get_on(
        &self,
        sender: &mut hyper::client::conn::http2::SendRequest<raw::ReqBody>,
        path: &str,
    ) -> raw::Reply {
        let uri = format!("https://{}{path}", self.authority());
        raw::send_h2(sender, raw::request("GET", &uri, None))
            .await
            .unwrap_or_else(|e| panic!("the bystander's GET {path}: {e}"))
    }

    /// `GET path` by the bystander on a fresh tunnel.
    async fn bystander_get(&self, path: &str) -> raw::Reply {
        let mut sender = self.bystander().await;
        self.bystander_get_on(&mut sender, path).await
    }
}

// ---------------------------------------------------------------------------------------
// Raw h2: frames, a minimal HPACK encoder, and a watcher for the end of the connection
// ---------------------------------------------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

const CANCEL: u32 = 0x8;

/// Largest frame payload a peer must accept without negotiation (RFC 9113 §4.2).
const MAX_FRAME: usize = 16 * 1024;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_FRAME, "frame payload too large");
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer (RFC 7541 §5.1) with an `n`-bit prefix, OR-ed into `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// An HPACK string literal without Huffman coding.
fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0x00, 7, s.len() as u64);
    out.extend_from_slice(s);
}

/// The header block of `GET https://<authority><path>`: `:method GET` and `:scheme https`
/// from the static table (indices 2 and 7), `:authority` and `:path` as literals without
/// indexing whose names come from the static table (indices 1 and 4).
fn get_block(authority: &str, path: &str) -> Vec<u8> {
    let mut out = vec![0x82, 0x87];
    hpack_int(&mut out, 0x00, 4, 1);
    hpack_str(&mut out, authority.as_bytes());
    hpack_int(&mut out, 0x00, 4, 4);
    hpack_str(&mut out, path.as_bytes());
    out
}

/// How the proxy ended an attacked connection, as the watcher saw it.
#[derive(Debug, Clone)]
enum End {
    GoAway {
        code: u32,
        last_stream: u32,
        debug: String,
    },
    Eof,
    Error(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::GoAway {
                code,
                last_stream,
                debug,
            } => write!(
                f,
                "GOAWAY code {code:#x} last-stream-id {last_stream} debug {debug:?}"
            ),
            End::Eof => write!(f, "EOF without GOAWAY"),
            End::Error(e) => write!(f, "read error without GOAWAY: {e}"),
        }
    }
}

/// The watcher's report: how the connection ended, and how many bytes the attacker had
/// written by then (the proxy accepted at most that much before it ended the connection).
#[derive(Debug, Clone)]
struct Ended {
    end: End,
    written: u64,
    at: Instant,
}

impl Ended {
    /// For the report: how it ended and when, counted from `started`.
    fn describe(ended: &Option<Ended>, started: Instant) -> String {
        match ended {
            Some(e) => format!("{e}, {:?} after the first frame", e.at - started),
            None => "still open".into(),
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} once {} bytes were written", self.end, self.written)
    }
}

/// One attacking h2 connection: the write half, a byte counter the writer keeps up to
/// date, and the watcher's verdict once the connection ends.
struct Attack {
    tx: WriteHalf<Tls>,
    written: Arc<AtomicU64>,
    ended: watch::Receiver<Option<Ended>>,
    /// HEADERS frames the proxy sent (responses it started), counted by the watcher.
    responses: Arc<AtomicU64>,
}

async fn read_frame(rx: &mut ReadHalf<Tls>) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    rx.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    rx.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

impl Attack {
    /// An intercepted h2 connection of the attacker: preface and an empty SETTINGS sent;
    /// with `ack`, the proxy's SETTINGS are read and acknowledged first (a client that
    /// looks compliant); without, they never are.
    async fn open(rig: &Rig, ack: bool) -> Self {
        let tls = intercepted(
            &rig.proxy,
            &rig.attacker,
            rig.upstream.host(),
            rig.upstream.port(),
            &[b"h2"],
        )
        .await;
        assert_eq!(
            tls.get_ref().1.alpn_protocol(),
            Some(&b"h2"[..]),
            "the proxy must speak h2 to the agent for these tests to mean anything"
        );
        let (mut rx, mut tx) = tokio::io::split(tls);
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tx.write_all(&hello).await.expect("preface sent");
        tx.flush().await.expect("preface flushed");
        if ack {
            let settings = tokio::time::timeout(raw::IO_DEADLINE, async {
                loop {
                    let (kind, flags, _, _) = read_frame(&mut rx).await?;
                    if kind == SETTINGS && flags & ACK == 0 {
                        return std::io::Result::Ok(());
                    }
                }
            })
            .await;
            settings
                .expect("the proxy's SETTINGS within the deadline")
                .expect("the proxy's SETTINGS");
            tx.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            tx.flush().await.unwrap();
        }

        let written = Arc::new(AtomicU64::new(0));
        let responses = Arc::new(AtomicU64::new(0));
        let (report, ended) = watch::channel(None);
        let (count, started) = (written.clone(), responses.clone());
        tokio::spawn(async move {
            let end = loop {
                match read_frame(&mut rx).await {
                    Ok((GOAWAY, _, _, payload)) if payload.len() >= 8 => {
                        let word = |i: usize| {
                            u32::from_be_bytes([
                                payload[i],
                                payload[i + 1],
                                payload[i + 2],
                                payload[i + 3],
                            ])
                        };
                        break End::GoAway {
                            last_stream: word(0) & 0x7fff_ffff,
                            code: word(4),
                            debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
                        };
                    }
                    Ok((HEADERS, _, _, _)) => {
                        started.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break End::Eof,
                    Err(e) => break End::Error(e.to_string()),
                }
            };
            let _ = report.send(Some(Ended {
                end,
                written: count.load(Ordering::SeqCst),
                at: Instant::now(),
            }));
        });
        Self {
            tx,
            written,
            ended,
            responses,
        }
    }

    /// Write `bytes`, counting them once written. A write error means the proxy is gone.
    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.tx.write_all(bytes).await?;
        self.tx.flush().await?;
        self.written.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        Ok(())
    }

    fn ended(&self) -> Option<Ended> {
        self.ended.borrow().clone()
    }

    /// The watcher's report, waiting up to `within` for the connection to end.
    async fn ended_within(&mut self, within: Duration) -> Option<Ended> {
        let _ = tokio::time::timeout(within, self.ended.wait_for(Option::is_some)).await;
        self.ended()
    }
}

// ---------------------------------------------------------------------------------------
// Rapid reset
// ---------------------------------------------------------------------------------------

/// Requests the attacker tries to open and cancel on one connection.
const RAPID_RESETS: u32 = 10_000;
/// HEADERS + RST_STREAM pairs per write: a real attacker batches so that streams are reset
/// before the server's accept loop takes them, the case h2's pending-accept reset limit
/// (`max_pending_accept_reset_streams`) is for. Resets paced a few milliseconds after
/// their HEADERS are not counted by that limit: the proxy's own guard (`reset_guard`)
/// handles those (`late_resets_get_the_connection_told_to_go_away`).
const RESET_BATCH: u32 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_streams_get_the_connection_closed_and_others_are_served() {
    let rig = Rig::start().await;
    // A slow, long response: every request that reaches the upstream is real work the
    // attacker got for free, so the count of those measures what the flood cost.
    let path = "/stream?chunks=1000&size=10&delay_ms=50";
    let block = get_block(&rig.authority(), path);
    let mut attack = Attack::open(&rig, true).await;
    // The bystander's connection exists before the flood: it must not be collateral damage.
    let mut bystander = rig.bystander().await;

    let started = Instant::now();
    let flood = async {
        let mut sent = 0u32;
        let mut write_error = None;
        while sent < RAPID_RESETS {
            let mut batch = Vec::new();
            for n in sent..sent + RESET_BATCH {
                let id = 2 * n + 1;
                batch.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &block));
                batch.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
            }
            match tokio::time::timeout(raw::IO_DEADLINE, attack.send(&batch)).await {
                Ok(Ok(())) => sent += RESET_BATCH,
                Ok(Err(e)) => {
                    write_error = Some(e.to_string());
                    break;
                }
                Err(_) => panic!("a write of the flood blocked for {:?}", raw::IO_DEADLINE),
            }
            // A short wait per batch, so the count written when the connection ends is
            // close to what the proxy read, not what loopback socket buffers (megabytes)
            // swallowed; a batch still arrives all at once, as an attacker's would.
            if attack
                .ended_within(Duration::from_millis(5))
                .await
                .is_some()
            {
                break;
            }
        }
        let flood_time = started.elapsed();
        let ended = attack.ended_within(Duration::from_secs(5)).await;
        (sent, write_error, flood_time, ended)
    };
    // The bystander asks while the attacked connection is flooded.
    let during = rig.bystander_get_on(&mut bystander, "/echo");
    let ((sent, write_error, flood_time, ended), during) = tokio::join!(flood, during);
    let wall = started.elapsed();
    // And on a fresh tunnel after it.
    let reply = rig.bystander_get("/echo").await;

    // Let whatever the flood set in motion reach the upstream before counting it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let upstream_saw = rig.upstream.count("/stream");
    let responses = attack.responses.load(Ordering::SeqCst);
    println!(
        "rapid reset: {sent} streams written in {flood_time:?} (write error: {write_error:?}); \
         connection end: {} (wall {wall:?}); upstream saw {upstream_saw} /stream \
         requests; proxy started {responses} responses; bystander got {} during, {} after",
        Ended::describe(&ended, started),
        during.status,
        reply.status
    );

    let ended = ended.unwrap_or_else(|| {
        panic!(
            "the proxy kept the connection open after {sent} rapidly reset streams \
             (upstream saw {upstream_saw})"
        )
    });
    if let End::GoAway {
        code, last_stream, ..
    } = &ended.end
    {
        // h2's own detector goes away with an error code naming the last stream it took.
        // When the resets land after the proxy started on the streams (a loaded machine),
        // the proxy's late-reset guard goes away first, and hyper only offers the graceful
        // form for that (NO_ERROR, last stream 2^31-1); the counts below hold either way.
        let graceful = *code == 0 && *last_stream == (1 << 31) - 1;
        if !graceful {
            assert_ne!(*code, 0, "a GOAWAY for a flood carries an error code");
            // Client streams are odd: the last one processed is the (n+1)/2-th.
            let processed = last_stream.div_ceil(2);
            assert!(
                processed < RAPID_RESETS / 10,
                "the proxy processed {processed} streams before going away"
            );
        }
    }
    let streams_before_close = ended.written / (block.len() as u64 + 9 + 13);
    assert!(
        streams_before_close < u64::from(RAPID_RESETS / 10),
        "the connection ended only after {streams_before_close} of {RAPID_RESETS} streams"
    );
    assert!(
        upstream_saw < (RAPID_RESETS / 10) as usize,
        "{upstream_saw} cancelled requests reached the upstream"
    );
    assert_eq!(
        during.status, 200,
        "the bystander is served during the flood:\n{during}"
    );
    assert_eq!(
        reply.status, 200,
        "the bystander is served after the flood:\n{reply}"
    );
    assert!(wall < Duration::from_secs(20), "the flood took {wall:?}");
}

// ---------------------------------------------------------------------------------------
// CONTINUATION flood
// ---------------------------------------------------------------------------------------

/// The most the attacker tries to push into one header block.
const FLOOD_BYTES: u64 = 64 << 20;
/// Up to this much, each frame waits briefly for the proxy's reaction, so the bytes
/// counted when the connection ends are close to what the proxy actually read rather than
/// what sat in socket buffers. Past it the flood goes at full speed.
const PACED_BYTES: u64 = 2 << 20;
/// The bound asserted: a small multiple of the header limit.
const CUT_BY: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_is_cut_at_the_header_limit() {
    let rig = Rig::start().await;
    // The attacker never acknowledges the proxy's SETTINGS: the limit must hold from the
    // first frame, not only once the client has agreed to it.
    let mut attack = Attack::open(&rig, false).await;

    // HEADERS without END_HEADERS: the pseudo-headers, then `x-pad` whose announced value
    // length is the whole flood, so the block never completes; the value fills every frame.
    let mut block = get_block(&rig.authority(), "/flood");
    block.push(0x00); // literal without indexing, new name
    hpack_str(&mut block, b"x-pad");
    hpack_int(&mut block, 0x00, 7, FLOOD_BYTES);
    block.resize(MAX_FRAME, b'a');
    let continuation = frame(CONTINUATION, 0, 1, &[b'a'; MAX_FRAME]);

    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let mut write_error = None;
    let mut next = frame(HEADERS, END_STREAM, 1, &block);
    while attack.written.load(Ordering::SeqCst) < FLOOD_BYTES && Instant::now() < deadline {
        match tokio::time::timeout(raw::IO_DEADLINE, attack.send(&next)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                write_error = Some(e.to_string());
                break;
            }
            // A proxy that stops reading without closing still bounds memory; it is
            // reported below as "no close", which this test does not accept either.
            Err(_) => {
                write_error = Some("write blocked".into());
                break;
            }
        }
        next.clone_from(&continuation);
        let paced = attack.written.load(Ordering::SeqCst) < PACED_BYTES;
        let reacted = if paced {
            attack.ended_within(Duration::from_millis(10)).await
        } else {
            attack.ended()
        };
        if reacted.is_some() {
            break;
        }
    }
    let written = attack.written.load(Ordering::SeqCst);
    let ended = attack.ended_within(Duration::from_secs(5)).await;
    let wall = started.elapsed();
    let upstream_saw = rig.upstream.seen().len();
    println!(
        "CONTINUATION flood: {written} bytes written in {wall:?} (write error: \
         {write_error:?}); connection end: {}; upstream saw {upstream_saw} requests",
        Ended::describe(&ended, started)
    );

    let ended = ended.unwrap_or_else(|| {
        panic!("the proxy kept the connection open after a {written}-byte header block")
    });
    assert!(
        ended.written < CUT_BY,
        "the proxy read {} bytes of one header block before ending the connection \
         (max_header_bytes = {MAX_HEADER_BYTES})",
        ended.written
    );
    assert!(
        ended.written > MAX_HEADER_BYTES / 2,
        "the connection ended after {} bytes, before the flood was even under way: \
         something else than the header limit cut it",
        ended.written
    );
    if let End::GoAway { code, .. } = &ended.end {
        assert_ne!(*code, 0, "a GOAWAY for a flood carries an error code");
    }
    assert_eq!(
        upstream_saw, 0,
        "nothing of the flood may reach the upstream"
    );

    // The proxy is unharmed: a fresh connection is served normally.
    let reply = rig.bystander_get("/echo").await;
    assert_eq!(reply.status, 200, "a fresh connection is served:\n{reply}");
    assert_eq!(rig.upstream.count("/echo"), 1);
    assert_eq!(rig.upstream.count("/flood"), 0);
}

// ---------------------------------------------------------------------------------------
// PING flood
// ---------------------------------------------------------------------------------------

/// The most the attacker tries to write as PINGs.
const PING_FLOOD_BYTES: u64 = 256 << 20;
/// PINGs per write.
const PING_BATCH: usize = 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_whose_acks_are_never_read_is_bounded() {
    let rig = Rig::start().await;
    let tls = intercepted(
        &rig.proxy,
        &rig.attacker,
        rig.upstream.host(),
        rig.upstream.port(),
        &[b"h2"],
    )
    .await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // No watcher here: the attacker never reads, so every PING ACK the proxy owes piles
    // up on its side. Only two outcomes bound that: it stops reading (the attacker's
    // writes stall) or it closes the connection (the writes fail).
    let (_rx, mut tx) = tokio::io::split(tls);
    let mut batch = PREFACE.to_vec();
    batch.extend(frame(SETTINGS, 0, 0, &[]));
    tx.write_all(&batch).await.expect("preface sent");
    let mut pings = Vec::with_capacity(PING_BATCH * 17);
    for i in 0..PING_BATCH as u64 {
        pings.extend(frame(PING, 0, 0, &i.to_be_bytes()));
    }

    let started = Instant::now();
    let mut written = 0u64;
    let outcome = loop {
        if written >= PING_FLOOD_BYTES {
            break "everything was read";
        }
        // A write that makes no progress for a second: the proxy stopped reading.
        match tokio::time::timeout(Duration::from_secs(1), async {
            tx.write_all(&pings).await?;
            tx.flush().await
        })
        .await
        {
            Ok(Ok(())) => written += pings.len() as u64,
            Ok(Err(_)) => break "closed",
            Err(_) => break "stalled",
        }
    };
    let wall = started.elapsed();
    println!(
        "PING flood: {written} bytes ({} PINGs) written before the proxy {outcome} \
         after {wall:?}",
        written / 17
    );
    assert_ne!(
        outcome, "everything was read",
        "the proxy read {written} bytes of PINGs without its ACKs being read"
    );
    drop(tx);

    let reply = rig.bystander_get("/echo").await;
    assert_eq!(reply.status, 200, "another connection is served:\n{reply}");
}

// ---------------------------------------------------------------------------------------
// Late resets
// ---------------------------------------------------------------------------------------

/// Requests the attacker opens, lets the proxy start on, and cancels.
const LATE_RESETS: u32 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_resets_get_the_connection_told_to_go_away() {
    let rig = Rig::start().await;
    let path = "/stream?chunks=1000&size=10&delay_ms=50";
    let block = get_block(&rig.authority(), path);
    let mut attack = Attack::open(&rig, true).await;
    let started = Instant::now();
    // Each stream is cancelled only after the proxy had time to pick it up (decide it,
    // perhaps send it upstream): resets hyper's pending-accept limit never counts.
    let mut sent = 0u32;
    while sent < LATE_RESETS && attack.ended().is_none() {
        let id = 2 * sent + 1;
        if attack
            .send(&frame(HEADERS, END_HEADERS | END_STREAM, id, &block))
            .await
            .is_err()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        if attack
            .send(&frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()))
            .await
            .is_err()
        {
            break;
        }
        sent += 1;
    }
    let ended = attack.ended_within(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let upstream_saw = rig.upstream.count("/stream");
    println!(
        "late resets: {sent} streams cancelled in {:?}; connection end: {}; upstream saw \
         {upstream_saw}",
        started.elapsed(),
        Ended::describe(&ended, started),
    );
    let ended = ended.unwrap_or_else(|| {
        panic!("the proxy kept serving a connection that cancelled {sent} requests late")
    });
    assert!(
        matches!(ended.end, End::GoAway { .. }),
        "told to go away, not dropped: {ended}"
    );
    // The guard trips at 128 cancellations; what is in flight then may still finish.
    assert!(
        sent < 400,
        "{sent} late resets before the connection was ended"
    );
    assert!(
        upstream_saw < 400,
        "{upstream_saw} cancelled requests reached the upstream"
    );
    let reply = rig.bystander_get("/echo").await;
    assert_eq!(reply.status, 200, "others are still served:\n{reply}");
}
