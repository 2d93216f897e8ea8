//! The proxy listener's event loops (`listen.proxy_threads`): connections are spread evenly
//! over the loops and each is served whole on its own, the sandbox's Unix socket's with the
//! TCP listener's; the loops drain what is in flight on shutdown and then close the
//! listener; `0` serves on the runtime's shared workers.

use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{h1, intercepted, request, send_h1, ReqBody};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;

/// `ostiary_proxy_connections` by its `thread` label, as `/metrics` shows it.
async fn gauges(proxy: &TestProxy) -> Vec<(String, i64)> {
    let text = proxy.metrics().await;
    let mut open: Vec<(String, i64)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("ostiary_proxy_connections{thread=\""))
        .filter_map(|rest| {
            let (thread, value) = rest.split_once("\"} ")?;
            Some((thread.to_owned(), value.trim().parse().ok()?))
        })
        .collect();
    open.sort();
    open
}

/// [`gauges`], but for the sandbox's Unix socket when the shared runtime serves it (`unix`).
async fn open_connections(proxy: &TestProxy) -> Vec<(String, i64)> {
    let mut open = gauges(proxy).await;
    open.retain(|(thread, _)| thread != "unix");
    open
}

/// Poll until the event loops together hold `total` connections; their split then.
async fn wait_for_total(proxy: &TestProxy, total: i64) -> Vec<(String, i64)> {
    let mut last = Vec::new();
    for _ in 0..200 {
        last = open_connections(proxy).await;
        if last.iter().map(|(_, n)| n).sum::<i64>() == total {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the proxy never held {total} connections: {last:?}");
}

/// An intercepted HTTP/1.1 connection to the upstream through `proxy`: one proxy connection.
async fn tunnel(proxy: &TestProxy, session: &Session, upstream: &Upstream) -> SendRequest<ReqBody> {
    let tls = intercepted(
        proxy,
        &session.token,
        "api.example.test",
        upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    h1(tls).await
}

async fn proxy_for(upstream: &Upstream, threads: Option<usize>) -> TestProxy {
    TestProxy::start(ProxySpec {
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        proxy_threads: threads,
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_spread_evenly_over_the_loops_and_each_is_served() {
    let upstream = Upstream::builder().start().await;
    let proxy = proxy_for(&upstream, Some(3)).await;
    let session = proxy.session("spread").await;
    let mut senders = Vec::new();
    for k in 1..=6 {
        senders.push(tunnel(&proxy, &session, &upstream).await);
        // Each connection is counted before the next arrives, so the split is decided by
        // the loops' counts alone, not by which loop's thread the kernel woke first.
        wait_for_total(&proxy, k).await;
    }
    let split = open_connections(&proxy).await;
    assert_eq!(
        split,
        [("0".into(), 2), ("1".into(), 2), ("2".into(), 2)],
        "six connections over three loops"
    );
    for (i, sender) in senders.iter_mut().enumerate() {
        for _ in 0..2 {
            let reply = send_h1(
                sender,
                request("GET", &format!("/echo?c={i}"), Some("api.example.test")),
            )
            .await
            .expect("a request on a kept connection");
            assert_eq!(reply.status, 200, "{reply}");
            assert!(
                String::from_utf8_lossy(&reply.body).contains(&format!("/echo?c={i}")),
                "{reply}"
            );
        }
    }
    assert_eq!(upstream.count("/echo"), 12);
    drop(senders);
    let closed = wait_for_total(&proxy, 0).await;
    assert!(closed.iter().all(|(_, n)| *n == 0), "{closed:?}");
}

/// A plain request over the sandbox's Unix socket on a kept connection.
async fn through_unix(
    proxy: &TestProxy,
    session: &Session,
    upstream: &Upstream,
) -> SendRequest<ReqBody> {
    let socket = proxy.shared.config.proxy_unix_path();
    let mut sender = h1(tokio::net::UnixStream::connect(&socket).await.unwrap()).await;
    let mut req = request("GET", &upstream.url("/echo"), None);
    let auth = format!("Bearer {}", session.token).parse().unwrap();
    req.headers_mut().insert("proxy-authorization", auth);
    let reply = send_h1(&mut sender, req)
        .await
        .expect("a request over the socket");
    assert_eq!(reply.status, 200, "{reply}");
    sender
}

/// The loops serve the Unix socket a sandbox reaches the proxy through too: its connections
/// are spread with the TCP listener's and counted on the loops; with `0` the shared runtime
/// serves both, the socket's counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_is_served_and_counted_on_the_loops() {
    let upstream = Upstream::builder().tls(false).start().await;
    let on = |threads| {
        TestProxy::start(ProxySpec {
            ports: vec![upstream.port()],
            proxy_threads: Some(threads),
            ..Default::default()
        })
    };
    let proxy = on(2).await;
    let session = proxy.session("sandboxed").await;
    let mut kept = vec![through_unix(&proxy, &session, &upstream).await];
    wait_for_total(&proxy, 1).await;
    kept.push(through_unix(&proxy, &session, &upstream).await);
    let split = wait_for_total(&proxy, 2).await;
    assert_eq!(
        split,
        [("0".into(), 1), ("1".into(), 1)],
        "two socket connections over two loops, no gauge of their own"
    );
    assert!(!gauges(&proxy).await.iter().any(|(t, _)| t == "unix"));
    drop(kept);
    wait_for_total(&proxy, 0).await;

    let proxy = on(0).await;
    let session = proxy.session("sandboxed").await;
    let _kept = through_unix(&proxy, &session, &upstream).await;
    let mut counted = Vec::new();
    for _ in 0..200 {
        counted = gauges(&proxy).await;
        if counted.contains(&("unix".into(), 1)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        counted,
        [("shared".into(), 0), ("unix".into(), 1)],
        "on the shared runtime the socket's connection is counted apart"
    );
    assert_eq!(upstream.count("/echo"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_lets_a_response_in_flight_finish_closes_idle_ones_and_the_listener() {
    let upstream = Upstream::builder().start().await;
    // A drain far longer than the test: a stop that waited for idle connections would
    // show as one that took it.
    let proxy = TestProxy::start(ProxySpec {
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        proxy_threads: Some(2),
        drain: Some("60s".into()),
        ..Default::default()
    })
    .await;
    let addr = proxy.proxy_addr;
    let socket = proxy.shared.config.proxy_unix_path();
    let session = proxy.session("drain").await;
    let mut busy = tunnel(&proxy, &session, &upstream).await;
    let mut idle = tunnel(&proxy, &session, &upstream).await;
    let warm = send_h1(&mut idle, request("GET", "/echo", Some("api.example.test")))
        .await
        .unwrap();
    assert_eq!(warm.status, 200, "{warm}");
    // Thirty chunks 100 ms apart: still streaming when the stop comes, and for seconds after.
    let streaming = tokio::spawn(async move {
        send_h1(
            &mut busy,
            request(
                "GET",
                "/stream?chunks=30&size=1000&delay_ms=100",
                Some("api.example.test"),
            ),
        )
        .await
    });
    while upstream.count("/stream") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let stopping = tokio::spawn(async move {
        let stopped = std::time::Instant::now();
        proxy.stop().await;
        stopped.elapsed()
    });
    // While the answer in flight drains, both listeners already refuse new connections.
    let mut tries = 0;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        tries += 1;
        assert!(
            tries < 500,
            "the TCP listener still accepts after 5 s of stopping"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!streaming.is_finished(), "checked during the drain");
    let sandboxed = tokio::net::UnixStream::connect(&socket).await;
    assert!(
        sandboxed.is_err(),
        "the Unix socket is closed with the TCP listener, before the drain"
    );
    let took = stopping.await.unwrap();
    let reply = streaming
        .await
        .unwrap()
        .expect("the response in flight completes");
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(reply.body.len(), 30_000, "the whole body, not a cut one");
    assert!(
        took < Duration::from_secs(30),
        "the stop waited for the idle connection ({took:?}), not only for the answer in flight"
    );
    let after = send_h1(&mut idle, request("GET", "/echo", Some("api.example.test"))).await;
    assert!(after.is_err(), "the idle connection was closed: {after:?}");
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(
        refused.is_err(),
        "the listener is closed once the loops stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_threads_serves_on_the_shared_runtime() {
    let upstream = Upstream::builder().start().await;
    let proxy = proxy_for(&upstream, Some(0)).await;
    let session = proxy.session("shared").await;
    let mut sender = tunnel(&proxy, &session, &upstream).await;
    let reply = send_h1(
        &mut sender,
        request("GET", "/echo", Some("api.example.test")),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(
        wait_for_total(&proxy, 1).await,
        [("shared".into(), 1)],
        "no event loops of their own"
    );
    drop(sender);
    wait_for_total(&proxy, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_there_is_one_loop_per_core() {
    let upstream = Upstream::builder().start().await;
    let proxy = proxy_for(&upstream, None).await;
    let session = proxy.session("cores").await;
    let cores = std::thread::available_parallelism().unwrap().get();
    let mut senders = Vec::new();
    for k in 1..=cores {
        senders.push(tunnel(&proxy, &session, &upstream).await);
        wait_for_total(&proxy, k as i64).await;
    }
    let split = open_connections(&proxy).await;
    assert_eq!(split.len(), cores, "{split:?}");
    assert!(split.iter().all(|(_, n)| *n == 1), "{split:?}");
}
