//! Shared by the test crates that drive the binary (`cli.rs`, `cli_policy.rs`, `reload.rs`): the real `ostiary`
//! binary built once per test process, `ostiary serve` as a child process on free ports, and
//! small helpers to read what the commands print. Each crate uses a subset, so unused items
//! are allowed here rather than duplicated per file.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use ostiary_e2e::clients::{self, CmdOutput};
use ostiary_e2e::raw::{auth_line, exchange, Reply};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Allows `/echo` on `api.example.test` for every agent; anything else (including the
/// `other.example.test` host) falls to the default deny.
pub(crate) const POLICY: &str = r#"
@id("allow-demo-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

/// How long a CLI command may take.
pub(crate) const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `ostiary serve` may take to answer `/healthz`, and to exit after SIGTERM.
pub(crate) const SERVER_DEADLINE: Duration = Duration::from_secs(30);

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

/// The `ostiary` binary (package `ostiary-cli`), brought up to date once per test process so
/// it matches the sources. It is built the way the test run itself builds it (`cargo test
/// --no-run --workspace`, which builds a package's binaries for its integration tests:
/// `cli/tests/` has them for this one): a plain `cargo build -p ostiary-cli` resolves
/// features without the workspace's dev-dependencies and would compile much of the
/// dependency tree a second time — minutes on a fresh CI machine. After `cargo nextest run
/// --workspace` this is a freshness check. Under scripts/test.sh, which builds everything
/// first, `OSTIARY_BIN` names it and cargo is not asked at all.
pub(crate) fn ostiary_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // scripts/test.sh built everything before the run and names the binary: no test
        // process then waits on cargo's build lock to hear that it is fresh.
        if let Some(bin) = std::env::var_os("OSTIARY_BIN").map(PathBuf::from) {
            assert!(bin.is_file(), "OSTIARY_BIN={} is not a file", bin.display());
            return bin;
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let root = workspace_root();
        let mut cmd = std::process::Command::new(cargo);
        // The test process carries the variables cargo set for it (`CARGO_MANIFEST_DIR`,
        // `CARGO_PKG_*`, ...); ring's build script reruns when `CARGO_MANIFEST_DIR`
        // changes, which would dirty its whole dependent tree, here and in the next run.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("CARGO_") && name != "CARGO_HOME" && name != "CARGO_TARGET_DIR" {
                cmd.env_remove(name);
            }
        }
        let out = cmd
            .args(["test", "--no-run", "--workspace", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .current_dir(&root)
            .output()
            .expect("running cargo build for the ostiary binary");
        assert!(
            out.status.success(),
            "cargo test --no-run --workspace (for the ostiary binary) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Integration tests know `<target>/tmp`; the binary is in `<target>/debug`.
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_TARGET_TMPDIR"))
                    .parent()
                    .expect("target dir")
                    .to_owned()
            });
        let target = if target.is_absolute() {
            target
        } else {
            root.join(target)
        };
        let bin = target.join("debug").join("ostiary");
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

/// Runs `ostiary <args>` with the proxy and CA variables scrubbed (see [`clients::run`]).
pub(crate) async fn ostiary(args: &[&str]) -> CmdOutput {
    let bin = ostiary_bin();
    clients::run(bin, args, &[("OSTIARY_LOG", "warn")], CLI_TIMEOUT).await
}

/// A port that was free a moment ago (bound on 127.0.0.1:0 and released).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// `GET /healthz` on the control listener answers 200.
pub(crate) async fn healthy(control: SocketAddr) -> bool {
    let Ok(mut tcp) = tokio::net::TcpStream::connect(control).await else {
        return false;
    };
    let request = format!("GET /healthz HTTP/1.1\r\nHost: {control}\r\nConnection: close\r\n\r\n");
    if tcp.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut response)).await;
    matches!(read, Ok(Ok(_))) && response.starts_with(b"HTTP/1.1 200")
}

/// `ostiary serve` running as a child process with its own config and state directory.
pub(crate) struct Server {
    pub(crate) child: Child,
    /// Holds the config, the state directory, the policies and the server's log.
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) state: PathBuf,
    pub(crate) proxy_addr: SocketAddr,
    /// The control listener (sessions, approvals, audit; `/healthz`).
    pub(crate) control_addr: SocketAddr,
    pub(crate) log: PathBuf,
}

impl Server {
    /// Starts `ostiary --config <file> serve` for a proxy that trusts `upstream`'s CA, may
    /// reach its port, and resolves `names` to 127.0.0.1. Free ports are picked by binding
    /// port 0; if another process takes one in between, the start is retried.
    pub(crate) async fn start(upstream: &Upstream, names: &[&str], policy: &str) -> Self {
        Self::start_with(upstream, names, policy, "", "info").await
    }

    /// Like [`Server::start`], with `extra_toml` appended to the config (sections it does
    /// not write, e.g. `[broker]`) and `OSTIARY_LOG` set to `log_level`.
    pub(crate) async fn start_with(
        upstream: &Upstream,
        names: &[&str],
        policy: &str,
        extra_toml: &str,
        log_level: &str,
    ) -> Self {
        Self::start_with_files(upstream, names, policy, &[], extra_toml, log_level).await
    }

    /// Like [`Server::start_with`], with more files written to the policy directory
    /// before the start (`("tools.toml", catalog)`).
    pub(crate) async fn start_with_files(
        upstream: &Upstream,
        names: &[&str],
        policy: &str,
        policy_files: &[(&str, &str)],
        extra_toml: &str,
        log_level: &str,
    ) -> Self {
        Self::start_with_listen(
            upstream,
            names,
            policy,
            policy_files,
            "",
            extra_toml,
            log_level,
        )
        .await
    }

    /// Like [`Server::start_with_files`], with `listen_toml` added to the `[listen]` table
    /// (`triggers = "127.0.0.1:<port>"`), which `extra_toml` cannot reopen.
    pub(crate) async fn start_with_listen(
        upstream: &Upstream,
        names: &[&str],
        policy: &str,
        policy_files: &[(&str, &str)],
        listen_toml: &str,
        extra_toml: &str,
        log_level: &str,
    ) -> Self {
        let mut dir = tempfile::tempdir().unwrap();
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("test.cedar"), policy).unwrap();
        // Files named `shadow/<name>` make a shadow set (`[policy] shadow_dir`) beside it.
        let mut shadow_toml = String::new();
        for (name, text) in policy_files {
            if let Some(name) = name.strip_prefix("shadow/") {
                let shadow = dir.path().join("shadow");
                std::fs::create_dir_all(&shadow).unwrap();
                std::fs::write(shadow.join(name), text).unwrap();
                shadow_toml = format!("shadow_dir = \"{}\"", shadow.display());
            } else {
                std::fs::write(policies.join(name), text).unwrap();
            }
        }
        let ca_file = upstream.write_ca(dir.path());
        let state = dir.path().join("state");
        let config = dir.path().join("ostiary.toml");
        let log = dir.path().join("serve.log");
        let resolve: Vec<String> = names
            .iter()
            .map(|n| format!("\"{n}\" = \"127.0.0.1\""))
            .collect();
        let mut last_log = String::new();
        for _attempt in 0..3 {
            let proxy_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let control_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
            let text = format!(
                r#"
[listen]
proxy = "{proxy_addr}"
control = "{control_addr}"
{listen_toml}

[state]
dir = "{state}"

[policy]
dir = "{policies}"
{shadow_toml}

[egress]
ports = [80, 443, {port}]
allow_private = ["127.0.0.1/32"]
resolve = {{ {resolve} }}
ca_file = "{ca_file}"
{extra_toml}
"#,
                state = state.display(),
                policies = policies.display(),
                port = upstream.port(),
                resolve = resolve.join(", "),
                ca_file = ca_file.display(),
            );
            std::fs::write(&config, text).unwrap();
            let child = spawn_serve(Some(&config), None, &log, log_level);
            let mut server = Server {
                child,
                dir,
                config: config.clone(),
                state: state.clone(),
                proxy_addr,
                control_addr,
                log: log.clone(),
            };
            match server.wait_healthy(control_addr).await {
                Ok(()) => return server,
                Err(text) => {
                    last_log = text;
                    let _ = server.child.kill().await;
                    if !last_log.contains("binding") {
                        break;
                    }
                    dir = server.dir;
                }
            }
        }
        panic!("ostiary serve did not become healthy:\n{last_log}");
    }

    /// Polls `/healthz` until it answers; on failure returns the server's log.
    pub(crate) async fn wait_healthy(&mut self, control: SocketAddr) -> Result<(), String> {
        wait_healthy(&mut self.child, control, &self.log).await
    }

    pub(crate) fn config_arg(&self) -> String {
        self.config.display().to_string()
    }

    /// Stops the server with SIGTERM and waits for a clean exit, so every audit record
    /// is committed and the head checkpoint written.
    pub(crate) async fn stop(mut self) -> tempfile::TempDir {
        terminate(&mut self.child, &self.log).await;
        self.dir
    }
}

pub(crate) fn spawn_serve(
    config: Option<&Path>,
    cwd: Option<&Path>,
    log: &Path,
    log_level: &str,
) -> Child {
    let log_file = std::fs::File::create(log).expect("creating the server log");
    let mut cmd = Command::new(ostiary_bin());
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .env("OSTIARY_LOG", log_level)
        .env_remove("OSTIARY_LOG_FORMAT")
        .env_remove("OSTIARY_CONFIG")
        .env_remove("OSTIARY_ADMIN_TOKEN")
        .kill_on_drop(true);
    for name in clients::SCRUBBED_ENV {
        cmd.env_remove(name);
    }
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    cmd.spawn().expect("starting ostiary serve")
}

pub(crate) async fn wait_healthy(
    child: &mut Child,
    control: SocketAddr,
    log: &Path,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + SERVER_DEADLINE;
    loop {
        if healthy(control).await {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "ostiary serve exited with {status}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "no /healthz on {control} within {SERVER_DEADLINE:?}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn terminate(child: &mut Child, log: &Path) {
    let pid = child.id().expect("the server is running").to_string();
    let sent = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("running kill");
    assert!(sent.success(), "kill -TERM {pid} failed");
    let status = tokio::time::timeout(SERVER_DEADLINE, child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!("ostiary serve did not exit within {SERVER_DEADLINE:?} of SIGTERM")
        })
        .expect("waiting for ostiary serve");
    assert!(
        status.success(),
        "ostiary serve exited with {status} on SIGTERM:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// `KEY=VALUE` lines (as `env` prints them) into pairs.
pub(crate) fn parse_env(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The body and status of `curl -w '\n%{http_code}'` output.
pub(crate) fn body_and_code(out: &CmdOutput) -> (Value, String) {
    let (body, code) = out
        .stdout
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("no status line:\n{out}"));
    let body =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("body is not JSON ({e}):\n{out}"));
    (body, code.trim().to_owned())
}

/// Audit records from `ostiary audit query <filters>`, once `ready` holds for them (the
/// server commits records asynchronously) or the deadline passes.
pub(crate) async fn audit_query(
    server: &Server,
    filters: &[&str],
    ready: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let config = server.config_arg();
    let mut args = vec!["--config", config.as_str(), "audit", "query"];
    args.extend_from_slice(filters);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let out = ostiary(&args).await;
        assert!(out.success(), "{out}");
        let records: Vec<Value> = out
            .stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if ready(&records) || tokio::time::Instant::now() >= deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

/// A session's id and token, from `session new --json`.
pub(crate) async fn session(server: &Server, agent: &str) -> (String, String) {
    let config = server.config_arg();
    let out = ostiary(&[
        "--config", &config, "session", "new", "--agent", agent, "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let session: Value = serde_json::from_str(&out.stdout).expect("session JSON");
    (
        session["session_id"].as_str().unwrap().to_owned(),
        session["token"].as_str().unwrap().to_owned(),
    )
}

/// A plain-http GET through the proxy with `token`.
pub(crate) async fn get(server: &Server, token: &str, url: &str) -> Reply {
    let host = url.split('/').nth(2).unwrap_or_default();
    let request = format!(
        "GET {url} HTTP/1.1\r\nHost: {host}\r\n{}Connection: close\r\n\r\n",
        auth_line(token)
    );
    exchange(server.proxy_addr, request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("GET {url} through the proxy: {e}"))
}
