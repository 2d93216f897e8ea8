//! Each trigger's rate limit (`rate = "10/m"`): a token bucket per trigger, full at start,
//! refilled continuously, so a burst of `count` is allowed and then one run every
//! `per / count`. Counted in this process: replicas each allow the rate (docs/runs.md).
//!
//! Taken after a delivery is authenticated, so forged deliveries cannot spend a trigger's
//! rate; given back when the delivery turns out to be a duplicate, which starts nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::triggers::Rate;

#[derive(Debug, Default)]
pub struct TriggerRates {
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl TriggerRates {
    /// Take one run of `trigger`'s `rate` at `now`; `Err(wait)` when none is left, with how
    /// long until one is.
    pub fn take(&self, trigger: &str, rate: Rate, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let capacity = f64::from(rate.count);
        let per_token = rate.per.as_secs_f64() / capacity;
        let bucket = buckets.entry(trigger.to_owned()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed / per_token).min(capacity);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) * per_token))
        }
    }

    /// Give back a run taken for a delivery that started nothing.
    pub fn give_back(&self, trigger: &str, rate: Rate) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bucket) = buckets.get_mut(trigger) {
            bucket.tokens = (bucket.tokens + 1.0).min(f64::from(rate.count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval_and_triggers_apart() {
        let rates = TriggerRates::default();
        let rate = Rate {
            count: 3,
            per: Duration::from_secs(60),
        };
        let t0 = Instant::now();
        for _ in 0..3 {
            rates.take("a", rate, t0).unwrap();
        }
        let wait = rates.take("a", rate, t0).unwrap_err();
        assert!((19..=20).contains(&wait.as_secs()), "{wait:?}");
        rates.take("b", rate, t0).unwrap();
        assert!(rates.take("a", rate, t0 + Duration::from_secs(19)).is_err());
        rates.take("a", rate, t0 + Duration::from_secs(21)).unwrap();
        rates.give_back("a", rate);
        rates.take("a", rate, t0 + Duration::from_secs(21)).unwrap();
        assert!(rates.take("a", rate, t0 + Duration::from_secs(21)).is_err());
    }
}
