//! Assembling a running proxy: state directory, policies, store, sessions, guard, pools,
//! audit writer — wired into the two planes' handles ([`crate::plane`]) and the background
//! tasks' own — and serving the two listeners until shutdown.
//!
//! Servers take bound listeners and a shutdown future (tests bind port 0); nothing here
//! binds a socket by itself. The parts it is assembled from (the store and what a previous
//! run left, the broker, the shared counters, the approvals' runner) are in `assemble`.

use std::future::Future;
use std::sync::Arc;

use ostiary_policies::PolicyEngine;
use tokio::net::TcpListener;

use crate::approvals::link::LinkSigner;
use crate::approvals::notify::Notifier;
use crate::approvals::{ApprovalQueue, Executor};
use crate::audit::stream::SiemStream;
use crate::audit::{AuditSink, AuditWriter};
use crate::check::Checks;
use crate::config::Config;
use crate::counters::Counters;
use crate::egress::{Dial, Guard, Resolve, SystemResolver, TcpDialer};
use crate::forward::Upstreams;
use crate::guardrails::pause::{Desk, TripQueue, Trips};
use crate::inject::credentials::Credentials;
use crate::lease_journal::Journal;
use crate::lifecycle::Teardown;
use crate::metrics::Metrics;
use crate::plane::{ControlPlane, DataPlane, ProxyAddr};
use crate::policy_store::{self, PolicyStore, Reloader};
use crate::session::TokenKeys;
use crate::state::{files, StateDir};
use crate::tls::ca::LeafMinter;
use crate::{accept, approvals, control, tls};

mod assemble;

use assemble::{
    broker, holder, load_state, replica_id, shared_counters, sync_bytes, tunnel_hosts,
    vault_session, Execution, Loaded,
};

/// How long the SIEM stream may take at shutdown to deliver the trail's last records.
const SIEM_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error(transparent)]
    Siem(#[from] crate::audit::stream::StreamError),
    /// Triggers and runs that cannot start as configured.
    #[error("runs: {0}")]
    Runs(String),
    #[error("approval notifications: {0}")]
    Notify(#[from] crate::approvals::notify::message::NotifyError),
    /// The audit chain no longer matches its checkpoint: serve refuses to extend it.
    #[error(transparent)]
    Audit(#[from] crate::audit::ChainError),
    #[error(transparent)]
    AuditSigning(#[from] crate::audit::attest::KeyError),
    #[error(transparent)]
    Counters(#[from] crate::counters::CountersError),
}

/// Seams for tests and embedders: where names are resolved, how sockets are dialed, and
/// (for the benchmarks' "audit off" rung) where the audit chain is kept. The binary sets
/// none of them.
#[derive(Debug, Clone)]
pub struct Options {
    pub resolver: Arc<dyn Resolve>,
    pub dialer: Arc<dyn Dial>,
    /// Keeps the audit chain instead of the configured store (its trail and its reader).
    pub audit_store: Option<Arc<dyn crate::store::audit::AuditStore>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            resolver: Arc::new(SystemResolver),
            dialer: Arc::new(TcpDialer),
            audit_store: None,
        }
    }
}

/// A built proxy, ready to serve.
#[derive(Debug)]
pub struct Ostiary {
    data: Arc<DataPlane>,
    control: Arc<ControlPlane>,
    /// The watchdog's desk and its queue of trips, served with the listeners.
    desk: (Desk, TripQueue),
    writer: AuditWriter,
    /// The proxy's Unix socket, when one was bound ([`Ostiary::with_unix`]).
    unix: Option<tokio::net::UnixListener>,
    /// The trail streamed to a SIEM (`[audit.siem]`).
    siem: Option<SiemStream>,
    /// The schedules of `[[trigger]] kind = "schedule"`, ticking once served.
    scheduler: Option<crate::runs::schedule::Scheduler>,
    /// `listen.triggers`, when one was bound ([`Ostiary::with_triggers`]).
    triggers: Option<TcpListener>,
}

/// Bind the proxy's Unix socket at `path`: a socket file left by a proxy that is gone is
/// replaced (one that still answers is not: two proxies must not share a state directory),
/// and the socket is made connectable by any uid (`0666`), because sandboxes reach it as
/// uids of their own; who can reach the path at all is decided by its directory (the state
/// directory is `0700`).
pub async fn bind_unix(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is served by another running proxy", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Load the policy set as the server would (the policy directory, or the embedded library
/// when the default directory is absent); see [`policy_store::build`].
pub fn load_policies(config: &Config) -> Result<PolicyEngine, ServeError> {
    let triggers = crate::runs::authorize::policy_triggers(&config.trigger);
    Ok(policy_store::build(&config.policy, &triggers)?)
}

/// The state directory and the policy set the config names. Shared keys, when configured,
/// are only read: a replica never makes its own.
fn open(config: &Config) -> Result<(StateDir, PolicyStore), ServeError> {
    let state = match &config.state.keys_dir {
        Some(keys) => StateDir::open_shared(&config.state.dir, keys)?,
        None => StateDir::open_or_create(&config.state.dir)?,
    };
    let policies = PolicyStore::open(
        config.policy.clone(),
        crate::runs::authorize::policy_triggers(&config.trigger),
    )?;
    if policies.watched_dir().is_none() {
        tracing::info!(
            "policy directory {} not found; using the embedded library",
            config.policy.dir.display()
        );
    }
    tracing::info!(policies = policies.current().len(), version = %policies.current().version(), dir = %config.policy.dir.display(), "policies loaded");
    Ok((state, policies))
}

/// The store and what a previous run left in it ([`load_state`]), with the keys `state`
/// holds. On the blocking pool: a store's calls block (PostgreSQL's client runs a runtime
/// of its own, which cannot start on a thread that drives this one's tasks).
async fn load(
    config: &Config,
    state: &StateDir,
    metrics: &Arc<Metrics>,
    counters: Option<Arc<Counters>>,
    audit_store: Option<Arc<dyn crate::store::audit::AuditStore>>,
) -> Result<Loaded, ServeError> {
    let keys = TokenKeys::from_pem(state.signing_key_pem.expose(), &state.verify_key_pem)
        .map_err(crate::session::SessionError::from)?;
    let signer = crate::audit::attest::Signer::from_pem(state.audit_signing_key_pem.expose())?;
    let chain = (
        state.audit_key.expose().as_bytes().to_vec(),
        state.path(files::AUDIT_HEAD),
        Arc::new(signer),
    );
    let (config, metrics) = (config.clone(), metrics.clone());
    tokio::task::spawn_blocking(move || {
        load_state(&config, keys, chain, &metrics, counters, audit_store)
    })
    .await
    .map_err(|e| crate::store::StoreError::Task(e.to_string()))?
}

/// The start-up's set goes live: from here on, a record no policy set decided names the set
/// in force; its shadow set starts; and it enters the version history (a lone process, on
/// SQLite, replaced its last one). The audit sink that names it.
async fn go_live(
    policies: &Arc<PolicyStore>,
    audit: AuditSink,
    metrics: &Arc<Metrics>,
    stores: &crate::store::Stores,
    config: &Config,
) -> Result<AuditSink, ServeError> {
    let audit = audit.with_policies(policies.clone());
    if let Some(shadow) = policies.shadow() {
        shadow.start(audit.clone(), metrics.clone());
    }
    let (policies, history) = (policies.clone(), stores.policy_versions.clone());
    let sole = config.state.store == "sqlite";
    tokio::task::spawn_blocking(move || policies.record_history(history, sole))
        .await
        .map_err(|e| crate::store::StoreError::Task(e.to_string()))??;
    Ok(audit)
}

/// Executions a crash interrupted go back to the queue. Every claim was the previous run's
/// on a store no other replica shares; on a shared one only those whose lease ran out (the
/// others' executors are alive).
async fn recover_executions(plane: &ControlPlane) {
    let when = if plane.config.state.store == "sqlite" {
        approvals::sweep::Recovery::Restart
    } else {
        approvals::sweep::Recovery::Lapsed
    };
    approvals::sweep::recover(&plane.approvals, when).await;
}

/// The runs' queue until `stop`: the runs a crash left running are ended first.
async fn run_queue(runner: Arc<crate::runs::runner::Runner>, stop: impl Future<Output = ()>) {
    match runner.recover().await {
        Ok(killed) if !killed.is_empty() => {
            tracing::warn!(
                runs = killed.len(),
                "runs left running by a crash were ended as killed"
            )
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "runs left running by a crash could not be recovered")
        }
    }
    runner.serve(stop).await;
}

/// The end of a shutdown, once the listeners and loops stopped: what the trail must still
/// record is recorded, then it closes and is delivered.
async fn close_trail(plane: &ControlPlane, siem: Option<tokio::task::JoinHandle<SiemStream>>) {
    // Executions still running are given back, not left to lapse (before the audit trail
    // closes: their release is recorded).
    approvals::sweep::release(&plane.approvals).await;
    // Usage since the reaper's last tick: a restart must not hand sessions fresh budgets.
    plane.guardrails.save().await;
    // Everything queued is written (retried for a grace period if the trail is unavailable,
    // then logged), and the writer stops: a restart's writer is the only one.
    plane.audit.close().await;
    // After the trail closed: its last records are spans too. Blocking (the SDK waits for
    // its export thread, which exports on this runtime).
    if let Some(spans) = plane.audit.spans() {
        let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
    }
    // And to the SIEM, within a grace; what is left goes with the next holder of the
    // stream's cursor (another replica, or this one's restart).
    if let Some(task) = siem {
        if let Ok(siem) = task.await {
            siem.finish(SIEM_GRACE).await;
        }
    }
}

/// What [`Ostiary::build`] opened and started, before it is wired into the planes' handles.
struct Opened {
    config: Config,
    state: StateDir,
    metrics: Arc<Metrics>,
    counters: Option<Arc<Counters>>,
    stores: crate::store::Stores,
    trail_reader: Arc<dyn crate::store::audit::AuditStore>,
    writer: AuditWriter,
    sessions: crate::session::SessionRegistry,
    guardrails: crate::guardrails::Guardrails,
    policies: Arc<PolicyStore>,
    audit: AuditSink,
    replica: String,
    holder: String,
    guard: Arc<Guard>,
    upstreams: Upstreams,
    credentials: Credentials,
    approvals: ApprovalQueue,
    checks: Checks,
    minter: LeafMinter,
    siem: Option<SiemStream>,
}

impl Opened {
    /// The state directory, the policies, the store and what a previous run left in it, the
    /// audit writer, the egress guard and pools, the broker (its Vault session), approvals,
    /// checks and the leaf minter.
    async fn open(config: Config, options: Options) -> Result<Self, ServeError> {
        let (state, policies) = open(&config)?;
        let metrics = Arc::new(Metrics::default());
        metrics.set_policy_generation(policies.generation());
        let counters = shared_counters(&config, &metrics)?;
        let Loaded {
            stores,
            trail_reader,
            writer,
            audit,
            sessions,
            guardrails,
            leftovers,
        } = load(
            &config,
            &state,
            &metrics,
            counters.clone(),
            options.audit_store.clone(),
        )
        .await?;
        let policies = Arc::new(policies);
        let audit = go_live(&policies, audit, &metrics, &stores, &config).await?;
        let replica = replica_id();
        let holder = holder(&config, &replica);
        let guard = Arc::new(Guard::new(
            options.resolver,
            options.dialer,
            config.egress.resolve.clone(),
            config.egress.allow_private.clone(),
            config.proxy.connect_timeout,
        ));
        let roots = Arc::new(tls::upstream::root_store(&config.egress.ca_file)?);
        let upstreams = Upstreams::new(
            guard.clone(),
            roots,
            config.proxy.upstream_timeout,
            config.listen.proxy_threads(),
        )?;
        let journal = Arc::new(Journal::start(stores.leases.clone())?);
        let broker = broker(&config, &policies, journal, leftovers).await?;
        let credentials = Credentials::new(Arc::new(broker), &metrics);
        // Before anything is served: what an earlier process or another replica injected
        // and an upstream kept must come back redacted from the first answer on.
        credentials.learn_lasting().await;
        let approvals = ApprovalQueue::new(
            stores.approvals.clone(),
            config.approvals.clone(),
            Notifier::from_config(&config.approvals)?,
            LinkSigner::new(state.approvals_key.expose().as_bytes()),
            audit.clone(),
            metrics.clone(),
        );
        let checks = Checks::new(config.tiers.clone(), &config.checks)?;
        checks.prepare(policies.current().catalog());
        let minter = LeafMinter::new(&state.ca_cert_pem, state.ca_key_pem.expose())?;
        let siem = match &config.audit.siem {
            Some(siem) => Some(SiemStream::new(
                siem,
                trail_reader.clone(),
                stores.cursors.clone(),
                holder.clone(),
                &metrics,
            )?),
            None => None,
        };
        Ok(Self {
            config,
            state,
            metrics,
            counters,
            stores,
            trail_reader,
            writer,
            sessions,
            guardrails,
            policies,
            audit,
            replica,
            holder,
            guard,
            upstreams,
            credentials,
            approvals,
            checks,
            minter,
            siem,
        })
    }

    /// The planes' handles and the background tasks' own, each given what it uses.
    fn wire(self) -> Result<Ostiary, ServeError> {
        let tunnel_hosts = tunnel_hosts(&self.config);
        let db_path = self.state.path(files::DATABASE);
        let config = Arc::new(self.config);
        let sessions = Arc::new(self.sessions);
        let credentials = Arc::new(self.credentials);
        let approvals = Arc::new(self.approvals);
        let checks = Arc::new(self.checks);
        let guardrails = Arc::new(self.guardrails);
        let proxy_addr = ProxyAddr::new(config.listen.proxy);
        let (trips, trip_queue) = Trips::channel();
        let desk = Desk {
            guardrails: guardrails.clone(),
            sessions: sessions.clone(),
            approvals: approvals.clone(),
            policies: self.policies.clone(),
            audit: self.audit.clone(),
            trail: self.stores.audit.clone(),
            metrics: self.metrics.clone(),
        };
        let mut runs = crate::runs::assemble::assemble(crate::runs::assemble::Inputs {
            config: &config,
            stores: &self.stores,
            broker: credentials.broker.clone(),
            approvals: approvals.clone(),
            policies: self.policies.clone(),
            audit: self.audit.clone(),
            metrics: self.metrics.clone(),
            admin_token: self.state.admin_token.clone(),
            holder: self.holder,
        })
        .map_err(ServeError::Runs)?;
        let data = Arc::new(DataPlane {
            config: config.clone(),
            policies: self.policies.clone(),
            sessions: sessions.clone(),
            guard: self.guard,
            upstreams: self.upstreams.clone(),
            credentials: credentials.clone(),
            approvals: approvals.clone(),
            checks: checks.clone(),
            guardrails: guardrails.clone(),
            trips,
            minter: self.minter,
            audit: self.audit.clone(),
            metrics: self.metrics.clone(),
            ca_pem: self.state.ca_cert_pem.clone(),
            tunnel_hosts,
            proxy_addr: proxy_addr.clone(),
            internal: runs.as_ref().map(|r| r.internal.clone()),
            undo: self.stores.undo.clone(),
        });
        let news = self.counters.map(|counters| crate::lifecycle::News {
            replica: self.replica,
            counters,
        });
        let scheduler = runs.as_mut().and_then(|r| r.scheduler.take());
        let control = control_plane(
            &data,
            &desk,
            runs,
            news,
            self.state.admin_token.clone(),
            self.trail_reader,
            db_path,
        );
        Ok(Ostiary {
            data,
            control,
            desk: (desk, trip_queue),
            writer: self.writer,
            unix: None,
            siem: self.siem,
            scheduler,
            triggers: None,
        })
    }
}

/// The control plane's handle over the data plane's parts (the same sessions, approvals,
/// credentials, audit sink), with what only the control API uses: the approvals' executor,
/// session teardown, the policy reloader, undo and the runs of triggers.
fn control_plane(
    data: &Arc<DataPlane>,
    desk: &Desk,
    runs: Option<crate::runs::assemble::Assembled>,
    news: Option<crate::lifecycle::News>,
    admin_token: crate::state::SecretString,
    trail: Arc<dyn crate::store::audit::AuditStore>,
    db_path: std::path::PathBuf,
) -> Arc<ControlPlane> {
    let executor = Executor {
        queue: data.approvals.clone(),
        sessions: data.sessions.clone(),
        runner: Arc::new(Execution {
            plane: data.clone(),
            desk: desk.clone(),
            runs: runs.as_ref().map(|r| r.intake.clone()),
        }),
        audit: data.audit.clone(),
        metrics: data.metrics.clone(),
    };
    let teardown = Teardown {
        sessions: data.sessions.clone(),
        guardrails: data.guardrails.clone(),
        approvals: data.approvals.clone(),
        credentials: data.credentials.clone(),
        upstreams: data.upstreams.clone(),
        audit: data.audit.clone(),
        metrics: data.metrics.clone(),
        news,
    };
    let reloader = Reloader {
        policies: data.policies.clone(),
        checks: data.checks.clone(),
        audit: data.audit.clone(),
        metrics: data.metrics.clone(),
        triggers: runs.as_ref().map(|r| r.reload.clone()),
    };
    let undo = crate::undo::Reverser {
        plane: data.clone(),
        teardown: teardown.clone(),
    };
    let run_trail = trail.clone();
    Arc::new_cyclic(|plane: &std::sync::Weak<ControlPlane>| {
        let sessions_for_runs: Arc<dyn crate::runs::runner::RunSessions> =
            Arc::new(crate::control::runs::PlaneSessions(plane.clone()));
        let runs = runs.map(|r| crate::control::runs::RunsControl {
            runner: Arc::new(r.runner(sessions_for_runs, run_trail)),
            intake: r.intake.clone(),
            checkpoints: r.checkpoints.clone(),
            store: r.store.clone(),
        });
        ControlPlane {
            config: data.config.clone(),
            sessions: data.sessions.clone(),
            approvals: data.approvals.clone(),
            guardrails: data.guardrails.clone(),
            credentials: data.credentials.clone(),
            teardown,
            executor,
            desk: desk.clone(),
            reloader,
            audit: data.audit.clone(),
            metrics: data.metrics.clone(),
            ca_pem: data.ca_pem.clone(),
            admin_token,
            trail,
            db_path,
            proxy_addr: data.proxy_addr.clone(),
            runs,
            undo,
        }
    })
}

impl Ostiary {
    /// Open state, load policies, log in to Vault if configured, start the audit writer.
    pub async fn build(config: Config, options: Options) -> Result<Self, ServeError> {
        Opened::open(config, options).await?.wire()
    }

    /// The control plane's handle: the config, the admin token (`OSTIARY_ADMIN_TOKEN`, or
    /// the state directory's), the CA, the database path, the reloader.
    pub fn control_plane(&self) -> &Arc<ControlPlane> {
        &self.control
    }

    /// Take webhook deliveries on `listener` too (`listen.triggers`), apart from the
    /// control API.
    pub fn with_triggers(mut self, listener: TcpListener) -> Self {
        self.triggers = Some(listener);
        self
    }

    /// Serve the proxy on `listener` too, a Unix socket (`listen.proxy_unix`, see
    /// [`bind_unix`]): the one way out of a sandbox.
    pub fn with_unix(mut self, listener: tokio::net::UnixListener) -> Self {
        self.unix = Some(listener);
        self
    }

    /// Serve both listeners until `shutdown` resolves; then drain and flush the audit chain.
    pub async fn serve(
        self,
        proxy: TcpListener,
        control: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Ostiary {
            data,
            control: plane,
            desk: (desk, trip_queue),
            writer,
            unix,
            siem,
            scheduler,
            triggers,
        } = self;
        let proxy_addr = proxy.local_addr()?;
        let control_addr = control.local_addr()?;
        data.proxy_addr.bind(proxy_addr);
        plane.approvals.set_control_addr(control_addr);
        // Before the listeners: an execution a crash interrupted is back in the queue
        // before anyone can look at it.
        recover_executions(&plane).await;
        data.guard.set_own_listeners(vec![proxy_addr, control_addr]);
        tracing::info!(%proxy_addr, %control_addr, "ostiary serving");

        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let proxy_task = tokio::spawn(
            accept::Proxy::new(proxy, unix, data.clone())?.serve(stopped(stop_rx.clone())),
        );
        let control_task = tokio::spawn(control::serve(
            control,
            plane.clone(),
            stopped(stop_rx.clone()),
        ));
        let desk_task = tokio::spawn(desk.serve(trip_queue, stopped(stop_rx.clone())));
        let watch_task = tokio::spawn(policy_store::watch(
            plane.reloader.clone(),
            stopped(stop_rx.clone()),
        ));
        let sweep_task = tokio::spawn(approvals::sweep::run(
            plane.executor.clone(),
            stopped(stop_rx.clone()),
        ));
        let reap_task = tokio::spawn(
            plane
                .teardown
                .clone()
                .reap(plane.config.broker.reap_interval, stopped(stop_rx.clone())),
        );
        // Teardown news from the other replicas, and the bytes long streams moved here.
        let news_task = tokio::spawn(plane.teardown.clone().follow(stopped(stop_rx.clone())));
        let bytes_task = tokio::spawn(sync_bytes(
            plane.guardrails.clone(),
            stopped(stop_rx.clone()),
        ));
        let vault_task = plane.config.broker.vault.clone().map(|config| {
            tokio::spawn(vault_session(
                data.credentials.clone(),
                config,
                stopped(stop_rx.clone()),
            ))
        });
        let siem_task = siem.map(|siem| tokio::spawn(siem.run(stopped(stop_rx.clone()))));
        // Runs: what a crash left first, then the queue; the schedules tick.
        let runs_task = plane
            .runs
            .as_ref()
            .map(|runs| tokio::spawn(run_queue(runs.runner.clone(), stopped(stop_rx.clone()))));
        let schedule_task = scheduler.map(|scheduler| {
            let rx = stop_rx.clone();
            tokio::spawn(scheduler.run(stopped(rx)))
        });
        let triggers_task = triggers.map(|listener| {
            tokio::spawn(control::serve_triggers(
                listener,
                plane.clone(),
                stopped(stop_rx.clone()),
            ))
        });
        shutdown.await;
        let _ = stop_tx.send(true);
        let _ = tokio::join!(
            proxy_task,
            control_task,
            desk_task,
            watch_task,
            reap_task,
            sweep_task,
            news_task,
            bytes_task
        );
        if let Some(task) = vault_task {
            let _ = task.await;
        }
        // Runs going are stopped and recorded before the trail closes.
        for task in [runs_task, schedule_task, triggers_task]
            .into_iter()
            .flatten()
        {
            let _ = task.await;
        }
        close_trail(&plane, siem_task).await;
        drop((data, plane));
        // Remaining sinks (spawned tunnels) may still hold the writer open; do not block on them.
        tokio::task::spawn_blocking(move || writer.join());
        Ok(())
    }
}
