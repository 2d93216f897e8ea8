//! A `101 Switching Protocols` is spliced only after a genuine WebSocket handshake
//! (proxy/src/pipeline/upgrade.rs). Found by attacking this proxy: any upstream `101` used to
//! splice the agent's connection to the upstream's raw bytes, so an upstream that lets its
//! client pick the status (httpbin's `/status/101`) turned an allowed GET into a pipe that
//! carried the agent's next raw `DELETE` past the policy forbidding it, with only the GET on
//! the record.
//!
//! - a bare `101`, or one whose `Sec-WebSocket-Accept` is not the accept of the key the
//!   proxy sent (the accept of the agent's own key included: an upstream that echoes headers
//!   the agent chose could carry it), is a 502 `upstream_error` on the record; nothing is
//!   spliced, both connections are closed, and no byte written after it reaches the upstream;
//! - a request asking for a WebSocket without being a whole handshake (no usable
//!   `Sec-WebSocket-Key`, another `Sec-WebSocket-Version`) is a 400 before anything is sent;
//! - a genuine handshake still switches, the agent's client given the accept of its own key.
//!
//! The hostile upstream here speaks HTTP/1.1 by hand on 127.0.0.1 and keeps every byte it
//! receives, so a test can say what reached it.

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{assert_refused, intercepted, Reply, Wire, IO_DEADLINE};
use ostiary_e2e::upstream::{tls_acceptor, Upstream, DEFAULT_NAMES};
use ostiary_sdk::Session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const HOST: &str = "api.example.test";

/// The agent's `Sec-WebSocket-Key` (RFC 6455 §1.3's example).
const AGENT_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// GETs are allowed; DELETE is forbidden — the request a splice would smuggle past.
const POLICY: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("allow-connect")
permit (principal, action == Ostiary::Action::"connect", resource);
@id("forbid-delete")
forbid (principal, action == Ostiary::Action::"http", resource)
when { context.method == "DELETE" };
"#;

/// What the hand-spoken upstream heard, over all its connections.
#[derive(Debug, Clone, Default)]
struct Heard {
    /// Every byte received, in order of arrival.
    bytes: Vec<u8>,
    connections: usize,
    /// Connections that ended (the peer closed, or the connection failed).
    ended: usize,
}

impl Heard {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn heard_delete(&self) -> bool {
        self.bytes.windows(7).any(|w| w == b"DELETE ")
    }
}

/// An HTTPS upstream on 127.0.0.1 that speaks HTTP/1.1 by hand, as a careless or hostile
/// one would: each connection's first request head is answered with `answer(head)`, written
/// as it is, and whatever arrives after is read and kept until the peer closes.
struct Switcher {
    port: u16,
    ca: TestCa,
    heard: watch::Receiver<Heard>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Switcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Switcher {
    async fn start(answer: fn(&str) -> String) -> Self {
        let ca = TestCa::new();
        let acceptor = tls_acceptor(&ca, DEFAULT_NAMES, &[b"http/1.1"]).expect("an acceptor");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, heard) = watch::channel(Heard::default());
        let tx = Arc::new(tx);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tx.send_modify(|h| h.connections += 1);
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut head = Vec::new();
                        let mut answered = false;
                        let mut chunk = [0u8; 4096];
                        loop {
                            let n = match tls.read(&mut chunk).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            tx.send_modify(|h| h.bytes.extend_from_slice(&chunk[..n]));
                            if answered {
                                continue;
                            }
                            head.extend_from_slice(&chunk[..n]);
                            if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                                answered = true;
                                let reply = answer(&String::from_utf8_lossy(&head[..end]));
                                if tls.write_all(reply.as_bytes()).await.is_err()
                                    || tls.flush().await.is_err()
                                {
                                    break;
                                }
                            }
                        }
                    }
                    tx.send_modify(|h| h.ended += 1);
                });
            }
        });
        Self {
            port,
            ca,
            heard,
            task,
        }
    }

    /// Once `connections` connections came and all of them ended — or as soon as a DELETE
    /// arrived: what the upstream heard. Panics when a connection is still open after the
    /// deadline (the proxy kept it).
    async fn settled(&self, connections: usize) -> Heard {
        let mut heard = self.heard.clone();
        let settled = tokio::time::timeout(
            IO_DEADLINE,
            heard.wait_for(|h| {
                h.heard_delete() || (h.connections >= connections && h.ended == h.connections)
            }),
        )
        .await;
        let now = self.heard.borrow().clone();
        assert!(
            settled.is_ok(),
            "the upstream's connection is still open {IO_DEADLINE:?} after the 101: {now:?}\n{}",
            now.text()
        );
        now
    }
}

/// A 101 head with `headers` (each line ending in CRLF).
fn switching(headers: &str) -> String {
    format!("HTTP/1.1 101 Switching Protocols\r\n{headers}\r\n")
}

/// The `Sec-WebSocket-Key` a request head carries.
fn key_in(head: &str) -> &str {
    head.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key")
                .then_some(value.trim())
        })
        .unwrap_or_default()
}

/// A hostile upstream's answers, chosen by the request path.
fn hostile(head: &str) -> String {
    let path = head.split(' ').nth(1).unwrap_or_default();
    match path {
        // httpbin's `/status/101`: the status the client asked for, nothing else.
        "/status/101" => switching(""),
        // What an upstream that echoes headers the agent chose answers: the accept of the
        // agent's own key.
        "/echoed-accept" => switching(&format!(
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
            derive_accept_key(AGENT_KEY.as_bytes())
        )),
        // The accept of another key altogether.
        "/other-accept" => switching(&format!(
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
            derive_accept_key(b"x3JJHMbDL1EzLkh9GBhXDw==")
        )),
        // The right accept, without `Upgrade: websocket` / `upgrade` in `Connection`.
        "/no-upgrade" => switching(&format!(
            "Connection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
            derive_accept_key(key_in(head).as_bytes())
        )),
        "/no-connection" => switching(&format!(
            "Upgrade: websocket\r\nSec-WebSocket-Accept: {}\r\n",
            derive_accept_key(key_in(head).as_bytes())
        )),
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned(),
    }
}

struct Rig {
    proxy: TestProxy,
    session: Session,
    port: u16,
}

impl Rig {
    async fn start(port: u16, ca_pem: String) -> Self {
        let proxy = TestProxy::start(ProxySpec {
            policies: POLICY.into(),
            ports: vec![port],
            upstream_ca_pem: Some(ca_pem),
            ..Default::default()
        })
        .await;
        let session = proxy.session("ws-agent").await;
        Self {
            proxy,
            session,
            port,
        }
    }

    async fn tunnel(&self) -> Wire<TlsStream<TcpStream>> {
        let tls = intercepted(
            &self.proxy,
            &self.session.token,
            HOST,
            self.port,
            &[b"http/1.1"],
        )
        .await;
        Wire::new(tls)
    }

    /// A WebSocket handshake for `path` with `headers` (each line ending in CRLF).
    fn handshake(&self, path: &str, headers: &str) -> String {
        format!(
            "GET {path} HTTP/1.1\r\nHost: {HOST}:{}\r\n{headers}\r\n",
            self.port
        )
    }

    /// The request a policy forbids, written raw as if the connection were the upstream's.
    fn delete(&self) -> String {
        format!(
            "DELETE /v1/items/42 HTTP/1.1\r\nHost: {HOST}:{}\r\nContent-Length: 0\r\n\r\n",
            self.port
        )
    }
}

/// Every header line of a whole handshake with the agent's key.
fn whole() -> String {
    format!(
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {AGENT_KEY}\r\n\
         Sec-WebSocket-Version: 13\r\n"
    )
}

/// The refusal of a 101 that completed no handshake: a 502 on the record, the agent's
/// connection closed.
async fn assert_not_switched(rig: &Rig, wire: &mut Wire<TlsStream<TcpStream>>, reply: &Reply) {
    let (body, record) = assert_refused(&rig.proxy, reply, 502, "upstream_error").await;
    let reason = body["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("switched protocols without completing the WebSocket handshake"),
        "{body}"
    );
    assert!(
        !reason.contains(AGENT_KEY),
        "the reason quotes the key: {body}"
    );
    assert_eq!(record.method.as_deref(), Some("GET"), "{record:#?}");
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("without completing the WebSocket handshake")),
        "{record:#?}"
    );
    assert_eq!(reply.header("connection"), Some("close"), "{reply}");
    assert!(
        wire.closed_within(IO_DEADLINE).await,
        "the agent's connection was left open after the refused 101"
    );
}

/// Nothing but handshakes is on the record: no DELETE was decided, let alone allowed.
async fn assert_no_delete_recorded(proxy: &TestProxy) {
    let records = proxy.audit().await;
    assert!(
        records
            .iter()
            .all(|r| r.method.as_deref() != Some("DELETE")),
        "{records:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_101_is_a_502_and_nothing_written_after_it_reaches_the_upstream() {
    let switcher = Switcher::start(hostile).await;
    let rig = Rig::start(switcher.port, switcher.ca.ca_pem()).await;
    // The DELETE written once the 101 would have come, and pipelined behind the handshake
    // in the same write (hyper holds it in its buffer, which an upgrade hands on).
    for (n, pipelined) in [(1, false), (2, true)] {
        let mut wire = rig.tunnel().await;
        let mut bytes = rig.handshake("/status/101", &whole());
        if pipelined {
            bytes.push_str(&rig.delete());
        }
        wire.send(bytes.as_bytes()).await.expect("handshake sent");
        let reply = wire.response().await.expect("an answer to the handshake");
        // The attack: raw bytes, as if the connection were now the upstream's. The proxy may
        // have closed it already, so a failed write is fine.
        let _ = wire.send(rig.delete().as_bytes()).await;
        let heard = switcher.settled(n).await;
        assert!(
            !heard.heard_delete(),
            "the upstream received a DELETE the policy forbids (pipelined: {pipelined}):\n{}",
            heard.text()
        );
        assert_eq!(
            heard.text().matches("GET /status/101 ").count(),
            n,
            "{}",
            heard.text()
        );
        assert_not_switched(&rig, &mut wire, &reply).await;
    }
    assert_no_delete_recorded(&rig.proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_without_the_accept_of_the_proxys_key_is_a_502() {
    let switcher = Switcher::start(hostile).await;
    let rig = Rig::start(switcher.port, switcher.ca.ca_pem()).await;
    let paths = [
        "/echoed-accept",
        "/other-accept",
        "/no-upgrade",
        "/no-connection",
    ];
    for (n, path) in paths.into_iter().enumerate() {
        let mut wire = rig.tunnel().await;
        wire.send(rig.handshake(path, &whole()).as_bytes())
            .await
            .expect("handshake sent");
        let reply = wire.response().await.expect("an answer to the handshake");
        let _ = wire.send(rig.delete().as_bytes()).await;
        let heard = switcher.settled(n + 1).await;
        assert!(
            !heard.heard_delete(),
            "{path}: the upstream received a DELETE the policy forbids:\n{}",
            heard.text()
        );
        assert_not_switched(&rig, &mut wire, &reply).await;
    }
    // The upstream never saw the agent's key: the one it was sent is the proxy's own.
    let heard = switcher.heard.borrow().clone();
    assert!(!heard.text().contains(AGENT_KEY), "{}", heard.text());
    assert_eq!(
        heard
            .text()
            .to_ascii_lowercase()
            .matches("sec-websocket-key: ")
            .count(),
        paths.len(),
        "{}",
        heard.text()
    );
    assert_no_delete_recorded(&rig.proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_to_a_request_that_asked_for_no_websocket_is_a_502() {
    let switcher = Switcher::start(hostile).await;
    let rig = Rig::start(switcher.port, switcher.ca.ca_pem()).await;
    let mut wire = rig.tunnel().await;
    wire.send(rig.handshake("/status/101", "").as_bytes())
        .await
        .expect("request sent");
    let reply = wire.response().await.expect("an answer");
    let (body, _) = assert_refused(&rig.proxy, &reply, 502, "upstream_error").await;
    assert!(
        body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("without completing the WebSocket handshake")),
        "{body}"
    );
    // The connection was never switched: what follows is a request, and decided as one.
    wire.send(rig.delete().as_bytes()).await.expect("sent");
    let denied = wire.response().await.expect("an answer to the DELETE");
    assert_refused(&rig.proxy, &denied, 403, "denied").await;
    let heard = switcher.settled(1).await;
    assert!(!heard.heard_delete(), "{}", heard.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_request_without_a_usable_key_is_refused_before_anything_is_sent() {
    let upstream = Upstream::builder().start().await;
    let rig = Rig::start(upstream.port(), upstream.ca_pem()).await;
    let upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\n";
    for (headers, reason) in [
        (
            format!("{upgrade}Sec-WebSocket-Version: 13\r\n"),
            "Sec-WebSocket-Key",
        ),
        (
            format!("{upgrade}Sec-WebSocket-Key: not-a-nonce\r\nSec-WebSocket-Version: 13\r\n"),
            "Sec-WebSocket-Key",
        ),
        (
            format!("{upgrade}Sec-WebSocket-Key: {AGENT_KEY}\r\nSec-WebSocket-Version: 8\r\n"),
            "Sec-WebSocket-Version: 13",
        ),
    ] {
        let mut wire = rig.tunnel().await;
        // With a forbidden request behind it that a switched connection would carry raw.
        let bytes = rig.handshake("/ws", &headers) + &rig.delete();
        wire.send(bytes.as_bytes()).await.expect("request sent");
        let reply = wire.response().await.expect("an answer");
        let (body, record) = assert_refused(&rig.proxy, &reply, 400, "bad_request").await;
        assert!(
            body["reason"]
                .as_str()
                .is_some_and(|r| r.contains("WebSocket handshake") && r.contains(reason)),
            "{body}"
        );
        assert_eq!(record.path.as_deref(), Some("/ws"), "{record:#?}");
        assert_eq!(reply.header("connection"), Some("close"), "{reply}");
        assert!(
            wire.closed_within(IO_DEADLINE).await,
            "the connection was left open after the refused handshake"
        );
    }
    assert_eq!(upstream.connections(), 0, "nothing reached the upstream");
    assert!(upstream.seen().is_empty());
    assert_no_delete_recorded(&rig.proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_genuine_handshake_switches_with_the_accept_of_the_agents_key() {
    let upstream = Upstream::builder().start().await;
    let rig = Rig::start(upstream.port(), upstream.ca_pem()).await;
    let mut wire = rig.tunnel().await;
    wire.send(rig.handshake("/ws", &whole()).as_bytes())
        .await
        .expect("handshake sent");
    let reply = wire.connect_response().await.expect("an answer");
    assert_eq!(reply.status, 101, "{reply}");
    assert_eq!(
        reply.header("sec-websocket-accept"),
        Some(derive_accept_key(AGENT_KEY.as_bytes()).as_str()),
        "{reply}"
    );
    // The upstream ran the handshake on a key of the proxy's own.
    let seen = upstream.seen_path("/ws");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let sent = seen[0].header("sec-websocket-key").expect("a key upstream");
    assert_ne!(sent, AGENT_KEY);
    let mut ws = WebSocketStream::from_raw_socket(wire.into_inner(), Role::Client, None).await;
    ws.send(Message::text("through a checked handshake"))
        .await
        .unwrap();
    let echoed = tokio::time::timeout(IO_DEADLINE, ws.next())
        .await
        .expect("an echo in time")
        .expect("an echo")
        .expect("a frame");
    assert_eq!(
        echoed.into_text().unwrap().as_str(),
        "through a checked handshake"
    );
    let records = rig.proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 1, "{records:#?}");
    assert_eq!(http[0].decision, "allow");
    assert_eq!(http[0].status, Some(101));
}
