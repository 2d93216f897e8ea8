//! `[sessions]`: lifetimes, spawn bounds, the hard limits every session gets unless its
//! creator names its own (the cap on requests held for approval among them), what reaching
//! one does, teardown's grace, and the loop watchdog's settings.

use std::time::Duration;

use serde::Deserialize;

use super::duration;

/// Session defaults and bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    /// Lifetime of a session (and its token) when the creator names none.
    #[serde(deserialize_with = "duration")]
    pub default_ttl: Duration,
    /// Longest lifetime a session may be given.
    #[serde(deserialize_with = "duration")]
    pub max_ttl: Duration,
    /// Agent-to-agent spawn depth: a session created by an operator has depth 0, its
    /// children 1, and so on up to this.
    pub max_depth: u32,
    /// Live children per session.
    pub max_children: u32,
    /// Tool calls a session may make when its creator names no `max_calls` (0: no limit).
    pub max_calls: u64,
    /// Cost (catalog `cost` units) a session may spend when its creator names no
    /// `max_cost` (0: no limit).
    pub max_cost: f64,
    /// Request bytes a session may send upstream (0: no limit).
    pub max_bytes_sent: u64,
    /// Response bytes a session may receive (0: no limit).
    pub max_bytes_received: u64,
    /// Requests a session may have held for approval at once (pending), when its creator
    /// names no `max_pending_approvals`; one more is refused `429 limit_exceeded` with
    /// `limit: "approvals"`. A child's holds count against its ancestors' caps too. `0`: no
    /// request may be held at all (there is no "unlimited": every hold costs an approver's
    /// attention and up to `approvals.max_body_bytes` of storage).
    pub max_pending_approvals: u32,
    /// Limits that put the request before a human instead of answering `429`: `calls`,
    /// `cost`. An approver's yes runs the request and grants the session as much again.
    pub escalate_limits: Vec<String>,
    /// How long teardown lets requests in flight finish before it cancels them.
    #[serde(deserialize_with = "duration")]
    pub grace: Duration,
    /// How long the outcome of a request sent with an `Idempotency-Key` is kept.
    #[serde(deserialize_with = "duration")]
    pub idempotency_ttl: Duration,
    /// Largest response body kept for an `Idempotency-Key` replay; a longer one is not
    /// stored and a retry answers `409` rather than running twice.
    pub idempotency_max_bytes: usize,
    pub watchdog: Watchdog,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            default_ttl: Duration::from_secs(3600),
            max_ttl: Duration::from_secs(24 * 3600),
            max_depth: 3,
            max_children: 16,
            max_calls: 0,
            max_cost: 0.0,
            max_bytes_sent: 0,
            max_bytes_received: 0,
            max_pending_approvals: 5,
            escalate_limits: Vec::new(),
            grace: Duration::from_secs(5),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            idempotency_max_bytes: 1024 * 1024,
            watchdog: Watchdog::default(),
        }
    }
}

/// The limits `escalate_limits` may name.
pub const LIMIT_NAMES: &[&str] = &["calls", "cost"];

/// The largest `max_pending_approvals` a config or a session may name: each pending hold
/// may store `approvals.max_body_bytes` and asks a human for attention, so "practically
/// unlimited" is not a setting.
pub const PENDING_APPROVALS_CEILING: u32 = 1000;

impl Sessions {
    /// Checks of `[sessions]` that serde cannot express.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.max_pending_approvals > PENDING_APPROVALS_CEILING {
            return Err(format!(
                "sessions.max_pending_approvals = {} exceeds {PENDING_APPROVALS_CEILING}",
                self.max_pending_approvals
            ));
        }
        Ok(())
    }
}

/// `[sessions.watchdog]`: when a session looks like it is looping, it is paused for a
/// human. The identical-call rule is per tier (`[tiers.*] repeat_max`, `repeat_window`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Watchdog {
    pub enabled: bool,
    /// A cycle of two or three distinct calls (A→B→A→B…) repeated this many times.
    pub cycle_repeats: u32,
    /// Denied requests within `denial_window`.
    pub denials: u32,
    #[serde(deserialize_with = "duration")]
    pub denial_window: Duration,
    /// Calls that establish which tiers a session normally uses…
    pub baseline_calls: u32,
    /// …and attempts above them within `tier_jump_window` that trip the watchdog.
    pub tier_jumps: u32,
    #[serde(deserialize_with = "duration")]
    pub tier_jump_window: Duration,
    /// Requests held for approval (or refused because the session's holds reached
    /// `max_pending_approvals`) within `hold_window`: a session that keeps asking for a
    /// human is as suspicious as one that keeps being refused.
    pub holds: u32,
    #[serde(deserialize_with = "duration")]
    pub hold_window: Duration,
    /// Audit records of the session kept in the dead-letter snapshot.
    pub snapshot_records: u32,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self {
            enabled: true,
            cycle_repeats: 10,
            denials: 10,
            denial_window: Duration::from_secs(60),
            baseline_calls: 20,
            tier_jumps: 3,
            tier_jump_window: Duration::from_secs(60),
            holds: 10,
            hold_window: Duration::from_secs(60),
            snapshot_records: 50,
        }
    }
}
