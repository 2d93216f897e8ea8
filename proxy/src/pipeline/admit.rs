//! Phases `authenticate` and `gate`: who is asking, and whether their session may ask
//! anything at all right now. Nothing about a request is examined before both passed.

use std::sync::Arc;

use http::{Method, Request};
use hyper::body::Incoming;

use super::ctx::Note;
use crate::audit::{AuditGuard, Phase};
use crate::authenticate;
use crate::classify::Origin;
use crate::error::ProxyError;
use crate::guardrails::inflight::Ticket;
use crate::plane::DataPlane;
use crate::session::Principal;

/// The session a request belongs to. In a tunnel the token was checked at CONNECT; the
/// session is re-checked on every request so that teardown cuts off open tunnels too.
pub(super) async fn authenticate(
    plane: &DataPlane,
    origin: &Origin,
    req: &Request<Incoming>,
    audit: &mut AuditGuard,
) -> Result<Arc<Principal>, ProxyError> {
    audit.mark(Phase::Authenticate);
    let principal = match origin {
        Origin::Plain => authenticate::principal(&plane.sessions, req.headers()).await?,
        Origin::Tunnel(tunnel) => tunnel.principal.clone(),
    };
    // Recorded before the liveness check below, so that a request refused inside the tunnel
    // of a revoked or expired session still says whose tunnel it came through.
    audit.update(|r| r.set_principal(&principal));
    if matches!(origin, Origin::Tunnel(_)) && !plane.sessions.is_live(&principal.session_id) {
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
    Ok(principal)
}

/// A session the watchdog paused is refused everything (423), one that spent its bytes too
/// (429). Past the gate the request counts for the watchdog and is in flight, so teardown
/// can wait for it.
pub(super) async fn gate(
    plane: &DataPlane,
    principal: &Arc<Principal>,
    note: &mut Note,
) -> Result<Ticket, ProxyError> {
    plane.guardrails.gate(principal).await?;
    note.principal = Some(principal.clone());
    Ok(plane.guardrails.inflight.enter(&principal.session_id))
}
