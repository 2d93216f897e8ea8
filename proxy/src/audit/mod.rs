//! The audit trail: one record for every decision, written from a guard so that allow,
//! deny, error and cancellation (the agent hung up, the task was dropped) all leave a trace.
//!
//! - [`record`] — what a record holds; names policies and lease ids, never secrets.
//! - [`writer`] — a dedicated thread appending records to SQLite, sealing each one into an
//!   HMAC chain.
//! - [`verify`] — recomputing the chain (`ostiary audit verify`) and queries.

pub mod record;
pub mod verify;
pub mod writer;

pub use record::{AuditGuard, AuditRecord};
pub use writer::{AuditSink, AuditWriter};
