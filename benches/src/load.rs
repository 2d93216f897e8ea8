//! The load harness's client side, shared by the `load` and `fleet` bins: HTTPS GETs over
//! keep-alive connections, direct or through a proxy (CONNECT, then TLS with the proxy's
//! CA), with per-request latencies and throughput over the whole run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Where a worker's connection goes: `proxy` (address, session token) to go through
/// Ostiary, else straight to the upstream; `path` is what each request asks for.
#[derive(Clone)]
pub struct Route {
    pub proxy: Option<(std::net::SocketAddr, String)>,
    pub upstream: std::net::SocketAddr,
    pub host: String,
    pub path: String,
    pub tls: Arc<ClientConfig>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("proxy", &self.proxy.as_ref().map(|(addr, _)| addr))
            .field("upstream", &self.upstream)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

async fn open(route: &Route) -> Result<http1::SendRequest<Empty<Bytes>>> {
    let target = format!("{}:{}", route.host, route.upstream.port());
    let tcp = match &route.proxy {
        None => TcpStream::connect(route.upstream).await?,
        Some((addr, token)) => {
            let mut tcp = TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let connect = format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Bearer {token}\r\n\r\n"
            );
            tcp.write_all(connect.as_bytes()).await?;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                tcp.read_exact(&mut byte).await?;
                head.push(byte[0]);
            }
            if !head.starts_with(b"HTTP/1.1 200") {
                bail!("CONNECT refused: {}", String::from_utf8_lossy(&head));
            }
            tcp
        }
    };
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(route.host.clone())?;
    let tls = TlsConnector::from(route.tls.clone())
        .connect(name, tcp)
        .await?;
    let (sender, conn) = http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn worker(route: Route, requests: usize) -> Result<Vec<Duration>> {
    let mut sender = open(&route).await?;
    let mut latencies = Vec::with_capacity(requests);
    for _ in 0..requests {
        let req = hyper::Request::get(route.path.as_str())
            .header("host", &route.host)
            .body(Empty::new())?;
        let started = Instant::now();
        let response = sender.send_request(req).await?;
        let status = response.status();
        response.into_body().collect().await?;
        latencies.push(started.elapsed());
        if !status.is_success() {
            bail!("status {status}");
        }
    }
    Ok(latencies)
}

/// Latency percentiles and throughput of one run.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub p50: Duration,
    pub p99: Duration,
    pub rps: f64,
}

/// `total` requests over `connections` keep-alive connections along `route`.
pub async fn run(route: Route, total: usize, connections: usize) -> Result<Summary> {
    run_spread(&[route], total, connections).await
}

/// Like [`run`], connection `i` taking `routes[i % routes.len()]` (replicas behind a
/// round-robin balancer).
pub async fn run_spread(routes: &[Route], total: usize, connections: usize) -> Result<Summary> {
    let per = total / connections;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..connections {
        tasks.push(tokio::spawn(worker(routes[i % routes.len()].clone(), per)));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed();
    all.sort();
    let pick = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Ok(Summary {
        p50: pick(0.50),
        p99: pick(0.99),
        rps: all.len() as f64 / elapsed.as_secs_f64(),
    })
}

/// A client trusting `ca_pem` alone, HTTP/1.1.
pub fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
