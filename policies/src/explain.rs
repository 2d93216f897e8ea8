//! `ostiary policy explain`: one request, its decision, the policies that determined it (with
//! the file each came from), and what would change it.
//!
//! "What would change it" is kept to statements this crate can prove from the policy set,
//! never a guess at intent:
//! - allowed: the permits that allowed it (it stays allowed while any of them matches and no
//!   forbid does);
//! - forbidden: the forbids, and the decision the same request gets with them removed (so
//!   the reader knows whether removing them is enough);
//! - escalated: the escalating forbids, which an approval (`context.approval.granted`) lifts;
//! - default deny: the permits for this action (or its tier group) whose resource scope names
//!   this resource (their principal scope or conditions did not hold) and those whose scope
//!   admits any resource of its type, or a note that no permit could match it at all.

use std::fmt;

use cedar_policy::{ActionConstraint, Effect, EntityUid, Policy, PolicySet, ResourceConstraint};
use serde::Serialize;

use crate::decide::{Decision, DenyReason};
use crate::load::PolicyEngine;
use crate::request::AccessRequest;
use crate::schema::NAMESPACE;

/// A policy id and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyRef {
    pub id: String,
    pub file: Option<String>,
}

impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            Some(file) => write!(f, "{} ({file})", self.id),
            None => f.write_str(&self.id),
        }
    }
}

/// What would change the decision (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Allowed by `permits`: a matching forbid would deny it, and so would none of these
    /// permits matching any more.
    Allowed { permits: Vec<PolicyRef> },
    /// Denied by `forbids`; a forbid always wins. `without_forbids` is the decision with them
    /// removed, and `permits` the permits that would then allow it (empty if none would).
    Forbidden {
        forbids: Vec<PolicyRef>,
        without_forbids: String,
        permits: Vec<PolicyRef>,
    },
    /// No permit matched. `host_permits` name this host in their scope; `any_host_permits`
    /// admit any host; both apply to this action and neither matched.
    NoPermit {
        host_permits: Vec<PolicyRef>,
        any_host_permits: Vec<PolicyRef>,
    },
    /// Denied by forbids that all carry `@escalate("approval")`; approved, it is allowed.
    Escalated { forbids: Vec<PolicyRef> },
    /// Evaluation failed, so the request was denied (fail closed).
    Error { message: String },
}

/// The full explanation of one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The request as decided: agent, tenant, host, action and context.
    pub request: serde_json::Value,
    /// `allow`, `escalate` or `deny`.
    pub decision: &'static str,
    /// Why it was denied or escalated; absent for an allow.
    pub reason: Option<String>,
    /// The determining policies (permits for an allow, forbids for a forbid, none for a
    /// default deny).
    pub policies: Vec<PolicyRef>,
    pub change: Change,
}

impl PolicyEngine {
    /// Decide `req` and explain the decision.
    pub fn explain(&self, req: &AccessRequest) -> Explanation {
        let decision = self.decide(req);
        let refs = |ids: &[String]| -> Vec<PolicyRef> {
            let mut refs: Vec<PolicyRef> = ids.iter().map(|id| self.policy_ref(id)).collect();
            refs.sort_by(|a, b| a.id.cmp(&b.id));
            refs
        };
        let (reason, change) = match &decision {
            Decision::Allow { policies } => (
                None,
                Change::Allowed {
                    permits: refs(policies),
                },
            ),
            Decision::Escalate { policies } => (
                Some("approval required".to_owned()),
                Change::Escalated {
                    forbids: refs(policies),
                },
            ),
            Decision::Deny {
                policies,
                reason: reason @ DenyReason::Forbidden,
            } => {
                let without = self.decide_with(req, &self.without(policies));
                let permits = if without.is_allow() {
                    refs(without.policies())
                } else {
                    Vec::new()
                };
                (
                    Some(reason.to_string()),
                    Change::Forbidden {
                        forbids: refs(policies),
                        without_forbids: crate::testing::describe(&without),
                        permits,
                    },
                )
            }
            Decision::Deny {
                reason: reason @ DenyReason::NoPermit,
                ..
            } => {
                let (host_permits, any_host_permits) = self.candidate_permits(req);
                (
                    Some(reason.to_string()),
                    Change::NoPermit {
                        host_permits,
                        any_host_permits,
                    },
                )
            }
            Decision::Deny {
                reason: reason @ DenyReason::EvaluationError(message),
                ..
            } => (
                Some(reason.to_string()),
                Change::Error {
                    message: message.clone(),
                },
            ),
        };
        Explanation {
            request: serde_json::json!({
                "agent": req.agent,
                "tenant": req.tenant,
                "host": req.host,
                "resource": req.resource(),
                "action": req.action.id(),
                "context": req.context(),
            }),
            decision: match decision {
                Decision::Allow { .. } => "allow",
                Decision::Escalate { .. } => "escalate",
                Decision::Deny { .. } => "deny",
            },
            reason,
            policies: refs(decision.policies()),
            change,
        }
    }

    fn policy_ref(&self, id: &str) -> PolicyRef {
        PolicyRef {
            id: id.to_owned(),
            file: self.origin(id).map(str::to_owned),
        }
    }

    /// This set without the given policies.
    fn without(&self, ids: &[String]) -> PolicySet {
        let mut set = PolicySet::new();
        for policy in self.policy_set().policies() {
            if !ids.iter().any(|id| *id == policy.id().to_string()) {
                // Ids are unique in the source set, so adding to a fresh set cannot clash.
                let _ = set.add(policy.clone());
            }
        }
        set
    }

    /// Permits that apply to the request's action: those whose resource scope names this
    /// resource, and those whose scope admits any resource of its type. Sorted by id.
    fn candidate_permits(&self, req: &AccessRequest) -> (Vec<PolicyRef>, Vec<PolicyRef>) {
        let mut host = Vec::new();
        let mut any = Vec::new();
        // A tool not in the catalog has no action any permit could name.
        let Some(action) = self.names().action(&req.action) else {
            return (host, any);
        };
        let groups = self.names().groups(&req.action);
        let (resource_type, resource_id) = match &req.action {
            crate::request::Action::Tool { name, .. } => (format!("{NAMESPACE}::Tool"), name),
            crate::request::Action::Spawn { child } => (format!("{NAMESPACE}::Agent"), child),
            crate::request::Action::Trigger { name, .. } => (format!("{NAMESPACE}::Trigger"), name),
            _ => (format!("{NAMESPACE}::Host"), &req.host),
        };
        for policy in self.policy_set().policies() {
            if policy.effect() != Effect::Permit || !applies_to(policy, action, &groups) {
                continue;
            }
            let names_host = |uid: &EntityUid| {
                uid.type_name().to_string() == resource_type && uid.id().unescaped() == resource_id
            };
            let target = match policy.resource_constraint() {
                ResourceConstraint::Eq(uid)
                | ResourceConstraint::In(uid)
                | ResourceConstraint::IsIn(_, uid) => names_host(&uid).then_some(&mut host),
                ResourceConstraint::Any => Some(&mut any),
                ResourceConstraint::Is(ty) => (ty.to_string() == resource_type).then_some(&mut any),
            };
            if let Some(list) = target {
                list.push(self.policy_ref(policy.id().as_ref()));
            }
        }
        host.sort_by(|a, b| a.id.cmp(&b.id));
        any.sort_by(|a, b| a.id.cmp(&b.id));
        (host, any)
    }
}

/// Whether the policy's action scope admits `action`, a member of `groups` (the hierarchy is
/// one level deep: a tool action in its tier group).
fn applies_to(policy: &Policy, action: &EntityUid, groups: &[EntityUid]) -> bool {
    match policy.action_constraint() {
        ActionConstraint::Any => true,
        ActionConstraint::Eq(a) => &a == action,
        ActionConstraint::In(list) => list.iter().any(|a| a == action || groups.contains(a)),
    }
}

fn list(f: &mut fmt::Formatter<'_>, refs: &[PolicyRef]) -> fmt::Result {
    for r in refs {
        writeln!(f, "    {r}")?;
    }
    Ok(())
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Some(reason) => writeln!(f, "decision: {} ({reason})", self.decision)?,
            None => writeln!(f, "decision: {}", self.decision)?,
        }
        writeln!(f, "request: {}", self.request)?;
        if self.policies.is_empty() {
            writeln!(f, "determining policies: none")?;
        } else {
            writeln!(f, "determining policies:")?;
            list(f, &self.policies)?;
        }
        writeln!(f, "what would change it:")?;
        match &self.change {
            Change::Allowed { permits } => {
                writeln!(
                    f,
                    "  a forbid matching this request would deny it; so would none of these \
                     permits matching any more:"
                )?;
                list(f, permits)
            }
            Change::Forbidden {
                forbids,
                without_forbids,
                permits,
            } => {
                writeln!(
                    f,
                    "  a forbid always wins; these must stop matching (be removed or narrowed):"
                )?;
                list(f, forbids)?;
                writeln!(f, "  without them the request would be: {without_forbids}")?;
                if permits.is_empty() {
                    writeln!(f, "  (so a permit would be needed as well)")?;
                }
                Ok(())
            }
            Change::NoPermit {
                host_permits,
                any_host_permits,
            } => {
                let resource = self.request["resource"].as_str().unwrap_or_default();
                let resource = resource
                    .strip_prefix(&format!("{NAMESPACE}::"))
                    .unwrap_or(resource);
                let action = self.request["action"].as_str().unwrap_or_default();
                if host_permits.is_empty() {
                    writeln!(
                        f,
                        "  no {action} permit names {resource} in its scope; \
                         a permit for this request would allow it"
                    )?;
                } else {
                    writeln!(
                        f,
                        "  these {action} permits name {resource}, but their principal \
                         scope or conditions did not hold for this request:"
                    )?;
                    list(f, host_permits)?;
                }
                if !any_host_permits.is_empty() {
                    writeln!(
                        f,
                        "  these {action} permits admit any resource of its type, and did not \
                         match either:"
                    )?;
                    list(f, any_host_permits)?;
                }
                Ok(())
            }
            Change::Escalated { forbids } => {
                writeln!(
                    f,
                    "  these forbids all carry @escalate(\"approval\"); a human's approval \
                     (context.approval.granted) would allow the request:"
                )?;
                list(f, forbids)
            }
            Change::Error { message } => writeln!(
                f,
                "  evaluation failed ({message}); the request is denied until the error is fixed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::PolicySource;
    use crate::request::Action;

    fn engine() -> PolicyEngine {
        PolicyEngine::from_sources(&[PolicySource {
            name: "t.cedar".into(),
            text: r#"
            @id("read") permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"a.example")
            when { context.method == "GET" };
            @id("sfx") permit (principal, action == Ostiary::Action::"http", resource)
            when { resource.name like "*.b.example" };
            @id("tunnel") permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"a.example");
            @id("no-admin") forbid (principal, action, resource) when { principal == Ostiary::Agent::"admin" };
            "#
            .into(),
        }])
        .unwrap()
    }

    fn http(agent: &str, host: &str, method: &str) -> AccessRequest {
        AccessRequest {
            agent: agent.into(),
            tenant: "default".into(),
            host: host.into(),
            session: Default::default(),
            action: Action::Http {
                method: method.into(),
                scheme: "https".into(),
                port: 443,
                path: "/".into(),
                query: String::new(),
            },
        }
    }

    fn r(id: &str) -> PolicyRef {
        PolicyRef {
            id: id.into(),
            file: Some("t.cedar".into()),
        }
    }

    #[test]
    fn allow_names_the_permits() {
        let e = engine().explain(&http("a", "a.example", "GET"));
        assert_eq!(e.decision, "allow");
        assert_eq!(e.policies, [r("read")]);
        assert_eq!(
            e.change,
            Change::Allowed {
                permits: vec![r("read")]
            }
        );
    }

    #[test]
    fn forbid_says_what_removing_it_gives() {
        let e = engine().explain(&http("admin", "a.example", "GET"));
        assert_eq!(e.decision, "deny");
        assert_eq!(
            e.change,
            Change::Forbidden {
                forbids: vec![r("no-admin")],
                without_forbids: "allow by [read]".into(),
                permits: vec![r("read")],
            }
        );
        let e = engine().explain(&http("admin", "c.example", "GET"));
        let Change::Forbidden { permits, .. } = e.change else {
            panic!("{e}");
        };
        assert!(permits.is_empty());
    }

    #[test]
    fn default_deny_lists_permits_for_the_host_and_action() {
        let e = engine().explain(&http("a", "a.example", "POST"));
        assert_eq!(e.policies, []);
        assert_eq!(
            e.change,
            Change::NoPermit {
                host_permits: vec![r("read")],
                any_host_permits: vec![r("sfx")],
            }
        );
        let text = e.to_string();
        assert!(text.contains("read (t.cedar)"), "{text}");
        // The connect permit for the same host cannot change an http decision.
        assert!(!text.contains("tunnel"), "{text}");

        let e = engine().explain(&http("a", "z.example", "GET"));
        assert!(e.to_string().contains("no http permit names"), "{e}");
    }
}
