//! The control API's sessions (docs/design.md §6): create (by an operator, or by a session for a
//! child of its own), show, resume after a watchdog pause, terminate, and the dead letters
//! the watchdog wrote.
//!
//! Creating is the one session call a session token may make — `POST /v1/sessions` with
//! `Authorization: Bearer <session token>` creates a child of that session — because agents
//! spawn agents; everything else here needs the admin token.

use std::sync::Arc;

use http::header::AUTHORIZATION;
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::error::ControlError;
use super::{read_json, Reply};
use crate::approvals::queue::CapRefused;
use crate::audit::AuditGuard;
use crate::guardrails::meter::Limits;
use crate::plane::ControlPlane;
use crate::session::spawn::{self, ChildAgent};
use crate::session::{limits, registry, NewSession, Principal, SessionError};
use crate::store::Call;

/// The session a `Bearer` token on a control request stands for, if it is a session token.
pub(super) async fn bearer_session<B>(
    shared: &ControlPlane,
    req: &Request<B>,
) -> Option<Result<std::sync::Arc<Principal>, SessionError>> {
    let value = req.headers().get(AUTHORIZATION)?;
    let token = value.to_str().ok()?.strip_prefix("Bearer ")?;
    Some(shared.sessions.authenticate(token).await)
}

/// `POST /v1/sessions`. `parent` is the session whose token authenticated the call, if a
/// session did; an operator may name one in the body instead.
pub(super) async fn create(
    shared: &ControlPlane,
    req: Request<Incoming>,
    parent: Option<Arc<Principal>>,
) -> Reply {
    create_in_order(shared, req, parent)
        .await
        .unwrap_or_else(|refused| refused)
}

/// The steps of a creation, in order; every refusal before the session exists costs
/// nothing (nothing carved, counted or stored that is not given back).
async fn create_in_order(
    shared: &ControlPlane,
    req: Request<Incoming>,
    parent: Option<Arc<Principal>>,
) -> Result<Reply, Reply> {
    let new: NewSession = read_json(req).await?;
    create_from(shared, new, parent).await
}

/// A session made from `new` as `POST /v1/sessions` makes it (the runner's sessions for
/// runs come this way too).
pub(super) async fn create_from(
    shared: &ControlPlane,
    new: NewSession,
    parent: Option<Arc<Principal>>,
) -> Result<Reply, Reply> {
    // Every number first: a negative or absurd budget must not reach the carving below.
    let new = checked_new(shared, new)?;
    let parent = resolve_parent(shared, parent, new.parent.as_deref()).await?;
    // spawn — the bounds, the fan-out and who the child runs as, before anything is carved
    // for it: its parent's agent, or another name only if policy permits the parent's
    // agent to spawn it.
    let (reserved, child) = match &parent {
        Some(p) => {
            let (reserved, child) = admit_child(shared, p, new.agent.as_deref()).await?;
            (Some(reserved), Some(child))
        }
        None => (None, None),
    };
    // approvals and budget — the cap on holds, then the budget carved from the parent.
    let (limits, max_pending_approvals) = budget(shared, &new, parent.as_deref()).await?;
    let created = shared
        .sessions
        .create(new, parent.as_deref().zip(child.as_ref()))
        .await;
    let (principal, token) = match created {
        Ok(created) => created,
        Err(e) => {
            // Give back what was carved for a child that was not created.
            if let Some(p) = &parent {
                shared.guardrails.uncarve(&p.session_id, &limits).await;
            }
            return Err(match e {
                SessionError::Invalid(m) => ControlError::BadRequest(m).into(),
                SessionError::Bound { limit, used, max } => {
                    limit_reply(limit.to_owned(), json!(used), json!(max))
                }
                e => ControlError::Internal(e.to_string()).into(),
            });
        }
    };
    // The child exists: its count is its own now, given back when it ends.
    if let Some(reserved) = reserved {
        reserved.keep();
    }
    // Its account and its cap, or no session at all.
    establish(shared, &principal, limits, max_pending_approvals).await?;
    record_created(shared, &principal, child.as_ref());
    let mut shown_limits = limits_json(&limits);
    shown_limits["max_pending_approvals"] = json!(max_pending_approvals);
    Ok(Reply(
        StatusCode::CREATED,
        json!({
            "session_id": principal.session_id,
            "agent": principal.agent,
            "tenant": principal.tenant,
            "parent": principal.parent,
            "depth": principal.depth,
            "profile": principal.profile,
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
    ))
}

/// The new session, with every number in bounds and a profile the sandbox knows.
fn checked_new(shared: &ControlPlane, new: NewSession) -> Result<NewSession, Reply> {
    if let Err(e) = limits::check(&new) {
        return Err(ControlError::BadRequest(e.to_string()).into());
    }
    // A profile policies will be told about must be one the sandbox knows.
    if let Some(name) = new.profile.as_deref() {
        if shared.config.sandbox.profile(name).is_none() {
            return Err(ControlError::BadRequest(format!(
                "profile {name:?} is not a sandbox profile (known: {})",
                shared.config.sandbox.profile_names().join(", ")
            ))
            .into());
        }
    }
    Ok(new)
}

/// The parent: the session whose token made the call, or the one an operator named (looked
/// up in the store too: another replica may have made it).
async fn resolve_parent(
    shared: &ControlPlane,
    caller: Option<Arc<Principal>>,
    named: Option<&str>,
) -> Result<Option<Arc<Principal>>, Reply> {
    match (caller, named) {
        (Some(p), Some(named)) if named != p.session_id => {
            Err(ControlError::Denied("a session may only create children of its own".into()).into())
        }
        (Some(p), _) => Ok(Some(p)),
        (None, Some(named)) => match shared.sessions.find(named).await {
            Some(p) => Ok(Some(p)),
            None => {
                Err(ControlError::NotFound(format!("parent session {named} is not active")).into())
            }
        },
        (None, None) => Ok(None),
    }
}

/// Whether `parent` may have one more child, and who it runs as: not paused, within the
/// spawn bounds, counted against its fan-out across replicas, then the agent name decided.
async fn admit_child(
    shared: &ControlPlane,
    parent: &Principal,
    asked: Option<&str>,
) -> Result<(Reserved, ChildAgent), Reply> {
    // A paused session spawns nothing: a child would be a way around the pause.
    if let Some(paused) = shared.guardrails.paused(&parent.session_id) {
        return Err(ControlError::SessionPaused(format!(
            "the parent session is paused: {}",
            paused.reason
        ))
        .into());
    }
    // The spawn bounds before the budget: a refused child carves nothing.
    if let Err(SessionError::Bound { limit, used, max }) = shared.sessions.may_spawn(parent) {
        return Err(limit_reply(limit.to_owned(), json!(used), json!(max)));
    }
    // The fan-out across replicas (`state.redis`), last of the refusals that cost nothing:
    // counted here, given back (on drop) if the child is not made after all.
    let reserved = reserve_child(shared, parent).await?;
    let child = child_agent(shared, parent, asked).await?;
    Ok((reserved, child))
}

/// The new session's limits and its cap on pending approvals. The cap first (never more
/// than its parent's), then the budget: a child's is carved out of what its parent has
/// left (the `[sessions]` defaults do not apply to it: what it names, or half of what is
/// left); a root session gets the defaults for what it does not name.
async fn budget(
    shared: &ControlPlane,
    new: &NewSession,
    parent: Option<&Principal>,
) -> Result<(Limits, u32), Reply> {
    let cap = shared
        .approvals
        .cap_for(
            new.max_pending_approvals,
            parent.map(|p| p.session_id.as_str()),
            shared.config.sessions.max_pending_approvals,
        )
        .await
        .map_err(|e| match e {
            CapRefused::Invalid(m) => Reply::from(ControlError::BadRequest(m)),
            e => ControlError::Internal(e.to_string()).into(),
        })?;
    let named = Limits {
        max_calls: new.max_calls,
        max_cost_micros: new.max_cost.map(ostiary_policies::catalog::cost_to_micros),
        max_bytes_sent: new.max_bytes_sent,
        max_bytes_received: new.max_bytes_received,
    };
    let limits = match parent {
        Some(p) => match shared.guardrails.carve(&p.session_id, named).await {
            Ok(Ok(limits)) => limits,
            Ok(Err(hit)) => return Err(limit_reply(hit.limit, hit.used, hit.max)),
            Err(e) => return Err(ControlError::Proxy(e).into()),
        },
        None => named.or(shared.guardrails.default_limits()),
    };
    Ok((limits, cap))
}

/// Open the new session's account and store its cap; either failing ends the session
/// (fail closed: without its account its budget could not be kept, without its cap its
/// holds would not count against its ancestors').
async fn establish(
    shared: &ControlPlane,
    principal: &Principal,
    limits: Limits,
    cap: u32,
) -> Result<(), Reply> {
    let opened = shared
        .guardrails
        .open(
            &principal.session_id,
            limits,
            principal.parent.clone(),
            principal.expires_at,
        )
        .await;
    if let Err(e) = opened {
        let why = "its budget account could not be opened";
        let _ = shared.teardown.tear_down(&principal.session_id, why).await;
        return Err(ControlError::Proxy(e).into());
    }
    let parent_id = principal.parent.as_deref();
    let capped = shared
        .approvals
        .set_cap(&principal.session_id, parent_id, cap)
        .await;
    if let Err(e) = capped {
        let why = "its cap of pending approvals could not be stored";
        let _ = shared.teardown.tear_down(&principal.session_id, why).await;
        return Err(ControlError::Internal(format!(
            "storing the session's cap of pending approvals: {e}"
        ))
        .into());
    }
    Ok(())
}

/// The creation's `session` audit record.
fn record_created(shared: &ControlPlane, principal: &Principal, child: Option<&ChildAgent>) {
    shared.audit.session_event(
        &shared.metrics,
        &principal.session_id,
        &principal.agent,
        &principal.tenant,
        &match (&principal.parent, child) {
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
}

/// A child counted against its parent's fan-out across replicas; given back when dropped
/// unless [`Reserved::keep`] says the child was made.
struct Reserved {
    guardrails: std::sync::Arc<crate::guardrails::Guardrails>,
    parent: Option<String>,
}

impl Reserved {
    fn keep(mut self) {
        self.parent = None;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(parent) = self.parent.take() {
            let guardrails = self.guardrails.clone();
            tokio::spawn(async move { guardrails.release_child(&parent).await });
        }
    }
}

async fn reserve_child(shared: &ControlPlane, parent: &Principal) -> Result<Reserved, Reply> {
    let max = shared.config.sessions.max_children;
    match shared.guardrails.reserve_child(parent, max).await {
        Ok(Ok(())) => Ok(Reserved {
            guardrails: shared.guardrails.clone(),
            parent: shared
                .guardrails
                .shared
                .is_some()
                .then(|| parent.session_id.clone()),
        }),
        Ok(Err(used)) => Err(limit_reply("children".into(), json!(used), json!(max))),
        Err(e) => Err(ControlError::Proxy(e).into()),
    }
}

/// The agent a child of `parent` runs as (`asked` by its creator, or none), or the reply
/// refusing it. A refused spawn is audited (kind `spawn`) under the parent's session.
async fn child_agent(
    shared: &ControlPlane,
    parent: &Principal,
    asked: Option<&str>,
) -> Result<ChildAgent, Reply> {
    if let Some(name) = asked {
        if let Err(e) = registry::valid_name("agent", name) {
            return Err(ControlError::BadRequest(e.to_string()).into());
        }
    }
    let engine = shared.reloader.policies.current();
    let mut session = shared.guardrails.session_state(parent);
    // What the parent touched is in the spawn's context too.
    let remembered = shared
        .sessions
        .memory
        .state(
            shared.guardrails.shared.as_deref(),
            &parent.session_id,
            None,
            engine.reads_session_memory(),
            crate::store::now_ms(),
        )
        .await;
    match remembered {
        Ok((labels, _)) => session.labels = labels,
        Err(e) => return Err(ControlError::Proxy(e).into()),
    }
    let mut kept = None;
    let resolved = spawn::resolve(&engine, &shared.metrics, parent, &session, asked, &mut kept);
    if let Some(name) = asked.filter(|name| *name != parent.agent) {
        let request_id = crate::ids::request_id();
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "spawn");
        audit.update(|r| {
            r.set_principal(parent);
            r.reason = Some(format!("spawn a child session as agent {name:?}"));
            r.policy_version = Some(engine.version().to_string());
            // Kept like every decision, for replay and the shadow set.
            r.decided = kept;
        });
        audit.decided(resolved.as_ref().map(ChildAgent::policies));
    }
    resolved.map_err(|e| ControlError::Proxy(e).into())
}

fn limit_reply(limit: String, used: Value, max: Value) -> Reply {
    ControlError::LimitExceeded { limit, used, max }.into()
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
pub(super) async fn show(shared: &ControlPlane, id: &str) -> Reply {
    let Some(principal) = shared.sessions.find(id).await else {
        return ControlError::NotFound(format!("session {id} is not active")).into();
    };
    let account = shared.guardrails.meter.snapshot(id).unwrap_or_default();
    let paused = shared.guardrails.paused(id);
    let memory = match shared
        .sessions
        .memory
        .show(
            shared.guardrails.shared.as_deref(),
            id,
            crate::store::now_ms(),
        )
        .await
    {
        Ok(memory) => memory,
        Err(e) => return ControlError::Proxy(e).into(),
    };
    Reply(
        StatusCode::OK,
        json!({
            "session_id": principal.session_id,
            "agent": principal.agent,
            "tenant": principal.tenant,
            "parent": principal.parent,
            "depth": principal.depth,
            "profile": principal.profile,
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
            // `context.session.labels`, and the calls `context.session.recent` counts.
            "labels": memory.labels,
            "recent": memory.recent,
        }),
    )
}

/// `POST /v1/sessions/{id}/resume`: a human lifted a watchdog pause.
pub(super) async fn resume(shared: &ControlPlane, id: &str, by: &str) -> Reply {
    let Some(principal) = shared.sessions.find(id).await else {
        return ControlError::NotFound(format!("session {id} is not active")).into();
    };
    match shared.desk.resume(&principal.session_id, by).await {
        Ok(true) => Reply(
            StatusCode::OK,
            json!({"session_id": id, "status": "resumed"}),
        ),
        Ok(false) => ControlError::Conflict(format!("session {id} is not paused")).into(),
        Err(e) => ControlError::Internal(e.to_string()).into(),
    }
}

/// The optional body of `POST /v1/sessions/{id}/terminate`: why, and what became of the run
/// the session was made for (`ostiary run` reports its exit, the limit that ended it and
/// what it cleaned up; the report is sealed into the audit trail as a `run` record).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Termination {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    run: Option<serde_json::Map<String, Value>>,
}

/// The longest `reason` and `run` report a terminate may carry (they go into the audit).
const MAX_TERMINATION: usize = 16 * 1024;

/// `POST /v1/sessions/{id}/terminate`, with an optional [`Termination`] body.
pub(super) async fn terminate_as_told(
    shared: &ControlPlane,
    req: Request<Incoming>,
    id: &str,
) -> Reply {
    let told: Termination = match super::read_optional_json(req, MAX_TERMINATION).await {
        Ok(told) => told,
        Err(reply) => return reply,
    };
    let why = match told.reason.as_deref().map(str::trim) {
        Some(reason) if !reason.is_empty() => {
            format!(
                "session terminated: {}",
                reason.chars().take(500).collect::<String>()
            )
        }
        _ => "session terminated by an operator".to_owned(),
    };
    let principal = shared.sessions.find(id).await;
    let reply = terminate(shared, id, &why, "terminated").await;
    if let (Some(mut run), Some(principal), StatusCode::OK) = (told.run, principal, reply.0) {
        // The session's own end (its leases, its record) is the proxy's to vouch for.
        let cleaned = run
            .entry("cleaned")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(steps) = cleaned {
            steps.push(json!("session"));
        }
        let limit = run.get("limit").and_then(Value::as_str).map(str::to_owned);
        let request_id = crate::ids::request_id();
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "run");
        audit.update(|r| {
            r.set_principal(&principal);
            r.reason = Some(match &limit {
                Some(limit) => format!("the run was ended by its {limit} limit"),
                None => "the run ended".to_owned(),
            });
            r.run = Some(Value::Object(run));
        });
        match limit {
            Some(_) => audit.event("deny", Some("limit_exceeded")),
            None => audit.event("allow", None),
        }
    }
    reply
}

/// `DELETE /v1/sessions/{id}` and `POST /v1/sessions/{id}/terminate`.
pub(super) async fn terminate(shared: &ControlPlane, id: &str, why: &str, status: &str) -> Reply {
    match shared.teardown.tear_down(id, why).await {
        Ok(true) => Reply(StatusCode::OK, json!({"session_id": id, "status": status})),
        Ok(false) => ControlError::NotFound(format!("session {id} is not active")).into(),
        Err(e) => ControlError::Internal(e.to_string()).into(),
    }
}

/// `GET /v1/dead-letters?session=ID`.
pub(super) async fn dead_letters(shared: &ControlPlane, query: &str) -> Reply {
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
        Err(e) => ControlError::Internal(e.to_string()).into(),
    }
}
