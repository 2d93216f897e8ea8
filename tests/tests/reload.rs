//! Hot reload of the policy set (issue 3, item 6): by `POST /v1/policy/reload`, by the
//! directory watcher, and by `SIGHUP` to `ostiary serve`. A broken set keeps the last good
//! one serving, and the failure shows in the response, the metrics and the audit chain.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{absolute_get, auth_line, exchange, Reply};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::Session;

/// Permits `/echo` only.
pub(crate) const ECHO_ONLY: &str = r#"
@id("allow-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

/// Permits `/echo` and `/status/200`.
pub(crate) const ECHO_AND_STATUS: &str = r#"
@id("allow-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
@id("allow-status")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/status/200" };
"#;

/// Parses, but reads a context attribute the schema does not have: strict validation fails.
const INVALID: &str = r#"
@id("allow-everything-badly")
permit (principal, action == Ostiary::Action::"http", resource)
when { context.no_such_attribute == "x" };
"#;

/// How long a reload by watcher or signal may take to show.
const DEADLINE: Duration = Duration::from_secs(20);

struct Fixture {
    upstream: Upstream,
    proxy: TestProxy,
    session: Session,
}

async fn start(policies: &str, watch_interval: Option<&str>) -> Fixture {
    let upstream = Upstream::builder().tls(false).start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: policies.into(),
        ports: vec![upstream.port()],
        watch_interval: watch_interval.map(str::to_owned),
        // Scraped without the admin token by `metric` (the control tests cover the token).
        extra_toml: "[control]\npublic_metrics = true\n".into(),
        ..Default::default()
    })
    .await;
    let session = proxy.session("reloader").await;
    Fixture {
        upstream,
        proxy,
        session,
    }
}

impl Fixture {
    /// `GET <path>` on the upstream through the proxy; the status.
    async fn get(&self, path: &str) -> StatusCode {
        let url = self.upstream.url(path);
        absolute_get(&self.proxy, &url, &auth_line(&self.session.token))
            .await
            .status
    }

    fn write_policies(&self, text: &str) {
        let dir = self.proxy.dir.path().join("policies");
        std::fs::write(dir.join("test.cedar"), text).unwrap();
    }
}

/// A request to the control API, with or without the admin token.
async fn control(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    exchange(addr, request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

async fn reload(proxy: &TestProxy) -> Reply {
    control(
        proxy.control_addr,
        "POST",
        "/v1/policy/reload",
        Some(&proxy.admin_token),
    )
    .await
}

/// The value of one sample line of the Prometheus exposition, e.g.
/// `ostiary_policy_reloads_total{outcome="failed"}`.
async fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let reply = control(addr, "GET", "/metrics", None).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Poll `check` until it holds or the deadline passes.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_endpoint_swaps_in_a_changed_policy() {
    let fx = start(ECHO_ONLY, Some("0s")).await;
    assert_eq!(fx.get("/echo").await, StatusCode::OK);
    assert_eq!(fx.get("/status/200").await, StatusCode::FORBIDDEN);

    fx.write_policies(ECHO_AND_STATUS);
    // Watching is off: nothing changes until the reload is asked for.
    assert_eq!(fx.get("/status/200").await, StatusCode::FORBIDDEN);

    let unauthenticated = control(fx.proxy.control_addr, "POST", "/v1/policy/reload", None).await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);

    let policies = &fx.proxy.shared.reloader.policies;
    let before = policies.current().version().to_string();
    let reply = reload(&fx.proxy).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    // The new set's version: its files changed, so its id did.
    let version = policies.current().version().to_string();
    assert_ne!(version, before);
    assert_eq!(
        reply.json(),
        serde_json::json!({"status": "reloaded", "policies": 2, "generation": 2, "version": version})
    );
    assert_eq!(fx.get("/status/200").await, StatusCode::OK);
    assert_eq!(fx.upstream.count("/status/200"), 1);
    assert_eq!(
        metric(fx.proxy.control_addr, "ostiary_policy_generation").await,
        Some(2.0)
    );
    assert_eq!(
        metric(
            fx.proxy.control_addr,
            "ostiary_policy_reloads_total{outcome=\"ok\"}"
        )
        .await,
        Some(1.0)
    );

    let records = fx.proxy.audit().await;
    let policy: Vec<_> = records.iter().filter(|r| r.kind == "policy").collect();
    assert_eq!(policy.len(), 1, "{records:#?}");
    assert_eq!(policy[0].decision, "allow");
    assert_eq!(
        policy[0].reason,
        Some(format!(
            "policy set reloaded: 2 policies, version {version}"
        ))
    );
    assert_eq!(policy[0].policy_version.as_deref(), Some(version.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_set_keeps_the_last_good_one() {
    let fx = start(ECHO_ONLY, Some("0s")).await;
    assert_eq!(fx.get("/echo").await, StatusCode::OK);

    for broken in [INVALID, "permit (principal, action, resource"] {
        fx.write_policies(broken);
        let reply = reload(&fx.proxy).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
        let body = reply.json();
        assert_eq!(body["error"], "policy_invalid", "{reply}");
        assert!(
            body["message"].as_str().unwrap().contains("test.cedar"),
            "the message names the file: {reply}"
        );
        assert_eq!(body["request_id"].as_str(), reply.request_id(), "{reply}");
        // Still decided by the old set: /echo allowed, everything else denied (the invalid
        // set would have permitted anything).
        assert_eq!(fx.get("/echo").await, StatusCode::OK);
        assert_eq!(fx.get("/status/200").await, StatusCode::FORBIDDEN);
    }

    let addr = fx.proxy.control_addr;
    assert_eq!(
        metric(addr, "ostiary_policy_reloads_total{outcome=\"failed\"}").await,
        Some(2.0)
    );
    assert_eq!(
        metric(addr, "ostiary_policy_reloads_total{outcome=\"ok\"}").await,
        Some(0.0)
    );
    assert_eq!(metric(addr, "ostiary_policy_generation").await, Some(1.0));

    let records = fx.proxy.audit().await;
    let failed: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "policy" && r.decision == "error")
        .collect();
    assert_eq!(failed.len(), 2, "{records:#?}");
    assert_eq!(failed[0].error.as_deref(), Some("policy_invalid"));
    let reason = failed[0].reason.as_deref().unwrap();
    assert!(reason.contains("strict validation"), "{reason}");
    assert!(reason.contains("test.cedar"), "{reason}");

    // Fixing the file recovers.
    fx.write_policies(ECHO_AND_STATUS);
    let reply = reload(&fx.proxy).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    assert_eq!(reply.json()["generation"], 2);
    assert_eq!(fx.get("/status/200").await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_picks_up_changes() {
    let fx = start(ECHO_ONLY, Some("100ms")).await;
    assert_eq!(fx.get("/status/200").await, StatusCode::FORBIDDEN);

    fx.write_policies(ECHO_AND_STATUS);
    eventually("the watcher reloads the changed file", || async {
        fx.get("/status/200").await == StatusCode::OK
    })
    .await;
    assert_eq!(fx.proxy.shared.reloader.policies.generation(), 2);

    // A broken file is reported once, and the set in force stays.
    fx.write_policies(INVALID);
    let addr = fx.proxy.control_addr;
    eventually("the watcher reports the broken file", || async {
        metric(addr, "ostiary_policy_reloads_total{outcome=\"failed\"}").await == Some(1.0)
    })
    .await;
    assert_eq!(fx.get("/status/200").await, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        metric(addr, "ostiary_policy_reloads_total{outcome=\"failed\"}").await,
        Some(1.0),
        "an unchanged broken file is not reloaded on every poll"
    );
    assert_eq!(fx.proxy.shared.reloader.policies.generation(), 2);

    let records = fx.proxy.audit().await;
    let decisions: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "policy")
        .map(|r| r.decision.as_str())
        .collect();
    assert_eq!(decisions, ["allow", "error"], "{records:#?}");
}

use crate::support::cli as support;
use support::ostiary_bin;

async fn signal(child: &tokio::process::Child, name: &str) {
    let pid = child.id().expect("running").to_string();
    let status = tokio::process::Command::new("kill")
        .args([name, &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "kill {name} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_ostiary_serve() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("test.cedar"), ECHO_ONLY).unwrap();
    let log = dir.path().join("serve.log");
    // A child's port 0 cannot be read back: take ports that were free a moment ago.
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("binding 127.0.0.1:0")
    };
    // Another test may take a port between its release here and the child's bind: then
    // the child says so and exits, and the start is tried again on fresh ports.
    let config = dir.path().join("ostiary.toml");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut attempts = 0;
    let (mut child, control_addr) = loop {
        attempts += 1;
        let (proxy_addr, control_addr) = (free(), free());
        std::fs::write(
            &config,
            format!(
                "[listen]\nproxy = \"{proxy_addr}\"\ncontrol = \"{control_addr}\"\n\
                 [state]\ndir = \"{}\"\n[policy]\ndir = \"{}\"\nwatch_interval = \"0s\"\n\
                 [control]\npublic_metrics = true\n",
                dir.path().join("state").display(),
                policies.display(),
            ),
        )
        .unwrap();
        let log_file = std::fs::File::create(&log).unwrap();
        let mut child = tokio::process::Command::new(ostiary_bin())
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("OSTIARY_LOG", "info")
            .env_remove("OSTIARY_CONFIG")
            .env_remove("OSTIARY_ADMIN_TOKEN")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(log_file.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("starting ostiary serve");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut lost_port = false;
        while metric_or_none(control_addr).await.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                lost_port = log_text().contains("Address already in use") && attempts < 5;
                if !lost_port {
                    panic!("ostiary serve exited with {status}:\n{}", log_text());
                }
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "ostiary serve did not answer:\n{}",
                log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !lost_port {
            break (child, control_addr);
        }
    };
    assert_eq!(metric_or_none(control_addr).await, Some(1.0));

    std::fs::write(policies.join("test.cedar"), ECHO_AND_STATUS).unwrap();
    signal(&child, "-HUP").await;
    eventually("SIGHUP reloads the policy set", || async {
        metric_or_none(control_addr).await == Some(2.0)
    })
    .await;

    // A broken set on SIGHUP: counted as failed, the process keeps serving generation 2.
    std::fs::write(policies.join("test.cedar"), INVALID).unwrap();
    signal(&child, "-HUP").await;
    eventually("SIGHUP reports the broken set", || async {
        metric(
            control_addr,
            "ostiary_policy_reloads_total{outcome=\"failed\"}",
        )
        .await
            == Some(1.0)
    })
    .await;
    assert_eq!(metric_or_none(control_addr).await, Some(2.0));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP must not end the proxy"
    );
    assert!(
        log_text().contains("policy reload failed"),
        "the failure is logged:\n{}",
        log_text()
    );

    signal(&child, "-TERM").await;
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}:\n{}", log_text());
}

/// `ostiary_policy_generation`, or `None` while the control listener does not answer.
async fn metric_or_none(addr: SocketAddr) -> Option<f64> {
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let reply = exchange(addr, request.as_bytes()).await.ok()?;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("ostiary_policy_generation ")?.parse().ok())
}
