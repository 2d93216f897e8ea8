//! `POST /v1/sessions/{id}/undo`: a session's recorded undos sent newest first
//! ([`crate::undo::reverse`]), and the report of what was reversed, what failed, what was
//! refused and which calls had no undo.
//!
//! Body (optional): `{"since": "<epoch ms | RFC 3339 | duration back from now>",
//! "dry_run": true}`. A session neither the journal nor the audit trail knows is 404.

use std::collections::HashSet;

use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::error::ControlError;
use super::Reply;
use crate::error::ProxyError;
use crate::plane::ControlPlane;
use crate::store::audit::AuditQuery;
use crate::store::Call;

/// The largest body an undo request may have.
const MAX_BODY: usize = 4 * 1024;

/// The most audit records read to find the session's calls that had no undo.
const MAX_CALLS: u32 = 10_000;

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Asked {
    #[serde(default)]
    since: Option<Value>,
    #[serde(default)]
    dry_run: bool,
}

pub(super) async fn undo(shared: &ControlPlane, req: Request<Incoming>, id: &str) -> Reply {
    let asked: Asked = match super::read_optional_json(req, MAX_BODY).await {
        Ok(asked) => asked,
        Err(reply) => return reply,
    };
    let since_ms = match &asked.since {
        None => 0,
        Some(Value::Number(n)) => match n.as_i64() {
            Some(ms) => ms,
            None => return bad("since: a number must be whole epoch milliseconds"),
        },
        Some(Value::String(text)) => match super::parse_since(text) {
            Some(ms) => ms,
            None => {
                return bad(&format!(
                    "since {text:?}: expected epoch milliseconds, RFC 3339 or a duration (15m)"
                ))
            }
        },
        Some(_) => return bad("since: expected a string or a number"),
    };
    let mut report = match shared.undo.undo(id, since_ms, asked.dry_run).await {
        Ok(report) => report,
        Err(e) => {
            return ControlError::Proxy(ProxyError::StateUnavailable {
                component: "store",
                reason: e.to_string(),
            })
            .into()
        }
    };
    let journaled: HashSet<&str> = [
        &report.reversed,
        &report.failed,
        &report.refused,
        &report.unavailable,
        &report.already_reversed,
        &report.in_progress,
    ]
    .into_iter()
    .flatten()
    .map(|e| e.call.as_str())
    .collect();
    let (known, no_undo) = match calls_without_undo(shared, id, since_ms, &journaled).await {
        Ok(found) => found,
        Err(e) => {
            return ControlError::Proxy(ProxyError::StateUnavailable {
                component: "audit",
                reason: e,
            })
            .into()
        }
    };
    if journaled.is_empty() && !known {
        return ControlError::NotFound(format!(
            "session {id}: neither the undo journal nor the audit trail knows it"
        ))
        .into();
    }
    report.no_undo = no_undo;
    match serde_json::to_value(&report) {
        Ok(body) => Reply(StatusCode::OK, body),
        Err(e) => ControlError::Internal(format!("the report: {e}")).into(),
    }
}

fn bad(why: &str) -> Reply {
    ControlError::BadRequest(why.to_owned()).into()
}

/// Whether the trail knows the session at all, and its calls since `since_ms` that changed
/// something (an allowed tool call outside the read tier, answered with a 2xx) and that
/// the journal does not hold: tools that declare no undo. Newest first.
async fn calls_without_undo(
    shared: &ControlPlane,
    session: &str,
    since_ms: i64,
    journaled: &HashSet<&str>,
) -> Result<(bool, Vec<Value>), String> {
    // What the writer holds is on disk before it is read back.
    shared.audit.flush().await;
    let query = AuditQuery {
        session: Some(session.to_owned()),
        decision: None,
        since_ms: Some(since_ms),
        limit: Some(MAX_CALLS),
    };
    let lines = shared
        .trail
        .call(move |t| t.query(&query))
        .await
        .map_err(|e| e.to_string())?;
    let known = !lines.is_empty() || {
        // Nothing since then: is the session known at all?
        let ever = AuditQuery {
            session: Some(session.to_owned()),
            decision: None,
            since_ms: None,
            limit: Some(1),
        };
        let found = shared.trail.call(move |t| t.query(&ever)).await;
        !found.map_err(|e| e.to_string())?.is_empty()
    };
    let mut calls = Vec::new();
    for line in lines.iter().rev() {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let text = |k: &str| record.get(k).and_then(Value::as_str);
        let changed = matches!(text("kind"), Some("http" | "mcp_call"))
            && text("decision") == Some("allow")
            && text("tool").is_some()
            && !matches!(text("tier"), Some("read") | None)
            && record
                .get("status")
                .and_then(Value::as_u64)
                .is_none_or(|s| (200..300).contains(&s));
        let id = text("request_id").unwrap_or_default();
        if changed && !journaled.contains(id) {
            calls.push(json!({
                "call": id,
                "tool": text("tool"),
                "tier": text("tier"),
                "at_ms": record.get("ts_ms"),
            }));
        }
    }
    Ok((known, calls))
}
