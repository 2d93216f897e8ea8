//! Cost of four phases of the request path, each against a baseline measured in the same run,
//! so that a figure is read as a ratio to what the machine gave that run:
//!
//! - `session_token`: `authenticate::principal` on a `Proxy-Authorization: Basic` header.
//!   `cached` is the token of an earlier request (the registry's verified-token cache);
//!   `uncached` a token never seen (the Ed25519 check, the live-session lookup and the cache
//!   insert); `verify_only` is `TokenKeys::verify` alone (signature and claims). Baseline: a
//!   `RwLock<HashMap>` lookup of the same token, what any in-memory cache costs.
//! - `classify`: a request turned into the catalogued tool policy is asked about. `rest_route`
//!   is a GET of `/repos/{owner}/{repo}/issues` in an intercepted tunnel (`classify::target`,
//!   `recognise::route`, its arguments read, `ToolCall::action`); `mcp_tools_call` a
//!   `tools/call` POST to a catalogued MCP endpoint (`classify::target`, the REST routes
//!   missed first as the pipeline does, `mcp::endpoint`, `mcp::parse`, `Endpoint::tool`).
//!   Baselines: `classify::target` alone (the destination, no catalog) and serde_json's
//!   `Value` parse of the MCP body (a lenient parse, no catalog).
//! - `leaf`: `LeafMinter::server_config` for a host never asked (`miss`: a leaf signed and
//!   its rustls config built) and for one asked before (`hit`). Baselines: one ECDSA P-256
//!   signature with the CA's key (ring, as rcgen signs leaves here) over a leaf-sized
//!   message, the part of a mint no cache design avoids; and loading a P-256 PKCS#8 key into
//!   rustls, which every mint did again for the one leaf key all leaves share until the
//!   minter kept it loaded (a third of a mint: p99 103 → 63 µs).
//! - `audit`: one request's record through `AuditGuard` to the audit writer on SQLite in a
//!   tempdir. `send` is what the request path pays (the record queued; the writer commits in
//!   groups, off the request path); `one_then_flush` a record made durable on its own (a
//!   flush waits for its commit and the head checkpoint, as a held approval does);
//!   `burst_1000_then_flush` a thousand records, then one flush (throughput in records).
//!   Baselines: serialising and sealing the record (the writer's CPU floor per record) and a
//!   1 KiB write + `fdatasync` in the same directory (the disk's floor for a durable write).
//!
//! Printed before criterion runs: p50 and p99 of 2,000 mints, the hit rate of 10,000
//! lookups over 50 hosts (the goal: mint p99 ≤ 100 µs, ≥ 99% hits), and the per-record cost
//! of bursts of 1,000 audit records.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use futures_util::FutureExt;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderValue, Request};
use ostiary::audit::attest::RangeDigest;
use ostiary::audit::{writer, AuditGuard, AuditRecord, AuditSink, AuditWriter};
use ostiary::body::{self, ProxyBody};
use ostiary::classify::{self, Origin, Tunnel};
use ostiary::egress::address::normalize_host;
use ostiary::metrics::Metrics;
use ostiary::session::token::Claims;
use ostiary::session::{NewSession, Principal, SessionRegistry, TokenKeys};
use ostiary::state::{files, SecretString, StateDir};
use ostiary::store::sqlite;
use ostiary::tls::ca::LeafMinter;
use ostiary::{authenticate, config, mcp, recognise};
use ostiary_benches::fill_tool_call_record;
use ostiary_policies::Catalog;
use rustls::SignatureScheme;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// Keys, CA and database as a state directory holds them, made fresh for the run.
fn state() -> (TempDir, StateDir) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::open_with(dir.path(), Some(SecretString::new("bench".into()))).unwrap();
    (dir, state)
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

// --- session token ---

struct Sessions {
    registry: SessionRegistry,
    /// The same keys, to sign tokens the registry has never seen for the same session.
    keys: TokenKeys,
    claims: Claims,
    token: String,
    headers: HeaderMap,
    map: RwLock<HashMap<String, Arc<Principal>>>,
    /// Tells the tokens of `fresh` apart (their `iat`); no two iterations share one.
    issued: AtomicU64,
    _state: (TempDir, StateDir),
}

fn proxy_authorization(token: &str) -> HeaderMap {
    // The form `HTTPS_PROXY=http://agent:<token>@host:port` makes every client send.
    let basic = BASE64.encode(format!("agent:{token}"));
    let mut headers = HeaderMap::new();
    headers.insert(
        PROXY_AUTHORIZATION,
        HeaderValue::from_str(&format!("Basic {basic}")).unwrap(),
    );
    headers
}

impl Sessions {
    fn new() -> Self {
        let state = state();
        let keys = || {
            TokenKeys::from_pem(state.1.signing_key_pem.expose(), &state.1.verify_key_pem).unwrap()
        };
        let stores = sqlite::open(&state.1.path(files::DATABASE)).unwrap();
        let registry =
            SessionRegistry::load(keys(), stores.sessions, &config::Sessions::default()).unwrap();
        // Creating a session writes its row on the blocking pool; checking a token does not.
        let (principal, token) = runtime()
            .block_on(registry.create(
                NewSession {
                    agent: Some("bench".into()),
                    ..NewSession::default()
                },
                None,
            ))
            .unwrap();
        let keys = keys();
        let claims = keys.verify(&token).unwrap();
        let map = RwLock::new(HashMap::from([(token.clone(), principal)]));
        Self {
            registry,
            keys,
            claims,
            headers: proxy_authorization(&token),
            token,
            map,
            issued: AtomicU64::new(0),
            _state: state,
        }
    }

    /// A valid token of the same session that differs from every earlier one.
    fn fresh(&self) -> HeaderMap {
        let n = self.issued.fetch_add(1, Ordering::Relaxed) as i64;
        let claims = Claims {
            iat: self.claims.iat - 1 - n,
            ..self.claims.clone()
        };
        proxy_authorization(&self.keys.sign(&claims).unwrap())
    }

    fn authenticate(&self, headers: &HeaderMap) -> Arc<Principal> {
        // No store lookup for a session this replica knows: done on the first poll.
        authenticate::principal(&self.registry, headers)
            .now_or_never()
            .expect("a known session never waits")
            .unwrap()
    }
}

fn session_token(c: &mut Criterion) {
    let s = Sessions::new();
    s.authenticate(&s.headers);
    let mut group = c.benchmark_group("session_token");
    group.bench_function("hashmap_baseline", |b| {
        b.iter(|| {
            s.map
                .read()
                .unwrap()
                .get(std::hint::black_box(s.token.as_str()))
                .cloned()
        })
    });
    group.bench_function("cached", |b| {
        b.iter(|| s.authenticate(std::hint::black_box(&s.headers)))
    });
    group.bench_function("uncached", |b| {
        b.iter_batched(|| s.fresh(), |h| s.authenticate(&h), BatchSize::SmallInput)
    });
    group.bench_function("verify_only", |b| {
        b.iter(|| s.keys.verify(std::hint::black_box(&s.token)).unwrap())
    });
    group.finish();
}

// --- classification ---

/// Neighbouring routes on the same host before the measured one, so that the match is not
/// simply the catalog's first entry.
const TOOLS: &str = r#"
[[tool]]
name = "github.get_repo"
tier = "read"
match = { host = "api.github.com", method = "GET", path = "/repos/{owner}/{repo}" }

[[tool]]
name = "github.create_issue"
tier = "write"
match = { host = "api.github.com", method = "POST", path = "/repos/{owner}/{repo}/issues" }

[[tool]]
name = "github.list_issues"
tier = "read"
match = { host = "api.github.com", method = "GET", path = "/repos/{owner}/{repo}/issues" }

[[tool]]
name = "files.write"
tier = "write"
match = { mcp = "https://mcp.example.test/mcp", tool = "write_file" }

[[tool]]
name = "files.read"
tier = "read"
match = { mcp = "https://mcp.example.test/mcp", tool = "read_file" }
"#;

const MCP_BODY: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"/notes/2025-06-18.md","max_bytes":65536}}}"#;

/// `proxy.max_tool_body_bytes`'s order of magnitude; the bodies here are far below it.
const BODY_LIMIT: usize = 1 << 20;

struct Classify {
    catalog: Catalog,
    github: Origin,
    mcp: Origin,
    mcp_body: Bytes,
}

fn tunnel(host: &str) -> Origin {
    Origin::Tunnel(Arc::new(Tunnel {
        host: normalize_host(host).unwrap(),
        port: 443,
        principal: Arc::new(ostiary_benches::principal("ses_bench")),
    }))
}

fn rest_request() -> Request<ProxyBody> {
    Request::get("/repos/acme/widgets/issues?state=open&per_page=50")
        .header(HOST, "api.github.com")
        .header(ACCEPT, "application/vnd.github+json")
        .body(body::empty())
        .unwrap()
}

fn mcp_request() -> Request<()> {
    Request::post("/mcp")
        .header(HOST, "mcp.example.test")
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json, text/event-stream")
        .body(())
        .unwrap()
}

impl Classify {
    fn new() -> Self {
        Self {
            catalog: Catalog::parse("tools.toml", TOOLS, None).unwrap(),
            github: tunnel("api.github.com"),
            mcp: tunnel("mcp.example.test"),
            mcp_body: Bytes::from_static(MCP_BODY.as_bytes()),
        }
    }

    fn rest(&self, req: &mut Request<ProxyBody>) -> ostiary_policies::Action {
        let target = classify::target(&self.github, req).unwrap();
        let route = recognise::route(&self.catalog, &target)
            .unwrap()
            .expect("a catalogued route");
        // `read` puts the buffered body back, so the same request serves every iteration.
        let call = route
            .read(req, &target, BODY_LIMIT)
            .now_or_never()
            .expect("an in-memory body is read on the first poll")
            .unwrap();
        call.action(None).unwrap()
    }

    /// The catalog's name of the MCP tool called, and its arguments.
    fn mcp(&self, req: &Request<()>) -> (&str, usize) {
        let target = classify::target(&self.mcp, req).unwrap();
        assert!(recognise::route(&self.catalog, &target).unwrap().is_none());
        let endpoint = mcp::endpoint(&self.catalog, &target)
            .unwrap()
            .expect("a catalogued endpoint");
        let exchange = mcp::parse(req.headers(), &self.mcp_body).unwrap();
        let (_, name, args) = exchange.single_call().expect("one tools/call");
        let tool = endpoint
            .tool(&self.catalog, name)
            .expect("a catalogued tool");
        (tool.name(), args.as_object().map_or(0, |a| a.len()))
    }
}

fn classification(c: &mut Criterion) {
    let f = Classify::new();
    let mut rest = rest_request();
    let mcp = mcp_request();
    assert!(matches!(
        f.rest(&mut rest),
        ostiary_policies::Action::Tool { ref name, .. } if name == "github.list_issues"
    ));
    assert_eq!(f.mcp(&mcp), ("files.read", 2));
    let mut group = c.benchmark_group("classify");
    group.bench_function("target_only_baseline", |b| {
        b.iter(|| classify::target(&f.github, std::hint::black_box(&rest)).unwrap())
    });
    group.bench_function("rest_route", |b| {
        b.iter(|| f.rest(std::hint::black_box(&mut rest)))
    });
    group.bench_function("serde_json_body_baseline", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(std::hint::black_box(&f.mcp_body)))
    });
    group.bench_function("mcp_tools_call", |b| {
        b.iter(|| f.mcp(std::hint::black_box(&mcp)))
    });
    group.finish();
}

// --- leaf certificates ---

fn minter(state: &StateDir) -> LeafMinter {
    LeafMinter::new(&state.ca_cert_pem, state.ca_key_pem.expose()).unwrap()
}

/// Host names no minter has been asked for yet.
fn new_host(n: u64) -> String {
    format!("h{n}.mint.example.com")
}

fn leaf(c: &mut Criterion) {
    let (_dir, state) = state();
    let minter = minter(&state);
    let key = PrivateKeyDer::from_pem_slice(state.ca_key_pem.expose().as_bytes()).unwrap();
    let load = || rustls::crypto::ring::sign::any_ecdsa_type(&key).unwrap();
    let signer = load()
        .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
        .expect("a P-256 key");
    // About the to-be-signed part of a minted leaf (name, validity, SAN, EKU, AKI, key).
    let message = vec![0x5a_u8; 420];
    minter.server_config("api.github.com").unwrap();
    let next = AtomicU64::new(0);
    let mut group = c.benchmark_group("leaf");
    group.bench_function("p256_sign_baseline", |b| {
        b.iter(|| signer.sign(std::hint::black_box(&message)).unwrap())
    });
    // A mint hands rustls the leaf key as PKCS#8 again, and loading one checks the key pair.
    group.bench_function("p256_key_load_baseline", |b| b.iter(load));
    // Past 10,000 names the cache evicts as it inserts, as a proxy meeting that many does.
    group.bench_function("miss", |b| {
        b.iter(|| {
            let host = new_host(next.fetch_add(1, Ordering::Relaxed));
            minter.server_config(&host).unwrap()
        })
    });
    group.bench_function("hit", |b| {
        b.iter(|| {
            minter
                .server_config(std::hint::black_box("api.github.com"))
                .unwrap()
        })
    });
    group.finish();
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn leaf_figures() {
    const MINTS: u64 = 2_000;
    const LOOKUPS: usize = 10_000;
    const HOSTS: usize = 50;
    let (_dir, state) = state();
    // A minter of its own, so that no mint pays for an eviction.
    let fresh = minter(&state);
    // Untimed, so that the first figures are not page faults and cold instruction caches.
    for n in 0..50 {
        fresh
            .server_config(&format!("warm{n}.example.com"))
            .unwrap();
    }
    let mut mints: Vec<Duration> = (0..MINTS)
        .map(|n| {
            let host = new_host(n);
            let t = Instant::now();
            std::hint::black_box(fresh.server_config(&host).unwrap());
            t.elapsed()
        })
        .collect();
    mints.sort();
    println!(
        "leaf mint (cache miss), {MINTS} mints: p50 {:?}, p99 {:?}, max {:?} (goal p99 <= 100us)",
        percentile(&mints, 50),
        percentile(&mints, 99),
        mints[mints.len() - 1]
    );

    let cache = minter(&state);
    let hosts: Vec<String> = (0..HOSTS).map(|i| format!("api{i}.example.com")).collect();
    // A config handed out again (the same allocation) came from the cache; a fresh one was
    // minted, whether first seen or evicted.
    let mut seen: Vec<Option<Arc<rustls::ServerConfig>>> = vec![None; HOSTS];
    let (mut hits, mut times) = (0, Vec::with_capacity(LOOKUPS));
    // Shuffled rather than round robin (repeatably): the gap between repeats varies.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..LOOKUPS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % HOSTS as u64) as usize;
        let t = Instant::now();
        let config = cache.server_config(&hosts[i]).unwrap();
        times.push(t.elapsed());
        if seen[i].as_ref().is_some_and(|s| Arc::ptr_eq(s, &config)) {
            hits += 1;
        } else {
            seen[i] = Some(config);
        }
    }
    times.sort();
    println!(
        "leaf cache, {LOOKUPS} lookups over {HOSTS} hosts: {hits} hits ({:.2}%, goal >= 99%), \
         lookup p50 {:?}, p99 {:?}",
        hits as f64 * 100.0 / LOOKUPS as f64,
        percentile(&times, 50),
        percentile(&times, 99)
    );
}

// --- audit ---

struct Audit {
    sink: AuditSink,
    writer: Option<AuditWriter>,
    metrics: Arc<Metrics>,
    key: Vec<u8>,
    rt: Runtime,
    state: (TempDir, StateDir),
}

impl Audit {
    fn new() -> Self {
        let state = state();
        let stores = sqlite::open(&state.1.path(files::DATABASE)).unwrap();
        let metrics = Arc::new(Metrics::default());
        let key = state.1.audit_key.expose().as_bytes().to_vec();
        let (writer, sink) = AuditWriter::start(
            stores.audit,
            key.clone(),
            state.1.path(files::AUDIT_HEAD),
            &metrics,
        )
        .unwrap();
        Self {
            sink,
            writer: Some(writer),
            metrics,
            key,
            rt: runtime(),
            state,
        }
    }

    /// One allowed tool call's record, filled in as the pipeline's phases fill it.
    fn write(&self) {
        let mut audit = AuditGuard::start(
            &self.sink,
            &self.metrics,
            &ostiary::ids::request_id(),
            "http",
        );
        audit.update(fill_tool_call_record);
        audit.allow(200);
    }

    fn flush(&self) {
        assert!(self.rt.block_on(self.sink.flush()), "the trail is writable");
    }

    fn close(mut self) {
        assert_eq!(self.rt.block_on(self.sink.close()), 0);
        if let Some(w) = self.writer.take() {
            w.join();
        }
    }
}

fn audit(c: &mut Criterion) {
    let a = Audit::new();
    let mut record = AuditRecord {
        ts_ms: ostiary::store::now_ms(),
        request_id: ostiary::ids::request_id(),
        kind: "http".into(),
        decision: "allow".into(),
        status: Some(200),
        duration_us: 1234,
        ..AuditRecord::default()
    };
    fill_tool_call_record(&mut record);
    let prev = writer::seal(&a.key, writer::GENESIS, 1, "{}");
    let mut file = std::fs::File::create(a.state.0.path().join("fsync.bin")).unwrap();
    let page = vec![0x5a_u8; 1024];

    let mut group = c.benchmark_group("audit");
    // A durable write is milliseconds: criterion's default 100 samples would take minutes.
    group.sample_size(20);
    group.bench_function("seal_baseline", |b| {
        b.iter(|| {
            let json = serde_json::to_string(std::hint::black_box(&record)).unwrap();
            writer::seal(&a.key, &prev, 2, &json)
        })
    });
    // What a signed checkpoint costs per record (the writer digests each row it commits),
    // against the seal every record already pays.
    let json = serde_json::to_string(&record).unwrap();
    let row = ostiary::store::audit::AuditRow {
        seq: 2,
        ts_ms: record.ts_ms,
        session: record.session.clone(),
        decision: record.decision.clone(),
        record: json,
        prev: prev.clone(),
        hash: prev.clone(),
    };
    group.bench_function("checkpoint_digest_row", |b| {
        b.iter(|| {
            let mut digest = RangeDigest::after(ostiary::store::audit::Tip {
                seq: 1,
                hash: prev.clone(),
            });
            assert!(digest.feed(std::hint::black_box(&row)));
            digest
        })
    });
    group.bench_function("fsync_baseline", |b| {
        b.iter(|| {
            file.write_all(&page).unwrap();
            file.sync_data().unwrap();
        })
    });
    group.bench_function("send", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                // Flushed untimed, well inside the writer's queue bound (1,024), past which
                // the trail would count as unavailable.
                let n = left.min(500);
                let t = Instant::now();
                for _ in 0..n {
                    a.write();
                }
                spent += t.elapsed();
                a.flush();
                left -= n;
            }
            spent
        })
    });
    group.bench_function("one_then_flush", |b| {
        b.iter(|| {
            a.write();
            a.flush();
        })
    });
    group.throughput(Throughput::Elements(1_000));
    group.bench_function("burst_1000_then_flush", |b| {
        b.iter(|| {
            for _ in 0..1_000 {
                a.write();
            }
            a.flush();
        })
    });
    group.finish();
    a.close();
}

fn audit_figures() {
    const BURSTS: usize = 30;
    const RECORDS: u32 = 1_000;
    let a = Audit::new();
    let (mut sent, mut durable) = (Vec::new(), Vec::new());
    for _ in 0..BURSTS {
        let t = Instant::now();
        for _ in 0..RECORDS {
            a.write();
        }
        sent.push(t.elapsed() / RECORDS);
        a.flush();
        durable.push(t.elapsed() / RECORDS);
    }
    sent.sort();
    durable.sort();
    println!(
        "audit, {BURSTS} bursts of {RECORDS} records then a flush, per record: queued p50 {:?}, \
         durable (committed and checkpointed) p50 {:?}, worst burst {:?}",
        percentile(&sent, 50),
        percentile(&durable, 50),
        durable[BURSTS - 1]
    );
    a.close();
}

criterion_group!(benches, session_token, classification, leaf, audit);

fn main() {
    leaf_figures();
    audit_figures();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
