//! The one place where outcomes become HTTP responses (linkerd's `errors/respond.rs`).
//!
//! Every response Ostiary itself produces carries `Ostiary-Request-Id` and a JSON body
//! `{"error", "message", "request_id", ...details}` as in docs/design.md §5. Nothing else in the
//! crate picks a status code for an error.

use http::header::{HeaderValue, CONTENT_TYPE, PROXY_AUTHENTICATE};
use http::{Response, StatusCode};
use serde_json::{json, Map, Value};

use crate::body::{full, ProxyBody};
use crate::error::ProxyError;
use crate::guardrails::meter::LimitHit;

/// Header carrying the request id on every response Ostiary produces.
pub const REQUEST_ID: &str = "ostiary-request-id";
/// Header naming an approval: on the 202 that holds a request, and on the agent's retry
/// that collects its outcome.
pub const APPROVAL: &str = "ostiary-approval";

/// Status and JSON body for a refusal or failure.
pub fn error(err: &ProxyError, request_id: &str) -> Response<ProxyBody> {
    if let ProxyError::McpRefused {
        replies,
        batch,
        follow_up,
    } = err
    {
        let errors = replies.iter().map(|r| match &r.error {
            ProxyError::ApprovalPending { approval_id, .. } if *follow_up => {
                crate::mcp::rounds::input_required(
                    &r.id,
                    approval_id,
                    error_body(&r.error, request_id),
                )
            }
            _ => jsonrpc_error(&r.id, &r.error, request_id),
        });
        let body = if *batch {
            Value::Array(errors.collect())
        } else {
            errors.into_iter().next().unwrap_or(Value::Null)
        };
        // 200: MCP clients read JSON-RPC errors only from a successful HTTP exchange; any
        // other status makes the SDKs fail the transport instead of the one call.
        return json_response(StatusCode::OK, &body, request_id);
    }
    let (status, _, _) = describe(err);
    let mut response = json_response(status, &error_body(err, request_id), request_id);
    if let ProxyError::ApprovalPending { approval_id, .. } = err {
        if let Ok(id) = HeaderValue::from_str(approval_id) {
            response.headers_mut().insert(APPROVAL, id);
        }
    }
    if let ProxyError::LimitExceeded(hit) = err {
        if let Some(secs) = hit.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
    }
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        response.headers_mut().insert(
            PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"ostiary\""),
        );
    }
    response
}

/// The status docs/design.md §5 gives `err` (for listeners that answer with their own envelope).
pub fn status(err: &ProxyError) -> StatusCode {
    describe(err).0
}

/// The JSON body of docs/design.md §5 for `err`: `{"error", "message", "request_id", ...details}`.
pub fn error_body(err: &ProxyError, request_id: &str) -> Value {
    let (_, message, details) = describe(err);
    let mut body = Map::new();
    body.insert("error".into(), json!(err.kind()));
    body.insert("message".into(), json!(message));
    body.insert("request_id".into(), json!(request_id));
    if let Value::Object(extra) = details {
        body.extend(extra);
    }
    Value::Object(body)
}

/// JSON-RPC error code of a refused MCP call held for approval (docs/design.md §5).
pub const JSONRPC_APPROVAL_PENDING: i64 = -32002;
/// JSON-RPC error code of a refused MCP call: denials, limits and failed checks.
pub const JSONRPC_REFUSED: i64 = -32001;

/// A refused MCP call as a JSON-RPC error response with the call's `id`; `data` is the
/// same body an HTTP refusal carries, so agents read one shape either way.
pub fn jsonrpc_error(id: &Value, err: &ProxyError, request_id: &str) -> Value {
    let code = match err {
        ProxyError::ApprovalRequired { .. } | ProxyError::ApprovalPending { .. } => {
            JSONRPC_APPROVAL_PENDING
        }
        _ => JSONRPC_REFUSED,
    };
    let data = error_body(err, request_id);
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": data["message"].clone(), "data": data },
    })
}

/// A JSON response of Ostiary's own (control API and errors).
pub fn json_response(status: StatusCode, body: &Value, request_id: &str) -> Response<ProxyBody> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(id) = HeaderValue::from_str(request_id) {
        headers.insert(REQUEST_ID, id);
    }
    response
}

/// A response's status, message and details (docs/design.md §5).
type Described = (StatusCode, String, Value);

/// Routes each variant to its family's mapping. The match is exhaustive, so a new variant
/// cannot go undescribed; a family's own match ends in [`misrouted`].
fn describe(err: &ProxyError) -> Described {
    match err {
        ProxyError::Unauthenticated { .. }
        | ProxyError::BadRequest { .. }
        | ProxyError::HeadersTooLarge
        | ProxyError::BodyTooLarge { .. }
        | ProxyError::LimitExceeded(_)
        | ProxyError::SessionPaused { .. }
        | ProxyError::IdempotencyMismatch { .. }
        | ProxyError::IdempotencyConflict { .. }
        | ProxyError::CheckFailed { .. }
        | ProxyError::Misdirected { .. } => request(err),
        ProxyError::Denied { .. }
        | ProxyError::ApprovalRequired { .. }
        | ProxyError::ApprovalPending { .. }
        | ProxyError::ApprovalDenied { .. }
        | ProxyError::ApprovalExpired { .. }
        | ProxyError::ApprovalNotExecuted { .. }
        | ProxyError::ApprovalMismatch { .. }
        | ProxyError::ApprovalBodyTooLarge { .. } => decision(err),
        ProxyError::DestinationBlocked { .. }
        | ProxyError::PlaceholderExfiltration { .. }
        | ProxyError::PlaceholderForeign { .. }
        | ProxyError::CredentialRefused { .. }
        | ProxyError::CredentialUnavailable { .. } => egress(err),
        ProxyError::Upstream { .. }
        | ProxyError::UpstreamTimeout { .. }
        | ProxyError::Internal { .. }
        | ProxyError::AuditUnavailable { .. }
        | ProxyError::NotServed { .. }
        | ProxyError::StateUnavailable { .. }
        | ProxyError::McpRefused { .. } => failure(err),
    }
}

/// What the agent sent, or its session's state, refuses the request.
fn request(err: &ProxyError) -> Described {
    match err {
        ProxyError::Unauthenticated { reason } => (
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "A valid Ostiary session token is required in Proxy-Authorization.".into(),
            json!({ "reason": reason }),
        ),
        ProxyError::BadRequest { reason } => (
            StatusCode::BAD_REQUEST,
            format!("The request is malformed: {reason}."),
            json!({ "reason": reason }),
        ),
        ProxyError::HeadersTooLarge => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "The request head is larger than this proxy accepts.".into(),
            json!({ "reason": "header_too_large" }),
        ),
        ProxyError::BodyTooLarge { limit } => (
            StatusCode::BAD_REQUEST,
            format!(
                "The request body is larger than the {limit} bytes this proxy reads to decide a \
                 tool call."
            ),
            json!({ "reason": "body_too_large", "limit": limit }),
        ),
        ProxyError::LimitExceeded(hit) => {
            let LimitHit {
                limit,
                used,
                max,
                retry_after,
            } = &**hit;
            (
                StatusCode::TOO_MANY_REQUESTS,
                match retry_after {
                    Some(secs) => format!(
                    "The session reached its {limit} limit ({used} of {max}); retry in {secs} s."
                ),
                    None => format!(
                        "The session reached its {limit} limit ({used} of {max}); it does not \
                     refill by itself."
                    ),
                },
                json!({ "limit": limit, "used": used, "max": max, "retry_after": retry_after }),
            )
        }
        ProxyError::SessionPaused { reason } => (
            StatusCode::LOCKED,
            format!("The session is paused until a human resumes or terminates it: {reason}."),
            json!({ "reason": reason }),
        ),
        ProxyError::IdempotencyMismatch { key } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            "This Idempotency-Key was already used for a different request in this session.".into(),
            json!({ "key": key }),
        ),
        ProxyError::IdempotencyConflict { key, reason } => (
            StatusCode::CONFLICT,
            format!("This Idempotency-Key cannot be run again: {reason}."),
            json!({ "key": key, "reason": reason }),
        ),
        ProxyError::CheckFailed { check, detail } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("The request failed the {check} check: {detail}."),
            json!({ "check": check, "detail": detail }),
        ),
        ProxyError::Misdirected { tunnel, host } => (
            StatusCode::MISDIRECTED_REQUEST,
            format!("This tunnel was opened to {tunnel}; a request for {host} must use its own."),
            json!({ "tunnel": tunnel, "host": host }),
        ),
        other => misrouted(other),
    }
}

/// A policy's or a human's decision refuses or holds the request.
fn decision(err: &ProxyError) -> Described {
    match err {
        ProxyError::Denied {
            policies,
            action,
            resource,
            reason,
        } => (
            StatusCode::FORBIDDEN,
            format!("Denied by policy: {reason}."),
            json!({ "policies": policies, "action": action, "resource": resource }),
        ),
        ProxyError::ApprovalRequired {
            policies,
            action,
            resource,
        } => (
            StatusCode::FORBIDDEN,
            format!(
                "This request needs a human's approval (policies: {}).",
                policies.join(", ")
            ),
            json!({ "policies": policies, "action": action, "resource": resource }),
        ),
        ProxyError::ApprovalPending {
            approval_id,
            status_url,
            expires_at,
            status,
        } => (
            StatusCode::ACCEPTED,
            format!(
                "This request is held for a human's approval ({approval_id}). Re-send it with \
                 Ostiary-Approval: {approval_id} (add Prefer: wait=<seconds> to wait) or poll \
                 the status URL to get the outcome."
            ),
            json!({
                "approval_id": approval_id,
                "status_url": status_url,
                "expires_at": expires_at,
                "status": status,
            }),
        ),
        ProxyError::ApprovalDenied {
            approval_id,
            approver,
            reason,
        } => (
            StatusCode::FORBIDDEN,
            format!("The approver {approver} denied this request."),
            json!({ "approval_id": approval_id, "approver": approver, "reason": reason }),
        ),
        ProxyError::ApprovalExpired { approval_id } => (
            StatusCode::FORBIDDEN,
            "Nobody approved this request before its deadline; it was not executed.".into(),
            json!({ "approval_id": approval_id, "approver": null }),
        ),
        ProxyError::ApprovalNotExecuted {
            approval_id,
            status,
            reason,
        } => (
            if *status == "failed" {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::FORBIDDEN
            },
            format!("The request was approved but not executed: {reason}."),
            json!({ "approval_id": approval_id, "status": status, "reason": reason, "policies": [] }),
        ),
        ProxyError::ApprovalMismatch {
            approval_id,
            reason,
        } => (
            StatusCode::BAD_REQUEST,
            match *reason {
                "approval_mismatch" => format!(
                    "Approval {approval_id} was given for a different request (method, URL or \
                     body differ)."
                ),
                _ => format!("No approval {approval_id} belongs to this session."),
            },
            json!({ "approval_id": approval_id, "reason": reason }),
        ),
        ProxyError::ApprovalBodyTooLarge { limit } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "This request needs approval, and its body is larger than the {limit} bytes an \
                 approval can hold."
            ),
            json!({ "reason": "approval_body_too_large", "limit": limit }),
        ),
        other => misrouted(other),
    }
}

/// Where the request would go, or the credential it would carry, refuses it.
fn egress(err: &ProxyError) -> Described {
    match err {
        ProxyError::DestinationBlocked { address, reason } => (
            StatusCode::FORBIDDEN,
            format!("The destination {address} may not be reached ({reason})."),
            json!({ "address": address, "reason": reason }),
        ),
        ProxyError::PlaceholderExfiltration {
            credential,
            host,
            at,
            point,
        } => (
            StatusCode::FORBIDDEN,
            match point {
                None => format!(
                    "The placeholder of credential {credential} may only be sent to its own \
                     hosts, not to {host}; this attempt is recorded."
                ),
                Some(point) => format!(
                    "The placeholder of credential {credential} may only stand in its {point}, \
                     where the proxy writes the credential; it was found in the {at}. This \
                     attempt is recorded."
                ),
            },
            json!({ "policies": [], "reason": "placeholder_exfiltration", "credential": credential, "host": host, "at": at, "point": point }),
        ),
        ProxyError::PlaceholderForeign { credential } => (
            StatusCode::FORBIDDEN,
            format!(
                "This placeholder of credential {credential} belongs to another session: a \
                 session uses its own placeholders (a child inherits none of its parent's \
                 credentials); this attempt is recorded."
            ),
            json!({ "policies": [], "reason": "placeholder_of_another_session", "credential": credential }),
        ),
        ProxyError::CredentialRefused { credential, reason } => (
            StatusCode::FORBIDDEN,
            match *reason {
                "credential_needs_tls" => format!(
                    "This host's credential {credential} is only sent over https with a \
                     verified certificate; use https."
                ),
                _ => format!(
                    "This host's credential {credential} is not sent on a WebSocket upgrade: \
                     its frames cannot be scrubbed."
                ),
            },
            json!({ "policies": [], "reason": reason, "credential": credential }),
        ),
        ProxyError::CredentialUnavailable { credential, cause } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "The credential {credential} for this host is unavailable ({cause}); nothing was \
                 sent upstream."
            ),
            json!({ "credential": credential, "reason": cause }),
        ),
        other => misrouted(other),
    }
}

/// The upstream or the proxy itself failed; nothing of the agent's is at fault.
fn failure(err: &ProxyError) -> Described {
    match err {
        ProxyError::Upstream { reason } => (
            StatusCode::BAD_GATEWAY,
            format!("The upstream failed: {reason}."),
            json!({ "reason": reason }),
        ),
        ProxyError::UpstreamTimeout { reason } => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("The upstream did not answer in time: {reason}."),
            json!({ "reason": reason }),
        ),
        ProxyError::Internal { .. } => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Ostiary failed to handle this request; the audit record has the details.".into(),
            json!({}),
        ),
        // No reason for the agent: what failed on the proxy's disk is the operator's to know
        // (`/readyz` on the control listener names it).
        ProxyError::AuditUnavailable { .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            "Ostiary cannot write its audit trail, so it forwards nothing until it can; nothing \
             was sent upstream. Retry later."
                .into(),
            json!({}),
        ),
        // The component, not the reason: which address failed is the operator's to know.
        ProxyError::NotServed { status, reason } => (
            StatusCode::from_u16(*status).unwrap_or(StatusCode::NOT_FOUND),
            format!("{reason}."),
            json!({ "reason": reason }),
        ),
        ProxyError::StateUnavailable { component, .. } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Ostiary cannot reach its shared state ({component}), which this request's \
                 limits are counted in, so it refuses rather than guess; nothing was sent \
                 upstream. Retry later."
            ),
            json!({ "component": component }),
        ),
        // Answered by `error` before `describe` is asked; described by its first refusal
        // for any other caller.
        ProxyError::McpRefused { replies, .. } => match replies.first() {
            Some(first) => {
                let (_, message, details) = describe(&first.error);
                (StatusCode::OK, message, details)
            }
            None => (
                StatusCode::OK,
                "The MCP calls were refused.".into(),
                json!({}),
            ),
        },
        other => misrouted(other),
    }
}

/// A variant routed to a family that does not map it: a 500 rather than a panic on the
/// response path (the routing and the families are one file apart, and tests cover each).
fn misrouted(err: &ProxyError) -> Described {
    tracing::error!(
        kind = err.kind(),
        "respond: a refusal was routed to the wrong family"
    );
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "Ostiary failed to handle this request; the audit record has the details.".into(),
        json!({}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_json(response: Response<ProxyBody>) -> Value {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn denied_carries_policies_and_request_id() {
        let err = ProxyError::Denied {
            policies: vec!["p1".into()],
            action: "Ostiary::Action::\"http\"".into(),
            resource: "Ostiary::Host::\"x\"".into(),
            reason: "a policy forbids this request".into(),
        };
        let response = error(&err, "abc");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert_eq!(response.headers()[REQUEST_ID], "abc");
        let body = body_json(response).await;
        assert_eq!(body["error"], "denied");
        assert_eq!(body["request_id"], "abc");
        assert_eq!(body["policies"], json!(["p1"]));
    }

    #[tokio::test]
    async fn approval_required_is_a_403_with_its_own_kind() {
        let err = ProxyError::ApprovalRequired {
            policies: vec!["irreversible-needs-human".into()],
            action: "Ostiary::Action::\"tool:files.delete\"".into(),
            resource: "Ostiary::Tool::\"files.delete\"".into(),
        };
        assert_eq!(err.audit_decision(), "deny");
        let response = error(&err, "r");
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let body = body_json(response).await;
        assert_eq!(body["error"], "approval_required");
        assert_eq!(body["policies"], json!(["irreversible-needs-human"]));
        assert_eq!(body["action"], "Ostiary::Action::\"tool:files.delete\"");
        assert_eq!(body["resource"], "Ostiary::Tool::\"files.delete\"");
    }

    #[tokio::test]
    async fn check_failed_is_a_422_naming_the_check() {
        let err = ProxyError::CheckFailed {
            check: "args_schema".into(),
            detail: "args.title: expected a string, got a number".into(),
        };
        assert_eq!(err.audit_decision(), "deny");
        let response = error(&err, "r");
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body = body_json(response).await;
        assert_eq!(body["error"], "check_failed");
        assert_eq!(body["check"], "args_schema");
        assert_eq!(
            body["detail"],
            "args.title: expected a string, got a number"
        );
    }

    #[tokio::test]
    async fn body_too_large_is_a_bad_request_with_its_reason() {
        let response = error(&ProxyError::BodyTooLarge { limit: 10 }, "r");
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = body_json(response).await;
        assert_eq!(body["error"], "bad_request");
        assert_eq!(body["reason"], "body_too_large");
        assert_eq!(body["limit"], 10);
    }

    fn x() -> String {
        "x".to_owned()
    }

    /// One of each variant `request` maps, and its status.
    fn request_cases() -> Vec<(ProxyError, u16)> {
        let hit = crate::guardrails::meter::LimitHit {
            limit: "calls".into(),
            used: json!(3),
            max: json!(3),
            retry_after: None,
        };
        vec![
            (ProxyError::Unauthenticated { reason: x() }, 407),
            (ProxyError::BadRequest { reason: x() }, 400),
            (ProxyError::HeadersTooLarge, 431),
            (ProxyError::BodyTooLarge { limit: 1 }, 400),
            (ProxyError::LimitExceeded(Box::new(hit)), 429),
            (ProxyError::SessionPaused { reason: x() }, 423),
            (ProxyError::IdempotencyMismatch { key: x() }, 422),
            (
                ProxyError::IdempotencyConflict {
                    key: x(),
                    reason: "running",
                },
                409,
            ),
            (
                ProxyError::CheckFailed {
                    check: x(),
                    detail: x(),
                },
                422,
            ),
            (
                ProxyError::Misdirected {
                    tunnel: x(),
                    host: x(),
                },
                421,
            ),
        ]
    }

    /// One of each variant `decision` maps, and its status.
    fn decision_cases() -> Vec<(ProxyError, u16)> {
        vec![
            (
                ProxyError::Denied {
                    policies: vec![],
                    action: x(),
                    resource: x(),
                    reason: x(),
                },
                403,
            ),
            (
                ProxyError::ApprovalRequired {
                    policies: vec![],
                    action: x(),
                    resource: x(),
                },
                403,
            ),
            (
                ProxyError::ApprovalPending {
                    approval_id: x(),
                    status_url: x(),
                    expires_at: x(),
                    status: "pending",
                },
                202,
            ),
            (
                ProxyError::ApprovalDenied {
                    approval_id: x(),
                    approver: x(),
                    reason: None,
                },
                403,
            ),
            (ProxyError::ApprovalExpired { approval_id: x() }, 403),
            (
                ProxyError::ApprovalNotExecuted {
                    approval_id: x(),
                    status: "failed",
                    reason: x(),
                },
                502,
            ),
            (
                ProxyError::ApprovalMismatch {
                    approval_id: x(),
                    reason: "approval_mismatch",
                },
                400,
            ),
            (ProxyError::ApprovalBodyTooLarge { limit: 1 }, 413),
        ]
    }

    /// One of each variant `egress` maps, and its status.
    fn egress_cases() -> Vec<(ProxyError, u16)> {
        vec![
            (
                ProxyError::DestinationBlocked {
                    address: x(),
                    reason: x(),
                },
                403,
            ),
            (
                ProxyError::PlaceholderExfiltration {
                    credential: x(),
                    host: x(),
                    at: x(),
                    point: None,
                },
                403,
            ),
            (ProxyError::PlaceholderForeign { credential: x() }, 403),
            (
                ProxyError::CredentialRefused {
                    credential: x(),
                    reason: "credential_needs_tls",
                },
                403,
            ),
            (
                ProxyError::CredentialUnavailable {
                    credential: x(),
                    cause: x(),
                },
                503,
            ),
        ]
    }

    /// One of each variant `failure` maps but `Internal`, and its status.
    fn failure_cases() -> Vec<(ProxyError, u16)> {
        vec![
            (ProxyError::Upstream { reason: x() }, 502),
            (ProxyError::UpstreamTimeout { reason: x() }, 504),
            (ProxyError::AuditUnavailable { reason: x() }, 503),
            (
                ProxyError::NotServed {
                    status: 405,
                    reason: x(),
                },
                405,
            ),
            (
                ProxyError::StateUnavailable {
                    component: "redis",
                    reason: x(),
                },
                503,
            ),
            (
                ProxyError::McpRefused {
                    replies: vec![],
                    batch: false,
                    follow_up: false,
                },
                200,
            ),
        ]
    }

    /// One of each variant and the status docs/design.md §5 gives it: a variant the routing
    /// in `describe` sends to the wrong family would answer 500 with `misrouted`'s message.
    #[test]
    fn every_variant_is_described_by_its_family() {
        let misrouted = misrouted(&ProxyError::Internal { reason: x() }).1;
        let cases = [
            request_cases(),
            decision_cases(),
            egress_cases(),
            failure_cases(),
        ];
        for (err, want) in cases.into_iter().flatten() {
            let (status, message, _) = describe(&err);
            assert_eq!(status.as_u16(), want, "{err:?}");
            assert_ne!(message, misrouted, "{err:?} was misrouted");
        }
        let (status, _, details) = describe(&ProxyError::Internal { reason: x() });
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            details,
            json!({}),
            "an internal error's reason stays in the record"
        );
    }

    #[tokio::test]
    async fn unauthenticated_asks_for_basic() {
        let response = error(&ProxyError::unauthenticated("missing"), "r");
        assert_eq!(response.status(), StatusCode::PROXY_AUTHENTICATION_REQUIRED);
        assert_eq!(
            response.headers()[PROXY_AUTHENTICATE],
            "Basic realm=\"ostiary\""
        );
        assert_eq!(body_json(response).await["reason"], "missing");
    }
}
