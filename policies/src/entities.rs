//! The entities of a decision, kept per policy engine: the agent in its tenant and the
//! resource (a host, a tool with its action and tier group, a child agent) are the same for
//! every request that names them, and building them — Cedar computes the hierarchy's
//! transitive closure each time — cost more than evaluating a small policy set
//! (docs/benchmarks.md). Nothing per request goes in here: the session's counters and the
//! request's arguments live in the context.
//!
//! Bounded: past [`CAPACITY`] distinct (agent, tenant, resource) triples the map starts
//! again empty, so an agent cycling through host names costs rebuilds, never memory.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cedar_policy::Entities;

/// Distinct entity sets kept before the cache starts over.
pub(crate) const CAPACITY: usize = 4_096;

/// What a request's entities are built from: nothing else may vary between requests that
/// share a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EntityKey {
    pub agent: String,
    pub tenant: String,
    pub resource: Resource,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Resource {
    Host(String),
    Tool(String),
    Agent(String),
    /// A trigger's entity carries its kind, which a reload may change under the same name.
    Trigger {
        name: String,
        kind: String,
    },
}

#[derive(Debug, Default)]
pub(crate) struct EntityCache {
    sets: RwLock<HashMap<EntityKey, Arc<Entities>>>,
}

impl EntityCache {
    /// The entities for `key`, built by `build` on a miss (an error is not kept).
    pub fn get_or_build(
        &self,
        key: EntityKey,
        build: impl FnOnce() -> Result<Entities, String>,
    ) -> Result<Arc<Entities>, String> {
        if let Some(found) = self.sets.read().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(found);
        }
        let built = Arc::new(build()?);
        // A poisoned lock only costs the caching, never the decision.
        if let Ok(mut sets) = self.sets.write() {
            if sets.len() >= CAPACITY {
                sets.clear();
            }
            sets.insert(key, built.clone());
        }
        Ok(built)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.sets.read().map_or(0, |m| m.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(host: &str) -> EntityKey {
        EntityKey {
            agent: "a".into(),
            tenant: "t".into(),
            resource: Resource::Host(host.into()),
        }
    }

    #[test]
    fn builds_once_per_key_and_stays_bounded() {
        let cache = EntityCache::default();
        let mut built = 0;
        for _ in 0..3 {
            cache
                .get_or_build(key("h"), || {
                    built += 1;
                    Ok(Entities::empty())
                })
                .unwrap();
        }
        assert_eq!(built, 1, "a hit does not rebuild");
        for i in 0..CAPACITY + 10 {
            cache
                .get_or_build(key(&format!("h{i}")), || Ok(Entities::empty()))
                .unwrap();
        }
        assert!(cache.len() <= CAPACITY, "bounded: {}", cache.len());
        assert!(cache.get_or_build(key("x"), || Err("no".into())).is_err());
        assert!(
            cache
                .get_or_build(key("x"), || Ok(Entities::empty()))
                .is_ok(),
            "a failed build is not kept"
        );
    }
}
