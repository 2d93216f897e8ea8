//! What an agent's connection may hold open without using it, and what it may send ahead of
//! a protocol switch (THREATS.md, "Slowloris (headers dribbled), idle tunnels … → bounded
//! memory and CPU, connections closed" and "Bytes after an Upgrade request → held until
//! 101"):
//!
//! - a CONNECT that is accepted and then never starts TLS holds a task and a socket for as
//!   long as the agent likes unless `proxy.tls_handshake_timeout` ends it: intercepted and
//!   uninspected (`egress.tunnel`) tunnels alike are closed about that long after the `200`,
//!   and the refusal is on the record (kind `tls`, resp. `tunnel`);
//! - an uninspected relay, whose bytes the proxy cannot read, is closed once both ways were
//!   quiet for `proxy.tunnel_idle_timeout`, while one that keeps exchanging is left alone.
//!   The close is the proxy's, and on the record: one `stream` record, `cancel`, saying
//!   how long both ways were quiet;
//! - bytes pipelined right behind a WebSocket handshake, in the same write, are neither
//!   dropped nor forwarded with the handshake: the upstream hears nothing after the request
//!   head until it has answered `101`, and then the agent's frame, which it echoes back.
//!
//! The timeouts are a second or so, so that each test takes seconds; what is asserted (still
//! open at half the timeout, closed within four or five times it) leaves room for a loaded
//! machine. The upstreams are on 127.0.0.1.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{
    self, auth_line, connect, intercepted, tls, wait_for_audit, Wire, IO_DEADLINE,
};
use ostiary_e2e::upstream::{tls_acceptor, Upstream, DEFAULT_NAMES};
use ostiary_sdk::Session;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const API_HOST: &str = "api.example.test";
const TUNNEL_HOST: &str = "tunnel.test";

/// The WebSocket handshake on the intercepted host, and the uninspected relay (which needs
/// a `connect` permit of its own); nothing else is decided here.
const POLICIES: &str = r#"
@id("allow-ws-handshake")
permit (principal, action == Ostiary::Action::"http", resource)
when { context.method == "GET" && context.path == "/ws" };

@id("tunnel-ok")
permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"tunnel.test");
"#;

/// A proxy intercepting `api.example.test` on `api_port` and relaying `tunnel.test` on
/// `relay_port` uninspected, with `[proxy]` lines `limits`; and a session.
async fn proxy(
    api_port: u16,
    api_ca: String,
    relay_port: u16,
    limits: &str,
) -> (TestProxy, Session) {
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICIES.into(),
        names: vec![API_HOST.into(), TUNNEL_HOST.into()],
        ports: vec![api_port, relay_port],
        upstream_ca_pem: Some(api_ca),
        tunnel: vec![TUNNEL_HOST.into()],
        extra_toml: format!("[proxy]\n{limits}\n"),
        ..Default::default()
    })
    .await;
    let session = proxy.session("idle-agent").await;
    (proxy, session)
}

// ---------------------------------------------------------------------------------------
// A CONNECT that never starts TLS
// ---------------------------------------------------------------------------------------

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// CONNECT to `authority`, accepted, then silence: how long until the proxy closed the
/// connection. Panics if it closed at half the handshake timeout or was still open at five
/// times it.
async fn silent_after_connect(proxy: &TestProxy, session: &Session, authority: &str) -> Duration {
    let (mut wire, reply) = connect(proxy.proxy_addr, authority, &auth_line(&session.token)).await;
    assert_eq!(reply.status, 200, "CONNECT {authority}:\n{reply}");
    // About when the proxy's clock started: it starts as the `200` goes out.
    let accepted = Instant::now();
    assert!(
        !wire.closed_within(HANDSHAKE_TIMEOUT / 2).await,
        "CONNECT {authority}: closed after {:?}, well before the handshake timeout \
         ({HANDSHAKE_TIMEOUT:?}): something else ended it",
        accepted.elapsed()
    );
    assert!(
        wire.closed_within((HANDSHAKE_TIMEOUT * 5).saturating_sub(accepted.elapsed()))
            .await,
        "CONNECT {authority}: still open {:?} after the 200 with no ClientHello \
         (handshake timeout {HANDSHAKE_TIMEOUT:?})",
        accepted.elapsed()
    );
    accepted.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_never_starts_tls_is_closed_after_the_handshake_timeout() {
    let api = Upstream::builder().start().await;
    let relayed = Upstream::builder().names(&[TUNNEL_HOST]).start().await;
    let (proxy, session) = proxy(
        api.port(),
        api.ca_pem(),
        relayed.port(),
        &format!(
            "tls_handshake_timeout = \"{}ms\"",
            HANDSHAKE_TIMEOUT.as_millis()
        ),
    )
    .await;
    let api_authority = format!("{API_HOST}:{}", api.port());
    let relay_authority = format!("{TUNNEL_HOST}:{}", relayed.port());
    // Side by side: each is bounded by its own clock, not by the other's.
    let (intercepted_after, relayed_after) = tokio::join!(
        silent_after_connect(&proxy, &session, &api_authority),
        silent_after_connect(&proxy, &session, &relay_authority),
    );
    eprintln!("closed after {intercepted_after:?} (intercepted), {relayed_after:?} (relayed)");

    for (kind, host) in [("tls", API_HOST), ("tunnel", TUNNEL_HOST)] {
        let record = wait_for_audit(&proxy, &format!("the silent {kind} CONNECT"), |r| {
            r.kind == kind && r.decision == "deny"
        })
        .await;
        assert!(
            record
                .reason
                .as_deref()
                .is_some_and(|t| t.contains("no ClientHello in time")),
            "{record:#?}"
        );
        assert_eq!(record.error.as_deref(), Some("bad_request"), "{record:#?}");
        assert_eq!(record.host.as_deref(), Some(host), "{record:#?}");
        assert_eq!(
            record.session.as_deref(),
            Some(&*session.session_id),
            "{record:#?}"
        );
    }
    // A relay dials only once a ClientHello named its host.
    assert_eq!(relayed.connections(), 0);
    assert_eq!(api.connections(), 0);
}

// ---------------------------------------------------------------------------------------
// An idle uninspected tunnel
// ---------------------------------------------------------------------------------------

const IDLE_TIMEOUT: Duration = Duration::from_millis(1500);

/// An uninspected relay to `tunnel.test`, TLS end to end with the upstream itself.
async fn relay(proxy: &TestProxy, session: &Session, upstream: &Upstream) -> TlsStream<TcpStream> {
    let authority = format!("{TUNNEL_HOST}:{}", upstream.port());
    let (wire, reply) = connect(proxy.proxy_addr, &authority, &auth_line(&session.token)).await;
    assert_eq!(reply.status, 200, "CONNECT {authority}:\n{reply}");
    tls(
        wire.into_inner(),
        upstream.ca().client_config(&[b"http/1.1"]),
        TUNNEL_HOST,
    )
    .await
    .expect("TLS with the relayed upstream")
}

/// One keep-alive `GET /echo` over a relay.
async fn relayed_echo(stream: &mut TlsStream<TcpStream>, port: u16) -> raw::Reply {
    let mut wire = Wire::new(stream);
    wire.send(format!("GET /echo HTTP/1.1\r\nHost: {TUNNEL_HOST}:{port}\r\n\r\n").as_bytes())
        .await
        .expect("a request over the relay");
    wire.response().await.expect("a response over the relay")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_uninspected_tunnel_is_closed_after_its_idle_timeout() {
    let api = Upstream::builder().start().await;
    let relayed = Upstream::builder().names(&[TUNNEL_HOST]).start().await;
    let port = relayed.port();
    let (proxy, session) = proxy(
        api.port(),
        api.ca_pem(),
        port,
        &format!("tunnel_idle_timeout = \"{}ms\"", IDLE_TIMEOUT.as_millis()),
    )
    .await;
    let mut idle = relay(&proxy, &session, &relayed).await;
    let mut busy = relay(&proxy, &session, &relayed).await;
    assert_eq!(relayed_echo(&mut idle, port).await.status, 200);
    assert_eq!(relayed_echo(&mut busy, port).await.status, 200);
    let quiet_since = Instant::now();

    let idle_closes = async {
        let mut wire = Wire::new(&mut idle);
        assert!(
            !wire.closed_within(IDLE_TIMEOUT / 2).await,
            "the relay was closed {:?} after its last byte, well within its idle timeout \
             ({IDLE_TIMEOUT:?})",
            quiet_since.elapsed()
        );
        // Each way times out on its own and checks the other's last byte: the relay closes
        // between one and two idle timeouts after the last byte either way.
        assert!(
            wire.closed_within((IDLE_TIMEOUT * 4).saturating_sub(quiet_since.elapsed()))
                .await,
            "the relay is still open {:?} after its last byte (idle timeout {IDLE_TIMEOUT:?})",
            quiet_since.elapsed()
        );
        quiet_since.elapsed()
    };
    // A byte exchange every sixth of the timeout, for three timeouts: longer than any idle
    // relay lives, so only its traffic can be keeping it open.
    let busy_stays = async {
        let mut exchanges = 0;
        while quiet_since.elapsed() < IDLE_TIMEOUT * 3 {
            tokio::time::sleep(IDLE_TIMEOUT / 6).await;
            let reply = relayed_echo(&mut busy, port).await;
            assert_eq!(
                reply.status,
                200,
                "exchange {exchanges} after {:?}",
                quiet_since.elapsed()
            );
            exchanges += 1;
        }
        exchanges
    };
    let (closed_after, exchanges) = tokio::join!(idle_closes, busy_stays);
    eprintln!(
        "the idle relay closed {closed_after:?} after its last byte; the busy one made \
         {exchanges} more exchanges"
    );
    // One upstream connection per relay, and every exchange of the busy one reached it.
    assert_eq!(relayed.connections(), 2);
    assert_eq!(relayed.count("/echo"), 2 + exchanges);
    assert_eq!(relayed_echo(&mut busy, port).await.status, 200);
    // The idle close, and only it, is a `stream` record.
    let record = wait_for_audit(&proxy, "the idle close", |r| r.kind == "stream").await;
    assert_eq!(record.decision, "cancel", "{record:#?}");
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|why| why.contains("quiet for")),
        "{record:#?}"
    );
    assert_eq!(record.host.as_deref(), Some(TUNNEL_HOST), "{record:#?}");
    let streams = proxy.audit().await;
    let streams: Vec<_> = streams.iter().filter(|r| r.kind == "stream").collect();
    assert_eq!(streams.len(), 1, "{streams:#?}");
}

// ---------------------------------------------------------------------------------------
// Bytes behind a WebSocket handshake
// ---------------------------------------------------------------------------------------

/// The agent's `Sec-WebSocket-Key` (RFC 6455 §1.3's example).
const AGENT_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The text the agent pipelines behind its handshake.
const PAYLOAD: &str = "pipelined behind the handshake";

/// How long the upstream listens before it answers `101`: bytes the proxy forwarded ahead
/// of the switch would arrive within it.
const BEFORE_101: Duration = Duration::from_millis(300);

/// What the hand-spoken WebSocket upstream heard on its one connection.
#[derive(Debug)]
struct Heard {
    /// The handshake's request head.
    head: String,
    /// Bytes that came after the head and before the upstream wrote its `101`.
    early: Vec<u8>,
    /// The message it echoed.
    echoed: Message,
}

/// The value of header `name` in a head.
fn header_in<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, value) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then_some(value.trim())
    })
}

/// Read a response head and not one byte more (what follows it is another protocol's).
async fn head_alone<S: AsyncRead + Unpin>(io: &mut S) -> String {
    let mut head = Vec::new();
    tokio::time::timeout(IO_DEADLINE, async {
        while !head.ends_with(b"\r\n\r\n") {
            head.push(io.read_u8().await.expect("a response head"));
        }
    })
    .await
    .expect("a response head within the deadline");
    String::from_utf8(head).expect("a UTF-8 head")
}

/// An HTTPS upstream on 127.0.0.1 that completes one WebSocket handshake by hand, noting
/// whatever arrives before its `101`, then echoes one message. A hyper server would not
/// tell: bytes behind a request head wait in its buffer and reach the upgrade all the same.
async fn patient_echo(ca: &TestCa) -> (u16, tokio::task::JoinHandle<Heard>) {
    let acceptor = tls_acceptor(ca, DEFAULT_NAMES, &[b"http/1.1"]).expect("an acceptor");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("the proxy connects");
        let mut tls = acceptor.accept(tcp).await.expect("TLS with the proxy");
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = tls.read(&mut chunk).await.expect("the request head");
            assert!(n > 0, "closed before a whole head");
            bytes.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let mut early = bytes[end..].to_vec();
        if let Ok(Ok(n)) = tokio::time::timeout(BEFORE_101, tls.read(&mut chunk)).await {
            early.extend_from_slice(&chunk[..n]);
        }
        let key = header_in(&head, "sec-websocket-key").expect("a Sec-WebSocket-Key");
        let accept = derive_accept_key(key.as_bytes());
        tls.write_all(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("the 101 written");
        tls.flush().await.expect("the 101 flushed");
        // Early bytes are the agent's frame too: echoed, so the agent's side of the test
        // passes and the failure names what the upstream saw.
        let mut ws =
            WebSocketStream::from_partially_read(tls, early.clone(), Role::Server, None).await;
        let echoed = tokio::time::timeout(IO_DEADLINE, ws.next())
            .await
            .expect("a message within the deadline")
            .expect("a message")
            .expect("a valid frame");
        ws.send(echoed.clone()).await.expect("the echo sent");
        Heard {
            head,
            early,
            echoed,
        }
    });
    (port, task)
}

/// A masked, final text frame (RFC 6455 §5.2, §5.3: every client frame is masked).
fn masked_text(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126, "a one-byte length");
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_behind_a_genuine_websocket_handshake_arrive_after_the_101() {
    let ca = TestCa::new();
    let (port, upstream) = patient_echo(&ca).await;
    let relayed = Upstream::builder().names(&[TUNNEL_HOST]).start().await;
    let (proxy, session) = proxy(port, ca.ca_pem(), relayed.port(), "").await;
    let mut tunnel = intercepted(&proxy, &session.token, API_HOST, port, &[b"http/1.1"]).await;

    let mut bytes = format!(
        "GET /ws HTTP/1.1\r\nHost: {API_HOST}:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: {AGENT_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes();
    bytes.extend(masked_text(PAYLOAD.as_bytes()));
    // One write: the frame is on its way before any answer to the handshake could be.
    tunnel.write_all(&bytes).await.expect("handshake sent");
    tunnel.flush().await.expect("handshake flushed");

    let head = head_alone(&mut tunnel).await;
    assert!(
        head.starts_with("HTTP/1.1 101 "),
        "the handshake was not switched:\n{head}"
    );
    assert_eq!(
        header_in(&head, "sec-websocket-accept"),
        Some(derive_accept_key(AGENT_KEY.as_bytes()).as_str()),
        "{head}"
    );
    // A client-role stream refuses a masked frame from the server (RFC 6455 §5.1).
    let mut ws = WebSocketStream::from_raw_socket(tunnel, Role::Client, None).await;
    let echo = tokio::time::timeout(IO_DEADLINE, ws.next())
        .await
        .expect("the echo of the pipelined frame within the deadline: it was dropped")
        .expect("an echo")
        .expect("an unmasked, valid frame");
    assert_eq!(echo, Message::text(PAYLOAD));

    let heard = tokio::time::timeout(IO_DEADLINE, upstream)
        .await
        .expect("the upstream finished")
        .expect("the upstream's task");
    assert!(heard.head.starts_with("GET /ws "), "{}", heard.head);
    assert!(
        heard.early.is_empty(),
        "the upstream received {} bytes before it answered 101: {:?}",
        heard.early.len(),
        heard.early
    );
    assert_eq!(heard.echoed, Message::text(PAYLOAD));

    let records = proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 1, "one decision, the handshake's: {records:#?}");
    assert_eq!(http[0].decision, "allow", "{:#?}", http[0]);
    assert_eq!(http[0].status, Some(101), "{:#?}", http[0]);
    assert_eq!(http[0].path.as_deref(), Some("/ws"), "{:#?}", http[0]);
}
