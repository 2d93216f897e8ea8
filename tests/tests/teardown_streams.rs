//! Teardown ends every byte stream (THREATS.md, "Sessions and teardown"): a session that is
//! revoked (`DELETE /v1/sessions/{id}`) or expires loses its WebSocket splices, its
//! uninspected `egress.tunnel` relays and its intercepted TLS connections — idle keep-alive
//! and h2 ones too, not only their next request. The bytes those streams carry count against
//! the session's `max_bytes_sent`/`max_bytes_received`, and a stream that reaches a budget
//! is cut at it. A CONNECT sent inside a tunnel is refused and the connection closed.
//!
//! Bounds are the raw helpers' deadline (`IO_DEADLINE`): what is asserted is that the proxy
//! closes the stream (the client reads its end), never how fast.

use futures_util::{SinkExt, StreamExt};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, auth_line, connect, intercepted, request, tls, Wire, IO_DEADLINE};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const TUNNEL_HOST: &str = "tunnel.test";

const POLICIES: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);

@id("tunnel-ok")
permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"tunnel.test");
"#;

/// An intercepted upstream (`api.example.test`, `/ws` echo), an uninspected one
/// (`tunnel.test`, relayed as is), and a proxy that reaps every 100 ms.
struct Rig {
    api: Upstream,
    relayed: Upstream,
    proxy: TestProxy,
}

impl Rig {
    async fn start() -> Self {
        let api = Upstream::builder().start().await;
        let relayed = Upstream::builder().names(&[TUNNEL_HOST]).start().await;
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICIES.into(),
            names: vec!["api.example.test".into(), TUNNEL_HOST.into()],
            ports: vec![api.port(), relayed.port()],
            upstream_ca_pem: Some(api.ca_pem()),
            tunnel: vec![TUNNEL_HOST.into()],
            // An idle keep-alive would otherwise be closed by the head-read timeout (10 s),
            // within the tests' deadline: only the session's end may close it here.
            extra_toml:
                "[broker]\nreap_interval = \"100ms\"\n\n[proxy]\nheader_read_timeout = \"60s\"\n"
                    .into(),
            ..Default::default()
        })
        .await;
        Self {
            api,
            relayed,
            proxy,
        }
    }

    /// `POST /v1/sessions` with `body` (byte budgets are not in the SDK's `NewSession`).
    async fn session(&self, body: Value) -> Session {
        let response = reqwest::Client::new()
            .post(format!("http://{}/v1/sessions", self.proxy.control_addr))
            .bearer_auth(&self.proxy.admin_token)
            .json(&body)
            .send()
            .await
            .expect("control API");
        assert_eq!(response.status(), 201, "creating {body}");
        response.json().await.expect("a session")
    }

    async fn usage(&self, session: &Session) -> Value {
        let shown = self
            .proxy
            .control()
            .session(&session.session_id)
            .await
            .unwrap();
        shown["usage"].clone()
    }

    async fn delete(&self, session: &Session) {
        self.proxy
            .control()
            .delete_session(&session.session_id)
            .await
            .expect("session deleted");
    }

    /// A WebSocket to the api upstream's `/ws`, through an intercepted tunnel.
    async fn websocket(&self, session: &Session) -> WebSocketStream<TlsStream<TcpStream>> {
        let tunnel = intercepted(
            &self.proxy,
            &session.token,
            self.api.host(),
            self.api.port(),
            &[b"http/1.1"],
        )
        .await;
        let url = format!("wss://{}:{}/ws", self.api.host(), self.api.port());
        let (ws, response) =
            tokio::time::timeout(IO_DEADLINE, tokio_tungstenite::client_async(url, tunnel))
                .await
                .expect("handshake in time")
                .expect("a WebSocket through the proxy");
        assert_eq!(response.status(), 101);
        ws
    }

    /// An uninspected relay to `tunnel.test`, TLS end to end with the upstream itself.
    async fn relay(&self, session: &Session) -> TlsStream<TcpStream> {
        let authority = format!("{TUNNEL_HOST}:{}", self.relayed.port());
        let (wire, reply) = connect(
            self.proxy.proxy_addr,
            &authority,
            &auth_line(&session.token),
        )
        .await;
        assert_eq!(reply.status, 200, "{reply}");
        tls(
            wire.into_inner(),
            self.relayed.ca().client_config(&[b"http/1.1"]),
            TUNNEL_HOST,
        )
        .await
        .expect("TLS with the relayed upstream")
    }

    fn relayed_authority(&self) -> String {
        format!("{TUNNEL_HOST}:{}", self.relayed.port())
    }
}

/// An echo round trip of `payload` bytes.
async fn echo(ws: &mut WebSocketStream<TlsStream<TcpStream>>, payload: usize) {
    let message = Message::binary(vec![b'w'; payload]);
    ws.send(message.clone()).await.expect("sent");
    let back = tokio::time::timeout(IO_DEADLINE, ws.next())
        .await
        .expect("echo in time");
    assert_eq!(back.unwrap().unwrap(), message);
}

/// The WebSocket ends (a close, an error or EOF) within the deadline, with no message.
async fn assert_ws_closed(ws: &mut WebSocketStream<TlsStream<TcpStream>>, what: &str) {
    match tokio::time::timeout(IO_DEADLINE, ws.next()).await {
        Err(_) => panic!("{what}: the WebSocket is still open after {IO_DEADLINE:?}"),
        Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_)))) => {}
        Ok(Some(Ok(other))) => panic!("{what}: a message after the end: {other:?}"),
    }
}

/// The stream is closed by the proxy: EOF (or an error) within the deadline.
async fn assert_closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, what: &str) {
    let mut buf = [0u8; 4096];
    let end = tokio::time::timeout(IO_DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "{what}: still open after {IO_DEADLINE:?}");
}

/// One HTTP/1.1 GET over an uninspected relay (raw bytes, TLS with the upstream).
async fn relayed_get(stream: &mut TlsStream<TcpStream>, authority: &str, path: &str) -> raw::Reply {
    let mut wire = Wire::new(stream);
    wire.send(format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    wire.response().await.expect("a response over the relay")
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Waits for the `stream` audit record of a cut of one of the session's streams that
/// matches `pred`: the proxy records a cut once the stream is closed, so the client may
/// read its end first.
async fn wait_for_cut(
    proxy: &TestProxy,
    session: &Session,
    what: &str,
    pred: impl Fn(&ostiary::audit::AuditRecord) -> bool,
) -> ostiary::audit::AuditRecord {
    raw::wait_for_audit(proxy, what, |r| {
        r.kind == "stream" && r.session.as_deref() == Some(&*session.session_id) && pred(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_closed_at_teardown_and_its_bytes_are_counted() {
    let rig = Rig::start().await;
    let session = rig.session(serde_json::json!({"agent": "ws-agent"})).await;
    let other = rig.session(serde_json::json!({"agent": "bystander"})).await;
    let mut ws = rig.websocket(&session).await;
    let mut bystander = rig.websocket(&other).await;
    echo(&mut ws, 100_000).await;

    // The frames both ways are the session's: far more than the handshake's few hundred.
    let usage = rig.usage(&session).await;
    assert!(usage["bytes_sent"].as_u64().unwrap() >= 100_000, "{usage}");
    assert!(
        usage["bytes_received"].as_u64().unwrap() >= 100_000,
        "{usage}"
    );

    rig.delete(&session).await;
    assert_ws_closed(&mut ws, "after DELETE").await;
    wait_for_cut(
        &rig.proxy,
        &session,
        "the WebSocket's cut at teardown",
        |r| {
            r.reason
                .as_deref()
                .is_some_and(|t| t.starts_with("websocket closed at teardown"))
        },
    )
    .await;
    // Another session's WebSocket is not touched.
    echo(&mut bystander, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_an_expired_session_are_closed_at_expiry() {
    let rig = Rig::start().await;
    let session = rig
        .session(serde_json::json!({"agent": "short-lived", "ttl": "3s"}))
        .await;
    let mut ws = rig.websocket(&session).await;
    let mut relay = rig.relay(&session).await;
    let authority = rig.relayed_authority();
    let reply = relayed_get(&mut relay, &authority, "/echo").await;
    assert_eq!(reply.status, 200, "{reply}");
    // An intercepted keep-alive connection, idle after one request.
    let tunnel = intercepted(
        &rig.proxy,
        &session.token,
        rig.api.host(),
        rig.api.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut keep_alive = Wire::new(tunnel);
    keep_alive
        .send(
            format!(
                "GET /echo HTTP/1.1\r\nHost: {}:{}\r\n\r\n",
                rig.api.host(),
                rig.api.port()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(keep_alive.response().await.unwrap().status, 200);
    echo(&mut ws, 10).await;

    // Nothing more is sent: each stream must be ended by the proxy once the TTL is over.
    assert_ws_closed(&mut ws, "WebSocket after expiry").await;
    assert!(
        now() >= session.expires_at - 1,
        "closed before the session expired"
    );
    assert_closed(&mut relay, "relay after expiry").await;
    assert!(
        keep_alive.closed_within(IO_DEADLINE).await,
        "the intercepted keep-alive connection outlived its session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_relay_is_closed_at_teardown_and_its_bytes_are_counted() {
    let rig = Rig::start().await;
    let session = rig
        .session(serde_json::json!({"agent": "relay-agent"}))
        .await;
    let mut relay = rig.relay(&session).await;
    let authority = rig.relayed_authority();
    let reply = relayed_get(
        &mut relay,
        &authority,
        "/stream?chunks=10&size=10000&delay_ms=0",
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body.len(), 100_000);
    // Uninspected, yet counted: the TLS records both ways.
    let usage = rig.usage(&session).await;
    assert!(
        usage["bytes_received"].as_u64().unwrap() >= 100_000,
        "{usage}"
    );
    assert!(usage["bytes_sent"].as_u64().unwrap() > 0, "{usage}");

    rig.delete(&session).await;
    assert_closed(&mut relay, "relay after DELETE").await;
    wait_for_cut(&rig.proxy, &session, "the relay's cut at teardown", |r| {
        r.host.as_deref() == Some(TUNNEL_HOST)
            && r.decision == "cancel"
            && r.reason
                .as_deref()
                .is_some_and(|t| t.starts_with("tunnel closed at teardown"))
    })
    .await;
    // A relay opened with the token afterwards is refused at CONNECT.
    let (_, reply) = connect(rig.proxy.proxy_addr, &authority, &auth_line(&session.token)).await;
    assert_eq!(reply.status, 407, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_over_its_byte_budget_is_cut_at_the_budget() {
    let rig = Rig::start().await;
    const BUDGET: u64 = 40_000;
    let session = rig
        .session(serde_json::json!({"agent": "budgeted", "max_bytes_received": BUDGET}))
        .await;
    let mut relay = rig.relay(&session).await;
    let authority = rig.relayed_authority();
    let mut wire = Wire::new(&mut relay);
    wire.send(
        format!(
            "GET /stream?chunks=20&size=10000&delay_ms=0 HTTP/1.1\r\nHost: {authority}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // 200 kB asked for, 40 kB allowed: the answer never completes, the relay is cut.
    let answer = wire.response().await;
    assert!(
        answer.is_err(),
        "the whole answer came through: {:?}",
        answer.map(|r| r.body.len())
    );
    drop(wire);
    assert_closed(&mut relay, "relay over budget").await;
    let usage = rig.usage(&session).await;
    assert_eq!(
        usage["bytes_received"], BUDGET,
        "cut exactly at the budget: {usage}"
    );
    wait_for_cut(&rig.proxy, &session, "the relay's cut at its budget", |r| {
        r.decision == "deny"
            && r.error.as_deref() == Some("limit_exceeded")
            && r.reason
                .as_deref()
                .is_some_and(|t| t.contains("max_bytes_received"))
    })
    .await;
    // The session's next request is refused for the budget it spent in the relay.
    let reply = raw::absolute_get(
        &rig.proxy,
        &format!("http://api.example.test:{}/echo", rig.api.port()),
        &auth_line(&session.token),
    )
    .await;
    let body = raw::assert_ostiary_error(&reply, 429, "limit_exceeded");
    assert_eq!(body["limit"], "bytes_received", "{body}");

    // The same for what the agent sends over a WebSocket.
    let sender = rig
        .session(serde_json::json!({"agent": "ws-budgeted", "max_bytes_sent": 20_000}))
        .await;
    let mut ws = rig.websocket(&sender).await;
    echo(&mut ws, 1_000).await;
    let _ = ws.send(Message::binary(vec![b'x'; 50_000])).await;
    assert_ws_closed(&mut ws, "WebSocket over max_bytes_sent").await;
    let usage = rig.usage(&sender).await;
    assert_eq!(usage["bytes_sent"], 20_000, "{usage}");
    assert!(
        rig.api.seen_path("/ws").len() == 1,
        "one handshake reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intercepted_connections_are_closed_at_teardown_h1_and_h2() {
    let rig = Rig::start().await;
    let session = rig
        .session(serde_json::json!({"agent": "tunnel-agent"}))
        .await;
    let host = format!("{}:{}", rig.api.host(), rig.api.port());

    // h1 keep-alive, idle after one request.
    let tunnel = intercepted(
        &rig.proxy,
        &session.token,
        rig.api.host(),
        rig.api.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut keep_alive = Wire::new(tunnel);
    keep_alive
        .send(format!("GET /echo HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(keep_alive.response().await.unwrap().status, 200);

    // h2, idle after one request; its connection task ends when the proxy closes it.
    let tunnel = intercepted(
        &rig.proxy,
        &session.token,
        rig.api.host(),
        rig.api.port(),
        &[b"h2"],
    )
    .await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tunnel),
    )
    .await
    .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let reply = raw::send_h2(&mut sender, request("GET", &rig.api.url("/echo"), None))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");

    rig.delete(&session).await;
    assert!(
        keep_alive.closed_within(IO_DEADLINE).await,
        "the idle h1 keep-alive connection outlived its session"
    );
    let ended = tokio::time::timeout(IO_DEADLINE, conn).await;
    assert!(ended.is_ok(), "the idle h2 connection outlived its session");
    assert_eq!(rig.api.count("/echo"), 2, "nothing after the teardown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_inside_a_tunnel_is_refused_and_the_connection_closed() {
    let rig = Rig::start().await;
    let session = rig.session(serde_json::json!({"agent": "nested"})).await;
    let host = format!("{}:{}", rig.api.host(), rig.api.port());
    for (target, trailer) in [
        // To the tunnel's own host, to another, and with a request smuggled behind it that
        // a pass-through connection would carry uninspected.
        (host.clone(), String::new()),
        (format!("{TUNNEL_HOST}:{}", rig.relayed.port()), String::new()),
        (
            "10.0.0.1:443".to_owned(),
            format!("GET /echo HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"),
        ),
    ] {
        let tunnel = intercepted(&rig.proxy, &session.token, rig.api.host(), rig.api.port(), &[b"http/1.1"]).await;
        let mut wire = Wire::new(tunnel);
        wire.send(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n{trailer}").as_bytes())
            .await
            .unwrap();
        let reply = wire.response().await.expect("an answer to the CONNECT");
        let body = raw::assert_ostiary_error(&reply, 400, "bad_request");
        assert!(
            body["reason"].as_str().unwrap_or_default().contains("CONNECT inside a tunnel")
                || body["message"].as_str().unwrap_or_default().contains("CONNECT inside a tunnel"),
            "{body}"
        );
        assert_eq!(reply.header("connection"), Some("close"), "{reply}");
        assert!(
            wire.closed_within(IO_DEADLINE).await,
            "CONNECT {target}: the connection was left open after the refusal"
        );
    }
    assert_eq!(
        rig.api.count("/echo"),
        0,
        "nothing behind a refused CONNECT was forwarded"
    );
    assert_eq!(rig.relayed.connections(), 0);
    // Each refusal is on the record, under the session.
    let records = rig.proxy.audit().await;
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r.method.as_deref() == Some("CONNECT") && r.kind == "http")
        .collect();
    assert_eq!(refused.len(), 3, "{records:#?}");
    assert!(refused
        .iter()
        .all(|r| r.decision == "deny" && r.session.as_deref() == Some(&*session.session_id)));

    // A CONNECT over h2 inside the tunnel is refused too.
    let tunnel = intercepted(
        &rig.proxy,
        &session.token,
        rig.api.host(),
        rig.api.port(),
        &[b"h2"],
    )
    .await;
    let mut sender = raw::h2(tunnel).await;
    let req = http::Request::builder()
        .method("CONNECT")
        .uri(host.as_str())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    match raw::send_h2(&mut sender, req).await {
        Ok(reply) => assert_ne!(reply.status, 200, "{reply}"),
        Err(e) => eprintln!("the h2 CONNECT was reset: {e}"),
    }
    assert_eq!(rig.api.count("/echo"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_tunnel_leaves_the_proxy_serving_the_session_s_siblings() {
    // Teardown of one session's streams keeps the listener and other sessions' streams up.
    let rig = Rig::start().await;
    let ending = rig.session(serde_json::json!({"agent": "ending"})).await;
    let staying = rig.session(serde_json::json!({"agent": "staying"})).await;
    let mut ending_relay = rig.relay(&ending).await;
    let mut staying_relay = rig.relay(&staying).await;
    let authority = rig.relayed_authority();
    assert_eq!(
        relayed_get(&mut ending_relay, &authority, "/echo")
            .await
            .status,
        200
    );
    rig.delete(&ending).await;
    assert_closed(&mut ending_relay, "the ended session's relay").await;
    let reply = relayed_get(&mut staying_relay, &authority, "/echo").await;
    assert_eq!(reply.status, 200, "{reply}");
    staying_relay.shutdown().await.ok();
}
