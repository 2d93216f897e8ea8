//! The first end-to-end path: curl through the proxy to a TLS upstream, over HTTP/1.1 and
//! HTTP/2, allowed and denied, with audit records for both.

use ostiary_e2e::clients::curl;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;

const POLICY: &str = r#"
@id("allow-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_https_h1_and_h2_allowed_and_denied() {
    let upstream = Upstream::builder().start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICY.into(),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        ..Default::default()
    })
    .await;
    let session = proxy.session("demo").await;
    let env = proxy.client_env(&session);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    for version in ["--http1.1", "--http2"] {
        let ok = curl(
            &[
                version,
                "-w",
                "\n%{http_code} %{http_version}",
                &upstream.url("/echo"),
            ],
            &env,
        )
        .await;
        assert!(ok.success(), "{ok}");
        let last = ok.stdout.lines().last().unwrap().to_owned();
        let expected_version = if version == "--http2" { "2" } else { "1.1" };
        assert_eq!(last, format!("200 {expected_version}"), "{ok}");
        assert!(ok.stdout.contains("\"method\":\"GET\""), "{ok}");
    }

    let denied = curl(&["-i", "--http1.1", &upstream.url("/status/200")], &env).await;
    assert!(denied.stdout.contains("\nHTTP/1.1 403"), "{denied}");
    assert!(denied.stdout.contains("\"error\":\"denied\""), "{denied}");
    assert_eq!(
        upstream.count("/status/200"),
        0,
        "a denied request is never forwarded"
    );

    let records = proxy.audit().await;
    let http: Vec<_> = records.iter().filter(|r| r.kind == "http").collect();
    assert_eq!(http.len(), 3, "{records:#?}");
    assert_eq!(http[0].decision, "allow");
    assert_eq!(http[0].policies, vec!["allow-echo".to_owned()]);
    assert_eq!(http[2].decision, "deny");
    assert_eq!(http[2].error.as_deref(), Some("denied"));
}
