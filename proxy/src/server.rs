//! Assembling a running proxy: state directory, policies, store, sessions, guard, pools,
//! audit writer — and serving the two listeners until shutdown.
//!
//! Servers take bound listeners and a shutdown future (tests bind port 0); nothing here
//! binds a socket by itself.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ostiary_policies::PolicyEngine;
use tokio::net::TcpListener;

use crate::approvals::link::LinkSigner;
use crate::approvals::notify::Notifier;
use crate::approvals::store::ApprovalStore;
use crate::approvals::ApprovalQueue;
use crate::audit::{AuditGuard, AuditSink, AuditWriter};
use crate::check::Checks;
use crate::classify::Tunnel;
use crate::config::Config;
use crate::egress::address::Host;
use crate::egress::{Dial, Guard, Resolve, SystemResolver, TcpDialer};
use crate::forward::Upstreams;
use crate::guardrails::store::GuardStore;
use crate::guardrails::Guardrails;
use crate::inject::credentials::Credentials;
use crate::lease_journal::{self, SqliteJournal};
use crate::metrics::Metrics;
use crate::policy_store::{self, PolicyStore};
use crate::session::{SessionRegistry, TokenKeys};
use crate::state::{files, SecretString, StateDir};
use crate::tls::ca::LeafMinter;
use crate::{accept, approvals, control, ids, lifecycle, store, tls};
use ostiary_broker::vault::VaultClient;
use ostiary_broker::Broker;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("policies: {0}")]
    Policy(#[from] ostiary_policies::LoadError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Session(#[from] crate::session::SessionError),
    #[error(transparent)]
    Ca(#[from] crate::tls::ca::CaError),
    #[error(transparent)]
    UpstreamTls(#[from] crate::tls::upstream::UpstreamTlsError),
    #[error("listener: {0}")]
    Listener(#[from] std::io::Error),
    #[error("credential broker: {0}")]
    Broker(#[from] ostiary_broker::BrokerError),
    #[error("credential broker: {0}")]
    Vault(#[from] ostiary_broker::vault::VaultError),
    #[error("checks: {0}")]
    Checks(#[from] crate::check::webhook::WebhookError),
    #[error("approval notifications: {0}")]
    Notify(#[from] crate::approvals::notify::message::NotifyError),
    /// The audit chain no longer matches its checkpoint: serve refuses to extend it.
    #[error(transparent)]
    Audit(#[from] crate::audit::ChainError),
}

/// Seams for tests: where names are resolved and how sockets are dialed.
#[derive(Debug, Clone)]
pub struct Options {
    pub resolver: Arc<dyn Resolve>,
    pub dialer: Arc<dyn Dial>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            dialer: Arc::new(TcpDialer),
        }
    }
}

/// Everything the request path shares.
#[derive(Debug)]
pub struct Shared {
    pub config: Config,
    /// The policy set in force; requests take [`PolicyStore::current`] once.
    pub policies: PolicyStore,
    pub sessions: SessionRegistry,
    pub guard: Arc<Guard>,
    pub upstreams: Upstreams,
    /// The credential broker and what the proxy derives from its credentials.
    pub credentials: Credentials,
    /// Requests held for a human.
    pub approvals: ApprovalQueue,
    /// The tier checks.
    pub checks: Checks,
    /// Session budgets, rate limits, the loop watchdog, idempotency, in-flight requests.
    pub guardrails: Guardrails,
    pub minter: LeafMinter,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    pub ca_pem: String,
    pub admin_token: SecretString,
    pub db_path: PathBuf,
    tunnel_hosts: HashSet<Host>,
    proxy_addr: OnceLock<SocketAddr>,
}

impl Shared {
    /// Whether CONNECTs to `host` are relayed uninspected.
    pub fn is_tunnel_host(&self, host: &Host) -> bool {
        self.tunnel_hosts.contains(host)
    }

    /// The proxy listener's address as bound (the configured one before `serve`).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
            .get()
            .copied()
            .unwrap_or(self.config.listen.proxy)
    }

    /// The proxy URL an agent uses, with its token as the password.
    pub fn proxy_url(&self, token: &str) -> String {
        format!("http://agent:{token}@{}", self.proxy_addr())
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

    /// Record a session lifecycle event in the audit chain.
    pub fn audit_session_event(&self, session: &str, agent: &str, tenant: &str, what: &str) {
        let request_id = ids::request_id();
        let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "session");
        audit.update(|r| {
            r.session = Some(session.to_owned());
            r.agent = (!agent.is_empty()).then(|| agent.to_owned());
            r.tenant = (!tenant.is_empty()).then(|| tenant.to_owned());
            r.reason = Some(what.to_owned());
        });
        audit.allow(0);
    }
}

/// Log in to Vault if start-up could not (retrying with backoff), then keep the token
/// alive, until `shutdown`.
async fn vault_session(
    shared: Arc<Shared>,
    config: ostiary_broker::vault::VaultConfig,
    shutdown: impl Future<Output = ()>,
) {
    let broker = &shared.credentials.broker;
    tokio::pin!(shutdown);
    let mut wait = std::time::Duration::from_secs(1);
    while broker.awaits_vault() {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match VaultClient::connect(&config).await {
            Ok(client) => {
                tracing::info!(addr = %config.addr, "logged in to vault");
                broker.set_vault(Arc::new(client));
            }
            Err(e) => {
                tracing::warn!(addr = %config.addr, error = %e, "vault login failed; retrying");
                wait = (wait * 2).min(std::time::Duration::from_secs(30));
            }
        }
    }
    if let Some(vault) = broker.vault().cloned() {
        vault.keep_token_alive(shutdown).await;
    }
}

/// A built proxy, ready to serve.
#[derive(Debug)]
pub struct Ostiary {
    shared: Arc<Shared>,
    writer: AuditWriter,
}

/// Load the policy set as the server would (the policy directory, or the embedded library
/// when the default directory is absent); see [`policy_store::build`].
pub fn load_policies(config: &Config) -> Result<PolicyEngine, ServeError> {
    Ok(policy_store::build(&config.policy)?)
}

impl Ostiary {
    /// Open state, load policies, log in to Vault if configured, start the audit writer.
    pub async fn build(config: Config, options: Options) -> Result<Self, ServeError> {
        for section in config.unenforced_sections() {
            tracing::warn!(
                section,
                "config section accepted but not enforced by this version"
            );
        }
        let state = StateDir::open_or_create(&config.state.dir)?;
        let policies = PolicyStore::open(config.policy.clone())?;
        if policies.watched_dir().is_none() {
            tracing::info!(
                "policy directory {} not found; using the embedded library",
                config.policy.dir.display()
            );
        }
        tracing::info!(policies = policies.current().len(), dir = %config.policy.dir.display(), "policies loaded");
        let metrics = Arc::new(Metrics::default());
        metrics.set_policy_generation(policies.generation());

        let db_path = state.path(files::DATABASE);
        let (writer, audit) = AuditWriter::start(
            store::open(&db_path)?,
            state.audit_key.expose().as_bytes().to_vec(),
            state.path(files::AUDIT_HEAD),
            &metrics,
        )?;
        let keys = TokenKeys::from_pem(state.signing_key_pem.expose(), &state.verify_key_pem)
            .map_err(crate::session::SessionError::from)?;
        let sessions = SessionRegistry::load(keys, store::open(&db_path)?, &config.sessions)?;
        let guardrails = Guardrails::load(GuardStore::open(&db_path)?, config.sessions.clone())?;
        let guard = Arc::new(Guard::new(
            options.resolver,
            options.dialer,
            config.egress.resolve.clone(),
            config.egress.allow_private.clone(),
            config.proxy.connect_timeout,
        ));
        let roots = Arc::new(tls::upstream::root_store(&config.egress.ca_file)?);
        let upstreams = Upstreams::new(guard.clone(), roots, config.proxy.upstream_timeout)?;
        let journal = Arc::new(SqliteJournal::start(&db_path)?);
        let file = Some(config.broker.file.clone());
        let broker = match &config.broker.vault {
            Some(vault) if config.broker.backend == "vault" => {
                let broker = Broker::awaiting_vault(config.credential.clone(), file)?;
                // One try now, so that a reachable Vault serves the first request; if it
                // fails, Ostiary serves anyway (file sources, uncredentialed hosts) and
                // keeps trying in the background ([`vault_session`]).
                match VaultClient::connect(vault).await {
                    Ok(client) => {
                        tracing::info!(addr = %vault.addr, "logged in to vault");
                        broker.set_vault(Arc::new(client));
                    }
                    Err(e) => tracing::error!(
                        addr = %vault.addr,
                        error = %e,
                        "vault login failed; retrying in the background, vault credentials unavailable meanwhile"
                    ),
                }
                broker
            }
            _ => Broker::new(config.credential.clone(), file, None)?,
        }
        .with_journal(journal);
        // A tool that names a credential no binding defines would run without it: say so
        // at start-up rather than at the first call. Without any binding (the bare default,
        // whose library names credentials for illustration) there is nothing to misspell.
        let tools = policies.current();
        let tools = if broker.bindings().is_empty() {
            &[][..]
        } else {
            tools.catalog().tools()
        };
        for tool in tools {
            if let Some(name) = tool.credential() {
                if broker.binding(name).is_none() {
                    tracing::warn!(
                        tool = tool.name(),
                        credential = name,
                        "the tool catalog names a credential that no [[credential]] binding defines"
                    );
                }
            }
        }
        // Leases a previous run fetched: nothing holds them now, so they are revoked on
        // the reaper's first pass (and retried, quarantined, while Vault refuses).
        let leftovers = lease_journal::load(&db_path)?;
        if !leftovers.is_empty() {
            tracing::info!(
                leases = leftovers.len(),
                "revoking leases left by a previous run"
            );
            broker.adopt(leftovers);
        }
        let credentials = Credentials::new(Arc::new(broker), &metrics);
        let approvals = ApprovalQueue::new(
            ApprovalStore::open(&db_path)?,
            config.approvals.clone(),
            Notifier::from_config(&config.approvals)?,
            LinkSigner::new(state.approvals_key.expose().as_bytes()),
            audit.clone(),
            metrics.clone(),
        );
        let checks = Checks::new(config.tiers.clone(), &config.checks)?;
        checks.prepare(policies.current().catalog());
        let minter = LeafMinter::new(&state.ca_cert_pem, state.ca_key_pem.expose())?;
        let tunnel_hosts = config
            .egress
            .tunnel
            .iter()
            .filter_map(|h| match crate::egress::address::normalize_host(h) {
                Ok(host) => Some(host),
                Err(e) => {
                    tracing::error!(host = %h, error = %e, "egress.tunnel entry ignored");
                    None
                }
            })
            .collect();
        let shared = Arc::new(Shared {
            policies,
            sessions,
            guard,
            upstreams,
            credentials,
            approvals,
            checks,
            guardrails,
            minter,
            audit,
            metrics,
            ca_pem: state.ca_cert_pem.clone(),
            admin_token: state.admin_token.clone(),
            db_path,
            tunnel_hosts,
            proxy_addr: OnceLock::new(),
            config,
        });
        Ok(Self { shared, writer })
    }

    /// What the request path shares (the admin token among it: `OSTIARY_ADMIN_TOKEN`, or
    /// the state directory's).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serve both listeners until `shutdown` resolves; then drain and flush the audit chain.
    pub async fn serve(
        self,
        proxy: TcpListener,
        control: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let proxy_addr = proxy.local_addr()?;
        let control_addr = control.local_addr()?;
        let _ = self.shared.proxy_addr.set(proxy_addr);
        self.shared.approvals.set_control_addr(control_addr);
        // Before the listeners: an execution a crash interrupted is back in the queue
        // before anyone can look at it.
        approvals::sweep::recover(&self.shared).await;
        self.shared
            .guard
            .set_own_listeners(vec![proxy_addr, control_addr]);
        tracing::info!(%proxy_addr, %control_addr, "ostiary serving");

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let proxy_task = tokio::spawn(accept::serve(
            proxy,
            self.shared.clone(),
            stopped(stop_rx.clone()),
        ));
        let control_task = tokio::spawn(control::serve(
            control,
            self.shared.clone(),
            stopped(stop_rx.clone()),
        ));
        let watch_task = tokio::spawn(policy_store::watch(
            self.shared.clone(),
            stopped(stop_rx.clone()),
        ));
        let sweep_task = tokio::spawn(approvals::sweep::run(
            self.shared.clone(),
            stopped(stop_rx.clone()),
        ));
        let reap_task = tokio::spawn(lifecycle::reap(
            self.shared.clone(),
            stopped(stop_rx.clone()),
        ));
        let vault_task = self.shared.config.broker.vault.clone().map(|config| {
            tokio::spawn(vault_session(
                self.shared.clone(),
                config,
                stopped(stop_rx.clone()),
            ))
        });
        shutdown.await;
        let _ = stop_tx.send(true);
        let _ = tokio::join!(proxy_task, control_task, watch_task, reap_task, sweep_task);
        if let Some(task) = vault_task {
            let _ = task.await;
        }
        // Usage since the reaper's last tick: a restart must not hand sessions fresh budgets.
        self.shared.guardrails.save().await;
        // Everything queued is written (retried for a grace period if the trail is
        // unavailable, then logged), and the writer stops: a restart's writer is the only one.
        self.shared.audit.close().await;
        let Ostiary { shared, writer } = self;
        drop(shared);
        // Remaining sinks (spawned tunnels) may still hold the writer open; do not block on them.
        tokio::task::spawn_blocking(move || writer.join());
        Ok(())
    }
}
