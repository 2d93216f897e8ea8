//! The load harness: the same HTTPS requests sent directly to a local upstream and through
//! Ostiary (CONNECT + interception + Cedar + audit), measured in one run so the proxy's cost
//! is reported as a ratio against the direct baseline.
//!
//! `cargo run --release -p ostiary-benches --bin load -- [requests] [connections]`
//! Traffic stays on 127.0.0.1; the run is bounded by the request count.

use anyhow::{Context, Result};
use ostiary_benches::load::{client_config, run, Route};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;

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
        path: "/echo".into(),
        tls: client_config(&upstream.ca_pem())?,
    };
    let through = Route {
        proxy: Some((proxy.proxy_addr, session.token.clone())),
        upstream: upstream.addr(),
        host,
        path: "/echo".into(),
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
