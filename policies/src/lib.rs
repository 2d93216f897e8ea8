//! Ostiary's policy layer: the Cedar schema, the policy set loaded from a directory, and the
//! decision every request gets.
//!
//! # Layout
//! - [`schema`] — the fixed core schema of DESIGN §4 (`Agent`, `Tenant`, `Host`,
//!   `Action::"http"`, `Action::"connect"`), in Cedar's human syntax.
//! - [`load`] — reading `*.cedar` files, naming policies by their `@id`, strict validation.
//! - [`request`] — what the proxy observed, in the terms policies are written in.
//! - [`decide`] — evaluation; fail closed (an evaluation error is a deny).
//!
//! The proxy depends on this crate, never the reverse: the types here describe requests in
//! Cedar's vocabulary and know nothing of HTTP plumbing.
#![forbid(unsafe_code)]

pub mod decide;
pub mod load;
pub mod request;
pub mod schema;

pub use decide::{Decision, DenyReason};
pub use load::{LoadError, PolicyEngine, PolicySource};
pub use request::{AccessRequest, Action};

/// The library shipped with Ostiary, embedded so that `ostiary serve` works from any
/// directory with no config at all. The files on disk under `policies/library/` are the same.
pub const EMBEDDED_LIBRARY: &[(&str, &str)] =
    &[("egress.cedar", include_str!("../library/egress.cedar"))];
