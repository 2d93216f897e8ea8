//! Phase `inject`: the decided request made ready for its upstream — pointed at its checked
//! upstream URI, agent credentials stripped and the brokered ones written at their
//! injection points ([`crate::inject`]), and its body wrapped in the guards that act while
//! it streams: placeholders, the tier's `dlp`, and the `max_bytes_sent` meter.
//!
//! After the decision, so nothing is prepared (and no credential fetched) for a refused
//! request. The WebSocket handshake is only honoured once authorized, and goes upstream
//! with a key of the proxy's own ([`upgrade::Handshake`]).

use std::sync::{Arc, OnceLock};

use http::header::{HeaderName, HeaderValue};
use http::Request;

use super::ctx::RequestCtx;
use super::decide::Decided;
use super::upgrade;
use crate::audit::Phase;
use crate::body::{self, ProxyBody};
use crate::check::dlp::{DlpBody, Finding};
use crate::error::ProxyError;
use crate::guardrails::counted::{Counted, Direction};
use crate::inject::body_guard::Tripped;
use crate::inject::credentials::{Bound, Injected};
use crate::{approvals, inject};

/// A request ready to be sent, with what to look at once it has been.
pub(crate) struct Prepared {
    pub req: Request<ProxyBody>,
    pub injected: Injected,
    /// A WebSocket handshake (what the upstream's `101` must answer), and the agent's side
    /// of it once the upstream switched.
    pub handshake: Option<upgrade::Handshake>,
    pub agent_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// What keeps the agent's connection counted and drained, for the splice that
    /// outlives it.
    pub alive: Option<crate::shards::Alive>,
    /// The agent spoke HTTP/2: the upstream may too (ALPN decides). An HTTP/1.1 request
    /// goes upstream over HTTP/1.1, as it came — hyper's h2 client cost the proxy an
    /// eighth of its CPU per request that h1 does not (docs/benchmarks.md).
    pub multiplexed: bool,
    /// Set when the streamed body carried a placeholder (the chunk never left).
    pub placeholder: Option<Tripped>,
    /// Set when streamed DLP found a secret in the body (the chunk never left).
    pub dlp: Option<Arc<OnceLock<Finding>>>,
}

pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    mut req: Request<ProxyBody>,
    decided: &mut Decided,
) -> Result<Prepared, ProxyError> {
    ctx.audit.mark(Phase::Inject);
    // Checked whole before `decide` (a live request); honoured live only: an approved
    // execution or an undo is never spliced.
    let handshake = if ctx.mode.is_live() {
        upgrade::asked(&req)?.map(upgrade::Handshake::new)
    } else {
        None
    };
    let upgrade = handshake.is_some();
    let agent_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let alive = req.extensions_mut().remove::<crate::shards::Alive>();
    let multiplexed = req.version() == http::Version::HTTP_2;
    // Credentials go in after `prepare` pointed the request at its checked upstream URI, so
    // a query credential lands in the URI actually sent.
    let upstream_req = inject::prepare(req, &ctx.target, upgrade)?;
    let (mut parts, upstream_body) = upstream_req.into_parts();
    if let Some(handshake) = &handshake {
        handshake.rekey(&mut parts.headers);
    }
    let injected = ctx
        .plane
        .credentials
        .apply(
            &mut parts,
            Bound {
                target: &ctx.target,
                principal: &ctx.principal,
                tool: decided.tool.as_deref(),
                upgrade,
                scope: ctx.mode.lease_scope(),
            },
            &ctx.plane.metrics,
        )
        .await?;
    if !injected.held.is_empty() {
        ctx.audit.update(|r| {
            r.credentials = injected.names();
            r.leases = injected.leases();
        });
    }
    // The trace context (`[telemetry] propagate`): the upstream is told the span this
    // request's record becomes.
    if ctx.plane.config.telemetry.propagate {
        let trace = crate::telemetry::TraceContext::propagate(&mut parts.headers);
        ctx.audit.update(|r| r.trace = Some(trace));
    }
    if let Some(key) = ctx.mode.idempotency_key() {
        // The exactly-once guard towards the upstream: a crash after this was sent and a
        // re-send after the restart carry the same key.
        let key = HeaderValue::from_str(key).map_err(|e| ProxyError::Internal {
            reason: format!("idempotency key: {e}"),
        })?;
        parts.headers.insert(
            HeaderName::from_static(approvals::execute::IDEMPOTENCY_KEY),
            key,
        );
    }
    // A streamed body is where a placeholder can hide from the check before `decide`: it
    // is guarded chunk by chunk on its way, and the chunk carrying one is never passed on.
    let (upstream_body, placeholder) = match ctx.plane.credentials.guard_body(upstream_body) {
        Ok((guarded, tripped)) => (guarded, Some(tripped)),
        Err(unguarded) => (unguarded, None),
    };
    // A body that streams is scanned for secrets on its way (`dlp` of the tier): the chunk
    // carrying a finding, and everything after it, never leaves; the upstream request is
    // aborted. Wrapped after the placeholder guard, which it must not hide a chunk from.
    let (upstream_body, dlp) = match decided.stream_dlp.take() {
        Some(detectors) => {
            let (scanned, slot) = DlpBody::new(upstream_body, detectors);
            (scanned, Some(slot))
        }
        None => (upstream_body, None),
    };
    // Every byte sent upstream counts against the session's `max_bytes_sent`.
    let upstream_body = body::stream(Counted::new(
        upstream_body,
        ctx.plane.guardrails.meter.clone(),
        &ctx.principal.session_id,
        Direction::Sent,
        None,
    ));
    Ok(Prepared {
        req: Request::from_parts(parts, upstream_body),
        injected,
        handshake,
        agent_upgrade,
        alive,
        multiplexed,
        placeholder,
        dlp,
    })
}
