//! Runs started by triggers (`[[trigger]]`, docs/runs.md): a signed webhook, a schedule or
//! an API call starts a sandboxed agent run, bounded and audited from its first moment to its
//! teardown.
//!
//! - [`assemble`] — the runs' parts, made at start from the config.
//! - [`signature`] — webhook signature schemes (GitHub, Stripe, Slack, generic HMAC),
//!   checked in constant time.
//! - [`webhook`] — a trigger's signature scheme from its config, the payload as JSON, the
//!   deduplication key.
//! - [`spec`] — what a run runs, fixed when the run is made.
//! - [`intake`] — a delivery or an API call admitted in order (size, signature, payload,
//!   schema, then deduplication and the trigger's rate, counted in the store with the run)
//!   and stored as a queued run, or refused and audited.
//! - [`refusal`] — why a delivery or a call started nothing.
//! - [`reload`] — triggers reloaded with the policies (`SIGHUP`, `POST /v1/policy/reload`).
//! - [`runner`] — queued runs claimed and run: a session, `ostiary run`, the outcome,
//!   retries and dead letters; `attempt` — one attempt's parts (its end classified, its
//!   dead letter, its directory).
//! - [`schedule`] — cron expressions in a time zone, and the ticks that start runs.
//! - [`checkpoint`] — a run's checkpoint at the proxy's reserved name `ostiary.internal`.
//! - [`authorize`] — the Cedar decision on `Action::"trigger"` before a run is made, and
//!   again when a human approves it.
//! - [`gate`] — runs held for a human before they start (`approval = true`, or a policy's
//!   `@escalate`).
//! - [`internal`] — what a run's agent asks of the proxy itself at `ostiary.internal`:
//!   its checkpoint, child runs.

pub mod assemble;
mod attempt;
pub mod authorize;
pub mod checkpoint;
pub mod gate;
pub mod intake;
pub mod internal;
pub mod refusal;
pub mod reload;
pub mod runner;
pub mod schedule;
pub mod signature;
pub mod spec;
pub mod webhook;
