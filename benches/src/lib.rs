//! Shared fixtures of Ostiary's benchmarks: generated policy sets and requests, so that
//! every bench measures against the same inputs (and a baseline in the same run).
//!
//! # Layout
//! - this library — [`engine_with_hosts`] and [`request`], the fixtures the benches share.
//! - `benches/` — criterion benches, each against a baseline in the same run: `decision`
//!   (Cedar as the set grows), `inject`, `scrub`, `dlp`, `checks`, `guardrails`, `ambiguity`.
//! - [`load`] — the load harness's client; `src/bin/load.rs` — direct against through
//!   Ostiary; `src/bin/fleet.rs` — one replica on SQLite against PostgreSQL + Redis and three.
//! - `src/bin/approvals.rs` — what the approval queue costs against a plain forwarded call.
//!
//! Results and how to run them: `docs/benchmarks.md`.
#![forbid(unsafe_code)]

pub mod load;

use ostiary_policies::{AccessRequest, Action, PolicyEngine, PolicySource};

/// A policy set of `n` host permits (one per generated host), plus a metadata forbid.
pub fn engine_with_hosts(n: usize) -> PolicyEngine {
    engine_of(n, |i| {
        format!(
        "@id(\"p{i}\") permit (principal, action == Ostiary::Action::\"http\", resource == Ostiary::Host::\"host{i}.example.com\") when {{ context.method == \"GET\" }};\n"
    )
    })
}

/// A policy set of `n` per-path permits of the shape issue 17 measured (no host in the
/// scope: `when { context.path == "/p<i>" }`), plus the same metadata forbid.
pub fn engine_with_paths(n: usize) -> PolicyEngine {
    engine_of(n, |i| {
        format!(
        "@id(\"p{i}\") permit (principal, action == Ostiary::Action::\"http\", resource) when {{ context.path == \"/p{i}\" }};\n"
    )
    })
}

/// A policy set of `n` per-prefix permits (`when { context.path like "/p<i>/*" }`), plus the
/// same metadata forbid.
pub fn engine_with_prefixes(n: usize) -> PolicyEngine {
    engine_of(n, |i| {
        format!(
        "@id(\"p{i}\") permit (principal, action == Ostiary::Action::\"http\", resource) when {{ context.path like \"/p{i}/*\" }};\n"
    )
    })
}

/// `n` policies made by `policy`, then a forbid of the metadata address.
fn engine_of(n: usize, policy: impl Fn(usize) -> String) -> PolicyEngine {
    let mut text: String = (0..n).map(policy).collect();
    text.push_str(
        "@id(\"no-meta\") forbid (principal, action, resource == Ostiary::Host::\"169.254.169.254\");\n",
    );
    PolicyEngine::from_sources(&[PolicySource {
        name: "bench.cedar".into(),
        text,
    }])
    .expect("generated policies validate")
}

/// A GET of `/p{i}` on one host.
pub fn path_request(i: usize) -> AccessRequest {
    let mut req = request(0);
    if let Action::Http { path, .. } = &mut req.action {
        *path = format!("/p{i}");
    }
    req
}

/// A GET to `host{i}.example.com`.
pub fn request(i: usize) -> AccessRequest {
    AccessRequest {
        agent: "bench".into(),
        tenant: "default".into(),
        host: format!("host{i}.example.com"),
        session: Default::default(),
        action: Action::Http {
            method: "GET".into(),
            scheme: "https".into(),
            port: 443,
            path: "/v1/items".into(),
            query: String::new(),
        },
    }
}
