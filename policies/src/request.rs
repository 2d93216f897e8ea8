//! What the proxy observed about one request, in the vocabulary policies are written in.
//!
//! Everything here comes from the proxy's own observation (the connection, the parsed
//! request line, the session record). Nothing the agent claims in headers is ever copied into
//! the context: an agent cannot talk its way into a different tier or budget.

use std::borrow::Cow;

use cedar_policy::{ExpressionConstructionError, RestrictedExpression};
use serde_json::{json, Value};

use crate::schema::NAMESPACE;

/// One authorization question: may this agent perform this action on this host (or tool)?
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
    /// A call of a catalogued tool (`Action::"tool:<name>"`, resource `Tool::"<name>"`).
    Tool {
        /// The catalog name.
        name: String,
        /// The arguments as the agent sent them; checked against the tool's schema when the
        /// request is decided (a mismatch is a deny).
        args: Value,
        /// `context.impact.records` (see [`crate::catalog::Tool::impact_records`]).
        impact_records: i64,
        /// `context.impact.cost`, micro-units (see [`crate::catalog::Tool::cost_micros`]).
        cost_micros: i64,
        /// The session so far.
        session: SessionState,
        /// `Some(approver)` once a human approved this call: `context.approval.granted`.
        approval: Option<String>,
    },
}

/// `context.session` of a tool call: what the session has done before this call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionState {
    /// Tool calls made so far.
    pub calls: i64,
    /// Cost so far, micro-units.
    pub cost_micros: i64,
    /// Delegation depth (0 for an agent acting for a human directly).
    pub depth: i64,
}

impl AccessRequest {
    /// The resource as Cedar text: `Ostiary::Tool::"<name>"` for a tool call, else
    /// `Ostiary::Host::"<host>"`.
    pub fn resource(&self) -> String {
        match &self.action {
            Action::Tool { name, .. } => format!("{NAMESPACE}::Tool::{name:?}"),
            _ => format!("{NAMESPACE}::Host::{:?}", self.host),
        }
    }
}

impl Action {
    /// The Cedar action id (`http`, `connect` or `tool:<name>`).
    pub fn id(&self) -> Cow<'static, str> {
        match self {
            Action::Http { .. } => Cow::Borrowed("http"),
            Action::Connect { .. } => Cow::Borrowed("connect"),
            Action::Tool { name, .. } => Cow::Owned(format!("tool:{name}")),
        }
    }

    /// The action as Cedar text: `Ostiary::Action::"<id>"`.
    pub fn uid_text(&self) -> String {
        format!("{NAMESPACE}::Action::{:?}", self.id())
    }

    /// The context as Cedar expressions (the evaluation path: no JSON round trip). For a tool
    /// call this is all but `args`, which only the engine can type (it needs the tool's
    /// schema).
    pub fn context_pairs(
        &self,
    ) -> Result<Vec<(String, RestrictedExpression)>, ExpressionConstructionError> {
        let s = |v: &str| RestrictedExpression::new_string(v.to_owned());
        let n = |v: u16| RestrictedExpression::new_long(i64::from(v));
        Ok(match self {
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
            Action::Tool {
                impact_records,
                cost_micros,
                session,
                approval,
                ..
            } => {
                let l = RestrictedExpression::new_long;
                let record = |fields: Vec<(&str, RestrictedExpression)>| {
                    RestrictedExpression::new_record(
                        fields.into_iter().map(|(k, v)| (k.to_owned(), v)),
                    )
                };
                vec![
                    (
                        "impact".into(),
                        record(vec![
                            ("records", l(*impact_records)),
                            ("cost", l(*cost_micros)),
                        ])?,
                    ),
                    (
                        "session".into(),
                        record(vec![
                            ("calls", l(session.calls)),
                            ("cost", l(session.cost_micros)),
                            ("depth", l(session.depth)),
                        ])?,
                    ),
                    (
                        "approval".into(),
                        record(vec![
                            (
                                "granted",
                                RestrictedExpression::new_bool(approval.is_some()),
                            ),
                            ("approver", s(approval.as_deref().unwrap_or_default())),
                        ])?,
                    ),
                ]
            }
        })
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
            Action::Tool {
                args,
                impact_records,
                cost_micros,
                session,
                approval,
                ..
            } => json!({
                "args": args,
                "impact": { "records": impact_records, "cost": cost_micros },
                "session": {
                    "calls": session.calls,
                    "cost": session.cost_micros,
                    "depth": session.depth,
                },
                "approval": {
                    "granted": approval.is_some(),
                    "approver": approval.as_deref().unwrap_or_default(),
                },
            }),
        }
    }
}
