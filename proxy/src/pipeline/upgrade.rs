//! WebSocket upgrades through the pipeline: which requests are honoured as one, and the
//! splice of the two upgraded connections once both sides switched.

use http::header::{CONNECTION, UPGRADE};
use http::{Request, Version};
use hyper_util::rt::TokioIo;

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

/// Join the agent's and the upstream's upgraded connections once both sides switched.
pub(super) fn splice(agent: hyper::upgrade::OnUpgrade, upstream: hyper::upgrade::OnUpgrade) {
    tokio::spawn(async move {
        match tokio::try_join!(agent, upstream) {
            Ok((agent, upstream)) => {
                let mut agent = TokioIo::new(agent);
                let mut upstream = TokioIo::new(upstream);
                if let Err(e) = tokio::io::copy_bidirectional(&mut agent, &mut upstream).await {
                    tracing::debug!(error = %e, "upgraded connection ended");
                }
            }
            Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
        }
    });
}
