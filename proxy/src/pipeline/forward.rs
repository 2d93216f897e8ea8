//! Phase `forward`: the prepared request sent to its upstream — the egress guard runs inside
//! the connector on every dial, and TLS is verified for the exact host before the request
//! (and any credential in it) is written — and what its body's guards found on the way.

use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::ctx::RequestCtx;
use super::decide::Decided;
use super::inject::Prepared;
use super::upgrade;
use crate::audit::Phase;
use crate::check;
use crate::connector::DialedAddr;
use crate::error::ProxyError;

/// Send `prepared`. `agent_body_failed` is set when the agent's own body failed on its way
/// (the wire guard refused a chunk mid-body, say).
pub(super) async fn run(
    ctx: &mut RequestCtx<'_>,
    prepared: &mut Prepared,
    decided: &Decided,
    agent_body_failed: Option<&std::sync::OnceLock<String>>,
) -> Result<Response<Incoming>, ProxyError> {
    ctx.audit.mark(Phase::Forward);
    if let (Some(approved), Some(cost)) = (ctx.mode.approved(), decided.charge_when_sent) {
        // A limit a human was asked about is granted again (as much as the session started
        // with), and the call is charged whatever the budget says: a human approved it.
        ctx.plane
            .guardrails
            .charge_approved(&ctx.principal.session_id, cost, &approved.grants)
            .await?;
    }
    // Checked again right before forward, for audit failures that arrived while the
    // request was being decided: nothing leaves that could not be recorded.
    ctx.plane.audit.writable().await?;
    let req = std::mem::replace(&mut prepared.req, http::Request::new(crate::body::empty()));
    let send = ctx.plane.upstreams.send(
        req,
        prepared.handshake.is_some() || !prepared.multiplexed,
        prepared.injected.identity.as_deref(),
        &ctx.plane.metrics,
    );
    // A teardown whose grace ran out cancels the wait.
    let sent = match &ctx.ticket {
        Some(ticket) => tokio::select! {
            sent = send => sent,
            () = ticket.cancelled.cancelled() => Err(ProxyError::Upstream {
                reason: "the session was torn down before the upstream answered".into(),
            }),
        },
        None => send.await,
    };
    if let Some(refusal) = prepared.placeholder.as_ref().and_then(|t| {
        ctx.plane
            .credentials
            .tripped(t, &ctx.host, &ctx.plane.metrics)
    }) {
        return Err(refusal);
    }
    if let Some(finding) = prepared.dlp.as_ref().and_then(|slot| slot.get()) {
        ctx.plane
            .metrics
            .check_ran("dlp", "fail", std::time::Duration::ZERO);
        ctx.audit.update(|r| {
            r.checks.push(check::Ran {
                check: "dlp".into(),
                outcome: check::Outcome::Fail,
                duration_us: 0,
            })
        });
        return Err(ProxyError::CheckFailed {
            check: "dlp".into(),
            detail: format!(
                "the request body carries {} at byte {}; the upstream request was aborted",
                finding.kind, finding.offset
            ),
        });
    }
    if let Some(place) = ctx.body_watch.as_ref().and_then(|found| found.get()) {
        // The watch stopped the body before its end left: the upstream never had all of it.
        return Err(crate::method_override::refused(place));
    }
    let mut response = match (sent, agent_body_failed.and_then(|f| f.get())) {
        (Ok(response), _) => response,
        // The send failed because the agent's own body did: a malformed request, not an
        // upstream failure.
        (Err(_), Some(reason)) => {
            return Err(ProxyError::bad_request(format!("request body: {reason}")))
        }
        (Err(e), None) => return Err(e),
    };
    if let Some(DialedAddr(addr)) = response.extensions().get::<DialedAddr>() {
        let addr = addr_text(addr);
        ctx.audit.update(|r| r.upstream = Some(addr));
    }
    // hyper takes `chunked` off an answer's body and leaves any other transfer coding on
    // it: a `gzip, chunked` answer would reach the agent still compressed, where neither
    // the scrubber nor response DLP can read it, and nothing undecoded may pass.
    if let Some(coding) = other_transfer_coding(response.headers()) {
        return Err(ProxyError::Upstream {
            reason: format!(
                "the upstream's answer has the transfer coding {coding:?}, which the proxy \
                 does not decode"
            ),
        });
    }
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        // Spliced only once the upstream completed the WebSocket handshake (upgrade.rs says
        // why); any other 101 is a 502, its upgraded halves dropped, both connections closed.
        upgrade::switched(prepared.handshake.as_ref(), &mut response)?;
        if let Some(agent) = prepared.agent_upgrade.take() {
            upgrade::splice(
                ctx.plane,
                &ctx.principal,
                &ctx.target,
                agent,
                hyper::upgrade::on(&mut response),
                prepared.alive.take(),
            );
        }
    }
    Ok(response)
}

/// The first transfer coding of an answer other than `chunked`, if any (a value that is not
/// text counts as one). Allocates only for what it reports.
fn other_transfer_coding(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .find_map(|v| match v.to_str() {
            Ok(text) => text
                .split(',')
                .map(str::trim)
                .find(|t| !t.is_empty() && !t.eq_ignore_ascii_case("chunked"))
                .map(str::to_ascii_lowercase),
            Err(_) => Some(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        })
}

/// `addr` as its `Display` spells it. An IPv4 address is written out directly: every
/// forwarded request's record names the address it was sent to, and the formatting
/// machinery of `Display` costs about ten times the copy (~1,600 instructions).
fn addr_text(addr: &std::net::SocketAddr) -> String {
    let std::net::SocketAddr::V4(v4) = addr else {
        return addr.to_string();
    };
    let mut text = String::with_capacity(21);
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            text.push('.');
        }
        text.push_str(itoa::Buffer::new().format(octet));
    }
    text.push(':');
    text.push_str(itoa::Buffer::new().format(v4.port()));
    text
}

#[cfg(test)]
mod tests {
    use super::{addr_text, other_transfer_coding};

    #[test]
    fn only_chunked_passes_as_a_transfer_coding() {
        let with = |values: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for v in values {
                headers.append(http::header::TRANSFER_ENCODING, v.parse().unwrap());
            }
            other_transfer_coding(&headers)
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&["chunked"]), None);
        assert_eq!(with(&["Chunked"]), None);
        assert_eq!(with(&["gzip, chunked"]).as_deref(), Some("gzip"));
        assert_eq!(with(&["deflate", "chunked"]).as_deref(), Some("deflate"));
        assert_eq!(with(&["chunked", "X-Custom"]).as_deref(), Some("x-custom"));
    }

    #[test]
    fn an_address_is_spelled_as_display_spells_it() {
        for addr in [
            "127.0.0.1:443",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.20.30.40:8080",
            "[::1]:443",
            "[2001:db8::1:0:0:1]:80",
            "[::ffff:192.0.2.1]:443",
        ] {
            let addr: std::net::SocketAddr = addr.parse().unwrap();
            assert_eq!(addr_text(&addr), addr.to_string());
        }
    }
}
