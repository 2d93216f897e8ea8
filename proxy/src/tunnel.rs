//! Uninspected tunnels for `egress.tunnel` hosts: the ClientHello is read (not answered) to
//! check that its SNI names the CONNECT host, then bytes are relayed both ways to the
//! address the guard checked at CONNECT, until either side closes, the tunnel idles out,
//! the session ends (teardown, expiry) or its byte budget is spent.
//!
//! [`splice`] is the relay itself, shared with WebSocket upgrades: every byte it passes is
//! charged to the session's `max_bytes_sent` (agent → upstream) or `max_bytes_received`
//! (upstream → agent) before it is written, and the chunk that would pass a budget is cut
//! at the budget and the whole relay closed. A WebSocket's upstream-to-agent half is
//! rewritten on its way ([`crate::scrub::websocket`]): what is charged and written is
//! what the agent receives.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::classify::Tunnel;
use crate::egress::address::normalize_host;
use crate::guardrails::counted::Direction;
use crate::guardrails::meter::Meter;
use crate::lifecycle::StreamWatch;
use crate::plane::DataPlane;
use crate::scrub::websocket::FrameScrubber;

/// Largest ClientHello read before giving up (a real one is a few hundred bytes).
const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Relay a tunnel after the CONNECT was accepted.
pub async fn relay(
    plane: Arc<DataPlane>,
    mut agent: TokioIo<hyper::upgrade::Upgraded>,
    tunnel: Arc<Tunnel>,
    addrs: Vec<std::net::SocketAddr>,
) {
    let Some(watch) = plane.watch_stream(&tunnel.principal) else {
        return plane.refuse_tunnel(&tunnel, "tunnel", SESSION_OVER.into());
    };
    let limits = plane.config.proxy.clone();
    let hello = tokio::select! {
        read = tokio::time::timeout(limits.tls_handshake_timeout, read_client_hello(&mut agent)) => read,
        () = watch.ended() => return plane.refuse_tunnel(&tunnel, "tunnel", SESSION_OVER.into()),
    };
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(reason)) => return plane.refuse_tunnel(&tunnel, "tunnel", reason),
        Err(_) => return plane.refuse_tunnel(&tunnel, "tunnel", "no ClientHello in time".into()),
    };
    match hello.sni.as_deref().map(normalize_host) {
        Some(Ok(host)) if host == tunnel.host => {}
        Some(Ok(other)) => {
            return plane.refuse_tunnel(
                &tunnel,
                "tunnel",
                format!("SNI {other} differs from the CONNECT host"),
            )
        }
        Some(Err(e)) => {
            return plane.refuse_tunnel(&tunnel, "tunnel", format!("SNI is invalid: {e}"))
        }
        None => return plane.refuse_tunnel(&tunnel, "tunnel", "ClientHello carries no SNI".into()),
    }
    let (mut upstream, _addr) = match plane.guard.dial_checked(&addrs).await {
        Ok(dialed) => dialed,
        Err(e) => return plane.refuse_tunnel(&tunnel, "tunnel", e.to_string()),
    };
    // The ClientHello is the first thing the session sends upstream: it counts too.
    let session = tunnel.principal.session_id.as_str();
    let n = hello.bytes.len() as u64;
    let fits = plane
        .guardrails
        .meter
        .admit_bytes(session, Direction::Sent, n);
    if fits < n {
        let ended = Ended::Budget(Direction::Sent);
        return plane.record_cut(&tunnel, "tunnel", ended);
    }
    if let Err(e) = upstream.write_all(&hello.bytes).await {
        return tracing::debug!(error = %e, "tunnel upstream write failed");
    }
    let bounds = Bounds {
        watch,
        meter: plane.guardrails.meter.clone(),
        session: session.to_owned(),
        idle: Some(limits.tunnel_idle_timeout),
    };
    let ended = splice(agent, upstream, bounds).await;
    if ended.is_cut() {
        plane.record_cut(&tunnel, "tunnel", ended);
    }
}

/// Why a refused tunnel's session is over.
const SESSION_OVER: &str = "the session is not active (revoked or expired)";

/// What bounds a relay: its session's life and byte budgets, and (tunnels) idleness.
#[derive(Debug)]
pub struct Bounds {
    pub watch: StreamWatch,
    pub meter: Arc<Meter>,
    pub session: String,
    /// Closed once both directions were quiet this long; `None`: never for idleness.
    pub idle: Option<Duration>,
}

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A side closed (or failed): the relay's own end.
    Closed,
    /// Both directions were quiet for the relay's idle bound: the proxy closed it.
    Idle(Duration),
    /// The session was torn down or expired.
    SessionOver,
    /// The session's byte budget that way is spent.
    Budget(Direction),
}

impl Ended {
    /// The relay was cut by the proxy rather than ended by its peers.
    pub fn is_cut(self) -> bool {
        self != Ended::Closed
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Closed => f.write_str("closed"),
            Ended::Idle(idle) => write!(f, "closed: both ways were quiet for {idle:?}"),
            Ended::SessionOver => {
                f.write_str("closed at teardown: the session was revoked or expired")
            }
            Ended::Budget(Direction::Sent) => {
                f.write_str("cut: the session's max_bytes_sent is spent")
            }
            Ended::Budget(Direction::Received) => {
                f.write_str("cut: the session's max_bytes_received is spent")
            }
        }
    }
}

/// Relay bytes between `agent` and `upstream` within `bounds`; both are dropped (closed)
/// when this returns.
pub async fn splice<A, U>(agent: A, upstream: U, bounds: Bounds) -> Ended
where
    A: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    splice_rewriting(agent, upstream, bounds, None).await
}

/// [`splice`], with what the upstream sends rewritten by `received` before the agent has
/// it (a WebSocket's frames, scrubbed).
pub async fn splice_rewriting<A, U>(
    agent: A,
    upstream: U,
    bounds: Bounds,
    received: Option<FrameScrubber>,
) -> Ended
where
    A: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (agent_read, agent_write) = tokio::io::split(agent);
    let (up_read, up_write) = tokio::io::split(upstream);
    let stop = CancellationToken::new();
    let way = |direction| Way {
        direction,
        meter: &bounds.meter,
        session: &bounds.session,
        stop: &stop,
        activity: Arc::new(AtomicU64::new(0)),
        started: Instant::now(),
        idle: bounds.idle,
    };
    let rewrite = received;
    let (sent, received) = (way(Direction::Sent), way(Direction::Received));
    // Idleness is of the tunnel, not of one direction: both share the last activity.
    let received = Way {
        activity: sent.activity.clone(),
        started: sent.started,
        ..received
    };
    let pumps = async {
        let (a, b) = tokio::join!(
            pump(agent_read, up_write, sent, None),
            pump(up_read, agent_write, received, rewrite)
        );
        if a.is_cut() {
            a
        } else {
            b
        }
    };
    tokio::select! {
        ended = pumps => ended,
        () = bounds.watch.ended() => Ended::SessionOver,
    }
}

/// One direction of a relay.
struct Way<'a> {
    direction: Direction,
    meter: &'a Meter,
    session: &'a str,
    /// Cancelled when either direction cuts the relay, so the other stops too.
    stop: &'a CancellationToken,
    activity: Arc<AtomicU64>,
    started: Instant,
    idle: Option<Duration>,
}

/// Copy one direction (through `rewrite`, if any) until its reader closes (then
/// half-close the writer), both directions have been quiet for `idle`, the budget is
/// spent, the rewrite refuses what it read, or the other direction cut.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    way: Way<'_>,
    mut rewrite: Option<FrameScrubber>,
) -> Ended
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    let mut rewritten = Vec::new();
    let ended = loop {
        let step = async {
            let read = match way.idle {
                Some(idle) => match tokio::time::timeout(idle, from.read(&mut buf)).await {
                    Ok(read) => read,
                    Err(_) => {
                        let last = Duration::from_millis(way.activity.load(Ordering::Relaxed));
                        return if way.started.elapsed().saturating_sub(last) >= idle {
                            Step::Done(Ended::Idle(idle))
                        } else {
                            Step::Again
                        };
                    }
                },
                None => from.read(&mut buf).await,
            };
            let n = match read {
                Ok(0) | Err(_) => return Step::Done(Ended::Closed),
                Ok(n) => n,
            };
            way.activity
                .store(way.started.elapsed().as_millis() as u64, Ordering::Relaxed);
            let bytes = match &mut rewrite {
                None => &buf[..n],
                Some(rewrite) => {
                    rewritten.clear();
                    if let Err(e) = rewrite.feed(&buf[..n], &mut rewritten) {
                        tracing::debug!(error = %e, "relay closed");
                        return Step::Done(Ended::Closed);
                    }
                    &rewritten[..]
                }
            };
            let n = bytes.len();
            let fits = way.meter.admit_bytes(way.session, way.direction, n as u64) as usize;
            if to.write_all(&bytes[..fits]).await.is_err() {
                return Step::Done(Ended::Closed);
            }
            if fits < n {
                let _ = to.flush().await;
                return Step::Done(Ended::Budget(way.direction));
            }
            Step::Again
        };
        tokio::select! {
            step = step => match step {
                Step::Again => continue,
                Step::Done(ended) => break ended,
            },
            () = way.stop.cancelled() => return Ended::Closed,
        }
    };
    if ended.is_cut() {
        way.stop.cancel();
    } else {
        let _ = to.shutdown().await;
    }
    ended
}

enum Step {
    Again,
    Done(Ended),
}

struct ClientHello {
    bytes: Vec<u8>,
    sni: Option<String>,
}

/// Read until rustls has parsed a whole ClientHello; keep every byte to replay upstream.
async fn read_client_hello<R: AsyncRead + Unpin>(io: &mut R) -> Result<ClientHello, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = io
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading ClientHello: {e}"))?;
        if n == 0 {
            return Err("connection closed before a ClientHello".into());
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() > MAX_CLIENT_HELLO {
            return Err("ClientHello too large".into());
        }
        acceptor
            .read_tls(&mut &chunk[..n])
            .map_err(|e| format!("not TLS: {e}"))?;
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let sni = accepted.client_hello().server_name().map(str::to_owned);
                return Ok(ClientHello { bytes, sni });
            }
            Ok(None) => continue,
            Err((e, _alert)) => return Err(format!("not a TLS ClientHello: {e}")),
        }
    }
}
