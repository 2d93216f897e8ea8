//! The loop watchdog's side of the pipeline: feed it every decided call, and when it trips,
//! pause the session for a human.
//!
//! A trip pauses the session in memory at once — its very next request is refused `423
//! session_paused` — and then, off the request path: the diagnostic snapshot (the trip,
//! the watchdog's counters, the session's usage, its last audit records) goes to the
//! dead-letter table with the pause, and an approval "resume this session?" is put before
//! the approvers through every channel they have (Slack, email, the review page, the CLI).
//! Approving it resumes the session; denying it terminates it. `ostiary sessions
//! resume|terminate` and the control API do the same directly.

use std::hash::{Hash, Hasher};

use serde_json::{json, Value};

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::approvals::model::{Approval, Ask, HeldRequest, Observed};
use crate::approvals::ApprovalQueue;
use crate::audit::AuditSink;
use crate::config;
use crate::counters::trail::TrailEvent;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;
use crate::session::watchdog::Trip;
use crate::session::{Principal, SessionRegistry};
use crate::store::{now_ms, Call};

use super::store::Paused;
use super::Guardrails;

/// A trip on its way to the [`Desk`], with the request that tripped it waiting on `done`.
#[derive(Debug)]
struct Tripped {
    principal: Principal,
    trip: Trip,
    done: oneshot::Sender<()>,
}

/// The request path's end of the watchdog: where a trip goes to be put before a human. The
/// request path never touches the approval queue itself.
#[derive(Debug, Clone)]
pub struct Trips {
    tx: mpsc::Sender<Tripped>,
}

/// A trip is rare: a handful queued is plenty (a full queue waits, it never drops one).
const TRIPS_QUEUED: usize = 64;

impl Trips {
    /// The request path's end and the [`Desk`]'s, to be run with [`Desk::serve`].
    pub fn channel() -> (Self, TripQueue) {
        let (tx, rx) = mpsc::channel(TRIPS_QUEUED);
        (Self { tx }, TripQueue { rx })
    }

    /// Hand a trip to the desk and wait until its pause is written (or the desk is gone).
    async fn send(&self, principal: &Principal, trip: Trip) {
        let (done, written) = oneshot::channel();
        let tripped = Tripped {
            principal: principal.clone(),
            trip,
            done,
        };
        if self.tx.send(tripped).await.is_err() {
            // Shutting down: the pause holds in memory for as long as the process does.
            tracing::error!(session = %principal.session_id, "the watchdog desk is gone; the pause is not stored");
            return;
        }
        let _ = written.await;
    }
}

/// The desk's end of [`Trips`].
#[derive(Debug)]
pub struct TripQueue {
    rx: mpsc::Receiver<Tripped>,
}

/// Where a paused session is put before a human and resumed: the dead letter and the
/// pause (guardrails' store), the audit record, the "resume?" approval (the queue).
#[derive(Debug, Clone)]
pub struct Desk {
    pub guardrails: Arc<Guardrails>,
    pub sessions: Arc<SessionRegistry>,
    pub approvals: Arc<ApprovalQueue>,
    /// The generation a "resume?" approval is held under.
    pub policies: Arc<PolicyStore>,
    pub audit: AuditSink,
    /// The trail a trip's snapshot quotes (the last records of the session).
    pub trail: Arc<dyn crate::store::audit::AuditStore>,
    pub metrics: Arc<Metrics>,
}

impl Desk {
    /// Take trips off `queue` until every [`Trips`] is dropped or `shutdown` resolves.
    pub async fn serve(
        self,
        mut queue: TripQueue,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            let tripped = tokio::select! {
                () = &mut shutdown => return,
                tripped = queue.rx.recv() => match tripped {
                    Some(t) => t,
                    None => return,
                },
            };
            persist(&self, &tripped.principal, tripped.trip).await;
            let _ = tripped.done.send(());
        }
    }

    /// Lift a pause (a human said so). Returns false when the session was not paused.
    pub async fn resume(&self, session: &str, by: &str) -> Result<bool, crate::store::StoreError> {
        resume(self, session, by).await
    }
}

/// The URL scheme of a held "resume this session" approval: never sent anywhere.
pub const RESUME_URL: &str = "ostiary:session/";

/// One decided call as the watchdog sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The tool, or `METHOD host/path` of a plain request.
    pub key: String,
    pub args_hash: u64,
    pub tier: &'static str,
    /// Refused by policy or a check; `None`: as the request's own outcome says.
    pub denied: Option<bool>,
    /// Held for a human, or refused because the session's holds are at their cap
    /// ([`counts_as_hold`]); `None`: as the request's own outcome says.
    pub held: Option<bool>,
    /// A catalogued tool call. Only those count towards the identical-call rule: an agent
    /// polling one URL is not looping the way one calling one tool with the same
    /// arguments is.
    pub tool: bool,
}

impl Seen {
    pub fn new(
        key: &str,
        args: &Value,
        tier: &'static str,
        denied: Option<bool>,
        tool: bool,
    ) -> Self {
        // Not a security hash: it only tells identical arguments apart from different ones
        // (the watchdog keys it again with its own per-process secret).
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash_value(args, &mut h);
        Self {
            key: key.to_owned(),
            args_hash: h.finish(),
            tier,
            denied,
            held: None,
            tool,
        }
    }
}

/// Hash a JSON value as it is, without serializing it first (which cost more than the
/// watchdog itself). Each kind is tagged so that `"1"` and `1` differ.
fn hash_value(value: &Value, h: &mut impl Hasher) {
    match value {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            for item in items {
                hash_value(item, h);
            }
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(h);
            for (k, v) in map {
                k.hash(h);
                hash_value(v, h);
            }
        }
    }
}

/// Whether a refusal counts towards the watchdog's burst of denials: policy and checks
/// saying no — not the guardrails' own limits, which already hold the session back, and
/// not a hold for a human.
pub fn counts_as_denial(err: &ProxyError) -> bool {
    err.audit_decision() == "deny"
        && !matches!(
            err,
            ProxyError::LimitExceeded(_)
                | ProxyError::SessionPaused { .. }
                | ProxyError::ApprovalPending { .. }
                | ProxyError::ApprovalRequired { .. }
        )
}

/// Whether an outcome counts towards the watchdog's burst of holds: the request was put
/// before a human (a new approval or one it joined), or would have been but the session's
/// holds are at their cap. Asking for approvals over and over floods the approvers the way
/// probing floods the denials.
pub fn counts_as_hold(err: &ProxyError) -> bool {
    match err {
        ProxyError::ApprovalPending { .. } => true,
        ProxyError::LimitExceeded(hit) => hit.limit == "approvals",
        _ => false,
    }
}

fn rank(tier: &str) -> u8 {
    match tier {
        "read" => 0,
        "write" => 1,
        "irreversible" => 2,
        _ => 3,
    }
}

/// Feed the watchdog what one request decided; pause the session if it trips. A trip is
/// rare, so the pause is written before this returns (and the tripping request is
/// answered): whoever looks next finds the dead letter. `refused` and `held` are the
/// request's own outcome, for calls that do not say theirs.
pub async fn observe(
    guardrails: &Guardrails,
    tiers: &config::Tiers,
    trips: &Trips,
    principal: &Principal,
    calls: Vec<Seen>,
    refused: bool,
    held: bool,
) {
    if !guardrails.settings().watchdog.enabled {
        return;
    }
    let now_ms = now_ms();
    let events = calls
        .into_iter()
        .map(|seen| {
            let tier = tiers.get(seen.tier);
            TrailEvent {
                repeat_max: if seen.tool {
                    tier.map_or(20, |t| t.repeat_max)
                } else {
                    0
                },
                repeat_window_ms: tier
                    .map_or(std::time::Duration::from_secs(60), |t| t.repeat_window)
                    .as_millis()
                    .try_into()
                    .unwrap_or(u64::MAX),
                tier_rank: rank(seen.tier),
                denied: seen.denied.unwrap_or(refused),
                held: seen.held.unwrap_or(held),
                args_hash: seen.args_hash,
                key: seen.key,
                at_ms: now_ms,
                reset: false,
            }
        })
        .collect();
    let Some(trip) = guardrails.watch(&principal.session_id, events).await else {
        return;
    };
    if guardrails.paused(&principal.session_id).is_some() {
        return;
    }
    // In memory first, so the session's next request is refused whatever the
    // store and the notifications below take.
    guardrails
        .set_paused(
            &principal.session_id,
            Paused {
                kind: kind_name(&trip),
                reason: trip.reason.clone(),
                at_ms: now_ms,
                dead_letter: 0,
            },
        )
        .await;
    tracing::warn!(session = %principal.session_id, reason = %trip.reason, "watchdog paused a session");
    trips.send(principal, trip).await;
}

fn kind_name(trip: &Trip) -> String {
    serde_json::to_value(trip.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "watchdog".into())
}

/// Write the dead letter and the pause, audit it, and ask the approvers.
async fn persist(shared: &Desk, principal: &Principal, trip: Trip) {
    shared.metrics.watchdog_trip(&kind_name(&trip));
    let session = principal.session_id.clone();
    // The request that tripped it is in the snapshot too.
    shared.audit.flush().await;
    let guardrails = &shared.guardrails;
    let n = guardrails.settings().watchdog.snapshot_records;
    let recent = {
        let session = session.clone();
        shared
            .trail
            .call(move |s| s.recent(&session, n))
            .await
            .map(|records| {
                records
                    .iter()
                    .map(|r| serde_json::from_str(r).unwrap_or(serde_json::Value::Null))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|e| vec![json!({ "error": e.to_string() })])
    };
    let account = guardrails.meter.snapshot(&session).unwrap_or_default();
    let kind = kind_name(&trip);
    let snapshot = json!({
        "trip": trip,
        "counters": guardrails.watchdog.counters(&session),
        "usage": account.usage,
        "limits": account.limits,
        "agent": principal.agent,
        "tenant": principal.tenant,
        "depth": principal.depth,
        "parent": principal.parent,
        "recent_audit": recent,
    });
    let stored = {
        let (session, kind, reason) = (session.clone(), kind.clone(), trip.reason.clone());
        guardrails
            .store
            .call(move |s| s.pause(&session, &kind, &reason, &snapshot, now_ms()))
            .await
    };
    let paused = match stored {
        Ok(Some(paused)) => paused,
        Ok(None) => return,
        Err(e) => {
            // The pause holds in memory; only a restart would lift it.
            tracing::error!(session, error = %e, "storing a watchdog pause failed");
            return;
        }
    };
    // Resumed or ended while the snapshot was being written, on this replica or another:
    // the human was first. The pause is completed only where it still stands, in one step
    // with that check, so a resume elsewhere is never undone.
    if !guardrails.refresh_paused(&session, paused.clone()).await {
        let owned = session.clone();
        let resolution = if shared.sessions.is_live(&session) {
            "resumed"
        } else {
            "terminated"
        };
        let _ = guardrails
            .store
            .call(move |s| s.unpause(&owned, resolution, now_ms()))
            .await;
        return;
    }
    shared.audit.session_event(
        &shared.metrics,
        &session,
        &principal.agent,
        &principal.tenant,
        &format!(
            "session paused by the watchdog ({kind}): {}; dead letter {}",
            trip.reason, paused.dead_letter
        ),
    );
    if let Err(e) = ask_approvers(shared, principal, &kind, &trip.reason, paused.dead_letter).await
    {
        tracing::error!(session, error = %e, "asking approvers about a paused session failed");
    }
}

/// Put "resume this session?" before the approvers, through the approval queue.
async fn ask_approvers(
    shared: &Desk,
    principal: &Principal,
    kind: &str,
    reason: &str,
    dead_letter: i64,
) -> Result<(), crate::store::StoreError> {
    let config = &shared.approvals.config;
    let args = json!({
        "session": principal.session_id,
        "watchdog": kind,
        "reason": reason,
        "dead_letter": dead_letter,
        "approve": "resume the session",
        "deny": "terminate the session",
    });
    let url = format!("{RESUME_URL}{}/resume", principal.session_id);
    let approval = crate::approvals::model::pending(
        config,
        Ask {
            principal,
            request_id: crate::ids::request_id(),
            policies: vec![format!("watchdog:{kind}")],
            policy_generation: shared.policies.generation(),
            request: HeldRequest {
                method: "POST".into(),
                url,
                headers: Vec::new(),
                body: Vec::new(),
                body_digest: crate::approvals::model::digest(b""),
            },
            observed: Observed {
                host: "ostiary".into(),
                port: 0,
                scheme: "ostiary".into(),
                action: "Ostiary::Action::\"session:resume\"".into(),
                resource: format!("Ostiary::Session::{:?}", principal.session_id),
                tool: Some("ostiary.resume_session".into()),
                tier: Some("high_impact".into()),
                args: Some(args),
                ..Default::default()
            },
        },
        now_ms(),
    );
    shared.approvals.hold(approval).await.map(|_| ())
}

/// The session a "resume" approval is about, if `approval` is one.
pub fn resume_target(approval: &Approval) -> Option<&str> {
    approval
        .request
        .url
        .strip_prefix(RESUME_URL)?
        .strip_suffix("/resume")
}

/// Lift a pause (a human said so). Returns false when the session was not paused.
async fn resume(shared: &Desk, session: &str, by: &str) -> Result<bool, crate::store::StoreError> {
    let owned = session.to_owned();
    let was = shared
        .guardrails
        .store
        .call(move |s| s.unpause(&owned, "resumed", now_ms()))
        .await?;
    // A pause only in memory (its snapshot still being written) is lifted too.
    let in_memory = shared.guardrails.clear_paused(session).await;
    if was || in_memory {
        let principal = shared.sessions.get(session);
        let (agent, tenant) = principal
            .as_ref()
            .map(|p| (p.agent.as_str(), p.tenant.as_str()))
            .unwrap_or_default();
        shared.audit.session_event(
            &shared.metrics,
            session,
            agent,
            tenant,
            &format!("session resumed by {by}"),
        );
        // The approvers' "resume?" question is answered: withdraw it (a no-op when the
        // approval itself is what resumed it — it is executing, not pending).
        let (owned, reason) = (
            session.to_owned(),
            format!("the session was resumed by {by}"),
        );
        let queue = &shared.approvals;
        match queue
            .store
            .call(move |s| s.withdraw_resume(&owned, &reason, now_ms()))
            .await
        {
            Ok(withdrawn) => {
                for approval in &withdrawn {
                    queue.record(
                        approval,
                        "expired",
                        "deny",
                        Some("approval_expired"),
                        format!("withdrawn: the session was resumed by {by}"),
                        None,
                    );
                }
            }
            Err(e) => tracing::error!(session, error = %e, "withdrawing a resume question failed"),
        }
    }
    Ok(was || in_memory)
}
