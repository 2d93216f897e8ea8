//! Shared fixtures of Ostiary's benchmarks: generated policy sets and requests, so that
//! every bench measures against the same inputs (and a baseline in the same run).
//!
//! # Layout
//! - this library — [`engine_with_hosts`] and [`request`], the fixtures the benches share.
//! - `benches/` — criterion benches, each against a baseline in the same run: `decision`
//!   (Cedar as the set grows), `inject`, `scrub`, `dlp`, `checks`, `guardrails`, `ambiguity`,
//!   `phases` (session token, classification, leaf minting, audit write).
//! - [`load`] — the load harness's client; `src/bin/load.rs` — direct against through
//!   Ostiary; `src/bin/fleet.rs` — one replica on SQLite against PostgreSQL + Redis and three.
//! - `src/bin/approvals.rs` — what the approval queue costs against a plain forwarded call.
//! - `src/bin/audit_writer.rs` — the audit writer's CPU per record, off the request path.
//!
//! Results and how to run them: `docs/benchmarks.md`.
#![forbid(unsafe_code)]

pub mod load;

use ostiary_policies::{AccessRequest, Action, Catalog, PolicyEngine, PolicySource};

/// The principal of a bench session `session` (agent `bench`, tenant `default`, a root).
pub fn principal(session: &str) -> ostiary::session::Principal {
    ostiary::session::Principal {
        session_id: session.into(),
        agent: "bench".into(),
        tenant: "default".into(),
        depth: 0,
        parent: None,
        parent_agent: None,
        profile: None,
        expires_at: i64::MAX,
    }
}

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

/// Tools in the catalog of [`engine_with_tool_names`], whatever the number of policies, so
/// that only the policies vary between sizes: enough for 1,000 policies and the requests
/// beyond them. (Cedar validates `action in tier:…` once per action of the tier: a set of
/// 10,000 such policies over 10,000 tools takes minutes to validate, so this shape stops at
/// 1,000.)
pub const CATALOG_TOOLS: usize = 1_300;

/// A catalog of `tools` read tools `t<i>` and `repo.read` (argument `repo`).
fn bench_catalog(tools: usize) -> Catalog {
    let mut text = String::from(
        "[[tool]]\nname = \"repo.read\"\ntier = \"read\"\n\
         match = { host = \"api.example.com\", method = \"GET\", path = \"/repos/{repo}\" }\n\
         args_schema = { type = \"object\", required = [\"repo\"], properties = { repo = { type = \"string\" } } }\n",
    );
    for i in 0..tools {
        text.push_str(&format!(
            "[[tool]]\nname = \"t{i}\"\ntier = \"read\"\n\
             match = {{ host = \"api.example.com\", method = \"GET\", path = \"/t{i}\" }}\n"
        ));
    }
    Catalog::parse("tools.toml", &text, None).expect("bench catalog parses")
}

/// `n` per-tool permits conditioned on the tool's name rather than scoped by it
/// (`action in tier:read`, `when { resource == Tool::"t<i>" }`).
pub fn engine_with_tool_names(n: usize) -> PolicyEngine {
    engine_with_catalog(n, CATALOG_TOOLS, |i| {
        format!(
            "@id(\"p{i}\") permit (principal, action in Ostiary::Action::\"tier:read\", resource) when {{ resource == Ostiary::Tool::\"t{i}\" }};\n"
        )
    })
}

/// `n` permits of one tool conditioned on a literal argument value
/// (`when { context.args.repo == "r<i>" }`).
pub fn engine_with_arguments(n: usize) -> PolicyEngine {
    engine_with_catalog(n, 0, |i| {
        format!(
            "@id(\"p{i}\") permit (principal, action == Ostiary::Action::\"tool:repo.read\", resource) when {{ context.args.repo == \"r{i}\" }};\n"
        )
    })
}

fn engine_with_catalog(n: usize, tools: usize, policy: impl Fn(usize) -> String) -> PolicyEngine {
    let text: String = (0..n).map(policy).collect();
    PolicyEngine::with_catalog(
        &[PolicySource {
            name: "bench.cedar".into(),
            text,
        }],
        bench_catalog(tools),
    )
    .expect("generated policies validate")
}

/// A call of tool `t{i}` (no arguments).
pub fn tool_request(i: usize) -> AccessRequest {
    tool_call(format!("t{i}"), serde_json::json!({}))
}

/// A call of `repo.read` with `repo = "r{i}"`.
pub fn argument_request(i: usize) -> AccessRequest {
    tool_call(
        "repo.read".into(),
        serde_json::json!({ "repo": format!("r{i}") }),
    )
}

fn tool_call(name: String, args: serde_json::Value) -> AccessRequest {
    AccessRequest {
        action: Action::Tool {
            name,
            args,
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        },
        ..request(0)
    }
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

/// One allowed tool call's audit record, as the pipeline's phases fill it in.
pub fn fill_tool_call_record(r: &mut ostiary::audit::AuditRecord) {
    r.session = Some("ses_0123456789abcdef0123456789abcdef".into());
    r.agent = Some("bench".into());
    r.tenant = Some("default".into());
    r.method = Some("GET".into());
    r.scheme = Some("https".into());
    r.host = Some("api.github.com".into());
    r.port = Some(443);
    r.path = Some("/repos/acme/widgets/issues".into());
    r.policies = vec!["read-github-issues".into()];
    r.upstream = Some("140.82.112.6:443".into());
    r.tool = Some("github.list_issues".into());
    r.tier = Some("read".into());
}
