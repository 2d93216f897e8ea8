//! The control API (docs/design.md §6), on its own listener that the egress guard never lets the
//! proxy reach: sessions, approvals ([`approvals`]), audit, policy reload and versions,
//! metrics, health.
//!
//! Admin calls carry `Authorization: Bearer <admin token>`, compared in constant time.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::header::AUTHORIZATION;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

mod approvals;
mod error;
pub mod runs;
mod sessions;
mod undo;

use error::ControlError;

use crate::approvals::Verdict;
use crate::audit::verify::{self, Query};
use crate::body::{full, ProxyBody};
use crate::ids;
use crate::plane::ControlPlane;
use crate::policy_store::{self, ReloadError, Trigger};
use crate::respond::json_response;
use crate::store::Call;

/// Largest control request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// Serve the control listener until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<ControlPlane>,
    shutdown: impl Future<Output = ()>,
) {
    serve_routes(listener, shared, shutdown, route).await
}

/// Serve `listen.triggers` until `shutdown` resolves: webhook deliveries only (`POST
/// /v1/triggers/{name}`) and `/healthz`, so that what faces the senders is not the
/// control API.
pub async fn serve_triggers(
    listener: TcpListener,
    shared: Arc<ControlPlane>,
    shutdown: impl Future<Output = ()>,
) {
    serve_routes(listener, shared, shutdown, route_triggers).await
}

/// Accept connections on `listener`, each request answered by `router`, until `shutdown`;
/// then let the connections in flight finish (for up to five seconds).
async fn serve_routes<R, F>(
    listener: TcpListener,
    shared: Arc<ControlPlane>,
    shutdown: impl Future<Output = ()>,
    router: R,
) where
    R: Fn(Arc<ControlPlane>, Request<Incoming>) -> F + Copy + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let tracker = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                tracker.spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(router(shared, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(std::time::Duration::from_secs(10))
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
    tracker.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tracker.wait()).await;
}

async fn route_triggers(shared: Arc<ControlPlane>, req: Request<Incoming>) -> Response<ProxyBody> {
    let request_id = ids::request_id();
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => {
            json_response(StatusCode::OK, &json!({"status": "ok"}), &request_id)
        }
        (&Method::POST, ["v1", "triggers", name]) => {
            let name = (*name).to_owned();
            runs::deliver(&shared, req, &name, &request_id).await
        }
        _ => {
            let Reply(status, mut body) = ControlError::NotFound(format!(
                "no route {path}: this listener takes webhook deliveries only"
            ))
            .into();
            body["request_id"] = json!(request_id);
            json_response(status, &body, &request_id)
        }
    }
}

pub(crate) struct Reply(StatusCode, serde_json::Value);

async fn route(shared: Arc<ControlPlane>, req: Request<Incoming>) -> Response<ProxyBody> {
    let request_id = ids::request_id();
    let path = req.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => {
            return json_response(StatusCode::OK, &json!({"status": "ok"}), &request_id)
        }
        (&Method::GET, ["readyz"]) => return ready(&shared, &request_id).await,
        // Metrics name agents, tenants, credentials and tools: admin only, unless the
        // operator made them public for a scraper that cannot send a token.
        (&Method::GET, ["metrics"]) if shared.config.control.public_metrics => {
            return metrics(&shared)
        }
        // The approvers' own doors: a signed link and a signed Slack callback are their
        // credentials, not the admin token.
        (&Method::GET | &Method::HEAD | &Method::POST, _)
            if approvals::review_token(&path).is_some() =>
        {
            let token = approvals::review_token(&path)
                .unwrap_or_default()
                .to_owned();
            return approvals::review(&shared, req, &token).await;
        }
        // A webhook's signature is its credential, not the admin token.
        (&Method::POST, ["v1", "triggers", name]) => {
            let name = (*name).to_owned();
            return runs::deliver(&shared, req, &name, &request_id).await;
        }
        (&Method::POST, ["v1", "slack", "interactions"]) => {
            let Reply(status, mut body) = approvals::slack(&shared, req).await;
            if status.is_client_error() || status.is_server_error() {
                body["request_id"] = json!(request_id);
            }
            return json_response(status, &body, &request_id);
        }
        _ => {}
    }
    let admin = is_admin(&shared, &req);
    // A session creating a child of its own: its token is its credential here.
    if !admin && req.method() == Method::POST && segments.as_slice() == ["v1", "sessions"] {
        if let Some(parent) = sessions::bearer_session(&shared, &req).await {
            let Reply(status, mut body) = match parent {
                Ok(parent) => sessions::create(&shared, req, Some(parent)).await,
                Err(e) => {
                    ControlError::Unauthenticated(format!("the session token is not valid: {e}"))
                        .into()
                }
            };
            body["request_id"] = json!(request_id);
            return json_response(status, &body, &request_id);
        }
    }
    // A trigger's own token may start its runs (the intake checks it).
    if !admin && runs::is_start(req.method(), &segments) {
        return runs::start(&shared, req, false, &request_id).await;
    }
    if !admin {
        let Reply(status, mut body) = ControlError::Unauthenticated(
            "this call needs Authorization: Bearer <admin token>".into(),
        )
        .into();
        body["request_id"] = json!(request_id);
        return json_response(status, &body, &request_id);
    }
    let reply = match (req.method().clone(), segments.as_slice()) {
        (Method::GET, ["metrics"]) => return metrics(&shared),
        (Method::POST, ["v1", "sessions"]) => sessions::create(&shared, req, None).await,
        (Method::GET, ["v1", "sessions", id]) => sessions::show(&shared, id).await,
        (Method::DELETE, ["v1", "sessions", id]) => {
            sessions::terminate(&shared, id, "session revoked", "revoked").await
        }
        (Method::POST, ["v1", "sessions", id, "terminate"]) => {
            sessions::terminate_as_told(&shared, req, id).await
        }
        (Method::POST, ["v1", "sessions", id, "undo"]) => undo::undo(&shared, req, id).await,
        (Method::POST, ["v1", "sessions", id, "resume"]) => {
            sessions::resume(&shared, id, "an operator").await
        }
        (Method::GET, ["v1", "dead-letters"]) => {
            sessions::dead_letters(&shared, req.uri().query().unwrap_or("")).await
        }
        (Method::POST, ["v1", "policy", "reload"]) => reload_policies(&shared).await,
        (Method::POST, ["v1", "policy", "promote"]) => promote_shadow(&shared).await,
        (Method::GET, ["v1", "policy", "versions"]) => {
            policy_versions(&shared, req.uri().query().unwrap_or("")).await
        }
        (Method::GET, ["v1", "approvals"]) => {
            approvals::list(&shared, req.uri().query().unwrap_or("")).await
        }
        (Method::GET, ["v1", "approvals", id]) => approvals::show(&shared, id).await,
        (Method::POST, ["v1", "approvals", id, "approve"]) => {
            approvals::decide_api(&shared, req, id, Verdict::Approve).await
        }
        (Method::POST, ["v1", "approvals", id, "deny"]) => {
            approvals::decide_api(&shared, req, id, Verdict::Deny).await
        }
        (Method::POST, ["v1", "approvals", id, "link"]) => approvals::link(&shared, req, id).await,
        (Method::POST, ["v1", "runs"]) => {
            return runs::start(&shared, req, true, &request_id).await
        }
        (Method::GET, ["v1", "runs"]) => runs::list(&shared, req.uri().query().unwrap_or("")).await,
        (Method::GET, ["v1", "runs", id]) => runs::show(&shared, id).await,
        (Method::POST, ["v1", "runs", id, "cancel"]) => runs::cancel(&shared, id).await,
        (Method::POST, ["v1", "runs", id, "retry"]) => runs::retry(&shared, id).await,
        (Method::GET, ["v1", "audit"]) => {
            return audit_lines(&shared, req.uri().query().unwrap_or(""), &request_id).await
        }
        _ => ControlError::NotFound(format!("no route {path}")).into(),
    };
    let Reply(status, mut body) = reply;
    if status.is_client_error() || status.is_server_error() {
        body["request_id"] = json!(request_id);
    }
    json_response(status, &body, &request_id)
}

/// `GET /metrics`: the Prometheus (OpenMetrics) text.
fn metrics(shared: &ControlPlane) -> Response<ProxyBody> {
    let mut response = Response::new(full(shared.metrics.encode()));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    response
}

fn is_admin<B>(shared: &ControlPlane, req: &Request<B>) -> bool {
    let Some(value) = req.headers().get(AUTHORIZATION) else {
        return false;
    };
    let Some(token) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    bool::from(token.ct_eq(shared.admin_token.expose().as_bytes()))
}

pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Reply> {
    let bytes: Bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| Reply::from(ControlError::BadRequest(format!("body: {e}"))))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ControlError::BadRequest(format!("body: {e}")).into())
}

/// An optional JSON body of at most `limit` bytes: empty (or only whitespace) is
/// `T::default()`. Strict: a key given twice is refused, never guessed between.
pub(crate) async fn read_optional_json<T: serde::de::DeserializeOwned + Default>(
    req: Request<Incoming>,
    limit: usize,
) -> Result<T, Reply> {
    let bad =
        |e: &dyn std::fmt::Display| Reply::from(ControlError::BadRequest(format!("body: {e}")));
    let bytes: Bytes = Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|e| bad(&e))?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value = crate::strict_json::parse(&bytes).map_err(|e| bad(&e))?;
    serde_json::from_value(value).map_err(|e| bad(&e))
}

/// `POST /v1/policy/reload`: the same reload as a file change or `SIGHUP`. An invalid set
/// answers 422 and leaves the set in force untouched.
async fn reload_policies(shared: &Arc<ControlPlane>) -> Reply {
    match policy_store::reload(shared.reloader.clone(), Trigger::Api).await {
        Ok(report) => Reply(
            StatusCode::OK,
            json!({
                "status": "reloaded",
                "policies": report.policies,
                "generation": report.generation,
                "version": report.version,
            }),
        ),
        Err(ReloadError::Invalid(e)) => ControlError::PolicyInvalid(e.to_string()).into(),
        Err(e @ ReloadError::Interrupted(_)) => ControlError::Internal(e.to_string()).into(),
    }
}

/// `POST /v1/policy/promote`: the shadow set becomes the enforced one (`crate::promote`),
/// audited as kind `policy`. No shadow set, or the embedded library in force, is 409; a
/// shadow set that no longer loads 422, and nothing changes.
async fn promote_shadow(shared: &Arc<ControlPlane>) -> Reply {
    use crate::promote::PromoteError;
    let reloader = shared.reloader.clone();
    let request_id = crate::ids::request_id();
    let mut audit =
        crate::audit::AuditGuard::start(&reloader.audit, &reloader.metrics, &request_id, "policy");
    let before = reloader.policies.current().version().to_string();
    let policies = reloader.policies.clone();
    let result = match tokio::task::spawn_blocking(move || policies.promote()).await {
        Ok(result) => result,
        Err(e) => return ControlError::Internal(format!("promotion did not complete: {e}")).into(),
    };
    match result {
        Ok(report) => {
            reloader.metrics.policy_reloaded(true, report.generation);
            reloader
                .checks
                .prepare(reloader.policies.current().catalog());
            tracing::info!(version = %report.version, replaced = %before, "shadow set promoted");
            audit.update(|r| {
                r.reason = Some(format!(
                    "shadow set promoted: version {} replaces {before} ({} policies)",
                    report.version, report.policies
                ));
                r.policy_version = Some(report.version.clone());
            });
            audit.event("allow", None);
            Reply(
                StatusCode::OK,
                json!({
                    "status": "promoted",
                    "version": report.version,
                    "replaced": before,
                    "policies": report.policies,
                    "generation": report.generation,
                }),
            )
        }
        Err(e) => {
            audit.update(|r| r.reason = Some(format!("shadow set not promoted: {e}")));
            audit.event("error", Some("policy_invalid"));
            match e {
                PromoteError::NoShadow | PromoteError::Embedded(_) => {
                    ControlError::Conflict(e.to_string()).into()
                }
                PromoteError::Invalid(e) => ControlError::PolicyInvalid(e.to_string()).into(),
                PromoteError::Io(_) => ControlError::Internal(e.to_string()).into(),
            }
        }
    }
}

/// `GET /v1/policy/versions?limit=`: the policy sets that were live, the most recently gone
/// live first, with when each first went live, last went live and was last replaced; and
/// which one this replica serves (`current`).
async fn policy_versions(shared: &ControlPlane, query: &str) -> Reply {
    let mut limit = 100usize;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if key == "limit" {
            limit = match value.parse::<usize>() {
                Ok(n) => n.clamp(1, 10_000),
                Err(_) => {
                    return ControlError::BadRequest(format!("limit {value:?} is not a number"))
                        .into()
                }
            };
        }
    }
    let current = shared.reloader.policies.current().version().to_string();
    let rows = match shared.reloader.policies.history() {
        Some(history) => match history.call(move |h| h.list(limit)).await {
            Ok(rows) => rows,
            Err(e) => return ControlError::Internal(e.to_string()).into(),
        },
        None => Vec::new(),
    };
    let versions: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            json!({
                "version": r.version,
                "current": r.version == current,
                "live": r.replaced_ms.is_none(),
                "first_live_ms": r.first_live_ms,
                "last_live_ms": r.last_live_ms,
                "replaced_ms": r.replaced_ms,
                "policies": r.policies,
                "tools": r.tools,
            })
        })
        .collect();
    Reply(
        StatusCode::OK,
        json!({ "current": current, "versions": versions }),
    )
}

/// The placeholder variables of the credentials a session may use: every binding with a
/// host that some policy could permit or that serves catalog tools (docs/design.md §9). Values are worthless by design; a child
/// session's carry its own id (`ostiary:github@ses_…`), so its parent's do not work in it.
pub(crate) fn placeholders(
    shared: &ControlPlane,
    child: Option<&str>,
) -> serde_json::Map<String, serde_json::Value> {
    let engine = shared.reloader.policies.current();
    // A host reached only through catalog tools (no `http` permit names it) still needs
    // its placeholder: an SDK refuses to start without an API key to send. The same
    // test as the CONNECT that lets the tunnel open.
    shared
        .credentials
        .broker
        .bindings()
        .iter()
        .filter(|b| {
            b.hosts.iter().any(|h| {
                h.starts_with("*.")
                    || engine.may_permit_http(h)
                    || crate::recognise::serves_tools(engine.catalog(), h)
            })
        })
        .filter_map(|b| {
            let value = match child {
                Some(session) => format!("{}@{session}", b.placeholder()),
                None => b.placeholder(),
            };
            Some((b.env_var()?, serde_json::Value::from(value)))
        })
        .collect()
}

async fn audit_lines(shared: &ControlPlane, query: &str, request_id: &str) -> Response<ProxyBody> {
    let mut q = Query::default();
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "session" => q.session = Some(value.into_owned()),
            "decision" => q.decision = Some(value.into_owned()),
            "since" => match parse_since(&value) {
                Some(ms) => q.since_ms = Some(ms),
                None => {
                    let Reply(s, b) = ControlError::BadRequest("since must be milliseconds since the epoch, RFC 3339, or a duration like 15m".into()).into();
                    return json_response(s, &b, request_id);
                }
            },
            "limit" => q.limit = value.parse().ok(),
            _ => {}
        }
    }
    shared.audit.flush().await;
    let trail = shared.trail.clone();
    let result = tokio::task::spawn_blocking(move || verify::query(&*trail, &q)).await;
    match result {
        Ok(Ok(records)) => {
            let mut text = String::new();
            for r in records {
                if let Ok(line) = serde_json::to_string(&r) {
                    text.push_str(&line);
                    text.push('\n');
                }
            }
            let mut response = Response::new(full(text));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-ndjson"),
            );
            response
        }
        Ok(Err(e)) => {
            let Reply(s, b) = ControlError::Internal(e.to_string()).into();
            json_response(s, &b, request_id)
        }
        Err(e) => {
            let Reply(s, b) = ControlError::Internal(e.to_string()).into();
            json_response(s, &b, request_id)
        }
    }
}

/// `since` as epoch milliseconds, RFC 3339, or a duration back from now (`15m`).
pub fn parse_since(text: &str) -> Option<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return t
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as i64);
    }
    humantime::parse_duration(text)
        .ok()
        .map(|d| crate::store::now_ms() - d.as_millis() as i64)
}

/// `GET /readyz`: 200 while the proxy can serve, else 503 naming each component that cannot:
/// the audit trail (while its records cannot be written, nothing is forwarded), the store
/// (sessions, approvals and audit live there), and Redis when counters are shared (budgets
/// and rate limits refuse without it). Store and Redis are asked afresh, each within
/// [`READY_TIMEOUT`].
async fn ready(shared: &ControlPlane, request_id: &str) -> Response<ProxyBody> {
    let audit = shared.audit.status();
    let trail = shared.trail.clone();
    let store = tokio::time::timeout(READY_TIMEOUT, trail.call(|s| s.last().map(drop))).await;
    let store = match store {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {READY_TIMEOUT:?}")),
    };
    let redis = match &shared.guardrails.shared {
        Some(counters) => Some(
            match tokio::time::timeout(READY_TIMEOUT, counters.ping()).await {
                Ok(status) => status,
                Err(_) => crate::counters::Status {
                    ok: false,
                    reason: Some(format!("no answer within {READY_TIMEOUT:?}")),
                },
            },
        ),
        None => None,
    };
    let ok = audit.available && store.is_ok() && redis.as_ref().is_none_or(|r| r.ok);
    let mut components = json!({
        "audit": {
            "ok": audit.available,
            "reason": audit.reason,
            "queued": audit.queued,
            "head_seq": audit.head_seq,
        },
        "store": {
            "ok": store.is_ok(),
            "reason": store.err(),
        },
    });
    if let Some(redis) = redis {
        components["redis"] = json!({ "ok": redis.ok, "reason": redis.reason });
    }
    let body = json!({
        "status": if ok { "ready" } else { "unavailable" },
        "components": components,
    });
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(status, &body, request_id)
}

/// How long `/readyz` waits for the store and for Redis.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
