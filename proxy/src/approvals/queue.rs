//! The approval queue as the rest of the proxy uses it: hold a request, decide, wait, and
//! the bookkeeping every transition owes (an audit record, a metric, a wake-up for waiters,
//! notifications for approvers).
//!
//! Who may decide lives here, in one function ([`ApprovalQueue::may_decide`]), whatever the
//! channel: a listed approver, and never the agent whose request it is. So does how many
//! holds a session may have pending ([`ApprovalQueue::cap_for`], enforced by
//! [`ApprovalQueue::hold_bounded`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use super::link::{LinkClaims, LinkError, LinkSigner};
use super::model::{Approval, Channel, Verdict};
use super::notify::Notifier;
use super::store::{Admission, ApprovalStore, DecideError, Decision, Hold, QueueCounts};
use crate::audit::{AuditGuard, AuditSink};
use crate::config;
use crate::metrics::Metrics;
use crate::store::{now_ms, Call, StoreError};

/// The queue, its channels and its bookkeeping.
#[derive(Debug)]
pub struct ApprovalQueue {
    pub store: Arc<dyn ApprovalStore>,
    pub config: config::Approvals,
    pub notifier: Notifier,
    signer: LinkSigner,
    audit: AuditSink,
    metrics: Arc<Metrics>,
    /// Bumped on every transition; waiters re-read what they wait for.
    changed: watch::Sender<u64>,
    /// Base of review links: `approvals.public_url`, or the control listener as bound.
    link_base: OnceLock<String>,
    /// Executions this process has claimed and not finished: released at shutdown.
    pub(crate) claimed: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl ApprovalQueue {
    pub fn new(
        store: Arc<dyn ApprovalStore>,
        config: config::Approvals,
        notifier: Notifier,
        signer: LinkSigner,
        audit: AuditSink,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (changed, _) = watch::channel(0);
        let link_base = OnceLock::new();
        if !config.public_url.is_empty() {
            let _ = link_base.set(config.public_url.trim_end_matches('/').to_owned());
        }
        Self {
            store,
            config,
            notifier,
            signer,
            audit,
            metrics,
            changed,
            link_base,
            claimed: std::sync::Mutex::default(),
        }
    }

    /// The control listener's address, once bound (the default base of review links).
    pub fn set_control_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.link_base.set(format!("http://{addr}"));
    }

    /// A new approval id.
    pub fn new_id() -> String {
        format!("apr_{}", crate::state::random_hex(12))
    }

    /// Store a held request and owe its first notifications. The caller answers 202 only
    /// after this returned: an acknowledged hold is on disk.
    pub async fn hold(&self, approval: Approval) -> Result<Approval, StoreError> {
        let notify = self.notifier.recipients(&self.config);
        let stored = approval.clone();
        self.store
            .call(move |s| {
                s.insert(&stored)?;
                for (channel, recipient) in &notify {
                    s.enqueue(&stored.id, channel, recipient, 1, stored.created_ms)?;
                }
                Ok(())
            })
            .await?;
        self.metrics.approval_transition("held");
        self.bump();
        Ok(approval)
    }

    /// Hold an agent's request, bounded: joined to the session's pending approval of the
    /// same request (`fingerprint`) if there is one, refused if the session or one of its
    /// ancestors is at its cap of pending holds (`default_max` for a session with none
    /// stored), else stored with its first notifications owed — all in one transaction.
    pub async fn hold_bounded(
        &self,
        approval: Approval,
        fingerprint: String,
        default_max: u32,
    ) -> Result<Admission, StoreError> {
        let notify = self.notifier.recipients(&self.config);
        let stored = approval.clone();
        let admission = self
            .store
            .call(move |s| {
                s.hold_bounded(
                    Hold {
                        approval: &stored,
                        fingerprint: &fingerprint,
                        default_max,
                        notify: &notify,
                    },
                    now_ms(),
                )
            })
            .await?;
        match &admission {
            Admission::Held => {
                self.metrics.approval_transition("held");
                self.bump();
            }
            Admission::Joined(existing) => self.record(
                existing,
                "joined",
                "escalate",
                None,
                format!(
                    "request {} of the same session is the same request (method, URL, body): \
                     it joins this approval, nobody is notified again",
                    approval.request_id
                ),
                None,
            ),
            Admission::Full(_) => {}
        }
        Ok(admission)
    }

    /// The cap of pending holds for a new session: what it asks for (at most
    /// [`config::PENDING_APPROVALS_CEILING`], and for a child at most its parent's), else
    /// its parent's, else `default`. The reason is for a `400 bad_request`.
    pub async fn cap_for(
        &self,
        asked: Option<u32>,
        parent: Option<&str>,
        default: u32,
    ) -> Result<u32, CapRefused> {
        if let Some(n) = asked.filter(|n| *n > config::PENDING_APPROVALS_CEILING) {
            return Err(CapRefused::Invalid(format!(
                "max_pending_approvals = {n} exceeds {}",
                config::PENDING_APPROVALS_CEILING
            )));
        }
        let Some(parent) = parent else {
            return Ok(asked.unwrap_or(default));
        };
        let owned = parent.to_owned();
        let parents = self
            .store
            .call(move |s| s.cap(&owned))
            .await?
            .unwrap_or(default);
        match asked {
            None => Ok(parents),
            Some(n) if n <= parents => Ok(n),
            Some(n) => Err(CapRefused::Invalid(format!(
                "max_pending_approvals = {n} exceeds the parent session's {parents}: a child \
                 never holds more than its parent may"
            ))),
        }
    }

    /// Store a new session's cap (after [`Self::cap_for`]), with its parent, whose cap its
    /// holds count against too.
    pub async fn set_cap(
        &self,
        session: &str,
        parent: Option<&str>,
        max: u32,
    ) -> Result<(), StoreError> {
        let (session, parent) = (session.to_owned(), parent.map(str::to_owned));
        self.store
            .call(move |s| s.set_cap(&session, parent.as_deref(), max))
            .await
    }

    /// May `approver` decide `approval`? Every channel asks this before deciding.
    pub fn may_decide(&self, approval: &Approval, approver: &str) -> Result<(), DecideError> {
        let approver = approver.trim();
        if approver.is_empty() {
            return Err(DecideError::NotApprover(String::new()));
        }
        // The agent is never its own approver, whatever the approver list says.
        if approver.eq_ignore_ascii_case(&approval.agent) {
            return Err(DecideError::SelfApproval);
        }
        if !self.config.approvers.is_empty() && !self.config.approvers.iter().any(|a| a == approver)
        {
            return Err(DecideError::NotApprover(approver.to_owned()));
        }
        Ok(())
    }

    /// Record a decision. `nonce` is the single-use link's, when it came by link.
    pub async fn decide(
        &self,
        id: &str,
        verdict: Verdict,
        approver: &str,
        channel: Channel,
        reason: Option<String>,
        nonce: Option<String>,
    ) -> Result<Approval, DecideError> {
        let current = {
            let id = id.to_owned();
            self.store.call(move |s| s.get(&id)).await?
        }
        .ok_or_else(|| DecideError::Unknown(id.to_owned()))?;
        self.may_decide(&current, approver)?;
        let decided = {
            let (id, approver) = (id.to_owned(), approver.to_owned());
            self.store
                .call(move |s| {
                    s.decide(&Decision {
                        id: &id,
                        verdict,
                        approver: &approver,
                        channel,
                        reason: reason.as_deref(),
                        nonce: nonce.as_deref(),
                        now_ms: now_ms(),
                    })
                })
                .await?
        };
        let (transition, decision, error) = match verdict {
            Verdict::Approve => ("approved", "allow", None),
            Verdict::Deny => ("denied", "deny", Some("approval_denied")),
        };
        self.record(
            &decided,
            transition,
            decision,
            error,
            format!("{transition} by {approver} via {}", channel.as_str()),
            None,
        );
        // The approver is told only once the decision's record is on disk.
        self.audit.flush().await;
        Ok(decided)
    }

    /// One approval.
    pub async fn get(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let id = id.to_owned();
        self.store.call(move |s| s.get(&id)).await
    }

    /// Wait until `id` reaches a final status or `wait` passes; the approval as it is then.
    pub async fn wait(&self, id: &str, wait: Duration) -> Result<Option<Approval>, StoreError> {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait.min(self.config.max_wait);
        loop {
            // Marked seen before reading, so a transition between the read and the wait
            // still wakes us.
            rx.borrow_and_update();
            let approval = self.get(id).await?;
            match &approval {
                Some(a) if !a.status.is_final() => {}
                _ => return Ok(approval),
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Ok(approval);
            }
        }
    }

    /// Write the audit record and metric of one transition, and wake waiters.
    pub fn record(
        &self,
        approval: &Approval,
        transition: &str,
        decision: &str,
        error: Option<&str>,
        reason: String,
        status: Option<u16>,
    ) {
        self.record_with(
            approval,
            transition,
            decision,
            error,
            reason,
            status,
            |_| {},
        );
    }

    /// [`Self::record`], with more fields (an execution's credentials and upstream).
    #[allow(clippy::too_many_arguments)]
    pub fn record_with(
        &self,
        approval: &Approval,
        transition: &str,
        decision: &str,
        error: Option<&str>,
        reason: String,
        status: Option<u16>,
        more: impl FnOnce(&mut crate::audit::AuditRecord),
    ) {
        let mut audit = AuditGuard::start(
            &self.audit,
            &self.metrics,
            &crate::ids::request_id(),
            "approval",
        );
        audit.update(|r| {
            r.session = Some(approval.session.clone());
            r.agent = Some(approval.agent.clone());
            r.tenant = Some(approval.tenant.clone());
            r.method = Some(approval.request.method.clone());
            r.scheme = Some(approval.observed.scheme.clone());
            r.host = Some(approval.observed.host.clone());
            r.port = Some(approval.observed.port);
            r.tool = approval.observed.tool.clone();
            r.tier = approval.observed.tier.clone();
            r.policies = approval.policies.clone();
            r.approval = Some(approval.id.clone());
            r.approver = approval.approver.clone();
            r.reason = Some(reason);
            r.status = status;
            more(r);
        });
        audit.event(decision, error);
        self.metrics.approval_transition(transition);
        self.bump();
    }

    /// Write the audit record of a refused attempt to decide (a review link that does not
    /// verify, a Slack callback whose signature fails or is replayed): `what` names the
    /// channel, `reason` why, never the token or signature. It names no approval: a
    /// refused token's claims are not believed.
    pub fn record_refused(&self, what: &str, reason: String) {
        let mut audit = AuditGuard::start(
            &self.audit,
            &self.metrics,
            &crate::ids::request_id(),
            "approval",
        );
        audit.update(|r| r.reason = Some(format!("{what} refused: {reason}")));
        audit.event("deny", Some("unauthenticated"));
    }

    /// The metrics transitions and notifications are counted in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Wait until every transition recorded so far is committed to the audit chain; whether
    /// it was.
    pub async fn flush_audit(&self) -> bool {
        self.audit.flush().await
    }

    /// Wake everyone waiting on any approval.
    pub fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The review link for `approver`, valid until the approval's deadline.
    pub fn link(&self, approval: &Approval, approver: &str) -> String {
        let token = self
            .signer
            .issue(&approval.id, approver, approval.deadline_ms);
        format!("{}/approve/{token}", self.link_base())
    }

    /// Review links for every listed approver.
    pub fn links(&self, approval: &Approval) -> Vec<(String, String)> {
        self.config
            .approvers
            .iter()
            .map(|a| (a.clone(), self.link(approval, a)))
            .collect()
    }

    /// Check a review-page token.
    pub fn verify_link(&self, token: &str) -> Result<LinkClaims, LinkError> {
        self.signer.verify(token, now_ms())
    }

    /// Where the control API is reached from outside: `approvals.public_url`, or the
    /// control listener as bound (run status URLs use it too).
    pub fn link_base(&self) -> &str {
        self.link_base
            .get()
            .map(String::as_str)
            .unwrap_or("http://127.0.0.1:8081")
    }

    /// Queue counts, also set on the gauges.
    pub async fn refresh_gauges(&self) -> Result<QueueCounts, StoreError> {
        let counts = self.store.call(|s| s.counts()).await?;
        self.metrics.approvals_pending.set(counts.pending);
        self.metrics.approvals_executing.set(counts.executing);
        self.metrics
            .approval_notifications_failing
            .set(counts.failing_deliveries);
        Ok(counts)
    }
}

/// Why a session's `max_pending_approvals` was refused.
#[derive(Debug, thiserror::Error)]
pub enum CapRefused {
    /// Over the ceiling, or over the parent's cap: the creator's mistake (400).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}
