//! The two handles a running proxy hands out, each holding only what its listener uses:
//! [`DataPlane`] for the agent-facing path (accept, CONNECT, tunnels, the request pipeline)
//! and [`ControlPlane`] for the control API. [`crate::server`] builds both from the same
//! components; background tasks get the narrower handles of the modules they run
//! ([`crate::lifecycle::Teardown`], [`crate::approvals::Executor`],
//! [`crate::guardrails::pause::Desk`], [`crate::policy_store::Reloader`]).
//!
//! Domain modules (approvals, guardrails, checks, the policy store) never see either
//! handle: they take the components they use.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::approvals::{ApprovalQueue, Executor};
use crate::audit::{AuditGuard, AuditSink};
use crate::check::Checks;
use crate::classify::Tunnel;
use crate::config::Config;
use crate::egress::address::Host;
use crate::egress::Guard;
use crate::forward::Upstreams;
use crate::guardrails::pause::{Desk, Trips};
use crate::guardrails::Guardrails;
use crate::ids;
use crate::inject::credentials::Credentials;
use crate::lifecycle::{StreamWatch, Teardown};
use crate::metrics::Metrics;
use crate::policy_store::{PolicyStore, Reloader};
use crate::session::{Principal, SessionRegistry};
use crate::state::SecretString;
use crate::tls::ca::LeafMinter;
use crate::tunnel::Ended;

/// The proxy listener's address: the configured one until `serve` has bound it. Shared by
/// both planes (proxy URLs, review links, the self-connect guard).
#[derive(Debug, Clone)]
pub struct ProxyAddr {
    bound: Arc<OnceLock<SocketAddr>>,
    configured: SocketAddr,
}

impl ProxyAddr {
    pub fn new(configured: SocketAddr) -> Self {
        Self {
            bound: Arc::new(OnceLock::new()),
            configured,
        }
    }

    /// Set once, when the listener is bound.
    pub fn bind(&self, addr: SocketAddr) {
        let _ = self.bound.set(addr);
    }

    pub fn get(&self) -> SocketAddr {
        self.bound.get().copied().unwrap_or(self.configured)
    }
}

/// What the agent-facing path uses: decisions, credentials, checks, guardrails, holds and
/// the audit trail — not the admin token, not the database path.
#[derive(Debug)]
pub struct DataPlane {
    pub config: Arc<Config>,
    /// The policy set in force; requests take [`PolicyStore::current`] once.
    pub policies: Arc<PolicyStore>,
    pub sessions: Arc<SessionRegistry>,
    pub guard: Arc<Guard>,
    pub upstreams: Upstreams,
    /// The credential broker and what the proxy derives from its credentials.
    pub credentials: Arc<Credentials>,
    /// Where requests are held for a human (and collected once decided).
    pub approvals: Arc<ApprovalQueue>,
    /// The tier checks.
    pub checks: Arc<Checks>,
    /// Session budgets, rate limits, the loop watchdog, idempotency, in-flight requests.
    pub guardrails: Arc<Guardrails>,
    /// Where a watchdog trip goes to be put before a human ([`Desk`]).
    pub trips: Trips,
    pub minter: LeafMinter,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    pub ca_pem: String,
    pub tunnel_hosts: HashSet<Host>,
    pub proxy_addr: ProxyAddr,
    /// What runs ask of the proxy itself at the reserved name `ostiary.internal`
    /// (checkpoints, child runs); `None` without triggers (the name is still never resolved).
    pub internal: Option<Arc<crate::runs::internal::Internal>>,
    /// Where the undos of calls that succeeded are recorded (docs/undo.md).
    pub undo: Arc<dyn crate::store::undo::UndoStore>,
}

impl DataPlane {
    /// Whether CONNECTs to `host` are relayed uninspected.
    pub fn is_tunnel_host(&self, host: &Host) -> bool {
        self.tunnel_hosts.contains(host)
    }

    /// The proxy listener's address as bound (the configured one before `serve`).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr.get()
    }

    /// Tie a stream of `principal`'s session to the session's life
    /// ([`crate::lifecycle::watch_stream`]).
    pub fn watch_stream(&self, principal: &Principal) -> Option<StreamWatch> {
        crate::lifecycle::watch_stream(&self.guardrails, &self.sessions, principal)
    }

    /// Record a stream the proxy cut ([`crate::lifecycle::record_cut`]).
    pub fn record_cut(&self, at: &Tunnel, what: &str, ended: Ended) {
        crate::lifecycle::record_cut(&self.audit, &self.metrics, at, what, ended)
    }

    /// Record a tunnel cut off after CONNECT was accepted (TLS or SNI refused): there is no
    /// HTTP exchange left to answer, so the audit record is the only trace. `kind` is `tls`
    /// for intercepted tunnels and `tunnel` for uninspected ones.
    pub fn refuse_tunnel(&self, tunnel: &Tunnel, kind: &str, reason: String) {
        let request_id = ids::request_id();
        let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, kind);
        audit.update(|r| r.set_tunnel(tunnel));
        tracing::info!(request_id, host = %tunnel.host, kind, reason, "tunnel refused");
        audit.refuse(&crate::error::ProxyError::bad_request(reason), 0);
    }
}

/// What the control API uses: sessions and their teardown, approvals and their execution,
/// pauses, policy reloads, the audit trail, and the admin token it checks.
#[derive(Debug)]
pub struct ControlPlane {
    pub config: Arc<Config>,
    pub sessions: Arc<SessionRegistry>,
    pub approvals: Arc<ApprovalQueue>,
    pub guardrails: Arc<Guardrails>,
    /// The broker's bindings, for the placeholders a new session is handed.
    pub credentials: Arc<Credentials>,
    pub teardown: Teardown,
    pub executor: Executor,
    pub desk: Desk,
    pub reloader: Reloader,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    pub ca_pem: String,
    pub admin_token: SecretString,
    /// The trail on a read-only connection, for audit queries (never the writer's).
    pub trail: Arc<dyn crate::store::audit::AuditStore>,
    /// The database file (what an operator inspects; tests look through it for leaks).
    pub db_path: PathBuf,
    pub proxy_addr: ProxyAddr,
    /// Runs started by triggers, when any trigger is configured.
    pub runs: Option<crate::control::runs::RunsControl>,
    /// Sends a session's recorded undos (`POST /v1/sessions/{id}/undo`).
    pub undo: crate::undo::Reverser,
}

impl ControlPlane {
    /// The proxy URL an agent uses, with its token as the password.
    pub fn proxy_url(&self, token: &str) -> String {
        format!("http://agent:{token}@{}", self.proxy_addr.get())
    }
}
