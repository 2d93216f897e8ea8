//! Evaluation of one request against the loaded policy set, failing closed.
//!
//! Cedar skips a policy whose condition errors and decides without it. For a `forbid` that
//! would turn a deny into an allow, so any evaluation error here is a deny, whatever Cedar
//! decided. Strict validation at load time makes such errors rare; this is the backstop.

use std::fmt;

use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicySet, Request,
    RestrictedExpression,
};

use crate::load::PolicyEngine;
use crate::request::{AccessRequest, Action};
use crate::schema::NAMESPACE;

/// The outcome of evaluation. Exhaustive on purpose: a new outcome must break every caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// At least one permit matched and no forbid did.
    Allow {
        /// Ids of the permits that determined the decision.
        policies: Vec<String>,
    },
    /// Anything else.
    Deny {
        /// Ids of the forbids that determined the decision (empty for a default deny).
        policies: Vec<String>,
        /// Why the request was denied.
        reason: DenyReason,
    },
}

impl Decision {
    /// True for [`Decision::Allow`].
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }

    /// The determining policy ids, whatever the outcome.
    pub fn policies(&self) -> &[String] {
        match self {
            Decision::Allow { policies } | Decision::Deny { policies, .. } => policies,
        }
    }
}

/// Why a request was denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// No permit matched (Cedar's default deny).
    NoPermit,
    /// A forbid matched.
    Forbidden,
    /// The request could not be built or a policy errored; fail closed.
    EvaluationError(String),
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::NoPermit => f.write_str("no policy permits this request"),
            DenyReason::Forbidden => f.write_str("a policy forbids this request"),
            DenyReason::EvaluationError(e) => write!(f, "policy evaluation failed: {e}"),
        }
    }
}

/// Entity type names and action ids, parsed once per policy set: parsing a name goes through
/// Cedar's grammar and would otherwise cost more than evaluating a small policy set.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    agent: EntityTypeName,
    tenant: EntityTypeName,
    host: EntityTypeName,
    http: EntityUid,
    connect: EntityUid,
}

impl Names {
    pub(crate) fn new() -> Result<Self, String> {
        let ty = |kind: &str| -> Result<EntityTypeName, String> {
            format!("{NAMESPACE}::{kind}")
                .parse()
                .map_err(|e| format!("entity type {kind}: {e}"))
        };
        let action = ty("Action")?;
        Ok(Self {
            agent: ty("Agent")?,
            tenant: ty("Tenant")?,
            host: ty("Host")?,
            http: EntityUid::from_type_name_and_id(action.clone(), EntityId::new("http")),
            connect: EntityUid::from_type_name_and_id(action, EntityId::new("connect")),
        })
    }
}

impl Names {
    /// The Cedar action entity of a request's action.
    pub(crate) fn action(&self, action: &Action) -> &EntityUid {
        match action {
            Action::Http { .. } => &self.http,
            Action::Connect { .. } => &self.connect,
        }
    }
}

impl PolicyEngine {
    /// Decide one request. Never panics and never allows on error.
    pub fn decide(&self, req: &AccessRequest) -> Decision {
        self.decide_with(req, self.policy_set())
    }

    /// Decide against another set built from this one's policies (explanations ask what the
    /// decision would be without some of them). Same fail-closed rule as [`Self::decide`].
    pub(crate) fn decide_with(&self, req: &AccessRequest, policies: &PolicySet) -> Decision {
        match self.evaluate(req, policies) {
            Ok(decision) => decision,
            Err(message) => Decision::Deny {
                policies: Vec::new(),
                reason: DenyReason::EvaluationError(message),
            },
        }
    }

    fn evaluate(&self, req: &AccessRequest, policies: &PolicySet) -> Result<Decision, String> {
        let names = self.names();
        let uid = |ty: &EntityTypeName, id: &str| {
            EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
        };
        let principal = uid(&names.agent, &req.agent);
        let tenant = uid(&names.tenant, &req.tenant);
        let resource = uid(&names.host, &req.host);
        let action = names.action(&req.action).clone();

        // The context is built from typed fields, so it matches the schema by construction;
        // re-validating it per request would cost more than evaluating a small policy set.
        // The schema test below keeps the two in step.
        let context =
            Context::from_pairs(req.action.context_pairs()).map_err(|e| format!("context: {e}"))?;
        let request = Request::new(principal.clone(), action, resource.clone(), context, None)
            .map_err(|e| format!("request: {e}"))?;

        let entities = [
            Entity::new_no_attrs(principal, [tenant.clone()].into_iter().collect()),
            Entity::new_no_attrs(tenant, Default::default()),
            Entity::new(
                resource,
                [(
                    "name".to_owned(),
                    RestrictedExpression::new_string(req.host.clone()),
                )]
                .into_iter()
                .collect(),
                Default::default(),
            )
            .map_err(|e| format!("host entity: {e}"))?,
        ];
        // Built here from observed facts, so they are well-formed by construction; validating
        // them against the schema on every request costs more than the evaluation itself.
        let entities =
            Entities::from_entities(entities, None).map_err(|e| format!("entities: {e}"))?;

        let response = self
            .authorizer()
            .is_authorized(&request, policies, &entities);
        let diagnostics = response.diagnostics();
        if let Some(error) = diagnostics.errors().next() {
            return Err(error.to_string());
        }
        let policies: Vec<String> = diagnostics.reason().map(|id| id.to_string()).collect();
        Ok(match response.decision() {
            cedar_policy::Decision::Allow => Decision::Allow { policies },
            cedar_policy::Decision::Deny if policies.is_empty() => Decision::Deny {
                policies,
                reason: DenyReason::NoPermit,
            },
            cedar_policy::Decision::Deny => Decision::Deny {
                policies,
                reason: DenyReason::Forbidden,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use cedar_policy::{Context, EntityUid, Request};

    use crate::load::{PolicyEngine, PolicySource};
    use crate::request::Action;

    /// Evaluation skips schema validation of the context for speed; this test validates the
    /// contexts the proxy builds against the schema, so the two cannot drift apart.
    #[test]
    fn built_contexts_match_the_schema() {
        let engine = PolicyEngine::from_sources(&[PolicySource {
            name: "t".into(),
            text: "permit (principal, action, resource);".into(),
        }])
        .unwrap();
        let actions = [
            Action::Http {
                method: "GET".into(),
                scheme: "https".into(),
                port: 443,
                path: "/".into(),
                query: String::new(),
            },
            Action::Connect {
                port: 443,
                sni: "a.example".into(),
            },
        ];
        for action in actions {
            let uid: EntityUid = format!("Ostiary::Action::\"{}\"", action.id())
                .parse()
                .unwrap();
            let context = Context::from_pairs(action.context_pairs()).unwrap();
            let principal: EntityUid = "Ostiary::Agent::\"a\"".parse().unwrap();
            let resource: EntityUid = "Ostiary::Host::\"h\"".parse().unwrap();
            Request::new(principal, uid, resource, context, Some(engine.schema()))
                .unwrap_or_else(|e| panic!("{action:?}: {e}"));
        }
    }
}
