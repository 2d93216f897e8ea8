//! The runs' parts, made once at start when the config has triggers: the intake and its
//! approvals, checkpoints and what `ostiary.internal` serves, the schedules, the reload, and
//! what the runner is told. The server hands each to the plane that uses it; the runner
//! itself is made with the control plane it opens sessions through
//! ([`Assembled::runner`]).

use std::sync::{Arc, RwLock};

use ostiary_broker::Broker;
use tokio::sync::Notify;

use super::checkpoint::Checkpoints;
use super::intake::Intake;
use super::internal::Internal;
use super::reload::{self, ConfigSnapshot, TriggerReload};
use super::runner::{RunSessions, Runner, RunnerSettings};
use super::schedule::Scheduler;
use crate::approvals::ApprovalQueue;
use crate::audit::AuditSink;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;
use crate::state::SecretString;
use crate::store::audit::AuditStore;
use crate::store::runs::RunStore;
use crate::store::Stores;

/// What the runs' parts are made from.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub config: &'a Config,
    pub stores: &'a Stores,
    pub broker: Arc<Broker>,
    pub approvals: Arc<ApprovalQueue>,
    pub policies: Arc<PolicyStore>,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
    pub admin_token: SecretString,
    /// This process, as the runs' and schedules' leases name it.
    pub holder: String,
}

/// The runs' parts.
#[derive(Debug)]
pub struct Assembled {
    /// Wakes the runner when a run is queued (a delivery, an approval, a retry).
    pub wake: Arc<Notify>,
    pub intake: Arc<Intake>,
    pub checkpoints: Arc<Checkpoints>,
    /// What a run's agent asks of the proxy itself, at `ostiary.internal`.
    pub internal: Arc<Internal>,
    /// Taken by the server, which runs it.
    pub scheduler: Option<Scheduler>,
    pub reload: Arc<TriggerReload>,
    pub store: Arc<dyn RunStore>,
    settings: RunnerSettings,
    holder: String,
    approvals: Arc<dyn crate::store::approvals::ApprovalStore>,
    audit: AuditSink,
    metrics: Arc<Metrics>,
}

/// The runs' parts, or `None` when no trigger is configured.
pub fn assemble(inputs: Inputs<'_>) -> Result<Option<Assembled>, String> {
    let Inputs {
        config,
        stores,
        broker,
        approvals,
        policies,
        audit,
        metrics,
        admin_token,
        holder,
    } = inputs;
    if config.trigger.is_empty() {
        return Ok(None);
    }
    let wake = Arc::new(Notify::new());
    let checkpoints = Arc::new(Checkpoints::new(
        stores.runs.clone(),
        config.runs.checkpoint_max_bytes,
    ));
    let intake = Arc::new(
        Intake::new(
            &config.trigger,
            stores.runs.clone(),
            broker,
            audit.clone(),
            metrics.clone(),
            wake.clone(),
            policies.clone(),
        )?
        .with_approvals(approvals),
    );
    let internal = Arc::new(Internal {
        checkpoints: checkpoints.clone(),
        intake: intake.clone(),
        runs: stores.runs.clone(),
    });
    // The reload reaches the intake, the schedules and the runner's serial triggers.
    let (schedule_updates, schedule_watch) =
        tokio::sync::watch::channel(Arc::new(config.trigger.clone()));
    let serial = Arc::new(RwLock::new(reload::serial(&config.trigger)));
    // Runs read the config as loaded, not as the file may be edited meanwhile.
    let snapshot = match &config.source {
        Some(source) => {
            let text = std::fs::read_to_string(source)
                .map_err(|e| format!("reading {}: {e}", source.display()))?;
            Some(Arc::new(
                ConfigSnapshot::create(&config.runs.dir(), &text)
                    .map_err(|e| format!("the runs' config snapshot: {e}"))?,
            ))
        }
        None => None,
    };
    let reload = Arc::new(TriggerReload::new(
        config.source.clone(),
        intake.clone(),
        schedule_updates,
        serial.clone(),
        snapshot.clone(),
    ));
    let scheduler = Scheduler::new(
        &config.trigger,
        intake.clone(),
        stores.cursors.clone(),
        stores.runs.clone(),
        audit.clone(),
        metrics.clone(),
        holder.clone(),
    )?
    .following(schedule_watch);
    let settings = RunnerSettings {
        binary: std::env::current_exe()
            .map_err(|e| format!("the ostiary binary, which runs start: {e}"))?,
        config: snapshot.as_ref().map(|s| s.path().to_owned()),
        dir: config.runs.dir(),
        concurrency: config.runs.concurrency,
        stop_grace: config.runs.stop_grace,
        lease: config.runs.lease,
        admin_token,
        serial,
        checkpoint_retention: config.runs.checkpoint_retention,
    };
    Ok(Some(Assembled {
        wake,
        intake,
        checkpoints,
        internal,
        scheduler: Some(scheduler),
        reload,
        store: stores.runs.clone(),
        settings,
        holder,
        approvals: stores.approvals.clone(),
        audit,
        metrics,
    }))
}

impl Assembled {
    /// The runner, opening its runs' sessions through `sessions` and reading their records
    /// from `trail`.
    pub fn runner(&self, sessions: Arc<dyn RunSessions>, trail: Arc<dyn AuditStore>) -> Runner {
        Runner::new(
            self.store.clone(),
            sessions,
            trail,
            self.audit.clone(),
            self.metrics.clone(),
            self.settings.clone(),
            self.holder.clone(),
            self.wake.clone(),
        )
        .with_checkpoints(Some(self.checkpoints.clone()))
        .with_approvals(self.approvals.clone())
    }
}
