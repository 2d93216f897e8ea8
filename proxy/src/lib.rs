//! Ostiary: the authorization proxy between AI agents and everything they reach.
//!
//! # Layout
//! The request path, in the order a request meets it:
//! - [`accept`] — the proxy listener; strict HTTP/1 framing ([`wire_guard`]), timeouts.
//! - [`connect`] — `CONNECT`: destination checks, TLS interception with leaves minted by
//!   [`tls::ca`], or uninspected relays ([`tunnel`]) for `egress.tunnel` hosts.
//! - [`pipeline`] — the one function listing the phases:
//!   [`authenticate`] → [`classify`] → [`recognise`] (catalogued REST tool calls and their
//!   arguments; MCP JSON-RPC in [`mcp`]) → placeholders ([`inject::placeholders`]) →
//!   [`evaluate`] → [`inject`] (brokered credentials: [`inject::credentials`]) → [`forward`]
//!   → [`scrub`], with an [`audit`] guard around them.
//! - [`egress`] — the SSRF guard every dial goes through ([`connector`]).
//! - [`respond`] — the one place where refusals ([`error`]) become HTTP responses.
//! - [`strict_json`] and [`path_forms`] — what the proxy decides on is what the upstream
//!   runs: JSON that decoders read alike, paths in the one spelling that is forwarded (and
//!   the spellings a lenient upstream would route elsewhere).
//! - [`scrub`] — injected secrets redacted from upstream responses (headers, streamed bodies,
//!   compressed bodies decoded first) before the agent sees them.
//!
//! Around it: [`policy_store`] (the policy set in force and its hot reload), [`session`]
//! (tokens and live sessions), [`lifecycle`] (teardown and the lease reaper) with
//! [`lease_journal`], [`control`] (the control API),
//! [`metrics`], [`store`] (SQLite), [`state`] (the state directory), [`config`], [`server`]
//! (assembly), [`cli`] (the `ostiary` command).
#![forbid(unsafe_code)]

pub mod accept;
pub mod approvals;
pub mod audit;
pub mod authenticate;
pub mod body;
pub mod check;
pub mod classify;
pub mod cli;
pub mod config;
pub mod connect;
pub mod connector;
pub mod control;
pub mod egress;
pub mod error;
pub mod escalate;
pub mod evaluate;
pub mod forward;
pub mod guardrails;
pub mod ids;
pub mod inject;
pub mod lease_journal;
pub mod lifecycle;
pub mod mcp;
pub mod metrics;
pub mod path_forms;
pub mod pipeline;
pub mod policy_store;
pub mod recognise;
pub mod reset_guard;
pub mod respond;
pub mod scrub;
pub mod server;
pub mod session;
pub mod state;
pub mod store;
pub mod strict_json;
pub mod tls;
pub mod tunnel;
pub mod wire_guard;

pub use config::Config;
pub use server::{Options, Ostiary};
