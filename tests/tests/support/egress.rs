//! Shared by the egress test crates (`egress.rs`, `tunnels.rs`): the resolver/dialer seams
//! that keep every dial on loopback, and requests sent as a session. Each crate uses a
//! subset, so unused items are allowed here.
#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;

use ostiary::Options;
use ostiary_e2e::proxy::{ProxySpec, RecordingDialer, StubResolver, TestProxy};
use ostiary_e2e::raw::{absolute_get, auth_line, connect};
use ostiary_sdk::Session;

/// A stub resolver and a recording dialer, and the `Options` that install them.
pub(crate) fn seams() -> (StubResolver, RecordingDialer, Options) {
    let stub = StubResolver::default();
    let dialer = RecordingDialer::default();
    let options = Options {
        resolver: Arc::new(stub.clone()),
        dialer: Arc::new(dialer.clone()),
        ..Default::default()
    };
    (stub, dialer, options)
}

pub(crate) fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

pub(crate) async fn started(mut spec: ProxySpec) -> (TestProxy, Session) {
    // These tests probe blocked destinations over and over from one session, which the
    // loop watchdog (guardrails.rs) rightly pauses as a burst of denials.
    spec.extra_toml
        .push_str("\n[sessions.watchdog]\nenabled = false\n");
    let proxy = TestProxy::start(spec).await;
    let session = proxy.session("egress-agent").await;
    (proxy, session)
}

/// `CONNECT authority` with the session's token.
pub(crate) async fn connect_as(
    proxy: &TestProxy,
    session: &Session,
    authority: &str,
) -> ostiary_e2e::raw::Reply {
    connect(proxy.proxy_addr, authority, &auth_line(&session.token))
        .await
        .1
}

/// `GET url` in absolute form with the session's token and `extra` header lines.
pub(crate) async fn get_as(
    proxy: &TestProxy,
    session: &Session,
    url: &str,
    extra: &str,
) -> ostiary_e2e::raw::Reply {
    absolute_get(proxy, url, &format!("{}{extra}", auth_line(&session.token))).await
}

/// The one audit record of an allowed `http` request (forwarded responses are the
/// upstream's and carry no `ostiary-request-id`, so the record is found by its outcome).
pub(crate) async fn only_allowed_http(proxy: &TestProxy) -> ostiary::audit::AuditRecord {
    let records: Vec<_> = proxy
        .audit()
        .await
        .into_iter()
        .filter(|r| r.kind == "http" && r.decision == "allow")
        .collect();
    assert_eq!(records.len(), 1, "{records:#?}");
    records.into_iter().next().unwrap()
}
