//! A decision as the audit trail keeps it, so that it can be decided again: the request in
//! Cedar's vocabulary (principal, action, resource, context inputs) and what the set said.
//! `ostiary policy replay` and the shadow set re-decide these against another set; replaying
//! them against the set that made them gives the same decisions (`tests/replay.rs`).
//!
//! # What is kept, and what is not
//! Everything a decision reads except what may be secret: the agent, tenant, host, session
//! state and the action with its context. A tool call's arguments and a trigger's payload
//! come from outside and may carry anything, so they are kept only while their JSON is at
//! most [`MAX_ARGS_BYTES`], and with every string that looks like a credential replaced by
//! `"***"` (the caller passes the test: the proxy's DLP detectors). A decision whose
//! arguments were left out or changed is marked so, and replay counts it as not
//! re-decidable instead of guessing.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::decide::Decision;
use crate::request::{AccessRequest, Action, Recent, SessionState};

/// Largest arguments (or payload), as JSON, kept with a decision.
pub const MAX_ARGS_BYTES: usize = 4096;

/// What a recorded decision is: the request, the outcome and whether it can be replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub request: AccessRequest,
    /// `allow`, `deny` or `escalate`.
    pub outcome: String,
    /// The determining policies, sorted.
    pub policies: Vec<String>,
    /// Arguments were left out (too large) or redacted: the request is not the one decided.
    pub partial: bool,
}

/// The outcome word of a decision.
pub fn outcome(decision: &Decision) -> &'static str {
    match decision {
        Decision::Allow { .. } => "allow",
        Decision::Escalate { .. } => "escalate",
        Decision::Deny { .. } => "deny",
    }
}

/// The JSON kept for `request` decided as `decision`. `secret` says whether a string value
/// of the arguments looks like a credential.
pub fn to_json(
    request: &AccessRequest,
    decision: &Decision,
    secret: &dyn Fn(&str) -> bool,
) -> Value {
    let mut partial = false;
    let mut keep = |value: &Value| -> Value {
        let (value, redacted) = redact(value, secret);
        partial |= redacted;
        if value.to_string().len() > MAX_ARGS_BYTES {
            partial = true;
            Value::Null
        } else {
            value
        }
    };
    let action = match &request.action {
        Action::Http {
            method,
            scheme,
            port,
            path,
            query,
        } => json!({"type": "http", "method": method, "scheme": scheme, "port": port,
                     "path": path, "query": query}),
        Action::Connect { port, sni } => json!({"type": "connect", "port": port, "sni": sni}),
        Action::Mcp { method, server } => {
            json!({"type": "mcp", "method": method, "server": server})
        }
        Action::Spawn { child } => json!({"type": "spawn", "child": child}),
        Action::Trigger {
            name,
            kind,
            payload,
            approval,
        } => json!({"type": "trigger", "name": name, "kind": kind,
                     "payload": keep(payload), "approval": approval}),
        Action::Tool {
            name,
            args,
            impact_records,
            cost_micros,
            approval,
            undo,
        } => {
            let mut tool = json!({"type": "tool", "name": name, "args": keep(args),
                     "impact_records": impact_records, "cost_micros": cost_micros,
                     "approval": approval});
            // Only an undo says so: every record kept before undo existed reads back the same.
            if *undo {
                tool["undo"] = json!(true);
            }
            tool
        }
    };
    let s = &request.session;
    let reason = match decision {
        Decision::Deny { reason, .. } => Some(reason.to_string()),
        _ => None,
    };
    json!({
        "agent": request.agent,
        "tenant": request.tenant,
        "host": request.host,
        "session": {
            "calls": s.calls,
            "cost": s.cost_micros,
            "depth": s.depth,
            "parent_agent": s.parent_agent,
            "profile": s.profile,
            "labels": s.labels,
            "recent": [s.recent.tool_10m, s.recent.tool_1h, s.recent.tier_10m, s.recent.tier_1h],
        },
        "action": action,
        "outcome": outcome(decision),
        "policies": decision.policies(),
        "reason": reason,
        "partial": partial,
    })
}

/// Strings that look like credentials replaced by `"***"`, and whether any was. Also what
/// the proxy keeps of a call's arguments for its undo.
pub fn redact(value: &Value, secret: &dyn Fn(&str) -> bool) -> (Value, bool) {
    match value {
        Value::String(s) if secret(s) => (json!("***"), true),
        Value::Array(items) => {
            let mut any = false;
            let items = items
                .iter()
                .map(|v| {
                    let (v, r) = redact(v, secret);
                    any |= r;
                    v
                })
                .collect();
            (Value::Array(items), any)
        }
        Value::Object(fields) => {
            let mut any = false;
            let fields: Map<String, Value> = fields
                .iter()
                .map(|(k, v)| {
                    let (v, r) = redact(v, secret);
                    any |= r;
                    (k.clone(), v)
                })
                .collect();
            (Value::Object(fields), any)
        }
        other => (other.clone(), false),
    }
}

/// A recorded decision read back.
pub fn from_json(value: &Value) -> Result<Recorded, String> {
    let text = |v: &Value, name: &str| -> Result<String, String> {
        v.get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("`{name}` is missing or not a string"))
    };
    let long = |v: &Value, name: &str| -> Result<i64, String> {
        v.get(name)
            .and_then(Value::as_i64)
            .ok_or_else(|| format!("`{name}` is missing or not an integer"))
    };
    let port = |v: &Value| -> Result<u16, String> {
        u16::try_from(long(v, "port")?).map_err(|_| "`port` is out of range".to_owned())
    };
    let approval = |v: &Value| v.get("approval").and_then(Value::as_str).map(str::to_owned);
    let a = value.get("action").ok_or("`action` is missing")?;
    let action = match text(a, "type")?.as_str() {
        "http" => Action::Http {
            method: text(a, "method")?,
            scheme: text(a, "scheme")?,
            port: port(a)?,
            path: text(a, "path")?,
            query: text(a, "query")?,
        },
        "connect" => Action::Connect {
            port: port(a)?,
            sni: text(a, "sni")?,
        },
        "mcp" => Action::Mcp {
            method: text(a, "method")?,
            server: text(a, "server")?,
        },
        "spawn" => Action::Spawn {
            child: text(a, "child")?,
        },
        "trigger" => Action::Trigger {
            name: text(a, "name")?,
            kind: text(a, "kind")?,
            payload: a.get("payload").cloned().unwrap_or(Value::Null),
            approval: approval(a),
        },
        "tool" => Action::Tool {
            name: text(a, "name")?,
            args: a.get("args").cloned().unwrap_or(Value::Null),
            impact_records: long(a, "impact_records")?,
            cost_micros: long(a, "cost_micros")?,
            approval: approval(a),
            undo: a.get("undo").and_then(Value::as_bool).unwrap_or(false),
        },
        other => return Err(format!("unknown action type {other:?}")),
    };
    let s = value.get("session").ok_or("`session` is missing")?;
    let recent: Vec<i64> = s
        .get("recent")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    let recent = match recent.as_slice() {
        [tool_10m, tool_1h, tier_10m, tier_1h] => Recent {
            tool_10m: *tool_10m,
            tool_1h: *tool_1h,
            tier_10m: *tier_10m,
            tier_1h: *tier_1h,
        },
        _ => Recent::default(),
    };
    let labels: BTreeSet<String> = s
        .get("labels")
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let session = SessionState {
        calls: long(s, "calls")?,
        cost_micros: long(s, "cost")?,
        depth: long(s, "depth")?,
        parent_agent: text(s, "parent_agent")?,
        profile: text(s, "profile")?,
        labels,
        recent,
    };
    let mut policies: Vec<String> = value
        .get("policies")
        .and_then(Value::as_array)
        .map(|p| {
            p.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    policies.sort();
    Ok(Recorded {
        request: AccessRequest {
            agent: text(value, "agent")?,
            tenant: text(value, "tenant")?,
            host: text(value, "host")?,
            session,
            action,
        },
        outcome: text(value, "outcome")?,
        policies,
        partial: value
            .get("partial")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// How a decision compares with a recorded one: the same, or what changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub old_outcome: String,
    pub new_outcome: String,
    pub old_policies: Vec<String>,
    pub new_policies: Vec<String>,
}

/// What `decision` changes of `recorded`, if anything: the outcome, or the determining
/// policies.
pub fn compare(recorded: &Recorded, decision: &Decision) -> Option<Change> {
    let mut new_policies = decision.policies().to_vec();
    new_policies.sort();
    let new_outcome = outcome(decision);
    (recorded.outcome != new_outcome || recorded.policies != new_policies).then(|| Change {
        old_outcome: recorded.outcome.clone(),
        new_outcome: new_outcome.to_owned(),
        old_policies: recorded.policies.clone(),
        new_policies,
    })
}
