//! The collect phase: a retry that only comes for the outcome of a request held earlier
//! ([`crate::escalate`]). Such a request was decided when it was held and again when it was
//! executed, so it is not recognised or evaluated again, and nothing is forwarded for it.

use http::{Request, Response};

use super::ctx::RequestCtx;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::escalate;

/// The held request's outcome when `req` collects one; `None` sends `req` on through the
/// pipeline (it names no approval, or is another message of an MCP session that carries
/// the header throughout).
pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
) -> Result<Option<Response<ProxyBody>>, ProxyError> {
    let id = match escalate::approval_header(req.headers()) {
        Some(id) => Some(id?),
        // A 2026-07-28 client's retry echoing the state its held call was answered with
        // (`mcp::rounds`): a collection too, however it is spelled.
        None if crate::mcp::endpoint(ctx.engine.catalog(), &ctx.target)?.is_some() => {
            let limit = ctx.plane.config.proxy.max_tool_body_bytes;
            crate::mcp::rounds::followed_up(req, limit).await?
        }
        None => None,
    };
    let Some(id) = id else {
        return Ok(None);
    };
    let collected = escalate::redeem(ctx.plane, &ctx.principal, &ctx.target, req, &id).await?;
    if collected.is_some() {
        ctx.audit.update(|r| r.approval = Some(id));
    }
    Ok(collected)
}
