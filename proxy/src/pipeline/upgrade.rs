//! WebSocket upgrades through the pipeline: which requests are honoured as one, and the
//! splice of the two upgraded connections once both sides switched — tied to the session
//! (closed at teardown or expiry) and charged to its byte budgets ([`tunnel::splice`]).

use std::sync::Arc;

use http::header::{CONNECTION, UPGRADE};
use http::{Request, Version};
use hyper_util::rt::TokioIo;

use crate::classify::{Target, Tunnel};
use crate::plane::DataPlane;
use crate::session::Principal;
use crate::tunnel::{self, Bounds, Ended};

/// A WebSocket handshake (HTTP/1.1 `Upgrade`); other upgrades are not passed.
pub(super) fn is_websocket<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req
            .headers()
            .get(UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
        && req
            .headers()
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Join the agent's and the upstream's upgraded connections once both sides switched, for
/// as long as `principal`'s session lives and its byte budgets last.
pub(super) fn splice(
    plane: &Arc<DataPlane>,
    principal: &Arc<Principal>,
    target: &Target,
    agent: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    alive: Option<crate::shards::Alive>,
) {
    let at = Tunnel {
        host: target.host.clone(),
        port: target.port,
        principal: principal.clone(),
    };
    // Dropping both halves unspliced closes both connections right after the 101.
    let Some(watch) = plane.watch_stream(principal) else {
        return plane.record_cut(&at, "websocket", Ended::SessionOver);
    };
    let plane = plane.clone();
    tokio::spawn(async move {
        // Counted and drained with the agent's connection, whose task has ended.
        let _alive = alive;
        let upgraded = tokio::select! {
            upgraded = async { tokio::try_join!(agent, upstream) } => upgraded,
            () = watch.ended() => {
                return plane.record_cut(&at, "websocket", Ended::SessionOver)
            }
        };
        match upgraded {
            Ok((agent, upstream)) => {
                let bounds = Bounds {
                    watch,
                    meter: plane.guardrails.meter.clone(),
                    session: at.principal.session_id.clone(),
                    idle: None,
                };
                let ended =
                    tunnel::splice(TokioIo::new(agent), TokioIo::new(upstream), bounds).await;
                if ended.is_cut() {
                    plane.record_cut(&at, "websocket", ended);
                }
            }
            Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
        }
    });
}
