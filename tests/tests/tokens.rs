//! Session tokens under attack (THREATS.md, "Session tokens"): every forged, malformed,
//! mis-claimed or revoked token is a 407 with `Proxy-Authenticate: Basic realm="ostiary"`
//! and a JSON `unauthenticated` body, on the plain listener (absolute-form) and at CONNECT
//! alike, with an audit record — and nothing reaches the upstream.
//!
//! Forged tokens are signed here with `jsonwebtoken`: with the proxy's own Ed25519 key read
//! from its state directory (so that only the one defect under test is wrong; a control test
//! shows such a token is otherwise accepted), with another key, with HS256 keyed by the public
//! key PEM, or with no signature at all. Every proxy here runs with a recording dialer, so
//! "nothing reached the upstream" also means "nothing was dialed".

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ostiary::session::token::{AUDIENCE, ISSUER};
use ostiary::Options;
use ostiary_e2e::proxy::{ProxySpec, RecordingDialer, StubResolver, TestProxy};
use ostiary_e2e::raw::{
    absolute_get, assert_refused, auth_line, connect, h1, h2, intercepted, request, send_h1,
    send_h2, IO_DEADLINE,
};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{NewSession, Session};
use serde_json::{json, Value};

/// One proxy with a plain upstream (reached in absolute form) and an HTTPS upstream
/// (reached through CONNECT), a live session, and the proxy's token keys.
struct Fixture {
    plain: Upstream,
    tls: Upstream,
    proxy: TestProxy,
    session: Session,
    dialer: RecordingDialer,
    signing: EncodingKey,
    public_pem: String,
}

async fn fixture() -> Fixture {
    let plain = Upstream::builder().tls(false).start().await;
    let tls = Upstream::builder().start().await;
    let dialer = RecordingDialer::default();
    let proxy = TestProxy::start(ProxySpec {
        ports: vec![plain.port(), tls.port()],
        upstream_ca_pem: Some(tls.ca_pem()),
        options: Options {
            resolver: Arc::new(StubResolver::default()),
            dialer: Arc::new(dialer.clone()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let session = proxy.session("token-agent").await;
    let state = proxy.dir.path().join("state");
    let key_pem = std::fs::read(state.join("session-signing.key.pem")).expect("signing key");
    let public_pem =
        std::fs::read_to_string(state.join("session-signing.pub.pem")).expect("public key");
    Fixture {
        plain,
        tls,
        proxy,
        session,
        dialer,
        signing: EncodingKey::from_ed_pem(&key_pem).expect("the proxy's key is Ed25519 PEM"),
        public_pem,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

impl Fixture {
    /// Claims exactly like the ones the proxy issues for the fixture's session.
    fn claims(&self) -> Value {
        let now = now();
        json!({
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": self.session.agent,
            "exp": now + 600,
            "nbf": now - 10,
            "iat": now,
            "jti": self.session.session_id,
            "ten": self.session.tenant,
        })
    }

    /// Sign `claims` with the proxy's own key under `header` (EdDSA unless the test says so).
    fn sign(&self, header: &Header, claims: &Value) -> String {
        jsonwebtoken::encode(header, claims, &self.signing).expect("signing a test token")
    }

    fn tls_authority(&self) -> String {
        format!("{}:{}", self.tls.host(), self.tls.port())
    }

    /// The request carrying `lines` (raw header lines, CRLF-terminated) is refused with 407
    /// in absolute form and at CONNECT, and both refusals are audited. Returns the reason the
    /// absolute-form refusal gave.
    async fn assert_407(&self, lines: &str, case: &str) -> String {
        let reply = absolute_get(&self.proxy, &self.plain.url("/echo"), lines).await;
        let (body, record) = assert_refused(&self.proxy, &reply, 407, "unauthenticated").await;
        let reason = body["reason"].as_str().unwrap_or_default().to_owned();
        assert!(
            !reason.is_empty(),
            "{case}: a 407 carries a reason:\n{reply}"
        );
        assert_eq!(record.kind, "http", "{case}");
        assert_eq!(
            record.reason.as_deref(),
            Some(&*format!("proxy authentication failed: {reason}")),
            "{case}: the audit record says why"
        );

        let (_, reply) = connect(self.proxy.proxy_addr, &self.tls_authority(), lines).await;
        let (_, record) = assert_refused(&self.proxy, &reply, 407, "unauthenticated").await;
        assert_eq!(record.kind, "connect", "{case}");
        reason
    }

    /// Nothing was dialed and neither upstream saw a connection.
    fn assert_nothing_reached(&self) {
        assert!(
            self.dialer.dials().is_empty(),
            "dials: {:?}",
            self.dialer.dials()
        );
        assert_eq!(self.plain.connections(), 0, "{:?}", self.plain.seen());
        assert_eq!(self.tls.connections(), 0, "{:?}", self.tls.seen());
    }
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().unwrap().remove(key);
    claims
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_malformed_proxy_authorization_is_407() {
    let fx = fixture().await;
    let basic = |text: &str| format!("Proxy-Authorization: Basic {}\r\n", STANDARD.encode(text));
    let cases = [
        ("missing header", String::new()),
        ("garbage bearer", auth_line("garbage")),
        ("three dots of garbage", auth_line("a.b.c")),
        (
            "empty bearer",
            "Proxy-Authorization: Bearer \r\n".to_owned(),
        ),
        (
            "no scheme",
            format!("Proxy-Authorization: {}\r\n", fx.session.token),
        ),
        (
            "unknown scheme",
            format!("Proxy-Authorization: Digest {}\r\n", fx.session.token),
        ),
        (
            "basic not base64",
            "Proxy-Authorization: Basic !!!\r\n".to_owned(),
        ),
        ("basic without colon", basic(&fx.session.token)),
        ("basic with garbage token", basic("agent:garbage")),
        (
            "token in Authorization instead",
            format!("Authorization: Bearer {}\r\n", fx.session.token),
        ),
        (
            "two Proxy-Authorization headers",
            format!("{}{}", auth_line(&fx.session.token), auth_line("garbage")),
        ),
    ];
    for (case, lines) in &cases {
        fx.assert_407(lines, case).await;
    }
    fx.assert_nothing_reached();
}

/// The control for every forged-token test below: a token this test signs with the proxy's
/// key and the claims the proxy would issue is accepted, so each refusal that follows is
/// due to the one thing that test changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_token_signed_with_the_proxys_key_and_right_claims_is_accepted() {
    let fx = fixture().await;
    let token = fx.sign(&Header::new(Algorithm::EdDSA), &fx.claims());
    let reply = absolute_get(&fx.proxy, &fx.plain.url("/echo"), &auth_line(&token)).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(fx.plain.count("/echo"), 1);
    let (_, reply) = connect(fx.proxy.proxy_addr, &fx.tls_authority(), &auth_line(&token)).await;
    assert_eq!(reply.status, 200, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alg_none_is_407() {
    let fx = fixture().await;
    let claims = b64(&fx.claims());
    let signed = fx.sign(&Header::new(Algorithm::EdDSA), &fx.claims());
    let real_signature = signed.rsplit('.').next().unwrap().to_owned();
    for alg in ["none", "None", "NONE"] {
        let header = b64(&json!({"alg": alg, "typ": "JWT"}));
        for signature in ["", real_signature.as_str()] {
            let token = format!("{header}.{claims}.{signature}");
            let case = format!("alg {alg} with signature {signature:?}");
            fx.assert_407(&auth_line(&token), &case).await;
        }
    }
    fx.assert_nothing_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs256_keyed_with_the_public_key_pem_is_407() {
    let fx = fixture().await;
    for secret in [fx.public_pem.as_str(), fx.public_pem.trim()] {
        let token = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &fx.claims(),
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap();
        let reason = fx
            .assert_407(&auth_line(&token), "HS256 keyed by the public PEM")
            .await;
        assert!(reason.contains("token is invalid"), "{reason}");
    }
    fx.assert_nothing_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_signed_by_another_key_or_algorithm_are_407() {
    let fx = fixture().await;
    let other_ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let other_ed = EncodingKey::from_ed_pem(other_ed.serialize_pem().as_bytes()).unwrap();
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ec = EncodingKey::from_ec_pem(ec.serialize_pem().as_bytes()).unwrap();
    for (case, alg, key) in [
        ("EdDSA by another key", Algorithm::EdDSA, &other_ed),
        ("ES256, outside the allowlist", Algorithm::ES256, &ec),
    ] {
        let token = jsonwebtoken::encode(&Header::new(alg), &fx.claims(), key).unwrap();
        fx.assert_407(&auth_line(&token), case).await;
    }
    fx.assert_nothing_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validly_signed_tokens_with_bad_claims_are_407() {
    let fx = fixture().await;
    let now = now();
    let good = fx.claims();
    let cases = [
        (
            "wrong aud",
            with(good.clone(), "aud", json!("some-other-service")),
        ),
        ("wrong iss", with(good.clone(), "iss", json!("evil-issuer"))),
        (
            "expired exp",
            with(
                with(good.clone(), "exp", json!(now - 3600)),
                "nbf",
                json!(now - 7200),
            ),
        ),
        ("future nbf", with(good.clone(), "nbf", json!(now + 3600))),
        // Just past the proxy's own leeway (5 s), well within jsonwebtoken's default (60 s):
        // the leeway is set, not inherited.
        (
            "exp 15 s ago",
            with(
                with(good.clone(), "exp", json!(now - 15)),
                "nbf",
                json!(now - 600),
            ),
        ),
        ("nbf in 15 s", with(good.clone(), "nbf", json!(now + 15))),
        (
            "exp as a string",
            with(good.clone(), "exp", json!((now + 600).to_string())),
        ),
        (
            "nbf as a string",
            with(good.clone(), "nbf", json!((now - 10).to_string())),
        ),
        ("missing exp", without(good.clone(), "exp")),
        ("missing nbf", without(good.clone(), "nbf")),
        ("missing iss", without(good.clone(), "iss")),
        ("missing aud", without(good.clone(), "aud")),
        ("missing sub", without(good.clone(), "sub")),
        ("missing jti", without(good.clone(), "jti")),
        (
            "jti of no session",
            with(good.clone(), "jti", json!("s_no_such_session")),
        ),
        (
            "sub of another agent",
            with(good.clone(), "sub", json!("other-agent")),
        ),
        (
            "ten of another tenant",
            with(good.clone(), "ten", json!("other-tenant")),
        ),
        ("empty sub", with(good.clone(), "sub", json!(""))),
    ];
    for (case, claims) in &cases {
        let token = fx.sign(&Header::new(Algorithm::EdDSA), claims);
        fx.assert_407(&auth_line(&token), case).await;
    }
    fx.assert_nothing_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_reference_headers_are_407_and_nothing_is_fetched() {
    let fx = fixture().await;
    // A key server the token points at; it must never see a connection.
    let key_server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    key_server.set_nonblocking(true).unwrap();
    let key_url = format!("http://{}/jwks.json", key_server.local_addr().unwrap());
    let header = |f: &dyn Fn(&mut Header)| {
        let mut h = Header::new(Algorithm::EdDSA);
        f(&mut h);
        h
    };
    let ca_der = STANDARD.encode(
        rustls_pki_types::pem::PemObject::from_pem_slice(fx.proxy.ca_pem.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap(),
    );
    let cases = [
        ("kid", header(&|h| h.kid = Some("1".into()))),
        (
            "path-like kid",
            header(&|h| h.kid = Some("../../../../../dev/null".into())),
        ),
        ("jku", header(&|h| h.jku = Some(key_url.clone()))),
        ("x5u", header(&|h| h.x5u = Some(key_url.clone()))),
        ("x5c", header(&|h| h.x5c = Some(vec![ca_der.clone()]))),
    ];
    for (case, header) in &cases {
        let token = fx.sign(header, &fx.claims());
        let reason = fx.assert_407(&auth_line(&token), case).await;
        assert!(reason.contains("refers to a key"), "{case}: {reason}");
    }
    match key_server.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the key URL in the token was fetched: {other:?}"),
    }
    fx.assert_nothing_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_replayed_after_teardown_is_407_even_inside_an_open_h1_tunnel() {
    let fx = fixture().await;
    let host = fx.tls_authority();
    let tunnel = intercepted(
        &fx.proxy,
        &fx.session.token,
        fx.tls.host(),
        fx.tls.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = h1(tunnel).await;
    let ok = send_h1(&mut sender, request("GET", "/echo", Some(&host)))
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{ok}");

    fx.proxy
        .control()
        .delete_session(&fx.session.session_id)
        .await
        .unwrap();

    // Teardown closes the open tunnel (teardown_streams.rs); a request that raced the close
    // is refused, never forwarded.
    if let Ok(after) = send_h1(&mut sender, request("GET", "/echo", Some(&host))).await {
        let (body, record) = assert_refused(&fx.proxy, &after, 407, "unauthenticated").await;
        assert_eq!(
            body["reason"],
            "the session is not active (revoked or expired)"
        );
        assert_eq!(record.kind, "http");
        assert_eq!(record.session.as_deref(), Some(&*fx.session.session_id));
    }
    assert_eq!(
        fx.tls.count("/echo"),
        1,
        "only the request before teardown arrived"
    );

    // Replayed on fresh connections, both ways.
    let reason = fx
        .assert_407(&auth_line(&fx.session.token), "replayed after teardown")
        .await;
    assert!(reason.contains("not active"), "{reason}");
    assert_eq!(fx.plain.connections(), 0);
    assert_eq!(fx.tls.count("/echo"), 1);
    let records = fx.proxy.audit().await;
    assert!(
        records.iter().any(|r| r.kind == "session"
            && r.session.as_deref() == Some(&*fx.session.session_id)
            && r.reason.as_deref() == Some("session revoked")),
        "{records:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_cuts_off_an_open_h2_tunnel() {
    let fx = fixture().await;
    let tunnel = intercepted(
        &fx.proxy,
        &fx.session.token,
        fx.tls.host(),
        fx.tls.port(),
        &[b"h2"],
    )
    .await;
    let mut sender = h2(tunnel).await;
    let url = fx.tls.url("/echo");
    let ok = send_h2(&mut sender, request("GET", &url, None))
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{ok}");
    fx.proxy
        .control()
        .delete_session(&fx.session.session_id)
        .await
        .unwrap();
    // The connection is shut down (GOAWAY); a request that raced it is refused.
    if let Ok(after) = send_h2(&mut sender, request("GET", &url, None)).await {
        let (_, record) = assert_refused(&fx.proxy, &after, 407, "unauthenticated").await;
        assert_eq!(record.session.as_deref(), Some(&*fx.session.session_id));
    }
    assert_eq!(fx.tls.count("/echo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_407_inside_an_open_tunnel_and_outside() {
    let fx = fixture().await;
    let session = fx
        .proxy
        .control()
        .create_session(&NewSession {
            agent: "short-lived".into(),
            ttl: Some("2s".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let host = fx.tls_authority();
    let tunnel = intercepted(
        &fx.proxy,
        &session.token,
        fx.tls.host(),
        fx.tls.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = h1(tunnel).await;
    let first = send_h1(&mut sender, request("GET", "/echo", Some(&host)))
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{first}");

    // Poll the open tunnel until the session's two seconds are over: then it is refused, or
    // (teardown_streams.rs) closed at expiry.
    let deadline = tokio::time::Instant::now() + IO_DEADLINE;
    let refused = loop {
        let Ok(reply) = send_h1(&mut sender, request("GET", "/echo", Some(&host))).await else {
            break None;
        };
        if reply.status != 200 {
            break Some(reply);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a 2s session still works after {IO_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        now() >= session.expires_at,
        "refused before the session expired"
    );
    if let Some(refused) = refused {
        assert_refused(&fx.proxy, &refused, 407, "unauthenticated").await;
    }
    let reason = fx
        .assert_407(&auth_line(&session.token), "expired session")
        .await;
    assert!(reason.contains("not active"), "{reason}");
}
