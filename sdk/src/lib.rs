//! Ostiary's Rust SDK: the control API (sessions, child sessions, teardown, approvals, the
//! audit trail), a `reqwest` client that sends through a session's proxy and turns
//! Ostiary's refusals into typed errors, and waiting for a request held for a human.
//!
//! The SDK depends on no other Ostiary crate: it speaks the wire contract of docs/design.md
//! §5–§7. docs/sdk-rust.md shows it in use.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ostiary_sdk::SdkError> {
//! use std::time::Duration;
//! use ostiary_sdk::{ControlClient, NewSession, Refusal, SdkError};
//!
//! let control = ControlClient::from_env()?; // OSTIARY_CONTROL_URL, OSTIARY_ADMIN_TOKEN
//! let session = control
//!     .create_session(&NewSession { agent: "triage".into(), max_calls: Some(50), ..Default::default() })
//!     .await?;
//! let agent = session.client()?;
//! match agent.send(agent.delete("https://api.example.com/v1/items/7")).await {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(SdkError::Refused(refusal)) => match *refusal {
//!         Refusal::Denied(d) => println!("denied by {:?}", d.policies()),
//!         Refusal::ApprovalPending(held) => {
//!             let id = held.approval_id().unwrap_or_default();
//!             let outcome = agent.wait_for_approval(id, Duration::from_secs(300)).await?;
//!             println!("approved and executed: {}", outcome.status());
//!         }
//!         other => println!("refused: {other}"),
//!     },
//!     Err(other) => return Err(other),
//! }
//! control.delete_session(&session.session_id).await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - `control` — [`ControlClient`] (and [`ControlClientBuilder`]): configuration from the
//!   environment, sessions and child sessions, teardown.
//! - `call` — the one path every control call takes: checked, sent, read.
//! - `approvals` — the approvers' calls on [`ControlClient`], [`Approval`],
//!   [`ApprovalStatus`], [`ApprovalQuery`].
//! - `audit` — [`ControlClient::audit`] and [`AuditQuery`].
//! - `session` — [`NewSession`], [`Session`] (with [`Session::env`] for child processes and
//!   [`Session::client_builder`] for `reqwest`), [`SessionStatus`], [`CA_BUNDLE_VARS`].
//! - `agent` — [`AgentClient`]: requests through the proxy, Ostiary's answers read as
//!   refusals, the upstream's handed back untouched.
//! - `waiting` — [`AgentClient::wait_for_approval`] and [`AgentClient::send_waiting`].
//! - `refusal` — [`Refusal`] and its typed kinds ([`Denied`], [`ApprovalPending`],
//!   [`ApprovalDenied`], [`LimitExceeded`], [`CheckFailed`], [`CredentialUnavailable`]), read
//!   from Ostiary's JSON; [`Problem`], the fields they share.
//! - `errors` — [`SdkError`], why any call failed.
//! - `secret` — the token type whose `Debug` is `***`.
#![forbid(unsafe_code)]

mod agent;
mod approvals;
mod audit;
mod call;
mod control;
mod errors;
mod refusal;
mod secret;
mod session;
mod waiting;

pub use agent::AgentClient;
pub use approvals::{Approval, ApprovalQuery, ApprovalStatus};
pub use audit::AuditQuery;
pub use control::{
    ControlClient, ControlClientBuilder, ADMIN_TOKEN_ENV, CONTROL_URL_ENV, DEFAULT_CONTROL_URL,
};
pub use errors::SdkError;
pub use refusal::{
    ApprovalDenied, ApprovalPending, CheckFailed, CredentialUnavailable, Denied, LimitExceeded,
    Problem, Refusal, APPROVAL_HEADER, REQUEST_ID_HEADER,
};
pub use session::{NewSession, Session, SessionStatus, CA_BUNDLE_VARS};

/// The `reqwest` this SDK is built on, so callers name the same types.
pub use reqwest;

/// docs/sdk-rust.md, whose examples `cargo test --doc` compiles so they keep matching the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/sdk-rust.md")]
pub struct DocsSdkRust;
