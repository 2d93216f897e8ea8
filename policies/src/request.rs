//! What the proxy observed about one request, in the vocabulary policies are written in.
//!
//! Everything here comes from the proxy's own observation (the connection, the parsed
//! request line, the session record). Nothing the agent claims in headers is ever copied into
//! the context: an agent cannot talk its way into a different tier or budget.

use cedar_policy::RestrictedExpression;
use serde_json::{json, Value};

/// One authorization question: may this agent perform this action on this host?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRequest {
    /// Agent name from the session (the principal, `Ostiary::Agent::"<agent>"`).
    pub agent: String,
    /// Tenant of the session (`Ostiary::Tenant::"<tenant>"`), parent of the agent.
    pub tenant: String,
    /// Canonical destination host (lowercase name or canonical IP text, no port).
    pub host: String,
    /// What is being done, with its context.
    pub action: Action,
}

/// The action and its context (DESIGN §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// An inspected HTTP request.
    Http {
        method: String,
        scheme: String,
        port: u16,
        path: String,
        query: String,
    },
    /// An uninspected tunnel, or a CONNECT to a port outside `egress.ports`.
    Connect { port: u16, sni: String },
}

impl Action {
    /// The Cedar action id (`http` or `connect`).
    pub fn id(&self) -> &'static str {
        match self {
            Action::Http { .. } => "http",
            Action::Connect { .. } => "connect",
        }
    }

    /// The context as Cedar expressions (the evaluation path: no JSON round trip).
    pub fn context_pairs(&self) -> Vec<(String, RestrictedExpression)> {
        let s = |v: &str| RestrictedExpression::new_string(v.to_owned());
        let n = |v: u16| RestrictedExpression::new_long(i64::from(v));
        match self {
            Action::Http {
                method,
                scheme,
                port,
                path,
                query,
            } => vec![
                ("method".into(), s(method)),
                ("scheme".into(), s(scheme)),
                ("port".into(), n(*port)),
                ("path".into(), s(path)),
                ("query".into(), s(query)),
            ],
            Action::Connect { port, sni } => {
                vec![("port".into(), n(*port)), ("sni".into(), s(sni))]
            }
        }
    }

    /// The Cedar context record for this action, as JSON (explanations, tests).
    pub fn context(&self) -> Value {
        match self {
            Action::Http {
                method,
                scheme,
                port,
                path,
                query,
            } => json!({
                "method": method,
                "scheme": scheme,
                "port": port,
                "path": path,
                "query": query,
            }),
            Action::Connect { port, sni } => json!({ "port": port, "sni": sni }),
        }
    }
}
