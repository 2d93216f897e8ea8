//! The load harness: the same HTTPS requests sent directly to a local upstream and through
//! Ostiary (CONNECT + interception + Cedar + audit), measured in one run so the proxy's cost
//! is reported as a ratio against the direct baseline.
//!
//! `cargo run --release -p ostiary-benches --bin load -- [requests] [connections]`
//! Traffic stays on 127.0.0.1; the run is bounded by the request count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

#[derive(Clone)]
struct Route {
    /// Some((proxy address, token)) to go through Ostiary.
    proxy: Option<(std::net::SocketAddr, String)>,
    upstream: std::net::SocketAddr,
    host: String,
    tls: Arc<ClientConfig>,
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
        let req = hyper::Request::get("/echo")
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

struct Summary {
    p50: Duration,
    p99: Duration,
    rps: f64,
}

async fn run(route: Route, total: usize, connections: usize) -> Result<Summary> {
    let per = total / connections;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        tasks.push(tokio::spawn(worker(route.clone(), per)));
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

fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>> {
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

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let total: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let connections: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16);

    let upstream = Upstream::builder().start().await;
    let proxy = TestProxy::start(ProxySpec {
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("load").await;
    let host = upstream.host().to_owned();

    let direct = Route {
        proxy: None,
        upstream: upstream.addr(),
        host: host.clone(),
        tls: client_config(&upstream.ca_pem())?,
    };
    let through = Route {
        proxy: Some((proxy.proxy_addr, session.token.clone())),
        upstream: upstream.addr(),
        host,
        tls: client_config(&proxy.ca_pem)?,
    };
    // Warm both paths (leaf minting, pools) before measuring.
    run(direct.clone(), connections * 10, connections)
        .await
        .context("direct warm-up")?;
    run(through.clone(), connections * 10, connections)
        .await
        .context("proxy warm-up")?;

    let d = run(direct, total, connections).await.context("direct")?;
    let p = run(through, total, connections)
        .await
        .context("through ostiary")?;
    println!("requests={total} connections={connections} (HTTPS GET /echo, HTTP/1.1 keep-alive)");
    println!(
        "direct   p50 {:>9.1?}  p99 {:>9.1?}  {:>9.0} req/s",
        d.p50, d.p99, d.rps
    );
    println!(
        "ostiary  p50 {:>9.1?}  p99 {:>9.1?}  {:>9.0} req/s",
        p.p50, p.p99, p.rps
    );
    println!(
        "ratio    p50 {:.2}x  p99 {:.2}x  throughput {:.2}x",
        p.p50.as_secs_f64() / d.p50.as_secs_f64(),
        p.p99.as_secs_f64() / d.p99.as_secs_f64(),
        p.rps / d.rps
    );
    let metrics = proxy.shared.metrics.encode();
    println!(
        "decision latency from /metrics: p50 bucket <= {}",
        histogram_p50(&metrics, "ostiary_decision_seconds")
    );
    Ok(())
}

/// The upper bound of the bucket holding the median of a Prometheus histogram.
fn histogram_p50(text: &str, name: &str) -> String {
    let mut buckets = Vec::new();
    let mut count = 0.0;
    let bucket_prefix = format!("{name}_bucket{{le=\"");
    let count_prefix = format!("{name}_count ");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(&bucket_prefix) {
            if let Some((le, value)) = rest.split_once("\"} ") {
                buckets.push((le.to_owned(), value.trim().parse::<f64>().unwrap_or(0.0)));
            }
        } else if let Some(rest) = line.strip_prefix(&count_prefix) {
            count = rest.trim().parse().unwrap_or(0.0);
        }
    }
    buckets
        .into_iter()
        .find(|(_, cumulative)| *cumulative >= count / 2.0)
        .map(|(le, _)| format!("{le}s ({count} decisions)"))
        .unwrap_or_else(|| "n/a".into())
}
