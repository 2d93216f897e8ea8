//! A map from session id to per-session state, split into shards so that requests of
//! different sessions on different cores do not all take (and bounce between caches) one
//! process-wide lock: every request of every session reads these maps.

use std::hash::BuildHasher;
use std::sync::RwLock;

use crate::ids::{IdHasher, IdMap};

const SHARDS: usize = 32;

#[derive(Debug)]
pub struct Sharded<V> {
    shards: Vec<RwLock<IdMap<String, V>>>,
    hasher: IdHasher,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(IdMap::default())).collect(),
            hasher: IdHasher::default(),
        }
    }
}

impl<V: Clone> Sharded<V> {
    fn shard(&self, key: &str) -> &RwLock<IdMap<String, V>> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    pub fn get(&self, key: &str) -> Option<V> {
        self.shard(key)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    pub fn insert(&self, key: &str, value: V) {
        self.shard(key)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), value);
    }

    /// The value of `key`, made by `make` if there is none (one of racing callers makes it).
    pub fn get_or_insert_with(&self, key: &str, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.get(key) {
            return v;
        }
        self.shard(key)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_owned())
            .or_insert_with(make)
            .clone()
    }

    pub fn remove(&self, key: &str) -> Option<V> {
        self.shard(key)
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    /// Every entry (a copy; the shards are read one at a time).
    pub fn entries(&self) -> Vec<(String, V)> {
        self.shards
            .iter()
            .flat_map(|s| {
                s.read()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}
