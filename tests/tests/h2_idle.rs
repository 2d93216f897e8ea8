//! An intercepted HTTP/2 connection with no request in flight for `header_read_timeout` is
//! closed with GOAWAY (`proxy/src/h2_idle.rs`), the bound an idle HTTP/1 keep-alive has:
//! idle after a request, and with a peer that reads nothing; httpx, which reads nothing
//! while idle, sends its next request on a new connection. A connection in use, or
//! carrying an answer longer than the bound, is kept.

use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use ostiary_e2e::clients::{self, client_script, CmdOutput};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, intercepted, request, ReqBody, Wire};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const HOST: &str = "api.example.test";

/// The idle bound every test here runs with.
const BOUND: Duration = Duration::from_millis(1500);

struct Rig {
    upstream: Upstream,
    proxy: TestProxy,
    session: Session,
}

impl Rig {
    async fn start() -> Self {
        let upstream = Upstream::builder().start().await;
        let proxy = TestProxy::start(ProxySpec {
            ports: vec![upstream.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            // A long grace: an idle connection is closed without waiting for it.
            extra_toml: format!(
                "[proxy]\nheader_read_timeout = \"{}ms\"\n[sessions]\ngrace = \"30s\"\n",
                BOUND.as_millis()
            ),
            ..Default::default()
        })
        .await;
        let session = proxy.session("h2-idler").await;
        Self {
            upstream,
            proxy,
            session,
        }
    }

    /// An intercepted h2 connection: its sender, and the task that ends when the proxy
    /// closes it.
    async fn h2(&self) -> (SendRequest<ReqBody>, JoinHandle<hyper::Result<()>>) {
        raw::h2_watched(self.tunnel().await).await
    }

    async fn tunnel(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        intercepted(
            &self.proxy,
            &self.session.token,
            HOST,
            self.upstream.port(),
            &[b"h2"],
        )
        .await
    }

    /// An agent running httpx with h2 through the proxy: two GETs of `/echo` on one client,
    /// `pause` seconds apart (`py_httpx_idle.py`).
    async fn httpx_idle(&self, pause: &str) -> CmdOutput {
        let mut env = self.proxy.client_env(&self.session);
        env.push(("OSTIARY_HTTP2".into(), "1".into()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let url = self.url("/echo");
        clients::python(client_script("py_httpx_idle.py"), &[&url, pause], &env).await
    }

    fn url(&self, path: &str) -> String {
        format!("https://{HOST}:{}{path}", self.upstream.port())
    }

    async fn get(&self, sender: &mut SendRequest<ReqBody>, path: &str) -> String {
        let reply = raw::send_h2(sender, request("GET", &self.url(path), None))
            .await
            .expect("an answer");
        assert_eq!(reply.status, 200, "{reply}");
        String::from_utf8_lossy(&reply.body).into_owned()
    }
}

/// How long `conn` lived from `since`, if the proxy closed it within `within`.
async fn closed_after(
    conn: JoinHandle<hyper::Result<()>>,
    since: Instant,
    within: Duration,
) -> Option<Duration> {
    let ended = tokio::time::timeout(within, conn).await.ok()?;
    // GOAWAY ends the client's connection cleanly; a cut one ends in error.
    ended
        .expect("the connection's task")
        .expect("the connection ended in error, not by GOAWAY");
    Some(since.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_h2_connection_is_closed_after_the_bound() {
    let rig = Rig::start().await;
    let (mut sender, conn) = rig.h2().await;
    assert!(rig.get(&mut sender, "/echo?n=1").await.contains("n=1"));
    let idle_from = Instant::now();
    let lived = closed_after(conn, idle_from, BOUND + Duration::from_secs(4))
        .await
        .expect("the idle h2 connection was still open well after the bound");
    assert!(lived >= BOUND - Duration::from_millis(100), "{lived:?}");
    // Closed by GOAWAY, not cut: the client knows not to send on it.
    assert!(sender.is_closed(), "the sender still takes requests");
    // The agent's next request opens a new connection, served as the first was.
    let (mut sender, _conn) = rig.h2().await;
    assert!(rig.get(&mut sender, "/echo?n=2").await.contains("n=2"));
    assert_eq!(rig.upstream.count("/echo"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connection_in_use_is_kept_past_the_bound() {
    let rig = Rig::start().await;
    let (mut sender, conn) = rig.h2().await;
    // A request every half bound, for three bounds: never idle for one.
    let until = Instant::now() + BOUND * 3;
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        assert!(rig
            .get(&mut sender, &format!("/echo?n={n}"))
            .await
            .contains(&format!("n={n}")));
        tokio::time::sleep(BOUND / 2).await;
    }
    assert!(!conn.is_finished(), "closed while in use");
    assert_eq!(rig.upstream.count("/echo"), n);
}

/// The bound counts from the end of the last answer, not its start: an answer that streams
/// for longer than the bound arrives whole, and the connection takes the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_longer_than_the_bound_is_not_cut() {
    let rig = Rig::start().await;
    let (mut sender, conn) = rig.h2().await;
    let body = rig
        .get(&mut sender, "/stream?chunks=3&size=16&delay_ms=1000")
        .await;
    let want: String = ["a", "b", "c"].iter().map(|c| c.repeat(16)).collect();
    assert_eq!(body, want);
    assert!(rig
        .get(&mut sender, "/echo?after=stream")
        .await
        .contains("after=stream"));
    assert!(!conn.is_finished());
}

/// A peer that opens h2 and then neither sends a request nor reads what the proxy sends
/// (it acknowledges nothing) is closed soon after the bound: the grace (30 s here) is for
/// requests in flight, and it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deaf_peer_is_closed_soon_after_the_bound() {
    let rig = Rig::start().await;
    let mut tls = rig.tunnel().await;
    // The client preface and an empty SETTINGS frame; nothing after, no ack of anything.
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let started = Instant::now();
    // Not read until the bound has passed: a peer that reads nothing acks nothing.
    tokio::time::sleep(BOUND).await;
    let mut wire = Wire::new(tls);
    assert!(
        wire.closed_within(Duration::from_secs(5)).await,
        "a deaf h2 peer was not closed within 5 s of the bound (grace 30 s)"
    );
    let lived = started.elapsed();
    assert!(lived >= BOUND, "{lived:?}");
}

/// A real agent's client (httpx with h2) that keeps its client across a pause longer than the
/// bound: its next request goes out on a new connection, with no error to the agent; the
/// stream ids say which connection carried it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httpx_sends_its_next_request_on_a_new_connection_after_the_idle_close() {
    let rig = Rig::start().await;
    // Well past the bound.
    let pause = (BOUND + Duration::from_secs(2)).as_secs_f64().to_string();
    let run = rig.httpx_idle(&pause).await;
    assert!(run.success(), "{run}");
    let v = run.json();
    assert_eq!(v["statuses"], serde_json::json!([200, 200]), "{run}");
    assert_eq!(
        v["http_versions"],
        serde_json::json!(["HTTP/2", "HTTP/2"]),
        "{run}"
    );
    assert_eq!(
        v["stream_ids"],
        serde_json::json!([1, 1]),
        "the second request went out on the first connection: it was not closed ({run})"
    );
    assert_eq!(rig.upstream.count("/echo"), 2);
}

/// An ended session's idle h2 connection is closed the same way: httpx's next request goes
/// to a new connection and meets the proxy's refusal of the ended session, not a protocol
/// error from the old connection (hyper's shutdown, with its PING, gave httpx
/// `LocalProtocolError`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httpx_meets_the_refusal_after_its_sessions_idle_connection_is_closed() {
    let rig = Rig::start().await;
    let agent = rig.httpx_idle("3");
    let teardown = async {
        // Once the first request is answered, while the agent pauses.
        while rig.upstream.count("/echo") < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        rig.proxy
            .control()
            .delete_session(&rig.session.session_id)
            .await
            .expect("session deleted");
    };
    let (run, ()) = tokio::join!(agent, teardown);
    assert!(!run.success(), "the second request went through: {run}");
    let error = run.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        !error.contains("ProtocolError"),
        "the old connection failed the request: {run}"
    );
    assert!(error.contains("ProxyError"), "{run}");
    assert_eq!(rig.upstream.count("/echo"), 1);
}
