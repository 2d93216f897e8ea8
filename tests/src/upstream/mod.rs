//! A real HTTPS (or plain HTTP) upstream for end-to-end tests, which remembers what it saw.
//!
//! Ostiary's promises are about what reaches the upstream: a denied request is *never
//! forwarded*, a held request is executed *exactly once* after approval, injected
//! credentials arrive while agent-supplied ones do not, bodies and trailers stream through
//! intact. Asserting any of that needs a server on the far side that is as real as the
//! proxy's clients (TLS with ALPN `h2`/`http/1.1`, h2 trailers, WebSocket upgrades,
//! streaming bodies) and that records every request it receives. [`Upstream`] is that
//! server: it binds `127.0.0.1:0`, serves a fixed set of routes, and keeps a [`Seen`] per
//! request in shared memory for the test to inspect.
//!
//! Routes (any method unless said otherwise):
//! - `/echo` — 200 JSON describing the request (method, path, query, version, headers,
//!   body length and SHA-256), so a test can see exactly what the proxy forwarded;
//! - `/stream?chunks=N&size=S[&delay_ms=D]` — N chunks of S bytes, D ms apart (default 5),
//!   produced one by one, to prove the proxy streams instead of buffering;
//! - `/upload` — consumes the request body as a stream and answers `{"received": n, "sha256"}`;
//! - `/grpc` — a gRPC-style unary echo: `application/grpc`, the request's length-prefixed
//!   message(s) echoed, and trailers `grpc-status: 0`, `grpc-message: ok` (h2 only carries them);
//! - `/ws` — a WebSocket echo over an HTTP/1.1 Upgrade;
//! - `/reflect[?mode=M]` — a hostile upstream that echoes whatever credential it got: the
//!   request's `Authorization`, `Cookie`, query and `x-*` headers copied into `x-reflect-*`
//!   response headers, `Set-Cookie: s=<authorization>`, and a JSON echo of the whole
//!   request streamed in 3-byte chunks (so a secret straddles frames). `mode` changes the
//!   answer: `sse` (one event per request header), `gzip`/`br`/`zstd`/`deflate` (the echo
//!   compressed whatever `Accept-Encoding` said), `compress` (`Content-Encoding: compress`,
//!   undecodable), `b64` (the echo in base64), `redirect` (302 to
//!   `https://other.example.test:<port>/reflect?auth=<authorization>`), `error` (a 500 HTML
//!   page quoting the request headers), `plain` (a fixed body, no reflection at all),
//!   `names` (also each `authorization`/`x-*` value turned into a header name
//!   `x-n-<value>`), `json_slashes` (the echo with `/` escaped as `\/`, as PHP writes JSON);
//!   `trailers` (the reflection repeated in `x-trailer-*` trailers), `reason` (HTTP/1.1
//!   reason phrase `Echo <authorization>`), `encoding_upper` (`Content-Encoding` set to the
//!   uppercased `x-api-key` value); `delay_ms=D` spaces the chunks;
//! - `/status/{code}` — answers with that status;
//! - `POST /v1/chat/completions`, `POST /v1/messages` — stand-ins for the OpenAI and
//!   Anthropic APIs: a canned chat completion / message (text `Hello from the stand-in.`,
//!   the request's `model` echoed) in the shape their SDKs parse;
//! - `/git/...` — git's smart HTTP, served by `git http-backend` as CGI over the
//!   repositories under [`UpstreamBuilder::git_root`] (404 without one);
//! - `/messages` — a service that stores what it receives and hands it back (a message
//!   board, a request bin, an API that logs headers): `GET` answers 200
//!   `{"messages": [...]}`, every other method stores `{method, path, headers, body}` (the
//!   whole request, query and headers included) and answers 201 `{"stored": n}` without
//!   echoing it. One store for every name the upstream serves, as one service behind
//!   several hostnames;
//! - `/records` — a REST collection whose calls can be reversed: `POST /records` creates a
//!   record (the request's JSON body, an `id` `r<n>` given) and answers 201 `{"id", "n"}`;
//!   `DELETE /records/{id}` removes it (204, or 404 when there is none); `GET /records`
//!   answers `{"records": [...]}` in creation order; `?id=<text>` on the POST makes the
//!   server answer that id instead (a hostile or careless upstream);
//! - anything else — 404.
//!
//! The request body is always read to the end before answering (streamed, never held
//! whole except for `/grpc`), so `Seen::body_len`/`Seen::body_complete` tell whether the
//! proxy delivered the whole body.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::pki::TestCa;

/// The names an upstream answers to unless the test says otherwise.
pub const DEFAULT_NAMES: &[&str] = &["api.example.test", "localhost"];

/// The body type of every response the upstream sends.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Arrival order, unique per server.
    pub id: u64,
    pub method: Method,
    /// Path and query as received, e.g. `/echo?a=1`.
    pub path: String,
    /// The full request target as hyper parsed it (absolute for h2 and absolute-form h1).
    pub uri: String,
    pub version: Version,
    /// Header names are lowercase (hyper normalises them).
    pub headers: HeaderMap,
    /// Body bytes received so far; final once `body_complete` is true.
    pub body_len: u64,
    /// The body reached its end (as opposed to the peer resetting or hanging up mid-body).
    pub body_complete: bool,
    /// Hex SHA-256 of the whole body, once it is complete.
    pub body_sha256: Option<String>,
    /// Trailers that came after the body, if any.
    pub trailers: Option<HeaderMap>,
    /// The TLS SNI the client sent, `None` on plain HTTP or when no SNI was sent.
    pub sni: Option<String>,
    pub peer: SocketAddr,
}

impl Seen {
    /// The first value of header `name` (case-insensitive), if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The path without its query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or_default()
    }
}

/// Configures an [`Upstream`] before it starts.
#[derive(Debug, Clone)]
pub struct UpstreamBuilder {
    names: Vec<String>,
    tls: bool,
    http2: bool,
    ca: Option<TestCa>,
    client_ca_pem: Option<String>,
    git_root: Option<PathBuf>,
}

impl Default for UpstreamBuilder {
    fn default() -> Self {
        Self {
            names: DEFAULT_NAMES.iter().map(|s| s.to_string()).collect(),
            tls: true,
            http2: true,
            ca: None,
            client_ca_pem: None,
            git_root: None,
        }
    }
}

impl UpstreamBuilder {
    /// Names the certificate covers (DNS names or IP addresses); the first one is also
    /// the host of [`Upstream::url`]. Default: `["api.example.test", "localhost"]`.
    pub fn names(mut self, names: &[&str]) -> Self {
        self.names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// HTTPS (default) or plain HTTP (`false`; h1 and h2c with prior knowledge).
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// `false` makes the server speak HTTP/1.1 only and advertise only `http/1.1` in
    /// ALPN, to test a proxy talking to an upstream that lacks h2.
    pub fn http2(mut self, http2: bool) -> Self {
        self.http2 = http2;
        self
    }

    /// Require a client certificate issued by this CA (PEM) on every TLS connection (mTLS);
    /// the handshake fails without one. [`Upstream::client_certs`] lists what was presented.
    pub fn client_ca(mut self, pem: &str) -> Self {
        self.client_ca_pem = Some(pem.to_owned());
        self
    }

    /// Serve the git repositories under `root` at `/git/<path below root>` (smart HTTP,
    /// `git http-backend`; every repository exported, pushes refused by git's default).
    pub fn git_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.git_root = Some(root.into());
        self
    }

    /// Issue the server certificate from this CA instead of a fresh one, so several
    /// upstreams can be trusted through one CA file.
    pub fn ca(mut self, ca: &TestCa) -> Self {
        self.ca = Some(ca.clone());
        self
    }

    /// Binds `127.0.0.1:0` and starts serving in the background of the current tokio
    /// runtime. Panics on failure: a test without its upstream cannot say anything.
    pub async fn start(self) -> Upstream {
        self.try_start().await.expect("starting the test upstream")
    }

    /// Like [`UpstreamBuilder::start`], with the error returned.
    pub async fn try_start(self) -> Result<Upstream> {
        let (upstream, listener, launch) = self.prepare()?;
        let listener = TcpListener::from_std(listener).context("registering the listener")?;
        tokio::spawn(launch.run(listener));
        Ok(upstream)
    }

    /// Starts the server on a runtime of its own, in a background thread, for tests that
    /// block (a synchronous `#[test]`, `std::process::Command`, or a current-thread runtime
    /// busy with something else). Dropping the [`Upstream`] stops the thread and waits for it.
    pub fn start_detached(self) -> Upstream {
        self.try_start_detached()
            .expect("starting the detached test upstream")
    }

    /// Like [`UpstreamBuilder::start_detached`], with the error returned.
    pub fn try_start_detached(self) -> Result<Upstream> {
        let (mut upstream, listener, launch) = self.prepare()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("building the upstream's runtime")?;
        let thread = std::thread::Builder::new()
            .name(format!("test-upstream-{}", upstream.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => launch.run(listener).await,
                        Err(e) => eprintln!("test upstream: registering the listener: {e}"),
                    }
                });
                // Connection tasks die with the runtime, which is the point of a shutdown.
                runtime.shutdown_background();
            })
            .context("spawning the upstream's thread")?;
        upstream.thread = Some(thread);
        Ok(upstream)
    }

    /// Everything but the runtime: bound listener, certificate, the handle the test keeps.
    fn prepare(self) -> Result<(Upstream, std::net::TcpListener, Launch)> {
        anyhow::ensure!(
            !self.names.is_empty(),
            "an upstream needs at least one name"
        );
        let ca = self.ca.unwrap_or_default();
        let acceptor = if self.tls {
            let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
            let alpn: &[&[u8]] = if self.http2 {
                &[b"h2", b"http/1.1"]
            } else {
                &[b"http/1.1"]
            };
            Some(match &self.client_ca_pem {
                Some(pem) => mtls_acceptor(&ca, &names, alpn, pem)?,
                None => tls_acceptor(&ca, &names, alpn)?,
            })
        } else {
            None
        };
        // Bound here, synchronously, so the port is known and accepting before start returns.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = ServerState::default();
        let (stop_tx, stop_rx) = watch::channel(false);
        let launch = Launch {
            acceptor,
            state: state.clone(),
            options: ServeOptions {
                http2: self.http2,
                git_root: self.git_root,
                ..ServeOptions::default()
            },
            stop: stop_rx,
        };
        let upstream = Upstream {
            addr,
            names: self.names,
            tls: self.tls,
            ca,
            state,
            stop: stop_tx,
            thread: None,
        };
        Ok((upstream, listener, launch))
    }
}

/// What the server task needs, ready to run on whichever runtime.
struct Launch {
    acceptor: Option<TlsAcceptor>,
    state: ServerState,
    options: ServeOptions,
    stop: watch::Receiver<bool>,
}

impl Launch {
    async fn run(self, listener: TcpListener) {
        let mut stop = self.stop;
        let shutdown = async move {
            // A dropped sender means the Upstream is gone, which is also a shutdown.
            let _ = stop.wait_for(|stop| *stop).await;
        };
        serve(listener, self.acceptor, self.state, self.options, shutdown).await;
    }
}

/// A running test upstream; it stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    names: Vec<String>,
    tls: bool,
    ca: TestCa,
    state: ServerState,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    pub fn builder() -> UpstreamBuilder {
        UpstreamBuilder::default()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The names the certificate covers; the first is the one [`Upstream::url`] uses.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The first name, which tests map to 127.0.0.1 (`egress.resolve`, `curl --resolve`).
    pub fn host(&self) -> &str {
        &self.names[0]
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// `https://<first name>:<port><path>` (or `http://` without TLS).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}{path}", self.host(), self.port())
    }

    /// `<first name>:<port>:127.0.0.1`, the argument of `curl --resolve`.
    pub fn resolve_arg(&self) -> String {
        format!("{}:{}:127.0.0.1", self.host(), self.port())
    }

    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// PEM of the CA that issued this upstream's certificate.
    pub fn ca_pem(&self) -> String {
        self.ca.ca_pem()
    }

    /// Writes the CA PEM into `dir` and returns the file's path.
    pub fn write_ca(&self, dir: impl AsRef<Path>) -> PathBuf {
        self.ca.write_ca(dir)
    }

    /// A snapshot of every request received so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().clone()
    }

    /// The requests whose path (query excluded) is `path`.
    pub fn seen_path(&self, path: &str) -> Vec<Seen> {
        self.state
            .lock()
            .iter()
            .filter(|s| s.path_only() == path)
            .cloned()
            .collect()
    }

    /// How many requests for `path` (query excluded) arrived.
    pub fn count(&self, path: &str) -> usize {
        self.state
            .lock()
            .iter()
            .filter(|s| s.path_only() == path)
            .count()
    }

    /// The shared record itself, for tests that want to clear it between phases.
    pub fn seen_handle(&self) -> Arc<Mutex<Vec<Seen>>> {
        self.state.seen.clone()
    }

    /// What the `/idem/` route applied, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.state
            .effects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the `/messages` route stored, in order.
    /// `/records`: the live records, in creation order.
    pub fn records(&self) -> Vec<serde_json::Value> {
        self.state
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    pub fn messages(&self) -> Vec<serde_json::Value> {
        self.state
            .messages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// DER of each client certificate presented to this upstream (mTLS), in order.
    pub fn client_certs(&self) -> Vec<Vec<u8>> {
        self.state
            .client_certs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// TCP connections accepted so far, TLS handshake or not: zero proves that nothing
    /// (not even a CONNECT that was later denied) reached this server.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests for `path` arrived, for effects the proxy
    /// produces asynchronously (an approved request executed in the background).
    /// Returns whether the count was reached before `timeout`.
    pub async fn wait_for_count(&self, path: &str, n: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.count(path) >= n {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            // Joined so the port is closed once drop returns; the thread needs nothing
            // from the caller's runtime, so this cannot deadlock.
            let _ = thread.join();
        }
    }
}

/// What a server shares with its test: the request record and a connection count.
#[derive(Debug, Clone, Default)]
pub struct ServerState {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicUsize>,
    /// DER of the leaf client certificate of each mTLS handshake, in order.
    pub client_certs: Arc<Mutex<Vec<Vec<u8>>>>,
    /// `/idem/...`: the effect of each `Idempotency-Key` (path, body digest), applied once.
    pub effects: Arc<Mutex<Vec<Effect>>>,
    /// `/messages`: each stored request, as the route hands it back.
    pub messages: Arc<Mutex<Vec<serde_json::Value>>>,
    /// `/records`: the live records, in creation order, and how many were ever made.
    pub records: Arc<Mutex<(Vec<serde_json::Value>, u64)>>,
    next_id: Arc<AtomicU64>,
}

/// One request the `/idem/` route applied (a retry with the same `Idempotency-Key` is
/// answered from the first one and applies nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// The `Idempotency-Key`, or `None` when the request carried none.
    pub key: Option<String>,
    pub method: String,
    pub path: String,
    pub body_sha256: String,
}

impl ServerState {
    fn lock(&self) -> MutexGuard<'_, Vec<Seen>> {
        // A panicking test thread must not hide what the server saw from the others.
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, req: &Request<Incoming>, peer: SocketAddr, sni: Option<&str>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let seen = Seen {
            id,
            method: req.method().clone(),
            path: req
                .uri()
                .path_and_query()
                .map(|pq| pq.as_str().to_owned())
                .unwrap_or_else(|| "/".to_owned()),
            uri: req.uri().to_string(),
            version: req.version(),
            headers: req.headers().clone(),
            body_len: 0,
            body_complete: false,
            body_sha256: None,
            trailers: None,
            sni: sni.map(str::to_owned),
            peer,
        };
        self.lock().push(seen);
        id
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut Seen)) {
        // Searched by id rather than index because a test may clear the record mid-request.
        if let Some(seen) = self.lock().iter_mut().rev().find(|s| s.id == id) {
            f(seen);
        }
    }
}

/// Knobs of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Serve h2 as well as HTTP/1.1.
    pub http2: bool,
    /// Give up on a client that has not finished the TLS handshake by then.
    pub handshake_timeout: Duration,
    /// Repositories served at `/git/...` by `git http-backend` (none when `None`).
    pub git_root: Option<PathBuf>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            http2: true,
            handshake_timeout: Duration::from_secs(10),
            git_root: None,
        }
    }
}

/// Like [`tls_acceptor`], requiring a client certificate that chains to `client_ca_pem`.
pub fn mtls_acceptor(
    ca: &TestCa,
    names: &[&str],
    alpn: &[&[u8]],
    client_ca_pem: &str,
) -> Result<TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    let (chain, key) = ca.issue_rustls(names);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots
            .add(cert.context("client CA PEM")?)
            .context("client CA certificate")?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("client verifier")?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("server certificate")?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A rustls acceptor with a certificate from `ca` for `names`, offering `alpn`.
pub fn tls_acceptor(ca: &TestCa, names: &[&str], alpn: &[&[u8]]) -> Result<TlsAcceptor> {
    let (chain, key) = ca.issue_rustls(names);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("server certificate")?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves the upstream routes on `listener` until `shutdown` completes; then stops
/// accepting and drops every open connection (WebSockets included).
///
/// [`Upstream`] wraps this; it is public for tests that need the server on a listener
/// of their own (a fixed port, a second replica sharing one `state`).
pub async fn serve(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    state: ServerState,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    // Connection tasks outlive the accept loop's borrow of `shutdown`, so they get
    // their own signal, raised when `shutdown` completes.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Usually EMFILE; back off instead of spinning.
                    eprintln!("test upstream: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        let conn = Connection {
            state: state.clone(),
            options: options.clone(),
            peer,
            stop: stop_rx.clone(),
        };
        tokio::spawn(conn.run(stream, acceptor.clone()));
    }
    let _ = stop_tx.send(true);
}

mod connection;
use connection::Connection;

mod reflect;
mod routes;
pub use routes::plain_reflect_body;

/// A gRPC message as the `/grpc` route expects it: flag byte, 4-byte big-endian length,
/// payload.
pub fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}
