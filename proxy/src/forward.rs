//! Phase `forward`: send the request upstream over a pooled connection and stream the
//! response back. Dials go through the egress guard inside [`UpstreamConnector`].
//!
//! Two pools: the general one negotiates `h2` or `http/1.1` by ALPN, for agents speaking
//! HTTP/2; the HTTP/1.1-only one serves agents speaking HTTP/1.1 (the protocol the agent
//! chose, as Envoy's `USE_DOWNSTREAM_PROTOCOL`) and WebSocket handshakes, which cannot ride
//! an h2 connection.
//!
//! A request carrying an mTLS credential goes through a client of its own, built for that
//! one certificate and cached while the credential lives: pooled connections that present
//! one session's certificate are never reused for another session's requests.
//!
//! Each event loop of the proxy listener ([`crate::shards`]) has pools of its own: an
//! upstream connection is driven by a task on the loop that dialed it, and a request from
//! another loop checking it out would wake that loop's thread twice (to write, and to hand
//! back the answer).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use ostiary_broker::{Held, Material};
use rustls::{ClientConfig, RootCertStore};

use crate::body::ProxyBody;
use crate::connector::{UpstreamConnector, UpstreamTlsFailure};
use crate::egress::{EgressError, Guard};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::tls::upstream::{self, UpstreamTlsError};

type Pool = Client<UpstreamConnector, ProxyBody>;

/// The pooled upstream clients.
#[derive(Clone)]
pub struct Upstreams {
    guard: Arc<Guard>,
    roots: Arc<RootCertStore>,
    /// The general and HTTP/1.1-only pools, one pair per event loop.
    loops: Box<[(Pool, Pool)]>,
    /// One client per mTLS credential (keyed by the broker's credential id).
    mtls: moka::sync::Cache<u64, (Pool, Pool)>,
    response_timeout: Duration,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("mtls_clients", &self.mtls.entry_count())
            .finish_non_exhaustive()
    }
}

/// Idle upstream connections kept per host and pool.
const IDLE_PER_HOST: usize = 32;

/// The most an HTTP/1.1 upstream connection reads ahead, and so the largest piece of a body
/// it hands on (hyper's default, ~400 KiB, is what each streaming connection held on this
/// side alone).
pub const UPSTREAM_READ_BUFFER: usize = 64 * 1024;

/// The largest answer head taken from an upstream (as Envoy's 60 KiB default). hyper refuses
/// a head past its buffer only when the head arrives in more than one read; this bound is
/// what makes the refusal the same whichever way the bytes came, and for h2 too.
pub const MAX_UPSTREAM_HEAD_BYTES: usize = UPSTREAM_READ_BUFFER;

/// A head's size as written on HTTP/1.1: each line with its `: ` and CRLF.
fn head_bytes(response: &Response<Incoming>) -> usize {
    let lines: usize = response
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    "HTTP/1.1 200 \r\n\r\n".len() + lines
}

/// The two pools (ALPN h2+h1, and h1 only) over one TLS configuration.
fn pools(guard: &Arc<Guard>, tls: ClientConfig) -> (Pool, Pool) {
    let mut h1_only = tls.clone();
    h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
    let build = |tls: ClientConfig| {
        Client::builder(TokioExecutor::new())
            .http1_max_buf_size(UPSTREAM_READ_BUFFER)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            // HTTP/1.1 agents get an upstream connection each while a request is out;
            // idle ones past this are closed rather than kept per agent connection (1,000
            // idle agents held 1,000 upstream TLS sessions otherwise).
            .pool_max_idle_per_host(IDLE_PER_HOST)
            .build(UpstreamConnector::new(guard.clone(), Arc::new(tls)))
    };
    (build(tls), build(h1_only))
}

impl Upstreams {
    /// Build the pools over `guard` for `loops` event loops (at least one pair),
    /// verifying upstream certificates against `roots`.
    pub fn new(
        guard: Arc<Guard>,
        roots: Arc<RootCertStore>,
        response_timeout: Duration,
        loops: usize,
    ) -> Result<Self, UpstreamTlsError> {
        let tls = upstream::plain_config(roots.clone())?;
        let loops = (0..loops.max(1))
            .map(|_| pools(&guard, tls.clone()))
            .collect();
        Ok(Self {
            guard,
            roots,
            loops,
            mtls: moka::sync::Cache::builder()
                .max_capacity(10_000)
                // A client outlives its credential by at most this much idle time; teardown
                // drops it at once ([`Upstreams::forget`]).
                .time_to_idle(Duration::from_secs(300))
                .build(),
            response_timeout,
        })
    }

    /// Drop the client of an mTLS credential (teardown, expiry).
    pub fn forget(&self, credential_id: u64) {
        self.mtls.invalidate(&credential_id);
    }

    /// The pools to use for a request with the client identity `identity`, if any.
    fn pools_for(&self, identity: Option<&Held>) -> Result<(Pool, Pool), ProxyError> {
        let Some(held) = identity else {
            // Off the loops (an approved request executing, or `listen.proxy_threads = 0`):
            // the first pair.
            let at = crate::shards::current().unwrap_or(0) % self.loops.len();
            return Ok(self.loops[at].clone());
        };
        let Material::ClientCert(id) = &held.credential.material else {
            return Err(ProxyError::Internal {
                reason: format!(
                    "credential {} is not a client certificate",
                    held.binding.name
                ),
            });
        };
        self.mtls
            .try_get_with(held.id, || {
                upstream::mtls_config(self.roots.clone(), &id.cert_chain_pem, id.key_pem.expose())
                    .map(|tls| pools(&self.guard, tls))
            })
            .map_err(|e| ProxyError::CredentialUnavailable {
                credential: held.binding.name.clone(),
                cause: e.to_string(),
            })
    }

    /// Send a prepared request; the response head within the configured timeout. With an
    /// `identity`, the connection presents that client certificate; `h1_only` (a WebSocket
    /// handshake, an agent speaking HTTP/1.1) keeps it off h2 connections.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        h1_only: bool,
        identity: Option<&Held>,
        metrics: &Metrics,
    ) -> Result<Response<Incoming>, ProxyError> {
        let (general, h1) = self.pools_for(identity)?;
        let client = if h1_only { &h1 } else { &general };
        let started = Instant::now();
        let result = tokio::time::timeout(self.response_timeout, client.request(req)).await;
        metrics
            .upstream_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(response)) => match head_bytes(&response) {
                head if head > MAX_UPSTREAM_HEAD_BYTES => Err(ProxyError::Upstream {
                    reason: format!(
                        "the answer's head is {head} bytes, over the {} KiB it may take",
                        MAX_UPSTREAM_HEAD_BYTES / 1024
                    ),
                }),
                _ => Ok(response),
            },
            Ok(Err(e)) => Err(classify_error(&e)),
            Err(_) => Err(ProxyError::UpstreamTimeout {
                reason: format!(
                    "no response head within {}",
                    humantime::format_duration(self.response_timeout)
                ),
            }),
        }
    }
}

/// Map a client error to the refusal it stands for, keeping the reason.
fn classify_error(err: &hyper_util::client::legacy::Error) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(egress) = e.downcast_ref::<EgressError>() {
            return match egress {
                EgressError::Blocked { address, reason } => ProxyError::DestinationBlocked {
                    address: address.clone(),
                    reason: reason.clone(),
                },
                EgressError::Timeout { .. } => ProxyError::UpstreamTimeout {
                    reason: egress.to_string(),
                },
                other => ProxyError::Upstream {
                    reason: other.to_string(),
                },
            };
        }
        if let Some(tls) = e.downcast_ref::<UpstreamTlsFailure>() {
            return ProxyError::Upstream {
                reason: tls.to_string(),
            };
        }
        source = e.source();
    }
    let mut reason = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        reason.push_str(": ");
        reason.push_str(&e.to_string());
        source = e.source();
    }
    ProxyError::Upstream { reason }
}
