//! The shadow policy set (`[policy] shadow_dir`): a candidate set evaluated beside the
//! enforced one on every decision the trail keeps, never enforced. Off the request path: a
//! decision's record, once queued for the trail, is handed to a thread of its own through a
//! bounded queue (a full queue drops the comparison and counts it, never waits), which decides
//! it again with the shadow set — the same code as `ostiary policy replay` — and writes every
//! disagreement (outcome or determining policies) as an audit record of kind `shadow`,
//! counted in `ostiary_shadow_decisions_total{outcome}`.
//!
//! The request path pays for one clone of the kept decision and a `try_send`; what the shadow
//! costs is measured in docs/benchmarks.md.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use ostiary_policies::recorded::{self, Kept};
use ostiary_policies::{LoadError, PolicyEngine, Triggers};
use serde_json::json;

use crate::audit::{AuditGuard, AuditRecord, AuditSink};
use crate::metrics::Metrics;

/// Decisions waiting for the shadow at most; past this they are dropped and counted.
pub const QUEUE: usize = 4096;

/// One decision to compare.
struct Observed {
    request_id: String,
    session: Option<String>,
    agent: Option<String>,
    tenant: Option<String>,
    tool: Option<String>,
    kept: Kept,
}

/// The candidate set and the queue to its thread.
#[derive(Debug)]
pub struct Shadow {
    dir: PathBuf,
    engine: RwLock<Arc<PolicyEngine>>,
    tx: OnceLock<SyncSender<Observed>>,
    metrics: OnceLock<Arc<Metrics>>,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

impl Shadow {
    /// Load the candidate set of `dir`, typed by the config's `triggers`.
    pub fn load(dir: &Path, triggers: &Triggers) -> Result<Self, LoadError> {
        Ok(Self {
            dir: dir.to_owned(),
            engine: RwLock::new(Arc::new(PolicyEngine::load_dir_with(dir, triggers)?)),
            tx: OnceLock::new(),
            metrics: OnceLock::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The candidate set now.
    pub fn engine(&self) -> Arc<PolicyEngine> {
        self.engine
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Read the directory again (with the policies' reload); a set that does not load
    /// leaves the last one.
    pub fn reload(&self, triggers: &Triggers) -> Result<(), LoadError> {
        let engine = Arc::new(PolicyEngine::load_dir_with(&self.dir, triggers)?);
        *self.engine.write().unwrap_or_else(PoisonError::into_inner) = engine;
        Ok(())
    }

    /// Start comparing: a thread deciding what [`Shadow::observe`] hands it, writing
    /// disagreements to `sink`. Once; later calls do nothing.
    pub fn start(self: &Arc<Self>, sink: AuditSink, metrics: Arc<Metrics>) {
        let (tx, rx) = sync_channel(QUEUE);
        if self.tx.set(tx).is_err() {
            return;
        }
        let _ = self.metrics.set(metrics.clone());
        let shadow = self.clone();
        let spawned = std::thread::Builder::new()
            .name("ostiary-shadow".into())
            .spawn(move || shadow.compare_all(&rx, &sink, &metrics));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the shadow set's thread did not start: nothing is compared");
        }
    }

    /// Hand a queued record's kept decision to the comparison, if it kept one. Never waits.
    pub fn observe(&self, record: &AuditRecord) {
        let (Some(kept), Some(tx)) = (&record.decided, self.tx.get()) else {
            return;
        };
        let observed = Observed {
            request_id: record.request_id.clone(),
            session: record.session.clone(),
            agent: record.agent.clone(),
            tenant: record.tenant.clone(),
            tool: record.tool.clone(),
            kept: kept.clone(),
        };
        if let Err(TrySendError::Full(_)) = tx.try_send(observed) {
            if let Some(metrics) = self.metrics.get() {
                metrics.shadow_decided("dropped");
            }
        }
    }

    fn compare_all(&self, rx: &Receiver<Observed>, sink: &AuditSink, metrics: &Arc<Metrics>) {
        while let Ok(observed) = rx.recv() {
            let outcome = self.compare(&observed, sink, metrics);
            metrics.shadow_decided(outcome);
        }
    }

    /// Decide one kept decision with the shadow set; a disagreement is written.
    fn compare(
        &self,
        observed: &Observed,
        sink: &AuditSink,
        metrics: &Arc<Metrics>,
    ) -> &'static str {
        let Ok(kept) = recorded::from_json(&observed.kept.to_value()) else {
            return "unreadable";
        };
        if kept.partial {
            return "partial";
        }
        let engine = self.engine();
        let decision = engine.decide(&kept.request);
        let Some(change) = recorded::compare(&kept, &decision) else {
            return "agree";
        };
        let mut audit = AuditGuard::start(sink, metrics, &observed.request_id, "shadow");
        audit.update(|r| {
            r.session = observed.session.clone();
            r.agent = observed.agent.clone();
            r.tenant = observed.tenant.clone();
            r.tool = observed.tool.clone();
            r.policies = change.new_policies.clone();
            r.policy_version = Some(engine.version().to_string());
            r.reason = Some(format!(
                "shadow set {}: {} [{}] where the enforced set said {} [{}]",
                engine.version(),
                change.new_outcome,
                change.new_policies.join(", "),
                change.old_outcome,
                change.old_policies.join(", "),
            ));
            r.shadow = Some(json!({
                "action": kept.request.action.uid_text(),
                "resource": kept.request.resource(),
                "live": { "decision": change.old_outcome, "policies": change.old_policies },
                "shadow": { "decision": change.new_outcome, "policies": change.new_policies },
            }));
        });
        let outcome = change.new_outcome.clone();
        audit.event(&outcome, None);
        "disagree"
    }
}
