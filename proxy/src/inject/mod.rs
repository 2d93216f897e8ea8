//! Phase `inject`: turn the agent's request into the upstream request.
//!
//! Hop-by-hop headers and everything addressed to the proxy (`Proxy-Authorization`, the
//! session token) are removed, `Host` is rebuilt from the checked target, and the request is
//! pointed at the absolute upstream URI. Brokered credentials are then added by
//! [`credentials`]; the agent never chooses what is injected, and the placeholders it was
//! given ([`placeholders`]) only ever turn into secrets towards their own hosts.

pub mod body_guard;
pub mod credentials;
pub mod placeholders;

use http::header::{HeaderName, CONNECTION, HOST, TE, UPGRADE};
use http::{HeaderMap, Request, Version};

use crate::body::ProxyBody;
use crate::classify::Target;
use crate::error::ProxyError;

/// Headers that describe one hop and never travel past the proxy (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Remove hop-by-hop headers, including those named by `Connection`. `keep_upgrade` keeps
/// `Connection: upgrade` and `Upgrade` for a WebSocket handshake.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    // gRPC requires `te: trailers` end to end; it is the one TE value that is safe to pass.
    let trailers = headers
        .get(TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let upgrade = headers.get(UPGRADE).cloned();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(UPGRADE);
    if trailers {
        headers.insert(TE, http::HeaderValue::from_static("trailers"));
    }
    if keep_upgrade {
        if let Some(upgrade) = upgrade {
            headers.insert(UPGRADE, upgrade);
            headers.insert(CONNECTION, http::HeaderValue::from_static("upgrade"));
        }
    }
}

/// Build the upstream request for `target` from the agent's request.
pub fn prepare(
    req: Request<ProxyBody>,
    target: &Target,
    upgrade: bool,
) -> Result<Request<ProxyBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers, upgrade);
    // The client sets Host (h1) or :authority (h2) from the URI: the checked target.
    parts.headers.remove(HOST);
    parts.uri = target.upstream_uri()?;
    // The pool picks h1 or h2 per upstream; the request's own version must not force one.
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_named() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, "close, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("proxy-authorization", "Bearer t".parse().unwrap());
        h.insert(TE, "trailers".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        strip_hop_by_hop(&mut h, false);
        assert!(h.get("x-secret-hop").is_none());
        assert!(h.get("proxy-authorization").is_none());
        assert!(h.get(CONNECTION).is_none());
        assert_eq!(h[TE], "trailers");
        assert_eq!(h["x-keep"], "1");
    }
}
