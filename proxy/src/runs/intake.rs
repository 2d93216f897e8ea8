//! How a trigger's delivery becomes a run, in order, each refusal audited and none starting
//! anything:
//!
//! ```text
//! trigger known, of this kind → size (413) → signature (401; secret from the broker)
//!   → payload as JSON (400) → schema (422) → policy (403, or held) → deduplication key (400)
//!   → stored: deduplicated (200 duplicate), rate (429), new (202), one store transaction
//! ```
//! The size before the signature, so an unauthenticated sender cannot make the proxy read
//! (or MAC) more than a payload may be; the signature before everything that reads the
//! payload, so nothing an unauthenticated sender wrote is parsed; the policy decision
//! (`Action::"trigger"`, [`super::authorize`]) on a payload the schema accepted, which is
//! what types it; the rate after the
//! signature, so forged deliveries cannot spend a trigger's rate, and after the
//! deduplication, so a duplicate spends none of it; the deduplication and the rate in the
//! same store transaction as the run, so two deliveries of one event racing on two replicas
//! start one run, and replicas sharing the store share each trigger's rate. Every outcome is
//! one audit record of kind `trigger`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use ostiary_broker::Broker;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Notify;

use super::authorize::Verdict;
use super::signature::Scheme;
use super::spec::RunSpec;
use super::webhook;
use crate::audit::{AuditGuard, AuditSink};
use crate::config::triggers::{Kind, Trigger};
use crate::metrics::Metrics;
use crate::store::runs::{Dedup, Enqueued, NewRun, RateLimit, RunRow, RunStatus, RunStore};
use crate::store::{Call, StoreError};

pub use super::refusal::IntakeError;

/// A run made (or found: a duplicate delivery's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub run_id: String,
    pub trigger: String,
    pub duplicate: bool,
    pub status: RunStatus,
}

/// A trigger made ready for its deliveries: the scheme and the compiled schema.
struct Ready {
    trigger: Trigger,
    scheme: Option<Scheme>,
    schema: Option<jsonschema::Validator>,
}

/// Where deliveries and calls come in.
pub struct Intake {
    /// Swapped whole when the triggers are reloaded ([`Intake::replace`]): a delivery works
    /// with the set it started with.
    triggers: RwLock<Arc<HashMap<String, Arc<Ready>>>>,
    runs: Arc<dyn RunStore>,
    broker: Arc<Broker>,
    audit: AuditSink,
    metrics: Arc<Metrics>,
    /// Woken when a run is queued, so the runner starts it at once.
    wake: Arc<Notify>,
    /// Where held runs wait for a human (`approval = true`, or a policy's `@escalate`).
    approvals: Option<Arc<crate::approvals::ApprovalQueue>>,
    /// What decides `Action::"trigger"`.
    policies: Arc<crate::policy_store::PolicyStore>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field(
                "triggers",
                &self.current().keys().cloned().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Who asks for an API run.
#[derive(Debug)]
pub enum Caller<'a> {
    /// An operator (the admin token).
    Admin,
    /// Whoever holds the trigger's own token (or presented this one).
    Token(Option<&'a str>),
    /// A run's agent, with its session's token: the new run is its child (its session a
    /// child of `session`, carved from its budget, under the spawn rules). `agent` and
    /// `depth` are that session's.
    Run {
        run: String,
        session: String,
        agent: String,
        depth: u32,
    },
}

/// The payload as the run gets it: the bytes delivered, when they are JSON (so the agent can
/// check them against their signature, and a number past a double's precision stays as
/// written); a form's as the object it was read as.
fn stored_text(payload: &Value, raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => text.to_owned(),
        _ => payload.to_string(),
    }
}

/// Each trigger made ready: its scheme and its compiled schema.
fn compile(triggers: &[Trigger]) -> Result<HashMap<String, Arc<Ready>>, String> {
    let mut ready = HashMap::new();
    for trigger in triggers {
        let scheme = trigger
            .signature
            .as_ref()
            .map(webhook::scheme)
            .transpose()?;
        let schema = trigger
            .schema_value()?
            .map(|s| jsonschema::validator_for(&s).map_err(|e| e.to_string()))
            .transpose()?;
        ready.insert(
            trigger.name.clone(),
            Arc::new(Ready {
                trigger: trigger.clone(),
                scheme,
                schema,
            }),
        );
    }
    Ok(ready)
}

/// What approving a held run came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// Queued: the runner starts it.
    Queued,
    /// It was no longer waiting for approval (cancelled meanwhile, or released already).
    NotWaiting,
    /// Decided again, approved, policy still refuses it: cancelled, for this reason.
    Refused(String),
}

/// The run a child run is started from, and its session.
#[derive(Debug)]
struct Parent {
    run: String,
    session: String,
    agent: String,
    depth: u32,
}

impl Ready {
    /// The payload against the trigger's JSON Schema: the first mismatch, located.
    fn check_schema(&self, payload: &Value) -> Result<(), IntakeError> {
        let Some(first) = self
            .schema
            .as_ref()
            .and_then(|s| s.iter_errors(payload).next())
        else {
            return Ok(());
        };
        let at = first.instance_path().to_string();
        let at = if at.is_empty() {
            "the top"
        } else {
            at.as_str()
        };
        Err(IntakeError::SchemaMismatch(format!("{first} (at {at})")))
    }
}

/// A run of `trigger` made `now`, queued: its id, spec and payload.
fn new_row(trigger: &Trigger, spec: String, payload: String, digest: String, now: i64) -> RunRow {
    let new = NewRun {
        id: format!("run_{}", crate::state::random_hex(10)),
        trigger: trigger.name.clone(),
        kind: trigger.kind.as_str().to_owned(),
        spec,
        payload,
        payload_sha256: digest,
    };
    RunRow::queued(new, now)
}

/// Whether a run the policy decided is held for a human, and who asked for the hold: the
/// escalating policies, or the trigger's own `approval = true`; a deny makes no run.
fn held(trigger: &Trigger, verdict: Verdict) -> Result<(bool, Vec<String>), IntakeError> {
    match verdict {
        Verdict::Allowed => Ok((
            trigger.approval,
            vec![format!("trigger:{}:approval", trigger.name)],
        )),
        Verdict::Escalated(policies) => Ok((true, policies)),
        Verdict::Denied { policies, why } => Err(IntakeError::Denied {
            trigger: trigger.name.clone(),
            policies,
            why,
        }),
    }
}

/// What a delivery brings.
#[derive(Debug)]
pub struct Delivery<'a> {
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

impl Intake {
    /// The triggers of the config, compiled (the config was validated: a trigger that does
    /// not compile here was refused at load).
    pub fn new(
        triggers: &[Trigger],
        runs: Arc<dyn RunStore>,
        broker: Arc<Broker>,
        audit: AuditSink,
        metrics: Arc<Metrics>,
        wake: Arc<Notify>,
        policies: Arc<crate::policy_store::PolicyStore>,
    ) -> Result<Self, String> {
        Ok(Self {
            triggers: RwLock::new(Arc::new(compile(triggers)?)),
            runs,
            broker,
            audit,
            metrics,
            wake,
            approvals: None,
            policies,
        })
    }

    /// Hold runs for a human in `approvals`.
    pub fn with_approvals(mut self, approvals: Arc<crate::approvals::ApprovalQueue>) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// The triggers in force.
    fn current(&self) -> Arc<HashMap<String, Arc<Ready>>> {
        self.triggers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Put `triggers` in force (a reload); a trigger that does not compile leaves the ones
    /// in force as they are.
    pub fn replace(&self, triggers: &[Trigger]) -> Result<(), String> {
        let compiled = Arc::new(compile(triggers)?);
        *self.triggers.write().unwrap_or_else(|p| p.into_inner()) = compiled;
        Ok(())
    }

    /// The trigger named `name`.
    pub fn trigger(&self, name: &str) -> Option<Trigger> {
        self.current().get(name).map(|r| r.trigger.clone())
    }

    /// The largest body trigger `name` takes (to bound the read before anything else).
    pub fn max_payload(&self, name: &str) -> Option<usize> {
        self.current()
            .get(name)
            .map(|r| r.trigger.max_payload_bytes)
    }

    /// A webhook delivery to `name` (`POST /v1/triggers/{name}`).
    pub async fn webhook(
        &self,
        name: &str,
        delivery: Delivery<'_>,
    ) -> Result<Admitted, IntakeError> {
        let mut audit = self.record(name);
        let result = self.webhook_in_order(name, &delivery, &mut audit).await;
        self.close(audit, &result);
        result
    }

    async fn webhook_in_order(
        &self,
        name: &str,
        delivery: &Delivery<'_>,
        audit: &mut AuditGuard,
    ) -> Result<Admitted, IntakeError> {
        let ready = self.ready(name, Kind::Webhook)?;
        let trigger = &ready.trigger;
        if delivery.body.len() > trigger.max_payload_bytes {
            return Err(IntakeError::TooLarge {
                limit: trigger.max_payload_bytes,
            });
        }
        let (Some(scheme), Some(signature)) = (&ready.scheme, &trigger.signature) else {
            return Err(IntakeError::BadSignature(
                "the trigger has no scheme".into(),
            ));
        };
        let secret = self
            .broker
            .static_secret(&signature.secret)
            .await
            .map_err(|e| IntakeError::SecretUnavailable {
                credential: signature.secret.clone(),
                cause: e.to_string(),
            })?;
        scheme
            .verify(
                secret.expose().as_bytes(),
                delivery.headers,
                &delivery.body,
                crate::store::now_ms() / 1000,
            )
            .map_err(|e| IntakeError::BadSignature(e.to_string()))?;
        let payload =
            webhook::payload(delivery.headers, &delivery.body).map_err(IntakeError::BadPayload)?;
        let key = match &trigger.dedup {
            Some(dedup) => Some(
                webhook::dedup_key(dedup, delivery.headers, &payload)
                    .map_err(IntakeError::BadPayload)?,
            ),
            None => None,
        };
        self.admit(&ready, payload, &delivery.body, key, None, audit)
            .await
    }

    /// A webhook delivery to `name` refused for its size before it was read (its
    /// `Content-Length`, or the read stopped at the limit): audited like any refusal.
    pub fn too_large(&self, name: &str) -> IntakeError {
        let audit = self.record(name);
        let refusal = match self.ready(name, Kind::Webhook) {
            Ok(ready) => IntakeError::TooLarge {
                limit: ready.trigger.max_payload_bytes,
            },
            Err(e) => e,
        };
        let result = Err(refusal);
        self.close(audit, &result);
        result
            .err()
            .unwrap_or(IntakeError::UnknownTrigger(name.to_owned()))
    }

    /// Tell the runner that a run is queued (an operator's retry).
    pub fn wake_runner(&self) {
        self.wake.notify_one();
    }

    /// An API call starting trigger `name` with `payload` (`POST /v1/runs`), by a caller
    /// the control API authenticated as an admin — or not (`admin` false), in which case
    /// `token` must be the trigger's own.
    pub async fn api(
        &self,
        name: &str,
        payload: Value,
        caller: Caller<'_>,
    ) -> Result<Admitted, IntakeError> {
        let mut audit = self.record(name);
        let result = async {
            let ready = self.ready(name, Kind::Api)?;
            let parent = match caller {
                Caller::Admin => None,
                Caller::Token(token) => {
                    self.check_token(&ready.trigger, token).await?;
                    None
                }
                Caller::Run {
                    run,
                    session,
                    agent,
                    depth,
                } => {
                    audit.update(|r| r.parent = Some(session.clone()));
                    Some(Parent {
                        run,
                        session,
                        agent,
                        depth,
                    })
                }
            };
            let body =
                serde_json::to_vec(&payload).map_err(|e| IntakeError::BadPayload(e.to_string()))?;
            if body.len() > ready.trigger.max_payload_bytes {
                return Err(IntakeError::TooLarge {
                    limit: ready.trigger.max_payload_bytes,
                });
            }
            let key = match &ready.trigger.dedup {
                Some(dedup) => Some(
                    webhook::dedup_key(dedup, &HeaderMap::new(), &payload)
                        .map_err(IntakeError::BadPayload)?,
                ),
                None => None,
            };
            self.admit(&ready, payload, &body, key, parent, &mut audit)
                .await
        }
        .await;
        self.close(audit, &result);
        result
    }

    /// A schedule's tick at `scheduled_ms` (after `missed` ticks that started nothing): one
    /// run, deduplicated on the tick so that replicas ticking together start it once.
    pub async fn tick(
        &self,
        name: &str,
        scheduled_ms: i64,
        missed: u64,
    ) -> Result<Admitted, IntakeError> {
        let mut audit = self.record(name);
        let result = async {
            let ready = self.ready(name, Kind::Schedule)?;
            let payload = json!({"scheduled_ms": scheduled_ms, "missed": missed});
            let body = payload.to_string();
            self.admit(
                &ready,
                payload,
                body.as_bytes(),
                Some(format!("tick:{scheduled_ms}")),
                None,
                &mut audit,
            )
            .await
        }
        .await;
        self.close(audit, &result);
        result
    }

    /// A human approved held run `run_id`: decided again — approved, under the policies in
    /// force now — and released into the queue, or cancelled with the policy's reason. The
    /// decision is one audit record of kind `trigger`.
    pub async fn release(&self, run_id: &str, approver: &str) -> Result<Release, StoreError> {
        let id = run_id.to_owned();
        let Some(row) = self.runs.call(move |s| s.get(&id)).await? else {
            return Ok(Release::NotWaiting);
        };
        if row.status != RunStatus::AwaitingApproval {
            return Ok(Release::NotWaiting);
        }
        let mut audit = self.record(&row.trigger);
        let verdict = match serde_json::from_str::<RunSpec>(&row.spec) {
            Ok(spec) => {
                // Stored as JSON (a form's as its object), so it reads back as it was decided.
                let payload = serde_json::from_str(&row.payload).unwrap_or(Value::Null);
                let request = super::authorize::request(
                    &row.trigger,
                    &row.kind,
                    &payload,
                    &spec,
                    Some(approver.to_owned()),
                );
                self.decide(&request, &mut audit)
            }
            Err(e) => Verdict::Denied {
                policies: Vec::new(),
                why: format!("the run's spec does not read: {e}"),
            },
        };
        audit.update(|r| {
            r.run = Some(json!({"trigger": row.trigger, "run_id": row.id, "approver": approver}));
        });
        let now = crate::store::now_ms();
        let id = row.id.clone();
        match verdict {
            Verdict::Allowed => {
                let released = self.runs.call(move |s| s.release(&id, now)).await;
                let released = match released {
                    Ok(released) => released.is_some(),
                    Err(e) => {
                        audit.update(|r| r.reason = Some(format!("releasing the run: {e}")));
                        audit.event("error", Some("state_unavailable"));
                        return Err(e);
                    }
                };
                audit.update(|r| {
                    r.reason = Some(format!(
                        "trigger {}: approved by {approver}, run released",
                        row.trigger
                    ))
                });
                audit.event("allow", None);
                if released {
                    self.wake.notify_one();
                    Ok(Release::Queued)
                } else {
                    Ok(Release::NotWaiting)
                }
            }
            // Approved, a run that still does not pass is refused (an escalation cannot
            // recur with the approval granted; were it to, it is no yes either).
            Verdict::Escalated(policies) | Verdict::Denied { policies, .. } => {
                let why = format!(
                    "policy denies starting the approved run of trigger {:?} ({})",
                    row.trigger,
                    if policies.is_empty() {
                        "no policy permits it".to_owned()
                    } else {
                        format!("policies: {}", policies.join(", "))
                    }
                );
                let cancelled = {
                    let why = why.clone();
                    self.runs.call(move |s| s.cancel(&id, &why, now)).await
                };
                audit.update(|r| {
                    r.reason = Some(why.clone());
                    r.error = Some("denied".into());
                });
                audit.event("deny", Some("denied"));
                cancelled?;
                Ok(Release::Refused(why))
            }
        }
    }

    /// `Action::"trigger"` decided under the policies in force now, the decision kept on
    /// the audit record (its policies, and `decided` for replay and the shadow set).
    fn decide(&self, request: &ostiary_policies::AccessRequest, audit: &mut AuditGuard) -> Verdict {
        let decision = self.policies.current().decide(request);
        audit.update(|r| {
            r.policies = decision.policies().to_vec();
            r.decided = Some(super::authorize::kept(request, &decision));
        });
        super::authorize::verdict(decision)
    }

    fn ready(&self, name: &str, kind: Kind) -> Result<Arc<Ready>, IntakeError> {
        let ready = self
            .current()
            .get(name)
            .cloned()
            .ok_or_else(|| IntakeError::UnknownTrigger(name.to_owned()))?;
        if ready.trigger.kind != kind {
            return Err(IntakeError::WrongKind {
                name: name.to_owned(),
                kind: ready.trigger.kind.as_str(),
            });
        }
        Ok(ready)
    }

    /// The trigger's own token, compared in constant time.
    async fn check_token(&self, trigger: &Trigger, token: Option<&str>) -> Result<(), IntakeError> {
        let (Some(credential), Some(token)) = (&trigger.token, token) else {
            return Err(IntakeError::Unauthenticated);
        };
        let expected = self.broker.static_secret(credential).await.map_err(|e| {
            IntakeError::SecretUnavailable {
                credential: credential.clone(),
                cause: e.to_string(),
            }
        })?;
        if bool::from(expected.expose().as_bytes().ct_eq(token.as_bytes())) {
            Ok(())
        } else {
            Err(IntakeError::Unauthenticated)
        }
    }

    /// Schema, then the run stored: deduplicated, and its trigger's rate spent, in one store
    /// transaction (a duplicate spends none of it).
    async fn admit(
        &self,
        ready: &Ready,
        payload: Value,
        raw: &[u8],
        key: Option<String>,
        parent: Option<Parent>,
        audit: &mut AuditGuard,
    ) -> Result<Admitted, IntakeError> {
        let trigger = &ready.trigger;
        ready.check_schema(&payload)?;
        let digest = hex::encode(Sha256::digest(raw));
        audit.update(|r| {
            r.run = Some(json!({"trigger": trigger.name, "payload_sha256": digest}));
        });
        let now = crate::store::now_ms();
        let mut spec = RunSpec::of(trigger);
        if let Some(parent) = &parent {
            spec.parent_session = Some(parent.session.clone());
            spec.parent_agent = Some(parent.agent.clone());
            spec.depth = parent.depth.saturating_add(1);
        }
        // Decided under the policies in force now; a held run is decided again, approved,
        // when a human says yes.
        let request =
            super::authorize::request(&trigger.name, trigger.kind.as_str(), &payload, &spec, None);
        let (held, asked_by) = held(trigger, self.decide(&request, audit))?;
        let spec =
            serde_json::to_string(&spec).map_err(|e| IntakeError::BadPayload(e.to_string()))?;
        let row = RunRow {
            status: if held {
                RunStatus::AwaitingApproval
            } else {
                RunStatus::Queued
            },
            parent_run: parent.map(|p| p.run),
            ..new_row(
                trigger,
                spec,
                stored_text(&payload, raw),
                digest.clone(),
                now,
            )
        };
        // The approval is made first so the run names it; it is put before humans only
        // once the run is stored (a duplicate delivery asks nobody).
        let approval = match (held, &self.approvals) {
            (true, Some(queue)) => {
                let generation = self.policies.generation();
                Some(super::gate::approval_for(
                    &queue.config,
                    trigger,
                    &row,
                    asked_by,
                    generation,
                    now,
                ))
            }
            _ => None,
        };
        let row = RunRow {
            approval: approval.as_ref().map(|a| a.id.clone()),
            ..row
        };
        let admitted = self.enqueue(trigger, &row, key.clone(), now).await?;
        audit.update(|r| {
            r.run = Some(json!({
                "trigger": trigger.name,
                "run_id": admitted.run_id,
                "payload_sha256": digest,
                "duplicate": admitted.duplicate,
                "dedup_key": key,
            }));
        });
        if let (Some(approval), Some(queue), false) =
            (approval, &self.approvals, admitted.duplicate)
        {
            if let Err(e) = queue.hold(approval).await {
                // A run nobody was asked about must not wait forever.
                let id = row.id.clone();
                let _ = self
                    .runs
                    .call(move |s| s.cancel(&id, "its approval could not be stored", now))
                    .await;
                return Err(e.into());
            }
        }
        if !admitted.duplicate {
            self.wake.notify_one();
        }
        Ok(admitted)
    }

    /// Store `row`, unless `key` names a run already stored in the trigger's dedup window
    /// (that one is answered) or the trigger's rate is spent.
    async fn enqueue(
        &self,
        trigger: &Trigger,
        row: &RunRow,
        key: Option<String>,
        now: i64,
    ) -> Result<Admitted, IntakeError> {
        let window = trigger.dedup.as_ref().map_or(
            // A tick is deduplicated for as long as the longest clock skew between replicas.
            Duration::from_secs(3600),
            |d| d.window,
        );
        let expires_ms = now + i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2);
        let rate = RateLimit {
            count: trigger.rate.count,
            per_ms: i64::try_from(trigger.rate.per.as_millis()).unwrap_or(i64::MAX),
        };
        let stored = {
            let row = row.clone();
            self.runs
                .call(move |s| {
                    s.enqueue(
                        &row,
                        key.as_deref().map(|key| Dedup { key, expires_ms }),
                        Some(rate),
                        now,
                    )
                })
                .await
        };
        let (run_id, duplicate) = match stored? {
            Enqueued::New => (row.id.clone(), false),
            Enqueued::Duplicate(first) => (first, true),
            Enqueued::RateLimited { retry_after_ms } => {
                return Err(IntakeError::RateLimited {
                    name: trigger.name.clone(),
                    count: trigger.rate.count,
                    per: trigger.rate.per,
                    retry_after: Duration::from_millis(u64::try_from(retry_after_ms).unwrap_or(0)),
                })
            }
        };
        Ok(Admitted {
            run_id,
            trigger: trigger.name.clone(),
            duplicate,
            status: row.status,
        })
    }

    fn record(&self, name: &str) -> AuditGuard {
        let request_id = crate::ids::request_id();
        let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "trigger");
        let trigger = self.trigger(name);
        let agent = trigger.as_ref().map(|t| t.agent.clone());
        let tenant = trigger.and_then(|t| t.tenant);
        audit.update(|r| {
            r.agent = agent;
            r.tenant = tenant;
            r.reason = Some(format!("trigger {name}"));
        });
        audit
    }

    fn close(&self, mut audit: AuditGuard, result: &Result<Admitted, IntakeError>) {
        match result {
            Ok(admitted) => {
                let what = if admitted.duplicate {
                    "a duplicate delivery: nothing started"
                } else {
                    "run queued"
                };
                audit.update(|r| r.reason = Some(format!("trigger {}: {what}", admitted.trigger)));
                audit.event("allow", None);
            }
            Err(e) => {
                let decision = match e {
                    IntakeError::Store(_) | IntakeError::SecretUnavailable { .. } => "error",
                    _ => "deny",
                };
                audit.update(|r| {
                    r.reason = Some(e.to_string());
                    r.error = Some(e.kind().to_owned());
                });
                audit.event(decision, Some(e.kind()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_payload_is_kept_as_delivered_and_a_form_as_its_object() {
        let raw = b"{\n  \"id\": 12345678901234567890123,\n  \"size\": 1.50\n}";
        let parsed = crate::strict_json::parse(raw).unwrap();
        assert_eq!(stored_text(&parsed, raw).as_bytes(), raw);
        let form = serde_json::json!({"a": "1"});
        assert_eq!(stored_text(&form, b"a=1"), r#"{"a":"1"}"#);
    }
}
