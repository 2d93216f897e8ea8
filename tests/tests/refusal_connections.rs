//! A refusal that may come before the request's body was read ends the agent's HTTP/1
//! connection, and says so (`Connection: close`): the proxy cannot take another request on a
//! connection whose body it did not read, and a client not told so sends its next request
//! into a closing socket (an SDK's test met "server disconnected" that way after a `423`).
//! A refusal of a request without a body keeps the connection for the next request.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{h1, intercepted, send_h1};
use ostiary_e2e::upstream::Upstream;

const POLICY: &str = r#"
@id("reads") permit (principal, action == Ostiary::Action::"http", resource)
when { context.method == "GET" && context.path == "/echo" };
"#;

fn request(method: &str, path: &str, authority: &str, body: &str) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", authority);
    if !body.is_empty() {
        builder = builder.header("content-type", "application/json");
    }
    builder
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_with_a_body_closes_its_connection_and_one_without_keeps_it() {
    let upstream = Upstream::builder().start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICY.into(),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("agent").await;
    let authority = format!("{}:{}", upstream.host(), upstream.port());
    let tunnel = intercepted(
        &proxy,
        &session.token,
        upstream.host(),
        upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut conn = h1(tunnel).await;

    // Refused without a body: the connection stays, and carries the next request.
    let refused = send_h1(&mut conn, request("GET", "/secret", &authority, ""))
        .await
        .unwrap();
    assert_eq!(refused.status, 403, "{refused}");
    assert!(refused.headers.get("connection").is_none(), "{refused}");
    let allowed = send_h1(&mut conn, request("GET", "/echo", &authority, ""))
        .await
        .unwrap();
    assert_eq!(allowed.status, 200, "{allowed}");

    // Refused with a body: told to close, and closed.
    let refused = send_h1(
        &mut conn,
        request("POST", "/echo", &authority, r#"{"x": 1}"#),
    )
    .await
    .unwrap();
    assert_eq!(refused.status, 403, "{refused}");
    assert_eq!(
        refused.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "{refused}"
    );
    conn.ready()
        .await
        .expect_err("the connection is closed after the answer");
    assert_eq!(
        upstream.count("/echo"),
        1,
        "only the allowed GET went upstream"
    );
}
