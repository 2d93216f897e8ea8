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
//! request (`ostiary.duration_us`), each phase of the pipeline it reached
//! (`ostiary.phase.<phase>_us`: authenticate, recognise, decide, inject, forward — to the
//! upstream's response head — and reply) and each tier check
//! (`ostiary.check.<name>.duration_us`).
//!
//! With `propagate = true` the trace context goes upstream (W3C Trace Context): a request
//! carrying a well-formed `traceparent` continues the agent's trace, its span the agent's
//! span's child; any other starts a trace. Either way the request leaves with a
//! `traceparent` naming the proxy's span, so the upstream's spans hang under it. The agent's
//! header is replaced, never passed on as it came (it could name any span).
//!
//! Spans are batched and sent off the request path by the SDK's own thread; the request
//! never waits for the collector, and a collector that is down costs dropped spans (counted
//! by the SDK), never a refused request — the audit trail, not telemetry, is the record that
//! must not be lost. The exporter sends with the proxy's reqwest client on the proxy's
//! runtime ([`Bridge`]).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::trace::{
    Span, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, Sampler,
    SdkTracerProvider,
};
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
    /// Send the trace context upstream (`traceparent`), continuing the agent's trace when
    /// it sent one: the upstream's spans then hang under the proxy's.
    pub propagate: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "ostiary".into(),
            export_interval: Duration::from_secs(5),
            propagate: false,
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
        if self.propagate && self.otlp_endpoint.is_none() {
            return Err(
                "telemetry.propagate names spans that exist only with telemetry.otlp_endpoint"
                    .into(),
            );
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
            // Every decision is a span, whatever an agent's `traceparent` says of sampling.
            .with_sampler(Sampler::AlwaysOn)
            .with_id_generator(Chosen)
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
        let builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes(record));
        // The ids the upstream was told, when the context was propagated.
        let parent = match record.trace {
            Some(trace) => {
                CHOSEN.set(Some((
                    TraceId::from_bytes(trace.trace_id),
                    SpanId::from_bytes(trace.span_id),
                )));
                match trace.parent {
                    Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
                        TraceId::from_bytes(trace.trace_id),
                        SpanId::from_bytes(parent),
                        TraceFlags::SAMPLED,
                        true,
                        TraceState::default(),
                    )),
                    None => Context::new(),
                }
            }
            None => Context::new(),
        };
        let mut span = self.tracer.build_with_context(builder, &parent);
        CHOSEN.set(None);
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
    text("ostiary.policy_version", &r.policy_version);
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
    for (phase, took) in r.phases.iter() {
        kv.push(KeyValue::new(
            format!("ostiary.phase.{}_us", phase.name()),
            i64::from(took),
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

/// W3C Trace Context's request header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// A request's place in a trace: the trace, the proxy's span and, when the agent sent a
/// `traceparent`, the agent's span it is the child of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
}

impl TraceContext {
    /// The context of a request going upstream with `headers`: the agent's trace continued
    /// when it sent exactly one well-formed `traceparent`, a new one otherwise; the header
    /// set to name the proxy's span (replacing the agent's).
    pub fn propagate(headers: &mut HeaderMap) -> Self {
        let mut sent = headers.get_all(&TRACEPARENT).iter();
        let incoming = match (sent.next(), sent.next()) {
            (Some(one), None) => one.to_str().ok().and_then(parse_traceparent),
            _ => None,
        };
        let random = RandomIdGenerator::default();
        let trace = Self {
            trace_id: incoming
                .map(|(trace, _)| trace)
                .unwrap_or_else(|| random.new_trace_id().to_bytes()),
            span_id: random.new_span_id().to_bytes(),
            parent: incoming.map(|(_, span)| span),
        };
        headers.insert(TRACEPARENT, trace.traceparent());
        trace
    }

    /// `00-<trace>-<span>-01`: version 0, sampled (every decision is a span).
    pub fn traceparent(&self) -> HeaderValue {
        let text = format!(
            "00-{}-{}-01",
            hex::encode(self.trace_id),
            hex::encode(self.span_id)
        );
        HeaderValue::from_str(&text).expect("hex digits and dashes are a valid header value")
    }
}

/// The trace and parent span of a `traceparent` value (W3C Trace Context level 1): lowercase
/// hex, neither id all zeros, version `ff` refused, version 00 exactly 55 characters and a
/// later version at least that with a `-` after.
fn parse_traceparent(text: &str) -> Option<([u8; 16], [u8; 8])> {
    let bytes = text.as_bytes();
    let lower_hex = |s: &[u8]| {
        s.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let (version, trace, span, flags) =
        (&bytes[..2], &bytes[3..35], &bytes[36..52], &bytes[53..55]);
    if !(lower_hex(version) && lower_hex(trace) && lower_hex(span) && lower_hex(flags))
        || version == b"ff"
    {
        return None;
    }
    if (version == b"00" && bytes.len() != 55) || (bytes.len() > 55 && bytes[55] != b'-') {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex::decode_to_slice(trace, &mut trace_id).ok()?;
    hex::decode_to_slice(span, &mut span_id).ok()?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some((trace_id, span_id))
}

thread_local! {
    /// The ids the next span built on this thread takes ([`Spans::record`] sets them for
    /// the one span it builds, then clears them): the SDK asks its id generator for every
    /// span's ids and takes none from the span's builder.
    static CHOSEN: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// The provider's id generator: the chosen ids when there are some, random ones otherwise.
#[derive(Debug)]
struct Chosen;

impl IdGenerator for Chosen {
    fn new_trace_id(&self) -> TraceId {
        CHOSEN
            .get()
            .map_or_else(|| RandomIdGenerator::default().new_trace_id(), |(t, _)| t)
    }

    fn new_span_id(&self) -> SpanId {
        CHOSEN
            .get()
            .map_or_else(|| RandomIdGenerator::default().new_span_id(), |(_, s)| s)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_is_continued_and_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(SAMPLE));
        let trace = TraceContext::propagate(&mut headers);
        assert_eq!(
            hex::encode(trace.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            trace.parent.map(hex::encode).as_deref(),
            Some("00f067aa0ba902b7")
        );
        let sent = headers
            .get(TRACEPARENT)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            sent,
            format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
                hex::encode(trace.span_id)
            )
        );
        assert_ne!(hex::encode(trace.span_id), "00f067aa0ba902b7");
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
    }

    #[test]
    fn anything_else_starts_a_trace_of_its_own() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ];
        for text in bad {
            assert_eq!(parse_traceparent(text), None, "{text:?}");
        }
        // A later version may append fields after a dash.
        assert!(parse_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        )
        .is_some());
        // Two headers: neither is believed.
        let mut headers = HeaderMap::new();
        headers.append(TRACEPARENT, HeaderValue::from_static(SAMPLE));
        headers.append(TRACEPARENT, HeaderValue::from_static(SAMPLE));
        let trace = TraceContext::propagate(&mut headers);
        assert_eq!(trace.parent, None);
        assert_ne!(
            hex::encode(trace.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        // None at all: a new trace, still sent.
        let mut none = HeaderMap::new();
        let fresh = TraceContext::propagate(&mut none);
        assert_eq!(fresh.parent, None);
        assert!(parse_traceparent(none.get(TRACEPARENT).unwrap().to_str().unwrap()).is_some());
    }

    #[test]
    fn propagation_needs_a_collector() {
        let config = TelemetryConfig {
            propagate: true,
            ..Default::default()
        };
        assert!(config.validate().unwrap_err().contains("otlp_endpoint"));
    }
}
