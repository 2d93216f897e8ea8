//! Ostiary: the authorization proxy between AI agents and everything they reach.
//!
//! Comments cite the contract as `docs/design.md §N` (the design restated in the repository);
//! `docs/architecture.md` draws the crates, the phase order and this map. The `ostiary`
//! command line is not here: it is the `ostiary-cli` crate (`cli/`), a user of this library.
//!
//! # Layout
//! The request path, in the order a request meets it:
//! - [`accept`] — the proxy listeners (TCP and the sandbox's Unix socket), header-read timeout.
//! - [`shards`] — the listeners' event loops: a thread each, connections spread by load.
//! - [`wire_guard`] — strict HTTP/1 framing on the raw bytes, before hyper sees them.
//! - [`reset_guard`] — HTTP/2 late-reset floods answered with GOAWAY.
//! - [`connect`] — `CONNECT`: destination checks, then TLS interception or a relay.
//! - [`tunnel`] — uninspected relays for `egress.tunnel` hosts; the splice WebSockets share.
//! - [`tls`] — the interception CA and its leaves ([`tls::ca`]), the upstream client config.
//! - [`pipeline`] — the phases in order, for a live request and for an approved one.
//! - [`authenticate`] — phase `authenticate`: the session token → the principal.
//! - [`classify`] — phase `classify`: scheme, canonical host, port, normalised path, query.
//! - [`path_forms`] — the one spelling of a path, and those a lenient upstream routes elsewhere.
//! - [`recognise`] — whether a request is a catalogued REST tool call, and its arguments.
//! - [`mcp`] — MCP over Streamable HTTP: JSON-RPC parsed, decided and answered per message.
//! - [`strict_json`] — JSON every decoder reads alike (duplicate or case-folded keys refused).
//! - [`evaluate`] — phase `evaluate`: the Cedar decision and the port rule.
//! - [`check`] — phase `check`: the tier's checks (`args_schema`, `dlp`, `webhook`) in budget.
//! - [`escalate`] — phase `escalate`: hold for approval, collect the outcome, `status_url`.
//! - [`inject`] — phase `inject`: the upstream request, brokered credentials, placeholders.
//! - [`forward`] — phase `forward`: pooled upstream clients (ALPN, upgrades, mTLS).
//! - [`connector`] — every upstream dial through the egress guard, then verified TLS.
//! - [`egress`] — the egress (SSRF) guard: resolve once, check every address, dial that one.
//! - [`scrub`] — the session's secrets redacted from upstream answers, in every encoding.
//! - [`body`] — the one body type handed around: a boxed stream of `Bytes`.
//! - [`error`] — the typed refusals and failures, one per row of docs/design.md §5.
//! - [`respond`] — the one place where refusals become HTTP responses (and JSON-RPC errors).
//! - [`audit`] — one record per decision from a guard; the HMAC chain; fails closed.
//!
//! Around it:
//! - [`session`] — session tokens, the live registry, `spawn`, limits, the loop watchdog.
//! - [`guardrails`] — budgets, rate limits, requests in flight, `Idempotency-Key`, pauses.
//! - [`approvals`] — the durable approval queue, its channels, and running approvals once.
//! - [`lifecycle`] — session teardown and the lease reaper (a session's end reaches the broker).
//! - [`lease_journal`] — leases owed a revocation, journaled so a restart revokes them.
//! - [`policy_store`] — the policy set in force and its hot reload.
//! - [`control`] — the control API on its own listener.
//! - [`metrics`] — Prometheus metrics; labels never name values.
//! - [`ids`] — request and session ids.
//! - [`store`] — the `ostiary-store` crate: one trait per durable aggregate, SQLite or PostgreSQL.
//! - [`stores`] — the backend `state.store` names (SQLite file or PostgreSQL URL), opened.
//! - [`state`] — the state directory: CA, admin token, keys, the database file.
//! - [`config`] — `ostiary.toml`: one serde tree, unknown fields refused.
//! - [`plane`] — the handles a running proxy hands its listeners (data plane, control plane).
//! - [`server`] — assembling a running proxy and serving its listeners until shutdown.
//! - [`sandbox`] — `ostiary run --sandbox`: the command's only way out is the proxy.
#![forbid(unsafe_code)]

pub mod accept;
pub mod approvals;
pub mod audit;
pub mod authenticate;
pub mod body;
pub mod check;
pub mod classify;
pub mod config;
pub mod connect;
pub mod connector;
pub mod control;
pub mod counters;
pub mod egress;
pub mod error;
pub mod escalate;
pub mod evaluate;
pub mod forward;
pub mod guardrails;
pub mod h2_idle;
pub mod hibernate;
pub mod ids;
pub mod inject;
pub mod lease_journal;
pub mod lifecycle;
pub mod mcp;
pub mod method_override;
pub mod metrics;
pub mod path_forms;
pub mod pipeline;
pub mod plane;
pub mod policy_store;
pub mod promote;
pub mod recognise;
pub mod reset_guard;
pub mod respond;
pub mod runs;
pub mod sandbox;
pub mod scrub;
pub mod server;
pub mod session;
pub mod shadow;
pub mod shards;
pub mod state;
pub mod stores;
/// Durable state: a trait per aggregate, the row types, migrations and the SQLite backend.
pub use ostiary_store as store;
pub mod strict_json;
pub mod telemetry;
pub mod tls;
pub mod tunnel;
pub mod undo;
pub mod wire_guard;

pub use config::Config;
pub use server::{Options, Ostiary};
