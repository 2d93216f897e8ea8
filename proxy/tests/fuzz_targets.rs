//! Fuzz targets for everything the proxy parses from an agent or an operator (THREATS.md,
//! "HTTP and TLS parsing": fuzz targets for request classification, MCP/JSON-RPC parsing,
//! config and catalog parsing; the catalog's are in `policies/tests/fuzz_targets.rs`).
//!
//! Agent-controlled input must never panic the proxy (a panic is a denial of service, and a
//! half-handled request is how smuggling starts), and each parser keeps a promise that
//! policy depends on: canonical hosts, the path policy sees being the path sent upstream,
//! JSON-RPC bodies accepted exactly when they have the documented shape, framing violations
//! never released to hyper. Each target asserts its promise, not only the absence of panics.
//!
//! Each target is a `bolero` check: under `cargo test`/`cargo nextest` it runs a bounded
//! number of random inputs on stable Rust; `cargo bolero test <name>` on nightly runs the
//! same target under libFuzzer, coverage-guided and unbounded (docs/fuzzing.md).

use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bolero::{check, TypeGenerator};
use http::{Method, Request};
use ostiary::classify::{self, Origin, Target, Tunnel};
use ostiary::egress::address::{normalize_host, split_authority, Host};
use ostiary::error::ProxyError;
use ostiary::mcp;
use ostiary::session::Principal;
use ostiary::wire_guard::StrictH1;
use ostiary::Config;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Random inputs per target on stable; `BOLERO_RANDOM_ITERATIONS` overrides it. Sized so the
/// whole file stays within a few seconds on a debug build.
const ITERATIONS: usize = 2_000;
/// Bounds for structured inputs. bolero refuses (skips) a value whose lists nest deeper
/// than its depth limit (default 5, where a string in a pair in a list in a list already
/// fails), so the limit is raised; the byte budget then bounds the values' size instead.
const STRUCTURED_MAX_LEN: usize = 16 * 1024;
const STRUCTURED_MAX_DEPTH: usize = 32;

// ---------------------------------------------------------------------------------------
// MCP / JSON-RPC
// ---------------------------------------------------------------------------------------

/// The longest `400` reason `mcp::parse` may give. Its reasons are fixed sentences, a
/// message index and serde_json's line/column; they must never grow with (or quote) the
/// agent's body, which is echoed into error responses and audit records.
const MAX_REASON: usize = 160;

/// The documented shape of one JSON-RPC message (mcp.rs module docs), written out
/// independently of the parser: `Some(true)` for a `tools/call`, `Some(false)` for any other
/// accepted message, `None` for a message `parse` must refuse.
fn expected_kind(message: &Value) -> Option<bool> {
    let message = message.as_object()?;
    if message.get("jsonrpc") != Some(&json!("2.0")) {
        return None;
    }
    let id = message.get("id");
    if id.is_some_and(|id| !matches!(id, Value::String(_) | Value::Number(_) | Value::Null)) {
        return None;
    }
    let Some(method) = message.get("method") else {
        let response = message.contains_key("result") || message.contains_key("error");
        return (id.is_some() && response).then_some(false);
    };
    match method.as_str()? {
        "tools/call" => {
            let params = message.get("params")?.as_object()?;
            params.get("name")?.as_str()?;
            match params.get("arguments") {
                None | Some(Value::Null | Value::Object(_)) => Some(true),
                Some(_) => None,
            }
        }
        _ => Some(false),
    }
}

/// Checks `mcp::parse(bytes)` against the documented contract.
fn check_mcp(bytes: &[u8]) {
    let parsed = mcp::parse(bytes);
    // The oracle parses with serde_json too, so nesting beyond its recursion limit is
    // refused by both.
    let value: Option<Value> = serde_json::from_slice(bytes).ok();
    let expected: Option<Vec<bool>> = value.as_ref().and_then(|value| match value {
        Value::Array(items) if items.is_empty() || items.len() > mcp::MAX_BATCH => None,
        Value::Array(items) => items.iter().map(expected_kind).collect(),
        single => expected_kind(single).map(|kind| vec![kind]),
    });
    match (parsed, expected) {
        (Ok(exchange), Some(kinds)) => {
            let batch = matches!(value, Some(Value::Array(_)));
            let lone_call = !batch && kinds == [true];
            assert_eq!(exchange.single_call().is_some(), lone_call);
            assert_eq!(exchange.needs_http(), kinds.contains(&false));
            if let (Some((id, name, args)), Some(Value::Object(message))) =
                (exchange.single_call(), &value)
            {
                // The decided call is the one in the body: same id, name and arguments.
                assert_eq!(id, message.get("id"));
                assert_eq!(Some(name), message["params"]["name"].as_str());
                match message["params"].get("arguments") {
                    None | Some(Value::Null) => assert_eq!(args, &json!({})),
                    Some(given) => assert_eq!(args, given),
                }
            }
        }
        (Err(ProxyError::BadRequest { reason }), None) => {
            assert!(
                reason.len() <= MAX_REASON,
                "a {}-byte reason for a {}-byte body: {reason}",
                reason.len(),
                bytes.len()
            );
        }
        (Ok(_), None) => panic!("accepted a body the contract refuses: {bytes:?}"),
        (Err(e), Some(_)) => panic!("refused a valid JSON-RPC body ({e}): {bytes:?}"),
        (Err(e), None) => panic!("refused with {} instead of bad_request: {e}", e.kind()),
    }
}

#[test]
fn mcp_parse_arbitrary_bytes() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| check_mcp(bytes));
}

/// A JSON scalar.
#[derive(Debug, TypeGenerator)]
enum Leaf {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

/// JSON up to two levels of nesting. bolero skips a value whose lists nest past its depth
/// limit, so a freely recursive type is mostly skipped; deep nesting is covered by the
/// byte-level target and by `mcp_parse_regressions`.
#[derive(Debug, TypeGenerator)]
enum Json {
    Leaf(Leaf),
    Array(Vec<Inner>),
    Object(Vec<(String, Inner)>),
}

#[derive(Debug, TypeGenerator)]
enum Inner {
    Leaf(Leaf),
    Array(Vec<Leaf>),
    Object(Vec<(String, Leaf)>),
}

impl Leaf {
    fn value(&self) -> Value {
        match self {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => json!(b),
            Leaf::Int(i) => json!(i),
            // Non-finite floats become null, as serde_json would serialise them.
            Leaf::Float(f) => json!(f),
            Leaf::Str(s) => json!(s),
        }
    }
}

impl Inner {
    fn value(&self) -> Value {
        match self {
            Inner::Leaf(leaf) => leaf.value(),
            Inner::Array(items) => items.iter().map(Leaf::value).collect(),
            Inner::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), v.value()))
                .collect::<Map<_, _>>()
                .into(),
        }
    }
}

impl Json {
    fn value(&self) -> Value {
        match self {
            Json::Leaf(leaf) => leaf.value(),
            Json::Array(items) => items.iter().map(Inner::value).collect(),
            Json::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), v.value()))
                .collect::<Map<_, _>>()
                .into(),
        }
    }
}

#[derive(Debug, TypeGenerator)]
enum RpcMethod {
    Call,
    List,
    Ping,
    Named(String),
}

/// One JSON-RPC message, well-formed unless `damage` applies (one in four messages), so
/// that batches of several messages are still often accepted. Once bolero's byte budget is
/// spent every further byte is 0, so 0 must mean "well-formed" and `damage` comes first.
#[derive(Debug, TypeGenerator)]
struct Message {
    damage: (u8, u8, Option<Json>),
    id: Option<Option<String>>,
    method: RpcMethod,
    name: String,
    arguments: Option<Vec<(String, Json)>>,
    result: Option<Json>,
    extra: Vec<(String, Json)>,
}

impl Message {
    fn value(&self) -> Value {
        let mut m: Map<String, Value> = self
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), v.value()))
            .collect();
        m.insert("jsonrpc".into(), json!("2.0"));
        if let Some(id) = &self.id {
            m.insert("id".into(), id.as_ref().map_or(json!(7), |s| json!(s)));
        }
        let method = match &self.method {
            RpcMethod::Call => "tools/call",
            RpcMethod::List => "tools/list",
            RpcMethod::Ping => "ping",
            RpcMethod::Named(n) => n,
        };
        m.insert("method".into(), json!(method));
        let mut params = Map::new();
        params.insert("name".into(), json!(self.name));
        if let Some(args) = &self.arguments {
            let args: Map<String, Value> =
                args.iter().map(|(k, v)| (k.clone(), v.value())).collect();
            params.insert("arguments".into(), args.into());
        }
        if let Some(result) = &self.result {
            m.insert("result".into(), result.value());
        }
        // Damage replaces one field the contract looks at with any JSON, or removes it.
        let (when, what, json) = &self.damage;
        let (fields, key) = match what % 5 {
            0 => (&mut m, "jsonrpc"),
            1 => (&mut m, "id"),
            2 => (&mut m, "method"),
            3 => (&mut params, "name"),
            _ => (&mut params, "arguments"),
        };
        if when % 4 == 1 {
            match json {
                Some(json) => fields.insert(key.into(), json.value()),
                None => fields.remove(key),
            };
        }
        m.insert("params".into(), params.into());
        m.into()
    }
}

#[test]
fn mcp_parse_structured_messages() {
    check!()
        .with_type::<(bool, Vec<Message>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(single, messages)| {
            let body = match (single, messages.first()) {
                (true, Some(first)) => first.value(),
                // Small batches: every message must be well-formed for the batch to be.
                _ => messages.iter().take(6).map(Message::value).collect(),
            };
            check_mcp(&serde_json::to_vec(&body).unwrap());
        });
}

#[test]
fn mcp_parse_regressions() {
    // A batch one over the cap, and JSON nested past serde_json's recursion limit: both a
    // short bad_request, whatever their size.
    let ping = r#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    check_mcp(format!("[{}]", vec![ping; mcp::MAX_BATCH + 1].join(",")).as_bytes());
    check_mcp(format!("[{}]", vec![ping; mcp::MAX_BATCH].join(",")).as_bytes());
    check_mcp(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).as_bytes());
    check_mcp(format!("\"{}", "x".repeat(100_000)).as_bytes());
}

// ---------------------------------------------------------------------------------------
// Hosts and authorities (egress/address.rs)
// ---------------------------------------------------------------------------------------

/// What `Host` promises: a name is lowercase ASCII (punycode) without trailing dot, at most
/// 253 characters in labels of 1..=63; an IP is never an IPv4-mapped IPv6 address; and the
/// canonical text normalises to itself.
fn assert_canonical(host: &Host, from: &str) {
    match host {
        Host::Name(name) => {
            assert!(name.len() <= 253, "{from:?} -> {name:?}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)),
                "{from:?} -> {name:?}"
            );
            assert!(
                name.split('.').all(|l| (1..=63).contains(&l.len())),
                "{from:?} -> {name:?}"
            );
        }
        Host::Ip(IpAddr::V6(v6)) => {
            assert!(v6.to_ipv4_mapped().is_none(), "{from:?} -> {v6}");
        }
        Host::Ip(IpAddr::V4(_)) => {}
    }
    let text = host.to_string();
    assert_eq!(
        normalize_host(&text).as_ref(),
        Ok(host),
        "{from:?} -> {text:?} does not normalise to itself"
    );
}

/// Host spellings: the odd forms THREATS.md lists (octal, hex, dotless, mapped IPv6,
/// trailing dots, IDN, full-width and ideographic dots) are reached far more often when
/// inputs are built from their pieces than from arbitrary strings.
const HOST_PIECES: &[&str] = &[
    "0",
    "1",
    "7",
    "9",
    "127",
    "255",
    "256",
    "0x",
    "0X7f",
    "0177",
    "4294967295",
    "4294967296",
    "2130706433",
    ".",
    "..",
    ":",
    "::",
    "[",
    "]",
    "ffff",
    "::ffff:",
    "64:ff9b::",
    "2002:",
    "a",
    "Z",
    "-",
    "_",
    "xn--",
    "xn--nxasmq6b",
    "example",
    "com",
    "é",
    "ß",
    "Ａ",
    "。",
    "．",
    "%2e",
    "%41",
    "%",
    "\u{0}",
    " ",
    "@",
    "*",
    "/",
    "\\",
    "\u{200b}",
    "ǅ",
    "ﬀ",
    "K",
];

fn host_from(pieces: &[u8]) -> String {
    pieces
        .iter()
        .map(|&i| HOST_PIECES[usize::from(i) % HOST_PIECES.len()])
        .collect()
}

fn check_host(raw: &str) {
    if let Ok(host) = normalize_host(raw) {
        assert_canonical(&host, raw);
    }
    if let Ok((host, port)) = split_authority(raw) {
        assert_canonical(&host, raw);
        assert_ne!(port, Some(0), "{raw:?}: port 0 is not a destination");
    }
}

#[test]
fn normalize_host_arbitrary_text() {
    check!()
        .with_type::<String>()
        .with_iterations(ITERATIONS)
        .for_each(|raw| check_host(raw));
}

#[test]
fn normalize_host_spellings() {
    check!()
        .with_type::<Vec<u8>>()
        .with_iterations(ITERATIONS)
        .for_each(|pieces| check_host(&host_from(pieces)));
}

// ---------------------------------------------------------------------------------------
// Request classification (classify.rs)
// ---------------------------------------------------------------------------------------

/// A host that is usually (three in four) a plain DNS name, otherwise an odd spelling.
#[derive(Debug, TypeGenerator)]
struct HostSpec {
    spelling: u8,
    pieces: Vec<u8>,
}

impl HostSpec {
    fn text(&self) -> String {
        if self.spelling >= 192 {
            return host_from(&self.pieces);
        }
        let alphabet = ['a', 'b', 'Z', '0', '-', '.'];
        let name: String = self
            .pieces
            .iter()
            .map(|&c| alphabet[usize::from(c) % alphabet.len()])
            .collect();
        format!("h{name}")
    }
}

#[derive(Debug, TypeGenerator)]
struct RequestSpec {
    method: u8,
    scheme: u8,
    host: HostSpec,
    port: Option<u16>,
    /// Used instead of `port` one time in sixteen.
    raw_port: (u8, String),
    path_pieces: Vec<u8>,
    query: Option<Vec<u8>>,
    host_header: Option<HostSpec>,
    /// `Some`: inside a tunnel to this host and port; `None`: plain absolute-form.
    tunnel: Option<(HostSpec, u16)>,
    absolute_in_tunnel: bool,
}

/// Path pieces that matter to policy: dot-segments in every spelling, encoded slashes,
/// `;params`, doubled slashes.
const PATH_PIECES: &[&str] = &[
    "/", "/", "/", "/", "//", ".", "..", "%2e", "%2E", "%2f", "%2F", ";", "=", "a", "admin", "a",
    "b", "~", "%00", "?", "*", "%",
];
/// Pieces beyond this are ignored: one bad character refuses the whole URI, so long paths
/// would almost never be built.
const MAX_PATH_PIECES: usize = 12;

fn principal() -> Arc<Principal> {
    Arc::new(Principal {
        session_id: "s".into(),
        agent: "a".into(),
        tenant: "t".into(),
        depth: 0,
        parent: None,
        expires_at: i64::MAX,
    })
}

impl RequestSpec {
    fn build(&self) -> Option<(Origin, Request<()>)> {
        let methods = ["GET", "POST", "OPTIONS", "CONNECT", "PROPFIND", "get"];
        let method = Method::from_bytes(methods[usize::from(self.method) % 6].as_bytes()).ok()?;
        let schemes = ["http://", "http://", "https://", "ftp://", ""];
        let scheme = schemes[usize::from(self.scheme) % schemes.len()];
        let pieces = |indices: &[u8]| -> String {
            indices
                .iter()
                .take(MAX_PATH_PIECES)
                .map(|&i| PATH_PIECES[usize::from(i) % PATH_PIECES.len()])
                .collect()
        };
        let path = pieces(&self.path_pieces);
        let mut uri = String::new();
        let absolute = self.tunnel.is_none() || self.absolute_in_tunnel;
        if absolute {
            uri.push_str(scheme);
            uri.push_str(&self.host.text());
            match (&self.raw_port, self.port) {
                ((c, raw), _) if *c >= 240 => uri.push_str(&format!(":{raw}")),
                (_, Some(port)) => uri.push_str(&format!(":{port}")),
                (_, None) => {}
            }
        }
        uri.push_str(&path);
        if let Some(query) = &self.query {
            uri.push('?');
            uri.push_str(&pieces(query));
        }
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(host) = &self.host_header {
            builder = builder.header(http::header::HOST, host.text());
        }
        let origin = match &self.tunnel {
            None => Origin::Plain,
            Some((host, port)) => Origin::Tunnel(Arc::new(Tunnel {
                host: normalize_host(&host.text()).ok()?,
                port: *port,
                principal: principal(),
            })),
        };
        // Requests `http` itself refuses to build never reach the proxy.
        Some((origin, builder.body(()).ok()?))
    }
}

/// A `.`/`..` segment in any spelling, as the proxy must refuse it.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

fn check_target(origin: &Origin, req: &Request<()>, target: &Target) {
    let context = format!("{} {}", req.method(), req.uri());
    // Path: absolute (or `*` for OPTIONS), passed as received, with no dot-segment.
    assert!(
        target.path.starts_with('/') || (target.path == "*" && target.method == Method::OPTIONS),
        "{context}: path {:?}",
        target.path
    );
    let received = req.uri().path();
    assert!(
        target.path == received || (received.is_empty() && target.path == "/"),
        "{context}: path {:?} altered to {:?}",
        received,
        target.path
    );
    assert!(!has_dot_segment(&target.path), "{context}");
    assert_eq!(target.query, req.uri().query().unwrap_or(""), "{context}");
    assert_canonical(&target.host, &context);
    match origin {
        Origin::Plain => assert_eq!(target.scheme, "http", "{context}"),
        Origin::Tunnel(tunnel) => {
            // No fronting: a request inside a tunnel is decided on the tunnel's destination.
            assert_eq!(target.scheme, "https", "{context}");
            assert_eq!((&target.host, target.port), (&tunnel.host, tunnel.port));
        }
    }
    // Policy sees exactly the path and query the upstream will be sent.
    if let Ok(upstream) = target.upstream_uri() {
        assert_eq!(upstream.path(), target.path, "{context} -> {upstream}");
        assert_eq!(
            upstream.query().unwrap_or(""),
            target.query,
            "{context} -> {upstream}"
        );
        let authority = upstream.authority().expect("an absolute URI").as_str();
        let (host, port) = split_authority(authority).expect("our own authority parses");
        assert_eq!((host, port), (target.host.clone(), Some(target.port)));
    }
}

#[test]
fn classify_target_structured_requests() {
    check!()
        .with_type::<RequestSpec>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|spec| {
            let Some((origin, req)) = spec.build() else {
                return;
            };
            match classify::target(&origin, &req) {
                Ok(target) => check_target(&origin, &req, &target),
                Err(ProxyError::BadRequest { .. } | ProxyError::Misdirected { .. }) => {}
                Err(e) => panic!(
                    "{} {}: unexpected {}: {e}",
                    req.method(),
                    req.uri(),
                    e.kind()
                ),
            }
        });
}

// ---------------------------------------------------------------------------------------
// HTTP/1 wire guard (wire_guard/)
// ---------------------------------------------------------------------------------------

/// An in-memory connection: reads hand out `input` in pieces of the given sizes (the
/// framing must not depend on read boundaries), writes are collected.
struct Wire {
    input: Vec<u8>,
    pos: usize,
    splits: Vec<usize>,
    reads: usize,
    written: Vec<u8>,
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let split = match this.splits.as_slice() {
            [] => usize::MAX,
            splits => splits[this.reads % splits.len()],
        };
        this.reads += 1;
        let n = split.min(buf.remaining()).min(this.input.len() - this.pos);
        buf.put_slice(&this.input[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().written.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What hyper would have received, the violation's reason, and what the client got back.
#[derive(Debug, PartialEq)]
struct Guarded {
    released: Vec<u8>,
    reason: Option<&'static str>,
    refusal_status: Option<String>,
}

/// Plays `input` through the guard as hyper would read it, answering each released piece
/// with one byte (an answer lets the guard inspect the next head). Synchronous: `Wire`
/// never returns `Pending`, so a `Pending` from the guard means it waits for an answer.
fn guard(input: &[u8], splits: &[usize], max_head: usize) -> Guarded {
    let wire = Wire {
        input: input.to_vec(),
        pos: 0,
        splits: splits.iter().map(|&s| s.max(1)).collect(),
        reads: 0,
        written: Vec::new(),
    };
    let mut guard = StrictH1::new(wire, max_head);
    let mut cx = Context::from_waker(Waker::noop());
    let (mut released, mut chunk) = (Vec::new(), [0u8; 997]);
    let mut pending = 0;
    // Every step consumes input, releases bytes or ends; the bound only guards the test.
    for _ in 0..(input.len() + 16) * 4 {
        let mut rb = ReadBuf::new(&mut chunk);
        match Pin::new(&mut guard).poll_read(&mut cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {
                released.extend_from_slice(rb.filled());
                pending = 0;
            }
            Poll::Ready(Err(_)) => break,
            Poll::Pending if pending > 1 => break,
            Poll::Pending => pending += 1,
        }
        let _ = Pin::new(&mut guard).poll_write(&mut cx, b"\0");
    }
    let reason = guard.violation().map(|v| v.reason());
    let refused = guard.rejection_id().is_some();
    let written = &guard.get_ref().written;
    let answer = written.iter().position(|&b| b != 0).map(|i| &written[i..]);
    let refusal_status = answer
        .filter(|_| refused)
        .map(|a| String::from_utf8_lossy(&a[..a.len().min(12)]).into_owned());
    Guarded {
        released,
        reason,
        refusal_status,
    }
}

/// Where the first request head ends (after any blank lines before it, RFC 9112 §2.2), or
/// the whole input if it has not ended.
fn first_head(input: &[u8]) -> &[u8] {
    let mut start = 0;
    while input[start..].starts_with(b"\r\n") {
        start += 2;
    }
    match input[start..].windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => &input[..start + i + 4],
        None => input,
    }
}

/// NUL, a LF not after CR, or a CR not before LF.
fn has_bad_line_ending(head: &[u8]) -> bool {
    head.iter().enumerate().any(|(i, &b)| match b {
        0 => true,
        b'\n' => i == 0 || head[i - 1] != b'\r',
        b'\r' => head.get(i + 1) != Some(&b'\n'),
        _ => false,
    })
}

fn check_guard(input: &[u8], splits: &[usize]) {
    let max = DEFAULT_MAX_HEAD;
    let whole = guard(input, &[], max);
    // The guard only ever holds bytes back; what it releases is the input, unchanged.
    assert!(
        input.starts_with(&whole.released),
        "released bytes differ from the input: {input:?}"
    );
    // The outcome does not depend on how the bytes were split into reads.
    let split = guard(input, splits, max);
    assert_eq!(split, whole, "splits {splits:?} of {input:?}");
    // hyper never gets part of a head: the first head is released whole or not at all…
    let head = first_head(input);
    assert!(
        whole.released.is_empty() || whole.released.starts_with(head),
        "released {:?} of the head {head:?}",
        whole.released
    );
    // …and a head with a bare LF, bare CR or NUL is never released.
    if has_bad_line_ending(head) {
        assert!(whole.released.is_empty(), "released a bad head: {input:?}");
    }
    // A refusal is an HTTP answer with a 4xx status, and only a violation earns one.
    if let Some(status) = &whole.refusal_status {
        assert!(status.starts_with("HTTP/1.1 4"), "{status:?}");
        assert!(whole.reason.is_some());
    }
}

const DEFAULT_MAX_HEAD: usize = ostiary::wire_guard::DEFAULT_MAX_HEAD_BYTES;

/// Pieces of HTTP/1 requests, so random sequences reach framing decisions (CL+TE,
/// duplicate lengths, chunk sizes, obs-fold) instead of failing on the request line.
const H1_PIECES: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\n",
    b"POST /p HTTP/1.1\r\n",
    b"POST / HTTP/1.0\r\n",
    b"CONNECT h:443 HTTP/1.1\r\n",
    b"Host: h\r\n",
    b"Content-Length: 3\r\n",
    b"Content-Length: 0\r\n",
    b"Content-Length: 18446744073709551615\r\n",
    b"Content-Length: +1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Transfer-Encoding: chunked, chunked\r\n",
    b"Expect: 100-continue\r\n",
    b"Upgrade: websocket\r\n",
    b"X: a\r\n b\r\n",
    b"X: \xff\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b"\0",
    b" ",
    b"abc",
    b"0\r\n\r\n",
    b"3\r\nabc\r\n",
    b"1;ext=v\r\nz\r\n",
    b"00000000000000001\r\n",
    b"fffffffffffffffff\r\n",
    b"3 \t;a\r\n",
    b"Trailer: t\r\n",
];

/// A known piece, or (one in sixteen) raw bytes.
#[derive(Debug, TypeGenerator)]
struct H1Piece {
    known: u8,
    raw: Vec<u8>,
}

#[test]
fn wire_guard_arbitrary_bytes() {
    check!()
        .with_type::<(Vec<u8>, Vec<u8>)>()
        .with_iterations(ITERATIONS)
        .for_each(|(input, splits)| {
            let splits: Vec<usize> = splits.iter().map(|&s| usize::from(s)).collect();
            check_guard(input, &splits);
        });
}

#[test]
fn wire_guard_request_pieces() {
    check!()
        .with_type::<(u8, Vec<H1Piece>, Vec<u8>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(first, pieces, splits)| {
            // Most inputs start with a request line, so that their heads can be valid.
            let mut input = H1_PIECES[usize::from(*first % 4)].to_vec();
            for piece in pieces {
                match piece.known {
                    k if k >= 240 => input.extend_from_slice(&piece.raw),
                    k => input.extend_from_slice(H1_PIECES[usize::from(k) % H1_PIECES.len()]),
                }
            }
            let splits: Vec<usize> = splits.iter().map(|&s| usize::from(s % 8)).collect();
            check_guard(&input, &splits);
        });
}

// ---------------------------------------------------------------------------------------
// Config (config/)
// ---------------------------------------------------------------------------------------

/// What `Config::validate` promises of every config it accepts.
fn check_config(text: &str) {
    let Ok(config) = Config::from_toml(text, Path::new("fuzz.toml")) else {
        return;
    };
    assert_eq!(config.state.store, "sqlite");
    assert!(!config.egress.ports.contains(&0));
    assert!(config.sessions.default_ttl <= config.sessions.max_ttl);
    assert!(config.sessions.max_cost.is_finite() && config.sessions.max_cost >= 0.0);
    assert!(config.proxy.max_header_bytes >= 1024);
    assert!(config.approvals.deadline >= config.approvals.ttl);
    assert!(!config.approvals.tick.is_zero());
    assert!(matches!(config.broker.backend.as_str(), "file" | "vault"));
    let mut names: Vec<&str> = config.credential.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), config.credential.len(), "duplicate credential");
}

#[test]
fn config_arbitrary_text() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| check_config(&String::from_utf8_lossy(bytes)));
}

/// Example configs to mutate: every field is reachable from them.
const EXAMPLES: &[&str] = &[
    include_str!("../../docs/examples/ostiary.toml"),
    include_str!("../../docs/examples/vault.toml"),
    include_str!("../../docs/examples/local-dev.toml"),
];

/// Strings that mean something to some field (durations at the limits, rates, CIDRs,
/// enum names, addresses), so mutations get past the type checks.
const CONFIG_STRINGS: &[&str] = &[
    "",
    "0s",
    "1ns",
    "18446744073709551615s",
    "584942417356y",
    "99999999999999999999h",
    "1h",
    "100/s",
    "0/s",
    "4294967295/h",
    "4294967296/s",
    "1/fortnight",
    "sqlite",
    "redis",
    "file",
    "vault",
    "allow",
    "deny",
    "escalate",
    "limits",
    "dlp",
    "webhook",
    "args_schema",
    "calls",
    "cost",
    "127.0.0.1:0",
    "[::1]:8080",
    "10.0.0.0/8",
    "::/0",
    "http://127.0.0.1:1",
    "Bearer {secret}",
    "{secret}{secret}",
    "*.example.com",
    "*",
    "A\r\nB",
];

#[derive(Debug, TypeGenerator)]
enum Scalar {
    Known(u8),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A value to put into a config. Not recursive: generating deep trees costs more than
/// parsing them, and a field's type check is reached by one level of nesting.
#[derive(Debug, TypeGenerator)]
enum ConfigValue {
    Scalar(Scalar),
    Array(Vec<Scalar>),
    Table(Vec<(u8, Scalar)>),
}

impl Scalar {
    fn toml(&self) -> toml::Value {
        match self {
            Scalar::Known(i) => CONFIG_STRINGS[usize::from(*i) % CONFIG_STRINGS.len()].into(),
            Scalar::Str(s) => s.clone().into(),
            Scalar::Int(i) => (*i).into(),
            Scalar::Float(f) => (*f).into(),
            Scalar::Bool(b) => (*b).into(),
        }
    }
}

impl ConfigValue {
    fn toml(&self, keys: &[String]) -> toml::Value {
        match self {
            ConfigValue::Scalar(s) => s.toml(),
            ConfigValue::Array(items) => items.iter().map(Scalar::toml).collect::<Vec<_>>().into(),
            ConfigValue::Table(fields) => fields
                .iter()
                .map(|(k, v)| (keys[usize::from(*k) % keys.len()].clone(), v.toml()))
                .collect::<toml::Table>()
                .into(),
        }
    }
}

#[derive(Debug, TypeGenerator)]
enum Mutation {
    /// Replace the value at one key path of the example.
    Set(u16, ConfigValue),
    /// Remove one key path.
    Remove(u16),
    /// Add a key (any key seen anywhere in the examples) under one table.
    Add(u16, u16, ConfigValue),
}

/// Every key path of `table`, tables and array elements included.
fn key_paths(value: &toml::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                path.push(k.clone());
                out.push(path.clone());
                key_paths(v, path, out);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                out.push(path.clone());
                key_paths(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The parent of `path`'s last element and that element's key.
fn parent_mut<'a>(root: &'a mut toml::Value, path: &[String]) -> Option<&'a mut toml::Value> {
    let mut at = root;
    for key in path {
        at = match at {
            toml::Value::Table(t) => t.get_mut(key)?,
            toml::Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

fn apply(root: &mut toml::Value, mutation: &Mutation, paths: &[Vec<String>], keys: &[String]) {
    let pick = |i: &u16| &paths[usize::from(*i) % paths.len()];
    match mutation {
        Mutation::Set(at, value) => {
            if let Some(slot) = parent_mut(root, pick(at)) {
                *slot = value.toml(keys);
            }
        }
        Mutation::Remove(at) => {
            let path = pick(at);
            let (last, parent) = path.split_last().expect("paths are non-empty");
            match parent_mut(root, parent) {
                Some(toml::Value::Table(t)) => {
                    t.remove(last);
                }
                Some(toml::Value::Array(a)) => {
                    if let Ok(i) = last.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
        }
        Mutation::Add(at, key, value) => {
            if let Some(toml::Value::Table(t)) = parent_mut(root, pick(at)) {
                let key = keys[usize::from(*key) % keys.len()].clone();
                t.insert(key, value.toml(keys));
            }
        }
    }
}

#[test]
fn config_mutated_examples() {
    let examples: Vec<toml::Value> = EXAMPLES
        .iter()
        .map(|text| toml::from_str(text).expect("the examples are TOML"))
        .collect();
    let paths: Vec<Vec<Vec<String>>> = examples
        .iter()
        .map(|example| {
            let mut out = Vec::new();
            key_paths(example, &mut Vec::new(), &mut out);
            out
        })
        .collect();
    let mut keys: Vec<String> = paths.iter().flatten().flatten().cloned().collect();
    // Fields the examples leave out (commented out or optional sections).
    keys.extend(
        [
            "redis",
            "smtp",
            "webhook",
            "rate_agent",
            "rate_tenant",
            "rate_burst",
            "url",
            "from",
            "token_env",
            "approle",
            "secret_id_env",
            "role_id",
        ]
        .map(String::from),
    );
    keys.retain(|k| k.parse::<usize>().is_err());
    keys.sort_unstable();
    keys.dedup();
    check!()
        .with_type::<(u8, Vec<Mutation>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(example, mutations)| {
            let i = usize::from(*example) % examples.len();
            let mut doc = examples[i].clone();
            for mutation in mutations.iter().take(8) {
                apply(&mut doc, mutation, &paths[i], &keys);
            }
            // Some mutations give values TOML cannot write (a table after plain keys is
            // fine, but not every shape serialises); those are not configs anyone can load.
            if let Ok(text) = toml::to_string(&doc) {
                check_config(&text);
            }
        });
}
