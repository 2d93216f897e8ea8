//! Phase `decide` for a JSON-RPC POST to a catalogued MCP endpoint: every message decided on
//! its own ([`crate::mcp::plan`]) — each `tools/call` as its tool, under its own tier's rate,
//! checks and budget, held for a human on its own when anything asks for one; every other
//! message as `Action::"mcp"`. Refused messages are taken out of the body before `inject`,
//! so nothing is prepared or forwarded for them; their answers are merged into the
//! upstream's (`answer`).

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::Request;
use ostiary_policies::SessionState;

use super::ctx::RequestCtx;
use super::decide::{still_asks, Decided};
use crate::audit::AuditGuard;
use crate::body::{self, ProxyBody};
use crate::error::ProxyError;
use crate::guardrails::limit_exceeded;
use crate::mcp::plan::Plan;
use crate::mcp::{self, Endpoint, Exchange};
use crate::{check, escalate};

pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    session: &SessionState,
    endpoint: Endpoint,
    exchange: Exchange,
    bytes: Bytes,
) -> Result<Decided, ProxyError> {
    let approved = ctx.mode.approved().cloned();
    // Each call sees its own tool's and tier's recent calls.
    let catalog = ctx.engine.catalog();
    let tools = exchange
        .call_names()
        .filter_map(|name| endpoint.tool(catalog, name))
        .map(|tool| (tool.name().to_owned(), tool.tier()));
    let recent = super::remember::recent_of(ctx, tools).await?;
    let asker = mcp::Asker {
        engine: ctx.engine,
        metrics: &ctx.plane.metrics,
        principal: &ctx.principal,
        target: &ctx.target,
        session,
        approval: approved.as_ref().map(|a| a.approver.as_str()),
        recent: Some(&recent),
        // Each message's decision is kept with its record (replay, the shadow set).
        keep: Some(&ctx.plane.checks.detectors),
    };
    let mut decided = exchange.decide(&endpoint, asker)?;
    if approved.is_some() {
        // The one call it was held as, decided again with the approval.
        return approved_call(ctx, req, decided, bytes);
    }

    // rate — each call policy allowed or escalated, by its own tool's tier; one over the
    // limit is refused on its own (`-32001 limit_exceeded`).
    rate(ctx, &mut decided).await;
    // check — each call policy allowed or escalated, under its own tier's budget, all calls
    // of a batch at once; after evaluate and before the holds, as for a REST call.
    check::calls::run(
        &ctx.plane.checks,
        &ctx.plane.credentials.broker,
        &ctx.plane.metrics,
        ctx.engine,
        &ctx.principal,
        &ctx.target,
        &ctx.host,
        &mut decided,
    )
    .await;
    // limit — each call still allowed is charged to the session's budget; one over it is
    // refused like a denied call, or held for a human when that limit escalates.
    let charged = charge(ctx, &mut decided).await;
    let mut plan = decided.finish(bytes);
    // A batch's calls carry their costs in their own `mcp_call` records; the request's
    // record carries it only for a single call, so `audit cost` counts each call once.
    if charged > 0 && !plan.batch {
        ctx.audit.update(|r| r.cost_micros = Some(charged));
    }
    // Boxed, and only when a call was escalated: holding is rare, and its future would
    // otherwise be in every request's.
    if !plan.escalated.is_empty() {
        Box::pin(hold(ctx, req, &mut plan)).await?;
    }
    for call in &plan.calls {
        ctx.note.calls.push(call.seen.clone());
    }
    record(ctx, &plan);

    forward(ctx, req, session, endpoint, plan)
}

/// escalate (hold) — each escalated call on its own, as the single call it is, so it can be
/// executed alone once approved; its refusal becomes `approval_pending`, or `limit_exceeded`
/// past the session's cap of pending approvals.
async fn hold(
    ctx: &mut RequestCtx<'_>,
    req: &Request<ProxyBody>,
    plan: &mut Plan,
) -> Result<(), ProxyError> {
    for escalated in std::mem::take(&mut plan.escalated) {
        let Some(refusal) = escalated.refusal else {
            continue;
        };
        let body = serde_json::to_vec(&escalated.message).map_err(|e| ProxyError::Internal {
            reason: format!("serializing a held MCP call: {e}"),
        })?;
        let held = escalate::Held {
            policies: escalated.policies,
            action: escalated.action,
            tier: Some(escalated.tier),
            rpc_id: escalated.message.get("id").cloned(),
            policy_version: Some(ctx.engine.version().to_string()),
        };
        let held = escalate::hold_body(
            ctx.plane,
            &ctx.principal,
            &ctx.target,
            req.headers(),
            &body,
            held,
            ctx.request_id,
        )
        .await;
        let pending = match held {
            Ok((id, pending)) => {
                ctx.audit.update(|r| r.approval = Some(id));
                pending
            }
            Err(cap @ ProxyError::LimitExceeded(_)) => {
                ctx.plane.metrics.limit_exceeded("approvals");
                cap
            }
            Err(e) => return Err(e),
        };
        plan.calls[escalated.call].seen.held = Some(true);
        plan.refused[refusal].error = pending.clone();
        plan.calls[escalated.call].outcome = Err(pending);
    }
    Ok(())
}

/// A batch's messages each get a record of their own: the request's record can name one
/// tool and one outcome, and a refused call in a forwarded batch would be invisible.
/// Written now, at the decision, so that they stand whatever happens upstream.
fn record(ctx: &mut RequestCtx<'_>, plan: &Plan) {
    let plane = ctx.plane;
    if plan.batch {
        let start = |kind| AuditGuard::start(&plane.audit, &plane.metrics, ctx.request_id, kind);
        for call in &plan.calls {
            let mut record = start("mcp_call");
            record.update(|r| {
                r.set_principal(&ctx.principal);
                r.host = Some(ctx.target.host.to_string());
                r.port = Some(ctx.target.port);
                if let Some((tool, tier)) = &call.tool {
                    r.tool = Some(tool.clone());
                    r.tier = Some(tier.clone());
                }
                r.rpc_id = call.rpc_id.clone();
                r.policy_version = Some(ctx.engine.version().to_string());
                r.checks = call.checks.clone();
                r.unchecked = call.unchecked;
                r.cost_micros = call.cost_micros;
                r.decided = call.kept.clone();
            });
            record.decided(call.outcome.as_ref().map(Vec::as_slice));
        }
        for message in &plan.messages {
            let mut record = start("mcp_message");
            record.update(|r| {
                r.set_principal(&ctx.principal);
                r.host = Some(ctx.target.host.to_string());
                r.port = Some(ctx.target.port);
                r.rpc_id = message.rpc_id.clone();
                r.rpc_method = Some(message.method.clone());
                r.policy_version = Some(ctx.engine.version().to_string());
                r.decided = message.kept.clone();
            });
            record.decided(message.outcome.as_ref().map(Vec::as_slice));
        }
    }
    ctx.audit.update(|r| {
        if let Some(tool) = plan.tools.first() {
            r.tool = Some(tool.clone());
        }
        if let (false, [message]) = (plan.batch, plan.messages.as_slice()) {
            r.rpc_method = Some(message.method.clone());
        }
        // A lone message's decision is kept with the request's own record.
        if !plan.batch {
            let lone = plan.calls.iter().map(|c| &c.kept);
            let lone = lone.chain(plan.messages.iter().map(|m| &m.kept));
            if let Some(kept) = lone.flatten().next() {
                r.decided = Some(kept.clone());
            }
        }
        r.add_policies(plan.policies.clone());
        r.checks = plan.calls.iter().flat_map(|c| c.checks.clone()).collect();
        r.unchecked = plan.calls.iter().any(|c| c.unchecked);
    });
}

/// An approved execution: the one call it was held as, decided again with the approval.
/// Its rate, checks and budget were settled at the hold; it is charged when it is sent.
fn approved_call(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    decided: mcp::plan::Decided,
    bytes: Bytes,
) -> Result<Decided, ProxyError> {
    let plan = decided.finish(bytes);
    let call = plan.calls.first().ok_or_else(still_asks)?;
    if !plan.escalated.is_empty() {
        return Err(still_asks());
    }
    if let Err(refused) = &call.outcome {
        return Err(refused.clone());
    }
    // `recognise` read the body to parse it: the call goes out as it was held.
    let forward = plan.forward.clone().ok_or_else(still_asks)?;
    *req.body_mut() = body::full(forward);
    let cost = call
        .tool
        .as_ref()
        .and_then(|(name, _)| ctx.engine.catalog().get(name))
        .map_or(0, |t| t.cost_micros());
    Ok(Decided {
        tool: call.tool.as_ref().map(|(name, _)| name.clone()),
        touched: call.tool.iter().map(|(name, _)| name.clone()).collect(),
        charge_when_sent: Some(cost),
        ..Decided::default()
    })
}

/// The rate limit of each checkable call's tier.
async fn rate(ctx: &RequestCtx<'_>, decided: &mut mcp::plan::Decided) {
    let rated: Vec<(usize, &'static str)> = decided
        .checkable()
        .filter_map(|call| Some((call.index, crate::config::tier_name(call.tier)?)))
        .collect();
    for (index, tier) in rated {
        if let Err(e) = ctx
            .plane
            .guardrails
            .admit_rate(&ctx.principal, tier, &ctx.plane.config.tiers)
            .await
        {
            if let ProxyError::LimitExceeded(hit) = &e {
                ctx.plane.metrics.limit_exceeded(&hit.limit);
            }
            decided.refuse(index, e);
        }
    }
}

/// Charge each allowed call to the session's budget; what was charged in all.
async fn charge(ctx: &RequestCtx<'_>, decided: &mut mcp::plan::Decided) -> i64 {
    let mut charged = 0;
    for (index, cost) in decided.allowed_costs(ctx.engine.catalog()) {
        let guardrails = &ctx.plane.guardrails;
        let charged_one = match guardrails
            .charge_call(&ctx.principal.session_id, cost)
            .await
        {
            Ok(charged_one) => charged_one,
            // The counters cannot be reached: this call is refused, not run uncounted.
            Err(e) => {
                decided.refuse(index, e);
                continue;
            }
        };
        match charged_one {
            Ok(()) => {
                charged += cost;
                decided.charged(index, cost);
            }
            Err(hit) if hit.escalatable(&guardrails.settings().escalate_limits) => {
                decided.escalate(index, format!("limit:{}", hit.limit))
            }
            Err(hit) => {
                ctx.plane.metrics.limit_exceeded(&hit.limit);
                decided.refuse(index, limit_exceeded(hit))
            }
        }
    }
    charged
}

/// What leaves: the messages still forwarded, and how their answer is filtered and merged
/// with the proxy's own refusals; or the refusals alone when nothing is forwarded.
fn forward(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    session: &SessionState,
    endpoint: Endpoint,
    plan: Plan,
) -> Result<Decided, ProxyError> {
    let Some(forward) = plan.forward else {
        if plan.refused.is_empty() {
            // Only refused notifications: no id to answer, so the refusal is the request's
            // (an accepted notification would be 202).
            return Err(plan.silenced.unwrap_or_else(|| ProxyError::Internal {
                reason: "an MCP body with nothing forwarded and nothing refused".into(),
            }));
        }
        return Err(ProxyError::McpRefused {
            replies: plan.refused,
            batch: plan.batch,
            follow_up: mcp::rounds::follows_up(req.headers()),
        });
    };
    if !plan.unchanged {
        req.headers_mut()
            .insert(CONTENT_LENGTH, http::HeaderValue::from(forward.len()));
    }
    *req.body_mut() = body::full(forward);
    let filter = mcp::reply::ToolFilter {
        engine: ctx.engine.clone(),
        metrics: ctx.plane.metrics.clone(),
        principal: (*ctx.principal).clone(),
        session: session.clone(),
        target: ctx.target.clone(),
        endpoint,
    };
    let mcp_reply = mcp::reply::ReplyPlan::new(&plan.refused, plan.listed, filter, ctx.request_id);
    if mcp_reply.is_some() {
        mcp::reply::ReplyPlan::prepare(req.headers_mut());
    }
    // The calls that go: neither refused nor held.
    let touched = plan
        .calls
        .iter()
        .filter(|call| call.outcome.is_ok())
        .filter_map(|call| call.tool.as_ref().map(|(name, _)| name.clone()))
        .collect();
    Ok(Decided {
        tool: plan.tools.first().cloned(),
        mcp_reply,
        touched,
        ..Decided::default()
    })
}
