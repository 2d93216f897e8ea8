//! Phase `rate`: the rate limits of the request's tier, per agent and per tenant, and what
//! the watchdog will compare once the request is answered. A POST of only MCP `tools/call`s
//! is rated and watched call by call instead, each by its own tool's tier (in `decide`).

use super::ctx::RequestCtx;
use super::recognise::Recognised;
use crate::error::ProxyError;
use crate::guardrails::pause::Seen;

pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    recognised: &Recognised<'_>,
) -> Result<(), ProxyError> {
    // An approved execution was rated when it was held; a human's yes is not a flood.
    if !ctx.mode.is_live() || !recognised.rated_as_one() {
        return Ok(());
    }
    let tier = recognised.tier(&ctx.target.method);
    ctx.plane
        .guardrails
        .admit_rate(&ctx.principal, tier, &ctx.plane.config.tiers)
        .await?;
    // After the rate limit: a request refused for its rate never ran.
    ctx.note.calls.push(match recognised {
        Recognised::Tool(call) => Seen::new(call.tool.name(), &call.args, tier, None, true),
        _ => Seen::new(
            &[ctx.target.method.as_str(), " ", &ctx.host, &ctx.target.path].concat(),
            &serde_json::Value::String(ctx.target.query.clone()),
            tier,
            None,
            false,
        ),
    });
    Ok(())
}
