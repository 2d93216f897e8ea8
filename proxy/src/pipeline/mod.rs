//! The request pipeline: the one place that lists the phases of docs/design.md §3 in order, for a
//! live request ([`handle`]), for an approved one being executed ([`execute`]) and for the
//! recorded undo of an earlier call ([`reverse`]), each phase in its own module named by its
//! verb.
//!
//! ```text
//! authenticate → gate → classify → [collect] → recognise → rate → idempotency →
//! placeholders → decide (evaluate, check, limit, [hold]) → remember → inject → forward →
//! reply → journal                                          (audit: a guard around all)
//! ```
//! A plain request, a REST tool call and a JSON-RPC POST to a catalogued MCP endpoint take
//! the same phases; `recognise` says which one it is and `decide` decides it accordingly
//! (one decision, or one per message). An approved execution takes the same phases from
//! `classify` on, in [`Mode::Approved`]: decided again with the approval under the policies
//! in force now; rate, checks, budget and hold were settled when it was held; its answer
//! goes through the same scrub, response DLP and byte meters, and is stored by
//! [`crate::approvals::execute`] for the agent to collect.

use std::sync::Arc;

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use http::{Method, Request, Response, Version};
use hyper::body::Incoming;

use crate::audit::AuditGuard;
use crate::body::{self, ProxyBody};
use crate::classify::{self, Origin};
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::session::Principal;
use crate::{escalate, ids};

mod admit;
mod answer;
mod collect;
mod ctx;
mod decide;
mod decide_mcp;
mod forward;
mod idempotency;
mod inject;
mod placeholders;
mod rate;
mod recognise;
mod remember;
mod reply;
mod upgrade;

use crate::approvals::Approved;
pub(crate) use ctx::{Mode, Reversal};
use ctx::{Note, RequestCtx};
use idempotency::Keyed;

/// Handle one inspected HTTP request (absolute-form on the proxy listener, or any request
/// inside an intercepted tunnel). Always answers; always leaves one audit record of its own
/// (plus one record per message of a JSON-RPC batch).
pub async fn handle(
    plane: Arc<DataPlane>,
    origin: Origin,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let request_id = ids::request_id();
    // Outermost, so that every path below — including a dropped future when the agent hangs
    // up — leaves a record.
    let mut audit = AuditGuard::start(&plane.audit, &plane.metrics, &request_id, "http");
    // The wire guard stops inspecting after an Upgrade head; a declined upgrade must not
    // leave a connection whose next requests go unchecked. The same for a CONNECT inside a
    // tunnel (always refused): its head switched the guard to pass-through.
    let upgrade_asked = (req.version() == Version::HTTP_11 && req.headers().contains_key(UPGRADE))
        || (req.method() == Method::CONNECT && req.version() <= Version::HTTP_11);
    // A refusal may come before the body was read; the connection then cannot carry another
    // request (hyper closes it once the answer is out), and a client that is not told so may
    // send its next request into the closing socket.
    let carries_body = req.version() <= Version::HTTP_11
        && (req.headers().contains_key(TRANSFER_ENCODING)
            || req
                .headers()
                .get(CONTENT_LENGTH)
                .is_some_and(|len| len.as_bytes() != b"0"));
    let mut note = Note::default();
    let result = run(&plane, &origin, req, &mut audit, &request_id, &mut note).await;
    let refused = result
        .as_ref()
        .err()
        .is_some_and(crate::guardrails::pause::counts_as_denial);
    let held = result
        .as_ref()
        .err()
        .is_some_and(crate::guardrails::pause::counts_as_hold);
    let close = answer::Close {
        upgrade_asked,
        carries_body,
    };
    let response = answer::answer(&plane, result, audit, &request_id, close).await;
    let shared = plane.guardrails.shared.is_some();
    // watchdog — after the answer is decided and its record written (the pause's snapshot
    // includes it): a session that keeps repeating itself is paused before its next request.
    // With shared counters it runs beside the answer instead: its trail is a Redis round
    // trip, and the other replicas' gates learn of a pause within 100 ms in any case.
    if let Some(principal) = note.principal.take() {
        let watch = async move {
            crate::guardrails::pause::observe(
                &plane.guardrails,
                &plane.config.tiers,
                &plane.trips,
                &principal,
                note.calls,
                refused,
                held,
            )
            .await;
        };
        if shared {
            tokio::spawn(watch);
        } else {
            watch.await;
        }
    }
    response
}

/// The phases of a live request, in order.
async fn run(
    plane: &Arc<DataPlane>,
    origin: &Origin,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    request_id: &str,
    note: &mut Note,
) -> Result<Response<ProxyBody>, ProxyError> {
    // audit — before anything else: a request whose record cannot be written is not
    // decided, charged, held or forwarded (503 `audit_unavailable`). Checked again in
    // `forward`, for failures that arrive while a request is being decided.
    plane.audit.writable().await?;
    // The agent's window on the approval queue (`status_url`) is answered by the proxy
    // itself, before anything treats it as a request to forward; it authenticates inside.
    if let (Origin::Plain, Some(id)) = (origin, escalate::status_request(plane, &req)) {
        audit.update(|r| r.approval = Some(id.clone()));
        // Boxed, like the other answers the proxy gives itself below: a rare path's future
        // would otherwise be part of every request's.
        return Box::pin(escalate::status(plane, req, &id, request_id)).await;
    }
    // authenticate — first: nothing about an unauthenticated request is examined further.
    let principal = admit::authenticate(plane, origin, &req, audit).await?;
    // gate — right after: a paused or spent session is refused everything.
    let ticket = admit::gate(plane, &principal, note).await?;
    // classify — before policy: fronting (421) and malformed targets never reach Cedar.
    let target = classify::target(origin, &req)?;
    // The proxy's own name (a run's checkpoint) is answered here: never decided as egress,
    // resolved or forwarded, whatever a policy says of hosts.
    if crate::runs::checkpoint::is_reserved(&target.host) {
        let internal = plane.internal.as_deref();
        return Box::pin(crate::runs::internal::answer(
            internal, &principal, &target, req, audit, request_id,
        ))
        .await;
    }
    // Taken once, so the whole request is recognised and decided under one policy set.
    let engine = plane.policies.current();
    let mode = Mode::Live {
        plain: matches!(origin, Origin::Plain),
    };
    let mut ctx = RequestCtx::new(
        plane, request_id, &mode, audit, note, principal, target, &engine,
    );
    ctx.ticket = Some(ticket);
    // upgrade — before anything is decided: a request that asks for a WebSocket without
    // being a whole handshake is malformed, as no `101` to it could be checked (upgrade.rs).
    upgrade::asked(&req)?;
    let (parts, agent_body) = req.into_parts();
    let (agent_body, agent_body_failed) = body::watched(agent_body);
    let mut req = Request::from_parts(parts, agent_body);
    // collect — after classify (the held request is matched by its canonical target),
    // before recognise: a retry that only collects a held request's outcome is not
    // recognised, decided or forwarded again.
    if let Some(collected) = collect::run(&mut ctx, &mut req).await? {
        return Ok(collected);
    }
    // recognise — after classify (routes match the canonical host and normalised path),
    // before decide (it says which action Cedar is asked about).
    let recognised = recognise::run(&mut ctx, &mut req).await?;
    // rate — as soon as the tier is known, before anything costly is spent on a flood.
    rate::run(&mut ctx, &recognised).await?;
    // idempotency — once the body is in hand for the fingerprint, before decide: a retry of
    // a request already run is answered with its stored outcome, nothing decided or sent.
    let claim = match idempotency::begin(&mut ctx, &mut req, &recognised).await? {
        Keyed::Replay(response) => return Ok(response),
        Keyed::Claimed(claim) => Some(claim),
        Keyed::Unkeyed => None,
    };
    let answered = async {
        // placeholders — before decide: an exfiltration attempt whatever policy would say.
        placeholders::run(&ctx, &req, &recognised)?;
        // decide — policy, checks, budget, and the hold when a human is asked.
        let mut decided = decide::run(&mut ctx, &mut req, recognised).await?;
        // remember — what the session touched, before anything leaves.
        remember::run(&ctx, &decided).await?;
        // inject — only for a request that is going, so nothing is fetched for a refused one.
        let mut prepared = inject::run(&mut ctx, req, &mut decided).await?;
        // forward — the egress guard on every dial, TLS verified before credentials leave.
        let response =
            forward::run(&mut ctx, &mut prepared, &decided, Some(&agent_body_failed)).await?;
        let undo = decided.undo.take();
        // reply — scrub first: no secret reaches anything downstream of it.
        let response = reply::run(&mut ctx, response, &prepared, decided).await?;
        // journal — after reply (what it keeps of the answer was scrubbed), before the agent
        // has the answer: a call it saw succeed has its undo recorded.
        Ok(journal(&mut ctx, response, undo).await)
    }
    .await;
    // idempotency — last: what is kept for a retry is exactly what the agent gets; a
    // refusal frees the key before it is answered.
    match (claim, answered) {
        (Some(claim), Ok(response)) => Ok(claim.store(response).await),
        (Some(claim), Err(e)) => {
            claim.release().await;
            Err(e)
        }
        (None, answered) => answered,
    }
}

/// The phases of an approved execution, in order: the held request (rebuilt as `origin` and
/// `req`) of `principal`'s session, run once. `audit` collects what the approval's own
/// record takes (credentials, leases, the address dialed). The answer comes with the
/// scrubber it went through, for whatever rewrites it before it is stored.
pub async fn execute(
    plane: &Arc<DataPlane>,
    approved: Approved,
    principal: Arc<Principal>,
    (origin, mut req): (Origin, Request<ProxyBody>),
    audit: &mut AuditGuard,
) -> Result<(Response<ProxyBody>, Option<crate::scrub::Scrubber>), ProxyError> {
    let request_id = ids::request_id();
    let mut note = Note::default();
    let target = classify::target(&origin, &req)?;
    let engine = plane.policies.current();
    let mode = Mode::Approved(approved);
    let mut ctx = RequestCtx::new(
        plane,
        &request_id,
        &mode,
        audit,
        &mut note,
        principal,
        target,
        &engine,
    );
    // recognise — as the same tool, under the catalog in force now.
    let recognised = recognise::run(&mut ctx, &mut req).await?;
    // placeholders — the body is checked as it was when held (both only refuse).
    placeholders::run(&ctx, &req, &recognised)?;
    // decide — again, with the approval, under the policies in force now.
    let mut decided = decide::run(&mut ctx, &mut req, recognised).await?;
    // remember — what the session touched, before anything leaves.
    remember::run(&ctx, &decided).await?;
    // inject — credentials minted now, and the execution's own idempotency key.
    let mut prepared = inject::run(&mut ctx, req, &mut decided).await?;
    // forward — charged as approved, then sent.
    let response = forward::run(&mut ctx, &mut prepared, &decided, None).await?;
    let undo = decided.undo.take();
    // reply — the same scrub, response DLP and byte meters as a live answer.
    let response = reply::run(&mut ctx, response, &prepared, decided).await?;
    // journal — as for a live call.
    let response = journal(&mut ctx, response, undo).await;
    Ok((response, prepared.injected.scrubber))
}

/// The phases of an undo (`ostiary sessions undo`), in order: the recorded undo request
/// (rebuilt as `origin` and `req`) of a call of `tool` made with `args` in `principal`'s
/// session, sent once. There is no `recognise`: it is the tool's undo whatever route it
/// takes, and `classify` and `decide` are what keep it to the tool's own host. A dry run
/// stops after `decide` (`Ok(None)`): decided exactly as it would be sent.
pub(crate) async fn reverse(
    plane: &Arc<DataPlane>,
    (principal, reversal): (Arc<Principal>, ctx::Reversal),
    (origin, req): (Origin, Request<ProxyBody>),
    (tool, args): (&str, serde_json::Value),
    audit: &mut AuditGuard,
    request_id: &str,
) -> Result<Option<Response<ProxyBody>>, ProxyError> {
    let mut note = Note::default();
    let target = classify::target(&origin, &req)?;
    let engine = plane.policies.current();
    let dry_run = reversal.dry_run;
    let mode = Mode::Undo(reversal);
    let mut ctx = RequestCtx::new(
        plane, request_id, &mode, audit, &mut note, principal, target, &engine,
    );
    // The tool as the catalog has it now: it must still declare an undo, served where the
    // call went (a catalog that moved the tool is not asked to reverse the old host's call).
    let tool = crate::undo::journal::tool_now(&engine, tool, &ctx.host)?;
    // decide — policy only, as `Action::"tool:<name>.undo"`.
    let mut decided = decide::undo(&mut ctx, tool, args).await?;
    if dry_run {
        return Ok(None);
    }
    // inject — the tool's credential binding, minted now, and the undo's idempotency key.
    let mut prepared = inject::run(&mut ctx, req, &mut decided).await?;
    // forward — the egress guard on every dial, as for any request.
    let response = forward::run(&mut ctx, &mut prepared, &decided, None).await?;
    // reply — the same scrub: nothing of a secret reaches the report.
    reply::run(&mut ctx, response, &prepared, decided)
        .await
        .map(Some)
}

/// Record the undo of a call that succeeded (`plan`, from `decide`); the answer is handed
/// back whole whatever the journal made of it.
async fn journal(
    ctx: &mut RequestCtx<'_>,
    response: Response<ProxyBody>,
    plan: Option<crate::undo::journal::Plan>,
) -> Response<ProxyBody> {
    let Some(plan) = plan else {
        return response;
    };
    let journal = crate::undo::journal::Journal {
        store: &ctx.plane.undo,
        detectors: &ctx.plane.checks.detectors,
        engine: ctx.engine,
    };
    let call = crate::undo::journal::Call {
        request_id: ctx.request_id,
        principal: &ctx.principal,
        target: &ctx.target,
        host: &ctx.host,
    };
    journal.record(call, plan, response, ctx.audit).await
}
