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
//! - **a leading literal** (a fourth dimension, from the body): a policy whose first condition
//!   is a `when` whose leftmost conjunct is `context.path == "<literal>"` or
//!   `context.method == "<literal>"` (either side), or `context.path like "<prefix>*"` (a
//!   pattern whose only wildcards end it), matches a request whose context holds that
//!   attribute only if it is that literal, or starts with that prefix. The shape security teams write for per-path
//!   permits (`when { context.path == "/pN" }`) then costs what a host-scoped one does.
//!
//! Per dimension, the index maps each uid a scope names to the policies naming it, and keeps a
//! list of the policies unconstrained in that dimension. A request looks its keys up in the
//! dimension with the fewest candidates, filters those by the other two constraints, and
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
//! kinds) is kept. A leading literal is sound for the same reason: the body is evaluated after
//! the scope, its conditions in order, `&&` left to right and short-circuiting, so when the
//! leftmost conjunct of the first `when` compares a string attribute the request's context
//! always holds (`path` and `method` of an `http` request, `method` of an `mcp` one) with a
//! different literal, the body is false before anything in it could error. A request whose
//! context lacks the attribute keeps the policy (evaluating it errors, as it does unsliced). A set holding template-linked policies is not sliced at all (they cannot
//! be copied into a sub-set), so every request then evaluates the full set.
//!
//! The escalation re-check (the same request with `approval.granted`) changes only the
//! context, never the scope, so it evaluates the same sub-set. `tests/index_differential.rs`
//! compares indexed and full-set decisions over generated policy sets.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use cedar_policy::{
    ActionConstraint, EntityUid, Policy, PolicySet, PrincipalConstraint, ResourceConstraint,
};

/// Cached sub-sets at most; past this the cache starts over (a workload touching this many
/// distinct slices is rare, and rebuilding a slice only costs the adds).
const CACHE_LIMIT: usize = 1024;

/// The uids a request presents to each scope constraint (see the module doc).
#[derive(Debug)]
pub(crate) struct ScopeKeys {
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
    /// The context's string attributes a leading literal may name ([`LITERAL_ATTRS`]), when
    /// the request's context holds them.
    pub literals: [Option<String>; 2],
}

/// The context attributes a leading literal is read from, in [`ScopeKeys::literals`] order.
pub(crate) const LITERAL_ATTRS: [&str; 2] = ["path", "method"];

/// What a leading literal asks of the attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Literal {
    /// `== "<value>"` (or a `like` pattern without a wildcard).
    Exact(String),
    /// `like "<prefix>*"`, the prefix not empty.
    Prefix(String),
}

impl Literal {
    fn admits(&self, value: &str) -> bool {
        match self {
            Self::Exact(literal) => value == literal,
            // `like` matches characters; a prefix of characters is a prefix of the UTF-8 bytes.
            Self::Prefix(prefix) => value.starts_with(prefix.as_str()),
        }
    }
}

/// A `like` pattern (EST: literals and `"Wildcard"`) as a [`Literal`], when it is a plain
/// string or a non-empty prefix followed by wildcards only.
fn pattern(elements: &[serde_json::Value]) -> Option<Literal> {
    let mut prefix = String::new();
    let mut rest = elements.iter();
    for element in rest.by_ref() {
        if element.as_str() == Some("Wildcard") {
            // Everything after the first wildcard must be wildcards too.
            let only_wildcards = rest.all(|e| e.as_str() == Some("Wildcard"));
            return (only_wildcards && !prefix.is_empty()).then_some(Literal::Prefix(prefix));
        }
        prefix.push_str(element.get("Literal")?.as_str()?);
    }
    Some(Literal::Exact(prefix))
}

/// The leading literal of `policy` (see the module doc): the attribute's position in
/// [`LITERAL_ATTRS`] and what it must be, if its first condition has one.
fn leading_literal(policy: &Policy) -> Option<(usize, Literal)> {
    let json = policy.to_json().ok()?;
    let first = json.get("conditions")?.as_array()?.first()?;
    if first.get("kind")?.as_str()? != "when" {
        return None;
    }
    let mut expr = first.get("body")?;
    while let Some(and) = expr.get("&&") {
        expr = and.get("left")?;
    }
    let attr = |e: &serde_json::Value| -> Option<usize> {
        let dot = e.get(".")?;
        if dot.get("left")?.get("Var")?.as_str()? != "context" {
            return None;
        }
        let name = dot.get("attr")?.as_str()?;
        LITERAL_ATTRS.iter().position(|a| *a == name)
    };
    if let Some(like) = expr.get("like") {
        let elements = like.get("pattern")?.as_array()?;
        return attr(like.get("left")?).zip(pattern(elements));
    }
    let eq = expr.get("==")?;
    let (left, right) = (eq.get("left")?, eq.get("right")?);
    let literal = |e: &serde_json::Value| {
        e.get("Value")?
            .as_str()
            .map(|v| Literal::Exact(v.to_owned()))
    };
    attr(left)
        .zip(literal(right))
        .or_else(|| attr(right).zip(literal(left)))
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

/// The leading-literal dimension: policies without one, and those with one by attribute
/// and literal (exact values hashed; prefixes, fewer in practice, scanned).
#[derive(Debug, Default)]
struct Literals {
    any: Vec<u32>,
    by_value: [HashMap<String, Vec<u32>>; 2],
    by_prefix: [HashMap<String, Vec<u32>>; 2],
    /// Every policy with a literal on the attribute, for requests that lack it.
    all: [Vec<u32>; 2],
}

impl Literals {
    fn add(&mut self, position: u32, literal: Option<&(usize, Literal)>) {
        match literal {
            None => self.any.push(position),
            Some((attr, literal)) => {
                let (map, key) = match literal {
                    Literal::Exact(value) => (&mut self.by_value[*attr], value),
                    Literal::Prefix(prefix) => (&mut self.by_prefix[*attr], prefix),
                };
                map.entry(key.clone()).or_default().push(position);
                self.all[*attr].push(position);
            }
        }
    }

    fn lookup<'a>(&'a self, keys: &ScopeKeys) -> Vec<&'a [u32]> {
        let mut lists = vec![self.any.as_slice()];
        for (attr, value) in keys.literals.iter().enumerate() {
            match value {
                Some(value) => {
                    lists.extend(self.by_value[attr].get(value).map(Vec::as_slice));
                    lists.extend(
                        self.by_prefix[attr]
                            .iter()
                            .filter(|(prefix, _)| value.starts_with(prefix.as_str()))
                            .map(|(_, positions)| positions.as_slice()),
                    );
                }
                None => lists.push(self.all[attr].as_slice()),
            }
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
    literal: Option<(usize, Literal)>,
}

impl Scope {
    fn admits(&self, keys: &ScopeKeys) -> bool {
        self.principal
            .admits(&keys.agent, std::slice::from_ref(&keys.tenant))
            && self.action.admits(&keys.action, &keys.groups)
            && self.resource.admits(&keys.resource, &[])
            && self.literal.as_ref().is_none_or(|(attr, literal)| {
                keys.literals[*attr]
                    .as_ref()
                    .is_none_or(|value| literal.admits(value))
            })
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
    literals: Literals,
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
            literals: Literals::default(),
            cache: RwLock::new(HashMap::new()),
        };
        for (position, policy) in (0u32..).zip(set.policies()) {
            let scope = Scope {
                principal: Constraint::principal(policy.principal_constraint()),
                action: Constraint::action(policy.action_constraint()),
                resource: Constraint::resource(policy.resource_constraint()),
                literal: leading_literal(policy),
            };
            slices.principal.add(position, &scope.principal);
            slices.action.add(position, &scope.action);
            slices.resource.add(position, &scope.resource);
            slices.literals.add(position, scope.literal.as_ref());
            slices.scopes.push(scope);
            slices.policies.push(policy.clone());
        }
        Self {
            slices: Some(slices),
        }
    }

    /// The sub-set to evaluate for a request with these keys; `None` means the full set
    /// (the index is off, or every policy may match).
    pub(crate) fn slice(&self, keys: &ScopeKeys) -> Option<Arc<PolicySet>> {
        let slices = self.slices.as_ref()?;
        let members = slices.members(keys);
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
    fn members(&self, keys: &ScopeKeys) -> Vec<u32> {
        let candidates = [
            self.principal
                .lookup(&keys.agent, std::slice::from_ref(&keys.tenant)),
            self.action.lookup(&keys.action, &keys.groups),
            self.resource.lookup(&keys.resource, &[]),
            self.literals.lookup(keys),
        ];
        // Walk the dimension with the fewest candidates and check the others per policy.
        let size = |lists: &Vec<&[u32]>| lists.iter().map(|l| l.len()).sum::<usize>();
        let smallest = candidates
            .iter()
            .min_by_key(|lists| size(lists))
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
            .slice(&keys)
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
        // Shapes that must not be sliced on: a literal after another conjunct, under `||`,
        // in an `unless`, on an attribute the index does not know.
        text.push_str("@id(\"late\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.port == 443 && context.path == \"/late\" };\n");
        text.push_str("@id(\"either\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.path == \"/a\" || context.path == \"/b\" };\n");
        text.push_str("@id(\"not\") forbid (principal, action == Ostiary::Action::\"http\", resource) unless { context.path == \"/ok\" };\n");
        text.push_str("@id(\"query\") permit (principal, action == Ostiary::Action::\"http\", resource) when { context.query == \"x\" };\n");
        text.push_str("@id(\"verb\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { \"DELETE\" == context.method };\n");
        // Prefixes: `like "/p7*"` is one; `like "*x"` and `like "/a*b"` are not.
        text.push_str("@id(\"under\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"/p7*\" };\n");
        text.push_str("@id(\"suffix\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"*x\" };\n");
        text.push_str("@id(\"middle\") forbid (principal, action == Ostiary::Action::\"http\", resource) when { context.path like \"/a*b\" };\n");
        let engine = engine(text);
        // p7, `under`, and the six kept shapes; `verb` only for a DELETE.
        assert_eq!(sliced(&engine, &http("/p7", "GET")), Some(8));
        assert_eq!(sliced(&engine, &http("/p7", "DELETE")), Some(9));
        // `/p70/x` is no policy's exact path, and under `/p7`.
        assert_eq!(sliced(&engine, &http("/p70/x", "GET")), Some(7));
        assert_eq!(sliced(&engine, &http("/nowhere", "GET")), Some(6));
        // And the decisions are the full set's.
        for (path, method) in [
            ("/p7", "GET"),
            ("/p7", "DELETE"),
            ("/p7/x", "GET"),
            ("/late", "GET"),
            ("/a", "GET"),
            ("/ab", "GET"),
            ("/ok", "GET"),
        ] {
            let req = http(path, method);
            assert_eq!(
                format!("{:?}", engine.decide(&req)),
                format!("{:?}", engine.decide_unindexed(&req)),
                "{path} {method}"
            );
        }
    }
}
