//! The approvers' side of the queue on the control listener:
//!
//! - admin API (`Authorization: Bearer <admin token>`): `GET /v1/approvals`,
//!   `GET /v1/approvals/{id}`, `POST /v1/approvals/{id}/approve|deny` (the CLI calls these),
//!   `POST /v1/approvals/{id}/link` (a review link for one approver);
//! - the review page behind a signed link: `GET`/`HEAD /approve/<token>` only show,
//!   `POST /approve/<token>` decides (mail scanners prefetch links; a GET never changes
//!   anything);
//! - Slack's interactive callbacks, `POST /v1/slack/interactions`, verified with the
//!   signing secret over the raw body and refused when replayed.
//!
//! Whoever decides, [`crate::approvals::ApprovalQueue::may_decide`] says whether they may;
//! an approval it lets through starts executing at once.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use super::error::ControlError;
use super::Reply;
use crate::approvals::link::LinkClaims;
use crate::approvals::slack_callback;
use crate::approvals::store::DecideError;
use crate::approvals::{execute, page, Approval, Channel, Status, Verdict};
use crate::body::{full, ProxyBody};
use crate::plane::ControlPlane;
use crate::store::{now_ms, Call};

/// Largest form or callback body read.
const MAX_FORM: usize = 64 * 1024;

/// `GET /v1/approvals?status=&session=&limit=`.
pub async fn list(shared: &ControlPlane, query: &str) -> Reply {
    let mut status = None;
    let mut session = None;
    let mut limit = 100usize;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "status" => match Status::parse(&value) {
                Some(s) => status = Some(s),
                None => {
                    return ControlError::BadRequest(format!("unknown status {value:?}")).into()
                }
            },
            "session" => session = Some(value.into_owned()),
            "limit" => limit = value.parse().unwrap_or(100).clamp(1, 10_000),
            _ => {}
        }
    }
    let listed = shared
        .approvals
        .store
        .call(move |s| s.list(status, session.as_deref(), limit))
        .await;
    let counts = shared.approvals.refresh_gauges().await;
    match (listed, counts) {
        (Ok(approvals), Ok(counts)) => Reply(
            StatusCode::OK,
            json!({
                "approvals": approvals.iter().map(summary).collect::<Vec<_>>(),
                "counts": {
                    "pending": counts.pending,
                    "approved": counts.approved,
                    "executing": counts.executing,
                    "failing_notifications": counts.failing_deliveries,
                },
            }),
        ),
        (Err(e), _) | (_, Err(e)) => ControlError::Internal(e.to_string()).into(),
    }
}

/// One approval, or the problem to answer instead.
async fn load(shared: &ControlPlane, id: &str) -> Result<Approval, Reply> {
    match shared.approvals.get(id).await {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(ControlError::NotFound(format!("no approval {id}")).into()),
        Err(e) => Err(ControlError::Internal(e.to_string()).into()),
    }
}

/// One line of a list.
fn summary(a: &Approval) -> serde_json::Value {
    json!({
        "approval_id": a.id,
        "status": a.status.as_str(),
        "summary": a.summary(),
        "tool": a.observed.tool,
        "agent": a.agent,
        "session": a.session,
        "created_ms": a.created_ms,
        "deadline_ms": a.deadline_ms,
        "approver": a.approver,
    })
}

/// `GET /v1/approvals/{id}`: everything, including notification delivery state.
pub async fn show(shared: &ControlPlane, id: &str) -> Reply {
    let approval = match load(shared, id).await {
        Ok(a) => a,
        Err(reply) => return reply,
    };
    let deliveries = {
        let id = id.to_owned();
        shared
            .approvals
            .store
            .call(move |s| s.deliveries_of(&id))
            .await
            .unwrap_or_default()
    };
    let mut body = serde_json::to_value(&approval).unwrap_or_default();
    body["approval_id"] = json!(approval.id);
    body["idempotency_key"] = json!(approval.idempotency_key());
    body["notifications"] = json!(deliveries);
    Reply(StatusCode::OK, body)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    approver: String,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/approvals/{id}/approve|deny` with `{"approver": "...", "reason": "..."}`.
pub async fn decide_api(
    shared: &Arc<ControlPlane>,
    req: Request<Incoming>,
    id: &str,
    verdict: Verdict,
) -> Reply {
    let body: DecideBody = match super::read_json(req).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    match decide(
        shared,
        id,
        verdict,
        &body.approver,
        Channel::Api,
        body.reason,
        None,
    )
    .await
    {
        Ok(a) => Reply(StatusCode::OK, summary(&a)),
        Err(e) => decide_problem(e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkBody {
    approver: String,
}

/// `POST /v1/approvals/{id}/link` with `{"approver": "..."}`: a review link for one
/// approver (the CLI prints it; email and Slack carry their own).
pub async fn link(shared: &ControlPlane, req: Request<Incoming>, id: &str) -> Reply {
    let body: LinkBody = match super::read_json(req).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    let approval = match load(shared, id).await {
        Ok(a) => a,
        Err(reply) => return reply,
    };
    if let Err(e) = shared.approvals.may_decide(&approval, &body.approver) {
        return decide_problem(e);
    }
    Reply(
        StatusCode::OK,
        json!({ "url": shared.approvals.link(&approval, &body.approver) }),
    )
}

/// Decide, and start executing what was approved.
async fn decide(
    shared: &Arc<ControlPlane>,
    id: &str,
    verdict: Verdict,
    approver: &str,
    channel: Channel,
    reason: Option<String>,
    nonce: Option<String>,
) -> Result<Approval, DecideError> {
    let decided = shared
        .approvals
        .decide(id, verdict, approver, channel, reason, nonce)
        .await?;
    if decided.status == Status::Approved {
        tokio::spawn(execute::run(shared.executor.clone(), decided.id.clone()));
    }
    // "Resume this paused session?" — no: the session is terminated.
    if decided.status == Status::Denied {
        if let Some(session) = crate::guardrails::pause::resume_target(&decided) {
            let (teardown, session) = (shared.teardown.clone(), session.to_owned());
            let why = format!("terminated by {approver} after a watchdog pause");
            tokio::spawn(async move {
                if let Err(e) = teardown.tear_down(&session, &why).await {
                    tracing::error!(session, error = %e, "terminating a paused session failed");
                }
            });
        }
    }
    Ok(decided)
}

fn decide_problem(e: DecideError) -> Reply {
    ControlError::from(e).into()
}

/// An HTML response with the page's security headers.
fn html(status: StatusCode, text: String, head_only: bool) -> Response<ProxyBody> {
    let len = text.len();
    let mut response = Response::new(if head_only {
        crate::body::empty()
    } else {
        full(text)
    });
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for (name, value) in page::security_headers() {
        headers.insert(name, value);
    }
    headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
    response
}

/// `GET`, `HEAD` and `POST /approve/<token>`.
pub async fn review(
    shared: &Arc<ControlPlane>,
    req: Request<Incoming>,
    token: &str,
) -> Response<ProxyBody> {
    let head_only = req.method() == Method::HEAD;
    let refuse =
        |status, title: &str, message: &str| html(status, page::outcome(title, message), head_only);
    let claims = match shared.approvals.verify_link(token) {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "review link refused");
            shared
                .approvals
                .record_refused("a review link", e.to_string());
            return refuse(
                StatusCode::FORBIDDEN,
                "This link is not valid",
                &format!("{e}. Ask for a new link (ostiary approvals show)."),
            );
        }
    };
    let approval = match shared.approvals.get(&claims.approval_id).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return refuse(
                StatusCode::NOT_FOUND,
                "No such approval",
                "This link names an approval that does not exist.",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "reading an approval for the review page failed");
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong",
                "The approval could not be read; try again.",
            );
        }
    };
    if let Err(e) = shared.approvals.may_decide(&approval, &claims.approver) {
        return refuse(StatusCode::FORBIDDEN, "Not an approver", &e.to_string());
    }
    let used = {
        let nonce = claims.nonce.clone();
        shared
            .approvals
            .store
            .call(move |s| s.link_used(&nonce))
            .await
            .unwrap_or(true)
    };
    match *req.method() {
        Method::GET | Method::HEAD => {
            if used && approval.status == Status::Pending {
                return refuse(
                    StatusCode::GONE,
                    "This link was already used",
                    "Each link decides once. Ask for a new link.",
                );
            }
            let action = format!("/approve/{token}");
            html(
                StatusCode::OK,
                page::review(&approval, &claims.approver, &action),
                head_only,
            )
        }
        // Said before anything else: a used link is spent, whatever became of the approval
        // since.
        Method::POST if used => refuse(
            StatusCode::GONE,
            "This link was already used",
            "Each link decides once. Ask for a new link.",
        ),
        Method::POST => post_decision(shared, req, &approval, claims).await,
        _ => {
            let mut response = refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "Use the buttons on the page.",
            );
            response.headers_mut().insert(
                http::header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST"),
            );
            response
        }
    }
}

/// The review form's decision on `approval`, by the link's approver (its link not yet used).
async fn post_decision(
    shared: &Arc<ControlPlane>,
    req: Request<Incoming>,
    approval: &Approval,
    claims: LinkClaims,
) -> Response<ProxyBody> {
    let refuse =
        |status, title: &str, message: &str| html(status, page::outcome(title, message), false);
    let (verdict, reason) = match read_form(req).await.and_then(|b| page::parse_form(&b)) {
        Ok(v) => v,
        Err(message) => return refuse(StatusCode::BAD_REQUEST, "Bad request", &message),
    };
    let decided = decide(
        shared,
        &approval.id,
        verdict,
        &claims.approver,
        Channel::Page,
        reason,
        Some(claims.nonce),
    )
    .await;
    match decided {
        Ok(decided) => {
            let (title, message) = match verdict {
                Verdict::Approve => (
                    "Approved",
                    format!(
                        "{} was approved; it runs once now. The agent receives the result.",
                        decided.summary()
                    ),
                ),
                Verdict::Deny => (
                    "Denied",
                    format!("{} was denied; it will not run.", decided.summary()),
                ),
            };
            html(StatusCode::OK, page::outcome(title, &message), false)
        }
        Err(e) => {
            let message = e.to_string();
            let Reply(status, _) = decide_problem(e);
            refuse(status, "Not recorded", &message)
        }
    }
}

async fn read_form(req: Request<Incoming>) -> Result<Bytes, String> {
    Limited::new(req.into_body(), MAX_FORM)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("body: {e}"))
}

/// `POST /v1/slack/interactions`.
pub async fn slack(shared: &Arc<ControlPlane>, req: Request<Incoming>) -> Reply {
    let config = &shared.config.approvals;
    let secret = std::env::var(&config.slack_signing_secret_env)
        .ok()
        .filter(|s| !s.is_empty());
    let Some(secret) = secret else {
        return ControlError::NotFound(
            "Slack callbacks are not configured (no signing secret)".into(),
        )
        .into();
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let timestamp = header("x-slack-request-timestamp");
    let signature = header("x-slack-signature");
    let form = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let body = match read_form(req).await {
        Ok(b) => b,
        Err(m) => return ControlError::BadRequest(m).into(),
    };
    let now_secs = now_ms() / 1000;
    if let Err(e) =
        slack_callback::verify(secret.as_bytes(), &timestamp, &signature, &body, now_secs)
    {
        tracing::warn!(error = %e, "slack callback refused");
        shared
            .approvals
            .record_refused("a Slack callback", e.to_string());
        return ControlError::Unauthenticated(e.to_string()).into();
    }
    // A valid signature seen before is a replay, even within the 5-minute window.
    let fresh = {
        let signature = signature.clone();
        shared
            .approvals
            .store
            .call(move |s| s.slack_first_seen(&signature, now_ms()))
            .await
    };
    match fresh {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("slack callback replayed");
            shared
                .approvals
                .record_refused("a Slack callback", "a replay".into());
            return ControlError::Unauthenticated(
                "this callback was already received (replay)".into(),
            )
            .into();
        }
        Err(e) => return ControlError::Internal(e.to_string()).into(),
    }
    if !form {
        return ControlError::BadRequest(
            "Slack callbacks are application/x-www-form-urlencoded".into(),
        )
        .into();
    }
    let action = match slack_callback::parse(&body) {
        Ok(a) => a,
        // A "Review as …" link button also reports its click here; the page it opened is
        // where that approver decides.
        Err(slack_callback::CallbackError::UnknownAction(id)) if id.starts_with("review-") => {
            return Reply(StatusCode::OK, json!({ "text": "opened the review page" }))
        }
        Err(e) => return ControlError::BadRequest(e.to_string()).into(),
    };
    let Some(approver) = config.slack_users.get(&action.user_id) else {
        return ControlError::NotAnApprover(format!(
            "Slack user {} is not mapped to an approver (approvals.slack_users)",
            action.user_id
        ))
        .into();
    };
    match decide(
        shared,
        &action.approval_id,
        action.verdict,
        approver,
        Channel::Slack,
        None,
        None,
    )
    .await
    {
        Ok(a) => Reply(
            StatusCode::OK,
            json!({
                "text": format!("{} {} by {approver}", a.summary(), match action.verdict {
                    Verdict::Approve => "approved",
                    Verdict::Deny => "denied",
                }),
                "approval_id": a.id,
                "status": a.status.as_str(),
            }),
        ),
        Err(e) => decide_problem(e),
    }
}

/// The review page path's token, if `path` is one.
pub fn review_token(path: &str) -> Option<&str> {
    let token = path.strip_prefix("/approve/")?;
    (!token.is_empty() && !token.contains('/')).then_some(token)
}
