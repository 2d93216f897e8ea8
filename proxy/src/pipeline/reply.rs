//! Phase `scrub` and what follows it on the way back: the upstream's answer as the agent
//! may see it. Scrubbed of every secret the session holds first, so nothing downstream
//! (response DLP, the MCP filter, the agent) ever sees one; then cut before any other secret
//! the tier's `response_dlp` finds; counted against `max_bytes_received` (keeping a live
//! request in flight until its last byte); MCP answers filtered and merged with the proxy's
//! own refusals; hop-by-hop headers dropped; paced last, so the agent's connection flushes
//! the head and the first piece at once rather than after hundreds of KiB behind them.

use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::ctx::RequestCtx;
use super::decide::Decided;
use super::inject::Prepared;
use crate::audit::Phase;
use crate::body::{self, ProxyBody};
use crate::check;
use crate::error::ProxyError;
use crate::guardrails::counted::{Counted, Direction};
use crate::{inject, scrub};

pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    response: Response<Incoming>,
    prepared: &Prepared,
    decided: Decided,
) -> Result<Response<ProxyBody>, ProxyError> {
    ctx.audit.mark(Phase::Reply);
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    // A body that cannot be decoded to be scrubbed is refused rather than passed on.
    let response = match &prepared.injected.scrubber {
        Some(scrubber) => {
            scrub::scrub_response(scrubber, response).map_err(|e| ProxyError::Upstream {
                reason: e.to_string(),
            })?
        }
        None => response.map(body::stream),
    };
    // After scrub (an injected secret is redacted, not a finding). The head has left by
    // then, and so has a live request's audit record: a cut is logged and counted
    // (`ostiary_checks_total{check="response_dlp"}`).
    let response = if decided.response_dlp {
        let metrics = ctx.plane.metrics.clone();
        let detectors = ctx.plane.checks.detectors.clone();
        let request_id = ctx.request_id.to_owned();
        response.map(|body| {
            let (scanned, _) = check::dlp::DlpBody::new(body, detectors);
            body::stream(http_body_util::BodyExt::map_err(scanned, move |e| {
                metrics.check_ran("response_dlp", "fail", std::time::Duration::ZERO);
                tracing::warn!(request_id, error = %e, "response cut: it carries a secret");
                e
            }))
        })
    } else {
        response
    };
    let meter = ctx.plane.guardrails.meter.clone();
    let session = ctx.principal.session_id.clone();
    let ticket = ctx.ticket.take();
    let response = response.map(move |b| {
        body::stream(Counted::new(
            b,
            meter,
            &session,
            Direction::Received,
            ticket,
        ))
    });
    let response = match decided.mcp_reply {
        Some(plan) => {
            plan.apply(response, prepared.injected.scrubber.as_ref())
                .await?
        }
        None => response,
    };
    let mut response = response.map(|b| body::stream(body::paced::Paced::new(b)));
    inject::strip_hop_by_hop(
        response.headers_mut(),
        prepared.handshake.is_some() && switching,
    );
    inject::strip_ostiary_headers(response.headers_mut());
    Ok(response)
}
