//! Fuzz targets for everything the proxy parses from an agent or an operator (THREATS.md,
//! "HTTP and TLS parsing": fuzz targets for request classification, MCP/JSON-RPC parsing,
//! config and catalog parsing; the catalog's are in `policies/tests/fuzz_targets.rs`).
//!
//! Agent-controlled input must never panic the proxy (a panic is a denial of service, and a
//! half-handled request is how smuggling starts), and each parser keeps a promise that
//! policy depends on: canonical hosts, the path policy sees being the path sent upstream,
//! JSON-RPC bodies accepted exactly when they have the documented shape, framing violations
//! never released to hyper. Each target asserts its promise, not only the absence of panics.
//!
//! Each target is a `bolero` check: under `cargo test`/`cargo nextest` it runs a bounded
//! number of random inputs on stable Rust; `cargo bolero test <name>` on nightly runs the
//! same target under libFuzzer, coverage-guided and unbounded (docs/fuzzing.md).

mod classify_target;
mod config_parse;
mod hosts;
mod mcp_parse;
mod path_forms;
mod strict_json;
mod wire_guard;

pub(crate) use std::io;
pub(crate) use std::net::IpAddr;
pub(crate) use std::path::Path;
pub(crate) use std::pin::Pin;
pub(crate) use std::sync::Arc;
pub(crate) use std::task::{Context, Poll, Waker};

pub(crate) use bolero::{check, TypeGenerator};
pub(crate) use http::{Method, Request};
pub(crate) use ostiary::classify::{self, Origin, Target, Tunnel};
pub(crate) use ostiary::egress::address::{normalize_host, split_authority, Host};
pub(crate) use ostiary::error::ProxyError;
pub(crate) use ostiary::mcp;
pub(crate) use ostiary::session::Principal;
pub(crate) use ostiary::wire_guard::StrictH1;
pub(crate) use ostiary::Config;
pub(crate) use serde_json::{json, Map, Value};
pub(crate) use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Random inputs per target on stable; `BOLERO_RANDOM_ITERATIONS` overrides it. Sized so the
/// whole file stays within a few seconds on a debug build.
pub(crate) const ITERATIONS: usize = 2_000;
/// Bounds for structured inputs. bolero refuses (skips) a value whose lists nest deeper
/// than its depth limit (default 5, where a string in a pair in a list in a list already
/// fails), so the limit is raised; the byte budget then bounds the values' size instead.
pub(crate) const STRUCTURED_MAX_LEN: usize = 16 * 1024;
pub(crate) const STRUCTURED_MAX_DEPTH: usize = 32;
