//! Phase `classify`: what a request means — its scheme, canonical host, port, path and
//! query — and whether it may be asked here at all.
//!
//! The path is normalised once, here, by the equivalences RFC 3986 defines (percent-encoded
//! unreserved characters decoded, escape hex uppercased: [`crate::path_forms::normalize`]),
//! and that path is what policy sees and what is forwarded: the upstream gets exactly the
//! path that was decided, and `/%61dmin` is `/admin` to both. Nothing else is decoded:
//! `%2F` stays an escape, and paths a lenient upstream would route elsewhere are dealt
//! with where routes are matched ([`crate::recognise`]). A request
//! inside a tunnel must name the tunnel's own host: fronting (CONNECT/SNI to A, `Host` or
//! `:authority` B) is refused with 421 before policy is consulted.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Method, Request, Uri};

use crate::egress::address::{split_authority, Host};
use crate::error::ProxyError;
use crate::session::Principal;

/// How a request reached the pipeline.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Absolute-form `http://` on the proxy listener; authenticated per request.
    Plain,
    /// Inside an intercepted TLS tunnel; authenticated once at CONNECT.
    Tunnel(Arc<Tunnel>),
}

/// An intercepted tunnel: where the agent said it was going, and who opened it.
#[derive(Debug)]
pub struct Tunnel {
    pub host: Host,
    pub port: u16,
    pub principal: Arc<Principal>,
}

/// The destination and shape of one request.
#[derive(Debug, Clone)]
pub struct Target {
    pub scheme: &'static str,
    pub host: Host,
    pub port: u16,
    pub method: Method,
    pub path: String,
    pub query: String,
}

impl Target {
    /// `host:port` for the upstream URI (IPv6 bracketed).
    pub fn authority(&self) -> String {
        match &self.host {
            // Joined, not `format!`ed: every forwarded request's URI is built from it.
            Host::Name(name) => {
                [name.as_str(), ":", itoa::Buffer::new().format(self.port)].concat()
            }
            Host::Ip(std::net::IpAddr::V6(v6)) => format!("[{v6}]:{}", self.port),
            host => format!("{host}:{}", self.port),
        }
    }

    /// The absolute URI the upstream request is sent to. Built from its parts, each text
    /// handed to `http` without a copy: this runs for every forwarded request.
    pub fn upstream_uri(&self) -> Result<Uri, ProxyError> {
        let invalid = |e: http::Error| ProxyError::bad_request(format!("request target: {e}"));
        let path_and_query = if self.query.is_empty() {
            PathAndQuery::from_maybe_shared(Bytes::from(self.path.clone()))
        } else {
            let mut text = String::with_capacity(self.path.len() + 1 + self.query.len());
            text.push_str(&self.path);
            text.push('?');
            text.push_str(&self.query);
            PathAndQuery::from_maybe_shared(Bytes::from(text))
        };
        Uri::builder()
            .scheme(self.scheme)
            .authority(
                Authority::from_maybe_shared(Bytes::from(self.authority()))
                    .map_err(|e| invalid(e.into()))?,
            )
            .path_and_query(path_and_query.map_err(|e| invalid(e.into()))?)
            .build()
            .map_err(invalid)
    }
}

/// Classify a request arriving by `origin`.
pub fn target<B>(origin: &Origin, req: &Request<B>) -> Result<Target, ProxyError> {
    check_headers(req.headers())?;
    let uri = req.uri();
    let (host, port, scheme) = match origin {
        Origin::Plain => {
            match uri.scheme_str() {
                Some("http") => {}
                Some("https") => {
                    return Err(ProxyError::bad_request(
                        "https:// must be requested through CONNECT",
                    ))
                }
                Some(other) => {
                    return Err(ProxyError::bad_request(format!(
                        "unsupported scheme {other}"
                    )))
                }
                None => {
                    return Err(ProxyError::bad_request(
                        "this is a forward proxy: send an absolute-form http:// URI or CONNECT",
                    ))
                }
            }
            let authority = uri
                .authority()
                .ok_or_else(|| ProxyError::bad_request("request URI has no host"))?;
            let (host, port) = parse_authority(authority.as_str())?;
            (host, port.unwrap_or(80), "http")
        }
        Origin::Tunnel(tunnel) => {
            // h2 carries :authority in the URI; h1 carries Host (or, rarely, absolute-form).
            let named = match uri.authority() {
                Some(a) => a.as_str(),
                None => req
                    .headers()
                    .get(HOST)
                    .ok_or_else(|| ProxyError::bad_request("request has no Host"))?
                    .to_str()
                    .map_err(|_| ProxyError::bad_request("Host is not ASCII"))?,
            };
            let (host, port) = tunnel_authority(tunnel, named)?;
            // A port-less Host means "the tunnel's port" in practice (some clients omit
            // non-default ports); a port that is present must match.
            if host != tunnel.host || port.is_some_and(|p| p != tunnel.port) {
                return Err(ProxyError::Misdirected {
                    tunnel: format!("{}:{}", tunnel.host, tunnel.port),
                    host: named.to_owned(),
                });
            }
            (host, tunnel.port, "https")
        }
    };
    let path = match uri.path() {
        "" => "/",
        p if p.starts_with('/') => p,
        "*" if req.method() == Method::OPTIONS => "*",
        other => {
            return Err(ProxyError::bad_request(format!(
                "request path {other:?} does not start with /"
            )))
        }
    };
    let path = crate::path_forms::normalize(path).into_owned();
    if has_dot_segment(&path) {
        // Upstreams disagree on resolving `.`/`..` (and their %2e spellings), so a rule on
        // `/admin` could be walked around with `/x/../admin`. Clients resolve them before
        // sending (RFC 3986 §5.2.4); a request that still carries one is refused.
        return Err(ProxyError::bad_request(
            "the path contains a dot-segment (. or ..); send the resolved path",
        ));
    }
    let query = uri.query().unwrap_or("");
    if overrides_method(query) {
        // The header spellings of an override are stripped in `inject`.
        return Err(crate::method_override::refused("the query"));
    }
    Ok(Target {
        scheme,
        host,
        port,
        method: req.method().clone(),
        path,
        query: query.to_owned(),
    })
}

/// Whether `query` holds a `_method` parameter (any case, any escape of it).
fn overrides_method(query: &str) -> bool {
    // Every request's query passes here: only one that could spell it is parsed (PHP
    // reads `.method` and `[method` as `_method`, so `method` is what every spelling holds
    // unless escaped).
    let could = query.contains('%')
        || query
            .as_bytes()
            .windows(6)
            .any(|w| w.eq_ignore_ascii_case(b"method"));
    could
        && url::form_urlencoded::parse(query.as_bytes())
            .any(|(key, _)| crate::method_override::is_method_override(&key))
}

/// A `.` or `..` segment, literally or percent-encoded (`%2e`), anywhere in the path.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(is_dot_segment)
}

/// `.` or `..`, each dot possibly spelt `%2e` or `%2E`. Looked at in place: every request's
/// path passes here.
fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return false,
        };
        dots += 1;
    }
    matches!(dots, 1 | 2)
}

/// The host and port a request inside `tunnel` names. The common case — the very spelling
/// the tunnel's host was normalised to, with or without a port — is recognised without
/// normalising it again (normalising a normalised name gives it back unchanged).
fn tunnel_authority(tunnel: &Tunnel, named: &str) -> Result<(Host, Option<u16>), ProxyError> {
    if let Host::Name(canonical) = &tunnel.host {
        match named.strip_prefix(canonical.as_str()) {
            Some("") => return Ok((tunnel.host.clone(), None)),
            Some(port) if is_port(port.strip_prefix(':'), tunnel.port) => {
                return Ok((tunnel.host.clone(), Some(tunnel.port)))
            }
            _ => {}
        }
    }
    parse_authority(named)
}

/// `text` is `port` in plain decimal: no sign, no leading zero.
fn is_port(text: Option<&str>, port: u16) -> bool {
    text.is_some_and(|text| {
        text.bytes().all(|b| b.is_ascii_digit())
            && !text.starts_with('0')
            && text.parse::<u16>() == Ok(port)
    })
}

fn parse_authority(text: &str) -> Result<(Host, Option<u16>), ProxyError> {
    split_authority(text).map_err(|e| ProxyError::bad_request(format!("host {text:?}: {e}")))
}

/// Header shapes refused on every protocol (the HTTP/1 wire guard refuses more, earlier).
fn check_headers(headers: &HeaderMap) -> Result<(), ProxyError> {
    if headers.get_all(CONTENT_LENGTH).iter().count() > 1 {
        return Err(ProxyError::bad_request("duplicate Content-Length"));
    }
    // A singleton field (RFC 9110 §8.3): with two, the proxy could read a body as JSON that
    // the upstream reads as a form, or the other way round.
    if headers.get_all(CONTENT_TYPE).iter().count() > 1 {
        return Err(ProxyError::bad_request(
            "duplicate Content-Type: the body could be read two ways",
        ));
    }
    if headers.contains_key(CONTENT_LENGTH) && headers.contains_key(TRANSFER_ENCODING) {
        return Err(ProxyError::bad_request(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if let Some((name, _)) = headers.iter().find(|(_, v)| v.to_str().is_err()) {
        return Err(ProxyError::bad_request(format!(
            "header {name} is not visible ASCII"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_method_override_in_the_query_is_found_in_any_spelling() {
        for query in [
            "_method=DELETE",
            "a=1&_method=PUT",
            "_METHOD=delete",
            "%5Fmethod=DELETE",
            "%5fMethod=DELETE",
            "_%6Dethod=DELETE",
            "_method",
            "+_method=DELETE",
        ] {
            assert!(super::overrides_method(query), "{query}");
        }
        for query in [
            "",
            "method=DELETE",
            "payment_method=card",
            "x_method=1",
            "q=_method",
        ] {
            assert!(!super::overrides_method(query), "{query}");
        }
    }
    use super::*;

    fn tunnel(host: &str, port: u16) -> Origin {
        Origin::Tunnel(Arc::new(Tunnel {
            host: crate::egress::address::normalize_host(host).unwrap(),
            port,
            principal: Arc::new(Principal {
                session_id: "s".into(),
                agent: "a".into(),
                tenant: "t".into(),
                depth: 0,
                parent: None,
                parent_agent: None,
                profile: None,
                expires_at: i64::MAX,
            }),
        }))
    }

    #[test]
    fn plain_absolute_form() {
        let req = Request::get("http://Example.COM./a%2fb?x=1")
            .body(())
            .unwrap();
        let t = target(&Origin::Plain, &req).unwrap();
        assert_eq!(t.host.to_string(), "example.com");
        assert_eq!((t.port, t.scheme), (80, "http"));
        assert_eq!(t.path, "/a%2Fb", "escapes are kept, their hex uppercased");
        let req = Request::get("http://a.example/%61dmin/%7euser")
            .body(())
            .unwrap();
        assert_eq!(target(&Origin::Plain, &req).unwrap().path, "/admin/~user");
        assert_eq!(t.query, "x=1");
    }

    #[test]
    fn origin_form_on_the_proxy_is_refused() {
        let req = Request::get("/").body(()).unwrap();
        assert!(matches!(
            target(&Origin::Plain, &req),
            Err(ProxyError::BadRequest { .. })
        ));
    }

    #[test]
    fn fronting_is_misdirected() {
        let req = Request::get("/")
            .header(HOST, "other.example")
            .body(())
            .unwrap();
        assert!(matches!(
            target(&tunnel("api.example", 443), &req),
            Err(ProxyError::Misdirected { .. })
        ));
        let ok = Request::get("/")
            .header(HOST, "API.example")
            .body(())
            .unwrap();
        assert!(target(&tunnel("api.example", 443), &ok).is_ok());
        let port = Request::get("/")
            .header(HOST, "api.example:8443")
            .body(())
            .unwrap();
        assert!(target(&tunnel("api.example", 443), &port).is_err());
    }

    #[test]
    fn dot_segments_are_refused() {
        for path in ["/a/../b", "/a/./b", "/a/%2e%2E/b", "/..", "/a/.%2e"] {
            let req = Request::get(format!("http://a.example{path}"))
                .body(())
                .unwrap();
            assert!(
                matches!(
                    target(&Origin::Plain, &req),
                    Err(ProxyError::BadRequest { .. })
                ),
                "{path}"
            );
        }
        for path in ["/a..b/", "/.well-known/x", "/a/...", "/%2e%2e%2e"] {
            let req = Request::get(format!("http://a.example{path}"))
                .body(())
                .unwrap();
            assert!(target(&Origin::Plain, &req).is_ok(), "{path}");
        }
    }

    #[test]
    fn dot_segments_are_found_in_place_as_by_decoding_them() {
        // The spelling that decodes each segment before comparing, as this module did.
        let decoded = |segment: &str| {
            let d = segment.to_ascii_lowercase().replace("%2e", ".");
            d == "." || d == ".."
        };
        let pieces = [".", "%2e", "%2E", "%2", "%", "e", "E", "a", "%2f"];
        let mut segments = vec![String::new()];
        for _ in 0..4 {
            let longer: Vec<String> = segments
                .iter()
                .flat_map(|s| pieces.iter().map(move |p| format!("{s}{p}")))
                .collect();
            segments.extend(longer);
        }
        for segment in &segments {
            assert_eq!(is_dot_segment(segment), decoded(segment), "{segment:?}");
        }
    }

    #[test]
    fn a_tunnel_hosts_own_spelling_is_taken_as_normalising_it_would() {
        let Origin::Tunnel(t) = tunnel("api.example", 443) else {
            unreachable!()
        };
        for named in [
            "api.example",
            "api.example:443",
            "api.example:8443",
            "api.example:0443",
            "api.example:+443",
            "api.example:",
            "api.example:443:443",
            "api.example.",
            "API.example:443",
            "api.examplex",
            "api.exampl",
            "api.example:65536",
            "api.example@evil.example",
        ] {
            let fast = tunnel_authority(&t, named).map_err(|e| e.to_string());
            let slow = parse_authority(named).map_err(|e| e.to_string());
            assert_eq!(fast, slow, "{named}");
        }
    }

    #[test]
    fn the_upstream_uri_is_the_target_written_out() {
        for (origin, uri) in [
            (Origin::Plain, "http://a.example/x/y?q=1&r=%20"),
            (Origin::Plain, "http://a.example:8080/"),
            (Origin::Plain, "http://[::1]:8080/v6?x"),
            (Origin::Plain, "http://127.0.0.1/%2F"),
            (tunnel("api.example", 443), "/tool/1k"),
        ] {
            let req = Request::get(uri)
                .header(HOST, "api.example")
                .body(())
                .unwrap();
            let t = target(&origin, &req).unwrap();
            let mut text = format!("{}://{}{}", t.scheme, t.authority(), t.path);
            if !t.query.is_empty() {
                text.push('?');
                text.push_str(&t.query);
            }
            assert_eq!(t.upstream_uri().unwrap().to_string(), text, "{uri}");
        }
    }

    #[test]
    fn an_asterisk_form_options_goes_upstream_as_asked() {
        // Built from parts, `OPTIONS *` keeps its asterisk (formatting and re-parsing the
        // whole URI, as before, gave authority `api.example:443*` and path `/`).
        let req = Request::options("*")
            .header(HOST, "api.example")
            .body(())
            .unwrap();
        let t = target(&tunnel("api.example", 443), &req).unwrap();
        assert_eq!(t.path, "*");
        let uri = t.upstream_uri().unwrap();
        assert_eq!(uri.path_and_query().map(|p| p.as_str()), Some("*"));
        assert_eq!(uri.authority().map(|a| a.as_str()), Some("api.example:443"));
    }

    #[test]
    fn two_content_types_are_refused() {
        let req = Request::post("http://a.example/")
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(())
            .unwrap();
        assert!(matches!(
            target(&Origin::Plain, &req),
            Err(ProxyError::BadRequest { .. })
        ));
    }

    #[test]
    fn cl_and_te_are_refused() {
        let req = Request::post("http://a.example/")
            .header(CONTENT_LENGTH, "1")
            .header(TRANSFER_ENCODING, "chunked")
            .body(())
            .unwrap();
        assert!(target(&Origin::Plain, &req).is_err());
    }
}
