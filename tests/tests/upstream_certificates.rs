//! An upstream whose certificate the proxy cannot verify (THREATS.md, "HTTP and TLS
//! parsing"): an untrusted CA, or a certificate for another name, is a 502 and no request
//! crosses the connection. Loopback only: the upstream's name is mapped to 127.0.0.1.

use ostiary_e2e::proxy::{ProxySpec, TestProxy, ALLOW_ALL};
use ostiary_e2e::raw::{assert_refused, h1, intercepted, request, send_h1};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;

async fn assert_upstream_certificate_refused(proxy: &TestProxy, session: &Session, up: &Upstream) {
    let mut sender = h1(intercepted(
        proxy,
        &session.token,
        "api.example.test",
        up.port(),
        &[b"http/1.1"],
    )
    .await)
    .await;
    let host = format!("api.example.test:{}", up.port());
    let reply = send_h1(&mut sender, request("GET", "/echo", Some(&host)))
        .await
        .unwrap();
    let (body, record) = assert_refused(proxy, &reply, 502, "upstream_error").await;
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("certificate"), "{reason}");
    assert_eq!(record.decision, "error");
    assert!(
        up.seen().is_empty(),
        "no request crossed an unverified connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_certificate_from_an_untrusted_ca_is_502() {
    let up = Upstream::builder().start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: ALLOW_ALL.into(),
        ports: vec![up.port()],
        // upstream_ca_pem deliberately not given.
        ..Default::default()
    })
    .await;
    let session = proxy.session("cert-agent").await;
    assert_upstream_certificate_refused(&proxy, &session, &up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_certificate_for_another_name_is_502() {
    let up = Upstream::builder().names(&["localhost"]).start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: ALLOW_ALL.into(),
        ports: vec![up.port()],
        upstream_ca_pem: Some(up.ca_pem()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("cert-agent").await;
    assert_upstream_certificate_refused(&proxy, &session, &up).await;
}
