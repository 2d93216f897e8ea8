//! Phase `idempotency`: a mutating request carrying an `Idempotency-Key` that this session
//! already ran is answered with its stored outcome, and nothing about it is decided,
//! charged or sent again; otherwise the key is claimed, and the answer stored at the end.

use http::Request;

use super::ctx::RequestCtx;
use super::recognise::Recognised;
use crate::body::{self, ProxyBody};
use crate::error::ProxyError;
use crate::guardrails::idempotency::{self, Begin, Claim};
use crate::recognise::read_body;

/// What the key said.
pub(super) enum Keyed {
    /// No key (or not a live, mutating request): nothing to store.
    Unkeyed,
    /// Run it, and store the answer under the claim.
    Claimed(Claim),
    /// Answer with this.
    Replay(http::Response<ProxyBody>),
}

pub(super) async fn begin(
    ctx: &mut RequestCtx<'_>,
    req: &mut Request<ProxyBody>,
    recognised: &Recognised<'_>,
) -> Result<Keyed, ProxyError> {
    // An approved execution carries its own key, to the upstream (see `inject`).
    if !ctx.mode.is_live() {
        return Ok(Keyed::Unkeyed);
    }
    let Some(key) = idempotency::key(req.headers(), &ctx.target.method)? else {
        return Ok(Keyed::Unkeyed);
    };
    let body = match recognised.held_body() {
        Some(bytes) => bytes.clone(),
        None => {
            // A plain request's body is read (bounded) to tell a retry from another
            // request; it is forwarded from memory.
            let limit = ctx.plane.config.proxy.max_tool_body_bytes;
            let bytes = read_body(req, limit).await?;
            *req.body_mut() = body::full(bytes.clone());
            bytes
        }
    };
    let settings = ctx.plane.guardrails.settings();
    Ok(
        match idempotency::begin(
            &ctx.plane.guardrails.store,
            &ctx.principal.session_id,
            key,
            idempotency::fingerprint(&ctx.target, &body),
            i64::try_from(settings.idempotency_ttl.as_millis()).unwrap_or(i64::MAX),
            settings.idempotency_max_bytes,
        )
        .await?
        {
            Begin::Replay(response) => Keyed::Replay(response),
            Begin::Run(claim) => Keyed::Claimed(claim),
        },
    )
}
