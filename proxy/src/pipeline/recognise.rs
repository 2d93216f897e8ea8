//! Phase `recognise`: what a classified request is to policy — a call of a catalogued REST
//! tool (its body read, bounded, into arguments), JSON-RPC to a catalogued MCP endpoint (its
//! body parsed), or plain `http` (its body keeps streaming, unless it is a POST to a host
//! that serves tools, whose body is read or watched for a method override:
//! [`crate::method_override`]) — and the tier it is rated
//! and checked by ([`crate::recognise`], [`crate::mcp`] do the matching and parsing).

use bytes::Bytes;
use http::Request;

use super::ctx::RequestCtx;
use crate::audit::Phase;
use crate::body::ProxyBody;
use crate::check::Checks;
use crate::error::ProxyError;
use crate::mcp::{self, Endpoint, Exchange};
use crate::recognise::{self as routes, ToolCall};

/// A request as policy will be asked about it.
#[derive(Debug)]
pub(crate) enum Recognised<'e> {
    /// Plain `Action::"http"`.
    Http,
    /// A call of a catalogued REST tool.
    Tool(ToolCall<'e>),
    /// A POST of JSON-RPC to a catalogued MCP endpoint: every message decided on its own.
    Mcp {
        endpoint: Endpoint,
        exchange: Exchange,
        bytes: Bytes,
    },
}

impl Recognised<'_> {
    /// The tier of the request itself: a tool's own, else by method. An MCP POST's calls
    /// each have their own tool's tier besides.
    pub(crate) fn tier(&self, method: &http::Method) -> &'static str {
        match self {
            Recognised::Tool(call) => call.tool.tier().as_str(),
            _ => Checks::http_tier(method),
        }
    }

    /// The body the proxy holds (what is forwarded): a tool call's or a JSON-RPC POST's.
    pub(crate) fn held_body(&self) -> Option<&Bytes> {
        match self {
            Recognised::Tool(call) => Some(&call.body),
            Recognised::Mcp { bytes, .. } => Some(bytes),
            Recognised::Http => None,
        }
    }

    /// Whether anything in it is decided as the request it travels in (plain http, a tool
    /// call, or an MCP POST with more than `tools/call`s): rated and watched as one.
    pub(crate) fn rated_as_one(&self) -> bool {
        match self {
            Recognised::Mcp { exchange, .. } => exchange.has_plumbing(),
            _ => true,
        }
    }
}

/// Recognise the request. Only a recognised call's body is read (bounded by
/// `proxy.max_tool_body_bytes`), and a plain form or JSON POST's to a host that serves
/// tools, for a method override (untyped and multipart ones are watched as they stream);
/// every other body keeps streaming. An approved execution
/// must be recognised as the tool it was held as, under the catalog in force now.
pub(super) async fn run<'e>(
    ctx: &mut RequestCtx<'e>,
    req: &mut Request<ProxyBody>,
) -> Result<Recognised<'e>, ProxyError> {
    ctx.audit.mark(Phase::Recognise);
    let engine = ctx.engine;
    let limit = ctx.plane.config.proxy.max_tool_body_bytes;
    if let Some(route) = routes::route(engine.catalog(), &ctx.target)? {
        let tool = route.tool;
        same_tool(ctx, Some(tool.name()))?;
        ctx.audit.update(|r| {
            r.tool = Some(tool.name().to_owned());
            r.tier = Some(tool.tier().as_str().to_owned());
        });
        return Ok(Recognised::Tool(route.read(req, &ctx.target, limit).await?));
    }
    // MCP after REST routes, so that a catalogued REST route is never reinterpreted as
    // JSON-RPC. Only a POST (in any case: an upstream that takes `post` for POST must not
    // run JSON-RPC the proxy never parsed) carries JSON-RPC; the SSE stream (GET) and the
    // session's end (DELETE) stay plain `http`.
    if let Some(endpoint) = mcp::endpoint(engine.catalog(), &ctx.target)? {
        if ctx.target.method.as_str().eq_ignore_ascii_case("POST") {
            let bytes = routes::read_body(req, limit).await?;
            let exchange = mcp::parse(req.headers(), &bytes)?;
            if ctx.mode.approved().is_some() {
                // A held MCP call is stored as the one call it is.
                let name = exchange
                    .single_call()
                    .map(|(_, name, _)| name)
                    .ok_or_else(|| no_longer("the held MCP body is not one tools/call"))?;
                let tool = endpoint.tool(engine.catalog(), name).ok_or_else(|| {
                    no_longer(&format!("the MCP tool {name:?} is no longer catalogued"))
                })?;
                same_tool(ctx, Some(tool.name()))?;
            }
            return Ok(Recognised::Mcp {
                endpoint,
                exchange,
                bytes,
            });
        }
    }
    same_tool(ctx, None)?;
    ctx.body_watch =
        crate::method_override::refuse_in_body(req, engine.catalog(), &ctx.target, limit).await?;
    Ok(Recognised::Http)
}

/// An approved execution recognised as another tool (or none) than it was held as does
/// not run: a catalog change since the hold means a human approved something else.
fn same_tool(ctx: &RequestCtx<'_>, now: Option<&str>) -> Result<(), ProxyError> {
    let Some(approved) = ctx.mode.approved() else {
        return Ok(());
    };
    if now.is_some() && now == approved.tool.as_deref() {
        return Ok(());
    }
    Err(match now {
        Some(name) => no_longer(&format!(
            "the request is now recognised as {name}, not {}",
            approved.tool.as_deref().unwrap_or("-")
        )),
        None => no_longer("the request is no longer recognised as a catalogued tool"),
    })
}

/// Re-recognition refused an approved execution; `reason` is what its record says.
fn no_longer(reason: &str) -> ProxyError {
    ProxyError::ApprovalNotExecuted {
        approval_id: String::new(),
        status: "refused",
        reason: reason.to_owned(),
    }
}
