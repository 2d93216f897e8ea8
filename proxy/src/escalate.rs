//! Phase `escalate`: a request policy would allow with a human's approval is held in the
//! approval queue (202 `approval_pending`), and the agent collects the outcome later.
//!
//! Three entry points, all on the proxy listener:
//! - [`hold`] — after `evaluate` escalated: store the request (without the agent's
//!   credentials), owe notifications, answer 202 with `Ostiary-Approval: <id>`. Holds are
//!   bounded: the same request (fingerprint: method, URL, body digest) of the same session
//!   joins its pending approval (same id, nobody notified again), and past the session's
//!   `max_pending_approvals` — counted in the store, for its whole session tree — the hold
//!   is refused `429 limit_exceeded` (`limit: "approvals"`).
//! - [`redeem`] — the agent re-sends the same request with `Ostiary-Approval: <id>`: the
//!   fingerprint (method, URL, body digest) must match and the approval must be this
//!   session's; the answer is the stored upstream response once executed, the refusal if
//!   denied or expired, or 202 again while it waits (`Prefer: wait=<s>` blocks up to `s`).
//! - [`status`] — `GET /v1/approvals/<id>` on the proxy listener (the `status_url`): the
//!   same facts as JSON, for the session that made the request. The control listener stays
//!   unreachable through the proxy; this is the agent's only window on the queue.

use std::time::Duration;

use http::header::{HeaderValue, AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION};
use http::{HeaderMap, Request, Response, StatusCode};
use ostiary_policies::Action;
use serde_json::json;

use crate::approvals::model::digest;
use crate::approvals::model::Ask;
use crate::approvals::store::{Admission, CapReached};
use crate::approvals::{Approval, HeldRequest, Observed, Status};
use crate::body::{self, ProxyBody};
use crate::classify::Target;
use crate::error::{McpRefusal, ProxyError};
use crate::guardrails::meter::LimitHit;
use crate::plane::DataPlane;
use crate::recognise;
use crate::respond::{self, APPROVAL};
use crate::session::Principal;
use crate::store::now_ms;

/// Headers never stored with a held request: the agent's own credentials (the broker's are
/// injected at execution) and anything addressed to the proxy.
fn storable(name: &str) -> bool {
    !(name == AUTHORIZATION.as_str()
        || name == COOKIE.as_str()
        || name.starts_with("proxy-")
        || name == APPROVAL
        || name == "prefer"
        || name == "host"
        || name == "content-length"
        || name == "transfer-encoding"
        || name == "connection"
        || name == "keep-alive"
        || name == "te"
        || name == "upgrade")
}

/// Hold an escalated tool call. Returns the 202 refusal the pipeline answers with.
#[allow(clippy::too_many_arguments)]
pub async fn hold(
    plane: &DataPlane,
    principal: &Principal,
    target: &Target,
    req: &mut Request<ProxyBody>,
    policies: Vec<String>,
    action: Action,
    tier: Option<String>,
    request_id: &str,
    policy_version: Option<String>,
) -> Result<(String, ProxyError), ProxyError> {
    let config = &plane.config.approvals;
    let body = match recognise::read_body(req, config.max_body_bytes).await {
        Err(ProxyError::BodyTooLarge { limit }) => {
            return Err(ProxyError::ApprovalBodyTooLarge { limit })
        }
        other => other?,
    };
    let held = Held {
        policies,
        action,
        tier,
        rpc_id: None,
        policy_version,
    };
    hold_body(
        plane,
        principal,
        target,
        req.headers(),
        &body,
        held,
        request_id,
    )
    .await
}

/// What policy decided about a request to be held.
#[derive(Debug)]
pub struct Held {
    pub policies: Vec<String>,
    pub action: Action,
    pub tier: Option<String>,
    /// The JSON-RPC id of an MCP `tools/call` (its body is that one call).
    pub rpc_id: Option<serde_json::Value>,
    /// The version of the policy set that escalated it (the approval's held version).
    pub policy_version: Option<String>,
}

/// Hold a request whose body is in hand (an MCP call taken out of its batch).
pub async fn hold_body(
    plane: &DataPlane,
    principal: &Principal,
    target: &Target,
    headers: &HeaderMap,
    body: &[u8],
    held: Held,
    request_id: &str,
) -> Result<(String, ProxyError), ProxyError> {
    let config = &plane.config.approvals;
    if body.len() > config.max_body_bytes {
        return Err(ProxyError::ApprovalBodyTooLarge {
            limit: config.max_body_bytes,
        });
    }
    let Held {
        policies,
        action,
        tier,
        rpc_id,
        policy_version,
    } = held;
    let url = target.upstream_uri()?.to_string();
    let headers = headers
        .iter()
        .filter(|(name, _)| storable(name.as_str()))
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let fingerprint = fingerprint(target.method.as_str(), &url, body, rpc_id.is_some());
    let mut observed = observe(target, &action, tier);
    observed.rpc_id = rpc_id;
    let mut approval = crate::approvals::model::pending(
        config,
        Ask {
            principal,
            request_id: request_id.to_owned(),
            policies,
            policy_generation: plane.policies.generation(),
            request: HeldRequest {
                method: target.method.to_string(),
                url,
                headers,
                body_digest: digest(body),
                body: body.to_vec(),
            },
            observed,
        },
        now_ms(),
    );
    approval.held_policy_version = policy_version;
    let admission = plane
        .approvals
        .hold_bounded(
            approval.clone(),
            fingerprint,
            plane.config.sessions.max_pending_approvals,
        )
        .await
        .map_err(|e| ProxyError::Internal {
            reason: format!("storing the approval: {e}"),
        })?;
    let approval = match admission {
        Admission::Held => {
            tracing::info!(approval = %approval.id, tool = ?approval.observed.tool, "request held for approval");
            approval
        }
        Admission::Joined(existing) => {
            tracing::info!(approval = %existing.id, "an identical request joined a pending approval");
            *existing
        }
        Admission::Full(full) => return Err(cap_reached(principal, full)),
    };
    Ok((approval.id.clone(), pending(plane, &approval)))
}

/// What makes two holds the same request: method, URL and body digest — for an MCP call
/// the call as asked ([`crate::mcp::rounds::as_asked`]), since clients number their
/// requests afresh.
fn fingerprint(method: &str, url: &str, body: &[u8], mcp: bool) -> String {
    let body_digest = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(message) if mcp => digest(
            crate::mcp::rounds::as_asked(&message)
                .to_string()
                .as_bytes(),
        ),
        _ => digest(body),
    };
    // Length-prefixed, so no choice of URL can make two different triples one text.
    digest(format!("{}:{method}{}:{url}{body_digest}", method.len(), url.len()).as_bytes())
}

/// The refusal of a hold past a cap: `429 limit_exceeded`, `limit: "approvals"`.
/// `retry_after` is when the first counted hold reaches its deadline (a slot is free by
/// then whatever the approvers do); a decision frees one sooner.
fn cap_reached(principal: &Principal, full: CapReached) -> ProxyError {
    let retry_after = full
        .frees_at_ms
        .map(|at| ((at - now_ms()).max(0) as u64).div_ceil(1000).max(1));
    if full.session != principal.session_id {
        tracing::info!(session = %principal.session_id, ancestor = %full.session, "hold refused: an ancestor's cap of pending approvals is reached");
    }
    ProxyError::LimitExceeded(Box::new(LimitHit {
        limit: "approvals".into(),
        used: json!(full.used),
        max: json!(full.max),
        retry_after,
    }))
}

/// What the approver is shown: the proxy's own reading of the request.
fn observe(target: &Target, action: &Action, tier: Option<String>) -> Observed {
    let mut observed = Observed {
        host: target.host.to_string(),
        port: target.port,
        scheme: target.scheme.to_owned(),
        action: action.uid_text(),
        tier,
        ..Default::default()
    };
    if let Action::Tool {
        name,
        args,
        impact_records,
        cost_micros,
        ..
    } = action
    {
        observed.resource = format!("Ostiary::Tool::{name:?}");
        observed.tool = Some(name.clone());
        observed.args_hash = serde_json::to_vec(args).ok().map(|b| digest(&b));
        observed.args = Some(args.clone());
        observed.records = Some(*impact_records);
        observed.cost = Some(*cost_micros as f64 / 1_000_000.0);
    } else {
        observed.resource = format!("Ostiary::Host::{:?}", observed.host);
    }
    observed
}

/// The 202 for an approval still waiting (or approved and not yet executed).
fn pending(plane: &DataPlane, approval: &Approval) -> ProxyError {
    ProxyError::ApprovalPending {
        approval_id: approval.id.clone(),
        status_url: status_url(plane, &approval.id),
        expires_at: rfc3339(approval.deadline_ms),
        status: approval.status.as_str(),
    }
}

fn status_url(plane: &DataPlane, id: &str) -> String {
    format!("http://{}/v1/approvals/{id}", plane.proxy_addr())
}

fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `Prefer: wait=<seconds>` (RFC 7240), capped by the caller.
pub fn prefer_wait(headers: &HeaderMap) -> Duration {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .filter_map(|p| p.trim().strip_prefix("wait="))
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .next()
        .map(Duration::from_secs)
        .unwrap_or(Duration::ZERO)
}

/// The `Ostiary-Approval` header of a retry, if any.
pub fn approval_header(headers: &HeaderMap) -> Option<Result<String, ProxyError>> {
    let value = headers.get(APPROVAL)?;
    Some(
        value
            .to_str()
            .ok()
            .filter(|v| v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .map(str::to_owned)
            .ok_or_else(|| ProxyError::bad_request("Ostiary-Approval is not an approval id")),
    )
}

/// Collect the outcome of approval `id` for a retry of the held request. `None`: the
/// request is not a collection after all (another message of an MCP session that carries
/// the header throughout) and goes through the pipeline as usual.
pub async fn redeem(
    plane: &DataPlane,
    principal: &Principal,
    target: &Target,
    req: &mut Request<ProxyBody>,
    id: &str,
) -> Result<Option<Response<ProxyBody>>, ProxyError> {
    let mismatch = |reason| ProxyError::ApprovalMismatch {
        approval_id: id.to_owned(),
        reason,
    };
    let approval = lookup(plane, principal, id).await?;
    let body = match recognise::read_body(req, plane.config.approvals.max_body_bytes).await {
        Err(ProxyError::BodyTooLarge { .. }) => return Err(mismatch("approval_mismatch")),
        other => other?,
    };
    let url = target.upstream_uri()?.to_string();
    // An MCP call is answered as MCP clients expect: JSON-RPC, under the retry's own id.
    let rpc = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .filter(|m| m.get("method").and_then(|v| v.as_str()) == Some("tools/call"))
        .and_then(|m| Some((m.get("id")?.clone(), m)));
    let follow_up = crate::mcp::rounds::follows_up(req.headers());
    let as_mcp = |err: ProxyError| match &rpc {
        Some((rpc_id, _)) => ProxyError::McpRefused {
            replies: vec![McpRefusal {
                id: rpc_id.clone(),
                error: err,
            }],
            batch: false,
            follow_up,
        },
        None => err,
    };
    let Some(approval) = approval else {
        return Err(as_mcp(mismatch("approval_unknown")));
    };
    // An MCP client sets headers per session, not per call: the header rides along on
    // `initialize`, notifications and the like, which are not collections. They go on as
    // usual, body restored and header dropped.
    if approval.observed.rpc_id.is_some() && rpc.is_none() {
        *req.body_mut() = body::full(body);
        req.headers_mut().remove(APPROVAL);
        return Ok(None);
    }
    let same = approval.request.method == target.method.as_str()
        && approval.request.url == url
        && match (&approval.observed.rpc_id, &rpc) {
            // A client numbers its requests afresh: the call is compared without its id.
            (Some(_), Some((_, message))) => serde_json::from_slice::<serde_json::Value>(
                &approval.request.body,
            )
            .is_ok_and(|held| {
                crate::mcp::rounds::as_asked(&held) == crate::mcp::rounds::as_asked(message)
            }),
            (Some(_), None) => false,
            (None, _) => approval.request.body_digest == digest(&body),
        };
    if !same {
        return Err(as_mcp(mismatch("approval_mismatch")));
    }
    let wait = prefer_wait(req.headers());
    let approval = if approval.status.is_final() || wait.is_zero() {
        approval
    } else {
        plane
            .approvals
            .wait(id, wait)
            .await
            .map_err(internal)?
            .unwrap_or(approval)
    };
    match (&approval.observed.rpc_id, rpc) {
        (Some(_), Some((rpc_id, _))) => match outcome(plane, approval) {
            Ok(response) => Ok(Some(with_rpc_id(response, &rpc_id).await)),
            Err(err) => Err(ProxyError::McpRefused {
                replies: vec![McpRefusal {
                    id: rpc_id,
                    error: err,
                }],
                batch: false,
                follow_up,
            }),
        },
        _ => outcome(plane, approval).map(Some),
    }
}

/// The stored JSON-RPC answer, under the id of the retry that collects it.
async fn with_rpc_id(
    response: Response<ProxyBody>,
    rpc_id: &serde_json::Value,
) -> Response<ProxyBody> {
    use http_body_util::BodyExt;
    let (mut parts, stored) = response.into_parts();
    let bytes = match stored.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Response::from_parts(parts, body::empty()),
    };
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(mut message) if message.is_object() => {
            message["id"] = rpc_id.clone();
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, body::full(message.to_string()))
        }
        _ => Response::from_parts(parts, body::full(bytes)),
    }
}

/// What the agent gets for an approval as it stands.
fn outcome(plane: &DataPlane, approval: Approval) -> Result<Response<ProxyBody>, ProxyError> {
    match approval.status {
        Status::Pending | Status::Approved | Status::Executing => Err(pending(plane, &approval)),
        Status::Executed => {
            let stored = approval.result.ok_or_else(|| ProxyError::Internal {
                reason: "an executed approval has no stored response".into(),
            })?;
            let mut response = Response::new(body::full(stored.body));
            *response.status_mut() =
                StatusCode::from_u16(stored.status).unwrap_or(StatusCode::BAD_GATEWAY);
            for (name, value) in &stored.headers {
                if let (Ok(n), Ok(v)) = (
                    http::header::HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    response.headers_mut().append(n, v);
                }
            }
            if let Ok(v) = HeaderValue::from_str(&approval.id) {
                response.headers_mut().insert(APPROVAL, v);
            }
            if stored.truncated {
                response
                    .headers_mut()
                    .insert("ostiary-truncated", HeaderValue::from_static("true"));
            }
            Ok(response)
        }
        Status::Denied => Err(ProxyError::ApprovalDenied {
            approval_id: approval.id,
            approver: approval.approver.unwrap_or_default(),
            reason: approval.reason,
        }),
        Status::Expired => Err(ProxyError::ApprovalExpired {
            approval_id: approval.id,
        }),
        Status::Refused | Status::Failed => Err(ProxyError::ApprovalNotExecuted {
            approval_id: approval.id,
            status: approval.status.as_str(),
            reason: approval.reason.unwrap_or_default(),
        }),
    }
}

/// This session's approval `id`; another session's is as unknown as a missing one.
async fn lookup(
    plane: &DataPlane,
    principal: &Principal,
    id: &str,
) -> Result<Option<Approval>, ProxyError> {
    let approval = plane.approvals.get(id).await.map_err(internal)?;
    Ok(approval.filter(|a| a.session == principal.session_id))
}

fn internal(e: crate::store::StoreError) -> ProxyError {
    ProxyError::Internal {
        reason: format!("approval store: {e}"),
    }
}

/// Whether a request on the proxy listener is the agent asking for an approval's status:
/// `GET /v1/approvals/<id>`, origin-form (sent directly) or absolute-form naming the
/// proxy's own address (sent through it). Returns the id.
pub fn status_request<B>(plane: &DataPlane, req: &Request<B>) -> Option<String> {
    let uri = req.uri();
    let own = match uri.authority() {
        None => uri.scheme().is_none(),
        Some(authority) => {
            uri.scheme_str() == Some("http")
                && authority
                    .as_str()
                    .parse::<std::net::SocketAddr>()
                    .is_ok_and(|a| a == plane.proxy_addr())
        }
    };
    if !own {
        return None;
    }
    let id = uri.path().strip_prefix("/v1/approvals/")?;
    (!id.is_empty() && !id.contains('/')).then(|| id.to_owned())
}

/// Answer `GET /v1/approvals/<id>` for the agent. Authenticated like any proxy request
/// (`Proxy-Authorization`), or with `Authorization: Bearer <session token>` when the agent
/// calls the proxy directly (clients skip the proxy for its own address).
pub async fn status(
    plane: &DataPlane,
    req: Request<hyper::body::Incoming>,
    id: &str,
    request_id: &str,
) -> Result<Response<ProxyBody>, ProxyError> {
    if req.method() != http::Method::GET {
        return Err(ProxyError::bad_request("approval status is read with GET"));
    }
    let mut headers = req.headers().clone();
    if !headers.contains_key(PROXY_AUTHORIZATION) {
        if let Some(v) = headers.get(AUTHORIZATION).cloned() {
            headers.insert(PROXY_AUTHORIZATION, v);
        }
    }
    let principal = crate::authenticate::principal(&plane.sessions, &headers).await?;
    let wait = prefer_wait(req.headers());
    let found = lookup(plane, &principal, id).await?;
    let Some(found) = found else {
        return Err(ProxyError::ApprovalMismatch {
            approval_id: id.to_owned(),
            reason: "approval_unknown",
        });
    };
    let approval = if found.status.is_final() || wait.is_zero() {
        found
    } else {
        plane
            .approvals
            .wait(id, wait)
            .await
            .map_err(internal)?
            .unwrap_or(found)
    };
    Ok(respond::json_response(
        StatusCode::OK,
        &view(plane, &approval),
        request_id,
    ))
}

/// An approval as the agent may see it (no other approvers' links, no headers).
pub fn view(plane: &DataPlane, a: &Approval) -> serde_json::Value {
    let response = a.result.as_ref().map(|r| {
        let mut out = json!({
            "status": r.status,
            "headers": r.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
            "truncated": r.truncated,
        });
        match std::str::from_utf8(&r.body) {
            Ok(text) => out["body"] = json!(text),
            Err(_) => {
                use base64::Engine;
                out["body_base64"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(&r.body));
            }
        }
        out
    });
    json!({
        "approval_id": a.id,
        "status": a.status.as_str(),
        "status_url": status_url(plane, &a.id),
        "created_at": rfc3339(a.created_ms),
        "expires_at": rfc3339(a.deadline_ms),
        "tool": a.observed.tool,
        "method": a.request.method,
        "url": a.request.url,
        "approver": a.approver,
        "decided_at": a.decided_ms.map(rfc3339),
        "reason": a.reason,
        "response": response,
    })
}
