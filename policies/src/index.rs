//! A policy index: each decision evaluates only the policies whose scope can match the
//! request, so its cost follows the policies that concern the request, not the size of the set.
//!
//! # Slicing
//! Built once per policy set, at load. Every policy's scope is reduced to three constraints:
//! - **principal**: `== X` matches the request's agent only if `X` is `Agent::"<agent>"`;
//!   `in X` matches if `X` is the agent or its tenant; `is`/`is .. in`: unconstrained.
//! - **action**: `== X` matches if `X` is the request's action; `in [X, ..]` if the list
//!   names the action or a group it is in — for a tool, its tier group `Action::"tier:<tier>"`
//!   (from the catalog); `http` and `connect` are in no group.
//! - **resource**: `== X` or `in X` matches if `X` is the request's `Host`/`Tool` uid;
//!   `is`/`is .. in`: unconstrained.
//!
//! - **conditions** (a fourth dimension, from the body): the leading chain of simple tests of
//!   a policy's first `when` (`conditions.rs`: `==`, `!=`, `contains`, `like` and `has` on
//!   the scope variables, `principal.name`/`resource.name` and context attributes, tool
//!   arguments included). A policy is hashed under the first of them it can be looked up by
//!   (an equality, a set of literals, a `like` with no wildcard or only trailing ones), and
//!   every candidate's chain is walked against the request. The shapes security teams write —
//!   `when { context.path == "/pN" }`, `like "/pN/*"`, `resource == Tool::"t"`,
//!   `context.args.repo == "r"` — then cost what a host-scoped permit does.
//!
//! Per dimension, the index maps each uid a scope names (or literal a condition asks for) to
//! the policies naming it, and keeps a list of the policies unconstrained in that dimension. A
//! request looks its keys up in the dimension with the fewest candidates, filters those by the
//! other constraints and their chains, and
//! evaluates the resulting sub-set with the same [`cedar_policy::Authorizer`]. Sub-sets are
//! built on first use and cached by their member list (bounded; many requests share one,
//! e.g. every host that no policy names).
//!
//! # Why it is sound
//! Cedar evaluates a policy as `principal-scope && action-scope && resource-scope && body`,
//! short-circuiting: a policy whose scope is false for a request is not satisfied and cannot
//! error, so it can neither determine the decision nor change it. The index leaves a policy
//! out only when one of its scope constraints is provably false, and that proof rests on the
//! entity hierarchy of a request, which is not open-ended: [`crate::decide`] builds the
//! request's entities itself — the agent with its tenant as only parent, the tenant, the tool
//! action with its tier group as only parent, the group, and the resource without parents —
//! so `in` reaches exactly the uids listed above. Anything else (`is`, future constraint
//! kinds) is kept. Conditions are sound for the same reason: the body is evaluated after the
//! scope, its conditions in order, `&&` left to right and short-circuiting, so a chain
//! conjunct that is false after conjuncts that were true makes the body false before anything
//! could error; where the request does not present a value, the policy is kept
//! (`conditions.rs` has the details). A set holding template-linked policies is not sliced at
//! all (they cannot be copied into a sub-set), so every request then evaluates the full set.
//!
//! The escalation re-check (the same request with `approval.granted`) changes only
//! `context.approval`, which conditions never read, so it evaluates the same sub-set.
//! `tests/index_differential.rs` compares indexed and full-set decisions over generated policy
//! sets, and each dimension's lookup on its own.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use cedar_policy::{
    ActionConstraint, EntityUid, Policy, PolicySet, PrincipalConstraint, ResourceConstraint,
};

use crate::args::RecordType;
use crate::conditions::{Chain, HashKey, Known, Literal, Operand, Var};
use crate::request::{AccessRequest, Action};

/// Cached sub-sets at most; past this the cache starts over (a workload touching this many
/// distinct slices is rare, and rebuilding a slice only costs the adds).
const CACHE_LIMIT: usize = 1024;

/// What a request presents to the index: the uids its scope constraints see (see the
/// module doc) and, through [`Self::known`], the values its leading conditions may test.
#[derive(Debug)]
pub(crate) struct ScopeKeys<'a> {
    /// `Agent::"<agent>"`.
    pub agent: EntityUid,
    /// `Tenant::"<tenant>"`, the agent's only parent.
    pub tenant: EntityUid,
    /// The action uid.
    pub action: EntityUid,
    /// The groups the action is in (its tier group for a tool).
    pub groups: Vec<EntityUid>,
    /// `Host::"<host>"` or `Tool::"<name>"`, parentless.
    pub resource: EntityUid,
    /// The request, for the context values a condition tests.
    pub request: &'a AccessRequest,
    /// The type of `context.args` for a tool call: only what it declares is read.
    pub args: Option<&'a RecordType>,
}

impl ScopeKeys<'_> {
    /// The value the request presents for `operand`, if it is sure to present one (see
    /// `conditions.rs`; never `context.approval`).
    pub(crate) fn known(&self, operand: &Operand) -> Option<Known<'_>> {
        match operand {
            Operand::Var(Var::Principal) => Some(Known::Entity(&self.agent)),
            Operand::Var(Var::Action) => Some(Known::Entity(&self.action)),
            Operand::Var(Var::Resource) => Some(Known::Entity(&self.resource)),
            Operand::Name(Var::Principal) => Some(Known::Str(&self.request.agent)),
            Operand::Name(_) => match &self.request.action {
                Action::Http { .. } | Action::Connect { .. } | Action::Mcp { .. } => {
                    Some(Known::Str(&self.request.host))
                }
                Action::Spawn { child } => Some(Known::Str(child)),
                Action::Trigger { name, .. } => Some(Known::Str(name)),
                // A tool has no `name` attribute: reading one errors.
                Action::Tool { .. } => None,
            },
            Operand::Context(path) => self.request.known(path, self.args),
        }
    }
}

/// One scope constraint reduced to what the index can decide.
#[derive(Debug)]
enum Constraint {
    /// Admits anything, or the index cannot tell.
    Any,
    /// Matches only if the request's own uid (agent, action, resource) is this one.
    Eq(EntityUid),
    /// Matches if the request's uid or one of its ancestors is one of these.
    In(Vec<EntityUid>),
}

impl Constraint {
    fn principal(c: PrincipalConstraint) -> Self {
        match c {
            PrincipalConstraint::Eq(uid) => Self::Eq(uid),
            PrincipalConstraint::In(uid) => Self::In(vec![uid]),
            PrincipalConstraint::Any
            | PrincipalConstraint::Is(_)
            | PrincipalConstraint::IsIn(_, _) => Self::Any,
        }
    }

    fn action(c: ActionConstraint) -> Self {
        match c {
            ActionConstraint::Eq(uid) => Self::Eq(uid),
            ActionConstraint::In(list) => Self::In(list),
            ActionConstraint::Any => Self::Any,
        }
    }

    fn resource(c: ResourceConstraint) -> Self {
        match c {
            // A resource has no parents (see the module doc): `in X` is `== X`.
            ResourceConstraint::Eq(uid) | ResourceConstraint::In(uid) => Self::Eq(uid),
            ResourceConstraint::Any
            | ResourceConstraint::Is(_)
            | ResourceConstraint::IsIn(_, _) => Self::Any,
        }
    }

    /// Whether a request whose uid is `own`, with ancestors `ancestors`, can satisfy this.
    fn admits(&self, own: &EntityUid, ancestors: &[EntityUid]) -> bool {
        match self {
            Self::Any => true,
            Self::Eq(uid) => uid == own,
            Self::In(list) => list.iter().any(|uid| uid == own || ancestors.contains(uid)),
        }
    }
}

/// One dimension of the index.
#[derive(Debug, Default)]
struct Dimension {
    /// Policies unconstrained in this dimension.
    any: Vec<u32>,
    /// Policies whose constraint is `== uid`, by uid.
    eq: HashMap<EntityUid, Vec<u32>>,
    /// Policies whose constraint is `in uid` (or a list naming it), by uid.
    within: HashMap<EntityUid, Vec<u32>>,
}

impl Dimension {
    fn add(&mut self, position: u32, constraint: &Constraint) {
        match constraint {
            Constraint::Any => self.any.push(position),
            Constraint::Eq(uid) => self.eq.entry(uid.clone()).or_default().push(position),
            Constraint::In(list) => {
                for uid in list {
                    self.within.entry(uid.clone()).or_default().push(position);
                }
            }
        }
    }

    /// The candidate lists for a request: the unconstrained ones, those naming its own uid
    /// with `==` or `in`, and those naming an ancestor with `in`.
    fn lookup<'a>(&'a self, own: &EntityUid, ancestors: &[EntityUid]) -> Vec<&'a [u32]> {
        let mut lists = vec![self.any.as_slice()];
        lists.extend(self.eq.get(own).map(Vec::as_slice));
        lists.extend(
            std::iter::once(own)
                .chain(ancestors)
                .filter_map(|uid| self.within.get(uid).map(Vec::as_slice)),
        );
        lists
    }
}

/// The conditions dimension: policies by the conjunct their chain is hashed under
/// (`conditions::Chain::hash`), per operand, and those without one.
#[derive(Debug, Default)]
struct Conditions {
    any: Vec<u32>,
    /// Few operands in practice (`context.path`, `resource`, an argument or two).
    by_operand: Vec<(Operand, Hashed)>,
}

/// The policies hashed under one operand, by the literal their conjunct asks for.
#[derive(Debug, Default)]
struct Hashed {
    strs: HashMap<String, Vec<u32>>,
    longs: HashMap<i64, Vec<u32>>,
    bools: [Vec<u32>; 2],
    entities: HashMap<EntityUid, Vec<u32>>,
    /// `like "<prefix>*"`, by prefix.
    prefixes: HashMap<String, Vec<u32>>,
    /// Every policy hashed on a `like`: kept for a value that is not a string (`like`
    /// errors on it).
    likes: Vec<u32>,
    /// Every policy hashed here: kept for a request that does not present the operand.
    all: Vec<u32>,
}

impl Hashed {
    fn add(&mut self, position: u32, key: HashKey<'_>) {
        match key {
            HashKey::Literals(literals) => {
                for literal in literals {
                    match literal {
                        Literal::Str(s) => self.strs.entry(s.clone()).or_default(),
                        Literal::Long(n) => self.longs.entry(*n).or_default(),
                        Literal::Bool(b) => &mut self.bools[usize::from(*b)],
                        Literal::Entity(uid) => self.entities.entry(uid.clone()).or_default(),
                    }
                    .push(position);
                }
            }
            HashKey::LikeExact(text) => {
                self.strs.entry(text.to_owned()).or_default().push(position);
                self.likes.push(position);
            }
            HashKey::LikePrefix(prefix) => {
                self.prefixes
                    .entry(prefix.to_owned())
                    .or_default()
                    .push(position);
                self.likes.push(position);
            }
        }
        self.all.push(position);
    }

    /// The lists to keep for a request presenting `value`.
    fn lookup<'a>(&'a self, value: Option<Known<'_>>, lists: &mut Vec<&'a [u32]>) {
        let Some(value) = value else {
            lists.push(&self.all);
            return;
        };
        let found = match value {
            Known::Str(s) => {
                self.prefixes_of(s, lists);
                self.strs.get(s)
            }
            Known::Long(n) => self.longs.get(&n),
            Known::Bool(b) => Some(&self.bools[usize::from(b)]),
            Known::Entity(uid) => self.entities.get(uid),
            Known::Other => None,
        };
        lists.extend(found.map(Vec::as_slice));
        if !matches!(value, Known::Str(_)) {
            lists.push(&self.likes);
        }
    }

    /// The prefix lists whose prefix `s` starts with: by scanning the prefixes when there are
    /// fewer of them than `s` has characters, else by probing each prefix of `s`.
    fn prefixes_of<'a>(&'a self, s: &str, lists: &mut Vec<&'a [u32]>) {
        if self.prefixes.is_empty() {
            return;
        }
        if self.prefixes.len() <= s.len() {
            lists.extend(
                self.prefixes
                    .iter()
                    .filter(|(prefix, _)| s.starts_with(prefix.as_str()))
                    .map(|(_, positions)| positions.as_slice()),
            );
        } else {
            let ends = s.char_indices().skip(1).map(|(i, _)| i).chain([s.len()]);
            lists.extend(ends.filter_map(|end| self.prefixes.get(&s[..end]).map(Vec::as_slice)));
        }
    }
}

impl Conditions {
    fn add(&mut self, position: u32, chain: &Chain) {
        let Some((operand, key)) = chain.hash() else {
            self.any.push(position);
            return;
        };
        let slot = match self.by_operand.iter().position(|(o, _)| o == operand) {
            Some(slot) => slot,
            None => {
                self.by_operand.push((operand.clone(), Hashed::default()));
                self.by_operand.len() - 1
            }
        };
        self.by_operand[slot].1.add(position, key);
    }

    fn lookup<'a>(&'a self, keys: &ScopeKeys<'_>) -> Vec<&'a [u32]> {
        let mut lists = vec![self.any.as_slice()];
        for (operand, hashed) in &self.by_operand {
            hashed.lookup(keys.known(operand), &mut lists);
        }
        lists
    }
}

/// The scope of one policy, per dimension.
#[derive(Debug)]
struct Scope {
    principal: Constraint,
    action: Constraint,
    resource: Constraint,
    chain: Chain,
}

impl Scope {
    fn admits(&self, keys: &ScopeKeys<'_>) -> bool {
        self.principal
            .admits(&keys.agent, std::slice::from_ref(&keys.tenant))
            && self.action.admits(&keys.action, &keys.groups)
            && self.resource.admits(&keys.resource, &[])
            && self.chain.admits(|operand| keys.known(operand))
    }
}

/// The index of one policy set (see the module doc).
pub(crate) struct PolicyIndex {
    /// `None` when the set holds template-linked policies: every request evaluates all.
    slices: Option<Slices>,
}

struct Slices {
    policies: Vec<Policy>,
    scopes: Vec<Scope>,
    principal: Dimension,
    action: Dimension,
    resource: Dimension,
    conditions: Conditions,
    /// Sub-sets by their (sorted) member positions.
    cache: RwLock<HashMap<Vec<u32>, Arc<PolicySet>>>,
}

impl fmt::Debug for PolicyIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.slices {
            None => f.write_str("PolicyIndex(unsliced)"),
            Some(slices) => f
                .debug_struct("PolicyIndex")
                .field("policies", &slices.policies.len())
                .field(
                    "cached_slices",
                    &slices
                        .cache
                        .read()
                        .unwrap_or_else(PoisonError::into_inner)
                        .len(),
                )
                .finish(),
        }
    }
}

impl PolicyIndex {
    /// Index a validated policy set.
    pub(crate) fn new(set: &PolicySet) -> Self {
        if set.policies().any(|p| !p.is_static()) {
            return Self { slices: None };
        }
        let mut slices = Slices {
            policies: Vec::with_capacity(set.num_of_policies()),
            scopes: Vec::with_capacity(set.num_of_policies()),
            principal: Dimension::default(),
            action: Dimension::default(),
            resource: Dimension::default(),
            conditions: Conditions::default(),
            cache: RwLock::new(HashMap::new()),
        };
        for (position, policy) in (0u32..).zip(set.policies()) {
            let scope = Scope {
                principal: Constraint::principal(policy.principal_constraint()),
                action: Constraint::action(policy.action_constraint()),
                resource: Constraint::resource(policy.resource_constraint()),
                chain: Chain::of(policy),
            };
            slices.principal.add(position, &scope.principal);
            slices.action.add(position, &scope.action);
            slices.resource.add(position, &scope.resource);
            slices.conditions.add(position, &scope.chain);
            slices.scopes.push(scope);
            slices.policies.push(policy.clone());
        }
        Self {
            slices: Some(slices),
        }
    }

    /// The sub-set to evaluate for a request with these keys; `None` means the full set
    /// (the index is off, or every policy may match).
    ///
    /// `walk` names the dimension to walk (0 principal, 1 action, 2 resource, 3
    /// conditions) instead of the smallest: the differential test checks each dimension's
    /// lookup on its own, which the smallest-first choice would otherwise rarely exercise.
    pub(crate) fn slice(
        &self,
        keys: &ScopeKeys<'_>,
        walk: Option<usize>,
    ) -> Option<Arc<PolicySet>> {
        let slices = self.slices.as_ref()?;
        let members = slices.members(keys, walk);
        if members.len() == slices.policies.len() {
            return None;
        }
        if let Some(set) = slices
            .cache
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(members.as_slice())
        {
            return Some(Arc::clone(set));
        }
        let mut set = PolicySet::new();
        for &position in &members {
            // Static policies with ids unique in the source set: adding cannot fail. Should it
            // ever, the full set is the safe answer.
            if set.add(slices.policies[position as usize].clone()).is_err() {
                return None;
            }
        }
        let set = Arc::new(set);
        let mut cache = slices.cache.write().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(members, Arc::clone(&set));
        Some(set)
    }
}

impl Slices {
    /// Positions of the policies whose scope may match, sorted and unique.
    fn members(&self, keys: &ScopeKeys<'_>, walk: Option<usize>) -> Vec<u32> {
        let candidates = [
            self.principal
                .lookup(&keys.agent, std::slice::from_ref(&keys.tenant)),
            self.action.lookup(&keys.action, &keys.groups),
            self.resource.lookup(&keys.resource, &[]),
            self.conditions.lookup(keys),
        ];
        // Walk the dimension with the fewest candidates and check the others per policy.
        let size = |lists: &Vec<&[u32]>| lists.iter().map(|l| l.len()).sum::<usize>();
        let smallest = match walk {
            Some(dimension) => candidates.get(dimension),
            None => candidates.iter().min_by_key(|lists| size(lists)),
        }
        .map(Vec::as_slice)
        .unwrap_or_default();
        let mut members: Vec<u32> = smallest
            .iter()
            .flat_map(|list| list.iter().copied())
            .filter(|&position| self.scopes[position as usize].admits(keys))
            .collect();
        members.sort_unstable();
        members.dedup();
        members
    }
}

#[cfg(test)]
mod tests {
    use crate::{AccessRequest, Action, PolicyEngine, PolicySource};

    fn engine(text: String) -> PolicyEngine {
        PolicyEngine::from_sources(&[PolicySource {
            name: "t.cedar".into(),
            text,
        }])
        .expect("policies validate")
    }

    fn http(path: &str, method: &str) -> AccessRequest {
        AccessRequest {
            agent: "a".into(),
            tenant: "default".into(),
            host: "api.example.com".into(),
            session: Default::default(),
            action: Action::Http {
                method: method.into(),
                scheme: "https".into(),
                port: 443,
                path: path.into(),
                query: String::new(),
            },
        }
    }

    /// How many policies the index would evaluate for `req` (all of them: `None`).
    fn sliced(engine: &PolicyEngine, req: &AccessRequest) -> Option<usize> {
        let keys = engine.names().scope_keys(req)?;
        engine
            .index()
            .slice(&keys, None)
            .map(|set| set.policies().count())
    }

    #[test]
    fn per_path_permits_are_sliced_to_the_one_naming_the_path() {
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str(&format!(
                "@id(\"p{i}\") permit (principal, action == Ostiary::Action::\"http\", resource) when {{ context.path == \"/p{i}\" && context.port == 443 }};\n"
            ));
        }
        // Around them: a chain led by another test (`late`, hashed on its port, walked to
        // its path), `||` and `unless` (no chain: always kept), other attributes.
        text.push_str("@id(\"late\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.port == 443 && context.path == \"/late\" };\n");
        text.push_str("@id(\"either\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.path == \"/a\" || context.path == \"/b\" };\n");
        text.push_str("@id(\"not\") forbid (principal, action == Ostiary::Action::\"http\", resource) unless { context.path == \"/ok\" };\n");
        text.push_str("@id(\"query\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.query == \"x\" };\n");
        text.push_str("@id(\"verb\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { \"DELETE\" == context.method };\n");
        // `like "/p7*"` is hashed on its prefix; `like "*x"` and `like "/a*b"` are not
        // hashed, but walked.
        text.push_str("@id(\"under\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"/p7*\" };\n");
        text.push_str("@id(\"suffix\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"*x\" };\n");
        text.push_str("@id(\"middle\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"/a*b\" };\n");
        let engine = engine(text);
        // GET /p7: p7, `under`, and `either`, `not` (no chain); `late` fails on its path
        // after its port, `query` and `verb` on theirs, `suffix` and `middle` on their
        // patterns (walked, though not hashed).
        assert_eq!(sliced(&engine, &http("/p7", "GET")), Some(4));
        assert_eq!(sliced(&engine, &http("/p7", "DELETE")), Some(5));
        // `/p70/x` is no policy's exact path, is under `/p7` and ends in `x`.
        assert_eq!(sliced(&engine, &http("/p70/x", "GET")), Some(4));
        assert_eq!(sliced(&engine, &http("/nowhere", "GET")), Some(2));
        // And the decisions are the full set's.
        for (path, method) in [
            ("/p7", "GET"),
            ("/p7", "DELETE"),
            ("/p7/x", "GET"),
            ("/late", "GET"),
            ("/a", "GET"),
            ("/ab", "GET"),
            ("/ok", "GET"),
            ("/p70/x", "DELETE"),
            ("/late", "GET"),
        ] {
            let req = http(path, method);
            assert_eq!(
                format!("{:?}", engine.decide(&req)),
                format!("{:?}", engine.decide_unindexed(&req)),
                "{path} {method}"
            );
        }
    }

    fn tool_engine(text: String) -> PolicyEngine {
        let catalog = crate::Catalog::parse(
            "tools.toml",
            r#"
[[tool]]
name = "repo.read"
tier = "read"
match = { mcp = "https://mcp.example/mcp", tool = "read" }
args_schema = { type = "object", required = ["repo"], properties = { repo = { type = "string" }, n = { type = "integer" }, opts = { type = "object", properties = { mode = { type = "string" } } } } }

[[tool]]
name = "repo.write"
tier = "write"
match = { mcp = "https://mcp.example/mcp", tool = "write" }
"#,
            None,
        )
        .expect("catalog parses");
        PolicyEngine::with_catalog(
            &[PolicySource {
                name: "t.cedar".into(),
                text,
            }],
            catalog,
        )
        .expect("policies validate")
    }

    fn tool(name: &str, args: serde_json::Value) -> AccessRequest {
        AccessRequest {
            action: Action::Tool {
                name: name.into(),
                args,
                impact_records: 0,
                cost_micros: 0,
                approval: None,
                undo: false,
            },
            ..http("/", "GET")
        }
    }

    #[test]
    fn per_argument_and_per_tool_permits_are_sliced() {
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str(&format!(
                "@id(\"r{i}\") permit (principal, action == Ostiary::Action::\"tool:repo.read\", resource) when {{ context.args.repo == \"r{i}\" }};\n"
            ));
        }
        text.push_str("@id(\"n7\") permit (principal, action == Ostiary::Action::\"tool:repo.read\", resource) when { resource == Ostiary::Tool::\"repo.read\" && context.args has n && context.args.n == 7 };\n");
        text.push_str("@id(\"mode\") forbid (principal, action == Ostiary::Action::\"tool:repo.read\", resource) when { context.args has opts && context.args.opts has mode && [\"x\", \"y\"].contains(context.args.opts.mode) };\n");
        text.push_str("@id(\"writer\") permit (principal, action, resource) when { resource == Ostiary::Tool::\"repo.write\" };\n");
        let engine = tool_engine(text);
        let read = |args| tool("repo.read", args);
        use serde_json::json;
        // r5 only; `n7` and `mode` are kept while their attributes are absent.
        assert_eq!(sliced(&engine, &read(json!({"repo": "r5"}))), Some(3));
        assert_eq!(
            sliced(&engine, &read(json!({"repo": "r5", "n": 6}))),
            Some(2)
        );
        assert_eq!(
            sliced(&engine, &read(json!({"repo": "r5", "n": 7}))),
            Some(3)
        );
        let mode = |m: &str| read(json!({"repo": "nope", "opts": {"mode": m}}));
        assert_eq!(sliced(&engine, &mode("z")), Some(1));
        assert_eq!(sliced(&engine, &mode("y")), Some(2));
        // Another tool: only `writer` names it.
        let write = tool("repo.write", json!({}));
        assert_eq!(sliced(&engine, &write), Some(1));
        for req in [
            read(json!({"repo": "r5"})),
            read(json!({"repo": "r5", "n": 7})),
            read(json!({"repo": "r5", "n": 7.0})),
            read(json!({"repo": 5})),
            read(json!({"repo": "nope", "opts": {"mode": "y"}})),
            read(json!({"repo": "nope", "opts": {}})),
            write,
        ] {
            assert_eq!(
                format!("{:?}", engine.decide(&req)),
                format!("{:?}", engine.decide_unindexed(&req)),
                "{req:?}"
            );
        }
    }
}
