//! Ostiary's policy layer: the Cedar schema, the policy set loaded from a directory, and the
//! decision every request gets.
//!
//! # Layout
//! - [`catalog`] — the tool catalog (`tools.toml`): names, tiers, routes, argument schemas.
//! - [`labels`] — the catalog's session labels (`labels` on tools, `[[host]]` entries).
//! - [`schema`] — the schema of docs/design.md §4: a fixed core (`Agent`, `Tenant`, `Host`,
//!   `Tool`, `Trigger`; `http`, `connect`, `mcp`, `spawn`, `trigger`, the tier groups; `context.session`) plus one
//!   action per tool, generated from the catalog.
//! - [`recorded`] — a decision as the audit trail keeps it, to be decided again (replay,
//!   shadow sets).
//! - [`triggers`] — `Action::"trigger"`: the `Trigger` resource and the payload type the
//!   config's triggers share.
//! - [`args`] — JSON Schema → Cedar type of `context.args`, and arguments → Cedar values.
//! - [`load`] — reading `*.cedar` files and the catalog, naming policies by their `@id`,
//!   strict validation.
//! - [`request`] — what the proxy observed, in the terms policies are written in.
//! - [`decide`] — evaluation; fail closed (an evaluation error is a deny); escalation.
//!   `context_use` — the context attributes a set can read: a decision builds only those.
//!   `memo` — decisions kept by what their requests put into them, for questions asked again.
//! - `index` — the policy index: a decision evaluates only the policies whose scope can
//!   match the request (sound slicing by principal, action and resource, and by the leading
//!   conditions of `when` clauses, `conditions`).
//! - [`testing`] — data-driven policy tests (`<policy dir>/tests/*.toml`, `ostiary policy test`).
//! - [`version`] — a set's content-addressed id, recorded with every decision.
//! - [`explain`] — a decision with its determining policies and what would change it
//!   (`ostiary policy explain`).
//!
//! The proxy depends on this crate, never the reverse: the types here describe requests in
//! Cedar's vocabulary and know nothing of HTTP plumbing.
#![forbid(unsafe_code)]

pub mod args;
pub mod catalog;
mod conditions;
mod context_use;
pub mod decide;
mod entities;
pub mod explain;
mod index;
pub mod labels;
pub mod load;
mod memo;
pub mod recorded;
pub mod request;
pub mod schema;
pub mod testing;
pub mod triggers;
pub mod undo;
pub mod version;

pub use catalog::{Catalog, CatalogError, ImpactError, Tier, Tool, ToolMatch, ToolProblem};
pub use decide::{Decision, DenyReason};
pub use explain::{Change, Explanation, PolicyRef};
pub use load::{LoadError, PolicyEngine, PolicySource};
pub use request::{AccessRequest, Action, Recent, SessionState};
pub use testing::{run_dir, TestError, TestReport};
pub use triggers::{TriggerDef, Triggers};
pub use version::PolicyVersion;

/// The policies of the library shipped with Ostiary, embedded so that `ostiary serve` works
/// from any directory with no config at all. The files on disk under `policies/library/` are
/// the same. Only `*.cedar` files belong here: the library's `tests/*.toml` are test cases, not
/// policies, and its catalog is [`EMBEDDED_CATALOG`]. [`PolicyEngine::embedded`] loads both.
pub const EMBEDDED_LIBRARY: &[(&str, &str)] = &[
    ("egress.cedar", include_str!("../library/egress.cedar")),
    ("tiers.cedar", include_str!("../library/tiers.cedar")),
    ("triggers.cedar", include_str!("../library/triggers.cedar")),
];

/// The library's tool catalog (`policies/library/tools.toml`): `tiers.cedar` is written
/// against its tools, so the embedded policies are only valid together with it.
pub const EMBEDDED_CATALOG: &str = include_str!("../library/tools.toml");
