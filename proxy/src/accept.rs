//! The proxy listeners: accept connections — on TCP (`listen.proxy`) and on the Unix socket
//! sandboxes reach the proxy through (`listen.proxy_unix`), both on the event loops of
//! [`crate::shards`] unless `listen.proxy_threads = 0` — apply the strict HTTP/1 wire
//! guard and the header-read timeout, and route each request — `CONNECT` to
//! [`crate::connect`], everything else to the [`crate::pipeline`]. Both listeners serve the
//! same proxy: a request is authenticated by its session token, whichever way it came.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use hyper::body::Incoming;
use hyper::service::service_fn;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::AuditGuard;
use crate::classify::{Origin, Tunnel};
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::shards::{Alive, Loops};
use crate::wire_guard::{Observer, StrictH1};
use crate::{connect, pipeline};

/// The proxy's listeners, ready to serve.
#[derive(Debug)]
pub struct Proxy {
    tcp: Tcp,
    unix: Option<UnixListener>,
    plane: Arc<DataPlane>,
}

/// Who serves the TCP listener's connections.
#[derive(Debug)]
enum Tcp {
    /// Tasks of the runtime `serve` runs on (`listen.proxy_threads = 0`), counted in the
    /// gauge.
    Shared(TcpListener, Gauge),
    /// Event loops of their own ([`shards`]), already accepting.
    Loops(Loops),
}

impl Proxy {
    /// Take the TCP listener (and the Unix socket, when given) for `plane`, starting the
    /// event loops `listen.proxy_threads` asks for, which then serve both; with none, both
    /// are served on the runtime `serve` runs on.
    pub fn new(
        listener: TcpListener,
        mut unix: Option<UnixListener>,
        plane: Arc<DataPlane>,
    ) -> std::io::Result<Self> {
        let tcp = match plane.config.listen.proxy_threads() {
            0 => Tcp::Shared(listener, plane.metrics.proxy_connections("shared")),
            threads => {
                let serving = plane.clone();
                Tcp::Loops(Loops::start(
                    listener,
                    unix.take(),
                    threads,
                    &plane.metrics,
                    plane.config.listen.drain,
                    move |stream, alive| connection(serving.clone(), stream, alive),
                )?)
            }
        };
        Ok(Self { tcp, unix, plane })
    }

    /// Serve until `shutdown` resolves, then drain.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Self { tcp, unix, plane } = self;
        let (shared, loops) = match tcp {
            Tcp::Shared(listener, open) => (Some((listener, open)), None),
            Tcp::Loops(loops) => (None, Some(loops)),
        };
        let tracker = TaskTracker::new();
        let stopping = CancellationToken::new();
        // Only when this runtime serves the socket: on the loops, its connections are
        // counted in their loop's gauge.
        let unix = unix.map(|u| (u, plane.metrics.proxy_connections("unix")));
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = accept_tcp(shared.as_ref()) => match accepted {
                    Ok((stream, open)) => {
                        let _ = stream.set_nodelay(true);
                        let alive = Alive::new(open, &tracker, &stopping);
                        tracker.spawn(connection(plane.clone(), stream, alive));
                    }
                    Err(e) => backoff(e).await,
                },
                accepted = accept_unix(unix.as_ref()) => match accepted {
                    Ok((stream, open)) => {
                        let alive = Alive::new(open, &tracker, &stopping);
                        tracker.spawn(connection(plane.clone(), stream, alive));
                    }
                    Err(e) => backoff(e).await,
                },
            }
        }
        drop((shared, unix));
        stopping.cancel();
        tracker.close();
        // In-flight connections may finish (`listen.drain`); a load balancer has stopped
        // sending new ones once readiness failed or the pod left the endpoints. The loops
        // drain theirs at the same time.
        let drained = async {
            if tokio::time::timeout(plane.config.listen.drain, tracker.wait())
                .await
                .is_err()
            {
                tracing::warn!("proxy connections still open after the drain period");
            }
        };
        match loops {
            Some(loops) => {
                tokio::join!(drained, loops.stop());
            }
            None => drained.await,
        }
    }
}

/// The next connection on the TCP listener and the gauge it counts in; never, when the
/// event loops take them.
async fn accept_tcp(shared: Option<&(TcpListener, Gauge)>) -> std::io::Result<(TcpStream, &Gauge)> {
    match shared {
        Some((listener, open)) => listener.accept().await.map(|(stream, _)| (stream, open)),
        None => std::future::pending().await,
    }
}

/// The next connection on the Unix socket and the gauge it counts in; never, when there is
/// none or the event loops take them.
async fn accept_unix(
    unix: Option<&(UnixListener, Gauge)>,
) -> std::io::Result<(tokio::net::UnixStream, &Gauge)> {
    match unix {
        Some((listener, open)) => listener.accept().await.map(|(stream, _)| (stream, open)),
        None => std::future::pending().await,
    }
}

/// Out of descriptors and the like: back off instead of spinning.
pub(crate) async fn backoff(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serve one agent connection: the wire guard, then hyper, each request routed. `alive`
/// goes with a request that may outlive the connection's task (a CONNECT, an upgrade).
async fn connection<IO>(plane: Arc<DataPlane>, stream: IO, alive: Alive)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = plane.config.proxy.clone();
    let resting = plane.metrics.proxy_connections_resting.clone();
    let io = Box::new(
        StrictH1::new(stream, limits.max_header_bytes)
            .with_observer(audit_violations(plane.clone(), None)),
    );
    let lent = alive.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        let plane = plane.clone();
        lend(&lent, &mut req);
        async move {
            // Boxed: hyper keeps room for one service future per connection, in flight or
            // not, and the pipeline's is tens of KiB (see connect.rs).
            let response = if req.method() == Method::CONNECT {
                Box::pin(connect::handle(plane, req)).await
            } else {
                Box::pin(pipeline::handle(plane, Origin::Plain, req)).await
            };
            Ok::<_, Infallible>(response)
        }
    });
    // An idle keep-alive closes at once; a request in flight finishes first.
    let stop = Box::pin(async {
        alive.stopping().await;
        None
    });
    let result = crate::hibernate::serve(&limits, io, service, &resting, stop).await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "proxy connection ended with an error");
    }
}

/// Lend `alive` to `req` if the request may take the connection over (a CONNECT, an
/// `Upgrade`), so that whatever serves the rest of it is counted and drained too.
pub(crate) fn lend<B>(alive: &Alive, req: &mut Request<B>) {
    if req.method() == Method::CONNECT || req.headers().contains_key(http::header::UPGRADE) {
        req.extensions_mut().insert(alive.clone());
    }
}

/// An observer that writes an audit record for every framing violation the wire guard
/// refuses: those requests never reach the pipeline, but they are decisions too.
pub fn audit_violations(plane: Arc<DataPlane>, tunnel: Option<Arc<Tunnel>>) -> Observer {
    Box::new(move |violation, request_id| {
        let request_id = request_id
            .map(str::to_owned)
            .unwrap_or_else(crate::ids::request_id);
        let mut audit = AuditGuard::start(&plane.audit, &plane.metrics, &request_id, "http");
        if let Some(t) = &tunnel {
            audit.update(|r| r.set_tunnel(t));
        }
        let err = ProxyError::bad_request(violation.reason());
        audit.refuse(&err, violation.status());
    })
}
