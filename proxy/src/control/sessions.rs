//! The control API's sessions (DESIGN §6): create (by an operator, or by a session for a
//! child of its own), show, resume after a watchdog pause, terminate, and the dead letters
//! the watchdog wrote.
//!
//! Creating is the one session call a session token may make — `POST /v1/sessions` with
//! `Authorization: Bearer <session token>` creates a child of that session — because agents
//! spawn agents; everything else here needs the admin token.

use http::header::AUTHORIZATION;
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::{problem, read_json, Reply};
use crate::approvals::queue::CapRefused;
use crate::audit::AuditGuard;
use crate::guardrails::meter::Limits;
use crate::lifecycle;
use crate::server::Shared;
use crate::session::spawn::{self, ChildAgent};
use crate::session::{limits, registry, NewSession, Principal, SessionError};

/// The session a `Bearer` token on a control request stands for, if it is a session token.
pub(super) fn bearer_session<B>(
    shared: &Shared,
    req: &Request<B>,
) -> Option<Result<std::sync::Arc<Principal>, SessionError>> {
    let value = req.headers().get(AUTHORIZATION)?;
    let token = value.to_str().ok()?.strip_prefix("Bearer ")?;
    Some(shared.sessions.authenticate(token))
}

/// `POST /v1/sessions`. `parent` is the session whose token authenticated the call, if a
/// session did; an operator may name one in the body instead.
pub(super) async fn create(
    shared: &Shared,
    req: Request<Incoming>,
    parent: Option<std::sync::Arc<Principal>>,
) -> Reply {
    let new: NewSession = match read_json(req).await {
        Ok(n) => n,
        Err(reply) => return reply,
    };
    // Every number first: a negative or absurd budget must not reach the carving below.
    if let Err(e) = limits::check(&new) {
        return problem(StatusCode::BAD_REQUEST, "bad_request", e.to_string());
    }
    let parent = match (parent, new.parent.as_deref()) {
        (Some(p), Some(named)) if named != p.session_id => {
            return problem(
                StatusCode::FORBIDDEN,
                "denied",
                "a session may only create children of its own",
            )
        }
        (Some(p), _) => Some(p),
        (None, Some(named)) => match shared.sessions.get(named) {
            Some(p) => Some(p),
            None => {
                return problem(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("parent session {named} is not active"),
                )
            }
        },
        (None, None) => None,
    };
    if let Some(p) = &parent {
        // The spawn bounds before the budget: a refused child carves nothing.
        if let Err(SessionError::Bound { limit, used, max }) = shared.sessions.may_spawn(p) {
            return limit_reply(limit.to_owned(), json!(used), json!(max));
        }
        // A paused session spawns nothing: a child would be a way around the pause.
        if let Some(paused) = shared.guardrails.paused(&p.session_id) {
            return problem(
                StatusCode::LOCKED,
                "session_paused",
                format!("the parent session is paused: {}", paused.reason),
            );
        }
    }
    // spawn — who the child runs as, before anything is carved for it: its parent's agent,
    // or another name only if policy permits the parent's agent to spawn it.
    let child = match &parent {
        Some(p) => match child_agent(shared, p, new.agent.as_deref()) {
            Ok(child) => Some(child),
            Err(reply) => return reply,
        },
        None => None,
    };
    // approvals — how many requests it may have held at once, never more than its parent;
    // before the budget is carved, so a refused child carves nothing.
    let max_pending_approvals = match shared
        .approvals
        .cap_for(
            new.max_pending_approvals,
            parent.as_ref().map(|p| p.session_id.as_str()),
            shared.config.sessions.max_pending_approvals,
        )
        .await
    {
        Ok(n) => n,
        Err(CapRefused::Invalid(m)) => return problem(StatusCode::BAD_REQUEST, "bad_request", m),
        Err(e) => {
            return problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                e.to_string(),
            )
        }
    };
    let named = Limits {
        max_calls: new.max_calls,
        max_cost_micros: new.max_cost.map(ostiary_policies::catalog::cost_to_micros),
        max_bytes_sent: new.max_bytes_sent,
        max_bytes_received: new.max_bytes_received,
    };
    // A child's budget is carved out of what its parent has left (the `[sessions]`
    // defaults do not apply to it: what it names, or half of what is left); a root session
    // gets the defaults for what it does not name.
    let limits = match &parent {
        Some(p) => match shared.guardrails.meter.carve(&p.session_id, named) {
            Ok(limits) => limits,
            Err(hit) => return limit_reply(hit.limit, hit.used, hit.max),
        },
        None => named.or(shared.guardrails.default_limits()),
    };
    let created = shared
        .sessions
        .create(new, parent.as_deref().zip(child.as_ref()))
        .await;
    let (principal, token) = match created {
        Ok(created) => created,
        Err(e) => {
            // Give back what was carved for a child that was not created.
            if let Some(p) = &parent {
                shared.guardrails.meter.uncarve(&p.session_id, &limits);
            }
            return match e {
                SessionError::Invalid(m) => problem(StatusCode::BAD_REQUEST, "bad_request", m),
                SessionError::Bound { limit, used, max } => {
                    limit_reply(limit.to_owned(), json!(used), json!(max))
                }
                e => problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    e.to_string(),
                ),
            };
        }
    };
    shared
        .guardrails
        .open(&principal.session_id, limits, principal.parent.clone());
    let parent_id = principal.parent.as_deref();
    let capped = shared
        .approvals
        .set_cap(&principal.session_id, parent_id, max_pending_approvals)
        .await;
    if let Err(e) = capped {
        // Unstored, its holds would not count against its ancestors' caps: fail closed.
        let why = "its cap of pending approvals could not be stored";
        let _ = lifecycle::teardown(shared, &principal.session_id, why).await;
        return problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            format!("storing the session's cap of pending approvals: {e}"),
        );
    }
    shared.audit_session_event(
        &principal.session_id,
        &principal.agent,
        &principal.tenant,
        &match (&principal.parent, &child) {
            (Some(p), Some(c)) if c.renamed() => format!(
                "session created (child of {p}, depth {}, as agent {:?} by spawn policies {})",
                principal.depth,
                c.name(),
                c.policies().join(", ")
            ),
            (Some(p), _) => format!("session created (child of {p}, depth {})", principal.depth),
            (None, _) => "session created".to_owned(),
        },
    );
    let mut shown_limits = limits_json(&limits);
    shown_limits["max_pending_approvals"] = json!(max_pending_approvals);
    Reply(
        StatusCode::CREATED,
        json!({
            "session_id": principal.session_id,
            "agent": principal.agent,
            "tenant": principal.tenant,
            "parent": principal.parent,
            "depth": principal.depth,
            "token": token,
            "expires_at": principal.expires_at,
            "proxy_url": shared.proxy_url(&token),
            "ca_pem": shared.ca_pem,
            "placeholders": super::placeholders(
                shared,
                principal.parent.is_some().then_some(principal.session_id.as_str()),
            ),
            "limits": shown_limits,
        }),
    )
}

/// The agent a child of `parent` runs as (`asked` by its creator, or none), or the reply
/// refusing it. A refused spawn is audited (kind `spawn`) under the parent's session.
fn child_agent(
    shared: &Shared,
    parent: &Principal,
    asked: Option<&str>,
) -> Result<ChildAgent, Reply> {
    if let Some(name) = asked {
        if let Err(e) = registry::valid_name("agent", name) {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "bad_request",
                e.to_string(),
            ));
        }
    }
    let engine = shared.policies.current();
    let session = shared.guardrails.session_state(parent);
    let resolved = spawn::resolve(&engine, &shared.metrics, parent, &session, asked);
    if let Some(name) = asked.filter(|name| *name != parent.agent) {
        let request_id = crate::ids::request_id();
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "spawn");
        audit.update(|r| {
            r.set_principal(parent);
            r.reason = Some(format!("spawn a child session as agent {name:?}"));
        });
        audit.decided(resolved.as_ref().map(ChildAgent::policies));
    }
    resolved.map_err(|e| {
        Reply(
            crate::respond::status(&e),
            crate::respond::error_body(&e, ""),
        )
    })
}

fn limit_reply(limit: String, used: Value, max: Value) -> Reply {
    Reply(
        StatusCode::TOO_MANY_REQUESTS,
        json!({
            "error": "limit_exceeded",
            "message": format!("the {limit} limit is reached ({used} of {max})"),
            "limit": limit,
            "used": used,
            "max": max,
            "retry_after": null,
        }),
    )
}

fn limits_json(l: &Limits) -> Value {
    json!({
        "max_calls": l.max_calls,
        "max_cost": l.max_cost_micros.map(|m| m as f64 / 1_000_000.0),
        "max_bytes_sent": l.max_bytes_sent,
        "max_bytes_received": l.max_bytes_received,
    })
}

/// `GET /v1/sessions/{id}`.
pub(super) fn show(shared: &Shared, id: &str) -> Reply {
    let Some(principal) = shared.sessions.get(id) else {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {id} is not active"),
        );
    };
    let account = shared.guardrails.meter.snapshot(id).unwrap_or_default();
    let paused = shared.guardrails.paused(id);
    Reply(
        StatusCode::OK,
        json!({
            "session_id": principal.session_id,
            "agent": principal.agent,
            "tenant": principal.tenant,
            "parent": principal.parent,
            "depth": principal.depth,
            "expires_at": principal.expires_at,
            "state": if paused.is_some() { "paused" } else { "live" },
            "paused": paused.map(|p| json!({
                "reason": p.reason,
                "kind": p.kind,
                "at": p.at_ms,
                "dead_letter": p.dead_letter,
            })),
            "usage": {
                "calls": account.usage.calls,
                "cost": account.usage.cost_micros as f64 / 1_000_000.0,
                "bytes_sent": account.usage.bytes_sent,
                "bytes_received": account.usage.bytes_received,
            },
            "limits": limits_json(&account.limits),
            "children": shared
                .sessions
                .children(id)
                .iter()
                .map(|c| c.session_id.clone())
                .collect::<Vec<_>>(),
            "in_flight": shared.guardrails.inflight.count(id),
        }),
    )
}

/// `POST /v1/sessions/{id}/resume`: a human lifted a watchdog pause.
pub(super) async fn resume(shared: &Shared, id: &str, by: &str) -> Reply {
    let Some(principal) = shared.sessions.get(id) else {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {id} is not active"),
        );
    };
    match crate::guardrails::pause::resume(shared, &principal.session_id, by).await {
        Ok(true) => Reply(
            StatusCode::OK,
            json!({"session_id": id, "status": "resumed"}),
        ),
        Ok(false) => problem(
            StatusCode::CONFLICT,
            "conflict",
            format!("session {id} is not paused"),
        ),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
        ),
    }
}

/// `DELETE /v1/sessions/{id}` and `POST /v1/sessions/{id}/terminate`.
pub(super) async fn terminate(shared: &Shared, id: &str, why: &str, status: &str) -> Reply {
    match lifecycle::teardown(shared, id, why).await {
        Ok(true) => Reply(StatusCode::OK, json!({"session_id": id, "status": status})),
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {id} is not active"),
        ),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
        ),
    }
}

/// `GET /v1/dead-letters?session=ID`.
pub(super) async fn dead_letters(shared: &Shared, query: &str) -> Reply {
    let session = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "session")
        .map(|(_, v)| v.into_owned());
    match shared
        .guardrails
        .store
        .call(move |s| s.dead_letters(session.as_deref()))
        .await
    {
        Ok(letters) => Reply(StatusCode::OK, json!({ "dead_letters": letters })),
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            e.to_string(),
        ),
    }
}
