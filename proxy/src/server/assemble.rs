//! The parts `Ostiary::build` assembles the proxy from: the store and what a previous run
//! left in it, the credential broker and its Vault session, the shared counters, the runner
//! an approval executes through, and the small background loops the server runs.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use http::Request;

use crate::approvals::execute::Answered;
use crate::approvals::{Approved, Runner};
use crate::audit::{AuditGuard, AuditWriter};
use crate::body::ProxyBody;
use crate::classify::Origin;
use crate::config::Config;
use crate::counters::Counters;
use crate::guardrails::pause::Desk;
use crate::guardrails::Guardrails;
use crate::inject::credentials::Credentials;
use crate::lease_journal::{self, Journal};
use crate::metrics::Metrics;
use crate::plane::DataPlane;
use crate::policy_store::PolicyStore;
use crate::session::{Principal, SessionRegistry, TokenKeys};
use ostiary_broker::vault::VaultClient;
use ostiary_broker::Broker;

use super::ServeError;

/// Log in to Vault if start-up could not (retrying with backoff), then keep the token
/// alive, until `shutdown`.
pub(super) async fn vault_session(
    credentials: Arc<Credentials>,
    config: ostiary_broker::vault::VaultConfig,
    shutdown: impl Future<Output = ()>,
) {
    let broker = &credentials.broker;
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

/// Runs an approved request through the data plane's phases; resumes a paused session
/// through the watchdog's desk (the two things an approval can execute).
#[derive(Debug)]
pub(super) struct Execution {
    pub(super) plane: Arc<DataPlane>,
    pub(super) desk: Desk,
    /// Where runs held for approval are decided again and released.
    pub(super) runs: Option<Arc<crate::runs::intake::Intake>>,
}

impl Runner for Execution {
    fn run<'a>(
        &'a self,
        approved: Approved,
        principal: Arc<Principal>,
        held: (Origin, Request<ProxyBody>),
        audit: &'a mut AuditGuard,
    ) -> BoxFuture<'a, Answered> {
        Box::pin(crate::pipeline::execute(
            &self.plane,
            approved,
            principal,
            held,
            audit,
        ))
    }

    fn resume<'a>(
        &'a self,
        session: &'a str,
        by: &'a str,
    ) -> BoxFuture<'a, Result<bool, crate::store::StoreError>> {
        Box::pin(self.desk.resume(session, by))
    }

    fn release_run<'a>(
        &'a self,
        run: &'a str,
        approver: &'a str,
    ) -> BoxFuture<'a, Result<crate::runs::intake::Release, crate::store::StoreError>> {
        Box::pin(async move {
            match &self.runs {
                Some(intake) => intake.release(run, approver).await,
                None => Ok(crate::runs::intake::Release::NotWaiting),
            }
        })
    }
}

/// The credential broker: Vault logged in to once now (retried in the background when that
/// fails), the lease journal attached, and the leases a previous run left adopted so that the
/// reaper revokes them.
pub(super) async fn broker(
    config: &Config,
    policies: &PolicyStore,
    journal: Arc<Journal>,
    leftovers: Vec<(String, ostiary_broker::OwedLease)>,
) -> Result<Broker, ServeError> {
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
    if !leftovers.is_empty() {
        tracing::info!(
            leases = leftovers.len(),
            "revoking leases left by a previous run"
        );
        broker.adopt(leftovers);
    }
    Ok(broker)
}

/// `egress.tunnel`'s hosts, canonical; an entry that is not a host is said and left out.
pub(super) fn tunnel_hosts(
    config: &Config,
) -> std::collections::HashSet<crate::egress::address::Host> {
    config
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
        .collect()
}

/// The counters replicas share (`state.redis`), if configured; a shared store without them
/// is said at start-up, since each replica then counts its own requests only.
pub(super) fn shared_counters(
    config: &Config,
    metrics: &Metrics,
) -> Result<Option<Arc<Counters>>, ServeError> {
    let Some(url) = &config.state.redis else {
        if config.state.store != "sqlite" {
            tracing::warn!(
                "state.store is shared but state.redis is not set: budgets, rate limits, spawn counts, pauses and the loop watchdog count this replica's requests only"
            );
        }
        return Ok(None);
    };
    Ok(Some(Arc::new(Counters::new(
        url,
        &config.state.redis_prefix,
        metrics,
    )?)))
}

/// This replica's name in teardown news: `OSTIARY_REPLICA_ID` (a pod's name, say), or one
/// made up at start.
pub(super) fn replica_id() -> String {
    std::env::var("OSTIARY_REPLICA_ID")
        .ok()
        .filter(|id| !id.is_empty() && !id.contains(' '))
        .unwrap_or_else(|| format!("r-{}", crate::state::random_hex(6)))
}

/// Who holds this process's claims in the store (the SIEM stream's cursor, the runs'
/// queue): `replica` among replicas; on SQLite one process serves a state directory, so each
/// run of it is the same holder, and a restart after a crash recovers what the crash left.
pub(super) fn holder(config: &Config, replica: &str) -> String {
    match config.state.store.as_str() {
        "sqlite" => "this-state-directory".to_owned(),
        _ => replica.to_owned(),
    }
}

/// Add the bytes this replica's streams moved to the shared accounts, every
/// [`crate::counters::SYNC_EVERY`], until `shutdown` (nothing to do without `state.redis`).
pub(super) async fn sync_bytes(guardrails: Arc<Guardrails>, shutdown: impl Future<Output = ()>) {
    if guardrails.shared.is_none() {
        return;
    }
    let mut ticker = tokio::time::interval(crate::counters::SYNC_EVERY);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => guardrails.sync_streams().await,
        }
    }
    guardrails.sync_streams().await;
}

/// What start-up reads from the store.
pub(super) struct Loaded {
    pub(super) stores: crate::store::Stores,
    pub(super) trail_reader: Arc<dyn crate::store::audit::AuditStore>,
    pub(super) writer: AuditWriter,
    pub(super) audit: crate::audit::AuditSink,
    pub(super) sessions: SessionRegistry,
    pub(super) guardrails: Guardrails,
    /// Leases a previous run fetched and nothing holds now.
    pub(super) leftovers: Vec<(String, ostiary_broker::OwedLease)>,
}

/// Open the store the config names (every aggregate, migrated once), check the audit chain
/// and start its writer, and load what a previous run left: live sessions, accounts and
/// pauses, leases owed a revocation. Blocking: run on the blocking pool.
pub(super) fn load_state(
    config: &Config,
    keys: TokenKeys,
    (audit_key, audit_head, signer): (
        Vec<u8>,
        std::path::PathBuf,
        Arc<crate::audit::attest::Signer>,
    ),
    metrics: &Arc<Metrics>,
    counters: Option<Arc<Counters>>,
    audit_store: Option<Arc<dyn crate::store::audit::AuditStore>>,
) -> Result<Loaded, ServeError> {
    let backend =
        crate::stores::Backend::of(&config.state).map_err(crate::store::StoreError::Unavailable)?;
    let mut stores = backend.open()?;
    // Queries read on a connection of their own, never the writer's.
    let trail_reader = match audit_store {
        Some(audit) => {
            stores.audit = audit.clone();
            audit
        }
        None => backend.audit_reader()?,
    };
    tracing::info!(store = %backend.describe(), "state store open");
    let limits = crate::audit::Limits {
        sign_every: config.audit.signed_checkpoint_interval,
        linger: config.audit.group_commit,
        ..Default::default()
    };
    let (writer, audit) = AuditWriter::start_with(
        stores.audit.clone(),
        audit_key,
        audit_head,
        metrics,
        limits,
        Some(signer),
    )?;
    // Every record the trail gets is also a span, when a collector is configured.
    let audit = audit.with_spans(crate::telemetry::Spans::start(&config.telemetry)?);
    let sessions = SessionRegistry::load(keys, stores.sessions.clone(), &config.sessions)?;
    // On a store other replicas may share, a session not known here may be theirs.
    if matches!(backend, crate::stores::Backend::Postgres(_)) {
        sessions.set_shared();
    }
    let guardrails = Guardrails::load(stores.guard.clone(), config.sessions.clone(), counters)?;
    let leftovers = lease_journal::load(&*stores.leases)?;
    Ok(Loaded {
        stores,
        trail_reader,
        writer,
        audit,
        sessions,
        guardrails,
        leftovers,
    })
}
