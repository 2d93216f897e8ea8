//! The policy decision on a run before it is made (`Action::"trigger"`, docs/design.md §4):
//! the trigger's agent as principal, the trigger as resource, the validated payload and the
//! session the run would have in context. Asked once when a delivery, a tick or a call is
//! admitted — a deny starts nothing, an `@escalate` holds the run for a human as
//! `approval = true` does — and again, with `context.approval.granted`, when a human
//! approves a held run, under the policies in force at that moment.

use ostiary_policies::{AccessRequest, Action, Decision, SessionState, TriggerDef, Triggers};
use serde_json::Value;

use super::spec::RunSpec;
use crate::config::triggers::Trigger;

/// What the decision says of a run about to be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Made and queued, or held when the trigger says `approval = true`.
    Allowed,
    /// Held for a human: these policies asked for one.
    Escalated(Vec<String>),
    /// Nothing is made.
    Denied { policies: Vec<String>, why: String },
}

/// The request a run of `trigger` with `payload` and `spec` presents to policies;
/// `approver` once a human said yes.
pub fn request(
    trigger: &str,
    kind: &str,
    payload: &Value,
    spec: &RunSpec,
    approver: Option<String>,
) -> AccessRequest {
    AccessRequest {
        agent: spec.agent.clone(),
        tenant: spec.tenant.clone().unwrap_or_else(|| "default".into()),
        host: String::new(),
        // The session the run will have: new (no call, no cost), where the spec puts it.
        session: SessionState {
            calls: 0,
            cost_micros: 0,
            depth: i64::from(spec.depth),
            parent_agent: spec.parent_agent.clone().unwrap_or_default(),
            profile: if spec.sandboxed() {
                spec.profile.clone()
            } else {
                String::new()
            },
            // A new session has touched nothing.
            ..SessionState::default()
        },
        action: Action::Trigger {
            name: trigger.to_owned(),
            kind: kind.to_owned(),
            payload: payload.clone(),
            approval: approver,
        },
    }
}

/// The decision in the terms of a run.
pub fn verdict(decision: Decision) -> Verdict {
    match decision {
        Decision::Allow { .. } => Verdict::Allowed,
        Decision::Escalate { policies } => Verdict::Escalated(policies),
        Decision::Deny { policies, reason } => Verdict::Denied {
            why: reason.to_string(),
            policies,
        },
    }
}

/// The decision as the trigger's audit record keeps it (replay, the shadow set): the
/// payload's strings the default DLP detectors flag redacted.
pub fn kept(request: &AccessRequest, decision: &Decision) -> ostiary_policies::recorded::Kept {
    static DETECTORS: std::sync::OnceLock<crate::check::dlp::Detectors> =
        std::sync::OnceLock::new();
    let detectors = DETECTORS.get_or_init(crate::check::dlp::Detectors::default_set);
    ostiary_policies::recorded::to_json(request, decision, &|s: &str| {
        detectors.scan(s.as_bytes()).is_some()
    })
}

/// The triggers as the policy set types them (their payload schemas, resolved).
pub fn policy_triggers(triggers: &[Trigger]) -> Triggers {
    let defs: Vec<TriggerDef> = triggers
        .iter()
        .map(|t| TriggerDef {
            name: t.name.clone(),
            kind: t.kind.as_str().to_owned(),
            // The config was validated: a schema that does not read was refused at load.
            schema: t.schema_value().ok().flatten(),
        })
        .collect();
    Triggers::new(&defs)
}
