//! Audit records as OCSF events (Open Cybersecurity Schema Framework 1.3), for SIEMs that
//! ingest that schema: `ostiary audit query --format ocsf`.
//!
//! A request to a catalogued tool (REST or an MCP `tools/call`) and any other MCP message
//! is an **API Activity** (class 6003): what was asked of a service, the operation being
//! the tool or the JSON-RPC method. Any other request or tunnel is an **HTTP Activity**
//! (class 4002). The proxy's own records (sessions, approvals, the trail's checkpoints and
//! outages, policy reloads, runs) are API Activity of the proxy itself, operation the
//! record's kind. Every event keeps the decision as OCSF states it (`action_id` allowed or
//! denied, `status_id` success or failure, a severity) and Ostiary's own facts — decision,
//! determining policies, tier, approval, approver, checks — under `unmapped.ostiary`, so
//! nothing the record holds is lost in translation. Like the record, an event holds no
//! secret and no argument value.

use serde_json::{json, Map, Value};

use super::record::AuditRecord;

/// The OCSF schema version the events follow.
pub const VERSION: &str = "1.3.0";

const HTTP_ACTIVITY: u32 = 4002;
const API_ACTIVITY: u32 = 6003;

/// `record` as one OCSF event.
pub fn event(record: &AuditRecord) -> Value {
    let api = is_api(record);
    let mut event = Map::new();
    event.extend(class(record, api));
    event.extend(outcome(record));
    event.insert("metadata".into(), metadata(record));
    if let Some(actor) = actor(record) {
        event.insert("actor".into(), actor);
    }
    event.extend(network(record));
    if api {
        let operation = record
            .tool
            .clone()
            .or_else(|| record.rpc_method.clone())
            .unwrap_or_else(|| record.kind.clone());
        let service = record.host.clone().unwrap_or_else(|| "ostiary".into());
        event.insert(
            "api".into(),
            json!({"operation": operation, "service": {"name": service}}),
        );
    }
    event.insert("unmapped".into(), json!({"ostiary": ostiary_facts(record)}));
    Value::Object(drop_nulls(event))
}

/// API Activity: a tool call, any MCP message, the proxy's own records; the rest is HTTP.
fn is_api(record: &AuditRecord) -> bool {
    record.tool.is_some()
        || record.kind == "mcp_call"
        || record.kind == "mcp_message"
        || !matches!(
            record.kind.as_str(),
            "http" | "connect" | "tunnel" | "tls" | "stream"
        )
}

/// The class, category and activity, and the type they make.
fn class(record: &AuditRecord, api: bool) -> Map<String, Value> {
    let (class_uid, class_name, category_uid, category_name, activity_id) = if api {
        let activity = api_activity(record);
        (
            API_ACTIVITY,
            "API Activity",
            6,
            "Application Activity",
            activity,
        )
    } else {
        let activity = http_activity(record);
        (
            HTTP_ACTIVITY,
            "HTTP Activity",
            4,
            "Network Activity",
            activity,
        )
    };
    object(json!({
        "class_uid": class_uid,
        "class_name": class_name,
        "category_uid": category_uid,
        "category_name": category_name,
        "activity_id": activity_id,
        "type_uid": u64::from(class_uid) * 100 + u64::from(activity_id),
    }))
}

/// When, how long, and what became of it: allowed (1) or denied (2) — a request held for
/// a human was not let through yet — with the error kind and reason.
fn outcome(record: &AuditRecord) -> Map<String, Value> {
    let allowed = record.decision == "allow";
    object(json!({
        "time": record.ts_ms,
        "duration": record.duration_us / 1000,
        "severity_id": severity(record),
        "action_id": if allowed { 1 } else { 2 },
        "action": if allowed { "Allowed" } else { "Denied" },
        "status_id": if allowed { 1 } else { 2 },
        "status": if allowed { "Success" } else { "Failure" },
        "status_code": record.error,
        "status_detail": record.reason,
    }))
}

fn metadata(record: &AuditRecord) -> Value {
    json!({
        "version": VERSION,
        "uid": record.request_id,
        "correlation_uid": record.session,
        "product": {
            "name": "Ostiary",
            "vendor_name": "Ostiary",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "log_name": "audit",
    })
}

/// The agent, its session and tenant.
fn actor(record: &AuditRecord) -> Option<Value> {
    let agent = record.agent.as_ref()?;
    Some(json!({
        "user": {
            "name": agent,
            "uid": agent,
            "type_id": 99,
            "type": "Agent",
            "org": record.tenant.as_ref().map(|t| json!({"name": t})),
        },
        "session": record.session.as_ref().map(|s| json!({"uid": s})),
    }))
}

/// Where it went: the destination (and the address dialed), the request, the response.
fn network(record: &AuditRecord) -> Map<String, Value> {
    let ip = record
        .upstream
        .as_deref()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip().to_string());
    let mut parts = Map::new();
    if let Some(host) = &record.host {
        parts.insert(
            "dst_endpoint".into(),
            json!({"hostname": host, "port": record.port, "ip": ip}),
        );
    }
    if record.method.is_some() || record.path.is_some() {
        parts.insert(
            "http_request".into(),
            json!({
                "http_method": record.method,
                "url": {
                    "scheme": record.scheme,
                    "hostname": record.host,
                    "port": record.port,
                    "path": record.path,
                },
            }),
        );
    }
    if let Some(status) = record.status {
        parts.insert("http_response".into(), json!({"code": status}));
    }
    parts
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// HTTP Activity's `activity_id` for the request's method (0 unknown, 99 other).
fn http_activity(record: &AuditRecord) -> u32 {
    if matches!(record.kind.as_str(), "connect" | "tunnel" | "tls") {
        return 1;
    }
    match record
        .method
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        Some("CONNECT") => 1,
        Some("DELETE") => 2,
        Some("GET") => 3,
        Some("HEAD") => 4,
        Some("OPTIONS") => 5,
        Some("POST") => 6,
        Some("PUT") => 7,
        Some("TRACE") => 8,
        Some("PATCH") => 9,
        None => 0,
        Some(_) => 99,
    }
}

/// API Activity's `activity_id`: create, read, update or delete as the method says, else
/// other (an MCP message, the proxy's own records).
fn api_activity(record: &AuditRecord) -> u32 {
    if record.kind == "mcp_call" || record.kind == "mcp_message" {
        return 99;
    }
    match record
        .method
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        Some("POST") => 1,
        Some("GET") | Some("HEAD") => 2,
        Some("PUT") | Some("PATCH") => 3,
        Some("DELETE") => 4,
        _ => 99,
    }
}

/// Informational for what was allowed, low for a refusal, medium for a request held for a
/// human or an attempted exfiltration, high for a failure of the proxy itself.
fn severity(record: &AuditRecord) -> u32 {
    match record.decision.as_str() {
        "allow" | "checkpoint" => 1,
        "escalate" => 3,
        "error" => 4,
        _ if record.error.as_deref() == Some("placeholder_exfiltration") => 3,
        _ => 2,
    }
}

/// What OCSF has no field for, as the record says it.
fn ostiary_facts(record: &AuditRecord) -> Value {
    let mut facts = json!({
        "kind": record.kind,
        "decision": record.decision,
        "policies": record.policies,
        "policy_version": record.policy_version,
        "tier": record.tier,
        "approval": record.approval,
        "approver": record.approver,
        "parent_session": record.parent,
        "credentials": record.credentials,
        "rpc_id": record.rpc_id,
        "cost_micros": record.cost_micros,
        "unchecked": record.unchecked.then_some(true),
    });
    if !record.checks.is_empty() {
        facts["checks"] = serde_json::to_value(&record.checks).unwrap_or(Value::Null);
    }
    Value::Object(drop_nulls(object(facts)))
}

/// Absent facts are left out rather than sent as `null` (or an empty list).
fn drop_nulls(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter_map(|(k, v)| match v {
            Value::Null => None,
            Value::Array(a) if a.is_empty() => None,
            Value::Object(o) => {
                let o = drop_nulls(o);
                (!o.is_empty()).then_some((k, Value::Object(o)))
            }
            v => Some((k, v)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &str, decision: &str) -> AuditRecord {
        AuditRecord {
            ts_ms: 1_767_225_600_000,
            request_id: "r1".into(),
            session: Some("ses_1".into()),
            agent: Some("triage".into()),
            kind: kind.into(),
            method: Some("DELETE".into()),
            scheme: Some("https".into()),
            host: Some("api.example.com".into()),
            port: Some(443),
            path: Some("/v1/items/7".into()),
            decision: decision.into(),
            duration_us: 2_500,
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_request_is_http_activity_and_a_denial_says_so() {
        let mut r = record("http", "deny");
        r.error = Some("denied".into());
        r.policies = vec!["no-deletes".into()];
        r.policy_version = Some("sha256:0123456789abcdef".into());
        r.status = Some(403);
        let e = event(&r);
        assert_eq!(e["class_uid"], 4002);
        assert_eq!(e["activity_id"], 2, "DELETE");
        assert_eq!(e["type_uid"], 400202);
        assert_eq!(e["action_id"], 2);
        assert_eq!(e["status_id"], 2);
        assert_eq!(e["status_code"], "denied");
        assert_eq!(e["http_request"]["url"]["path"], "/v1/items/7");
        assert_eq!(e["http_response"]["code"], 403);
        assert_eq!(e["actor"]["user"]["name"], "triage");
        assert_eq!(e["actor"]["session"]["uid"], "ses_1");
        assert_eq!(e["metadata"]["uid"], "r1");
        assert_eq!(e["metadata"]["version"], VERSION);
        assert_eq!(e["unmapped"]["ostiary"]["policies"], json!(["no-deletes"]));
        assert_eq!(
            e["unmapped"]["ostiary"]["policy_version"],
            "sha256:0123456789abcdef"
        );
        assert_eq!(e["time"], 1_767_225_600_000_i64);
        assert_eq!(e["duration"], 2);
        assert!(e.get("api").is_none(), "{e}");
    }

    #[test]
    fn a_tool_call_is_api_activity_named_by_its_tool() {
        let mut r = record("http", "allow");
        r.tool = Some("github.delete_repo".into());
        r.tier = Some("irreversible".into());
        r.approval = Some("apr_1".into());
        r.approver = Some("alice".into());
        let e = event(&r);
        assert_eq!(e["class_uid"], 6003);
        assert_eq!(e["activity_id"], 4, "delete");
        assert_eq!(e["api"]["operation"], "github.delete_repo");
        assert_eq!(e["api"]["service"]["name"], "api.example.com");
        assert_eq!(e["action_id"], 1);
        assert_eq!(e["severity_id"], 1);
        assert_eq!(e["unmapped"]["ostiary"]["approver"], "alice");
        assert_eq!(e["unmapped"]["ostiary"]["tier"], "irreversible");
        // Absent facts are left out, not null.
        assert!(e["unmapped"]["ostiary"].get("rpc_id").is_none(), "{e}");
    }

    #[test]
    fn mcp_messages_and_the_proxys_own_records_are_api_activity_of_their_kind() {
        let mut m = record("mcp_message", "deny");
        m.rpc_method = Some("resources/read".into());
        let e = event(&m);
        assert_eq!(
            (e["class_uid"].clone(), e["activity_id"].clone()),
            (json!(6003), json!(99))
        );
        assert_eq!(e["api"]["operation"], "resources/read");
        let mut s = AuditRecord {
            kind: "session".into(),
            decision: "allow".into(),
            ..Default::default()
        };
        s.reason = Some("paused".into());
        let e = event(&s);
        assert_eq!(e["api"]["operation"], "session");
        assert_eq!(e["api"]["service"]["name"], "ostiary");
        assert_eq!(e["status_detail"], "paused");
        let held = event(&record("http", "escalate"));
        assert_eq!(held["severity_id"], 3);
        assert_eq!(held["action_id"], 2, "held: not let through yet");
    }
}
