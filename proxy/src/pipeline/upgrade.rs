//! WebSocket upgrades through the pipeline: which requests are honoured as one, the check
//! that the upstream completed the handshake before anything is spliced, and the splice of
//! the two upgraded connections once both sides switched — tied to the session (closed at
//! teardown or expiry) and charged to its byte budgets ([`tunnel::splice`]).
//!
//! Why the handshake is checked, and not just the status: once the two connections are
//! spliced, nothing the agent writes is parsed, decided or recorded — the wire guard stopped
//! inspecting at the `Upgrade` head, and no request reaches the pipeline again. A `101`
//! alone proves nothing: an upstream that lets its client choose the status (httpbin's
//! `/status/101`) "switches" to no protocol at all, and a splice to it carried the agent's
//! next raw `DELETE` past every policy, with only the handshake's GET on the record. So:
//!
//! - a request that asks for a WebSocket must be a whole handshake (RFC 6455 §4.1: a GET,
//!   `Connection: Upgrade`, one `Sec-WebSocket-Key` of 16 bytes, `Sec-WebSocket-Version:
//!   13`), or it is refused (400) before anything is decided ([`asked`]);
//! - the upstream is sent a key of the proxy's own, drawn fresh for each handshake, in
//!   place of the agent's, and its `101` is spliced only when it carries `Upgrade:
//!   websocket`, `upgrade` in `Connection` and the `Sec-WebSocket-Accept` of that key
//!   (RFC 6455 §4.2.2) — which only an upstream that ran the handshake on this request can
//!   compute, not one that echoes a status and headers the agent chose for its own key. The
//!   agent's `101` carries the accept of the agent's key, as its client expects
//!   ([`switched`]);
//! - any other `101` — to a request that was no handshake, or without those headers — is a
//!   502 `upstream_error`: nothing is spliced, and both upgraded halves are dropped, which
//!   closes both connections (the agent's refusal says `Connection: close`).
//!
//! Once spliced, what the upstream sends is scrubbed of every secret the process injected
//! ([`crate::scrub::websocket`]), as every HTTP answer is. For that the frames must stay
//! readable: the upstream is offered no extension (the agent's `Sec-WebSocket-Extensions`
//! is dropped, so nothing is compressed), and a `101` that names one is refused as above.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Version};
use hyper_util::rt::TokioIo;

use crate::classify::{Target, Tunnel};
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::scrub::websocket::FrameScrubber;
use crate::session::Principal;
use crate::tunnel::{self, Bounds, Ended};

/// RFC 6455 §1.3: appended to a key before it is hashed into its accept.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The agent's `Sec-WebSocket-Key` when `req` asks for a WebSocket (an HTTP/1.1 `Upgrade`
/// naming `websocket`: hyper and the wire guard switch on no other version); `None` when
/// it asks for none. A request that asks for one without being a whole handshake is
/// malformed: no `101` to it could be checked.
pub(super) fn asked<B>(req: &Request<B>) -> Result<Option<&HeaderValue>, ProxyError> {
    let headers = req.headers();
    if req.version() != Version::HTTP_11
        || !tokens(headers, &UPGRADE).any(|t| t.eq_ignore_ascii_case("websocket"))
    {
        return Ok(None);
    }
    let refuse = |what: &str| {
        Err(ProxyError::bad_request(format!(
            "a WebSocket handshake {what}"
        )))
    };
    if req.method() != Method::GET {
        return refuse("is a GET");
    }
    if !only(headers, &UPGRADE, "websocket") {
        return refuse("names `Upgrade: websocket` alone");
    }
    if !tokens(headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return refuse("needs `Connection: Upgrade`");
    }
    let Some(key) = one(headers, &SEC_WEBSOCKET_KEY).filter(|key| {
        STANDARD
            .decode(key.as_bytes())
            .is_ok_and(|nonce| nonce.len() == 16)
    }) else {
        return refuse("needs one `Sec-WebSocket-Key`, 16 bytes in base64");
    };
    if !only(headers, &SEC_WEBSOCKET_VERSION, "13") {
        return refuse("needs `Sec-WebSocket-Version: 13`");
    }
    Ok(Some(key))
}

/// A WebSocket handshake on its way upstream.
#[derive(Debug)]
pub(crate) struct Handshake {
    /// Sent upstream in place of the agent's key: drawn fresh, so no agent knows it ahead
    /// and no upstream can answer for it without running the handshake.
    upstream_key: HeaderValue,
    /// What the upstream's `101` must carry: the accept of `upstream_key`.
    upstream_accept: String,
    /// What the agent's `101` carries instead: the accept of the agent's own key.
    agent_accept: HeaderValue,
}

impl Handshake {
    /// The handshake of a request whose `Sec-WebSocket-Key` is `agent_key` ([`asked`]).
    pub(super) fn new(agent_key: &HeaderValue) -> Self {
        let upstream_key = STANDARD.encode(rand::random::<[u8; 16]>());
        let upstream_accept = accept(upstream_key.as_bytes());
        Self {
            upstream_key: HeaderValue::from_str(&upstream_key)
                .expect("base64 is a valid header value"),
            upstream_accept,
            agent_accept: HeaderValue::from_str(&accept(agent_key.as_bytes()))
                .expect("base64 is a valid header value"),
        }
    }

    /// Put the proxy's key in the request sent upstream, in place of the agent's, and
    /// offer no extension: the frames stay plain enough to scrub (no compression).
    pub(super) fn rekey(&self, headers: &mut HeaderMap) {
        headers.insert(SEC_WEBSOCKET_KEY, self.upstream_key.clone());
        headers.remove(SEC_WEBSOCKET_EXTENSIONS);
    }
}

/// A key's `Sec-WebSocket-Accept`: base64(SHA-1(key + GUID)) (RFC 6455 §4.2.2).
fn accept(key: &[u8]) -> String {
    let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    sha1.update(key);
    sha1.update(GUID.as_bytes());
    STANDARD.encode(sha1.finish())
}

/// Whether the upstream's `101` completed `handshake` (the request's, when it was one):
/// if so its accept is replaced by the one the agent expects; if not, a 502 and nothing
/// may be spliced.
pub(super) fn switched<B>(
    handshake: Option<&Handshake>,
    response: &mut Response<B>,
) -> Result<(), ProxyError> {
    let failed = |detail: &str| ProxyError::Upstream {
        reason: format!(
            "the upstream switched protocols without completing the WebSocket handshake: \
             {detail}"
        ),
    };
    let Some(handshake) = handshake else {
        return Err(failed("the request was no WebSocket handshake"));
    };
    completes(response.headers(), &handshake.upstream_accept).map_err(failed)?;
    response
        .headers_mut()
        .insert(SEC_WEBSOCKET_ACCEPT, handshake.agent_accept.clone());
    Ok(())
}

/// What the head of a `101` lacks to complete a handshake whose accept is `accept`.
fn completes(headers: &HeaderMap, accept: &str) -> Result<(), &'static str> {
    if !only(headers, &UPGRADE, "websocket") {
        return Err("no `Upgrade: websocket`");
    }
    if !tokens(headers, &CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return Err("no `upgrade` in `Connection`");
    }
    if headers.contains_key(SEC_WEBSOCKET_EXTENSIONS) {
        // The proxy offered none (RFC 6455 §9.1: a client fails such a handshake).
        return Err("an extension the proxy did not offer");
    }
    match one(headers, &SEC_WEBSOCKET_ACCEPT) {
        Some(answered) if answered.as_bytes() == accept.as_bytes() => Ok(()),
        Some(_) => Err("a `Sec-WebSocket-Accept` that is not the key's"),
        None => Err("no single `Sec-WebSocket-Accept`"),
    }
}

/// The comma-separated tokens of every `name` line, trimmed.
fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The value of `name` when it comes on exactly one line.
fn one<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (Some(value), None) => Some(value),
        _ => None,
    }
}

/// Whether `name` comes on exactly one line, reading `value` (ASCII case aside).
fn only(headers: &HeaderMap, name: &HeaderName, value: &str) -> bool {
    one(headers, name).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(value.as_bytes()))
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
                // Every secret the process injected is redacted from what the upstream
                // sends, as from any answer.
                let known = plane.credentials.known().clone();
                let scrub = FrameScrubber::new(Box::new(move || known.scrubber()));
                let ended = tunnel::splice_rewriting(
                    TokioIo::new(agent),
                    TokioIo::new(upstream),
                    bounds,
                    Some(scrub),
                )
                .await;
                if ended.is_cut() {
                    plane.record_cut(&at, "websocket", ended);
                }
            }
            Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
        }
    });
}

#[cfg(test)]
mod tests {
    use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
    use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};

    use super::{accept, asked, completes, switched, Handshake};
    use crate::error::ProxyError;

    /// RFC 6455 §1.3's own example.
    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
    const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

    #[test]
    fn the_accept_of_rfc_6455s_example_key() {
        assert_eq!(accept(KEY.as_bytes()), ACCEPT);
    }

    fn switching(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn a_101_completes_the_handshake_only_with_all_three_headers_right() {
        let whole = [
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-accept", ACCEPT),
        ];
        assert_eq!(completes(&switching(&whole), ACCEPT), Ok(()));
        // Spelled as servers spell them.
        let spelled = [
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, upgrade"),
            ("sec-websocket-accept", ACCEPT),
        ];
        assert_eq!(completes(&switching(&spelled), ACCEPT), Ok(()));
        for (headers, lacks) in [
            (&[][..], "no `Upgrade: websocket`"),
            (&whole[1..], "no `Upgrade: websocket`"),
            (
                &[("upgrade", "h2c"), whole[1], whole[2]][..],
                "no `Upgrade: websocket`",
            ),
            (&[whole[0], whole[2]][..], "no `upgrade` in `Connection`"),
            (
                &[whole[0], ("connection", "keep-alive"), whole[2]][..],
                "no `upgrade` in `Connection`",
            ),
            (&whole[..2], "no single `Sec-WebSocket-Accept`"),
            (
                &[whole[0], whole[1], whole[2], whole[2]][..],
                "no single `Sec-WebSocket-Accept`",
            ),
            (
                // The accept of another key (RFC 6455 §4.2.2's other sample).
                &[
                    whole[0],
                    whole[1],
                    ("sec-websocket-accept", "HSmrc0sMlYUkAGmm5OPpG2HaGWk="),
                ][..],
                "a `Sec-WebSocket-Accept` that is not the key's",
            ),
            (
                // Compared exactly: not case-folded, not trimmed of a character.
                &[
                    whole[0],
                    whole[1],
                    ("sec-websocket-accept", "S3PPLMBITXAQ9KYGZZHZRBK+XOO="),
                ][..],
                "a `Sec-WebSocket-Accept` that is not the key's",
            ),
            (
                &[
                    whole[0],
                    whole[1],
                    ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo"),
                ][..],
                "a `Sec-WebSocket-Accept` that is not the key's",
            ),
            (
                // Compression would hide the frames from the scrubber; none was offered.
                &[
                    whole[0],
                    whole[1],
                    whole[2],
                    ("sec-websocket-extensions", "permessage-deflate"),
                ][..],
                "an extension the proxy did not offer",
            ),
        ] {
            assert_eq!(
                completes(&switching(headers), ACCEPT),
                Err(lacks),
                "{headers:?}"
            );
        }
    }

    fn handshake_request(headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::get("/ws").version(Version::HTTP_11);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(()).unwrap()
    }

    const HANDSHAKE: [(&str, &str); 4] = [
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-key", KEY),
        ("sec-websocket-version", "13"),
    ];

    #[test]
    fn a_request_asking_for_a_websocket_must_be_a_whole_handshake() {
        let req = handshake_request(&HANDSHAKE);
        assert_eq!(
            asked(&req).unwrap().map(|k| k.as_bytes()),
            Some(KEY.as_bytes())
        );
        // Asking for none is no handshake, and nothing to refuse.
        for headers in [&[][..], &[("upgrade", "h2c"), HANDSHAKE[1]][..]] {
            assert!(asked(&handshake_request(headers)).unwrap().is_none());
        }
        let mut http10 = handshake_request(&HANDSHAKE);
        *http10.version_mut() = Version::HTTP_10;
        assert!(asked(&http10).unwrap().is_none());
        let mut post = handshake_request(&HANDSHAKE);
        *post.method_mut() = http::Method::POST;
        let without = |skip: &str| -> Vec<(&str, &str)> {
            HANDSHAKE
                .iter()
                .copied()
                .filter(|(n, _)| *n != skip)
                .collect()
        };
        let with = |name: &'static str, value: &'static str| -> Vec<(&str, &str)> {
            let mut headers = without(name);
            headers.push((name, value));
            headers
        };
        let mut refused = vec![(post, "is a GET")];
        for (headers, reason) in [
            (without("sec-websocket-key"), "Sec-WebSocket-Key"),
            (with("sec-websocket-key", ""), "Sec-WebSocket-Key"),
            (
                with("sec-websocket-key", "not base64!"),
                "Sec-WebSocket-Key",
            ),
            // Base64, but 15 bytes.
            (
                with("sec-websocket-key", "AAAAAAAAAAAAAAAAAAAA"),
                "Sec-WebSocket-Key",
            ),
            (
                [HANDSHAKE.to_vec(), vec![("sec-websocket-key", KEY)]].concat(),
                "Sec-WebSocket-Key",
            ),
            (
                without("sec-websocket-version"),
                "Sec-WebSocket-Version: 13",
            ),
            (
                with("sec-websocket-version", "8"),
                "Sec-WebSocket-Version: 13",
            ),
            (without("connection"), "Connection: Upgrade"),
            (with("connection", "keep-alive"), "Connection: Upgrade"),
            (
                with("upgrade", "websocket, h2c"),
                "`Upgrade: websocket` alone",
            ),
        ] {
            refused.push((handshake_request(&headers), reason));
        }
        for (req, reason) in refused {
            match asked(&req) {
                Err(ProxyError::BadRequest { reason: said }) => {
                    assert!(said.contains(reason), "{said:?} for {req:?}");
                    assert!(!said.contains(KEY), "{said:?} quotes the key");
                }
                other => panic!("{req:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_upstream_gets_a_key_of_its_own_and_the_agent_the_accept_of_its_key() {
        let req = handshake_request(&HANDSHAKE);
        let handshake = Handshake::new(asked(&req).unwrap().unwrap());
        let mut headers = req.headers().clone();
        handshake.rekey(&mut headers);
        let sent = headers.get(SEC_WEBSOCKET_KEY).unwrap().clone();
        assert_ne!(sent, KEY, "the agent's key went upstream");
        assert_eq!(headers.get_all(SEC_WEBSOCKET_KEY).iter().count(), 1);
        assert_ne!(
            Handshake::new(&HeaderValue::from_static(KEY)).upstream_key,
            handshake.upstream_key,
            "a key is drawn for each handshake"
        );
        let answer = |accept: &str| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let h = response.headers_mut();
            h.insert(UPGRADE, HeaderValue::from_static("websocket"));
            h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
            h.insert(SEC_WEBSOCKET_ACCEPT, HeaderValue::from_str(accept).unwrap());
            response
        };
        // The upstream that ran the handshake on the key it was sent: switched, and the
        // agent is given the accept of its own key.
        let mut ran = answer(&accept(sent.as_bytes()));
        switched(Some(&handshake), &mut ran).unwrap();
        assert_eq!(ran.headers().get(SEC_WEBSOCKET_ACCEPT).unwrap(), ACCEPT);
        // One that answers for the agent's key (headers the agent chose, echoed) did not.
        let mut echoed = answer(ACCEPT);
        let failed = switched(Some(&handshake), &mut echoed).unwrap_err();
        assert_eq!(failed.kind(), "upstream_error");
        assert!(failed
            .to_string()
            .contains("switched protocols without completing the WebSocket handshake"));
        // A 101 to a request that was no handshake is never one.
        let mut unasked = answer(&accept(sent.as_bytes()));
        let failed = switched(None, &mut unasked).unwrap_err();
        assert!(matches!(failed, ProxyError::Upstream { .. }), "{failed:?}");
        // A bare 101.
        let mut bare = Response::new(());
        *bare.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        assert!(switched(Some(&handshake), &mut bare).is_err());
    }
}
