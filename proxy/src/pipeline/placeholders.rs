//! Phase `placeholders`: a placeholder headed for a host its credential is not bound to,
//! or anywhere but its binding's injection point, is an exfiltration attempt whatever
//! policy would say, and is refused and recorded as one ([`crate::inject::placeholders`]).
//! Streamed bodies are guarded on their way instead (`inject`).

use http::Request;

use super::ctx::RequestCtx;
use super::recognise::Recognised;
use crate::body::ProxyBody;
use crate::error::ProxyError;

pub(super) fn run(
    ctx: &RequestCtx<'_>,
    req: &Request<ProxyBody>,
    recognised: &Recognised<'_>,
) -> Result<(), ProxyError> {
    // The body as sent (a tool call's arguments also hold its query, which is no body).
    ctx.plane.credentials.placeholders(
        req.headers(),
        req.uri(),
        recognised.held_body().map(|b| &b[..]),
        &ctx.host,
        &ctx.principal,
        &ctx.plane.metrics,
    )
}
