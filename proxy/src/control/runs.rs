//! The control API's runs (docs/runs.md): webhook deliveries (`POST /v1/triggers/{name}`,
//! authenticated by their signature, also served on `listen.triggers`), runs started by API
//! (`POST /v1/runs`, with the admin token or the trigger's own), and the runs themselves —
//! list, show, cancel, retry.

use std::sync::{Arc, Weak};

use http::header::{AUTHORIZATION, CONTENT_LENGTH};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::error::ControlError;
use super::{read_json, Reply};
use crate::body::ProxyBody;
use crate::plane::ControlPlane;
use crate::respond::json_response;
use crate::runs::intake::{Admitted, Caller, Delivery, Intake, IntakeError};
use crate::runs::runner::{RunSessions, Runner};
use crate::session::NewSession;
use crate::store::runs::{Cancel, RunFilter, RunRow, RunStatus, RunStore};
use crate::store::Call;

/// What the control API holds of runs.
#[derive(Debug)]
pub struct RunsControl {
    pub intake: Arc<Intake>,
    pub store: Arc<dyn RunStore>,
    pub runner: Arc<Runner>,
    /// Which run a session belongs to (a run starting a child run).
    pub checkpoints: Arc<crate::runs::checkpoint::Checkpoints>,
}

/// The header that marks the answer to a duplicate delivery.
pub const DUPLICATE: &str = "ostiary-duplicate";

/// `POST /v1/triggers/{name}`: a webhook delivery.
pub(super) async fn deliver(
    shared: &ControlPlane,
    req: Request<Incoming>,
    name: &str,
    request_id: &str,
) -> Response<ProxyBody> {
    let Some(runs) = &shared.runs else {
        return answer(
            shared,
            Err(IntakeError::UnknownTrigger(name.to_owned()).into()),
            request_id,
        );
    };
    // The size first: nothing past a trigger's limit is read, whatever its sender claims.
    let limit = runs.intake.max_payload(name).unwrap_or(0);
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (parts, body) = req.into_parts();
    let body = match declared {
        Some(n) if n > limit as u64 => Err(()),
        _ => Limited::new(body, limit.max(1))
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|_| ()),
    };
    let result = match body {
        Ok(body) => {
            let delivery = Delivery {
                headers: &parts.headers,
                body,
            };
            runs.intake.webhook(name, delivery).await
        }
        // Not read past the limit: refused, and audited, without it.
        Err(()) => Err(runs.intake.too_large(name)),
    };
    answer(shared, result.map_err(ControlError::from), request_id)
}

/// `POST /v1/runs` (`{"trigger": …, "payload": {…}}`) by an admin, or by a caller with the
/// trigger's own token.
pub(super) async fn start(
    shared: &ControlPlane,
    req: Request<Incoming>,
    admin: bool,
    request_id: &str,
) -> Response<ProxyBody> {
    let Some(runs) = &shared.runs else {
        return answer(
            shared,
            Err(ControlError::NotFound("no trigger is configured".into())),
            request_id,
        );
    };
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    // A run's agent, with its session token: the run it starts is its child.
    let parent = match (admin, super::sessions::bearer_session(shared, &req).await) {
        (false, Some(Ok(principal))) => {
            match runs.checkpoints.run_of(&principal.session_id).await {
                Ok(Some(run)) => Some(Caller::Run {
                    run,
                    session: principal.session_id.clone(),
                    agent: principal.agent.clone(),
                    depth: principal.depth,
                }),
                Ok(None) => {
                    return answer(
                        shared,
                        Err(ControlError::Denied(
                            "only a run's session may start a run: this session is not a run's"
                                .into(),
                        )),
                        request_id,
                    )
                }
                Err(e) => return answer(shared, Err(ControlError::Proxy(e)), request_id),
            }
        }
        _ => None,
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Start {
        trigger: String,
        #[serde(default)]
        payload: Option<Value>,
    }
    let start: Start = match read_json(req).await {
        Ok(start) => start,
        Err(Reply(status, body)) => return reply_json(status, body, request_id),
    };
    let payload = start.payload.unwrap_or_else(|| json!({}));
    let caller = match (admin, parent) {
        (true, _) => Caller::Admin,
        (false, Some(parent)) => parent,
        (false, None) => Caller::Token(token.as_deref()),
    };
    let result = runs.intake.api(&start.trigger, payload, caller).await;
    answer(shared, result.map_err(ControlError::from), request_id)
}

fn answer(
    shared: &ControlPlane,
    result: Result<Admitted, ControlError>,
    request_id: &str,
) -> Response<ProxyBody> {
    match result {
        Ok(admitted) => {
            let status = if admitted.duplicate {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            let body = json!({
                "run_id": admitted.run_id,
                "trigger": admitted.trigger,
                "status": admitted.status.as_str(),
                "duplicate": admitted.duplicate,
                "status_url": format!("{}/v1/runs/{}", shared.approvals.link_base(), admitted.run_id),
            });
            let mut response = json_response(status, &body, request_id);
            if admitted.duplicate {
                response
                    .headers_mut()
                    .insert(DUPLICATE, HeaderValue::from_static("true"));
            }
            response
        }
        Err(e) => {
            let Reply(status, body) = e.into();
            let retry_after = body["retry_after"].as_u64();
            let mut response = reply_json(status, body, request_id);
            if let Some(secs) = retry_after {
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
            }
            response
        }
    }
}

fn reply_json(status: StatusCode, mut body: Value, request_id: &str) -> Response<ProxyBody> {
    body["request_id"] = json!(request_id);
    json_response(status, &body, request_id)
}

/// `GET /v1/runs?status=&trigger=&dead_letters=1&limit=`.
pub(super) async fn list(shared: &ControlPlane, query: &str) -> Reply {
    let Some(runs) = &shared.runs else {
        return Reply(StatusCode::OK, json!({"runs": []}));
    };
    let mut filter = RunFilter::default();
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "status" => match RunStatus::parse(&value) {
                Some(status) => filter.status = Some(status),
                None => {
                    return ControlError::BadRequest(format!(
                        "status {value:?} is not a run status"
                    ))
                    .into()
                }
            },
            "trigger" => filter.trigger = Some(value.into_owned()),
            "dead_letters" => filter.dead_letters = matches!(value.as_ref(), "1" | "true"),
            "limit" => match value.parse() {
                Ok(n) => filter.limit = Some(n),
                Err(_) => return ControlError::BadRequest("limit must be a number".into()).into(),
            },
            other => {
                return ControlError::BadRequest(format!("unknown parameter {other:?}")).into()
            }
        }
    }
    match runs.store.call(move |s| s.list(&filter)).await {
        Ok(rows) => Reply(
            StatusCode::OK,
            json!({"runs": rows.iter().map(run_json).collect::<Vec<_>>()}),
        ),
        Err(e) => ControlError::from(e).into(),
    }
}

/// `GET /v1/runs/{id}`.
pub(super) async fn show(shared: &ControlPlane, id: &str) -> Reply {
    let Some(runs) = &shared.runs else {
        return ControlError::NotFound(format!("no run {id}")).into();
    };
    let owned = id.to_owned();
    match runs.store.call(move |s| s.get(&owned)).await {
        Ok(Some(row)) => Reply(StatusCode::OK, run_json(&row)),
        Ok(None) => ControlError::NotFound(format!("no run {id}")).into(),
        Err(e) => ControlError::from(e).into(),
    }
}

/// `POST /v1/runs/{id}/cancel`: a run not started ends at once; a running one is stopped
/// (here or on the replica running it) and ends `cancelled`.
pub(super) async fn cancel(shared: &ControlPlane, id: &str) -> Reply {
    let Some(runs) = &shared.runs else {
        return ControlError::NotFound(format!("no run {id}")).into();
    };
    let owned = id.to_owned();
    let now = crate::store::now_ms();
    let cancelled = runs
        .store
        .call(move |s| s.cancel(&owned, "cancelled by an operator", now))
        .await;
    match cancelled {
        Ok(Some(Cancel::Cancelled(row))) => Reply(StatusCode::OK, run_json(&row)),
        Ok(Some(Cancel::Requested(row))) => {
            runs.runner.stop(id);
            Reply(StatusCode::ACCEPTED, run_json(&row))
        }
        Ok(Some(Cancel::Over(row))) => ControlError::Conflict(format!(
            "run {id} has already ended: {}",
            row.status.as_str()
        ))
        .into(),
        Ok(None) => ControlError::NotFound(format!("no run {id}")).into(),
        Err(e) => ControlError::from(e).into(),
    }
}

/// `POST /v1/runs/{id}/retry`: a run that ended is queued again (its checkpoint, if it
/// saved one, is where it resumes).
pub(super) async fn retry(shared: &ControlPlane, id: &str) -> Reply {
    let Some(runs) = &shared.runs else {
        return ControlError::NotFound(format!("no run {id}")).into();
    };
    let owned = id.to_owned();
    let now = crate::store::now_ms();
    match runs.store.call(move |s| s.requeue(&owned, now)).await {
        Ok(Some(row)) if row.status == RunStatus::Queued => {
            runs.intake.wake_runner();
            Reply(StatusCode::ACCEPTED, run_json(&row))
        }
        Ok(Some(row)) => ControlError::Conflict(format!(
            "run {id} has not ended ({}): cancel it first",
            row.status.as_str()
        ))
        .into(),
        Ok(None) => ControlError::NotFound(format!("no run {id}")).into(),
        Err(e) => ControlError::from(e).into(),
    }
}

/// A run as the API shows it.
pub fn run_json(row: &RunRow) -> Value {
    let parsed = |text: &str| serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
    json!({
        "run_id": row.id,
        "trigger": row.trigger,
        "kind": row.kind,
        "status": row.status.as_str(),
        "attempt": row.attempt,
        "created_ms": row.created_ms,
        "not_before_ms": row.not_before_ms,
        "started_ms": row.started_ms,
        "ended_ms": row.ended_ms,
        "session": row.session,
        "holder": row.holder,
        "exit_code": row.exit_code,
        "limit": row.limit,
        "error": row.error,
        "stderr_tail": row.stderr_tail,
        "cost": row.cost_micros.map(|c| c as f64 / 1e6),
        "payload_sha256": row.payload_sha256,
        "payload": parsed(&row.payload),
        "spec": parsed(&row.spec),
        "dead_letter": row.dead_letter.as_deref().map(parsed),
        "cancel_requested": row.cancel_requested,
        "parent_run": row.parent_run,
        "approval": row.approval,
    })
}

/// Sessions for the runner, made as `POST /v1/sessions` makes them (every bound, the
/// audit record), through a handle that does not keep the control plane alive.
#[derive(Debug)]
pub struct PlaneSessions(pub Weak<ControlPlane>);

#[async_trait::async_trait]
impl RunSessions for PlaneSessions {
    async fn open(&self, new: NewSession) -> Result<Value, String> {
        let shared = self.0.upgrade().ok_or("the proxy is stopping")?;
        match super::sessions::create_from(&shared, new, None).await {
            Ok(Reply(_, body)) => Ok(body),
            Err(Reply(status, body)) => Err(format!(
                "{status}: {}",
                body["message"].as_str().unwrap_or_default()
            )),
        }
    }

    async fn close(&self, session: &str, why: &str) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        if let Err(e) = shared.teardown.tear_down(session, why).await {
            tracing::warn!(session, error = %e, "runs: the run's session could not be torn down");
        }
    }
}

/// The router's check for `POST /v1/runs` without the admin token: only a trigger token
/// may try.
pub(super) fn is_start(method: &http::Method, segments: &[&str]) -> bool {
    method == http::Method::POST && segments == ["v1", "runs"]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_posts_to_the_runs_collection_start_runs() {
        assert!(is_start(&http::Method::POST, &["v1", "runs"]));
        assert!(!is_start(&http::Method::GET, &["v1", "runs"]));
        assert!(!is_start(
            &http::Method::POST,
            &["v1", "runs", "x", "cancel"]
        ));
    }
}
