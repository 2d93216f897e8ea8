//! Who a child session runs as (docs/design.md §4, `Action::"spawn"`): identity only narrows.
//!
//! A session creating a child (`POST /v1/sessions` with its own token, or an operator naming
//! it as `parent`) gets a child that runs as the parent's own agent. A child under another
//! agent name would inherit every permit written for that name, so it is a question for
//! policy: Cedar is asked whether the parent's agent may `spawn` `Agent::"<child>"`, with the
//! parent's session as `context.session`, and anything but an allow refuses the child.
//!
//! The answer is a [`ChildAgent`], which only [`resolve`] makes: the session registry takes
//! one to create a child, so no caller can create a child under a name policy was not asked
//! about.

use std::time::Instant;

use ostiary_policies::{AccessRequest, Action, Decision, PolicyEngine, SessionState};

use super::Principal;
use crate::error::ProxyError;
use crate::metrics::Metrics;

/// The agent name a child session runs as, settled by [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildAgent {
    name: String,
    /// The permits that allowed a name other than the parent's (empty for the parent's own).
    policies: Vec<String>,
}

impl ChildAgent {
    /// The agent name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policies that allowed it; empty when the child runs as its parent's agent.
    pub fn policies(&self) -> &[String] {
        &self.policies
    }

    /// Whether the child runs under another name than its parent.
    pub fn renamed(&self) -> bool {
        !self.policies.is_empty()
    }
}

/// The agent a child of `parent` runs as when its creator `asked` for a name (or none).
/// `session` is the parent's `context.session`. A name other than the parent's is decided
/// by Cedar; a deny (default or forbid, or an evaluation error) is the refusal returned.
/// That decision is kept in `kept` (`ostiary_policies::recorded`), so that replay and the
/// shadow set can make it again: a spawn carries no argument, nothing to redact.
pub fn resolve(
    engine: &PolicyEngine,
    metrics: &Metrics,
    parent: &Principal,
    session: &SessionState,
    asked: Option<&str>,
    kept: &mut Option<ostiary_policies::recorded::Kept>,
) -> Result<ChildAgent, ProxyError> {
    let child = match asked {
        None => parent.agent.as_str(),
        Some(name) => name,
    };
    if child == parent.agent {
        return Ok(ChildAgent {
            name: child.to_owned(),
            policies: Vec::new(),
        });
    }
    let request = AccessRequest {
        agent: parent.agent.clone(),
        tenant: parent.tenant.clone(),
        host: String::new(),
        session: session.clone(),
        action: Action::Spawn {
            child: child.to_owned(),
        },
    };
    let started = Instant::now();
    let decision = engine.decide(&request);
    metrics
        .decision_seconds
        .observe(started.elapsed().as_secs_f64());
    *kept = Some(ostiary_policies::recorded::to_json(
        &request,
        &decision,
        &|_| false,
    ));
    match decision {
        Decision::Allow { policies } => Ok(ChildAgent {
            name: child.to_owned(),
            policies,
        }),
        // `spawn` never escalates (only tool calls do), but an escalation is no allow.
        Decision::Escalate { policies } => Err(denied(&request, policies, "approval required")),
        Decision::Deny { policies, reason } => Err(denied(&request, policies, &reason.to_string())),
    }
}

fn denied(request: &AccessRequest, policies: Vec<String>, reason: &str) -> ProxyError {
    ProxyError::Denied {
        policies,
        action: request.action.uid_text(),
        resource: request.resource(),
        reason: format!(
            "a child session runs as its parent's agent {:?}; another name needs a spawn \
             permit ({reason})",
            request.agent
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostiary_policies::PolicySource;

    fn engine(text: &str) -> PolicyEngine {
        PolicyEngine::from_sources(&[PolicySource {
            name: "t.cedar".into(),
            text: text.into(),
        }])
        .unwrap()
    }

    fn parent(agent: &str) -> Principal {
        Principal {
            session_id: "ses_p".into(),
            agent: agent.into(),
            tenant: "acme".into(),
            depth: 0,
            parent: None,
            parent_agent: None,
            profile: None,
            expires_at: i64::MAX,
        }
    }

    #[test]
    fn a_child_runs_as_its_parent_unless_spawn_is_permitted() {
        let metrics = Metrics::default();
        let engine = engine(
            r#"@id("planner-spawns-reviewer")
               permit (principal == Ostiary::Agent::"planner", action == Ostiary::Action::"spawn",
                       resource == Ostiary::Agent::"reviewer")
               when { context.session.depth == 0 };"#,
        );
        let session = SessionState::default();
        let own = resolve(
            &engine,
            &metrics,
            &parent("reader"),
            &session,
            None,
            &mut None,
        )
        .unwrap();
        assert_eq!((own.name(), own.renamed()), ("reader", false));
        let same = resolve(
            &engine,
            &metrics,
            &parent("reader"),
            &session,
            Some("reader"),
            &mut None,
        );
        assert_eq!(
            same.unwrap().name(),
            "reader",
            "its own name needs no permit"
        );
        // No permit names the pair: refused, whatever the name.
        for name in ["deployer", "Reader", "planner", "reviewer", "reader "] {
            let err = resolve(
                &engine,
                &metrics,
                &parent("reader"),
                &session,
                Some(name),
                &mut None,
            );
            assert!(
                matches!(&err, Err(ProxyError::Denied { policies, .. }) if policies.is_empty()),
                "{name}: {err:?}"
            );
        }
        let mut kept = None;
        let ok = resolve(
            &engine,
            &metrics,
            &parent("planner"),
            &session,
            Some("reviewer"),
            &mut kept,
        );
        let ok = ok.unwrap();
        // The decision is kept as it was made, to be made again (replay, the shadow set).
        let back =
            ostiary_policies::recorded::from_json(&kept.as_ref().unwrap().to_value()).unwrap();
        assert_eq!(back.outcome, "allow");
        assert_eq!(back.policies, ["planner-spawns-reviewer"]);
        assert!(engine.decide(&back.request).is_allow());
        assert_eq!(ok.name(), "reviewer");
        assert_eq!(ok.policies(), ["planner-spawns-reviewer"]);
        // The parent's session is the context: a deeper parent is refused.
        let deep = SessionState {
            depth: 1,
            ..Default::default()
        };
        let err = resolve(
            &engine,
            &metrics,
            &parent("planner"),
            &deep,
            Some("reviewer"),
            &mut None,
        );
        assert!(matches!(err, Err(ProxyError::Denied { .. })));
    }
}
