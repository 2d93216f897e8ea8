//! Prometheus metrics (`GET /metrics`): requests by decision, decision latency (Cedar
//! evaluation only), upstream latency (time to the response head).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `http`, `connect`, `tunnel`, `tls`.
    pub kind: String,
    /// `allow`, `deny`, `error`, `cancel`.
    pub decision: String,
}

/// All metrics of one proxy.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub decision_seconds: Histogram,
    pub upstream_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ostiary");
        let requests = Family::<RequestLabels, Counter>::default();
        // 1 µs .. ~8 ms: Cedar decisions live in microseconds.
        let decision_seconds = Histogram::new(exponential_buckets(1e-6, 2.0, 14));
        // 100 µs .. ~100 s.
        let upstream_seconds = Histogram::new(exponential_buckets(1e-4, 2.0, 21));
        registry.register(
            "requests",
            "Requests handled, by kind and decision",
            requests.clone(),
        );
        registry.register(
            "decision_seconds",
            "Time spent in policy evaluation per decision",
            decision_seconds.clone(),
        );
        registry.register(
            "upstream_seconds",
            "Time from dialing an upstream to its response head",
            upstream_seconds.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            requests,
            decision_seconds,
            upstream_seconds,
        }
    }
}

impl Metrics {
    /// Count one finished request.
    pub fn count(&self, kind: &str, decision: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                kind: kind.to_owned(),
                decision: decision.to_owned(),
            })
            .inc();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}
