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
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
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

/// A kept decision, embedded as JSON text in the audit record. The text is written the first
/// time it is asked for — for a live request by the audit writer's thread, as it writes the
/// record — from an owned copy of what the decision read, so the request that made the
/// decision pays for the copy (a few allocations), not for the JSON (~5,700 instructions
/// of a plain request's ~127,000 on its event loop: docs/benchmarks.md, "A kept decision
/// written by the writer, and maps keyed by the proxy's own ids"). Clones share the text, written at most once.
///
/// Building it as a `serde_json::Value` tree (an ordered map, a key string per field), then
/// serialising and dropping that tree on the audit writer's thread, cost 8% of the proxy's
/// CPU flat out (docs/benchmarks.md); the text costs a fraction.
#[derive(Clone)]
pub struct Kept(Arc<Lazy>);

struct Lazy {
    text: OnceLock<Box<RawValue>>,
    /// What the text is written from; none for a decision read back as text.
    parts: Option<Parts>,
}

/// What a kept decision's text says, owned. A tool call's arguments (a trigger's payload)
/// are in `args`, as kept: redacted when the decision was made, with the detectors of that
/// moment; the action's own copy of them is left empty.
struct Parts {
    agent: String,
    tenant: String,
    host: String,
    session: SessionState,
    action: Action,
    args: Option<Box<RawValue>>,
    outcome: &'static str,
    policies: Vec<String>,
    reason: Option<String>,
    partial: bool,
}

impl Kept {
    /// The JSON text (written now if it was not yet).
    pub fn as_str(&self) -> &str {
        self.text().get()
    }

    fn text(&self) -> &RawValue {
        self.0
            .text
            .get_or_init(|| self.0.parts.as_ref().map_or_else(null, Parts::write))
    }

    /// The decision as a JSON value ([`from_json`] reads it).
    pub fn to_value(&self) -> Value {
        // The text is always JSON: written by `serde_json` here or read back through `Value`.
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }

    /// A kept decision from its JSON value (a record read back, a test's fixture).
    pub fn from_value(value: &Value) -> Self {
        let text = RawValue::from_string(value.to_string()).unwrap_or_else(|_| null());
        Self(Arc::new(Lazy {
            text: OnceLock::from(text),
            parts: None,
        }))
    }
}

fn null() -> Box<RawValue> {
    RawValue::NULL.to_owned()
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Kept {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.text().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Kept {
    /// Through a `Value`, so that a record read from any source (text or a value) reads.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(|v| Self::from_value(&v))
    }
}

/// The fields of a kept decision, in the order they are written (the order `from_json`
/// needs none; the hash of a record covers its text as written).
#[derive(Serialize)]
struct KeptFields<'a> {
    agent: &'a str,
    tenant: &'a str,
    host: &'a str,
    session: SessionFields<'a>,
    action: ActionFields<'a>,
    outcome: &'static str,
    policies: &'a [String],
    reason: Option<&'a str>,
    partial: bool,
}

#[derive(Serialize)]
struct SessionFields<'a> {
    calls: i64,
    cost: i64,
    depth: i64,
    parent_agent: &'a str,
    profile: &'a str,
    labels: &'a BTreeSet<String>,
    recent: [i64; 4],
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ActionFields<'a> {
    Http {
        method: &'a str,
        scheme: &'a str,
        port: u16,
        path: &'a str,
        query: &'a str,
    },
    Connect {
        port: u16,
        sni: &'a str,
    },
    Mcp {
        method: &'a str,
        server: &'a str,
    },
    Spawn {
        child: &'a str,
    },
    Trigger {
        name: &'a str,
        kind: &'a str,
        payload: Option<&'a RawValue>,
        approval: &'a Option<String>,
    },
    Tool {
        name: &'a str,
        args: Option<&'a RawValue>,
        impact_records: i64,
        cost_micros: i64,
        approval: &'a Option<String>,
        /// Only an undo says so: every record kept before undo existed reads back the same.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        undo: bool,
    },
}

/// Arguments (or a payload) as kept: their JSON with credential-looking strings redacted,
/// `None` (written `null`) when that is over [`MAX_ARGS_BYTES`]. `partial` is set when they
/// were changed or left out.
fn keep_args(
    value: &Value,
    secret: &dyn Fn(&str) -> bool,
    partial: &mut bool,
) -> Option<Box<RawValue>> {
    let text = if any_secret(value, secret) {
        *partial = true;
        serde_json::to_string(&redact(value, secret).0)
    } else {
        serde_json::to_string(value)
    }
    .ok()?;
    if text.len() > MAX_ARGS_BYTES {
        *partial = true;
        return None;
    }
    RawValue::from_string(text).ok()
}

/// Whether a string anywhere in `value` looks like a credential (so that arguments with
/// none are written as they are, not copied first).
fn any_secret(value: &Value, secret: &dyn Fn(&str) -> bool) -> bool {
    match value {
        Value::String(s) => secret(s),
        Value::Array(items) => items.iter().any(|v| any_secret(v, secret)),
        Value::Object(fields) => fields.values().any(|v| any_secret(v, secret)),
        _ => false,
    }
}

/// The decision kept for `request` decided as `decision`. `secret` says whether a string
/// value of the arguments looks like a credential: they are redacted now, the rest is
/// copied and written as JSON when the text is first asked for ([`Kept`]).
pub fn to_json(
    request: &AccessRequest,
    decision: &Decision,
    secret: &dyn Fn(&str) -> bool,
) -> Kept {
    let mut partial = false;
    // Everything but the arguments (kept as their redacted text) is cloned as it is.
    let (action, args) = match &request.action {
        Action::Trigger {
            name,
            kind,
            payload,
            approval,
        } => (
            Action::Trigger {
                name: name.clone(),
                kind: kind.clone(),
                payload: Value::Null,
                approval: approval.clone(),
            },
            keep_args(payload, secret, &mut partial),
        ),
        Action::Tool {
            name,
            args,
            impact_records,
            cost_micros,
            approval,
            undo,
        } => (
            Action::Tool {
                name: name.clone(),
                args: Value::Null,
                impact_records: *impact_records,
                cost_micros: *cost_micros,
                approval: approval.clone(),
                undo: *undo,
            },
            keep_args(args, secret, &mut partial),
        ),
        other => (other.clone(), None),
    };
    let parts = Parts {
        agent: request.agent.clone(),
        tenant: request.tenant.clone(),
        host: request.host.clone(),
        session: request.session.clone(),
        action,
        args,
        outcome: outcome(decision),
        policies: decision.policies().to_vec(),
        reason: match decision {
            Decision::Deny { reason, .. } => Some(reason.to_string()),
            _ => None,
        },
        partial,
    };
    Kept(Arc::new(Lazy {
        text: OnceLock::new(),
        parts: Some(parts),
    }))
}

impl Parts {
    /// The text: the fields in [`KeptFields`]' order (the hash of a record covers its text
    /// as written, so the same parts always write the same text).
    fn write(&self) -> Box<RawValue> {
        let action = match &self.action {
            Action::Http {
                method,
                scheme,
                port,
                path,
                query,
            } => ActionFields::Http {
                method,
                scheme,
                port: *port,
                path,
                query,
            },
            Action::Connect { port, sni } => ActionFields::Connect { port: *port, sni },
            Action::Mcp { method, server } => ActionFields::Mcp { method, server },
            Action::Spawn { child } => ActionFields::Spawn { child },
            Action::Trigger {
                name,
                kind,
                approval,
                ..
            } => ActionFields::Trigger {
                name,
                kind,
                payload: self.args.as_deref(),
                approval,
            },
            Action::Tool {
                name,
                impact_records,
                cost_micros,
                approval,
                undo,
                ..
            } => ActionFields::Tool {
                name,
                args: self.args.as_deref(),
                impact_records: *impact_records,
                cost_micros: *cost_micros,
                approval,
                undo: *undo,
            },
        };
        let s = &self.session;
        let fields = KeptFields {
            agent: &self.agent,
            tenant: &self.tenant,
            host: &self.host,
            session: SessionFields {
                calls: s.calls,
                cost: s.cost_micros,
                depth: s.depth,
                parent_agent: &s.parent_agent,
                profile: &s.profile,
                labels: &s.labels,
                recent: [
                    s.recent.tool_10m,
                    s.recent.tool_1h,
                    s.recent.tier_10m,
                    s.recent.tier_1h,
                ],
            },
            action,
            outcome: self.outcome,
            policies: &self.policies,
            reason: self.reason.as_deref(),
            partial: self.partial,
        };
        // Borrowed strings, integers and JSON text: writing them cannot fail.
        serde_json::value::to_raw_value(&fields).unwrap_or_else(|_| null())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::DenyReason;

    fn request(action: Action) -> AccessRequest {
        AccessRequest {
            agent: "planner".into(),
            tenant: "acme".into(),
            host: "api.example.test".into(),
            session: SessionState {
                calls: 3,
                cost_micros: 1500,
                depth: 1,
                parent_agent: "root".into(),
                profile: "default".into(),
                labels: BTreeSet::from(["pii".to_owned()]),
                recent: Recent {
                    tool_10m: 1,
                    tool_1h: 2,
                    tier_10m: 3,
                    tier_1h: 4,
                },
            },
            action,
        }
    }

    /// The text is what the `Value` tree it replaced wrote, field for field and in order:
    /// records written before and after read and hash alike.
    #[test]
    fn the_kept_text_is_the_format_records_have_always_had() {
        let tool = request(Action::Tool {
            name: "records.create".into(),
            args: json!({"title": "t", "token": "AKIAEXAMPLE", "n": [1, 2]}),
            impact_records: 2,
            cost_micros: 10,
            approval: Some("alice".into()),
            undo: true,
        });
        let allow = Decision::Allow {
            policies: vec!["p1".into()],
        };
        let kept = to_json(&tool, &allow, &|s| s.starts_with("AKIA"));
        assert_eq!(
            kept.as_str(),
            r#"{"agent":"planner","tenant":"acme","host":"api.example.test","session":{"calls":3,"cost":1500,"depth":1,"parent_agent":"root","profile":"default","labels":["pii"],"recent":[1,2,3,4]},"action":{"type":"tool","name":"records.create","args":{"title":"t","token":"***","n":[1,2]},"impact_records":2,"cost_micros":10,"approval":"alice","undo":true},"outcome":"allow","policies":["p1"],"reason":null,"partial":true}"#
        );
        let http = request(Action::Http {
            method: "GET".into(),
            scheme: "https".into(),
            port: 443,
            path: "/a".into(),
            query: "q=1".into(),
        });
        let deny = Decision::Deny {
            policies: vec![],
            reason: DenyReason::NoPermit,
        };
        let kept = to_json(&http, &deny, &|_| false);
        assert_eq!(
            kept.as_str(),
            r#"{"agent":"planner","tenant":"acme","host":"api.example.test","session":{"calls":3,"cost":1500,"depth":1,"parent_agent":"root","profile":"default","labels":["pii"],"recent":[1,2,3,4]},"action":{"type":"http","method":"GET","scheme":"https","port":443,"path":"/a","query":"q=1"},"outcome":"deny","policies":[],"reason":"no policy permits this request","partial":false}"#
        );
        let back = from_json(&kept.to_value()).unwrap();
        assert_eq!(back.request, http);
    }

    /// The text is written when it is first asked for, once, from what was kept: a clone
    /// shares it, a record embeds it as it is, and the arguments were redacted when the
    /// decision was kept (the test of what is secret is not asked again later).
    #[test]
    fn the_text_is_written_once_when_first_asked_for() {
        #[derive(Serialize)]
        struct Record {
            decided: Kept,
        }
        let asked = std::cell::Cell::new(0);
        let secret = |s: &str| {
            asked.set(asked.get() + 1);
            s == "hunter2"
        };
        let tool = request(Action::Tool {
            name: "t".into(),
            args: json!({"password": "hunter2", "n": 1}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        });
        let allow = Decision::Allow {
            policies: vec!["p1".into()],
        };
        let kept = to_json(&tool, &allow, &secret);
        let asked_when_kept = asked.get();
        assert!(asked_when_kept > 0);
        assert!(
            kept.0.text.get().is_none(),
            "written while the request is decided"
        );
        let clone = kept.clone();
        let record = serde_json::to_string(&Record {
            decided: clone.clone(),
        })
        .unwrap();
        assert!(kept.0.text.get().is_some(), "a clone wrote its own text");
        assert!(std::ptr::eq(kept.as_str(), clone.as_str()));
        assert_eq!(record, format!(r#"{{"decided":{}}}"#, kept.as_str()));
        assert!(kept.as_str().contains(r#""args":{"password":"***","n":1}"#));
        assert_eq!(asked.get(), asked_when_kept);
        assert!(from_json(&kept.to_value()).unwrap().partial);
    }

    #[test]
    fn oversized_arguments_are_left_out_and_marked() {
        let tool = request(Action::Tool {
            name: "t".into(),
            args: json!({"note": "y".repeat(MAX_ARGS_BYTES)}),
            impact_records: 0,
            cost_micros: 0,
            approval: None,
            undo: false,
        });
        let allow = Decision::Allow { policies: vec![] };
        let kept = to_json(&tool, &allow, &|_| false).to_value();
        assert_eq!(kept["action"]["args"], Value::Null);
        assert_eq!(kept["partial"], json!(true));
        // An undo flag that is false is not written at all.
        assert!(kept["action"].get("undo").is_none());
    }

    /// Embedded in a record, the text is written as JSON, not as a string, and reads back
    /// from text and from a value alike.
    #[test]
    fn kept_embeds_as_json_and_reads_back_from_text_or_value() {
        #[derive(Serialize, Deserialize)]
        struct Record {
            decided: Option<Kept>,
        }
        let kept = Kept::from_value(&json!({"a": [1, "x"]}));
        let text = serde_json::to_string(&Record {
            decided: Some(kept.clone()),
        })
        .unwrap();
        assert_eq!(text, r#"{"decided":{"a":[1,"x"]}}"#);
        let from_text: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(from_text.decided, Some(kept.clone()));
        let from_value: Record =
            serde_json::from_value(json!({"decided": {"a": [1, "x"]}})).unwrap();
        assert_eq!(from_value.decided, Some(kept));
        assert_eq!(
            format!("{:?}", from_value.decided.unwrap()),
            r#"{"a":[1,"x"]}"#
        );
    }
}
