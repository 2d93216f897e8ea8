//! What the proxy observed about one request, in the vocabulary policies are written in.
//!
//! Everything here comes from the proxy's own observation (the connection, the parsed
//! request line, the session record). Nothing the agent claims in headers is ever copied into
//! the context: an agent cannot talk its way into a different tier or budget.

use std::borrow::Cow;
use std::collections::BTreeSet;

use cedar_policy::{ExpressionConstructionError, RestrictedExpression};
use serde_json::{json, Value};

use crate::args::RecordType;
use crate::conditions::Known;
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
    /// The session asking, as the proxy counts it: `context.session` of every action.
    pub session: SessionState,
    /// What is being done, with its context.
    pub action: Action,
}

/// The action and its context (docs/design.md §4).
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
    /// A JSON-RPC message other than `tools/call` to a catalogued MCP endpoint
    /// (`Action::"mcp"`, resource the endpoint's `Host`).
    Mcp {
        /// The JSON-RPC method (`initialize`, `resources/read`, ...); a response the client
        /// sends back to a server request has none and is decided with the empty string.
        method: String,
        /// The endpoint's URL, as the catalog writes it.
        server: String,
    },
    /// A session asking for a child session under another agent name (`Action::"spawn"`,
    /// principal the parent's agent, resource `Agent::"<child>"`).
    Spawn {
        /// The agent name the child would run as.
        child: String,
    },
    /// A trigger about to start a run (`Action::"trigger"`, resource `Trigger::"<name>"`,
    /// principal the agent the run would be).
    Trigger {
        /// The trigger's name in the config.
        name: String,
        /// `webhook`, `schedule` or `api`.
        kind: String,
        /// The payload, validated against the trigger's schema; converted to
        /// `context.payload` with the trigger's record (see [`crate::triggers`]).
        payload: Value,
        /// `Some(approver)` once a human approved the run: `context.approval.granted`.
        approval: Option<String>,
    },
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
        /// `Some(approver)` once a human approved this call: `context.approval.granted`.
        approval: Option<String>,
        /// The call's undo (`Action::"tool:<name>.undo"`, docs/undo.md): reversing an earlier
        /// call of the tool, with that call's arguments.
        undo: bool,
    },
}

/// `context.session` of every action: what the session has done before this request, and
/// where it sits in the spawn tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionState {
    /// Tool calls made so far.
    pub calls: i64,
    /// Cost so far, micro-units.
    pub cost_micros: i64,
    /// Delegation depth (0 for an agent acting for a human directly).
    pub depth: i64,
    /// The agent of the session that spawned this one; empty for a root session.
    pub parent_agent: String,
    /// The sandbox profile the session runs under; empty when none.
    pub profile: String,
    /// The labels of every labelled tool and host policy allowed the session (or an
    /// ancestor, before the session was spawned) so far: `context.session.labels`.
    pub labels: BTreeSet<String>,
    /// `context.session.recent`: this tool's and its tier's calls in the last windows.
    pub recent: Recent,
}

/// `context.session.recent`: the calls of the request's tool (`tool_*`) and of its tier
/// (`tier_*`) that this session was allowed in the 10 minutes and the hour before the
/// request, the request itself not counted. All 0 for an action that is not a tool call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recent {
    pub tool_10m: i64,
    pub tool_1h: i64,
    pub tier_10m: i64,
    pub tier_1h: i64,
}

impl Recent {
    fn fields(&self) -> [(&'static str, i64); 4] {
        [
            ("tool_10m", self.tool_10m),
            ("tool_1h", self.tool_1h),
            ("tier_10m", self.tier_10m),
            ("tier_1h", self.tier_1h),
        ]
    }
}

impl SessionState {
    fn pairs(
        &self,
    ) -> Result<Vec<(&'static str, RestrictedExpression)>, ExpressionConstructionError> {
        let l = RestrictedExpression::new_long;
        let s = |v: &str| RestrictedExpression::new_string(v.to_owned());
        let labels = RestrictedExpression::new_set(self.labels.iter().map(|label| s(label)));
        let recent = RestrictedExpression::new_record(
            self.recent.fields().map(|(k, v)| (k.to_owned(), l(v))),
        )?;
        Ok(vec![
            ("calls", l(self.calls)),
            ("cost", l(self.cost_micros)),
            ("depth", l(self.depth)),
            ("parent_agent", s(&self.parent_agent)),
            ("profile", s(&self.profile)),
            ("labels", labels),
            ("recent", recent),
        ])
    }

    fn json(&self) -> Value {
        let recent: serde_json::Map<String, Value> = self
            .recent
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        json!({
            "calls": self.calls,
            "cost": self.cost_micros,
            "depth": self.depth,
            "parent_agent": self.parent_agent,
            "profile": self.profile,
            "labels": self.labels,
            "recent": recent,
        })
    }
}

impl AccessRequest {
    /// The resource as Cedar text: `Ostiary::Tool::"<name>"` for a tool call,
    /// `Ostiary::Agent::"<child>"` for a spawn, `Ostiary::Trigger::"<name>"` for a trigger,
    /// else `Ostiary::Host::"<host>"`.
    pub fn resource(&self) -> String {
        match &self.action {
            Action::Tool { name, .. } => format!("{NAMESPACE}::Tool::{name:?}"),
            Action::Trigger { name, .. } => format!("{NAMESPACE}::Trigger::{name:?}"),
            Action::Spawn { child } => format!("{NAMESPACE}::Agent::{child:?}"),
            _ => format!("{NAMESPACE}::Host::{:?}", self.host),
        }
    }

    /// The context as Cedar expressions (the evaluation path: no JSON round trip). For a tool
    /// call this is all but `args`, which only the engine can type (it needs the tool's
    /// schema).
    pub fn context_pairs(
        &self,
    ) -> Result<Vec<(String, RestrictedExpression)>, ExpressionConstructionError> {
        self.context_pairs_reading(|_| true)
    }

    /// [`Self::context_pairs`] with only the attributes `reads` keeps (those some policy
    /// can read: `context_use.rs`); the others are never built.
    pub fn context_pairs_reading(
        &self,
        reads: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, RestrictedExpression)>, ExpressionConstructionError> {
        type Built = Result<RestrictedExpression, ExpressionConstructionError>;
        let s = |v: &str| -> Built { Ok(RestrictedExpression::new_string(v.to_owned())) };
        let n = |v: u16| -> Built { Ok(RestrictedExpression::new_long(i64::from(v))) };
        let record = |fields: Vec<(&str, RestrictedExpression)>| -> Built {
            RestrictedExpression::new_record(fields.into_iter().map(|(k, v)| (k.to_owned(), v)))
        };
        let mut pairs = Vec::new();
        // Each value is built only when kept.
        let mut keep =
            |key: &str, value: &dyn Fn() -> Built| -> Result<(), ExpressionConstructionError> {
                if reads(key) {
                    pairs.push((key.to_owned(), value()?));
                }
                Ok(())
            };
        match &self.action {
            Action::Http {
                method,
                scheme,
                port,
                path,
                query,
            } => {
                keep("method", &|| s(method))?;
                keep("scheme", &|| s(scheme))?;
                keep("port", &|| n(*port))?;
                keep("path", &|| s(path))?;
                keep("query", &|| s(query))?;
            }
            Action::Connect { port, sni } => {
                keep("port", &|| n(*port))?;
                keep("sni", &|| s(sni))?;
            }
            Action::Mcp { method, server } => {
                keep("method", &|| s(method))?;
                keep("server", &|| s(server))?;
            }
            Action::Spawn { .. } => {}
            // `payload`, like a tool's `args`, is typed by the engine.
            Action::Trigger { approval, .. } => {
                keep("approval", &|| approval_record(approval))?;
            }
            Action::Tool {
                impact_records,
                cost_micros,
                approval,
                ..
            } => {
                let l = RestrictedExpression::new_long;
                keep("impact", &|| {
                    record(vec![
                        ("records", l(*impact_records)),
                        ("cost", l(*cost_micros)),
                    ])
                })?;
                keep("approval", &|| approval_record(approval))?;
            }
        }
        keep("session", &|| record(self.session.pairs()?))?;
        Ok(pairs)
    }

    /// The value of `context.<path>` as Cedar will see it, for the policy index's conditions
    /// (`conditions.rs`): only where it is sure to be there, never `approval` (the
    /// escalation re-check flips it under the same slice). `args` types a tool's arguments.
    pub(crate) fn known<'a>(
        &'a self,
        path: &[String],
        args: Option<&'a RecordType>,
    ) -> Option<Known<'a>> {
        let (first, rest) = path.split_first()?;
        let leaf = |known: Known<'a>| rest.is_empty().then_some(known);
        if first == "session" {
            let s = &self.session;
            if let [recent, rest @ ..] = rest {
                if recent == "recent" {
                    return match rest {
                        [] => Some(Known::Other),
                        [window] => s
                            .recent
                            .fields()
                            .into_iter()
                            .find(|(k, _)| k == window)
                            .map(|(_, v)| Known::Long(v)),
                        _ => None,
                    };
                }
            }
            let Some((attr, [])) = rest.split_first() else {
                return rest.is_empty().then_some(Known::Other);
            };
            return match attr.as_str() {
                "calls" => Some(Known::Long(s.calls)),
                "cost" => Some(Known::Long(s.cost_micros)),
                "depth" => Some(Known::Long(s.depth)),
                "parent_agent" => Some(Known::Str(&s.parent_agent)),
                "profile" => Some(Known::Str(&s.profile)),
                // A set: equal to no literal; `like` on it errors.
                "labels" => Some(Known::Other),
                _ => None,
            };
        }
        match (&self.action, first.as_str()) {
            (Action::Http { method, .. }, "method") => leaf(Known::Str(method)),
            (Action::Http { scheme, .. }, "scheme") => leaf(Known::Str(scheme)),
            (Action::Http { path, .. }, "path") => leaf(Known::Str(path)),
            (Action::Http { query, .. }, "query") => leaf(Known::Str(query)),
            (Action::Http { port, .. } | Action::Connect { port, .. }, "port") => {
                leaf(Known::Long(i64::from(*port)))
            }
            (Action::Connect { sni, .. }, "sni") => leaf(Known::Str(sni)),
            (Action::Mcp { method, .. }, "method") => leaf(Known::Str(method)),
            (Action::Mcp { server, .. }, "server") => leaf(Known::Str(server)),
            (Action::Tool { args: json, .. }, "args")
            | (Action::Trigger { payload: json, .. }, "payload") => match rest {
                [] => Some(Known::Other),
                _ => args?.known(json, rest),
            },
            (
                Action::Tool {
                    impact_records,
                    cost_micros,
                    ..
                },
                "impact",
            ) => match rest {
                [] => Some(Known::Other),
                [attr] if attr == "records" => Some(Known::Long(*impact_records)),
                [attr] if attr == "cost" => Some(Known::Long(*cost_micros)),
                _ => None,
            },
            _ => None,
        }
    }

    /// The Cedar context record for this request, as JSON (explanations, tests).
    pub fn context(&self) -> Value {
        let mut context = match &self.action {
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
            Action::Mcp { method, server } => json!({ "method": method, "server": server }),
            Action::Spawn { .. } => json!({}),
            Action::Trigger {
                payload, approval, ..
            } => json!({
                "payload": payload,
                "approval": {
                    "granted": approval.is_some(),
                    "approver": approval.as_deref().unwrap_or_default(),
                },
            }),
            Action::Tool {
                args,
                impact_records,
                cost_micros,
                approval,
                ..
            } => json!({
                "args": args,
                "impact": { "records": impact_records, "cost": cost_micros },
                "approval": {
                    "granted": approval.is_some(),
                    "approver": approval.as_deref().unwrap_or_default(),
                },
            }),
        };
        context["session"] = self.session.json();
        context
    }
}

impl Action {
    /// The Cedar action id (`http`, `connect`, `mcp`, `spawn`, `trigger`, `tool:<name>` or
    /// `tool:<name>.undo`).
    pub fn id(&self) -> Cow<'static, str> {
        match self {
            Action::Http { .. } => Cow::Borrowed("http"),
            Action::Connect { .. } => Cow::Borrowed("connect"),
            Action::Mcp { .. } => Cow::Borrowed("mcp"),
            Action::Spawn { .. } => Cow::Borrowed("spawn"),
            Action::Trigger { .. } => Cow::Borrowed("trigger"),
            Action::Tool {
                name, undo: true, ..
            } => Cow::Owned(format!("tool:{name}.undo")),
            Action::Tool { name, .. } => Cow::Owned(format!("tool:{name}")),
        }
    }

    /// Who approved it, for the actions a human can approve (a tool call, a trigger).
    pub fn approval(&self) -> Option<&Option<String>> {
        match self {
            Action::Tool { approval, .. } | Action::Trigger { approval, .. } => Some(approval),
            _ => None,
        }
    }

    /// The same, to set when a decision is asked again as approved.
    pub fn approval_mut(&mut self) -> Option<&mut Option<String>> {
        match self {
            Action::Tool { approval, .. } | Action::Trigger { approval, .. } => Some(approval),
            _ => None,
        }
    }

    /// The action as Cedar text: `Ostiary::Action::"<id>"`.
    pub fn uid_text(&self) -> String {
        format!("{NAMESPACE}::Action::{:?}", self.id())
    }
}

/// `context.approval`: whether a human approved, and who.
fn approval_record(
    approval: &Option<String>,
) -> Result<RestrictedExpression, ExpressionConstructionError> {
    RestrictedExpression::new_record([
        (
            "granted".to_owned(),
            RestrictedExpression::new_bool(approval.is_some()),
        ),
        (
            "approver".to_owned(),
            RestrictedExpression::new_string(approval.clone().unwrap_or_default()),
        ),
    ])
}
