//! OpenTelemetry: every decision as a span, exported over OTLP/HTTP (protobuf, `POST
//! {otlp_endpoint}/v1/traces`) when `[telemetry] otlp_endpoint` is set.
//!
//! A span is made from the decision's audit record as it is queued ([`crate::audit`]): every
//! record the trail gets — allowed, refused, held, failed, a tool call of a batch — is also a
//! span, and a span never says more than its record (no secret, no argument value, no
//! query). Its attributes: `ostiary.request_id`, `ostiary.session`, `ostiary.agent`,
//! `ostiary.tenant`, `ostiary.kind`, `ostiary.decision`, `ostiary.policies`, `ostiary.tool`,
//! `ostiary.tier`, `ostiary.approval`, `ostiary.error`, the HTTP request and response
//! (`http.request.method`, `server.address`, `server.port`, `url.path`,
//! `http.response.status_code`), and the latency of the phases the record times: the whole
//! request (`ostiary.duration_us`) and each tier check (`ostiary.check.<name>.duration_us`).
//!
//! Spans are batched and sent off the request path by the SDK's own thread; the request
//! never waits for the collector, and a collector that is down costs dropped spans (counted
//! by the SDK), never a refused request — the audit trail, not telemetry, is the record that
//! must not be lost. The exporter sends with the proxy's reqwest client on the proxy's
//! runtime ([`Bridge`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use opentelemetry::trace::{Span, SpanKind, Status, Tracer, TracerProvider as _};
use opentelemetry::{KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde::Deserialize;

use crate::audit::AuditRecord;

/// `[telemetry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://collector:4318`); spans go to `/v1/traces` under
    /// it. Unset: no spans.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans.
    pub service_name: String,
    /// The longest a span waits in the batch before it is sent.
    #[serde(deserialize_with = "crate::config::duration")]
    pub export_interval: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "ostiary".into(),
            export_interval: Duration::from_secs(5),
        }
    }
}

impl TelemetryConfig {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let url = url::Url::parse(endpoint)
                .map_err(|e| format!("telemetry.otlp_endpoint {endpoint:?}: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(format!(
                    "telemetry.otlp_endpoint {endpoint:?} must be an http(s) URL with a host"
                ));
            }
        }
        if self.export_interval.is_zero() {
            return Err("telemetry.export_interval must be more than 0".into());
        }
        Ok(())
    }

    /// `{otlp_endpoint}/v1/traces`.
    fn traces_url(&self) -> Option<String> {
        self.otlp_endpoint
            .as_deref()
            .map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
    }
}

/// Why spans cannot be exported as configured (start-up refuses it).
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// The span exporter: one span per audit record.
#[derive(Debug)]
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

impl Spans {
    /// The exporter `config` asks for, on the current runtime; `None` when no endpoint is
    /// set.
    pub fn start(config: &TelemetryConfig) -> Result<Option<Arc<Self>>, TelemetryError> {
        let Some(url) = config.traces_url() else {
            return Ok(None);
        };
        let bridge = Bridge {
            // The collector is the operator's, reached directly: never through a proxy.
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| TelemetryError(e.to_string()))?,
            runtime: tokio::runtime::Handle::try_current()
                .map_err(|e| TelemetryError(format!("no runtime to export on: {e}")))?,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_http_client(bridge)
            .build()
            .map_err(|e| TelemetryError(e.to_string()))?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(config.export_interval)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("ostiary");
        Ok(Some(Arc::new(Self { provider, tracer })))
    }

    /// `record` as a span that ended now and lasted the record's duration.
    pub fn record(&self, record: &AuditRecord) {
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_micros(record.duration_us))
            .unwrap_or(end);
        let name = match &record.tool {
            Some(tool) => format!("ostiary {} {tool}", record.kind),
            None => format!("ostiary {}", record.kind),
        };
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes(record))
            .start(&self.tracer);
        if matches!(record.decision.as_str(), "error") {
            span.set_status(Status::error(record.error.clone().unwrap_or_default()));
        }
        span.end_with_timestamp(end);
    }

    /// Send what is batched and stop (at shutdown).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "telemetry: spans not all exported at shutdown");
        }
    }
}

fn attributes(r: &AuditRecord) -> Vec<KeyValue> {
    let mut kv = vec![
        KeyValue::new("ostiary.request_id", r.request_id.clone()),
        KeyValue::new("ostiary.kind", r.kind.clone()),
        KeyValue::new("ostiary.decision", r.decision.clone()),
        KeyValue::new("ostiary.duration_us", r.duration_us as i64),
    ];
    let mut text = |key: &'static str, value: &Option<String>| {
        if let Some(value) = value {
            kv.push(KeyValue::new(key, value.clone()));
        }
    };
    text("ostiary.session", &r.session);
    text("ostiary.agent", &r.agent);
    text("ostiary.tenant", &r.tenant);
    text("ostiary.tool", &r.tool);
    text("ostiary.tier", &r.tier);
    text("ostiary.approval", &r.approval);
    text("ostiary.error", &r.error);
    text("ostiary.rpc_method", &r.rpc_method);
    text("http.request.method", &r.method);
    text("server.address", &r.host);
    text("url.path", &r.path);
    if let Some(port) = r.port {
        kv.push(KeyValue::new("server.port", i64::from(port)));
    }
    if let Some(status) = r.status {
        kv.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    if !r.policies.is_empty() {
        kv.push(KeyValue::new(
            "ostiary.policies",
            Value::Array(
                r.policies
                    .iter()
                    .map(|p| StringValue::from(p.clone()))
                    .collect::<Vec<_>>()
                    .into(),
            ),
        ));
    }
    for ran in &r.checks {
        kv.push(KeyValue::new(
            format!("ostiary.check.{}.duration_us", ran.check),
            ran.duration_us as i64,
        ));
    }
    kv
}

/// The exporter's HTTP client: the SDK calls it from its own thread, outside any runtime,
/// so each export is run on the proxy's runtime and awaited from there.
#[derive(Debug)]
struct Bridge {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Bridge {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let sent = self.runtime.spawn(async move {
            let mut builder = client.request(parts.method, parts.uri.to_string());
            for (name, value) in &parts.headers {
                builder = builder.header(name, value);
            }
            let answer = builder.body(body).send().await?;
            let status = answer.status();
            let headers = answer.headers().clone();
            let bytes = answer.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, bytes))
        });
        let (status, headers, bytes) = sent.await??;
        let mut response = http::Response::new(bytes);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
