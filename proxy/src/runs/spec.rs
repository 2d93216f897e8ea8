//! What a run runs: fixed from its trigger when the run is made and stored with it, so that a
//! trigger edited or removed later changes no run already queued, held or retried.

use serde::{Deserialize, Serialize};

use crate::config::triggers::Trigger;

/// The command, the session it runs in, and what happens when it fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub argv: Vec<String>,
    pub agent: String,
    #[serde(default)]
    pub tenant: Option<String>,
    /// A sandbox profile, or `none`.
    pub profile: String,
    #[serde(default)]
    pub max_calls: Option<u64>,
    #[serde(default)]
    pub max_cost: Option<f64>,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    #[serde(default)]
    pub wall_clock_secs: Option<u64>,
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    pub backoff_ms: u64,
    /// A child run's parent session: its session is that one's child (depth, fan-out and
    /// budget carved as for any child session; no credential inherited).
    #[serde(default)]
    pub parent_session: Option<String>,
    /// The parent session's agent (`context.session.parent_agent` of the decision on the
    /// run); `None` for a root run.
    #[serde(default)]
    pub parent_agent: Option<String>,
    /// The depth the run's session will have (0 for a root run).
    #[serde(default)]
    pub depth: u32,
}

impl RunSpec {
    pub fn of(trigger: &Trigger) -> Self {
        Self {
            argv: trigger.argv(),
            agent: trigger.agent.clone(),
            tenant: trigger.tenant.clone(),
            profile: trigger.profile.clone(),
            max_calls: trigger.max_calls,
            max_cost: trigger.max_cost,
            ttl_secs: trigger.ttl.map(|d| d.as_secs().max(1)),
            wall_clock_secs: trigger.wall_clock.map(|d| d.as_secs().max(1)),
            attempts: trigger.retry.attempts,
            backoff_ms: u64::try_from(trigger.retry.backoff.as_millis()).unwrap_or(u64::MAX),
            parent_session: None,
            parent_agent: None,
            depth: 0,
        }
    }

    /// The wait before attempt `next` (2, 3, …): the backoff, doubling after each retry,
    /// at most an hour.
    pub fn backoff_before(&self, next: i64) -> std::time::Duration {
        let doublings = u32::try_from(next.saturating_sub(2).clamp(0, 20)).unwrap_or(20);
        let ms = self.backoff_ms.saturating_mul(1u64 << doublings);
        std::time::Duration::from_millis(ms.min(3_600_000))
    }

    /// Whether the profile is a sandbox (`none` is not).
    pub fn sandboxed(&self) -> bool {
        self.profile != "none"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_and_is_capped() {
        let spec = RunSpec {
            argv: vec!["true".into()],
            agent: "a".into(),
            tenant: None,
            profile: "none".into(),
            max_calls: None,
            max_cost: None,
            ttl_secs: None,
            wall_clock_secs: None,
            attempts: 5,
            backoff_ms: 1000,
            parent_session: None,
            parent_agent: Some("planner".into()),
            depth: 1,
        };
        let waits: Vec<u64> = (2..=5)
            .map(|n| spec.backoff_before(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, [1000, 2000, 4000, 8000]);
        assert_eq!(spec.backoff_before(80).as_secs(), 3600);
        assert!(!spec.sandboxed());
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<RunSpec>(&text).unwrap(), spec);
    }
}
