//! Phase `inject`: turn the agent's request into the upstream request.
//!
//! Hop-by-hop headers and everything addressed to the proxy (`Proxy-Authorization`, the
//! session token) are removed, `Host` is rebuilt from the checked target, and the request is
//! pointed at the absolute upstream URI. Headers that make an upstream route, authorise or
//! log the request as something other than what was decided — method overrides, original or
//! rewritten URLs, forwarding and client-address headers ([`is_routing_override`]) — are
//! removed too: the agent never speaks for a hop it is not. Brokered credentials are then added by
//! [`credentials`]; the agent never chooses what is injected, and the placeholders it was
//! given ([`placeholders`]) only ever turn into secrets towards their own hosts.

pub mod body_guard;
pub mod credentials;
pub mod known;
pub mod placeholders;

use std::borrow::Cow;

use http::header::{
    HeaderName, CONNECTION, HOST, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, Request, Version};

use crate::body::ProxyBody;
use crate::classify::Target;
use crate::error::ProxyError;

/// Headers that describe one hop and never travel past the proxy (RFC 9110 §7.6.1).
/// Names, not strings: a `&str` is parsed into a name again on every removal.
static HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION,
    TE,
    TRAILER,
    TRANSFER_ENCODING,
];

/// Agent-supplied headers that frameworks, gateways and load balancers read as *where the
/// request really goes* or *who really sent it*: a method override (`POST` decided, `DELETE`
/// run), an original or rewritten URL (`/public` decided, `/admin` routed), a forwarded host,
/// scheme, prefix or client address (trusted as coming from a proxy in front). Exact names,
/// compared after [`header_key`].
const ROUTING_OVERRIDES: &[&str] = &[
    // Method overrides (Rails, Symfony, Express method-override, Google APIs, OData).
    "x-http-method",
    "x-http-method-override",
    "x-method-override",
    "x-http-method-overwrite",
    // URL rewrites (IIS, Symfony, nginx/Envoy originals).
    "x-rewrite-url",
    "x-override-url",
    "x-accel-redirect",
    // Forwarding (RFC 7239 and the de-facto family) and the client address.
    "forwarded",
    "x-forwarded",
    "x-real-ip",
    "x-client-ip",
    "client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-remote-ip",
    "x-remote-addr",
    "x-originating-ip",
    "x-proxyuser-ip",
    "x-host",
    "x-http-host-override",
    "front-end-https",
    "x-url-scheme",
    "x-scheme",
    // Next.js internal routing (CVE-2025-29927 skipped middleware by this header).
    "x-middleware-subrequest",
];

/// Name prefixes of the same class: every `X-Forwarded-*` (`-for`, `-host`, `-proto`,
/// `-prefix`, `-uri`, `-path`, `-port`, `-server`, `-ssl`, `-scheme`), `X-Original-*`
/// (`-url`, `-uri`, `-host`, `-method`), `X-Upstream-*`, `X-Envoy-*` (Envoy trusts its own
/// `x-envoy-original-path`, `-internal`, `-upstream-*`), `X-Middleware-*`, `X-Invoke-*`.
const ROUTING_OVERRIDE_PREFIXES: &[&str] = &[
    "x-forwarded-",
    "x-original-",
    "x-upstream-",
    "x-envoy-",
    "x-middleware-",
    "x-invoke-",
    "x-rewrite-",
];

/// A header name as the upstream's framework may see it: lowercase, with `_` read as `-`
/// (CGI, WSGI, PHP and Rack all turn both into `HTTP_X_FORWARDED_FOR`). Borrowed when there
/// is nothing to read differently: every header of every request passes here.
pub(crate) fn header_key(name: &HeaderName) -> Cow<'_, str> {
    let name = name.as_str();
    if name.contains('_') {
        Cow::Owned(name.replace('_', "-"))
    } else {
        Cow::Borrowed(name)
    }
}

/// Whether `name` is an agent-supplied routing or override header, which never reaches an
/// upstream.
pub fn is_routing_override(name: &HeaderName) -> bool {
    let key = header_key(name);
    ROUTING_OVERRIDES.contains(&key.as_ref())
        || ROUTING_OVERRIDE_PREFIXES
            .iter()
            .any(|prefix| key.starts_with(prefix))
}

/// Remove every routing or override header ([`is_routing_override`]).
pub fn strip_routing_overrides(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_routing_override(name))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Remove every `Ostiary-*` header from an upstream's answer: those name what the proxy
/// itself said (`Ostiary-Request-Id` marks a refusal or a hold as the proxy's, `Ostiary-
/// Approval` a held request), and an upstream must not be able to speak for it.
pub fn strip_ostiary_headers(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("ostiary-"))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Remove hop-by-hop headers, including those named by `Connection`. `keep_upgrade` keeps
/// `Connection: upgrade` and `Upgrade` for a WebSocket handshake.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // One look at the names present, then a removal for each of the list that is there:
    // most requests carry one of them at most (`Proxy-Authorization` on the proxy
    // listener), and a removal by name costs a hash and a probe whether or not it finds one.
    let mut doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| *name == UPGRADE || HOP_BY_HOP.contains(name))
        .cloned()
        .collect();
    // Nothing below acts without one of them: the names `Connection` lists, `TE: trailers`
    // and a kept `Upgrade` each need their own header, looked up only when it is there.
    if doomed.is_empty() {
        return;
    }
    let has = |name: &HeaderName| doomed.contains(name);
    let (connection, te, upgrade) = (has(&CONNECTION), has(&TE), has(&UPGRADE));
    if connection {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        doomed.extend(named);
    }
    // gRPC requires `te: trailers` end to end; it is the one TE value that is safe to pass.
    let trailers = te
        && headers
            .get(TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let upgrade = if upgrade {
        headers.get(UPGRADE).cloned()
    } else {
        None
    };
    for name in doomed {
        headers.remove(name);
    }
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
    // What was decided is what the upstream routes: no header of the agent's re-aims it.
    strip_routing_overrides(&mut parts.headers);
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
    fn each_hop_by_hop_header_alone_is_stripped() {
        for name in HOP_BY_HOP.iter().chain([&UPGRADE]) {
            let mut h = HeaderMap::new();
            h.insert(name, "x".parse().unwrap());
            h.insert("x-keep", "1".parse().unwrap());
            strip_hop_by_hop(&mut h, false);
            assert!(!h.contains_key(name), "{name} passed");
            assert_eq!(h.len(), 1, "{name}: {h:?}");
        }
        // Only end-to-end headers: the map is left as it was.
        let mut h = HeaderMap::new();
        h.insert("accept", "*/*".parse().unwrap());
        h.insert("x-keep", "1".parse().unwrap());
        let before = h.clone();
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h, before);
    }

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

    #[test]
    fn routing_overrides_are_stripped_in_every_spelling() {
        let mut h = HeaderMap::new();
        for name in [
            "x-http-method-override",
            "X-HTTP-Method",
            "x-method-override",
            "X-Original-URL",
            "x-original-uri",
            "X-Rewrite-URL",
            "X-Forwarded-For",
            "x-forwarded-host",
            "X-Forwarded-Proto",
            "x-forwarded-prefix",
            "Forwarded",
            "X-Real-IP",
            "x-original-host",
            "X-Host",
            "X-Upstream-Host",
            "x-envoy-original-path",
            "X_Forwarded_For",
            "x_http_method_override",
            "X-Middleware-Subrequest",
            "True-Client-IP",
            "CF-Connecting-IP",
        ] {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                "1".parse().unwrap(),
            );
        }
        for keep in [
            "x-request-id",
            "x-forwarder",
            "x-hosted-by",
            "accept",
            "x-originals",
        ] {
            h.insert(HeaderName::from_static(keep), "1".parse().unwrap());
        }
        strip_routing_overrides(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            [
                "accept",
                "x-forwarder",
                "x-hosted-by",
                "x-originals",
                "x-request-id"
            ]
        );
    }
}
