//! What the session's decisions remember (`context.session.labels` and `.recent`,
//! [`crate::session::memory`]): read in before a decision ([`fill`]), and after an allowed
//! one, before anything leaves, the labels of the host and tool it reaches and the tool calls
//! it makes ([`run`]). Remembered before forwarding, so a request whose upstream then fails
//! still taints its session: the upstream may have read, or answered, part of it.

use std::collections::HashMap;

use ostiary_policies::{Recent, SessionState, Tier};

use super::ctx::RequestCtx;
use super::decide::Decided;
use crate::error::ProxyError;
use crate::store::now_ms;

/// Fill `session`'s labels, and its recent calls of `tool` (a REST tool call) if any.
pub(super) async fn fill(
    ctx: &RequestCtx<'_>,
    session: &mut SessionState,
    tool: Option<(&str, Tier)>,
) -> Result<(), ProxyError> {
    (session.labels, session.recent) = state(ctx, tool).await?;
    Ok(())
}

/// The session's labels, and its recent calls of `tool`, where a policy in force reads them.
async fn state(
    ctx: &RequestCtx<'_>,
    tool: Option<(&str, Tier)>,
) -> Result<(std::collections::BTreeSet<String>, Recent), ProxyError> {
    ctx.plane
        .sessions
        .memory
        .state(
            ctx.plane.guardrails.shared.as_deref(),
            &ctx.principal.session_id,
            tool,
            ctx.engine.reads_session_memory(),
            now_ms(),
        )
        .await
}

/// The recent calls of each of `tools` (an MCP body's calls, by catalog name).
pub(super) async fn recent_of(
    ctx: &RequestCtx<'_>,
    tools: impl Iterator<Item = (String, Tier)>,
) -> Result<HashMap<String, Recent>, ProxyError> {
    let mut out = HashMap::new();
    if !ctx.engine.reads_session_memory() {
        return Ok(out);
    }
    for (name, tier) in tools {
        if out.contains_key(&name) {
            continue;
        }
        let (_, recent) = state(ctx, Some((&name, tier))).await?;
        out.insert(name, recent);
    }
    Ok(out)
}

/// Remember an allowed request: the labels of its host and of each tool call that goes,
/// and those calls. Fails closed: a label that cannot be kept refuses the request.
pub(super) async fn run(ctx: &RequestCtx<'_>, decided: &Decided) -> Result<(), ProxyError> {
    let catalog = ctx.engine.catalog();
    let memory = &ctx.plane.sessions.memory;
    let shared = ctx.plane.guardrails.shared.as_deref();
    let principal = &ctx.principal;
    let tools: Vec<_> = decided
        .touched
        .iter()
        .filter_map(|name| catalog.get(name))
        .collect();
    let now = now_ms();
    let mut labels = catalog.labels_for(&ctx.host, None);
    if tools.is_empty() {
        return memory
            .record(
                shared,
                &principal.session_id,
                labels,
                None,
                now,
                principal.expires_at,
            )
            .await;
    }
    for tool in tools {
        labels.extend(tool.labels().iter().cloned());
        let labels = std::mem::take(&mut labels);
        memory
            .record(
                shared,
                &principal.session_id,
                labels,
                Some((tool.name(), tool.tier())),
                now,
                principal.expires_at,
            )
            .await?;
    }
    Ok(())
}
