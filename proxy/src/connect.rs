//! `CONNECT`: authenticate, check the destination, then either intercept TLS (every inner
//! request goes through the pipeline) or relay an uninspected tunnel for `egress.tunnel`
//! hosts.
//!
//! Destinations that may not be reached at all (blocked addresses, ports outside
//! `egress.ports`) are refused here with 403, before any TLS. The SNI of the agent's
//! ClientHello must name the CONNECT host: otherwise nothing is minted and the connection is
//! closed (fronting).

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use ostiary_policies::{Action, PolicyEngine, SessionState};
use tokio_rustls::LazyConfigAcceptor;

use crate::audit::AuditGuard;
use crate::body::{self, ProxyBody};
use crate::classify::{Origin, Tunnel};
use crate::egress::address::{normalize_host, split_authority, Host};
use crate::egress::EgressError;
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::session::Principal;
use crate::shards::Alive;
use crate::store::now_ms;
use crate::wire_guard::StrictH1;
use crate::{authenticate, evaluate, ids, pipeline, recognise, respond, tunnel};

/// What an accepted CONNECT turns into.
enum Plan {
    Intercept(Arc<Tunnel>),
    Relay {
        tunnel: Arc<Tunnel>,
        addrs: Vec<std::net::SocketAddr>,
    },
}

/// Handle one CONNECT request on the proxy listener.
pub async fn handle(plane: Arc<DataPlane>, mut req: Request<Incoming>) -> Response<ProxyBody> {
    let request_id = ids::request_id();
    let mut audit = AuditGuard::start(&plane.audit, &plane.metrics, &request_id, "connect");
    match open(&plane, &req, &mut audit).await {
        Ok(plan) => {
            let on_upgrade = hyper::upgrade::on(&mut req);
            // The tunnel outlives the agent connection's task: it keeps the connection
            // counted on its event loop and waited for by the drain.
            let alive = req.extensions_mut().remove::<Alive>();
            audit.allow(200);
            tokio::spawn(serve_tunnel(plane, on_upgrade, plan, alive));
            Response::new(body::empty())
        }
        Err(err) => {
            let mut response = respond::error(&err, &request_id);
            // The wire guard stops inspecting after a CONNECT head; a refused CONNECT must
            // not leave a connection whose next requests go unchecked.
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            audit.refuse(&err, response.status().as_u16());
            response
        }
    }
}

/// An accepted CONNECT's tunnel, once hyper hands the connection over: intercepted, or
/// relayed uninspected. What this future holds is what every intercepted connection's task
/// holds for as long as the connection lives.
async fn serve_tunnel(
    plane: Arc<DataPlane>,
    on_upgrade: hyper::upgrade::OnUpgrade,
    plan: Plan,
    alive: Option<Alive>,
) {
    let upgraded = match on_upgrade.await {
        Ok(u) => TokioIo::new(u),
        Err(e) => {
            tracing::debug!(error = %e, "CONNECT upgrade failed");
            return;
        }
    };
    match plan {
        Plan::Intercept(tunnel) => intercept(plane, upgraded, tunnel, alive).await,
        // Boxed: each connection's task is as large as the larger of the two, and
        // intercepted connections are the many.
        Plan::Relay { tunnel, addrs } => {
            let _alive = alive;
            Box::pin(tunnel::relay(plane, upgraded, tunnel, addrs)).await
        }
    }
}

async fn open(
    plane: &DataPlane,
    req: &Request<Incoming>,
    audit: &mut AuditGuard,
) -> Result<Plan, ProxyError> {
    // First, as in the pipeline: no tunnel is opened while its record cannot be written.
    plane.audit.writable().await?;
    let principal = authenticate::principal(&plane.sessions, req.headers()).await?;
    audit.update(|r| {
        r.set_principal(&principal);
        r.method = Some("CONNECT".into());
    });
    let authority = req
        .uri()
        .authority()
        .ok_or_else(|| ProxyError::bad_request("CONNECT needs host:port"))?;
    let (host, port) = split_authority(authority.as_str())
        .map_err(|e| ProxyError::bad_request(format!("CONNECT target: {e}")))?;
    let port = port.ok_or_else(|| ProxyError::bad_request("CONNECT target has no port"))?;
    audit.update(|r| {
        r.host = Some(host.to_string());
        r.port = Some(port);
    });

    // The proxy's own name: intercepted without a decision or a lookup; its requests are
    // answered by the proxy itself (`crate::runs::checkpoint`).
    if crate::runs::checkpoint::is_reserved(&host) && port == 443 {
        return Ok(Plan::Intercept(Arc::new(Tunnel {
            host,
            port,
            principal,
        })));
    }
    let engine = plane.policies.current();
    audit.update(|r| r.policy_version = Some(engine.version().to_string()));
    let mut session = plane.guardrails.session_state(&principal);
    let memory = &plane.sessions.memory;
    let shared = plane.guardrails.shared.as_deref();
    let reads = engine.reads_session_memory();
    (session.labels, _) = memory
        .state(shared, &principal.session_id, None, reads, now_ms())
        .await?;
    let opened_by = evaluate::port(
        &engine,
        &plane.metrics,
        &plane.config.egress.ports,
        (&principal, &session),
        &host,
        port,
    )?;
    audit.update(|r| r.add_policies(opened_by));
    // A host that no permit's scope names is refused here, before any TLS and before any
    // DNS lookup (a lookup of a name the agent chose is itself a way to leak data).
    // A host serving catalogued REST tools is let through too: its requests may be tool
    // calls, which tier and tool permits decide, and those do not name hosts.
    let tunnel_host = plane.is_tunnel_host(&host);
    let host_text = host.to_string();
    if !tunnel_host
        && !engine.may_permit_http(&host_text)
        && !recognise::serves_tools(engine.catalog(), &host_text)
    {
        return Err(ProxyError::Denied {
            policies: Vec::new(),
            action: "Ostiary::Action::\"http\"".into(),
            resource: format!("Ostiary::Host::\"{host}\""),
            reason: "no policy permits any request to this host".into(),
        });
    }
    let addrs = plane
        .guard
        .resolve(&host, port)
        .await
        .map_err(egress_refusal)?;

    let tunnel = Arc::new(Tunnel {
        host: host.clone(),
        port,
        principal: principal.clone(),
    });
    if tunnel_host {
        decide_tunnel(plane, &engine, (&principal, &session), &host, port, audit).await?;
        return Ok(Plan::Relay { tunnel, addrs });
    }
    if let Host::Ip(ip) = host {
        return Err(ProxyError::bad_request(format!(
            "CONNECT to the address {ip} cannot be intercepted: TLS interception needs a host name"
        )));
    }
    Ok(Plan::Intercept(tunnel))
}

/// An `egress.tunnel` host: uninspected, so this decision (`Action::"connect"`) is the only
/// one the tunnel gets, and the host's labels go on the session now, since whatever passes
/// the tunnel is unseen.
async fn decide_tunnel(
    plane: &DataPlane,
    engine: &PolicyEngine,
    (principal, session): (&Principal, &SessionState),
    host: &Host,
    port: u16,
    audit: &mut AuditGuard,
) -> Result<(), ProxyError> {
    audit.update(|r| r.kind = "tunnel".into());
    let action = Action::Connect {
        port,
        sni: host.to_string(),
    };
    // Kept with the record (replay, the shadow set); a Connect carries no arguments.
    let mut kept = None;
    let decided = evaluate::decide_kept(
        engine,
        &plane.metrics,
        principal,
        session,
        host,
        action,
        Some((&mut kept, &|_: &str| false)),
    );
    audit.update(|r| r.decided = kept);
    let policies = decided?;
    audit.update(|r| r.add_policies(policies));
    let labels = engine.catalog().labels_for(&host.to_string(), None);
    plane
        .sessions
        .memory
        .record(
            plane.guardrails.shared.as_deref(),
            &principal.session_id,
            labels,
            None,
            now_ms(),
            principal.expires_at,
        )
        .await
}

/// The refusal an egress failure at CONNECT time stands for.
pub fn egress_refusal(e: EgressError) -> ProxyError {
    match e {
        EgressError::Blocked { address, reason } => {
            ProxyError::DestinationBlocked { address, reason }
        }
        EgressError::Timeout { .. } => ProxyError::UpstreamTimeout {
            reason: e.to_string(),
        },
        other => ProxyError::Upstream {
            reason: other.to_string(),
        },
    }
}

/// The server side of an intercepted HTTP/2 connection, with its flood bounds.
fn h2_builder(limits: &crate::config::ProxyLimits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        // Rapid reset (CVE-2023-44487): streams reset by the client before the service saw
        // them are bounded, and a connection that keeps provoking errors is closed.
        .max_pending_accept_reset_streams(Some(64))
        .max_local_error_reset_streams(Some(256))
        // Bounds a CONTINUATION flood: the header block of one request cannot exceed it.
        .max_header_list_size(limits.max_header_bytes as u32)
        .keep_alive_interval(Some(std::time::Duration::from_secs(30)));
    builder
}

/// Once the proxy stops, when the connection came through a listener (`alive`); never else.
async fn stopping(alive: Option<&Alive>) {
    match alive {
        Some(alive) => alive.stopping().await,
        None => std::future::pending().await,
    }
}

/// Terminate the agent's TLS with a leaf for the tunnel's host and serve the inner requests.
async fn intercept(
    plane: Arc<DataPlane>,
    io: TokioIo<hyper::upgrade::Upgraded>,
    tunnel: Arc<Tunnel>,
    alive: Option<Alive>,
) {
    // Tied to the session from the start: its end closes the connection, idle keep-alive
    // and h2 alike, not only its next request.
    let Some(watch) = plane.watch_stream(&tunnel.principal) else {
        return plane.refuse_tunnel(
            &tunnel,
            "tls",
            "the session is not active (revoked or expired)".into(),
        );
    };
    let limits = plane.config.proxy.clone();
    let resting = plane.metrics.proxy_connections_resting.clone();
    // Boxed: the handshake's state (2.9 KiB) is needed for a few round trips, and an idle
    // connection's task would otherwise keep room for it as long as the connection lives.
    // Never borrowed here: a local borrowed in an async fn keeps its room in the future's
    // state until the end of its scope, and the TLS session's 1.2 KiB would then sit in
    // every intercepted connection's task for as long as the connection lives.
    let Some(Agreed { tls, h2 }) = Box::pin(handshake(&plane, io, &tunnel)).await else {
        return;
    };
    let observer = crate::accept::audit_violations(plane.clone(), Some(tunnel.clone()));
    // Requests in flight at teardown get the grace period (their tickets are cancelled after
    // it); this bounds the wait for the connection to wind down after them.
    let wind_down = plane.guardrails.grace() + std::time::Duration::from_secs(1);
    let origin = Origin::Tunnel(tunnel);
    let cancellations = Arc::new(crate::reset_guard::Cancellations::default());
    let watched = cancellations.clone();
    let lent = alive.clone();
    let service = service_fn(move |mut req: Request<Incoming>| {
        let plane = plane.clone();
        let origin = origin.clone();
        if let Some(alive) = &lent {
            crate::accept::lend(alive, &mut req);
        }
        // Dropped before it answers: the client cancelled the request (see reset_guard).
        let watch = watched.watch();
        async move {
            // Boxed, so that it takes memory only while a request is in flight: hyper's
            // HTTP/1 connection holds room for one service future from its start to its
            // end, and the pipeline's future is tens of KiB — most of what an idle
            // intercepted connection held (docs/benchmarks.md, "Memory").
            let response = Box::pin(pipeline::handle(plane, origin, req)).await;
            watch.done();
            Ok::<_, Infallible>(response)
        }
    });
    // The connection winds down when the session ends (requests in flight get the grace) or
    // the proxy stops (they get the drain).
    let stop: crate::hibernate::Stop<'_> = Box::pin(async {
        tokio::select! {
            () = watch.ended() => Some(wind_down),
            () = stopping(alive.as_ref()) => None,
        }
    });
    let result = if h2 {
        // Boxed: the task of every intercepted connection is as large as its largest state,
        // and an HTTP/2 connection's state would otherwise sit, unused, in each HTTP/1
        // one's (2.7 KiB of the 9.2 KiB of this function's state).
        Box::pin(serve_h2(&limits, tls, service, stop, &cancellations)).await
    } else {
        let io = Box::new(StrictH1::new(tls, limits.max_header_bytes).with_observer(observer));
        // An idle keep-alive closes at once; a request in flight finishes first.
        crate::hibernate::serve(&limits, io, service, &resting, stop).await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "intercepted connection ended with an error");
    }
}

/// How an intercepted HTTP/2 connection ends, when it does not end by itself.
enum H2Ending {
    /// Nothing in flight: the close `h2_idle` writes.
    Quiet,
    /// GOAWAY by hyper, and those in flight finish within the bound (`None`: unbounded).
    WindDown(Option<std::time::Duration>),
}

/// Serve an intercepted HTTP/2 connection until the agent closes it, it idles for
/// `header_read_timeout`, `stop` resolves, or it cancels more requests than it completes.
async fn serve_h2<S>(
    limits: &crate::config::ProxyLimits,
    tls: tokio_rustls::server::TlsStream<TokioIo<hyper::upgrade::Upgraded>>,
    service: S,
    mut stop: crate::hibernate::Stop<'_>,
    cancellations: &crate::reset_guard::Cancellations,
) -> hyper::Result<()>
where
    S: hyper::service::Service<
            Request<Incoming>,
            Response = hyper::Response<crate::body::ProxyBody>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    let quiet = Arc::new(crate::h2_idle::Quiet::default());
    let service = crate::h2_idle::counted(quiet.clone(), service);
    let (lent, lease) = crate::h2_idle::Lent::new(tls);
    // Boxed, so that it can be dropped and the stream taken back for the quiet close.
    let mut connection = Box::pin(h2_builder(limits).serve_connection(TokioIo::new(lent), service));
    let ending = tokio::select! {
        result = connection.as_mut() => return result,
        // Idle as long as an HTTP/1 keep-alive may be.
        () = quiet.elapsed(limits.header_read_timeout) => H2Ending::Quiet,
        // The session ends or the proxy stops. With nothing in flight, the same close as an
        // idle one: a client's next request is known unprocessed, and retried elsewhere
        // (another replica; or refused, with the reason, for an ended session) rather than
        // failed by the PING of hyper's shutdown (h2_idle).
        bound = &mut stop => if quiet.busy() { H2Ending::WindDown(bound) } else { H2Ending::Quiet },
        () = cancellations.tripped() => {
            // Late resets (cancelled after the proxy started on them) that
            // `max_pending_accept_reset_streams` does not see: go away, let what is in
            // flight finish.
            tracing::warn!(
                cancelled = cancellations.cancelled(),
                "closing an h2 connection that cancels more requests than it completes"
            );
            H2Ending::WindDown(None)
        }
    };
    match ending {
        H2Ending::Quiet => {
            // hyper goes; the stream gets a GOAWAY naming the last stream hyper took.
            drop(connection);
            crate::h2_idle::go_away(&lease).await;
            Ok(())
        }
        H2Ending::WindDown(bound) => {
            connection.as_mut().graceful_shutdown();
            match bound {
                Some(bound) => tokio::time::timeout(bound, connection)
                    .await
                    .unwrap_or(Ok(())),
                None => connection.await,
            }
        }
    }
}

/// An agent's TLS session, terminated, and whether it agreed on HTTP/2.
struct Agreed {
    tls: tokio_rustls::server::TlsStream<TokioIo<hyper::upgrade::Upgraded>>,
    h2: bool,
}

/// The agent's TLS, terminated with a leaf minted for the tunnel's host once its ClientHello
/// names that host; `None` (the tunnel refused and audited, or the handshake failed) when not.
async fn handshake(
    plane: &Arc<DataPlane>,
    io: TokioIo<hyper::upgrade::Upgraded>,
    tunnel: &Arc<Tunnel>,
) -> Option<Agreed> {
    let refuse = |reason: String| {
        plane.refuse_tunnel(tunnel, "tls", reason);
        None
    };
    let limits = &plane.config.proxy;
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io);
    let start = match tokio::time::timeout(limits.tls_handshake_timeout, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => return refuse(format!("reading ClientHello: {e}")),
        Err(_) => return refuse("no ClientHello in time".into()),
    };
    // The SNI must name the CONNECT host before anything is minted.
    let sni = start.client_hello().server_name().map(str::to_owned);
    let name = match sni.as_deref().map(normalize_host) {
        Some(Ok(Host::Name(name))) if Host::Name(name.clone()) == tunnel.host => name,
        Some(Ok(other)) => return refuse(format!("SNI {other} differs from the CONNECT host")),
        Some(Err(e)) => return refuse(format!("SNI is invalid: {e}")),
        None => return refuse("ClientHello carries no SNI".into()),
    };
    let config = match plane.minter.server_config(&name) {
        Ok(c) => c,
        Err(e) => return refuse(format!("minting a leaf: {e}")),
    };
    match tokio::time::timeout(limits.tls_handshake_timeout, start.into_stream(config)).await {
        Ok(Ok(tls)) => {
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            Some(Agreed { tls, h2 })
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "agent TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("agent TLS handshake timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn of four arguments returns, read off its type.
    fn future_size<A, B, C, D, F: std::future::Future>(_: fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What an idle intercepted connection's task keeps: the serving future's state and
    /// the few handles around it, not the TLS session (1.2 KiB, boxed in the wire guard).
    /// A local borrowed before an await keeps its room in the state to the end of its
    /// scope; with the ALPN read off the session in `intercept`, the tunnel's future took
    /// 2.2 KiB here (976 bytes without).
    #[test]
    fn an_intercepted_connections_task_keeps_no_tls_session() {
        let session = std::mem::size_of::<
            tokio_rustls::server::TlsStream<TokioIo<hyper::upgrade::Upgraded>>,
        >();
        let tunnel = future_size(serve_tunnel);
        assert!(
            tunnel < session,
            "the tunnel's future takes {tunnel} bytes, room for a TLS session ({session})"
        );
    }
}
