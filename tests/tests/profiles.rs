//! Sandbox profiles as policy sees them, the proxy's Unix socket (a sandbox's one way out),
//! and the report a run leaves when its session ends.

use std::os::unix::fs::PermissionsExt;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use serde_json::{json, Value};

/// Plain http is allowed only to sessions that run under the `default` profile; tool-less.
const POLICIES: &str = r#"
@id("sandboxed-only")
permit (principal, action == Ostiary::Action::"http", resource)
when { context.session.profile == "default" };
"#;

async fn rig() -> (Upstream, TestProxy) {
    let upstream = Upstream::builder().tls(false).start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICIES.into(),
        ports: vec![upstream.port()],
        ..Default::default()
    })
    .await;
    (upstream, proxy)
}

async fn create(proxy: &TestProxy, body: Value, bearer: Option<&str>) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/sessions", proxy.control_addr))
        .bearer_auth(bearer.unwrap_or(&proxy.admin_token))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A GET through the proxy's TCP listener as the session of `token`.
async fn get(proxy: &TestProxy, upstream: &Upstream, token: &str) -> u16 {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://a:{token}@{}", proxy.proxy_addr)).unwrap())
        .build()
        .unwrap()
        .get(upstream.url("/echo"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_names_its_profile_and_policies_see_it() {
    let (upstream, proxy) = rig().await;
    let (status, plain) = create(&proxy, json!({"agent": "a"}), None).await;
    assert_eq!(status, 201, "{plain}");
    assert_eq!(plain["profile"], Value::Null);
    let (status, boxed) = create(&proxy, json!({"agent": "a", "profile": "default"}), None).await;
    assert_eq!(status, 201, "{boxed}");
    assert_eq!(boxed["profile"], "default");
    // context.session.profile decides.
    assert_eq!(
        get(&proxy, &upstream, plain["token"].as_str().unwrap()).await,
        403
    );
    assert_eq!(
        get(&proxy, &upstream, boxed["token"].as_str().unwrap()).await,
        200
    );

    // Only a profile the sandbox knows; a name that cannot be one is refused as such.
    for bad in ["nope", "Default", "", "a b", "../x"] {
        let (status, answer) = create(&proxy, json!({"agent": "a", "profile": bad}), None).await;
        assert_eq!(
            (status, answer["error"].clone()),
            (400, json!("bad_request")),
            "{bad}: {answer}"
        );
    }
    // A child keeps its parent's profile: naming another is refused, naming none inherits.
    let token = boxed["token"].as_str().unwrap();
    let (status, child) = create(&proxy, json!({}), Some(token)).await;
    assert_eq!(
        (status, child["profile"].clone()),
        (201, json!("default")),
        "{child}"
    );
    assert_eq!(
        get(&proxy, &upstream, child["token"].as_str().unwrap()).await,
        200
    );
    let (status, answer) = create(&proxy, json!({"profile": "gvisor"}), Some(token)).await;
    assert_eq!(status, 400, "{answer}");
    // And an unsandboxed parent's child cannot claim a sandbox it does not run in.
    let (status, answer) = create(
        &proxy,
        json!({"profile": "default"}),
        Some(plain["token"].as_str().unwrap()),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    // Shown with the session.
    let shown: Value = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/sessions/{}",
            proxy.control_addr,
            boxed["session_id"].as_str().unwrap()
        ))
        .bearer_auth(&proxy.admin_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown["profile"], "default", "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_its_unix_socket_like_its_tcp_listener() {
    let (upstream, proxy) = rig().await;
    let socket = proxy.shared.config.proxy_unix_path();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o666,
        "any uid may connect: its directory decides who reaches it"
    );
    let dir_mode = std::fs::metadata(socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        dir_mode & 0o077,
        0,
        "the state directory keeps other users out"
    );

    let (_, session) = create(&proxy, json!({"agent": "a", "profile": "default"}), None).await;
    let token = session["token"].as_str().unwrap();
    let send = |auth: Option<String>| {
        let socket = socket.clone();
        let url = upstream.url("/echo");
        async move {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut req = Request::get(url);
            if let Some(auth) = auth {
                req = req.header("proxy-authorization", auth);
            }
            let response = sender
                .send_request(req.body(Full::new(Bytes::new())).unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }
    };
    let (status, _) = send(Some(format!("Bearer {token}"))).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.seen().len(), 1, "forwarded once");
    let (status, body) = send(None).await;
    assert_eq!(status, 407, "{}", String::from_utf8_lossy(&body));
    let (status, _) = send(Some("Bearer not-a-token".into())).await;
    assert_eq!(status, 407);
    assert_eq!(upstream.seen().len(), 1, "nothing more was forwarded");
    // Audited like any request.
    let records = proxy.audit().await;
    assert!(records
        .iter()
        .any(|r| r.kind == "http" && r.decision == "allow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_s_report_is_sealed_into_the_audit_when_its_session_ends() {
    let (_upstream, proxy) = rig().await;
    let (_, session) = create(&proxy, json!({"agent": "a", "profile": "default"}), None).await;
    let id = session["session_id"].as_str().unwrap();
    let terminate = |body: String| {
        let url = format!("http://{}/v1/sessions/{id}/terminate", proxy.control_addr);
        let token = proxy.admin_token.clone();
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            response.status().as_u16()
        }
    };
    // A body that is not a termination is refused, and the session stays.
    assert_eq!(terminate(r#"{"why": "x"}"#.into()).await, 400);
    assert_eq!(terminate("not json".into()).await, 400);
    let report = json!({"exit": 150, "limit": "memory", "limits_by": "cgroup-v1",
                        "isolation": "namespaces", "cleaned": ["processes", "cgroup"]});
    let body = json!({"reason": "the run ended", "run": report}).to_string();
    assert_eq!(terminate(body.clone()).await, 200);
    // Ending it again: not found, and no second report.
    assert_eq!(terminate(body).await, 404);

    let records = proxy.audit().await;
    let runs: Vec<_> = records.iter().filter(|r| r.kind == "run").collect();
    assert_eq!(runs.len(), 1, "{runs:#?}");
    let run = runs[0];
    assert_eq!(run.session.as_deref(), Some(id));
    assert_eq!(
        (run.decision.as_str(), run.error.as_deref()),
        ("deny", Some("limit_exceeded"))
    );
    let detail = run.run.as_ref().unwrap();
    assert_eq!(detail["exit"], 150);
    assert_eq!(
        detail["cleaned"],
        json!(["processes", "cgroup", "session"]),
        "{detail}"
    );
    let ended = records
        .iter()
        .find(|r| r.kind == "session" && r.session.as_deref() == Some(id) && r.totals.is_some())
        .unwrap();
    assert!(
        ended.reason.as_deref().unwrap().contains("the run ended"),
        "{ended:#?}"
    );
}
