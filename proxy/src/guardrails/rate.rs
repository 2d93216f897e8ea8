//! Rate limits per agent and per tenant, per tier (`[tiers.*] rate_agent`, `rate_tenant`):
//! GCRA, the generic cell rate algorithm — one timestamp per key (the theoretical arrival
//! time), no background refill, exact `Retry-After`.
//!
//! A request is admitted when `now ≥ tat − (burst − 1) × interval`; admitting it moves the
//! key's `tat` one interval on. A refused request does not move it, so an agent hammering a
//! closed limit does not push its own reopening further away. Keys are sharded so that one
//! agent saturating its limit does not contend with others on one lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Rate;

const SHARDS: usize = 16;

/// Keys idle for longer than this (past their `tat`) are forgotten at the next sweep.
const IDLE: Duration = Duration::from_secs(3600);

/// What is limited: `agent` or `tenant`, its name, and the tier.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub scope: &'static str,
    pub name: String,
    pub tier: &'static str,
}

/// The GCRA state of every key.
#[derive(Debug)]
pub struct RateLimiter {
    shards: Vec<Mutex<HashMap<Key, Instant>>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl RateLimiter {
    fn shard(&self, key: &Key) -> &Mutex<HashMap<Key, Instant>> {
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    /// Admit one request of `key` at `now` under `rate`, or say how long until one would be.
    pub fn admit(&self, key: Key, rate: &Rate, now: Instant) -> Result<(), Duration> {
        let interval = rate.interval();
        let tolerance = interval * rate.burst.saturating_sub(1);
        let mut shard = self.shard(&key).lock().unwrap_or_else(|e| e.into_inner());
        let tat = shard.get(&key).copied().unwrap_or(now).max(now);
        let allowed_at = tat.checked_sub(tolerance).unwrap_or(now);
        if now < allowed_at {
            return Err(allowed_at - now);
        }
        shard.insert(key, tat + interval);
        Ok(())
    }

    /// Forget keys that have been idle long enough to be back at a full burst anyway.
    pub fn sweep(&self, now: Instant) {
        for shard in &self.shards {
            shard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|_, tat| now.saturating_duration_since(*tat) < IDLE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        Key {
            scope: "agent",
            name: name.into(),
            tier: "read",
        }
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let limiter = RateLimiter::default();
        let rate = Rate {
            count: 10,
            period: Duration::from_secs(1),
            burst: 3,
        };
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.admit(key("a"), &rate, t0).unwrap();
        }
        let wait = limiter.admit(key("a"), &rate, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        // Refusals do not push the reopening further away.
        assert_eq!(limiter.admit(key("a"), &rate, t0).unwrap_err(), wait);
        limiter
            .admit(key("a"), &rate, t0 + Duration::from_millis(100))
            .unwrap();
        assert!(limiter
            .admit(key("a"), &rate, t0 + Duration::from_millis(150))
            .is_err());
        // Another key is untouched.
        limiter.admit(key("b"), &rate, t0).unwrap();
        // Over a long run the rate holds: 10 per second.
        let admitted = (0..1000)
            .filter(|i| {
                limiter
                    .admit(key("c"), &rate, t0 + Duration::from_millis(i * 10))
                    .is_ok()
            })
            .count();
        assert!((100..=103).contains(&admitted), "{admitted}");
    }

    #[test]
    fn idle_keys_are_swept() {
        let limiter = RateLimiter::default();
        let rate = Rate {
            count: 1,
            period: Duration::from_secs(1),
            burst: 1,
        };
        let t0 = Instant::now();
        limiter.admit(key("a"), &rate, t0).unwrap();
        limiter.sweep(t0 + IDLE + Duration::from_secs(2));
        let total: usize = limiter.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(total, 0);
    }
}
