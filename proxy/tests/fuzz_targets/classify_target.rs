//! Request classification: `classify::target`, plain and in a tunnel.

use super::*;
use crate::hosts::{assert_canonical, host_from};

// ---------------------------------------------------------------------------------------
// Request classification (classify.rs)
// ---------------------------------------------------------------------------------------

/// A host that is usually (three in four) a plain DNS name, otherwise an odd spelling.
#[derive(Debug, TypeGenerator)]
struct HostSpec {
    spelling: u8,
    pieces: Vec<u8>,
}

impl HostSpec {
    fn text(&self) -> String {
        if self.spelling >= 192 {
            return host_from(&self.pieces);
        }
        let alphabet = ['a', 'b', 'Z', '0', '-', '.'];
        let name: String = self
            .pieces
            .iter()
            .map(|&c| alphabet[usize::from(c) % alphabet.len()])
            .collect();
        format!("h{name}")
    }
}

#[derive(Debug, TypeGenerator)]
struct RequestSpec {
    method: u8,
    scheme: u8,
    host: HostSpec,
    port: Option<u16>,
    /// Used instead of `port` one time in sixteen.
    raw_port: (u8, String),
    path_pieces: Vec<u8>,
    query: Option<Vec<u8>>,
    host_header: Option<HostSpec>,
    /// `Some`: inside a tunnel to this host and port; `None`: plain absolute-form.
    tunnel: Option<(HostSpec, u16)>,
    absolute_in_tunnel: bool,
}

/// Path pieces that matter to policy: dot-segments in every spelling, encoded slashes,
/// `;params`, doubled slashes.
const PATH_PIECES: &[&str] = &[
    "/", "/", "/", "/", "//", ".", "..", "%2e", "%2E", "%2f", "%2F", ";", "=", "a", "admin", "a",
    "b", "~", "%00", "?", "*", "%",
];
/// Pieces beyond this are ignored: one bad character refuses the whole URI, so long paths
/// would almost never be built.
const MAX_PATH_PIECES: usize = 12;

fn principal() -> Arc<Principal> {
    Arc::new(Principal {
        session_id: "s".into(),
        agent: "a".into(),
        tenant: "t".into(),
        depth: 0,
        parent: None,
        parent_agent: None,
        profile: None,
        expires_at: i64::MAX,
    })
}

impl RequestSpec {
    fn build(&self) -> Option<(Origin, Request<()>)> {
        let methods = ["GET", "POST", "OPTIONS", "CONNECT", "PROPFIND", "get"];
        let method = Method::from_bytes(methods[usize::from(self.method) % 6].as_bytes()).ok()?;
        let schemes = ["http://", "http://", "https://", "ftp://", ""];
        let scheme = schemes[usize::from(self.scheme) % schemes.len()];
        let pieces = |indices: &[u8]| -> String {
            indices
                .iter()
                .take(MAX_PATH_PIECES)
                .map(|&i| PATH_PIECES[usize::from(i) % PATH_PIECES.len()])
                .collect()
        };
        let path = pieces(&self.path_pieces);
        let mut uri = String::new();
        let absolute = self.tunnel.is_none() || self.absolute_in_tunnel;
        if absolute {
            uri.push_str(scheme);
            uri.push_str(&self.host.text());
            match (&self.raw_port, self.port) {
                ((c, raw), _) if *c >= 240 => uri.push_str(&format!(":{raw}")),
                (_, Some(port)) => uri.push_str(&format!(":{port}")),
                (_, None) => {}
            }
        }
        uri.push_str(&path);
        if let Some(query) = &self.query {
            uri.push('?');
            uri.push_str(&pieces(query));
        }
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(host) = &self.host_header {
            builder = builder.header(http::header::HOST, host.text());
        }
        let origin = match &self.tunnel {
            None => Origin::Plain,
            Some((host, port)) => Origin::Tunnel(Arc::new(Tunnel {
                host: normalize_host(&host.text()).ok()?,
                port: *port,
                principal: principal(),
            })),
        };
        // Requests `http` itself refuses to build never reach the proxy.
        Some((origin, builder.body(()).ok()?))
    }
}

/// A `.`/`..` segment in any spelling, as the proxy must refuse it.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

fn check_target(origin: &Origin, req: &Request<()>, target: &Target) {
    let context = format!("{} {}", req.method(), req.uri());
    // Path: absolute (or `*` for OPTIONS), normalised by RFC 3986's equivalences only,
    // with no dot-segment.
    assert!(
        target.path.starts_with('/') || (target.path == "*" && target.method == Method::OPTIONS),
        "{context}: path {:?}",
        target.path
    );
    let received = req.uri().path();
    assert!(
        target.path == crate::path_forms::reference_normalize(received)
            || (received.is_empty() && target.path == "/"),
        "{context}: path {:?} altered to {:?}",
        received,
        target.path
    );
    assert!(!has_dot_segment(&target.path), "{context}");
    assert_eq!(target.query, req.uri().query().unwrap_or(""), "{context}");
    assert_canonical(&target.host, &context);
    match origin {
        Origin::Plain => assert_eq!(target.scheme, "http", "{context}"),
        Origin::Tunnel(tunnel) => {
            // No fronting: a request inside a tunnel is decided on the tunnel's destination.
            assert_eq!(target.scheme, "https", "{context}");
            assert_eq!((&target.host, target.port), (&tunnel.host, tunnel.port));
        }
    }
    // Policy sees exactly the path and query the upstream will be sent.
    if let Ok(upstream) = target.upstream_uri() {
        assert_eq!(upstream.path(), target.path, "{context} -> {upstream}");
        assert_eq!(
            upstream.query().unwrap_or(""),
            target.query,
            "{context} -> {upstream}"
        );
        let authority = upstream.authority().expect("an absolute URI").as_str();
        let (host, port) = split_authority(authority).expect("our own authority parses");
        assert_eq!((host, port), (target.host.clone(), Some(target.port)));
    }
}

#[test]
fn classify_target_structured_requests() {
    check!()
        .with_type::<RequestSpec>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|spec| {
            let Some((origin, req)) = spec.build() else {
                return;
            };
            match classify::target(&origin, &req) {
                Ok(target) => check_target(&origin, &req, &target),
                Err(ProxyError::BadRequest { .. } | ProxyError::Misdirected { .. }) => {}
                Err(e) => panic!(
                    "{} {}: unexpected {}: {e}",
                    req.method(),
                    req.uri(),
                    e.kind()
                ),
            }
        });
}
