//! Evaluation of one request against the loaded policy set, failing closed.
//!
//! Cedar skips a policy whose condition errors and decides without it. For a `forbid` that
//! would turn a deny into an allow, so any evaluation error here is a deny, whatever Cedar
//! decided. Strict validation at load time makes such errors rare; this is the backstop.
//! The one part of a request the agent controls, a tool call's arguments, is checked against
//! the tool's schema here, per request; a mismatch is a deny of the same kind.
//!
//! # Escalation (docs/design.md §4)
//! A tool call (or a trigger) that is denied is escalated instead — [`Decision::Escalate`], "ask a human" —
//! when (a) at least one policy determined the deny and every one of them carries
//! `@escalate("approval")`, and (b) the same request with `context.approval.granted == true`
//! (the approver left as it was, empty if none) is allowed. A default deny never escalates,
//! nor does a request already approved, nor an `http`/`connect` request (their context has no
//! approval to grant).

use std::collections::HashMap;
use std::fmt;

use cedar_policy::{
    Context, Entities, Entity, EntityId, EntityTypeName, EntityUid, PolicyId, PolicySet, Request,
    RestrictedExpression,
};

use crate::args::RecordType;
use crate::catalog::Catalog;
use crate::entities::{EntityKey, Resource};
use crate::index::ScopeKeys;
use crate::load::PolicyEngine;
use crate::request::{AccessRequest, Action};
use crate::schema::NAMESPACE;
use crate::triggers::Triggers;

/// The annotation that makes a forbid escalate: `@escalate("approval")`.
pub const ESCALATE_ANNOTATION: (&str, &str) = ("escalate", "approval");

/// The outcome of evaluation. Exhaustive on purpose: a new outcome must break every caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// At least one permit matched and no forbid did.
    Allow {
        /// Ids of the permits that determined the decision.
        policies: Vec<String>,
    },
    /// Denied only by forbids that all carry `@escalate("approval")`, and allowed once
    /// approved: the call waits for a human (see the module doc).
    Escalate {
        /// Ids of the escalating forbids that determined the deny.
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
            Decision::Allow { policies }
            | Decision::Escalate { policies }
            | Decision::Deny { policies, .. } => policies,
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

/// Entity type names, action ids and tool entities, built once per policy set: parsing a
/// name goes through Cedar's grammar and would otherwise cost more than evaluating a small
/// policy set.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    agent: EntityTypeName,
    tenant: EntityTypeName,
    host: EntityTypeName,
    http: EntityUid,
    connect: EntityUid,
    mcp: EntityUid,
    spawn: EntityUid,
    pub(crate) trigger: EntityUid,
    trigger_type: EntityTypeName,
    tools: HashMap<String, ToolModel>,
    /// The undo actions (`Action::"tool:<name>.undo"`) of the tools that declare one.
    undos: HashMap<String, ToolModel>,
    pub(crate) triggers: Triggers,
}

/// What evaluating a call of one tool needs beyond the request.
#[derive(Debug, Clone)]
struct ToolModel {
    /// `Action::"tool:<name>"`.
    action_uid: EntityUid,
    /// The same, as an entity whose parent is its tier group.
    action: Entity,
    /// `Action::"tier:<tier>"`.
    group: Entity,
    /// `Tool::"<name>"` with its attributes.
    resource: Entity,
    args: RecordType,
}

impl Names {
    pub(crate) fn new(catalog: &Catalog, triggers: &Triggers) -> Result<Self, String> {
        let ty = |kind: &str| -> Result<EntityTypeName, String> {
            format!("{NAMESPACE}::{kind}")
                .parse()
                .map_err(|e| format!("entity type {kind}: {e}"))
        };
        let action = ty("Action")?;
        let tool_ty = ty("Tool")?;
        let action_uid =
            |id: String| EntityUid::from_type_name_and_id(action.clone(), EntityId::new(id));
        let mut tools = HashMap::with_capacity(catalog.len());
        let mut undos = HashMap::new();
        for tool in catalog.tools() {
            let group = action_uid(format!("tier:{}", tool.tier().as_str()));
            let attrs = [
                (
                    "tier".to_owned(),
                    RestrictedExpression::new_string(tool.tier().as_str().to_owned()),
                ),
                (
                    "reversible".to_owned(),
                    RestrictedExpression::new_bool(tool.reversible()),
                ),
                (
                    "server".to_owned(),
                    RestrictedExpression::new_string(tool.server().to_owned()),
                ),
            ];
            let resource = Entity::new(
                EntityUid::from_type_name_and_id(tool_ty.clone(), EntityId::new(tool.name())),
                attrs.into_iter().collect(),
                Default::default(),
            )
            .map_err(|e| format!("tool entity {}: {e}", tool.name()))?;
            // An undo is its own action, in the same tier group, on the same `Tool`, with
            // the same context (the arguments of the call it reverses).
            let model = |id: String| {
                let uid = action_uid(id);
                ToolModel {
                    action: Entity::new_no_attrs(
                        uid.clone(),
                        [group.clone()].into_iter().collect(),
                    ),
                    action_uid: uid,
                    group: Entity::new_no_attrs(group.clone(), Default::default()),
                    resource: resource.clone(),
                    args: tool.args.clone(),
                }
            };
            if tool.undo().is_some() {
                undos.insert(
                    tool.name().to_owned(),
                    model(format!("tool:{}.undo", tool.name())),
                );
            }
            tools.insert(
                tool.name().to_owned(),
                model(format!("tool:{}", tool.name())),
            );
        }
        Ok(Self {
            agent: ty("Agent")?,
            tenant: ty("Tenant")?,
            host: ty("Host")?,
            http: action_uid("http".into()),
            connect: action_uid("connect".into()),
            mcp: action_uid("mcp".into()),
            spawn: action_uid("spawn".into()),
            trigger: action_uid("trigger".into()),
            trigger_type: ty("Trigger")?,
            tools,
            undos,
            triggers: triggers.clone(),
        })
    }

    /// The model of a tool call's action: the tool's own, or its undo's; `None` for a tool
    /// not in the catalog, or an undo of a tool that declares none.
    fn tool(&self, name: &str, undo: bool) -> Option<&ToolModel> {
        if undo {
            self.undos.get(name)
        } else {
            self.tools.get(name)
        }
    }

    /// The Cedar action entity of a request's action; `None` for a tool not in the catalog.
    pub(crate) fn action(&self, action: &Action) -> Option<&EntityUid> {
        match action {
            Action::Http { .. } => Some(&self.http),
            Action::Connect { .. } => Some(&self.connect),
            Action::Mcp { .. } => Some(&self.mcp),
            Action::Spawn { .. } => Some(&self.spawn),
            Action::Trigger { .. } => Some(&self.trigger),
            Action::Tool { name, undo, .. } => self.tool(name, *undo).map(|t| &t.action_uid),
        }
    }

    /// The action groups the action is in (its tier group for a tool; none otherwise).
    pub(crate) fn groups(&self, action: &Action) -> Vec<EntityUid> {
        match action {
            Action::Tool { name, undo, .. } => self
                .tool(name, *undo)
                .map(|t| vec![t.group.uid()])
                .unwrap_or_default(),
            Action::Http { .. }
            | Action::Connect { .. }
            | Action::Mcp { .. }
            | Action::Spawn { .. }
            | Action::Trigger { .. } => Vec::new(),
        }
    }

    /// The uids a request presents to policy scopes, for the index; `None` for a tool not in
    /// the catalog (its evaluation fails whatever the policies).
    pub(crate) fn scope_keys<'a>(&'a self, req: &'a AccessRequest) -> Option<ScopeKeys<'a>> {
        let uid = |ty: &EntityTypeName, id: &str| {
            EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
        };
        let (action, groups, resource) = match &req.action {
            Action::Tool { name, undo, .. } => {
                let model = self.tool(name, *undo)?;
                (
                    model.action_uid.clone(),
                    vec![model.group.uid()],
                    model.resource.uid(),
                )
            }
            Action::Http { .. } => (self.http.clone(), Vec::new(), uid(&self.host, &req.host)),
            Action::Connect { .. } => {
                (self.connect.clone(), Vec::new(), uid(&self.host, &req.host))
            }
            Action::Mcp { .. } => (self.mcp.clone(), Vec::new(), uid(&self.host, &req.host)),
            Action::Spawn { child } => (self.spawn.clone(), Vec::new(), uid(&self.agent, child)),
            Action::Trigger { name, .. } => (
                self.trigger.clone(),
                Vec::new(),
                uid(&self.trigger_type, name),
            ),
        };
        let args = match &req.action {
            Action::Tool { name, undo, .. } => self.tool(name, *undo).map(|t| &t.args),
            Action::Trigger { name, .. } => self.triggers.get(name).map(|t| &t.payload),
            _ => None,
        };
        Some(ScopeKeys {
            agent: uid(&self.agent, &req.agent),
            tenant: uid(&self.tenant, &req.tenant),
            action,
            groups,
            resource,
            request: req,
            args,
        })
    }
}

impl PolicyEngine {
    /// Decide one request. Never panics and never allows on error.
    ///
    /// Only the policies whose scope can match the request are evaluated (see `index.rs`);
    /// the decision is the one the full set gives.
    pub fn decide(&self, req: &AccessRequest) -> Decision {
        // The same question asked again is answered as it was (memo.rs).
        let reads = |key: &str| self.context_use().reads(key);
        self.memo()
            .decide(req, reads, || self.decide_sliced(req, None))
    }

    /// [`Self::decide`] with the index walking dimension `walk` (0 principal, 1 action, 2
    /// resource, 3 conditions) rather than the smallest: each dimension's lookup must be
    /// sound on its own (`tests/index_differential.rs`).
    #[doc(hidden)]
    pub fn decide_walking(&self, req: &AccessRequest, walk: usize) -> Decision {
        self.decide_sliced(req, Some(walk))
    }

    /// Decide over the index's slice for `req` (walking dimension `walk`, or the smallest).
    fn decide_sliced(&self, req: &AccessRequest, walk: Option<usize>) -> Decision {
        let slice = self
            .names()
            .scope_keys(req)
            .and_then(|keys| self.index().slice(&keys, walk));
        match slice {
            Some(policies) => self.decide_with(req, &policies),
            None => self.decide_with(req, self.policy_set()),
        }
    }

    /// [`Self::decide`] evaluating the full set, bypassing the index: the reference the
    /// index is tested against (`tests/index_differential.rs`).
    #[doc(hidden)]
    pub fn decide_unindexed(&self, req: &AccessRequest) -> Decision {
        self.decide_with(req, self.policy_set())
    }

    /// Decide against another set built from this one's policies (explanations ask what the
    /// decision would be without some of them). Same fail-closed rule as [`Self::decide`].
    pub(crate) fn decide_with(&self, req: &AccessRequest, policies: &PolicySet) -> Decision {
        let decision = self.decide_once(req, policies);
        let Decision::Deny {
            policies: determining,
            reason: DenyReason::Forbidden,
        } = &decision
        else {
            return decision;
        };
        // Only what a human can approve escalates, and only before they did.
        let Some(None) = req.action.approval() else {
            return decision;
        };
        let (key, value) = ESCALATE_ANNOTATION;
        let all_escalate = determining
            .iter()
            .all(|id| policies.annotation(&PolicyId::new(id), key) == Some(value));
        if !all_escalate {
            return decision;
        }
        let mut approved = req.clone();
        if let Some(approval) = approved.action.approval_mut() {
            *approval = Some(String::new());
        }
        if self.decide_once(&approved, policies).is_allow() {
            Decision::Escalate {
                policies: determining.clone(),
            }
        } else {
            decision
        }
    }

    fn decide_once(&self, req: &AccessRequest, policies: &PolicySet) -> Decision {
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

        // The context is built from typed fields, so it matches the schema by construction;
        // re-validating it per request would cost more than evaluating a small policy set.
        // Only the attributes some policy reads are built (`context_use.rs`).
        // The schema test below keeps the two in step. Tool arguments are the exception:
        // they come from the agent, so they are converted against the tool's record type,
        // and a mismatch is an error (a deny).
        let reads = |key: &str| self.context_use().reads(key);
        let mut pairs = req
            .context_pairs_reading(reads)
            .map_err(|e| format!("context: {e}"))?;
        let (action, resource, key) = self.subject(req, &mut pairs, &reads)?;
        // Even an empty record is evaluated by Cedar's restricted evaluator (~1% of the
        // proxy's CPU flat out); a set that reads no context needs none.
        let context = if pairs.is_empty() {
            Context::empty()
        } else {
            Context::from_pairs(pairs).map_err(|e| format!("context: {e}"))?
        };
        let request = Request::new(principal, action, resource, context, None)
            .map_err(|e| format!("request: {e}"))?;
        let key = EntityKey {
            agent: req.agent.clone(),
            tenant: req.tenant.clone(),
            resource: key,
        };
        let entities = self
            .entity_cache()
            .get_or_build(key, || self.entities(req))?;

        let response = self
            .authorizer()
            .is_authorized(&request, policies, &entities);
        let diagnostics = response.diagnostics();
        // Cedar reports errors and reasons in policy-set order; the index evaluates sub-sets
        // in another order, so pick the error and order the ids by policy id: the same
        // request gives the same decision, indexed or not.
        if let Some(error) = diagnostics.errors().map(ToString::to_string).min() {
            return Err(error);
        }
        let mut policies: Vec<String> = diagnostics.reason().map(|id| id.to_string()).collect();
        policies.sort_unstable();
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

    /// The action and resource of `req`, and the key its entities are cached by; a tool
    /// call's arguments and a trigger's payload, typed, go into `pairs` where a policy reads
    /// them.
    fn subject(
        &self,
        req: &AccessRequest,
        pairs: &mut Vec<(String, RestrictedExpression)>,
        reads: &dyn Fn(&str) -> bool,
    ) -> Result<(EntityUid, EntityUid, Resource), String> {
        let names = self.names();
        let uid = |ty: &EntityTypeName, id: &str| {
            EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
        };
        Ok(match &req.action {
            Action::Tool {
                name, args, undo, ..
            } => {
                let model = names
                    .tool(name, *undo)
                    .ok_or_else(|| unknown_tool(name, *undo))?;
                // Converted whether or not a policy reads them: arguments that do not fit
                // the tool's type are a deny either way.
                let args = model.args.value(args, "args")?;
                if reads("args") {
                    pairs.push(("args".into(), args));
                }
                // Keyed by the action (an undo's entities hold its own action).
                (
                    model.action_uid.clone(),
                    model.resource.uid(),
                    Resource::Tool(req.action.id().into_owned()),
                )
            }
            Action::Spawn { child } => (
                names.spawn.clone(),
                uid(&names.agent, child),
                Resource::Agent(child.clone()),
            ),
            Action::Trigger {
                name,
                kind,
                payload,
                ..
            } => {
                // The payload passed the trigger's JSON Schema before it got here; converted
                // with the trigger's own record, a payload that still does not fit (the
                // engine was loaded with another definition of the trigger) is a deny. A
                // trigger the engine was not loaded with has an empty payload.
                let payload = match names.triggers.get(name) {
                    Some(model) => model.payload.value(payload, "payload")?,
                    None => RecordType::default().value(&serde_json::json!({}), "payload")?,
                };
                if reads("payload") {
                    pairs.push(("payload".into(), payload));
                }
                (
                    names.trigger.clone(),
                    uid(&names.trigger_type, name),
                    Resource::Trigger {
                        name: name.clone(),
                        kind: kind.clone(),
                    },
                )
            }
            Action::Http { .. } | Action::Connect { .. } | Action::Mcp { .. } => {
                let action = names
                    .action(&req.action)
                    .cloned()
                    .ok_or_else(|| format!("unknown action {}", req.action.id()))?;
                (
                    action,
                    uid(&names.host, &req.host),
                    Resource::Host(req.host.clone()),
                )
            }
        })
    }

    /// The entities of `req`: the agent in its tenant and the resource, never anything that
    /// varies between requests with the same agent, tenant and resource (they are cached
    /// by those, `entities.rs`).
    fn entities(&self, req: &AccessRequest) -> Result<Entities, String> {
        let names = self.names();
        let uid = |ty: &EntityTypeName, id: &str| {
            EntityUid::from_type_name_and_id(ty.clone(), EntityId::new(id))
        };
        let principal = uid(&names.agent, &req.agent);
        let tenant = uid(&names.tenant, &req.tenant);
        // The index (index.rs) proves scopes false from exactly this hierarchy — the agent
        // in its tenant, a tool action in its tier group, parentless resources: keep the two
        // in step.
        let name = |id: &str| {
            [(
                "name".to_owned(),
                RestrictedExpression::new_string(id.to_owned()),
            )]
            .into_iter()
            .collect()
        };
        let mut entities = vec![
            Entity::new(
                principal,
                name(&req.agent),
                [tenant.clone()].into_iter().collect(),
            )
            .map_err(|e| format!("agent entity: {e}"))?,
            Entity::new_no_attrs(tenant, Default::default()),
        ];
        match &req.action {
            Action::Tool { name, undo, .. } => {
                let model = names
                    .tool(name, *undo)
                    .ok_or_else(|| unknown_tool(name, *undo))?;
                // The action and its tier group go in with the request, so that
                // `action in Action::"tier:..."` sees the hierarchy.
                entities.extend([
                    model.action.clone(),
                    model.group.clone(),
                    model.resource.clone(),
                ]);
            }
            // The child's agent comes without parents, like every resource (the index relies
            // on it): it stays in its parent's tenant, which policies see in the principal.
            // The same name as the principal is never asked (it needs no permit), but must
            // not become a second entity with that uid either.
            Action::Spawn { child } if *child != req.agent => entities.push(
                Entity::new(uid(&names.agent, child), name(child), Default::default())
                    .map_err(|e| format!("agent entity: {e}"))?,
            ),
            Action::Spawn { .. } => {}
            Action::Trigger { name, kind, .. } => {
                let attrs = [
                    (
                        "name".to_owned(),
                        RestrictedExpression::new_string(name.clone()),
                    ),
                    (
                        "kind".to_owned(),
                        RestrictedExpression::new_string(kind.clone()),
                    ),
                ];
                entities.push(
                    Entity::new(
                        uid(&names.trigger_type, name),
                        attrs.into_iter().collect(),
                        Default::default(),
                    )
                    .map_err(|e| format!("trigger entity: {e}"))?,
                );
            }
            Action::Http { .. } | Action::Connect { .. } | Action::Mcp { .. } => entities.push(
                Entity::new(
                    uid(&names.host, &req.host),
                    name(&req.host),
                    Default::default(),
                )
                .map_err(|e| format!("host entity: {e}"))?,
            ),
        }
        // Built here from observed facts, so they are well-formed by construction; validating
        // them against the schema on every request costs more than the evaluation itself.
        Entities::from_entities(entities, None).map_err(|e| format!("entities: {e}"))
    }
}

/// Why a tool call's action is not in the set: the tool is not catalogued, or declares no
/// undo.
fn unknown_tool(name: &str, undo: bool) -> String {
    if undo {
        format!("tool {name:?} declares no undo")
    } else {
        format!("tool {name:?} is not in the catalog")
    }
}

#[cfg(test)]
mod tests {
    use cedar_policy::{Context, EntityUid, Request};

    use crate::load::{PolicyEngine, PolicySource};
    use crate::request::{AccessRequest, Action, SessionState};

    fn request(action: Action) -> AccessRequest {
        AccessRequest {
            agent: "a".into(),
            tenant: "t".into(),
            host: "h".into(),
            session: SessionState {
                calls: 3,
                cost_micros: 4,
                depth: 1,
                parent_agent: "root".into(),
                profile: "strict".into(),
                // Labels and recent counts are in every action's context: built and typed
                // as the schema's `Session` says.
                labels: ["private_data".to_owned(), "untrusted_input".to_owned()].into(),
                recent: crate::request::Recent {
                    tool_10m: 1,
                    tool_1h: 2,
                    tier_10m: 3,
                    tier_1h: 4,
                },
            },
            action,
        }
    }

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
            Action::Mcp {
                method: "resources/read".into(),
                server: "https://h/mcp".into(),
            },
            Action::Spawn {
                child: "deployer".into(),
            },
        ];
        for action in actions {
            let req = request(action);
            let uid: EntityUid = req.action.uid_text().parse().unwrap();
            let context = Context::from_pairs(req.context_pairs().unwrap()).unwrap();
            let principal: EntityUid = "Ostiary::Agent::\"a\"".parse().unwrap();
            let resource: EntityUid = req.resource().parse().unwrap();
            Request::new(principal, uid, resource, context, Some(engine.schema()))
                .unwrap_or_else(|e| panic!("{:?}: {e}", req.action));
            // And the engine decides it (the permit-all policy), through the index.
            assert!(engine.decide(&req).is_allow(), "{:?}", req.action);
        }
    }

    /// The same for a tool call: the typed parts and the args record converted against the
    /// tool's type must both be what the generated schema declares.
    #[test]
    fn built_tool_contexts_match_the_generated_schema() {
        let catalog = crate::catalog::Catalog::parse(
            "tools.toml",
            r#"
            [[tool]]
            name = "gh.create"
            tier = "write"
            match = { host = "api.github.com", method = "POST", path = "/repos/{owner}/issues" }
            args_schema = { type = "object", required = ["title"], properties = { title = { type = "string" }, n = { type = ["integer", "null"] }, tags = { type = "array", items = { type = "object", properties = { k = { type = "boolean" } } } } } }
            "#,
            None,
        )
        .unwrap();
        let engine = PolicyEngine::with_catalog(&[], catalog).unwrap();
        let action = Action::Tool {
            name: "gh.create".into(),
            args: serde_json::json!({"owner": "o", "title": "t", "n": null, "tags": [{"k": true}]}),
            impact_records: 1,
            cost_micros: 2,
            approval: Some("alice".into()),
            undo: false,
        };
        let model = &engine.names().tools["gh.create"];
        let Action::Tool { args, .. } = &action else {
            unreachable!()
        };
        let mut pairs = request(action.clone()).context_pairs().unwrap();
        pairs.push(("args".into(), model.args.value(args, "args").unwrap()));
        let context = Context::from_pairs(pairs).unwrap();
        let principal: EntityUid = "Ostiary::Agent::\"a\"".parse().unwrap();
        let resource: EntityUid = "Ostiary::Tool::\"gh.create\"".parse().unwrap();
        Request::new(
            principal,
            model.action_uid.clone(),
            resource,
            context,
            Some(engine.schema()),
        )
        .unwrap();
    }
}
