//! Keep-alive HTTP/1 connections rest between requests (`proxy/src/hibernate.rs`): an idle
//! connection gives back hyper's buffers and state, counted by
//! `ostiary_proxy_connections_resting`, and serves its next request as if it never had —
//! intercepted or plain, a head that arrives in pieces, an answer that streams slower than
//! the rest period, a WebSocket upgrade. Resting keeps the connection's bounds: it is closed
//! after `header_read_timeout` idle, and at once when its session ends or the proxy stops.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{auth_line, intercepted, Wire, IO_DEADLINE};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message;

use crate::support::audit_trail::metric;

const HOST: &str = "api.example.test";

/// Connections at rest, as `/metrics` shows them.
async fn resting(proxy: &TestProxy) -> i64 {
    metric(proxy, "ostiary_proxy_connections_resting").await as i64
}

/// Poll until `n` connections are at rest.
async fn wait_resting(proxy: &TestProxy, n: i64) {
    let mut last = -1;
    for _ in 0..200 {
        last = resting(proxy).await;
        if last == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{n} connection(s) never rested: {last} at rest");
}

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    session: Session,
}

impl Rig {
    async fn start(extra_toml: &str) -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra_toml.into(),
            ..Default::default()
        })
        .await;
        let session = proxy.session("rester").await;
        Self {
            upstream,
            proxy,
            session,
        }
    }

    async fn tunnel(&self) -> Wire<TlsStream<TcpStream>> {
        let tls = intercepted(
            &self.proxy,
            &self.session.token,
            HOST,
            self.upstream.port(),
            &[b"http/1.1"],
        )
        .await;
        Wire::new(tls)
    }

    /// An intercepted connection that carried one request and is now at rest.
    async fn rested_tunnel(&self) -> Wire<TlsStream<TcpStream>> {
        let mut wire = self.tunnel().await;
        exchange(&mut wire, &self.get("/echo")).await;
        wait_resting(&self.proxy, 1).await;
        wire
    }

    fn get(&self, path: &str) -> String {
        format!(
            "GET {path} HTTP/1.1\r\nHost: {HOST}:{}\r\n\r\n",
            self.upstream.port()
        )
    }
}

/// One request on `wire`, answered 200 and kept alive.
async fn exchange<S>(wire: &mut Wire<S>, request: &str) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    wire.send(request.as_bytes()).await.expect("request sent");
    let reply = wire.response().await.expect("an answer");
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply
            .header("connection")
            .is_none_or(|v| !v.eq_ignore_ascii_case("close")),
        "the connection was not kept: {reply}"
    );
    String::from_utf8_lossy(&reply.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_intercepted_connection_rests_and_serves_its_next_request() {
    let rig = Rig::start("").await;
    let mut wire = rig.tunnel().await;
    assert!(exchange(&mut wire, &rig.get("/echo?n=1"))
        .await
        .contains("/echo?n=1"));
    wait_resting(&rig.proxy, 1).await;
    // Woken by the next request, which is served whole on the same connection.
    assert!(exchange(&mut wire, &rig.get("/echo?n=2"))
        .await
        .contains("/echo?n=2"));
    wait_resting(&rig.proxy, 1).await;
    assert!(exchange(&mut wire, &rig.get("/echo?n=3"))
        .await
        .contains("/echo?n=3"));
    assert_eq!(rig.upstream.count("/echo"), 3);
    drop(wire);
    wait_resting(&rig.proxy, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_plain_proxy_connection_rests_and_serves_its_next_request() {
    let upstream = Upstream::builder().tls(false).start().await;
    let proxy = TestProxy::start(ProxySpec {
        ports: vec![upstream.port()],
        ..Default::default()
    })
    .await;
    let session = proxy.session("plain-rester").await;
    let mut wire = Wire::new(TcpStream::connect(proxy.proxy_addr).await.unwrap());
    let get = |n: u32| {
        format!(
            "GET {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{}\r\n",
            upstream.url(&format!("/echo?n={n}")),
            upstream.port(),
            auth_line(&session.token)
        )
    };
    assert!(exchange(&mut wire, &get(1)).await.contains("/echo?n=1"));
    wait_resting(&proxy, 1).await;
    assert!(exchange(&mut wire, &get(2)).await.contains("/echo?n=2"));
    assert_eq!(upstream.count("/echo"), 2);
}

/// A head that arrives in pieces, slower than the rest period: the connection does not rest
/// while the wire guard holds part of a head, and the request is served whole; and the
/// first piece of a head is what wakes a connection at rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_in_pieces_is_served_whole_across_rests() {
    let rig = Rig::start("").await;
    let mut wire = rig.tunnel().await;
    in_pieces(&rig, &mut wire, "/echo?pieces=1", false).await;
    wait_resting(&rig.proxy, 1).await;
    in_pieces(&rig, &mut wire, "/echo?pieces=2", true).await;
    assert_eq!(rig.upstream.count("/echo"), 2);
}

/// GET `path` on `wire` in two pieces, 800 ms apart (the first waking the connection when
/// `wakes`), and check it never rests while it holds the first.
async fn in_pieces(rig: &Rig, wire: &mut Wire<TlsStream<TcpStream>>, path: &str, wakes: bool) {
    let head = rig.get(path);
    let (first, rest) = head.split_at(9);
    wire.send(first.as_bytes()).await.unwrap();
    if wakes {
        wait_resting(&rig.proxy, 0).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(resting(&rig.proxy).await, 0, "rested with half a head held");
    wire.send(rest.as_bytes()).await.unwrap();
    let reply = wire.response().await.expect("an answer");
    assert_eq!(reply.status, 200, "{reply}");
    assert!(String::from_utf8_lossy(&reply.body).contains(path));
}

/// An answer whose body pauses for longer than the rest period is in flight, not idle: it
/// arrives whole, and the connection is kept for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_slower_than_the_rest_period_is_not_cut() {
    let rig = Rig::start("").await;
    let mut wire = rig.tunnel().await;
    let body = exchange(&mut wire, &rig.get("/stream?chunks=3&size=16&delay_ms=700")).await;
    let want: String = ["a", "b", "c"].iter().map(|c| c.repeat(16)).collect();
    assert_eq!(body, want);
    assert!(exchange(&mut wire, &rig.get("/echo?after=stream"))
        .await
        .contains("after=stream"));
}

/// Two pipelined requests, the first answered slower than the rest period (so the connection
/// is asked to rest while both are held): both are answered, in order, before it rests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_before_the_connection_rests() {
    let rig = Rig::start("").await;
    let mut wire = rig.rested_tunnel().await;
    let pipelined = [
        rig.get("/stream?chunks=2&size=8&delay_ms=600"),
        rig.get("/echo?second=1"),
    ]
    .concat();
    wire.send(pipelined.as_bytes()).await.unwrap();
    let first = wire.response().await.expect("the first answer");
    assert_eq!(first.status, 200, "{first}");
    assert_eq!(
        String::from_utf8_lossy(&first.body),
        "a".repeat(8) + &"b".repeat(8)
    );
    let second = wire.response().await.expect("the second answer");
    assert_eq!(second.status, 200, "{second}");
    assert!(String::from_utf8_lossy(&second.body).contains("/echo?second=1"));
    wait_resting(&rig.proxy, 1).await;
    assert!(exchange(&mut wire, &rig.get("/echo?third=1"))
        .await
        .contains("third=1"));
}

/// A WebSocket handshake on a connection that rested is upgraded as on a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_after_a_rest_is_upgraded() {
    let rig = Rig::start("").await;
    let wire = rig.rested_tunnel().await;
    let url = format!("wss://{HOST}:{}/ws", rig.upstream.port());
    let (mut ws, response) = tokio::time::timeout(
        IO_DEADLINE,
        tokio_tungstenite::client_async(url, wire.into_inner()),
    )
    .await
    .expect("handshake in time")
    .expect("a WebSocket through a rested connection");
    assert_eq!(response.status(), 101);
    ws.send(Message::text("after a rest")).await.unwrap();
    let echoed = tokio::time::timeout(IO_DEADLINE, ws.next())
        .await
        .expect("an echo in time")
        .expect("an echo")
        .expect("a frame");
    assert_eq!(echoed.into_text().unwrap().as_str(), "after a rest");
    // Upgraded, the connection is a splice: it never rests again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(resting(&rig.proxy).await, 0);
}

/// At rest, a connection is still closed after `header_read_timeout` idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_rest_is_closed_after_the_idle_bound() {
    let rig = Rig::start("[proxy]\nheader_read_timeout = \"1500ms\"\n").await;
    let mut wire = rig.rested_tunnel().await;
    let started = tokio::time::Instant::now();
    assert!(
        wire.closed_within(Duration::from_secs(5)).await,
        "still open at rest"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    wait_resting(&rig.proxy, 0).await;
}

/// At rest, a connection is closed when its session ends, as an idle one was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_rest_is_closed_when_its_session_ends() {
    let rig = Rig::start("[proxy]\nheader_read_timeout = \"60s\"\n").await;
    let mut wire = rig.rested_tunnel().await;
    rig.proxy
        .control()
        .delete_session(&rig.session.session_id)
        .await
        .expect("session deleted");
    assert!(
        wire.closed_within(IO_DEADLINE).await,
        "still open after its session ended"
    );
    wait_resting(&rig.proxy, 0).await;
}

/// At rest, a connection is closed when the proxy stops, without waiting out the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_rest_is_closed_when_the_proxy_stops() {
    let rig = Rig::start("[proxy]\nheader_read_timeout = \"60s\"\n").await;
    let mut wire = rig.rested_tunnel().await;
    let Rig { proxy, .. } = rig;
    let stopped = tokio::spawn(proxy.stop());
    assert!(
        wire.closed_within(IO_DEADLINE).await,
        "still open after the proxy stopped"
    );
    tokio::time::timeout(IO_DEADLINE, stopped)
        .await
        .expect("the proxy stopped in time")
        .unwrap();
}
