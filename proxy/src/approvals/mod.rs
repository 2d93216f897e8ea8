//! The approval queue (docs/design.md §5, §10): requests that policy escalates wait here for a
//! human, then run exactly once.
//!
//! - [`model`] — what an approval is and its state machine.
//! - [`store`] — the durable queue in SQLite: every transition is one guarded `UPDATE`, so
//!   two workers can never both claim an approval, and a crash loses nothing.
//! - [`link`] — signed, single-use, approver-bound links to the review page.
//! - [`page`] — the review page (`GET /approve/<token>`) and its form.
//! - [`slack_callback`] — verifying and reading Slack's interactive callbacks.
//! - [`notify`] — telling approvers (Slack webhook, email), retried until delivered.
//! - [`queue`] — hold, decide, wait: the bookkeeping every transition owes.
//! - [`execute`] — running an approved request exactly once.
//! - [`sweep`] — deadlines, reminders, executions and deliveries on a clock; recovery.
//!
//! The pipeline's side (holding an escalated request, the agent collecting the outcome)
//! is the `escalate` phase, [`crate::escalate`]; the approvers' side is in
//! [`crate::control`] (API, review page, Slack callbacks).

pub mod execute;
pub mod link;
pub mod model;
pub mod notify;
pub mod page;
pub mod queue;
pub mod slack_callback;
/// The queue's store: the approvals aggregate of `ostiary-store`.
pub use ostiary_store::approvals as store;
pub mod sweep;

pub use execute::{Approved, Executor, Runner};
pub use model::{Approval, Channel, HeldRequest, Observed, Status, StoredResponse, Verdict};
pub use queue::ApprovalQueue;
