//! Uninspected relays for `egress.tunnel` hosts (THREATS.md, "Egress and SSRF"): relayed
//! without interception (the client sees the upstream's own certificate), decided as
//! `Action::"connect"` at CONNECT, and cut off when the ClientHello names another host.
//! Every dial is recorded and kept on loopback.

use ostiary_e2e::proxy::{ProxySpec, RecordingDialer, TestProxy};
use ostiary_e2e::raw::{
    assert_refused, auth_line, client_config, connect, h1, request, send_h1, tls, wait_for_audit,
};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;

use crate::support::egress as support;
use support::*;

/// Permits inspected requests only: a tunnel host needs a `connect` permit of its own.
const HTTP_ONLY: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);
"#;

/// A proxy relaying `tunnel.test` uninspected to an HTTPS upstream whose own certificate
/// names it; `policies` decide the CONNECT.
async fn tunnel_fixture(policies: &str) -> (Upstream, TestProxy, Session, RecordingDialer) {
    let upstream = Upstream::builder().names(&["tunnel.test"]).start().await;
    let (_stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: policies.into(),
        names: vec!["tunnel.test".into()],
        ports: vec![upstream.port()],
        tunnel: vec!["tunnel.test".into()],
        options,
        ..Default::default()
    })
    .await;
    (upstream, proxy, session, dialer)
}

const TUNNEL_ONLY: &str = r#"
@id("tunnel-ok")
permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"tunnel.test");
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_hosts_are_relayed_uninspected_and_decided_as_connect() {
    let (upstream, proxy, session, dialer) = tunnel_fixture(TUNNEL_ONLY).await;
    let authority = format!("tunnel.test:{}", upstream.port());

    let (wire, reply) = connect(proxy.proxy_addr, &authority, &auth_line(&session.token)).await;
    assert_eq!(reply.status, 200, "{reply}");
    // A successful CONNECT carries no request id (only refusals do); find it by kind.
    let record = wait_for_audit(&proxy, "the accepted CONNECT", |r| r.kind == "tunnel").await;
    assert_eq!(record.decision, "allow");
    assert_eq!(record.status, Some(200));
    assert_eq!(record.policies, vec!["tunnel-ok".to_owned()]);
    // The decision is kept so that it can be made again (replay, a shadow set).
    let kept = ostiary_policies::recorded::from_json(&record.decided.as_ref().unwrap().to_value())
        .unwrap();
    assert_eq!(
        (kept.outcome.as_str(), kept.policies.as_slice()),
        ("allow", &record.policies[..])
    );
    assert!(
        matches!(
            kept.request.action,
            ostiary_policies::Action::Connect { .. }
        ),
        "{kept:?}"
    );

    // The client verifies the *upstream's* certificate: the proxy minted nothing.
    let stream = tls(
        wire.into_inner(),
        upstream.ca().client_config(&[b"http/1.1"]),
        "tunnel.test",
    )
    .await
    .expect("TLS end to end with the upstream");
    let mut sender = h1(stream).await;
    // No http permit exists: an intercepted request would be denied. This one is not seen.
    let reply = send_h1(&mut sender, request("GET", "/echo", Some(&authority)))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(upstream.count("/echo"), 1);
    assert_eq!(upstream.seen()[0].sni.as_deref(), Some("tunnel.test"));
    assert!(
        proxy.audit().await.iter().all(|r| r.kind != "http"),
        "an uninspected tunnel has no per-request records"
    );

    // A client trusting only the proxy's CA cannot complete the handshake.
    let (wire, reply) = connect(proxy.proxy_addr, &authority, &auth_line(&session.token)).await;
    assert_eq!(reply.status, 200, "{reply}");
    let err = tls(
        wire.into_inner(),
        client_config(&proxy.ca_pem, &[b"http/1.1"]),
        "tunnel.test",
    )
    .await
    .expect_err("the proxy's CA did not issue the upstream's certificate");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(dialer.dials().iter().all(|d| *d == upstream.addr()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_hosts_without_a_connect_permit_are_403_at_connect() {
    let (upstream, proxy, session, dialer) = tunnel_fixture(HTTP_ONLY).await;
    let reply = connect_as(
        &proxy,
        &session,
        &format!("tunnel.test:{}", upstream.port()),
    )
    .await;
    let (body, record) = assert_refused(&proxy, &reply, 403, "denied").await;
    assert_eq!(body["action"], "Ostiary::Action::\"connect\"");
    assert_eq!(body["resource"], "Ostiary::Host::\"tunnel.test\"");
    assert_eq!(record.kind, "tunnel");
    assert_eq!(upstream.connections(), 0);
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_client_hello_naming_another_host_is_cut_off() {
    let (upstream, proxy, session, dialer) = tunnel_fixture(TUNNEL_ONLY).await;
    let authority = format!("tunnel.test:{}", upstream.port());
    // SNI other.test, no SNI (an IP as server name), and bytes that are not TLS at all.
    for (server_name, why) in [
        (Some("other.test"), "differs from the CONNECT host"),
        (Some("127.0.0.1"), "no SNI"),
        (None, "TLS"),
    ] {
        let (mut wire, reply) =
            connect(proxy.proxy_addr, &authority, &auth_line(&session.token)).await;
        assert_eq!(reply.status, 200, "{reply}");
        match server_name {
            Some(name) => {
                let result = tls(
                    wire.into_inner(),
                    upstream.ca().client_config(&[b"http/1.1"]),
                    name,
                )
                .await;
                assert!(result.is_err(), "{name}: the handshake must not complete");
            }
            None => {
                wire.send(b"GET /echo HTTP/1.1\r\nHost: tunnel.test\r\n\r\n")
                    .await
                    .unwrap();
                assert!(
                    wire.closed_within(ostiary_e2e::raw::IO_DEADLINE).await,
                    "plain text in a tunnel is cut off"
                );
            }
        }
        let record = wait_for_audit(&proxy, why, |r| {
            r.kind == "tunnel"
                && r.decision == "deny"
                && r.reason.as_deref().is_some_and(|t| t.contains(why))
        })
        .await;
        assert_eq!(record.session.as_deref(), Some(&*session.session_id));
        assert_eq!(record.host.as_deref(), Some("tunnel.test"));
    }
    assert_eq!(upstream.connections(), 0, "nothing reached the upstream");
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}
