//! Uninspected tunnels for `egress.tunnel` hosts: the ClientHello is read (not answered) to
//! check that its SNI names the CONNECT host, then bytes are relayed both ways to the
//! address the guard checked at CONNECT, until either side closes or the tunnel idles out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::classify::Tunnel;
use crate::egress::address::normalize_host;
use crate::server::Shared;

/// Largest ClientHello read before giving up (a real one is a few hundred bytes).
const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Relay a tunnel after the CONNECT was accepted.
pub async fn relay(
    shared: Arc<Shared>,
    mut agent: TokioIo<hyper::upgrade::Upgraded>,
    tunnel: Arc<Tunnel>,
    addrs: Vec<std::net::SocketAddr>,
) {
    let limits = shared.config.proxy.clone();
    let hello =
        match tokio::time::timeout(limits.tls_handshake_timeout, read_client_hello(&mut agent))
            .await
        {
            Ok(Ok(hello)) => hello,
            Ok(Err(reason)) => return shared.refuse_tunnel(&tunnel, "tunnel", reason),
            Err(_) => {
                return shared.refuse_tunnel(&tunnel, "tunnel", "no ClientHello in time".into())
            }
        };
    match hello.sni.as_deref().map(normalize_host) {
        Some(Ok(host)) if host == tunnel.host => {}
        Some(Ok(other)) => {
            return shared.refuse_tunnel(
                &tunnel,
                "tunnel",
                format!("SNI {other} differs from the CONNECT host"),
            )
        }
        Some(Err(e)) => {
            return shared.refuse_tunnel(&tunnel, "tunnel", format!("SNI is invalid: {e}"))
        }
        None => {
            return shared.refuse_tunnel(&tunnel, "tunnel", "ClientHello carries no SNI".into())
        }
    }
    let (mut upstream, _addr) = match shared.guard.dial_checked(&addrs).await {
        Ok(dialed) => dialed,
        Err(e) => return shared.refuse_tunnel(&tunnel, "tunnel", e.to_string()),
    };
    if let Err(e) = upstream.write_all(&hello.bytes).await {
        return tracing::debug!(error = %e, "tunnel upstream write failed");
    }
    let (agent_read, agent_write) = tokio::io::split(agent);
    let (up_read, up_write) = upstream.into_split();
    let activity = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let idle = limits.tunnel_idle_timeout;
    tokio::join!(
        pump(agent_read, up_write, activity.clone(), started, idle),
        pump(up_read, agent_write, activity, started, idle),
    );
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

/// Copy one direction; stop when both directions have been quiet for `idle`.
async fn pump<R, W>(
    mut from: R,
    mut to: W,
    activity: Arc<AtomicU64>,
    started: Instant,
    idle: Duration,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(idle, from.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            Err(_) => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= idle {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
