//! The proxy listeners: accept connections — on TCP (`listen.proxy`), and on the Unix socket
//! sandboxes reach the proxy through (`listen.proxy_unix`) — apply the strict HTTP/1 wire
//! guard and the header-read timeout, and route each request — `CONNECT` to
//! [`crate::connect`], everything else to the [`crate::pipeline`]. Both listeners serve the
//! same proxy: a request is authenticated by its session token, whichever way it came.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::task::TaskTracker;

use crate::audit::AuditGuard;
use crate::classify::{Origin, Tunnel};
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::wire_guard::{Observer, StrictH1};
use crate::{connect, pipeline};

/// Serve the proxy's TCP listener (and its Unix socket, when given) until `shutdown`
/// resolves, then drain.
pub async fn serve(
    listener: TcpListener,
    unix: Option<UnixListener>,
    plane: Arc<DataPlane>,
    shutdown: impl Future<Output = ()>,
) {
    let tracker = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    tracker.spawn(connection(plane.clone(), stream));
                }
                Err(e) => backoff(e).await,
            },
            accepted = accept_unix(unix.as_ref()) => match accepted {
                Ok(stream) => {
                    tracker.spawn(connection(plane.clone(), stream));
                }
                Err(e) => backoff(e).await,
            },
        }
    }
    tracker.close();
    // In-flight connections may finish (`listen.drain`); a load balancer has stopped
    // sending new ones once readiness failed or the pod left the endpoints.
    if tokio::time::timeout(plane.config.listen.drain, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("proxy connections still open after the drain period");
    }
}

/// The next connection on the Unix socket; never, when there is none.
async fn accept_unix(unix: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match unix {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// Out of descriptors and the like: back off instead of spinning.
async fn backoff(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

async fn connection<IO>(plane: Arc<DataPlane>, stream: IO)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = plane.config.proxy.clone();
    let io = TokioIo::new(
        StrictH1::new(stream, limits.max_header_bytes)
            .with_observer(audit_violations(plane.clone(), None)),
    );
    let service = service_fn(move |req: Request<Incoming>| {
        let plane = plane.clone();
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
    let result = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(crate::body::paced::h1_buffer(limits.max_header_bytes))
        .serve_connection(io, service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "proxy connection ended with an error");
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
