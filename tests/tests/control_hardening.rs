//! The control listener's own doors (THREATS.md, "Control API"): `/metrics` names agents,
//! tenants, credentials and tools, so it needs the admin token unless `[control]
//! public_metrics = true`; and `ostiary serve` takes its admin token from
//! `OSTIARY_ADMIN_TOKEN` when that is set (docs/design.md §6, §8) — the state directory's
//! `admin.token` is then neither read nor written, and a token too weak to be one stops the
//! start with a message that names the variable, never its value.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;

use ostiary_e2e::clients::SCRUBBED_ENV;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{exchange, Reply};

use crate::support::cli as support;
use support::*;

/// `GET /metrics` on `addr` with `Authorization: <auth>` when given.
async fn metrics(addr: SocketAddr, auth: Option<&str>) -> Reply {
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    exchange(addr, request.as_bytes())
        .await
        .expect("the control listener answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_admin_token_unless_made_public() {
    let proxy = TestProxy::start(ProxySpec::default()).await;
    let addr = proxy.control_addr;
    let token = proxy.admin_token.clone();
    for auth in [
        None,
        Some("Bearer ".to_owned()),
        Some("Bearer wrong-token".to_owned()),
        Some(format!("Bearer {token}x")),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
        Some(format!("bearer {token}")),
        Some(format!("Basic {token}")),
        Some(token.clone()),
    ] {
        let reply = metrics(addr, auth.as_deref()).await;
        assert_eq!(reply.status, 401, "{auth:?}: {reply}");
        let body = reply.json();
        assert_eq!(body["error"], "unauthenticated", "{body}");
        let text = String::from_utf8_lossy(&reply.body);
        assert!(
            !text.contains("ostiary_"),
            "metrics leaked to {auth:?}: {text}"
        );
    }
    let reply = metrics(addr, Some(&format!("Bearer {token}"))).await;
    assert_eq!(reply.status, 200, "{reply}");
    let text = String::from_utf8_lossy(&reply.body);
    assert!(
        text.contains("ostiary_requests_total") || text.contains("# TYPE ostiary_"),
        "{text}"
    );
    // The session's token is not an admin token.
    let reply = metrics(
        addr,
        Some(&format!("Bearer {}", session_token(&proxy).await)),
    )
    .await;
    assert_eq!(reply.status, 401, "{reply}");
    // Health stays open: probes carry no token.
    let health = exchange(
        addr,
        format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(health.status, 200);

    let public = TestProxy::start(ProxySpec {
        extra_toml: "[control]\npublic_metrics = true\n".into(),
        ..Default::default()
    })
    .await;
    let reply = metrics(public.control_addr, None).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert!(String::from_utf8_lossy(&reply.body).contains("# TYPE ostiary_"));
    let reply = metrics(
        public.control_addr,
        Some(&format!("Bearer {}", public.admin_token)),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    // Public metrics open nothing else.
    let reply = exchange(
        public.control_addr,
        format!(
            "GET /v1/approvals HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            public.control_addr
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 401, "{reply}");
}

async fn session_token(proxy: &TestProxy) -> String {
    proxy.session("another").await.token
}

/// `ostiary --config <config> serve` with `OSTIARY_ADMIN_TOKEN` set to `token` (raw
/// bytes, so that invalid UTF-8 can be tried).
fn serve_with_token(config: &Path, token: &[u8], log: &Path) -> tokio::process::Child {
    use std::os::unix::ffi::OsStrExt;
    let log_file = std::fs::File::create(log).unwrap();
    let mut cmd = tokio::process::Command::new(ostiary_bin());
    cmd.arg("--config")
        .arg(config)
        .arg("serve")
        .env("OSTIARY_LOG", "info")
        .env("OSTIARY_ADMIN_TOKEN", std::ffi::OsStr::from_bytes(token))
        .env_remove("OSTIARY_LOG_FORMAT")
        .env_remove("OSTIARY_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true);
    for name in SCRUBBED_ENV {
        cmd.env_remove(name);
    }
    cmd.spawn().expect("starting ostiary serve")
}

/// `serve_with_token` on free ports, healthy: the ports are drawn again when another
/// process took one between its draw and the bind (as `support::Server::start` does).
/// Returns the child, its control address and its config.
async fn serve_healthy(
    dir: &Path,
    token: &[u8],
    log: &Path,
) -> (tokio::process::Child, SocketAddr, std::path::PathBuf) {
    let mut last = String::new();
    for _attempt in 0..3 {
        let proxy: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let control: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let config = write_config(dir, proxy, control);
        let mut child = serve_with_token(&config, token, log);
        match wait_healthy(&mut child, control, log).await {
            Ok(()) => return (child, control, config),
            Err(text) => {
                let _ = child.kill().await;
                if !text.contains("binding") {
                    panic!("{text}");
                }
                last = text;
            }
        }
    }
    panic!("{last}");
}

fn write_config(dir: &Path, proxy: SocketAddr, control: SocketAddr) -> std::path::PathBuf {
    let config = dir.join("ostiary.toml");
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/test.cedar"), POLICY).unwrap();
    std::fs::write(
        &config,
        format!(
            "[listen]\nproxy = \"{proxy}\"\ncontrol = \"{control}\"\n[state]\ndir = \"{}\"\n\
             [policy]\ndir = \"{}\"\n",
            dir.join("state").display(),
            dir.join("policies").display(),
        ),
    )
    .unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_takes_the_admin_token_from_the_environment_and_leaves_the_file_alone() {
    const TOKEN: &str = "env-admin-token-0123456789abcdef0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (mut child, control, config) = serve_healthy(dir.path(), TOKEN.as_bytes(), &log).await;
    let state = dir.path().join("state");
    assert!(
        state.join("ca.pem").is_file(),
        "the rest of the state is there"
    );
    assert!(
        !state.join("admin.token").exists(),
        "admin.token was written although OSTIARY_ADMIN_TOKEN is set"
    );

    // The environment's token is the admin token; nothing else is.
    let client = ostiary_sdk::ControlClient::new(format!("http://{control}"), TOKEN);
    let session = client
        .create_session(&ostiary_sdk::NewSession {
            agent: "env-token".into(),
            ..Default::default()
        })
        .await
        .expect("the environment's token creates a session");
    assert_eq!(session.agent, "env-token");
    assert_eq!(
        metrics(control, Some(&format!("Bearer {TOKEN}")))
            .await
            .status,
        200
    );
    for wrong in [
        "Bearer not-the-token",
        &format!("Bearer {TOKEN}0"),
        &format!("Bearer {}", &TOKEN[1..]),
    ] {
        let reply = metrics(control, Some(wrong)).await;
        assert_eq!(reply.status, 401, "{wrong}: {reply}");
    }
    let wrong = ostiary_sdk::ControlClient::new(format!("http://{control}"), "0".repeat(64));
    assert!(
        wrong.approvals(None).await.is_err(),
        "a wrong token is refused"
    );

    // The CLI takes the same variable.
    let out = clients_run(&config, TOKEN, &["approvals", "list"]).await;
    assert!(out.success(), "{out}");
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains(TOKEN),
        "the token is in the log:\n{log_text}"
    );
    terminate(&mut child, &log).await;
    assert!(!state.join("admin.token").exists());

    // A file left from an earlier run is not read: its token is not the admin token.
    std::fs::write(
        state.join("admin.token"),
        "file-token-0123456789abcdef0123456789",
    )
    .unwrap();
    // Its ports may have been taken meanwhile: drawn afresh, as at the first start.
    let (mut child, control, _) = serve_healthy(dir.path(), TOKEN.as_bytes(), &log).await;
    let reply = metrics(
        control,
        Some("Bearer file-token-0123456789abcdef0123456789"),
    )
    .await;
    assert_eq!(reply.status, 401, "{reply}");
    assert_eq!(
        metrics(control, Some(&format!("Bearer {TOKEN}")))
            .await
            .status,
        200
    );
    terminate(&mut child, &log).await;
    assert_eq!(
        std::fs::read_to_string(state.join("admin.token")).unwrap(),
        "file-token-0123456789abcdef0123456789",
        "the file is not rewritten"
    );
}

/// Run the CLI with `OSTIARY_ADMIN_TOKEN`.
async fn clients_run(config: &Path, token: &str, args: &[&str]) -> ostiary_e2e::clients::CmdOutput {
    let config = config.display().to_string();
    let mut all = vec!["--config", config.as_str()];
    all.extend_from_slice(args);
    ostiary_e2e::clients::run(
        ostiary_bin(),
        &all,
        &[("OSTIARY_LOG", "warn"), ("OSTIARY_ADMIN_TOKEN", token)],
        CLI_TIMEOUT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_empty_or_weak_admin_token_at_start_up() {
    for (token, why) in [
        (&b""[..], "set but empty"),
        (b"short", "too short"),
        (&[b'a'; 31][..], "too short"),
        (b"0123456789abcdef0123456789abcdef\n", "visible ASCII"),
        (b" 0123456789abcdef0123456789abcdef", "visible ASCII"),
        (b"0123456789abcdef0123456789abcdef\xff", "UTF-8"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let proxy: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let control: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let config = write_config(dir.path(), proxy, control);
        let log = dir.path().join("serve.log");
        let mut child = serve_with_token(&config, token, &log);
        let status = tokio::time::timeout(SERVER_DEADLINE, child.wait())
            .await
            .unwrap_or_else(|_| panic!("{token:?}: ostiary serve did not refuse to start"))
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!status.success(), "{token:?}: started anyway:\n{text}");
        assert!(
            text.contains("OSTIARY_ADMIN_TOKEN") && text.contains(why),
            "{token:?}:\n{text}"
        );
        if token.len() >= 16 {
            let shown = String::from_utf8_lossy(&token[1..16]).into_owned();
            assert!(
                !text.contains(&shown),
                "the value is in the message:\n{text}"
            );
        }
        assert!(!healthy(control).await, "{token:?}: something listens");
        assert!(!dir.path().join("state/admin.token").exists(), "{token:?}");
    }
}
