//! The audit trail: one record for every decision, written from a guard so that allow,
//! deny, error and cancellation (the agent hung up, the task was dropped) all leave a trace.
//! It fails closed: while records cannot be written, nothing is forwarded.
//!
//! - [`record`] — what a record holds; names policies and lease ids, never secrets.
//! - [`sink`] — the request path's handle: queue a record, flush, and the writability check.
//! - [`writer`] — a dedicated thread appending records to SQLite in batches, sealing each one
//!   into an HMAC chain, retrying (never dropping) what it could not write.
//! - [`rows`] — records as the trail's rows: serialised, numbered, linked and sealed.
//! - [`health`] — whether records can be written: the request path's check, `/readyz`, and
//!   the `ostiary_audit_*` metrics.
//! - [`chain`] — seals, the sealed head checkpoint, and the start-up check that refuses a
//!   chain that no longer matches it.
//! - [`verify`] — recomputing the chain (`ostiary audit verify`) and queries.
//! - [`attest`] — Ed25519-signed checkpoints of the chain, checkable without the audit key.
//! - [`ocsf`] — records as OCSF events (`ostiary audit query --format ocsf`).
//! - [`export`] — `ostiary audit export` and its offline check (`audit verify --offline`).
//! - [`stream`] — the trail streamed to a SIEM (`[audit.siem]`), from a durable cursor.
//! - [`anchor`] — `ostiary audit reanchor`, the operator's acknowledged way past a mismatch.

pub mod anchor;
pub mod attest;
pub mod chain;
pub mod export;
pub mod health;
pub mod ocsf;
pub mod record;
mod rows;
mod signing;
mod sink;
pub mod stream;
pub mod verify;
pub mod writer;

pub use chain::ChainError;
pub use health::{Limits, Status};
pub use record::{AuditGuard, AuditRecord, Phase};
pub use sink::AuditSink;
pub use writer::AuditWriter;
