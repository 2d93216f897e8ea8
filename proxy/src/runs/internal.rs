//! The proxy's own name for a run's agent, `ostiary.internal`: what a run asks of Ostiary
//! itself, over the proxy connection it already has (a sandbox reaches nothing else; the
//! control API is never reachable through the proxy). Its session token — the proxy
//! credential — says who asks.
//!
//! - `PUT` / `GET /v1/checkpoint` — the run's checkpoint ([`super::checkpoint`]);
//! - `POST /v1/runs` (`{"trigger": …, "payload": {…}}`) — a child run of an `api` trigger:
//!   its session a child of the run's (depth, fan-out and budget carved as for any child
//!   session, another agent name only where policy permits the spawn, no credential
//!   inherited);
//! - `GET /v1/runs/{id}` — one of the run's own children.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::checkpoint::{self, Checkpoints};
use super::intake::{Caller, Intake, IntakeError};
use crate::audit::AuditGuard;
use crate::body::ProxyBody;
use crate::classify::Target;
use crate::error::ProxyError;
use crate::guardrails::meter::LimitHit;
use crate::respond::json_response;
use crate::session::Principal;
use crate::store::runs::RunStore;
use crate::store::Call;

/// What the reserved name serves.
#[derive(Debug)]
pub struct Internal {
    pub checkpoints: Arc<Checkpoints>,
    pub intake: Arc<Intake>,
    pub runs: Arc<dyn RunStore>,
}

/// The largest body of a child run's start.
const MAX_START: usize = 1 << 20;

/// Answer a request to the reserved name.
pub async fn answer(
    internal: Option<&Internal>,
    principal: &Principal,
    target: &Target,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    request_id: &str,
) -> Result<Response<ProxyBody>, ProxyError> {
    let path = target.path.as_str();
    // What was asked, on the record as for any request (this one never reaches the phases
    // that write it).
    audit.update(|r| {
        r.method = Some(target.method.to_string());
        r.scheme = Some(target.scheme.into());
        r.host = Some(checkpoint::RESERVED_HOST.into());
        r.port = Some(target.port);
        r.path = Some(target.path.clone());
    });
    if path == checkpoint::PATH {
        let checkpoints = internal.map(|i| &*i.checkpoints);
        return checkpoint::answer(checkpoints, principal, target, req, audit, request_id).await;
    }
    audit.update(|r| r.kind = "trigger".into());
    let Some(internal) = internal else {
        return Err(not_served(
            404,
            "no trigger is configured: runs cannot be started",
        ));
    };
    let run = internal
        .checkpoints
        .run_of(&principal.session_id)
        .await?
        .ok_or_else(|| not_served(404, "only a run's session may start or see runs"))?;
    match (req.method(), path.strip_prefix("/v1/runs")) {
        (&Method::POST, Some("")) => start_child(internal, principal, run, req, request_id).await,
        (&Method::GET, Some(rest)) if rest.len() > 1 && rest.starts_with('/') => {
            show_child(internal, &run, &rest[1..], request_id).await
        }
        (_, Some(_)) => Err(not_served(405, "/v1/runs takes POST, /v1/runs/{id} GET")),
        _ => Err(not_served(
            404,
            "ostiary.internal answers /v1/checkpoint and /v1/runs only",
        )),
    }
}

async fn start_child(
    internal: &Internal,
    principal: &Principal,
    run: String,
    req: Request<Incoming>,
    request_id: &str,
) -> Result<Response<ProxyBody>, ProxyError> {
    let body = Limited::new(req.into_body(), MAX_START)
        .collect()
        .await
        .map_err(|_| not_served(413, "a run's start is at most 1 MiB"))?
        .to_bytes();
    let start = crate::strict_json::parse(&body)
        .map_err(|e| ProxyError::bad_request(format!("the body is not JSON: {e}")))?;
    let trigger = start["trigger"]
        .as_str()
        .ok_or_else(|| ProxyError::bad_request("the body names no trigger"))?;
    let payload = start.get("payload").cloned().unwrap_or_else(|| json!({}));
    let caller = Caller::Run {
        run,
        session: principal.session_id.clone(),
        agent: principal.agent.clone(),
        depth: principal.depth,
    };
    let admitted = internal
        .intake
        .api(trigger, payload, caller)
        .await
        .map_err(refusal)?;
    let status = if admitted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok(json_response(
        status,
        &json!({
            "run_id": admitted.run_id,
            "trigger": admitted.trigger,
            "status": admitted.status.as_str(),
            "duplicate": admitted.duplicate,
            "status_url": format!("https://{}/v1/runs/{}", checkpoint::RESERVED_HOST, admitted.run_id),
        }),
        request_id,
    ))
}

async fn show_child(
    internal: &Internal,
    parent: &str,
    id: &str,
    request_id: &str,
) -> Result<Response<ProxyBody>, ProxyError> {
    let owned = id.to_owned();
    let row = internal
        .runs
        .call(move |s| s.get(&owned))
        .await
        .map_err(|e| ProxyError::StateUnavailable {
            component: "store",
            reason: e.to_string(),
        })?
        .filter(|r| r.parent_run.as_deref() == Some(parent))
        .ok_or_else(|| not_served(404, "no run of that id was started by this run"))?;
    let shown: Value = json!({
        "run_id": row.id,
        "trigger": row.trigger,
        "status": row.status.as_str(),
        "attempt": row.attempt,
        "exit_code": row.exit_code,
        "limit": row.limit,
        "error": row.error,
    });
    Ok(json_response(StatusCode::OK, &shown, request_id))
}

/// An intake refusal as the data plane answers it.
fn refusal(e: IntakeError) -> ProxyError {
    match e {
        IntakeError::UnknownTrigger(_) | IntakeError::WrongKind { .. } => {
            not_served(404, &e.to_string())
        }
        IntakeError::TooLarge { .. } => not_served(413, &e.to_string()),
        IntakeError::BadPayload(reason) => ProxyError::bad_request(reason),
        IntakeError::SchemaMismatch(detail) => ProxyError::CheckFailed {
            check: "schema".into(),
            detail,
        },
        IntakeError::RateLimited {
            name,
            count,
            retry_after,
            ..
        } => ProxyError::LimitExceeded(Box::new(LimitHit {
            limit: format!("trigger_rate:{name}"),
            used: json!(count),
            max: json!(count),
            retry_after: Some(retry_after.as_secs().max(1)),
        })),
        IntakeError::SecretUnavailable { credential, cause } => {
            ProxyError::CredentialUnavailable { credential, cause }
        }
        IntakeError::Store(e) => ProxyError::StateUnavailable {
            component: "store",
            reason: e.to_string(),
        },
        IntakeError::Denied {
            trigger,
            policies,
            why,
        } => ProxyError::Denied {
            policies,
            action: "Ostiary::Action::\"trigger\"".into(),
            resource: format!("Ostiary::Trigger::{trigger:?}"),
            reason: why,
        },
        IntakeError::BadSignature(_) | IntakeError::Unauthenticated => {
            ProxyError::unauthenticated(e.to_string())
        }
    }
}

fn not_served(status: u16, reason: &str) -> ProxyError {
    ProxyError::NotServed {
        status,
        reason: reason.to_owned(),
    }
}
