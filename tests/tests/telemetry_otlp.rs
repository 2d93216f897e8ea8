//! OpenTelemetry spans of the decisions, received over OTLP/HTTP by a collector stand-in on
//! loopback: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`, decoded here with
//! the OpenTelemetry protocol's own message types.
//!
//! What it proves: with `[telemetry] otlp_endpoint` set, an allowed and a denied request
//! each arrive as a span named for the decision, carrying the session, the agent, the
//! decision, the determining policies, the request and the duration, under the configured
//! service name, and how long each phase it reached took; with `propagate`, the upstream
//! gets a `traceparent` naming the proxy's span, which continues the agent's trace when
//! the agent sent one (and only then has a parent); a bad endpoint is refused at start-up.

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

/// Every span received, as (service name, content type, span), once the spans of all `ids`
/// (request ids) are among them.
async fn collect(received: &Received, ids: &[String]) -> Vec<(String, String, Span)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
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
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans of {ids:?} not received; got {} spans",
            spans.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    let spans = collect(&received, &ids).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trace_context_goes_upstream_and_each_span_times_its_phases() {
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
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\nexport_interval = \"100ms\"\npropagate = true\n"
        ),
        ..Default::default()
    })
    .await;
    let session = proxy.session("otel-agent").await;
    let port = upstream.port();
    let agents_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let agents_span = "00f067aa0ba902b7";
    for (path, traceparent) in [
        (
            "/status/200",
            Some(format!("00-{agents_trace}-{agents_span}-01")),
        ),
        ("/status/201", None),
        (
            "/denied",
            Some(format!("00-{agents_trace}-{agents_span}-01")),
        ),
    ] {
        let extra = traceparent
            .map(|t| format!("traceparent: {t}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET http://api.example.test:{port}{path} HTTP/1.1\r\nHost: api.example.test:{port}\r\n{extra}{}Connection: close\r\n\r\n",
            auth_line(&session.token)
        );
        exchange(proxy.proxy_addr, request.as_bytes())
            .await
            .unwrap();
    }
    let records = proxy.audit().await;
    let id_of = |path: &str| {
        records
            .iter()
            .find(|r| r.path.as_deref() == Some(path))
            .unwrap_or_else(|| panic!("no record of {path}"))
            .request_id
            .clone()
    };
    let ids = [id_of("/status/200"), id_of("/status/201"), id_of("/denied")];
    let spans = collect(&received, &ids).await;
    let span = |id: &str| {
        spans
            .iter()
            .map(|(_, _, s)| s)
            .find(|s| text(s, "ostiary.request_id").as_deref() == Some(id))
            .unwrap()
    };
    let sent = |path: &str| {
        let seen = upstream.seen_path(path);
        assert_eq!(seen.len(), 1, "{path}: {seen:?}");
        let value = seen[0]
            .header("traceparent")
            .expect("a traceparent upstream")
            .to_owned();
        let parts: Vec<String> = value.split('-').map(str::to_owned).collect();
        assert_eq!(
            (parts.len(), parts[0].as_str(), parts[3].as_str()),
            (4, "00", "01"),
            "{value}"
        );
        (parts[1].clone(), parts[2].clone())
    };

    // Continued: the agent's trace, the proxy's own span, the agent's span its parent.
    let (trace, span_id) = sent("/status/200");
    assert_eq!(trace, agents_trace);
    assert_ne!(span_id, agents_span);
    let continued = span(&ids[0]);
    assert_eq!(hex::encode(&continued.trace_id), agents_trace);
    assert_eq!(hex::encode(&continued.span_id), span_id);
    assert_eq!(hex::encode(&continued.parent_span_id), agents_span);

    // Started: a trace of its own, a root span, told to the upstream all the same.
    let (trace, span_id) = sent("/status/201");
    assert_ne!(trace, agents_trace);
    let started = span(&ids[1]);
    assert_eq!(hex::encode(&started.trace_id), trace);
    assert_eq!(hex::encode(&started.span_id), span_id);
    assert!(started.parent_span_id.is_empty(), "{started:?}");

    // Every phase a request reached is timed; a denied one never reached inject or forward.
    let phases = |s: &Span| -> Vec<String> {
        s.attributes
            .iter()
            .filter(|kv| kv.key.starts_with("ostiary.phase."))
            .map(|kv| {
                assert!(
                    matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(AnyValue::IntValue(us)) if *us >= 0),
                    "{kv:?}"
                );
                kv.key.clone()
            })
            .collect()
    };
    assert_eq!(
        phases(continued),
        [
            "ostiary.phase.authenticate_us",
            "ostiary.phase.recognise_us",
            "ostiary.phase.decide_us",
            "ostiary.phase.inject_us",
            "ostiary.phase.forward_us",
            "ostiary.phase.reply_us"
        ]
    );
    assert_eq!(
        phases(span(&ids[2])),
        [
            "ostiary.phase.authenticate_us",
            "ostiary.phase.recognise_us",
            "ostiary.phase.decide_us"
        ]
    );
    assert!(upstream.seen_path("/denied").is_empty());
}
