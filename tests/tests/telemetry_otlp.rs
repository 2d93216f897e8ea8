//! OpenTelemetry spans of the decisions, received over OTLP/HTTP by a collector stand-in on
//! loopback: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`, decoded here with
//! the OpenTelemetry protocol's own message types.
//!
//! What it proves: with `[telemetry] otlp_endpoint` set, an allowed and a denied request
//! each arrive as a span named for the decision, carrying the session, the agent, the
//! decision, the determining policies, the request and the duration, under the configured
//! service name; a bad endpoint is refused at start-up.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{auth_line, exchange};
use ostiary_e2e::upstream::Upstream;
use prost::Message;

/// What the stand-in received: each POST's path, content type and decoded body.
type Received = Arc<Mutex<Vec<(String, String, ExportTraceServiceRequest)>>>;

/// A collector on 127.0.0.1 that takes any POST and answers 200 (an empty
/// `ExportTraceServiceResponse` is zero bytes).
async fn collector() -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let seen = received.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let kind = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let body = req.into_body().collect().await?.to_bytes();
                        let decoded = ExportTraceServiceRequest::decode(body).unwrap_or_default();
                        seen.lock().unwrap().push((path, kind, decoded));
                        let mut answer = Response::new(Full::new(Bytes::new()));
                        answer.headers_mut().insert(
                            "content-type",
                            http::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, hyper::Error>(answer)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, received)
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attr(span, key)? {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

const POLICY: &str = r#"
@id("allow-status")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path like "/status/*" };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_arrives_as_a_span_over_otlp_http() {
    let (endpoint, received) = collector().await;
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICY.into(),
        names: vec!["api.example.test".into()],
        ports: vec![upstream.port()],
        extra_toml: format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}/\"\nservice_name = \"ostiary-e2e\"\nexport_interval = \"100ms\"\n"
        ),
        ..Default::default()
    })
    .await;
    let session = proxy.session("otel-agent").await;
    let port = upstream.port();
    for path in ["/status/204", "/denied"] {
        let url = format!("http://api.example.test:{port}{path}");
        let request = format!(
            "GET {url} HTTP/1.1\r\nHost: api.example.test:{port}\r\n{}Connection: close\r\n\r\n",
            auth_line(&session.token)
        );
        exchange(proxy.proxy_addr, request.as_bytes())
            .await
            .unwrap();
    }
    // The request ids, from the audit trail: each record is a span.
    let records = proxy.audit().await;
    let ids: Vec<String> = ["/status/204", "/denied"]
        .iter()
        .map(|path| {
            records
                .iter()
                .find(|r| r.path.as_deref() == Some(*path))
                .unwrap_or_else(|| panic!("no record of {path}: {records:#?}"))
                .request_id
                .clone()
        })
        .collect();

    // Batched: within a few export intervals both spans are there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans: Vec<(String, String, Span)> = received
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(path, kind, req)| {
                req.resource_spans.iter().flat_map(move |rs| {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.clone())
                        .and_then(|v| v.value)
                        .map(|v| match v {
                            AnyValue::StringValue(s) => s,
                            _ => String::new(),
                        })
                        .unwrap_or_default();
                    assert_eq!(path, "/v1/traces");
                    assert_eq!(kind, "application/x-protobuf");
                    rs.scope_spans
                        .iter()
                        .flat_map(|ss| ss.spans.iter().cloned())
                        .map(move |s| (service.clone(), kind.clone(), s))
                })
            })
            .collect();
        let found = ids.iter().all(|id| {
            spans
                .iter()
                .any(|(_, _, s)| text(s, "ostiary.request_id").as_deref() == Some(id))
        });
        if found {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans of {ids:?} not received; got {} spans",
            spans.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let of = |id: &str| {
        spans
            .iter()
            .find(|(_, _, s)| text(s, "ostiary.request_id").as_deref() == Some(id))
            .unwrap()
    };
    let (service, _, allowed) = of(&ids[0]);
    assert_eq!(service, "ostiary-e2e");
    assert_eq!(allowed.name, "ostiary http");
    assert_eq!(text(allowed, "ostiary.decision").as_deref(), Some("allow"));
    assert_eq!(
        text(allowed, "ostiary.session").as_deref(),
        Some(session.session_id.as_str())
    );
    assert_eq!(
        text(allowed, "ostiary.agent").as_deref(),
        Some("otel-agent")
    );
    assert_eq!(text(allowed, "url.path").as_deref(), Some("/status/204"));
    assert_eq!(
        text(allowed, "server.address").as_deref(),
        Some("api.example.test")
    );
    assert!(
        matches!(
            attr(allowed, "http.response.status_code"),
            Some(AnyValue::IntValue(204))
        ),
        "{allowed:?}"
    );
    match attr(allowed, "ostiary.policies") {
        Some(AnyValue::ArrayValue(list)) => {
            let names: Vec<_> = list
                .values
                .iter()
                .filter_map(|v| match &v.value {
                    Some(AnyValue::StringValue(s)) => Some(s.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(names, ["allow-status"], "{allowed:?}");
        }
        other => panic!("ostiary.policies: {other:?}"),
    }
    assert!(allowed.end_time_unix_nano >= allowed.start_time_unix_nano);
    assert!(
        matches!(attr(allowed, "ostiary.duration_us"), Some(AnyValue::IntValue(us)) if *us > 0),
        "{allowed:?}"
    );
    let (_, _, denied) = of(&ids[1]);
    assert_eq!(text(denied, "ostiary.decision").as_deref(), Some("deny"));
    assert_eq!(text(denied, "ostiary.error").as_deref(), Some("denied"));
    // The query never travels, in a span as in a record.
    assert!(spans.iter().all(|(_, _, s)| s
        .attributes
        .iter()
        .all(|kv| kv.key != "url.query" && kv.key != "url.full")));
}

#[tokio::test]
async fn an_endpoint_that_is_not_an_http_url_is_refused_at_start_up() {
    for bad in ["collector:4318", "ftp://collector", "http://"] {
        let toml = format!("[telemetry]\notlp_endpoint = \"{bad}\"\n");
        let e = ostiary::config::Config::from_toml(&toml, std::path::Path::new("t")).unwrap_err();
        assert!(e.to_string().contains("otlp_endpoint"), "{bad}: {e}");
    }
    let toml = "[telemetry]\nexport_interval = \"0s\"\n";
    assert!(ostiary::config::Config::from_toml(toml, std::path::Path::new("t")).is_err());
}
