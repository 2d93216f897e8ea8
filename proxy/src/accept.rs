//! The proxy listener: accept connections, apply the strict HTTP/1 wire guard and the
//! header-read timeout, and route each request — `CONNECT` to [`crate::connect`], everything
//! else to the [`crate::pipeline`].

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;

use crate::audit::AuditGuard;
use crate::classify::{Origin, Tunnel};
use crate::error::ProxyError;
use crate::server::Shared;
use crate::wire_guard::{Observer, StrictH1};
use crate::{connect, pipeline};

/// How long in-flight connections may finish after shutdown was requested.
const DRAIN: Duration = Duration::from_secs(5);

/// Serve the proxy listener until `shutdown` resolves, then drain.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: impl Future<Output = ()>) {
    let tracker = TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    tracker.spawn(connection(shared.clone(), stream));
                }
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    tracker.close();
    if tokio::time::timeout(DRAIN, tracker.wait()).await.is_err() {
        tracing::warn!("proxy connections still open after the drain period");
    }
}

async fn connection(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let limits = shared.config.proxy.clone();
    let io = TokioIo::new(
        StrictH1::new(stream, limits.max_header_bytes)
            .with_observer(audit_violations(shared.clone(), None)),
    );
    let service = service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        async move {
            let response = if req.method() == Method::CONNECT {
                connect::handle(shared, req).await
            } else {
                pipeline::handle(shared, Origin::Plain, req).await
            };
            Ok::<_, Infallible>(response)
        }
    });
    let result = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(io, service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "proxy connection ended with an error");
    }
}

/// An observer that writes an audit record for every framing violation the wire guard
/// refuses: those requests never reach the pipeline, but they are decisions too.
pub fn audit_violations(shared: Arc<Shared>, tunnel: Option<Arc<Tunnel>>) -> Observer {
    Box::new(move |violation, request_id| {
        let request_id = request_id
            .map(str::to_owned)
            .unwrap_or_else(crate::ids::request_id);
        let mut audit = AuditGuard::start(&shared.audit, &shared.metrics, &request_id, "http");
        if let Some(t) = &tunnel {
            audit.update(|r| r.set_tunnel(t));
        }
        let err = ProxyError::bad_request(violation.reason());
        audit.refuse(&err, violation.status());
    })
}
