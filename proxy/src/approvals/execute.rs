//! Running an approved request exactly once.
//!
//! ```text
//! claim (approved → executing) → session still live? → rebuild the held request →
//! runner (pipeline::execute): classify → recognise (the same tool) → placeholders →
//!   decide (approval.granted = true, under the policies in force now) →
//!   inject (credentials minted now, Idempotency-Key) → forward → reply (scrub,
//!   response DLP, byte meter) → store the response (executing → executed)
//! ```
//! The claim is the exactly-once guard: one guarded `UPDATE`, so of any number of tasks or
//! processes only one executes. A crash after the claim leaves the approval `executing`;
//! the next start puts it back to `approved` and it is sent again **with the same
//! `Idempotency-Key`** (derived from the approval id), so an upstream that honours the key
//! applies it once. Which of "before the upstream call" and "after it, before the result
//! was stored" a crash hit cannot be known from here; the key is what makes both safe.
//!
//! The request is recognised and decided afresh rather than replayed from the decision at
//! hold time: a policy change, a catalog change or a revoked session since then means it
//! does not run (`refused`).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::header::HOST;
use http::{Request, Response};
use http_body_util::BodyExt;

use super::model::{Approval, Status, StoredResponse};
use super::ApprovalQueue;
use crate::audit::{AuditGuard, AuditSink};
use crate::body::{self, ProxyBody};
use crate::classify::{Origin, Tunnel};
use crate::error::ProxyError;
use crate::guardrails::pause::resume_target;
use crate::metrics::Metrics;
use crate::session::{Principal, SessionRegistry};
use crate::store::{now_ms, Call};
use crate::{inject, scrub};

/// What an approved execution carries into the request phases.
#[derive(Debug, Clone)]
pub struct Approved {
    /// Who approved it (`context.approval.approver`).
    pub approver: String,
    /// The tool it was held as: recognised again, it must still be that tool.
    pub tool: Option<String>,
    /// The limits a human was asked about (`limit:calls`): granted again before it runs.
    pub grants: Vec<String>,
    /// Sent upstream as `Idempotency-Key`, so a crash and a re-send apply it once.
    pub idempotency_key: String,
}

/// An answer from [`Runner::run`], with the scrubber it went through (for whatever rewrites
/// it before it is stored).
pub type Answered = Result<(Response<ProxyBody>, Option<scrub::Scrubber>), ProxyError>;

/// What runs an approved request: the request path's phases, in their approved mode
/// (implemented where the data plane is assembled). The executor decides which approval
/// runs and records how it ended; how a request runs is not its business.
pub trait Runner: Send + Sync + std::fmt::Debug + 'static {
    /// Run the held request (`origin`, `req`) of `principal`'s session once. `audit`
    /// collects what the approval's record takes (credentials, leases, the address dialed).
    fn run<'a>(
        &'a self,
        approved: Approved,
        principal: Arc<Principal>,
        held: (Origin, Request<ProxyBody>),
        audit: &'a mut AuditGuard,
    ) -> BoxFuture<'a, Answered>;

    /// Resume a session a watchdog paused (an approved "resume?" question): `Ok(false)`
    /// when it is no longer paused.
    fn resume<'a>(
        &'a self,
        session: &'a str,
        by: &'a str,
    ) -> BoxFuture<'a, Result<bool, crate::store::StoreError>>;

    /// Release a run held for approval into the queue (an approved "start this run?"),
    /// once policy, asked again with the approval granted, still permits it.
    fn release_run<'a>(
        &'a self,
        run: &'a str,
        approver: &'a str,
    ) -> BoxFuture<'a, Result<crate::runs::intake::Release, crate::store::StoreError>>;
}

/// What executing approvals takes: the queue it claims from, the sessions it re-checks,
/// the runner, and the audit trail of its scratch records.
#[derive(Debug, Clone)]
pub struct Executor {
    pub queue: Arc<ApprovalQueue>,
    pub sessions: Arc<SessionRegistry>,
    pub runner: Arc<dyn Runner>,
    pub audit: AuditSink,
    pub metrics: Arc<Metrics>,
}

/// Header every execution carries (the de facto standard name, as Stripe and the IETF
/// draft spell it).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How an execution ended, before it is stored.
enum Ending {
    Executed(StoredResponse),
    /// Re-authorization said no; nothing was sent.
    Refused(String),
    /// Nothing usable came back (or nothing could be sent).
    Failed(String),
}

/// Execute `id` if it is approved and nobody else claimed it. Safe to call from any number
/// of tasks at once: all but one return without doing anything.
pub async fn run(shared: Executor, id: String) {
    let queue = &shared.queue;
    let claimed = {
        let id = id.clone();
        queue.store.call(move |s| s.claim(&id, now_ms())).await
    };
    let approval = match claimed {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(approval = %id, error = %e, "claiming an approval failed");
            return;
        }
    };
    tracing::info!(approval = %id, attempt = approval.attempts, "approval claimed for execution");
    let _held = Held::new(queue, &id);
    let _ = queue.refresh_gauges().await;
    // The claim's heartbeat: while this runs, no other replica takes the execution for
    // abandoned (`approvals.claim_lease`).
    let (ending, injected) = {
        let heartbeat = renew_while_running(queue, &id);
        tokio::pin!(heartbeat);
        tokio::select! {
            done = execute(&shared, &approval) => done,
            () = &mut heartbeat => unreachable!("the heartbeat never ends"),
        }
    };
    let (status, result, reason, transition, decision, error, code) = match ending {
        Ending::Executed(response) => {
            let code = response.status;
            (
                Status::Executed,
                Some(response),
                None,
                "executed",
                "allow",
                None,
                Some(code),
            )
        }
        Ending::Refused(reason) => (
            Status::Refused,
            None,
            Some(reason),
            "refused",
            "deny",
            Some("denied"),
            None,
        ),
        Ending::Failed(reason) => (
            Status::Failed,
            None,
            Some(reason),
            "failed",
            "error",
            Some("upstream_error"),
            None,
        ),
    };
    let executed_under = injected.policy_version.clone();
    let mut done = approval.clone();
    done.status = status;
    done.executed_policy_version = executed_under.clone();
    let text = match &reason {
        Some(reason) => format!("{transition}: {reason}"),
        None => format!("{transition} (attempt {})", approval.attempts),
    };
    // The execution's record is written before its outcome is stored, so that no answer
    // the agent can collect lacks its record (no audit, no answer). A record that cannot be
    // written leaves the approval `executing`: its claim lapses, and once the trail takes
    // records again the execution is sent again with the same idempotency key.
    queue.record_with(&done, transition, decision, error, text, code, |r| {
        r.credentials = injected.credentials;
        r.leases = injected.leases;
        r.upstream = injected.upstream;
        // The set that decided the execution; without one (nothing was decided again), the
        // sink names the set in force.
        r.policy_version = injected.policy_version;
    });
    if !queue.flush_audit().await {
        tracing::error!(approval = %id, "the execution's audit record could not be written; its outcome is not stored");
        return;
    }
    let stored = {
        let (id, reason, result) = (id.clone(), reason.clone(), result.clone());
        queue
            .store
            .call(move |s| {
                s.finish(
                    &id,
                    status,
                    result.as_ref(),
                    reason.as_deref(),
                    executed_under.as_deref(),
                    now_ms(),
                )
            })
            .await
    };
    match stored {
        Ok(true) => {}
        Ok(false) => {
            tracing::error!(approval = %id, "execution finished but the approval was no longer executing");
            return;
        }
        Err(e) => {
            // The upstream call happened but its outcome is not stored: the approval stays
            // `executing` and the next start re-sends it with the same idempotency key.
            tracing::error!(approval = %id, error = %e, "storing an execution's outcome failed");
            return;
        }
    }
    // Retries waiting on the approval (`Prefer: wait`) look again now the outcome is there:
    // the record's own wake-up came before it was.
    queue.bump();
    let _ = queue.refresh_gauges().await;
}

/// A claim this process holds, until its execution ends (then forgotten: finished, or left
/// for recovery); what is still held at shutdown is released ([`super::sweep::release`]).
struct Held<'a> {
    queue: &'a super::ApprovalQueue,
    id: String,
}

impl<'a> Held<'a> {
    fn new(queue: &'a super::ApprovalQueue, id: &str) -> Self {
        queue
            .claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned());
        Self {
            queue,
            id: id.to_owned(),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.queue
            .claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Renew the claim on `id` every third of `approvals.claim_lease`, forever (the caller
/// drops it when the execution ends).
async fn renew_while_running(queue: &super::ApprovalQueue, id: &str) {
    let every = (queue.config.claim_lease / 3).max(std::time::Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let owned = id.to_owned();
        match queue.store.call(move |s| s.renew(&owned, now_ms())).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(approval = %id, "this execution's claim was taken over (its lease ran out); the other executor sends it with the same idempotency key")
            }
            Err(e) => {
                tracing::warn!(approval = %id, error = %e, "renewing an execution's claim failed")
            }
        }
    }
}

/// What the execution injected, for its audit record.
#[derive(Debug, Default)]
pub struct Used {
    pub credentials: Vec<String>,
    pub leases: Vec<String>,
    pub upstream: Option<String>,
    /// The version of the policy set that decided the execution, when one did.
    pub policy_version: Option<String>,
}

async fn execute(shared: &Executor, approval: &Approval) -> (Ending, Used) {
    let mut used = Used::default();
    let ending = match attempt(shared, approval, &mut used).await {
        Ok(response) => Ending::Executed(response),
        Err(Refusal::Refused(reason)) => Ending::Refused(reason),
        Err(Refusal::Failed(reason)) => Ending::Failed(reason),
    };
    (ending, used)
}

enum Refusal {
    Refused(String),
    Failed(String),
}

impl From<ProxyError> for Refusal {
    fn from(e: ProxyError) -> Self {
        // Refused by the pipeline for what it no longer is (another tool, escalated again):
        // its reason is the whole story.
        if let ProxyError::ApprovalNotExecuted {
            status: "refused",
            reason,
            ..
        } = e
        {
            return Refusal::Refused(reason);
        }
        match e.side() {
            crate::error::Side::Upstream | crate::error::Side::Internal => {
                Refusal::Failed(e.to_string())
            }
            _ if e.policies().is_empty() => Refusal::Refused(e.to_string()),
            // The determining policies say why in terms an approver can look up.
            _ => Refusal::Refused(format!("{e} (policies: {})", e.policies().join(", "))),
        }
    }
}

async fn attempt(
    shared: &Executor,
    approval: &Approval,
    used: &mut Used,
) -> Result<StoredResponse, Refusal> {
    let approver = approval
        .approver
        .clone()
        .ok_or_else(|| Refusal::Refused("the approval names no approver".into()))?;
    // A run a trigger held: approving it starts it (it has no session yet to check).
    if let Some(run) = crate::runs::gate::run_target(approval) {
        use crate::runs::intake::Release;
        return match shared.runner.release_run(run, &approver).await {
            Ok(Release::Queued) => Ok(StoredResponse {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: format!(r#"{{"status":"queued","run_id":"{run}"}}"#).into_bytes(),
                truncated: false,
            }),
            Ok(Release::NotWaiting) => Err(Refusal::Refused(
                "the run is no longer waiting for approval (cancelled meanwhile)".into(),
            )),
            Ok(Release::Refused(why)) => Err(Refusal::Refused(why)),
            Err(e) => Err(Refusal::Failed(format!("releasing the run: {e}"))),
        };
    }
    // The session must still be live: a revoked or expired session's approvals never run.
    // Looked up in the store too: another replica may have made it and held the request.
    let principal = shared.sessions.find(&approval.session).await;
    if principal.is_none() || !shared.sessions.is_live(&approval.session) {
        return Err(Refusal::Refused(
            "the session ended before the request could run".into(),
        ));
    }
    let principal = principal.ok_or_else(|| Refusal::Refused("the session ended".into()))?;
    // A watchdog pause put before a human: approving it resumes the session; nothing is
    // sent anywhere.
    if let Some(session) = resume_target(approval) {
        return match shared.runner.resume(session, &approver).await {
            Ok(true) => Ok(StoredResponse {
                status: 200,
                headers: vec![("content-type".into(), "application/json".into())],
                body: br#"{"status":"resumed"}"#.to_vec(),
                truncated: false,
            }),
            Ok(false) => Err(Refusal::Refused("the session is no longer paused".into())),
            Err(e) => Err(Refusal::Failed(format!("resuming the session: {e}"))),
        };
    }
    let held = rebuild(approval, &principal)?;
    let approved = Approved {
        approver,
        tool: approval.observed.tool.clone(),
        grants: approval
            .policies
            .iter()
            .filter_map(|p| p.strip_prefix("limit:"))
            .map(str::to_owned)
            .collect(),
        idempotency_key: approval.idempotency_key(),
    };
    // The same phases as a live request; what they learn goes into the approval's record.
    let mut audit = AuditGuard::scratch(&shared.audit, &shared.metrics, &approval.id, "http");
    let answered = shared
        .runner
        .run(approved, principal, held, &mut audit)
        .await;
    if let Some(record) = audit.take() {
        used.credentials = record.credentials;
        used.leases = record.leases;
        used.upstream = record.upstream;
        used.policy_version = record.policy_version;
    }
    let (response, scrubber) = answered?;
    let kept = keep(response, shared.queue.config.max_response_bytes).await?;
    // A held MCP call keeps its JSON-RPC id; its answer is stored as one message.
    Ok(match &approval.observed.rpc_id {
        Some(id) => mcp_answer(kept, id, scrubber.as_ref()),
        None => kept,
    })
}

/// An MCP call's answer as one JSON-RPC message: the server may have answered with an SSE
/// stream (progress notifications, then the response); the agent collecting it later gets
/// the response to its call as `application/json`. Anything else is kept as it came.
///
/// The message is decoded and written anew (the retry that collects it puts its own id in
/// it the same way), and serialising turns escapes back into characters (`\u002B` into
/// `+`): what is stored is scrubbed again as written, with the execution's `scrubber`. A
/// JSON answer is stored in that same canonical form, so that the collecting retry's
/// rewrite changes nothing but the id.
fn mcp_answer(
    kept: StoredResponse,
    id: &serde_json::Value,
    scrubber: Option<&scrub::Scrubber>,
) -> StoredResponse {
    let media = kept
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.to_ascii_lowercase());
    let sse = media
        .as_deref()
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let json = media
        .as_deref()
        .is_some_and(|v| v.starts_with("application/json"));
    if kept.status != 200 || kept.truncated || !(sse || json) {
        return kept;
    }
    let answer = if sse {
        let text = String::from_utf8_lossy(&kept.body).replace("\r\n", "\n");
        text.split("\n\n")
            .map(|event| {
                event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .filter_map(|data| serde_json::from_str::<serde_json::Value>(&data).ok())
            .find(|m| {
                m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
            })
    } else {
        serde_json::from_slice::<serde_json::Value>(&kept.body)
            .ok()
            .filter(serde_json::Value::is_object)
    };
    let Some(message) = answer else {
        return kept;
    };
    let written = message.to_string();
    let body = match scrubber {
        Some(scrubber) => scrubber.scrub_text(written),
        None => written,
    };
    let mut headers: Vec<(String, String)> = kept
        .headers
        .into_iter()
        .filter(|(n, _)| {
            !n.eq_ignore_ascii_case("content-type") && !n.eq_ignore_ascii_case("content-length")
        })
        .collect();
    if sse {
        headers.clear();
    }
    headers.push(("content-type".into(), "application/json".into()));
    StoredResponse {
        status: 200,
        headers,
        body: body.into_bytes(),
        truncated: false,
    }
}

/// The stored request as the pipeline first saw it: inside a tunnel for https, absolute
/// form for http. Its URL was classified once already; a stored URL that no longer parses
/// means the row was tampered with.
fn rebuild(
    approval: &Approval,
    principal: &Arc<crate::session::Principal>,
) -> Result<(Origin, Request<ProxyBody>), Refusal> {
    let held = &approval.request;
    let uri: http::Uri = held
        .url
        .parse()
        .map_err(|e| Refusal::Failed(format!("stored URL: {e}")))?;
    let mut builder = Request::builder().method(held.method.as_str());
    for (name, value) in &held.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let origin = if uri.scheme_str() == Some("https") {
        let authority = uri
            .authority()
            .ok_or_else(|| Refusal::Failed("stored URL has no host".into()))?;
        let host = crate::egress::address::normalize_host(authority.host())
            .map_err(|e| Refusal::Failed(format!("stored host: {e}")))?;
        let port = uri.port_u16().unwrap_or(443);
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        builder = builder.uri(path).header(HOST, authority.as_str());
        Origin::Tunnel(Arc::new(Tunnel {
            host,
            port,
            principal: principal.clone(),
        }))
    } else {
        builder = builder.uri(uri);
        Origin::Plain
    };
    let req = builder
        .body(body::full(Bytes::from(held.body.clone())))
        .map_err(|e| Refusal::Failed(format!("stored request: {e}")))?;
    Ok((origin, req))
}

/// Read the response for storage: status, end-to-end headers, and the body up to `limit`.
async fn keep(response: Response<ProxyBody>, limit: usize) -> Result<StoredResponse, Refusal> {
    let (mut parts, mut body) = response.into_parts();
    inject::strip_hop_by_hop(&mut parts.headers, false);
    inject::strip_ostiary_headers(&mut parts.headers);
    let mut kept = BytesMut::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Refusal::Failed(format!("response body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            let room = limit.saturating_sub(kept.len());
            if data.len() > room {
                kept.extend_from_slice(&data[..room]);
                truncated = true;
                // The request ran; the rest of its answer is not kept, and not waited for.
                break;
            }
            kept.extend_from_slice(&data);
        }
    }
    let headers = parts
        .headers
        .iter()
        .filter(|(name, _)| {
            // The stored body is not the encoded length any more once cut.
            !(truncated && *name == http::header::CONTENT_LENGTH)
        })
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    Ok(StoredResponse {
        status: parts.status.as_u16(),
        headers,
        body: kept.to_vec(),
        truncated,
    })
}
