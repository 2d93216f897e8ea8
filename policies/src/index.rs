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
//! kinds) is kept. A set holding template-linked policies is not sliced at all (they cannot
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

/// The scope of one policy, per dimension.
#[derive(Debug)]
struct Scope {
    principal: Constraint,
    action: Constraint,
    resource: Constraint,
}

impl Scope {
    fn admits(&self, keys: &ScopeKeys) -> bool {
        self.principal
            .admits(&keys.agent, std::slice::from_ref(&keys.tenant))
            && self.action.admits(&keys.action, &keys.groups)
            && self.resource.admits(&keys.resource, &[])
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
            cache: RwLock::new(HashMap::new()),
        };
        for (position, policy) in (0u32..).zip(set.policies()) {
            let scope = Scope {
                principal: Constraint::principal(policy.principal_constraint()),
                action: Constraint::action(policy.action_constraint()),
                resource: Constraint::resource(policy.resource_constraint()),
            };
            slices.principal.add(position, &scope.principal);
            slices.action.add(position, &scope.action);
            slices.resource.add(position, &scope.resource);
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
