//! Phase `decide`: policy, the tier's checks, the call budget and — when any of them asks for
//! a human — the hold, for whatever the request was recognised as. A plain request or a REST
//! tool call is one decision ([`decide_one`]); a JSON-RPC POST is decided message by message
//! ([`super::decide_mcp`]). Either way the outcome is a [`Decided`]: what the rest of the
//! request needs to know about how it may leave and come back.
//!
//! Ordering inside: the port rule before Cedar (a port nobody opened is not a policy
//! question); checks after Cedar (nothing is spent, nor a webhook asked, for a refused
//! request) and before the hold (a request failing its checks is never put before a
//! human); the budget after both (a refused call costs nothing) and before the hold (a
//! limit that escalates is a reason to hold).
//!
//! An approved execution is decided again under the policies in force now, with
//! `context.approval` granted: its checks and budget were settled when it was held, so they
//! are not run again, and it is charged when it is sent (`forward`).

use std::sync::Arc;

use http::header::CONTENT_LENGTH;
use http::Request;
use ostiary_policies::{Action, SessionState};

use super::ctx::RequestCtx;
use super::recognise::Recognised;
use crate::audit::Phase;
use crate::body::ProxyBody;
use crate::check::{self, dlp::Detectors};
use crate::error::ProxyError;
use crate::escalate;
use crate::evaluate::{self, Verdict};
use crate::guardrails::limit_exceeded;
use crate::mcp::reply::ReplyPlan;

/// How a decided request may leave, and what its answer goes through.
#[derive(Debug, Default)]
pub(crate) struct Decided {
    /// The catalog tool it calls (for the credential binding's `tools`).
    pub tool: Option<String>,
    /// The tier's `dlp` over a body that streams: scanned on its way (`inject`).
    pub stream_dlp: Option<Arc<Detectors>>,
    /// The tier's `response_dlp`: the answer is cut before a secret (`answer`).
    pub response_dlp: bool,
    /// MCP answers to filter and merge with the proxy's own refusals (`answer`).
    pub mcp_reply: Option<ReplyPlan>,
    /// What an approved execution costs, charged when it is sent (`forward`).
    pub charge_when_sent: Option<i64>,
    /// The catalog tools of the calls that go (one for a REST call, each allowed call of a
    /// JSON-RPC body): their labels and calls are remembered (`remember`).
    pub touched: Vec<String>,
    /// A call of a tool that declares `undo`: its undo is recorded once it succeeded
    /// (`journal`).
    pub undo: Option<crate::undo::journal::Plan>,
}

/// Decide the request.
pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    recognised: Recognised<'_>,
) -> Result<Decided, ProxyError> {
    ctx.audit.mark(Phase::Decide);
    // `context.session` is read once, so every decision of the request sees the same usage.
    let mut session = ctx.plane.guardrails.session_state(&ctx.principal);
    let tool = match &recognised {
        Recognised::Tool(call) => Some((call.tool.name(), call.tool.tier())),
        _ => None,
    };
    super::remember::fill(ctx, &mut session, tool).await?;
    // The port rule first (a tunnel's port was decided at CONNECT; an approved execution's
    // when it was held).
    if matches!(ctx.mode, super::ctx::Mode::Live { plain: true }) {
        let opened_by = evaluate::port(
            ctx.engine,
            &ctx.plane.metrics,
            &ctx.plane.config.egress.ports,
            (&ctx.principal, &session),
            &ctx.target.host,
            ctx.target.port,
        )?;
        ctx.audit.update(|r| r.add_policies(opened_by));
    }
    match recognised {
        Recognised::Mcp {
            endpoint,
            exchange,
            bytes,
        } => super::decide_mcp::run(ctx, req, &session, endpoint, exchange, bytes).await,
        Recognised::Tool(call) => {
            let approval = ctx.mode.approved().map(|a| a.approver.clone());
            let tool = call.tool;
            let body = call.body.clone();
            // Before policy: a count it cannot read is refused, never decided as 0.
            let action = call.action(approval)?;
            decide_one(ctx, req, &session, action, Some((tool, body))).await
        }
        Recognised::Http => {
            let t = &ctx.target;
            let action = Action::Http {
                method: t.method.to_string(),
                scheme: t.scheme.into(),
                port: t.port,
                path: t.path.clone(),
                query: t.query.clone(),
            };
            decide_one(ctx, req, &session, action, None).await
        }
    }
}

/// One decision: a plain request, or a REST tool call (`tool`, with its body).
async fn decide_one(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    session: &SessionState,
    action: Action,
    tool: Option<(&ostiary_policies::Tool, bytes::Bytes)>,
) -> Result<Decided, ProxyError> {
    // Kept with the record whatever it says, so that it can be decided again (replay, the
    // shadow set).
    let mut kept = None;
    let detectors = &ctx.plane.checks.detectors;
    let secret = |s: &str| detectors.scan(s.as_bytes()).is_some();
    let verdict = evaluate::decide_keeping(
        ctx.engine,
        &ctx.plane.metrics,
        &ctx.principal,
        session,
        &ctx.target.host,
        action,
        Some((&mut kept, &secret)),
    );
    ctx.audit.update(|r| r.decided = kept);
    let (policies, action, escalated) = match verdict? {
        Verdict::Allow { policies, action } => (policies, action, false),
        Verdict::Escalate { policies, action } => (policies, action, true),
    };
    ctx.audit.update(|r| r.add_policies(policies.clone()));
    let tier = match &tool {
        Some((tool, _)) => tool.tier().as_str(),
        None => check::Checks::http_tier(&ctx.target.method),
    };
    let mut decided = Decided {
        tool: tool.as_ref().map(|(t, _)| t.name().to_owned()),
        touched: tool.iter().map(|(t, _)| t.name().to_owned()).collect(),
        response_dlp: ctx.plane.checks.wants(tier, "response_dlp"),
        undo: match (&tool, &action) {
            (Some((tool, _)), Action::Tool { args, .. }) if tool.undo().is_some() => {
                Some(crate::undo::journal::Plan {
                    tool: tool.name().to_owned(),
                    args: args.clone(),
                })
            }
            _ => None,
        },
        ..Decided::default()
    };
    if ctx.mode.approved().is_some() {
        if escalated {
            return Err(still_asks());
        }
        decided.charge_when_sent = Some(tool.map_or(0, |(t, _)| t.cost_micros()));
        return Ok(decided);
    }
    // check — the tier's checks under its latency budget.
    let asked_for_human = checks(ctx, req, tier, &action, tool.as_ref(), &mut decided).await?;
    // limit — the call budget; a call over a limit listed in `escalate_limits` goes to a
    // human who may grant more. A call held anyway is charged when it runs.
    let over_limit = match (&tool, escalated, &asked_for_human) {
        (Some((tool, _)), false, None) => charge(ctx, tool).await?,
        _ => None,
    };
    // escalate (hold) — policy, a check or a limit asked for a human.
    if escalated || asked_for_human.is_some() || over_limit.is_some() {
        let held = Held {
            policies,
            action,
            asked_for_human,
            over_limit,
            tool_call: tool.is_some(),
        };
        // Boxed: holding for a human is rare, and its future would otherwise be in every
        // request's.
        return Err(Box::pin(hold(ctx, req, held)).await);
    }
    Ok(decided)
}

/// Run the tier's checks; the check that asks for a human, if one does. A body that
/// streams is scanned on its way instead (`decided.stream_dlp`, applied by `inject`).
async fn checks(
    ctx: &mut RequestCtx<'_>,
    req: &Request<ProxyBody>,
    tier: &str,
    action: &Action,
    tool: Option<&(&ostiary_policies::Tool, bytes::Bytes)>,
    decided: &mut Decided,
) -> Result<Option<(String, String)>, ProxyError> {
    let (args, records) = match action {
        Action::Tool {
            args,
            impact_records,
            ..
        } => (Some(args), *impact_records),
        _ => (None, 0),
    };
    // "Any value of a credential known to the broker": the session's own, when the tier
    // scans bodies at all.
    let wants_dlp = ctx.plane.checks.wants(tier, "dlp");
    let with_secrets = if wants_dlp {
        check::calls::session_detectors(
            &ctx.plane.checks,
            &ctx.plane.credentials.broker,
            &ctx.principal,
        )
        .await
    } else {
        None
    };
    let subject = check::Subject {
        tier,
        agent: &ctx.principal.agent,
        tenant: &ctx.principal.tenant,
        session: &ctx.principal.session_id,
        host: &ctx.host,
        method: ctx.target.method.as_str(),
        path: &ctx.target.path,
        tool: tool.map(|(t, _)| *t),
        args,
        records,
        body: tool.map(|(_, body)| &body[..]),
        declared_len: req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
        detectors: with_secrets.as_deref(),
    };
    let report = ctx.plane.checks.run(subject, &ctx.plane.metrics).await;
    if tool.is_none() && wants_dlp {
        decided.stream_dlp =
            Some(with_secrets.unwrap_or_else(|| ctx.plane.checks.detectors.clone()));
    }
    ctx.audit.update(|r| {
        r.checks = report.ran.clone();
        r.unchecked = matches!(report.verdict, check::Verdict::Unchecked { .. });
    });
    match report.verdict {
        check::Verdict::Pass | check::Verdict::Unchecked { .. } => Ok(None),
        check::Verdict::Fail { check, detail } => Err(ProxyError::CheckFailed { check, detail }),
        check::Verdict::Escalate { check, reason } => Ok(Some((check, reason))),
    }
}

/// Charge the call budget; the limit that asks for a human instead, if one does.
async fn charge(
    ctx: &mut RequestCtx<'_>,
    tool: &ostiary_policies::Tool,
) -> Result<Option<String>, ProxyError> {
    let cost = tool.cost_micros();
    let guardrails = &ctx.plane.guardrails;
    match guardrails
        .charge_call(&ctx.principal.session_id, cost)
        .await?
    {
        Ok(_) => {
            ctx.audit.update(|r| r.cost_micros = Some(cost));
            Ok(None)
        }
        Err(hit) if hit.escalatable(&guardrails.settings().escalate_limits) => Ok(Some(hit.limit)),
        Err(hit) => Err(limit_exceeded(hit)),
    }
}

/// Why a request is held, and what for.
struct Held {
    policies: Vec<String>,
    action: Action,
    asked_for_human: Option<(String, String)>,
    over_limit: Option<String>,
    /// Whether it is a catalogued tool call (only those can wait for a human).
    tool_call: bool,
}

/// Hold the request for a human: stored as policy saw it, before anything is prepared or
/// injected for it (credentials are minted at execution, after the approval). Always an
/// error for the request path: `202 approval_pending`, or why it could not be held.
async fn hold(ctx: &mut RequestCtx<'_>, req: &mut Request<ProxyBody>, held: Held) -> ProxyError {
    let Held {
        mut policies,
        action,
        asked_for_human,
        over_limit,
        tool_call,
    } = held;
    if let Some(limit) = over_limit {
        policies.push(format!("limit:{limit}"));
    }
    if let Some((check, reason)) = asked_for_human {
        if !tool_call {
            // Only a catalogued tool call can wait for a human (and be re-decided with the
            // approval): a plain request is refused instead.
            return ProxyError::CheckFailed {
                check,
                detail: format!(
                    "asks for a human's approval, which only catalogued tool calls can wait for ({reason})"
                ),
            };
        }
        policies.push(format!("check:{check}"));
    }
    let tier = ctx.audit.record().and_then(|r| r.tier.clone());
    match escalate::hold(
        ctx.plane,
        &ctx.principal,
        &ctx.target,
        req,
        policies,
        action,
        tier,
        ctx.request_id,
        Some(ctx.engine.version().to_string()),
    )
    .await
    {
        Ok((id, held)) => {
            ctx.audit.update(|r| r.approval = Some(id));
            held
        }
        Err(e) => e,
    }
}

/// Decide the undo of an earlier call of `tool` (made with `args`): policy only, as
/// `Action::"tool:<name>.undo"` in the tool's tier, under the policies in force now. The
/// call's checks and budget were settled when it was made; an undo is never held (a policy
/// that asks for a human refuses it: `approval_required`).
pub(super) async fn undo(
    ctx: &mut RequestCtx<'_>,
    tool: &ostiary_policies::Tool,
    args: serde_json::Value,
) -> Result<Decided, ProxyError> {
    ctx.audit.mark(Phase::Decide);
    let tier = tool.tier().as_str();
    ctx.audit.update(|r| {
        r.tool = Some(tool.name().to_owned());
        r.tier = Some(tier.to_owned());
    });
    let mut session = ctx.plane.guardrails.session_state(&ctx.principal);
    super::remember::fill(ctx, &mut session, Some((tool.name(), tool.tier()))).await?;
    let mut kept = None;
    let detectors = &ctx.plane.checks.detectors;
    let secret = |s: &str| detectors.scan(s.as_bytes()).is_some();
    let verdict = evaluate::decide_kept(
        ctx.engine,
        &ctx.plane.metrics,
        &ctx.principal,
        &session,
        &ctx.target.host,
        undo_action(tool, args)?,
        Some((&mut kept, &secret)),
    );
    ctx.audit.update(|r| r.decided = kept);
    let policies = verdict?;
    ctx.audit.update(|r| r.add_policies(policies));
    Ok(Decided {
        tool: Some(tool.name().to_owned()),
        response_dlp: ctx.plane.checks.wants(tier, "response_dlp"),
        ..Decided::default()
    })
}

/// `Action::"tool:<name>.undo"` for a call of `tool` made with `args`; refused (`400`), as
/// the call would be, when `impact.records` finds no count in `args`.
fn undo_action(
    tool: &ostiary_policies::Tool,
    args: serde_json::Value,
) -> Result<Action, ProxyError> {
    Ok(Action::Tool {
        name: tool.name().to_owned(),
        impact_records: tool
            .impact_records(&args)
            .map_err(|e| ProxyError::bad_request(e.to_string()))?,
        cost_micros: tool.cost_micros(),
        approval: None,
        undo: true,
        args,
    })
}

/// Policy escalated an approved execution once more: it does not run.
pub(super) fn still_asks() -> ProxyError {
    ProxyError::ApprovalNotExecuted {
        approval_id: String::new(),
        status: "refused",
        reason: "policy still asks for approval after it was given".into(),
    }
}
