//! Phase `forward`: send the request upstream over a pooled connection and stream the
//! response back. Dials go through the egress guard inside [`UpstreamConnector`].
//!
//! Two pools: the general one negotiates `h2` or `http/1.1` by ALPN; WebSocket handshakes use
//! an HTTP/1.1-only pool, because an upgrade cannot ride an h2 connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::ClientConfig;

use crate::body::ProxyBody;
use crate::connector::{UpstreamConnector, UpstreamTlsFailure};
use crate::egress::{EgressError, Guard};
use crate::error::ProxyError;
use crate::metrics::Metrics;

/// The pooled upstream clients.
#[derive(Debug, Clone)]
pub struct Upstreams {
    general: Client<UpstreamConnector, ProxyBody>,
    upgrade: Client<UpstreamConnector, ProxyBody>,
    response_timeout: Duration,
}

impl Upstreams {
    /// Build the pools over `guard`, with `tls` for https upstreams.
    pub fn new(guard: Arc<Guard>, tls: Arc<ClientConfig>, response_timeout: Duration) -> Self {
        let mut h1_only = (*tls).clone();
        h1_only.alpn_protocols = vec![b"http/1.1".to_vec()];
        let build = |tls: Arc<ClientConfig>| {
            Client::builder(TokioExecutor::new())
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(UpstreamConnector::new(guard.clone(), tls))
        };
        Self {
            general: build(tls.clone()),
            upgrade: build(Arc::new(h1_only)),
            response_timeout,
        }
    }

    /// Send a prepared request; the response head within the configured timeout.
    pub async fn send(
        &self,
        req: Request<ProxyBody>,
        upgrade: bool,
        metrics: &Metrics,
    ) -> Result<Response<Incoming>, ProxyError> {
        let client = if upgrade {
            &self.upgrade
        } else {
            &self.general
        };
        let started = Instant::now();
        let result = tokio::time::timeout(self.response_timeout, client.request(req)).await;
        metrics
            .upstream_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(classify_error(&e)),
            Err(_) => Err(ProxyError::UpstreamTimeout {
                reason: format!(
                    "no response head within {}",
                    humantime::format_duration(self.response_timeout)
                ),
            }),
        }
    }
}

/// Map a client error to the refusal it stands for, keeping the reason.
fn classify_error(err: &hyper_util::client::legacy::Error) -> ProxyError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(egress) = e.downcast_ref::<EgressError>() {
            return match egress {
                EgressError::Blocked { address, reason } => ProxyError::DestinationBlocked {
                    address: address.clone(),
                    reason: reason.clone(),
                },
                EgressError::Timeout { .. } => ProxyError::UpstreamTimeout {
                    reason: egress.to_string(),
                },
                other => ProxyError::Upstream {
                    reason: other.to_string(),
                },
            };
        }
        if let Some(tls) = e.downcast_ref::<UpstreamTlsFailure>() {
            return ProxyError::Upstream {
                reason: tls.to_string(),
            };
        }
        source = e.source();
    }
    let mut reason = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        reason.push_str(": ");
        reason.push_str(&e.to_string());
        source = e.source();
    }
    ProxyError::Upstream { reason }
}
