//! The request pipeline: the one function that lists the phases of DESIGN §3 in order.
//!
//! ```text
//! authenticate → classify → [collect] → recognise → placeholders → evaluate → check →
//! [hold] → inject → (streamed dlp) → forward → scrub         (audit: a guard around all)
//! ```
//! MCP JSON-RPC to a catalogued endpoint ([`crate::mcp`]) runs through the same phases: its
//! body is parsed in `recognise`, each `tools/call` is decided in `evaluate`, refused calls
//! are taken out before `inject`, and the answer is filtered and merged after `forward`.
//! Besides the request's own record, each `tools/call` of a batch leaves an `mcp_call` record
//! under the same request id.
//! `escalate` has two halves ([`crate::escalate`]): a retry carrying `Ostiary-Approval`
//! collects a held request's outcome right after classify; an escalated decision is held
//! after `check` ([`crate::check`]), which runs the tier's checks between evaluate and the
//! hold; MCP `tools/call`s are checked one by one, between their decision and their hold.
//! Nothing else in the crate decides the order.

use std::sync::Arc;

use http::header::{CONTENT_LENGTH, UPGRADE};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use ostiary_policies::Action;

use crate::audit::AuditGuard;
use crate::body::{self, ProxyBody};
use crate::check::{self, Checks};

mod answer;
mod upgrade;
use crate::classify::{self, Origin};
use crate::connector::DialedAddr;
use crate::error::ProxyError;
use crate::evaluate::Verdict;
use crate::guardrails::counted::{Counted, Direction};
use crate::guardrails::{idempotency, limit_exceeded};
use crate::inject::credentials::Bound;
use crate::server::Shared;
use crate::session::Principal;
use crate::{authenticate, escalate, evaluate, ids, inject, mcp, recognise, scrub};

/// Handle one inspected HTTP request (absolute-form on the proxy listener, or any request
/// inside an intercepted tunnel). Always answers; always leaves one audit record of its own
/// (plus one `mcp_call` record per `tools/call` of a JSON-RPC batch).
pub async fn handle(
    shared: Arc<Shared>,
    origin: Origin,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let request_id = ids::request_id();
    // Outermost, so that every path below — including a dropped future when the agent hangs
    // up — leaves a record.
    let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "http");
    // The wire guard stops inspecting after an Upgrade head; a declined upgrade must not
    // leave a connection whose next requests go unchecked.
    // The same for a CONNECT inside a tunnel (always refused below): its head switched the
    // guard to pass-through.
    let upgrade_asked = (req.version() == Version::HTTP_11 && req.headers().contains_key(UPGRADE))
        || (req.method() == Method::CONNECT && req.version() <= Version::HTTP_11);
    let mut note = Note::default();
    let result = run(&shared, &origin, req, &mut audit, &request_id, &mut note).await;
    let refused = result
        .as_ref()
        .err()
        .is_some_and(crate::guardrails::pause::counts_as_denial);
    let held = result
        .as_ref()
        .err()
        .is_some_and(crate::guardrails::pause::counts_as_hold);
    let response = answer::answer(&shared, result, audit, &request_id, upgrade_asked).await;
    // watchdog — after the answer is decided and its record written (the pause's snapshot
    // includes it): a session that keeps repeating itself is paused before its next request.
    if let Some(principal) = note.principal.take() {
        crate::guardrails::pause::observe(&shared, &principal, note.calls, refused, held).await;
    }
    response
}

/// What the pipeline learned about a request that matters once it is answered.
#[derive(Debug, Default)]
struct Note {
    /// Whose request it was, once past the session's gate.
    principal: Option<Arc<Principal>>,
    /// What the watchdog compares, one per decided call (an MCP batch has several).
    calls: Vec<crate::guardrails::pause::Seen>,
}

async fn run(
    shared: &Arc<Shared>,
    origin: &Origin,
    req: Request<Incoming>,
    audit: &mut AuditGuard,
    request_id: &str,
    note: &mut Note,
) -> Result<Response<ProxyBody>, ProxyError> {
    // audit — before anything else: a request whose record cannot be written is not
    // decided, charged, held or forwarded (503 `audit_unavailable`). Checked again right
    // before forward, for the failures that arrive while a request is being decided.
    shared.audit.ensure_writable()?;
    // The agent's window on the approval queue (`status_url`) is answered by the proxy
    // itself, before anything treats it as a request to forward; it authenticates inside.
    if matches!(origin, Origin::Plain) {
        if let Some(id) = escalate::status_request(shared, &req) {
            audit.update(|r| r.approval = Some(id.clone()));
            return escalate::status(shared, req, &id, request_id).await;
        }
    }

    // authenticate — first: nothing about an unauthenticated request is examined further. In
    // a tunnel the token was checked at CONNECT; the session is re-checked on every request
    // so that teardown cuts off open tunnels too.
    let principal = match origin {
        Origin::Plain => authenticate::principal(&shared.sessions, req.headers())?,
        Origin::Tunnel(tunnel) => tunnel.principal.clone(),
    };
    // Recorded before the liveness check below, so that a request refused inside the tunnel
    // of a revoked or expired session still says whose tunnel it came through.
    audit.update(|r| r.set_principal(&principal));
    if matches!(origin, Origin::Tunnel(_)) && !shared.sessions.is_live(&principal.session_id) {
        return Err(ProxyError::unauthenticated(
            "the session is not active (revoked or expired)",
        ));
    }

    // Only a request to the tunnel's host travels inside a tunnel: a CONNECT there would be
    // a tunnel in a tunnel that nothing inspects.
    if req.method() == Method::CONNECT {
        audit.update(|r| r.method = Some("CONNECT".into()));
        return Err(ProxyError::bad_request(
            "CONNECT inside a tunnel is refused: open each tunnel on its own proxy connection",
        ));
    }

    // gate — right after authentication, before anything else is looked at: a session the
    // watchdog paused is refused everything (423), one that spent its bytes too (429).
    shared.guardrails.gate(&principal)?;
    note.principal = Some(principal.clone());
    // In flight from here to the answer's last byte, so teardown can wait for it.
    let ticket = shared.guardrails.inflight.enter(&principal.session_id);

    // classify — before policy: fronting (421) and malformed targets never reach Cedar.
    let target = classify::target(origin, &req)?;
    // The host as text, made once: audit, placeholder checks and errors all name it.
    let host = target.host.to_string();
    audit.update(|r| {
        r.method = Some(target.method.to_string());
        r.scheme = Some(target.scheme.into());
        r.host = Some(host.clone());
        r.port = Some(target.port);
        r.path = Some(target.path.clone());
    });

    // The engine is taken once so the whole request is recognised and decided under one
    // policy set: the catalog comes with the policies it was validated with.
    let engine = shared.policies.current();

    // recognise — after classify, because routes match the canonical host and the raw path
    // classify settled; before evaluate, because it decides which action Cedar is asked
    // about (a tool call or plain `http`). Only a recognised call's body is read (bounded);
    // every other body keeps streaming.
    let (parts, agent_body) = req.into_parts();
    let (agent_body, agent_body_failed) = body::watched(agent_body);
    let mut req = Request::from_parts(parts, agent_body);

    // escalate (collect) — a retry carrying `Ostiary-Approval` only collects the outcome of
    // a request held earlier: it was decided when held and is decided again when executed,
    // so it is not recognised or evaluated here, and nothing is forwarded for it. (An MCP
    // session's other messages carrying the header go on below, without it.)
    if let Some(id) = escalate::approval_header(req.headers()) {
        let id = id?;
        if let Some(collected) =
            escalate::redeem(shared, &principal, &target, &mut req, &id).await?
        {
            audit.update(|r| r.approval = Some(id));
            return Ok(collected);
        }
    }

    let call = match recognise::route(engine.catalog(), &target)? {
        Some(route) => {
            let tool = route.tool;
            audit.update(|r| {
                r.tool = Some(tool.name().to_owned());
                r.tier = Some(tool.tier().as_str().to_owned());
            });
            let limit = shared.config.proxy.max_tool_body_bytes;
            Some(route.read(&mut req, &target, limit).await?)
        }
        None => None,
    };
    // MCP after REST routes, so that a catalogued REST route is never reinterpreted as
    // JSON-RPC. Only a POST carries JSON-RPC; the SSE stream (GET) and session end (DELETE)
    // stay plain `http` requests below. The body is parsed here, decided in evaluate.
    let mcp = match (&call, mcp::endpoint(engine.catalog(), &target)?) {
        // The method in any case: an upstream that takes `post` for POST must not run
        // JSON-RPC the proxy never parsed.
        (None, Some(endpoint)) if target.method.as_str().eq_ignore_ascii_case("POST") => {
            let limit = shared.config.proxy.max_tool_body_bytes;
            let bytes = recognise::read_body(&mut req, limit).await?;
            let exchange = mcp::parse(req.headers(), &bytes)?;
            Some((endpoint, exchange, bytes))
        }
        _ => None,
    };

    // The request's tier, known once it is recognised: a tool's own, else by method.
    let tier: &'static str = match &call {
        Some(call) => call.tool.tier().as_str(),
        None => Checks::http_tier(&target.method),
    };
    // rate — per agent and per tenant, as soon as the tier is known and before anything
    // costly (Cedar, checks, a webhook, a Vault round trip) is spent on a flood. An MCP
    // POST of only `tools/call`s is rated call by call, each by its own tool's tier, below.
    let calls_only = mcp
        .as_ref()
        .is_some_and(|(_, exchange, _)| !exchange.has_plumbing());
    if !calls_only {
        shared
            .guardrails
            .admit_rate(&principal, tier, &shared.config.tiers)?;
    }

    // What the watchdog compares (after the rate limit: a call refused for its rate never
    // ran): the tool and its arguments, or the destination. An MCP
    // POST of calls is observed call by call below instead.
    if mcp
        .as_ref()
        .is_none_or(|(_, exchange, _)| exchange.has_plumbing())
    {
        note.calls.push(match &call {
            Some(call) => {
                crate::guardrails::pause::Seen::new(call.tool.name(), &call.args, tier, None, true)
            }
            None => crate::guardrails::pause::Seen::new(
                &format!("{} {}{}", target.method, host, target.path),
                &serde_json::Value::String(target.query.clone()),
                tier,
                None,
                false,
            ),
        });
    }
    // idempotency — after recognise (a tool call's body is in hand for the fingerprint),
    // before evaluate: a retry of a request already run is answered with its stored
    // outcome, and nothing about it is decided, charged or sent again.
    let mut claim = None;
    if let Some(key) = idempotency::key(req.headers(), &target.method)? {
        let body = match (&call, &mcp) {
            (Some(call), _) => call.body.clone(),
            (None, Some((_, _, bytes))) => bytes.clone(),
            (None, None) => {
                // A plain request's body is read (bounded) to tell a retry from another
                // request; it is forwarded from memory.
                let limit = shared.config.proxy.max_tool_body_bytes;
                let bytes = recognise::read_body(&mut req, limit).await?;
                *req.body_mut() = body::full(bytes.clone());
                bytes
            }
        };
        let settings = shared.guardrails.settings();
        match idempotency::begin(
            &shared.guardrails.store,
            &principal.session_id,
            key,
            idempotency::fingerprint(&target, &body),
            i64::try_from(settings.idempotency_ttl.as_millis()).unwrap_or(i64::MAX),
            settings.idempotency_max_bytes,
        )
        .await?
        {
            idempotency::Begin::Replay(response) => return Ok(response),
            idempotency::Begin::Run(c) => claim = Some(c),
        }
    }

    // placeholders — after recognise (a tool call's or MCP body is in hand to look into),
    // before evaluate: a placeholder headed for a host its credential is not bound to, or
    // anywhere but its binding's injection point, is an exfiltration attempt whatever
    // policy would say, and is recorded as one.
    let tool_name = call.as_ref().map(|c| c.tool.name().to_owned());
    {
        // The body as sent (a tool call's arguments also hold its query, which is no body).
        let held_body = match (&call, &mcp) {
            (Some(call), _) => Some(&call.body[..]),
            (None, Some((_, _, bytes))) => Some(&bytes[..]),
            _ => None,
        };
        shared.credentials.placeholders(
            req.headers(),
            req.uri(),
            held_body,
            &host,
            &principal,
            &shared.metrics,
        )?;
    }

    // evaluate — the port rule first (a tunnel's port was checked at CONNECT), then Cedar.
    // `context.session` is read once, so every decision of the request sees the same usage.
    let session = shared.guardrails.session_state(&principal);
    if matches!(origin, Origin::Plain) {
        let opened_by = evaluate::port(
            &engine,
            &shared.metrics,
            &shared.config.egress.ports,
            (&principal, &session),
            &target.host,
            target.port,
        )?;
        audit.update(|r| r.add_policies(opened_by));
    }
    let (action, tool) = match call {
        Some(call) => {
            let tool = (call.tool, call.body.clone());
            (Some(call.action(None)), Some(tool))
        }
        // Every message but `tools/call` is decided as the plain request it travels in; a
        // JSON-RPC to a catalogued MCP endpoint is decided message by message below, each
        // `tools/call` as its tool and every other message as `Action::"mcp"`; the POST
        // carrying them is not also decided as `http`.
        None if mcp.is_some() => (None, None),
        None => (
            Some(Action::Http {
                method: target.method.to_string(),
                scheme: target.scheme.into(),
                port: target.port,
                path: target.path.clone(),
                query: target.query.clone(),
            }),
            None,
        ),
    };
    let mut stream_dlp: Option<Arc<check::dlp::Detectors>> = None;
    let mut response_dlp = false;
    if let Some(action) = action {
        let (policies, action, escalated) = match evaluate::decide_or_escalate(
            &engine,
            &shared.metrics,
            &principal,
            &session,
            &target.host,
            action,
        )? {
            Verdict::Allow { policies, action } => (policies, action, false),
            Verdict::Escalate { policies, action } => (policies, action, true),
        };
        audit.update(|r| r.add_policies(policies.clone()));

        // check — after evaluate, so nothing is spent (or asked of a webhook) for a request
        // policy refuses; before the hold, so a request failing its checks is never put
        // before a human; before inject, so nothing is prepared for a refused one.
        let tier = match &tool {
            Some((tool, _)) => tool.tier().as_str(),
            None => Checks::http_tier(&target.method),
        };
        let (args, records) = match &action {
            Action::Tool {
                args,
                impact_records,
                ..
            } => (Some(args), *impact_records),
            _ => (None, 0),
        };
        // "Any value of a credential known to the broker": the session's own, when the
        // tier scans bodies at all.
        let wants_dlp = shared.checks.wants(tier, "dlp");
        let with_secrets = if wants_dlp {
            check::calls::session_detectors(shared, &principal).await
        } else {
            None
        };
        let subject = check::Subject {
            tier,
            agent: &principal.agent,
            tenant: &principal.tenant,
            session: &principal.session_id,
            host: &host,
            method: target.method.as_str(),
            path: &target.path,
            tool: tool.as_ref().map(|(t, _)| *t),
            args,
            records,
            body: tool.as_ref().map(|(_, body)| &body[..]),
            declared_len: req
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            detectors: with_secrets.as_deref(),
        };
        let report = shared.checks.run(subject, &shared.metrics).await;
        // A body that streams is scanned on its way, after the decision (see `check`).
        if tool.is_none() && wants_dlp {
            stream_dlp = Some(with_secrets.unwrap_or_else(|| shared.checks.detectors.clone()));
        }
        response_dlp = shared.checks.wants(tier, "response_dlp");
        audit.update(|r| {
            r.checks = report.ran.clone();
            r.unchecked = matches!(report.verdict, check::Verdict::Unchecked { .. });
        });
        let asked_for_human = match report.verdict {
            check::Verdict::Pass | check::Verdict::Unchecked { .. } => None,
            check::Verdict::Fail { check, detail } => {
                return Err(ProxyError::CheckFailed { check, detail })
            }
            check::Verdict::Escalate { check, reason } => Some((check, reason)),
        };

        // limit — the call budget, after evaluate and the checks (a refused call costs
        // nothing), before the hold: a call over a limit listed in `escalate_limits` goes to
        // a human who may grant more. A call held anyway is charged when it runs.
        let mut over_limit = None;
        if let (Some((tool, _)), false, None) = (&tool, escalated, &asked_for_human) {
            let cost = tool.cost_micros();
            match shared
                .guardrails
                .meter
                .charge_call(&principal.session_id, cost)
            {
                Ok(_) => audit.update(|r| r.cost_micros = Some(cost)),
                Err(hit) if hit.escalatable(&shared.guardrails.settings().escalate_limits) => {
                    over_limit = Some(hit.limit)
                }
                Err(hit) => return Err(limit_exceeded(hit)),
            }
        }

        // escalate (hold) — policy, a check or a limit asked for a human: the request is
        // stored as policy saw it, before anything is prepared or injected for it
        // (credentials are minted at execution, after the approval).
        if escalated || asked_for_human.is_some() || over_limit.is_some() {
            let mut policies = policies;
            if let Some(limit) = over_limit {
                policies.push(format!("limit:{limit}"));
            }
            if let Some((check, reason)) = asked_for_human {
                if tool.is_none() {
                    // Only a catalogued tool call can wait for a human (and be re-decided
                    // with the approval): a plain request is refused instead.
                    return Err(ProxyError::CheckFailed {
                        check,
                        detail: format!(
                            "asks for a human's approval, which only catalogued tool calls can wait for ({reason})"
                        ),
                    });
                }
                policies.push(format!("check:{check}"));
            }
            let tier = audit.record().and_then(|r| r.tier.clone());
            let (id, held) = escalate::hold(
                shared, &principal, &target, &mut req, policies, action, tier, request_id,
            )
            .await?;
            audit.update(|r| r.approval = Some(id));
            return Err(held);
        }
    }
    // Each `tools/call` on its own. Refused calls are taken out of the body here, before
    // inject, so that nothing is prepared or forwarded for them.
    let mut mcp_reply = None;
    if let Some((endpoint, exchange, bytes)) = mcp {
        let asker = mcp::Asker {
            engine: &engine,
            metrics: &shared.metrics,
            principal: &principal,
            target: &target,
            session: &session,
        };
        let mut decided = exchange.decide(&endpoint, asker)?;
        // rate — each call policy allowed or escalated, by its own tool's tier; one over
        // the limit is refused on its own (`-32001 limit_exceeded`).
        let rated: Vec<(usize, &'static str)> = decided
            .checkable()
            .filter_map(|call| Some((call.index, crate::config::tier_name(call.tier)?)))
            .collect();
        for (index, tier) in rated {
            if let Err(e) = shared
                .guardrails
                .admit_rate(&principal, tier, &shared.config.tiers)
            {
                if let ProxyError::LimitExceeded(hit) = &e {
                    shared.metrics.limit_exceeded(&hit.limit);
                }
                decided.refuse(index, e);
            }
        }
        // check — each call policy allowed or escalated, under its own tier's budget, all
        // calls of a batch at once; after evaluate and before the holds, as for a REST call.
        check::calls::run(shared, &engine, &principal, &target, &host, &mut decided).await;
        // limit — each call still allowed is charged to the session's budget; one over it
        // is refused like a denied call, or held for a human when that limit escalates.
        let mut charged = 0;
        for (index, cost) in decided.allowed_costs(engine.catalog()) {
            match shared
                .guardrails
                .meter
                .charge_call(&principal.session_id, cost)
            {
                Ok(_) => {
                    charged += cost;
                    decided.charged(index, cost);
                }
                Err(hit) if hit.escalatable(&shared.guardrails.settings().escalate_limits) => {
                    decided.escalate(index, format!("limit:{}", hit.limit))
                }
                Err(hit) => {
                    shared.metrics.limit_exceeded(&hit.limit);
                    decided.refuse(index, limit_exceeded(hit))
                }
            }
        }
        let mut plan = decided.finish(bytes);
        // A batch's calls carry their costs in their own `mcp_call` records; the request's
        // record carries it only for a single call, so `audit cost` counts each call once.
        if charged > 0 && !plan.batch {
            audit.update(|r| r.cost_micros = Some(charged));
        }
        // escalate (hold) — each escalated call on its own, as the single call it is, so it
        // can be executed alone once approved; its refusal becomes `approval_pending`, or
        // `limit_exceeded` past the session's cap of pending approvals.
        for escalated in std::mem::take(&mut plan.escalated) {
            let Some(refusal) = escalated.refusal else {
                continue;
            };
            let body =
                serde_json::to_vec(&escalated.message).map_err(|e| ProxyError::Internal {
                    reason: format!("serializing a held MCP call: {e}"),
                })?;
            let held = escalate::Held {
                policies: escalated.policies,
                action: escalated.action,
                tier: Some(escalated.tier),
                rpc_id: escalated.message.get("id").cloned(),
            };
            let held = escalate::hold_body(
                shared,
                &principal,
                &target,
                req.headers(),
                &body,
                held,
                request_id,
            )
            .await;
            let pending = match held {
                Ok((id, pending)) => {
                    audit.update(|r| r.approval = Some(id));
                    pending
                }
                Err(cap @ ProxyError::LimitExceeded(_)) => {
                    shared.metrics.limit_exceeded("approvals");
                    cap
                }
                Err(e) => return Err(e),
            };
            plan.calls[escalated.call].seen.held = Some(true);
            plan.refused[refusal].error = pending.clone();
            plan.calls[escalated.call].outcome = Err(pending);
        }
        for call in &plan.calls {
            note.calls.push(call.seen.clone());
        }
        // A batch's calls each get a record of their own: the request's record can name one
        // tool and one outcome, and a refused call in a forwarded batch would be invisible.
        // Written now, at the decision, so that they stand whatever happens upstream.
        if plan.batch {
            for call in &plan.calls {
                let mut record =
                    AuditGuard::start(&shared.audit, &shared.metrics, request_id, "mcp_call");
                record.update(|r| {
                    r.set_principal(&principal);
                    r.host = Some(target.host.to_string());
                    r.port = Some(target.port);
                    if let Some((tool, tier)) = &call.tool {
                        r.tool = Some(tool.clone());
                        r.tier = Some(tier.clone());
                    }
                    r.rpc_id = call.rpc_id.clone();
                    r.checks = call.checks.clone();
                    r.unchecked = call.unchecked;
                    r.cost_micros = call.cost_micros;
                });
                record.decided(call.outcome.as_ref().map(Vec::as_slice));
            }
            for message in &plan.messages {
                let mut record =
                    AuditGuard::start(&shared.audit, &shared.metrics, request_id, "mcp_message");
                record.update(|r| {
                    r.set_principal(&principal);
                    r.host = Some(target.host.to_string());
                    r.port = Some(target.port);
                    r.rpc_id = message.rpc_id.clone();
                    r.rpc_method = Some(message.method.clone());
                });
                record.decided(message.outcome.as_ref().map(Vec::as_slice));
            }
        }
        audit.update(|r| {
            if let Some(tool) = plan.tools.first() {
                r.tool = Some(tool.clone());
            }
            if let (false, [message]) = (plan.batch, plan.messages.as_slice()) {
                r.rpc_method = Some(message.method.clone());
            }
            r.add_policies(plan.policies.clone());
            r.checks = plan.calls.iter().flat_map(|c| c.checks.clone()).collect();
            r.unchecked = plan.calls.iter().any(|c| c.unchecked);
        });
        let Some(forward) = plan.forward else {
            if plan.refused.is_empty() {
                // Only refused notifications: no id to answer, so the refusal is the
                // request's (an accepted notification would be 202).
                return Err(plan.silenced.unwrap_or_else(|| ProxyError::Internal {
                    reason: "an MCP body with nothing forwarded and nothing refused".into(),
                }));
            }
            return Err(ProxyError::McpRefused {
                replies: plan.refused,
                batch: plan.batch,
            });
        };
        if !plan.unchanged {
            req.headers_mut()
                .insert(CONTENT_LENGTH, http::HeaderValue::from(forward.len()));
        }
        *req.body_mut() = body::full(forward);
        let filter = mcp::reply::ToolFilter {
            engine: engine.clone(),
            metrics: shared.metrics.clone(),
            principal: (*principal).clone(),
            session: session.clone(),
            target: target.clone(),
            endpoint,
        };
        mcp_reply = mcp::reply::ReplyPlan::new(&plan.refused, plan.listed, filter, request_id);
        if mcp_reply.is_some() {
            mcp::reply::ReplyPlan::prepare(req.headers_mut());
        }
    }

    // inject — after the decision, so nothing is prepared (and no credential fetched) for a
    // request that is refused. The WebSocket handshake is only honoured once authorized.
    // Credentials go in after `prepare` pointed the request at its checked upstream URI,
    // so a query credential lands in the URI actually sent.
    let upgrade = upgrade::is_websocket(&req);
    let agent_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let upstream_req = inject::prepare(req, &target, upgrade)?;
    let (mut parts, upstream_body) = upstream_req.into_parts();
    let tool_name = tool_name.or_else(|| audit.record().and_then(|r| r.tool.clone()));
    let injected = shared
        .credentials
        .apply(
            &mut parts,
            Bound {
                target: &target,
                principal: &principal,
                tool: tool_name.as_deref(),
                upgrade,
            },
            &shared.metrics,
        )
        .await?;
    if !injected.held.is_empty() {
        audit.update(|r| {
            r.credentials = injected.names();
            r.leases = injected.leases();
        });
    }
    // A streamed body is where a placeholder can hide from the check before evaluate: it is
    // guarded chunk by chunk on its way, and the chunk carrying one is never passed on.
    let (upstream_body, placeholder_in_body) = match shared.credentials.guard_body(upstream_body) {
        Ok((guarded, tripped)) => (guarded, Some(tripped)),
        Err(unguarded) => (unguarded, None),
    };
    // A body that streams is scanned for secrets on its way (`dlp` of the tier): the chunk
    // carrying a finding, and everything after it, never leaves; the upstream request is
    // aborted. Wrapped after the placeholder guard, which it must not hide a chunk from.
    let (upstream_body, dlp_finding) = match stream_dlp {
        Some(detectors) => {
            let (scanned, slot) = check::dlp::DlpBody::new(upstream_body, detectors);
            (scanned, Some(slot))
        }
        None => (upstream_body, None),
    };
    // Every byte sent upstream counts against the session's `max_bytes_sent`.
    let upstream_body = body::stream(Counted::new(
        upstream_body,
        shared.guardrails.meter.clone(),
        &principal.session_id,
        Direction::Sent,
        None,
    ));
    let upstream_req = Request::from_parts(parts, upstream_body);

    // forward — the egress guard runs inside the connector, on every dial; TLS is verified
    // for the exact host before the request (and any credential in it) is written. A
    // teardown whose grace ran out cancels the wait.
    shared.audit.ensure_writable()?;
    let sent = tokio::select! {
        sent = shared.upstreams.send(
            upstream_req,
            upgrade,
            injected.identity.as_deref(),
            &shared.metrics,
        ) => sent,
        () = ticket.cancelled.cancelled() => Err(ProxyError::Upstream {
            reason: "the session was torn down before the upstream answered".into(),
        }),
    };
    if let Some(refusal) = placeholder_in_body
        .as_ref()
        .and_then(|t| shared.credentials.tripped(t, &host, &shared.metrics))
    {
        return Err(refusal);
    }
    if let Some(finding) = dlp_finding.as_ref().and_then(|slot| slot.get()) {
        shared
            .metrics
            .check_ran("dlp", "fail", std::time::Duration::ZERO);
        audit.update(|r| {
            r.checks.push(check::Ran {
                check: "dlp".into(),
                outcome: check::Outcome::Fail,
                duration_us: 0,
            })
        });
        return Err(ProxyError::CheckFailed {
            check: "dlp".into(),
            detail: format!(
                "the request body carries {} at byte {}; the upstream request was aborted",
                finding.kind, finding.offset
            ),
        });
    }
    let mut response = match (sent, agent_body_failed.get()) {
        (Ok(response), _) => response,
        // The send failed because the agent's own body did (e.g. the wire guard refused a
        // chunk header mid-body): a malformed request, not an upstream failure.
        (Err(_), Some(reason)) => {
            return Err(ProxyError::bad_request(format!("request body: {reason}")))
        }
        (Err(e), None) => return Err(e),
    };
    if let Some(DialedAddr(addr)) = response.extensions().get::<DialedAddr>() {
        let addr = addr.to_string();
        audit.update(|r| r.upstream = Some(addr));
    }
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (Some(agent), true) = (agent_upgrade, switching) {
        upgrade::splice(
            shared,
            &principal,
            &target,
            agent,
            hyper::upgrade::on(&mut response),
        );
    }
    // scrub — first thing on the answer: no injected secret reaches anything downstream
    // of here (the MCP filter, the agent), and a body that cannot be decoded to be scrubbed
    // is refused rather than passed on.
    let response = match &injected.scrubber {
        Some(scrubber) => {
            scrub::scrub_response(scrubber, response).map_err(|e| ProxyError::Upstream {
                reason: e.to_string(),
            })?
        }
        None => response.map(body::stream),
    };
    // response_dlp — after scrub (an injected secret is redacted, not a finding), before
    // anything else reads the answer: a body carrying a secret is cut before the chunk
    // that holds it. The head has left by then, and so has this request's audit record:
    // the cut is logged and counted (`ostiary_checks_total{check="response_dlp"}`).
    let response = if response_dlp {
        let metrics = shared.metrics.clone();
        let request_id = request_id.to_owned();
        response.map(|body| {
            let (scanned, _) = check::dlp::DlpBody::new(body, shared.checks.detectors.clone());
            body::stream(http_body_util::BodyExt::map_err(scanned, move |e| {
                metrics.check_ran("response_dlp", "fail", std::time::Duration::ZERO);
                tracing::warn!(request_id, error = %e, "response cut: it carries a secret");
                e
            }))
        })
    } else {
        response
    };
    // The answer counts against `max_bytes_received`, and keeps the request in flight
    // until its last byte (or cut when a teardown's grace runs out).
    let meter = shared.guardrails.meter.clone();
    let session = principal.session_id.clone();
    let response = response.map(move |b| {
        body::stream(Counted::new(
            b,
            meter,
            &session,
            Direction::Received,
            Some(ticket),
        ))
    });
    // MCP answers are filtered and merged after forward, before hop-by-hop headers go.
    let mut response = match mcp_reply {
        Some(plan) => plan.apply(response, injected.scrubber.as_ref()).await?,
        None => response,
    };
    inject::strip_hop_by_hop(response.headers_mut(), upgrade && switching);
    // idempotency — last: what is kept for a retry is exactly what the agent gets.
    match claim {
        Some(claim) => Ok(claim.store(response).await),
        None => Ok(response),
    }
}
