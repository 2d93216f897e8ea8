//! Sessions: who an agent is while it runs, and the token that proves it.
//!
//! - [`token`] — signing and verifying session tokens (Ed25519 JWTs, strict validation,
//!   a cache of verified tokens so a request does not pay a signature check).
//! - [`registry`] — live sessions (memory, backed by SQLite): creation, lookup, teardown.
//! - [`watchdog`] — the loop watchdog: when a session repeats itself, it is paused.
//! - [`spawn`] — which agent a child session runs as (its parent's, or one policy permits).
//! - [`limits`] — the bounds every number a session asks for must keep.
//! - [`memory`] — what policies remember of a session: its labels and recent tool calls.

pub mod limits;
pub mod memory;
pub mod registry;
pub mod spawn;
pub mod token;
pub mod watchdog;

pub use registry::{NewSession, Principal, SessionError, SessionRegistry};
pub use token::{TokenError, TokenKeys};
