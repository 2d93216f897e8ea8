//! The bottom rung of the load harness's Ostiary ladder, "interception only": Ostiary's own
//! interception parts — the CONNECT listener, a leaf from [`LeafMinter`] for the tunnel's host,
//! the wire guard ([`StrictH1`]) on the agent's HTTP/1.1, the upstream pools of
//! [`Upstreams`] behind the egress [`Guard`], hop-by-hop headers stripped each way, the paced
//! answer — with no session, no policy, no audit, no injection. What the full pipeline costs
//! is what the rungs above add to this.
//!
//! `relay ADDR CA_CERT_PEM CA_KEY_PEM UPSTREAM_ROOTS_PEM` (the same arguments as the
//! hudsucker relay). Upstreams are dialed only on loopback: `localhost` resolves to
//! 127.0.0.1 and every other address is refused by the guard.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use ostiary::body::{self, paced, ProxyBody};
use ostiary::egress::{Guard, SystemResolver, TcpDialer};
use ostiary::forward::Upstreams;
use ostiary::inject::strip_hop_by_hop;
use ostiary::metrics::Metrics;
use ostiary::shards::{Alive, Loops};
use ostiary::tls::ca::LeafMinter;
use ostiary::wire_guard::StrictH1;
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;

/// As `[proxy] max_header_bytes` defaults.
const MAX_HEADER_BYTES: usize = 64 * 1024;

struct Relay {
    minter: LeafMinter,
    upstreams: Upstreams,
    metrics: Metrics,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, ca_cert, ca_key, roots] = args.as_slice() else {
        bail!("usage: relay ADDR CA_CERT_PEM CA_KEY_PEM UPSTREAM_ROOTS_PEM");
    };
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    let minter = LeafMinter::new(
        &std::fs::read_to_string(ca_cert).context("CA_CERT_PEM")?,
        &std::fs::read_to_string(ca_key).context("CA_KEY_PEM")?,
    )?;
    let guard = Arc::new(Guard::new(
        Arc::new(SystemResolver),
        Arc::new(TcpDialer),
        BTreeMap::from([("localhost".to_owned(), IpAddr::V4(Ipv4Addr::LOCALHOST))]),
        vec!["127.0.0.0/8".parse()?],
        Duration::from_secs(5),
    ));
    let roots = ostiary::tls::upstream::root_store(roots.as_ref())?;
    // As Ostiary's listener: one event loop per core (`listen.proxy_threads`), or the
    // runtime's shared workers with `RELAY_THREADS=0`.
    let threads = match std::env::var("RELAY_THREADS") {
        Ok(n) => n.parse().context("RELAY_THREADS")?,
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let upstreams = Upstreams::new(guard, Arc::new(roots), Duration::from_secs(30), threads)?;
    let relay = Arc::new(Relay {
        minter,
        upstreams,
        metrics: Metrics::default(),
    });
    let listener = TcpListener::bind(addr).await?;
    eprintln!("relay listening on {addr}");
    if threads > 0 {
        let serving = relay.clone();
        let _loops = Loops::start(
            listener,
            None,
            threads,
            &relay.metrics,
            Duration::from_secs(1),
            move |stream, alive| agent(serving.clone(), stream, Some(alive)),
        )?;
        std::future::pending::<()>().await;
        return Ok(());
    }
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(agent(relay.clone(), stream, None));
    }
}

/// One agent connection: CONNECTs, each intercepted, counted on its event loop (`alive`)
/// until the tunnel closes, as Ostiary's are.
async fn agent<IO>(relay: Arc<Relay>, stream: IO, alive: Option<Alive>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| connect(relay.clone(), req, alive.clone()));
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

/// A CONNECT: 200, then the tunnel intercepted.
async fn connect(
    relay: Arc<Relay>,
    req: Request<Incoming>,
    alive: Option<Alive>,
) -> Result<Response<ProxyBody>, Infallible> {
    // Copied, not cloned: hyper parses the URI as a slice of its read buffer, and a clone
    // kept for the tunnel's life would keep that whole 8 KiB buffer with it (massif, 1,000
    // idle connections: docs/benchmarks.md, "Where an idle connection's memory is").
    let authority = match (req.method(), req.uri().authority()) {
        (&Method::CONNECT, Some(a)) => match a.as_str().parse::<http::uri::Authority>() {
            Ok(a) => a,
            Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
        },
        _ => return Ok(status(StatusCode::METHOD_NOT_ALLOWED)),
    };
    tokio::spawn(async move {
        let _alive = alive;
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let _ = intercept(relay, TokioIo::new(upgraded), authority).await;
        }
    });
    Ok(status(StatusCode::OK))
}

async fn intercept(
    relay: Arc<Relay>,
    io: TokioIo<hyper::upgrade::Upgraded>,
    authority: http::uri::Authority,
) -> Result<()> {
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
    let config = relay.minter.server_config(authority.host())?;
    let tls = start.into_stream(config).await?;
    let service = service_fn(move |req| forward(relay.clone(), authority.clone(), req));
    http1::Builder::new()
        .timer(TokioTimer::new())
        .max_buf_size(paced::h1_buffer(MAX_HEADER_BYTES))
        .serve_connection(TokioIo::new(StrictH1::new(tls, MAX_HEADER_BYTES)), service)
        .await?;
    Ok(())
}

/// One intercepted request, sent on as it came but for its hop-by-hop headers, which belong
/// to the agent's connection (as every proxy must; until 2026-12-06 the relay passed them on,
/// and an agent's `Connection: close` closed the pooled upstream connection after each
/// answer, so `new-1k` measured an upstream handshake per request on this rung alone).
async fn forward(
    relay: Arc<Relay>,
    authority: http::uri::Authority,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (mut parts, incoming) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match Uri::builder()
        .scheme("https")
        .authority(authority)
        .path_and_query(path)
        .build()
    {
        Ok(uri) => uri,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    strip_hop_by_hop(&mut parts.headers, false);
    let req = Request::from_parts(parts, body::stream(incoming));
    Ok(
        match relay.upstreams.send(req, true, None, &relay.metrics).await {
            Ok(mut response) => {
                strip_hop_by_hop(response.headers_mut(), false);
                response.map(|b| body::stream(paced::Paced::new(b)))
            }
            Err(_) => status(StatusCode::BAD_GATEWAY),
        },
    )
}

fn status(code: StatusCode) -> Response<ProxyBody> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = code;
    response
}
