//! Ostiary's credential broker: where secrets come from, how long they live, and how they
//! die.
//!
//! The proxy asks the broker for the credential of a binding on behalf of a session; the
//! broker answers from its cache (keyed by session and binding, never beyond the lease) or
//! mints one from its source (the file backend or Vault/OpenBao), remembers the lease
//! against the session, and revokes every lease at teardown or expiry.
//!
//! The one rule of this crate: a secret value is never printed. [`Secret`]'s `Debug` and
//! `Display` print `***`, and errors name credentials and leases, never values.
//!
//! # Layout
//! - [`binding`] — a `[[credential]]` binding: which secret, sent to which hosts, injected how.
//! - [`source`] — where a credential comes from: a binding's `source = {...}`.
//! - [`credential`] — what a source hands back: the material, its lease, its expiry.
//! - `broker` — [`Broker`]: the per-session cache and the ledger of leases to revoke.
//! - `file` — [`FileSource`]: `name = "value"` pairs in a file only Ostiary reads.
//! - [`vault`] — Vault/OpenBao: login and renewal, KV v2, transit JWTs, PKI, database leases.
//! - `secret` — [`Secret`]: a value that may be used but never printed.
//! - `error` — [`BrokerError`]: why a credential could not be produced or revoked.
#![forbid(unsafe_code)]

pub mod binding;
mod broker;
pub mod credential;
mod error;
mod file;
mod secret;
pub mod source;
pub mod vault;

pub use binding::{Binding, BindingError, Injection, PLACEHOLDER_PREFIX};
pub use broker::{Broker, Held, LeaseJournal, OwedLease, Quarantined, Revoked};
pub use credential::{ClientIdentity, Credential, Lease, Material, MintFor, Revocation};
pub use error::{error_chain, BrokerError};
pub use file::FileSource;
pub use secret::Secret;
pub use source::SourceSpec;
