//! Phase `evaluate`: the Cedar decision for a classified request, and the port rule of the
//! egress guard (a port outside `egress.ports` needs a `connect` permit naming it).
//!
//! Fail closed: the policy crate turns every evaluation error into a deny, and this phase
//! turns every deny into a typed refusal with the determining policies.

use std::time::Instant;

use ostiary_policies::{AccessRequest, Action, Decision, DenyReason, PolicyEngine, SessionState};

use crate::egress::address::Host;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::session::Principal;

/// What policy said yes to, or would say yes to with a human's approval.
#[derive(Debug)]
pub enum Verdict {
    /// Allowed, by these policies; the action is handed back for the checks (and a hold,
    /// should a check ask for a human).
    Allow {
        policies: Vec<String>,
        action: Action,
    },
    /// Denied only by `@escalate("approval")` forbids: the request goes to the approval
    /// queue. The action is handed back so the queue can keep what was decided.
    Escalate {
        policies: Vec<String>,
        action: Action,
    },
}

/// Evaluate one question, timing it; an escalation is refused as `approval_required`
/// (for callers that cannot hold a request: CONNECT, MCP batches).
pub fn decide(
    engine: &PolicyEngine,
    metrics: &Metrics,
    principal: &Principal,
    session: &SessionState,
    host: &Host,
    action: Action,
) -> Result<Vec<String>, ProxyError> {
    decide_kept(engine, metrics, principal, session, host, action, None)
}

/// [`decide`], the decision also kept (see [`decide_keeping`]).
pub fn decide_kept(
    engine: &PolicyEngine,
    metrics: &Metrics,
    principal: &Principal,
    session: &SessionState,
    host: &Host,
    action: Action,
    kept: Option<Keep<'_>>,
) -> Result<Vec<String>, ProxyError> {
    match decide_keeping(engine, metrics, principal, session, host, action, kept)? {
        Verdict::Allow { policies, .. } => Ok(policies),
        Verdict::Escalate { policies, action } => Err(ProxyError::ApprovalRequired {
            resource: resource_of(principal, host, &action),
            action: action.uid_text(),
            policies,
        }),
    }
}

fn resource_of(principal: &Principal, host: &Host, action: &Action) -> String {
    AccessRequest {
        agent: principal.agent.clone(),
        tenant: principal.tenant.clone(),
        host: host.to_string(),
        session: SessionState::default(),
        action: action.clone(),
    }
    .resource()
}

/// Where a decision is kept, and which argument strings are credentials (redacted).
pub type Keep<'a> = (
    &'a mut Option<ostiary_policies::recorded::Kept>,
    &'a dyn Fn(&str) -> bool,
);

/// Evaluate one question, timing it; an escalation is handed back as [`Verdict::Escalate`].
/// `session` is `context.session`: what the principal's session used before this request.
/// With `kept`, the decision is also kept as `ostiary_policies::recorded` JSON (for the
/// audit record), arguments whose strings `secret` flags redacted.
pub fn decide_keeping(
    engine: &PolicyEngine,
    metrics: &Metrics,
    principal: &Principal,
    session: &SessionState,
    host: &Host,
    action: Action,
    kept: Option<Keep<'_>>,
) -> Result<Verdict, ProxyError> {
    let request = AccessRequest {
        agent: principal.agent.clone(),
        tenant: principal.tenant.clone(),
        host: host.to_string(),
        session: session.clone(),
        action,
    };
    let started = Instant::now();
    let decision = engine.decide(&request);
    metrics
        .decision_seconds
        .observe(started.elapsed().as_secs_f64());
    if let Some((kept, secret)) = kept {
        *kept = Some(ostiary_policies::recorded::to_json(
            &request, &decision, secret,
        ));
    }
    match decision {
        Decision::Allow { policies } => Ok(Verdict::Allow {
            policies,
            action: request.action,
        }),
        Decision::Escalate { policies } => Ok(Verdict::Escalate {
            policies,
            action: request.action,
        }),
        Decision::Deny { policies, reason } => {
            // A tool call whose arguments do not fit the tool's schema cannot be evaluated
            // (its `context.args` has no Cedar value), so the engine denies with an
            // evaluation error. That is the agent's mistake, not a policy's verdict: it is
            // answered as the failed `args_schema` check (422) so the agent can fix the call.
            // Re-checking only on this path keeps the allowed path free of a second
            // conversion.
            if let DenyReason::EvaluationError(_) = reason {
                if let Some(detail) = args_mismatch(engine, &request.action) {
                    return Err(ProxyError::CheckFailed {
                        check: "args_schema".into(),
                        detail,
                    });
                }
            }
            Err(ProxyError::Denied {
                policies,
                action: request.action.uid_text(),
                resource: request.resource(),
                reason: reason.to_string(),
            })
        }
    }
}

/// Why a tool call's arguments do not fit its tool's schema, if they do not.
fn args_mismatch(engine: &PolicyEngine, action: &Action) -> Option<String> {
    let Action::Tool { name, args, .. } = action else {
        return None;
    };
    engine.catalog().get(name)?.check_args(args).err()
}

/// The port rule: `egress.ports`, or a `connect` permit for this host and port. Returns the
/// policies that opened the port (none for a listed port), which the audit record names.
pub fn port(
    engine: &PolicyEngine,
    metrics: &Metrics,
    allowed_ports: &[u16],
    (principal, session): (&Principal, &SessionState),
    host: &Host,
    port: u16,
) -> Result<Vec<String>, ProxyError> {
    if allowed_ports.contains(&port) {
        return Ok(Vec::new());
    }
    let action = Action::Connect {
        port,
        sni: host.to_string(),
    };
    decide(engine, metrics, principal, session, host, action).map_err(|denied| {
        ProxyError::DestinationBlocked {
            address: format!("{host}:{port}"),
            reason: format!(
                "port {port} is not in egress.ports and no connect policy permits it ({denied})"
            ),
        }
    })
}
